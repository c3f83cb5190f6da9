//! NATS JetStream: how a server URL is read, for sources and destinations
//! alike (TLS and the credentials, from the URL's scheme, user-info and
//! query), and the header the key travels in; with the `nats` feature,
//! connecting (`connect`), the consumer transport (`consume`: pull,
//! explicit acks, ack-wait) and the publisher (`publish`).
//!
//! | part | meaning |
//! | --- | --- |
//! | `nats://HOST1:4222,HOST2:4222,HOST3:4222` | several servers of one cluster: the client connects to one of them, and to another when it drops; the credentials and options apply to each |
//! | `tls://HOST:PORT` or `?tls=true` | TLS required (the server's certificate is verified) |
//! | `tls_ca=FILE` | PEM file of the CA(s) that signed the server's certificate (implies TLS) |
//! | `tls_cert=FILE&tls_key=FILE` | client certificate and its key, PEM (implies TLS) |
//! | `nats://USER:PASSWORD@HOST` | user and password |
//! | `token=TOKEN` | a token |
//! | `nkey=FILE` | a file holding an NKey seed (`SU...`) |
//! | `creds=FILE` | a `.creds` file (user JWT and NKey seed) |
//!
//! The URL is read in every build: a URL is checked when it is parsed, so a
//! mistake shows before anything connects, whatever the features; the rest
//! of this folder needs the `nats` feature. Everything secret (the
//! password, the token) is only in the user-info or the query, which
//! [`idem_core::redact_url`] masks or cuts off.

#[cfg(feature = "nats")]
mod connect;
#[cfg(feature = "nats")]
pub(crate) mod consume;
#[cfg(feature = "nats")]
pub(crate) mod publish;

use std::path::PathBuf;

use url::Url;

/// The header the key travels in: the publisher sets it, the stream drops a
/// second message with the same id inside its duplicate window, and the
/// consumer reads it as the message id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// The query parameters a NATS server URL may hold.
pub(crate) const OPTIONS: &str =
    "tls=true, tls_ca=FILE, tls_cert=FILE, tls_key=FILE, token=TOKEN, nkey=FILE, creds=FILE";

/// A NATS URL read apart. Its authority may list several servers
/// (`nats://u:p@h1:4222,h2:4222/S/C`), which is no URL authority (a port
/// list is no port): `url` is the text with the list cut down to its first
/// server, for the scheme, user-info, path and query; `hosts` is the whole
/// list, `HOST[:PORT]` each, checked one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NatsUrl {
    pub(crate) url: Url,
    pub(crate) hosts: Vec<String>,
}

impl NatsUrl {
    /// Whether `text` is written with a NATS scheme (`nats://`, `tls://`).
    pub(crate) fn has_nats_scheme(text: &str) -> bool {
        text.split_once("://").is_some_and(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("nats") || scheme.eq_ignore_ascii_case("tls")
        })
    }

    /// Reads `text`: one server or a comma-separated list of them.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Url::parse(text).map_err(|e| e.to_string()).map(|url| Self {
                hosts: host(&url).into_iter().collect(),
                url,
            });
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (user_info, list) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        let entries: Vec<&str> = list.split(',').map(str::trim).collect();
        if entries.len() > 1 && entries.iter().any(|entry| entry.is_empty()) {
            return Err(
                "an empty server in the server list: write nats://HOST1:PORT,HOST2:PORT".into(),
            );
        }
        let url = Url::parse(&format!("{scheme}://{user_info}{}{tail}", entries[0]))
            .map_err(|e| e.to_string())?;
        let mut hosts = Vec::with_capacity(entries.len());
        // No host at all is for the caller to explain.
        for entry in entries.into_iter().filter(|entry| !entry.is_empty()) {
            let one = Url::parse(&format!("{scheme}://{entry}"))
                .ok()
                .filter(|one| one.path().is_empty() && one.username().is_empty())
                .as_ref()
                .and_then(host)
                .ok_or_else(|| format!("server {entry:?} in the server list is no HOST[:PORT]"))?;
            hosts.push(one);
        }
        Ok(Self { url, hosts })
    }

    /// The URL's servers with their options, without the path: what the
    /// source and destination keep as their `url`
    /// (`nats://USER:PASSWORD@H1:4222,H2:4222?tls=true`).
    pub(crate) fn server_url(&self) -> String {
        let url = &self.url;
        let mut text = format!("{}://", url.scheme());
        if !url.username().is_empty() {
            text.push_str(url.username());
            if let Some(password) = url.password() {
                text.push(':');
                text.push_str(password);
            }
            text.push('@');
        }
        text.push_str(&self.hosts.join(","));
        if let Some(query) = url.query().filter(|query| !query.is_empty()) {
            text.push('?');
            text.push_str(query);
        }
        text
    }
}

/// `HOST[:PORT]` of a parsed URL.
fn host(url: &Url) -> Option<String> {
    let host = url.host_str().filter(|h| !h.is_empty())?;
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// How to reach a NATS server and prove who is calling.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct NatsServer {
    /// `nats://HOST:PORT` or `tls://HOST:PORT`, one per server of the URL's
    /// list: no user-info, no query.
    pub(crate) servers: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) tls_cert: Option<(PathBuf, PathBuf)>,
    pub(crate) auth: Auth,
}

/// The one way a client proves who it is.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) enum Auth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    NKey(PathBuf),
    Creds(PathBuf),
}

impl NatsServer {
    /// Reads a server URL (its path is ignored: the caller reads it).
    pub(crate) fn parse(nats: &NatsUrl) -> Result<Self, String> {
        let url = &nats.url;
        let scheme = url.scheme();
        if scheme != "nats" && scheme != "tls" {
            return Err(format!(
                "scheme {scheme:?} is no NATS scheme: write nats:// or tls://"
            ));
        }
        if nats.hosts.is_empty() {
            return Err("no host".into());
        }
        let mut found = Self {
            servers: nats
                .hosts
                .iter()
                .map(|host| format!("{scheme}://{host}"))
                .collect(),
            tls: scheme == "tls",
            ..Self::default()
        };
        let mut auths = Vec::new();
        if !url.username().is_empty() {
            let user = decode(url.username());
            let Some(password) = url.password() else {
                return Err(
                    "has a user name but no password: write nats://USER:PASSWORD@HOST, or give a token as token=TOKEN"
                        .into(),
                );
            };
            auths.push(Auth::UserPassword(user, decode(password)));
        }
        let (mut cert, mut key) = (None, None);
        for (name, value) in url.query_pairs() {
            let value = value.into_owned();
            match &*name {
                "tls" => {
                    found.tls = match value.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => found.tls,
                        _ => return Err("tls= takes true or false".into()),
                    }
                }
                "tls_ca" => found.tls_ca = Some(file(&name, value)?),
                "tls_cert" => cert = Some(file(&name, value)?),
                "tls_key" => key = Some(file(&name, value)?),
                "token" if !value.is_empty() => auths.push(Auth::Token(value)),
                "nkey" => auths.push(Auth::NKey(file(&name, value)?)),
                "creds" => auths.push(Auth::Creds(file(&name, value)?)),
                other => {
                    return Err(format!(
                        "unknown option {other:?} in the server URL's query: a NATS URL takes {OPTIONS}"
                    ));
                }
            }
        }
        found.tls_cert = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(
                    "a client certificate needs both tls_cert=FILE and tls_key=FILE".into(),
                );
            }
        };
        found.tls |= found.tls_ca.is_some() || found.tls_cert.is_some();
        if auths.len() > 1 {
            return Err(
                "gives more than one way to authenticate: use one of USER:PASSWORD@, token=, nkey= or creds="
                    .into(),
            );
        }
        found.auth = auths.pop().unwrap_or_default();
        Ok(found)
    }
}

fn file(name: &str, value: String) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("{name}= names no file"));
    }
    Ok(PathBuf::from(value))
}

/// User-info is percent-encoded in a URL.
fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NatsServer, String> {
        NatsServer::parse(&NatsUrl::parse(text)?)
    }

    fn server_url(text: &str) -> String {
        NatsUrl::parse(text).unwrap().server_url()
    }

    #[test]
    fn reads_tls_and_each_kind_of_credentials() {
        let plain = parse("nats://127.0.0.1:4222").unwrap();
        assert_eq!(plain.servers, ["nats://127.0.0.1:4222"]);
        assert!(!plain.tls && plain.auth == Auth::None);
        assert!(parse("tls://h:4222").unwrap().tls);
        assert!(parse("nats://h?tls=true").unwrap().tls);
        let full = parse("nats://app:p%40ss@h:4222?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem")
            .unwrap();
        assert!(full.tls);
        assert_eq!(full.servers, ["nats://h:4222"]);
        assert_eq!(full.tls_ca, Some("/ca.pem".into()));
        assert_eq!(full.tls_cert, Some(("/c.pem".into(), "/k.pem".into())));
        assert!(full.auth == Auth::UserPassword("app".into(), "p@ss".into()));
        assert!(parse("nats://h?token=t0k").unwrap().auth == Auth::Token("t0k".into()));
        assert!(parse("nats://h?nkey=/s.nk").unwrap().auth == Auth::NKey("/s.nk".into()));
        assert!(parse("nats://h?creds=/u.creds").unwrap().auth == Auth::Creds("/u.creds".into()));
    }

    #[test]
    fn mistakes_are_explained_without_secrets() {
        for (text, expected) in [
            ("nats://h?tls_cert=/c.pem", "both tls_cert"),
            ("nats://h?tsl=true", "unknown option"),
            ("nats://h?tls=maybe", "true or false"),
            ("nats://u:secret@h?token=secret", "more than one way"),
            ("nats://secret@h", "no password"),
            ("nats://h?nkey=", "names no file"),
            ("nats://h1:4222,,h3:4222", "an empty server"),
            (
                "nats://u:secret@h1:4222,h2:port",
                "\"h2:port\" in the server list",
            ),
            ("tls://h1:4222,h2:99999", "in the server list"),
        ] {
            let error = parse(text).map(|_| ()).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("secret"), "{error}");
        }
    }

    #[test]
    fn the_server_url_keeps_the_options_and_drops_the_path() {
        assert_eq!(
            server_url("tls://u:p@h:4222/S/C?tls_ca=/ca.pem"),
            "tls://u:p@h:4222?tls_ca=/ca.pem"
        );
        assert_eq!(server_url("nats://h:4222/S/C"), "nats://h:4222");
    }

    #[test]
    fn a_server_list_reaches_every_server_with_the_same_options() {
        let text = "tls://app:p%40ss@n1.example:4222, n2.example:4223,10.0.0.3/ORDERS/billing?tls_ca=/ca.pem";
        let url = NatsUrl::parse(text).unwrap();
        assert_eq!(
            url.hosts,
            ["n1.example:4222", "n2.example:4223", "10.0.0.3"]
        );
        assert_eq!(url.url.path(), "/ORDERS/billing");
        assert_eq!(
            url.server_url(),
            "tls://app:p%40ss@n1.example:4222,n2.example:4223,10.0.0.3?tls_ca=/ca.pem"
        );
        let server = NatsServer::parse(&url).unwrap();
        assert_eq!(
            server.servers,
            [
                "tls://n1.example:4222",
                "tls://n2.example:4223",
                "tls://10.0.0.3"
            ]
        );
        assert!(server.tls && server.tls_ca == Some("/ca.pem".into()));
        assert!(server.auth == Auth::UserPassword("app".into(), "p@ss".into()));
        // IPv6 addresses keep their brackets; the list reads back as itself.
        let six = NatsUrl::parse("nats://[::1]:4222,[::1]:4223").unwrap();
        assert_eq!(six.hosts, ["[::1]:4222", "[::1]:4223"]);
        let again = NatsUrl::parse(&url.server_url()).unwrap();
        assert_eq!(again.hosts, url.hosts);
        assert!(NatsUrl::has_nats_scheme("NATS://a,b") && NatsUrl::has_nats_scheme("tls://a"));
        assert!(!NatsUrl::has_nats_scheme("kafka://a,b"));
    }
}
