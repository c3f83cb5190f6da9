//! NATS JetStream: how a server URL is read, for sources and destinations
//! alike (TLS and the credentials, from the URL's scheme, user-info and
//! query), and the header the key travels in; with the `nats` feature,
//! connecting (`connect`), the consumer transport (`consume`: pull,
//! explicit acks, ack-wait) and the publisher (`publish`).
//!
//! | part | meaning |
//! | --- | --- |
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

/// How to reach a NATS server and prove who is calling.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct NatsServer {
    /// `nats://HOST:PORT` or `tls://HOST:PORT`: no user-info, no query.
    pub(crate) server: String,
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
    pub(crate) fn parse(url: &Url) -> Result<Self, String> {
        let scheme = url.scheme();
        if scheme != "nats" && scheme != "tls" {
            return Err(format!(
                "scheme {scheme:?} is no NATS scheme: write nats:// or tls://"
            ));
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or("no host")?;
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        let mut found = Self {
            server: format!("{scheme}://{host}{port}"),
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

/// The URL's server part with its options, without the path: what the
/// source and destination keep as their `url`.
pub(crate) fn server_url(parsed: &Url) -> String {
    let mut server = parsed.clone();
    server.set_path("");
    server.set_fragment(None);
    let query = server.query().map(str::to_owned);
    server.set_query(None);
    let base = server.as_str().trim_end_matches('/').to_owned();
    match query {
        Some(query) if !query.is_empty() => format!("{base}?{query}"),
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NatsServer, String> {
        NatsServer::parse(&Url::parse(text).unwrap())
    }

    #[test]
    fn reads_tls_and_each_kind_of_credentials() {
        let plain = parse("nats://127.0.0.1:4222").unwrap();
        assert_eq!(plain.server, "nats://127.0.0.1:4222");
        assert!(!plain.tls && plain.auth == Auth::None);
        assert!(parse("tls://h:4222").unwrap().tls);
        assert!(parse("nats://h?tls=true").unwrap().tls);
        let full = parse("nats://app:p%40ss@h:4222?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem")
            .unwrap();
        assert!(full.tls);
        assert_eq!(full.server, "nats://h:4222");
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
        ] {
            let error = parse(text).map(|_| ()).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("secret"), "{error}");
        }
    }

    #[test]
    fn the_server_url_keeps_the_options_and_drops_the_path() {
        let url = Url::parse("tls://u:p@h:4222/S/C?tls_ca=/ca.pem").unwrap();
        assert_eq!(server_url(&url), "tls://u:p@h:4222?tls_ca=/ca.pem");
        let url = Url::parse("nats://h:4222/S/C").unwrap();
        assert_eq!(server_url(&url), "nats://h:4222");
    }
}
