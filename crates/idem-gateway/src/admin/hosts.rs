//! The names a listener answers to: a defence against DNS rebinding.
//!
//! A listener on `127.0.0.1` without a token trusts whoever can connect,
//! which is meant to be the host's own users. A web page can connect too:
//! its site points its own name at `127.0.0.1` after the page loaded, and the
//! browser then sends the page's requests, with their answers readable by the
//! page, to the local listener. Such a request still names the page's site in
//! its `Host` header, so a listener that answers only to its own names
//! refuses it before anything else runs.
//!
//! [`AllowedHosts::loopback`] admits the loopback names and addresses, with
//! any port: `localhost`, any name under `.localhost`, `127.0.0.0/8` and
//! `[::1]`. [`AllowedHosts::parse`] adds the names an operator gives
//! (`--allow-host NAME`, `IDEM_ALLOW_HOSTS`, `allow_hosts` in `idem serve`'s
//! config file): an exact name, `*.example.com` for the names under
//! `example.com`, or an IP address. Ports are not compared. Any other `Host`
//! is answered `421 Misdirected Request` with a problem document that names
//! the refused host and the flag that admits it.

use std::fmt;
use std::net::IpAddr;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// One name a listener answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Exactly this name (lower case, no final dot).
    Name(String),
    /// Any name ending in this suffix (which starts with a dot).
    Under(String),
    /// This address.
    Address(IpAddr),
}

impl Pattern {
    fn admits(&self, host: &Host) -> bool {
        match (self, host) {
            (Self::Name(name), Host::Name(given)) => name == given,
            (Self::Under(suffix), Host::Name(given)) => {
                given.len() > suffix.len() && given.ends_with(suffix.as_str())
            }
            (Self::Address(address), Host::Address(given)) => address == given,
            _ => false,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Under(suffix) => write!(f, "*{suffix}"),
            Self::Address(IpAddr::V6(address)) => write!(f, "[{address}]"),
            Self::Address(address) => write!(f, "{address}"),
        }
    }
}

/// The host a request names, its port set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Name(String),
    Address(IpAddr),
}

impl Host {
    /// `text` as a `Host` header gives it: `name`, `name:port`,
    /// `1.2.3.4:port`, `[::1]:port`. `None` when it is none of these.
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest.split_once(']')?;
            if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
                return None;
            }
            return inside.parse().ok().map(Self::Address);
        }
        let name = match text.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return None,
            None => text,
        };
        if let Ok(address) = name.parse::<IpAddr>() {
            return Some(Self::Address(address));
        }
        let name = name.strip_suffix('.').unwrap_or(name);
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            && !name.split('.').any(str::is_empty);
        valid.then(|| Self::Name(name.to_ascii_lowercase()))
    }

    fn is_loopback(&self) -> bool {
        match self {
            Self::Name(name) => name == "localhost" || name.ends_with(".localhost"),
            Self::Address(IpAddr::V4(address)) => address.is_loopback(),
            Self::Address(IpAddr::V6(address)) => {
                address.is_loopback() || address.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        }
    }
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// A name given to `--allow-host` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a host name to allow: {why}; write a name (console.example.com), a wildcard for the names under one (*.example.com) or an IP address (10.0.0.5, [fd00::5]), without a port"
)]
pub struct BadHostName {
    /// The name as given.
    pub given: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The `Host` names a listener answers to: the loopback ones, and those the
/// operator adds.
///
/// ```
/// use idem_gateway::admin::AllowedHosts;
/// let hosts = AllowedHosts::parse(["console.example.com, *.corp.example"]).unwrap();
/// assert!(hosts.admits("localhost:9300"));
/// assert!(hosts.admits("127.0.0.1:9300"));
/// assert!(hosts.admits("[::1]:9300"));
/// assert!(hosts.admits("Console.Example.com:443"));
/// assert!(hosts.admits("ops.corp.example"));
/// assert!(!hosts.admits("evil.example:9300"));
/// assert!(!AllowedHosts::loopback().admits("console.example.com"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    added: Vec<Pattern>,
}

impl AllowedHosts {
    /// The loopback names and addresses only.
    pub fn loopback() -> Self {
        Self::default()
    }

    /// The loopback names and addresses, and `names`: each item one name or
    /// several separated by commas (as `--allow-host` and
    /// `IDEM_ALLOW_HOSTS` take them). Empty items are skipped.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, BadHostName> {
        let mut added = Vec::new();
        for name in names.into_iter().flat_map(|item| item.split(',')) {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            let pattern = pattern(name)?;
            if !added.contains(&pattern) {
                added.push(pattern);
            }
        }
        Ok(Self { added })
    }

    /// Whether names beyond the loopback ones were added. A listener that
    /// requires a token checks `Host` only then.
    pub fn is_extended(&self) -> bool {
        !self.added.is_empty()
    }

    /// Whether a request whose `Host` is `host` may be answered.
    pub fn admits(&self, host: &str) -> bool {
        Host::parse(host)
            .is_some_and(|host| host.is_loopback() || self.added.iter().any(|p| p.admits(&host)))
    }

    /// The names added, as a config file or a flag takes them again.
    pub fn added(&self) -> Vec<String> {
        self.added.iter().map(ToString::to_string).collect()
    }

    /// `None` when `request` may be answered; otherwise the refusal, a `421`
    /// problem document naming the host and the flag that admits it.
    pub fn refusal(&self, request: &Request) -> Option<Response> {
        let named = request
            .headers()
            .get(header::HOST)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
        match named {
            Some(host) if self.admits(&host) => None,
            Some(host) => Some(self.refuse(&host)),
            None => Some(problem(
                StatusCode::BAD_REQUEST,
                "refused: the request names no host (no Host header); this listener answers only to the names it was started for".to_owned(),
                None,
            )),
        }
    }

    fn refuse(&self, host: &str) -> Response {
        let shown: String = host.chars().filter(|c| !c.is_control()).take(255).collect();
        let name = match Host::parse(&shown) {
            Some(Host::Name(name)) => name,
            Some(Host::Address(IpAddr::V6(address))) => format!("[{address}]"),
            Some(Host::Address(address)) => address.to_string(),
            None => shown.clone(),
        };
        let mut allowed = String::from("localhost, *.localhost, 127.0.0.0/8, [::1]");
        for added in self.added() {
            allowed.push_str(", ");
            allowed.push_str(&added);
        }
        let detail = format!(
            "refused: this request was sent to the host {shown:?}, and this listener answers only to {allowed}; a page of another site that points its name at this address must not reach the store through it (DNS rebinding). If {name} is a name you use for this host, start the listener with --allow-host {name} (or IDEM_ALLOW_HOSTS={name}, or allow_hosts = [\"{name}\"] in the config file of idem serve)"
        );
        problem(StatusCode::MISDIRECTED_REQUEST, detail, Some(shown))
    }
}

impl fmt::Display for AllowedHosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("loopback names")?;
        for added in &self.added {
            write!(f, ", {added}")?;
        }
        Ok(())
    }
}

/// A name `--allow-host` takes, as a pattern.
fn pattern(given: &str) -> Result<Pattern, BadHostName> {
    let bad = |why| BadHostName {
        given: given.to_owned(),
        why,
    };
    if given == "*" || given.contains('/') || given.contains('@') {
        return Err(bad(
            "allow names one by one (a wildcard covers the names under one domain only)",
        ));
    }
    if let Some(under) = given.strip_prefix("*.") {
        return match Host::parse(under) {
            Some(Host::Name(name)) if name.contains('.') || name == "localhost" => {
                Ok(Pattern::Under(format!(".{name}")))
            }
            Some(Host::Name(_)) => Err(bad("a wildcard needs a domain of two labels or more")),
            _ => Err(bad("a wildcard takes a domain name")),
        };
    }
    let bare = given.strip_prefix('[').and_then(|g| g.strip_suffix(']'));
    if let Ok(address) = bare.unwrap_or(given).parse::<IpAddr>() {
        return Ok(Pattern::Address(address));
    }
    if given.contains('*') {
        return Err(bad(
            "a wildcard is allowed only as the first label, as *.example.com",
        ));
    }
    match Host::parse(given) {
        Some(_) if given.contains(':') => Err(bad("the port is not compared, so leave it out")),
        Some(Host::Name(name)) => Ok(Pattern::Name(name)),
        Some(Host::Address(address)) => Ok(Pattern::Address(address)),
        None => Err(bad("it holds characters a host name cannot")),
    }
}

fn problem(status: StatusCode, detail: String, host: Option<String>) -> Response {
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Refused"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(host) = host {
        body["host"] = serde_json::Value::String(host);
    }
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body.to_string(),
    )
        .into_response()
}

/// Middleware: answers a request whose `Host` is not allowed with the
/// refusal of [`AllowedHosts::refusal`], before anything else runs.
pub async fn check_host(hosts: AllowedHosts, request: Request, next: Next) -> Response {
    match hosts.refusal(&request) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::AllowedHosts;

    #[test]
    fn the_loopback_names_are_admitted_with_or_without_a_port() {
        let hosts = AllowedHosts::loopback();
        for host in [
            "localhost",
            "localhost:9300",
            "LOCALHOST.:9300",
            "console.localhost:9300",
            "127.0.0.1",
            "127.0.0.1:9300",
            "127.3.2.1:80",
            "[::1]",
            "[::1]:9300",
            "[::ffff:127.0.0.1]:9300",
        ] {
            assert!(hosts.admits(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9300",
            "localhost.evil.example",
            "evillocalhost",
            "128.0.0.1",
            "0.0.0.0:9300",
            "[::2]:9300",
            "[::1]x",
            "127.0.0.1:port",
            "127.0.0.1:9300@evil.example",
            "evil.example#.localhost",
            "",
            "::1",
            "2130706433",
        ] {
            assert!(!hosts.admits(host), "{host}");
        }
    }

    #[test]
    fn added_names_are_exact_wildcards_or_addresses() {
        let hosts = AllowedHosts::parse([
            "console.example.com",
            "*.corp.example,10.0.0.5",
            "[fd00::5]",
        ])
        .unwrap();
        assert!(hosts.is_extended());
        assert!(hosts.admits("console.example.com:443"));
        assert!(hosts.admits("a.b.corp.example"));
        assert!(!hosts.admits("corp.example"));
        assert!(!hosts.admits("xcorp.example"));
        assert!(!hosts.admits("www.console.example.com"));
        assert!(hosts.admits("10.0.0.5:9300"));
        assert!(hosts.admits("[fd00::5]:9300"));
        assert_eq!(
            hosts.added(),
            [
                "console.example.com",
                "*.corp.example",
                "10.0.0.5",
                "[fd00::5]"
            ]
        );
        assert!(!AllowedHosts::parse([" ,"]).unwrap().is_extended());
        for bad in [
            "*",
            "*.com",
            "a.*.example",
            "host:9300",
            "http://host",
            "a b",
        ] {
            let error = AllowedHosts::parse([bad]).unwrap_err().to_string();
            assert!(error.contains("*.example.com"), "{bad}: {error}");
        }
    }
}
