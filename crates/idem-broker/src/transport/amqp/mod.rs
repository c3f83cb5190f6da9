//! RabbitMQ (AMQP 0-9-1): how its URL is read, for sources and destinations
//! alike; with the `amqp` feature, connecting (`connect`), the consumer
//! transport (`consume`: manual acks, prefetch) and the publisher (`publish`:
//! publisher confirms).
//!
//! `amqps://` connects with TLS (rustls, ring); the server's certificate is
//! verified against the system's roots and the CA file the URL names. The
//! names are RabbitMQ's URI query parameters, and the NATS URL's names are
//! accepted too:
//!
//! | option | also | meaning |
//! | --- | --- | --- |
//! | `cacertfile=FILE` | `tls_ca=FILE` | PEM file of the CA(s) that signed the server's certificate |
//! | `certfile=FILE` | `tls_cert=FILE` | client certificate, PEM |
//! | `keyfile=FILE` | `tls_key=FILE` | the client certificate's PKCS#8 key, PEM |
//!
//! Other query parameters (`heartbeat`, `channel_max`, `frame_max`,
//! `connection_timeout`, `auth_mechanism`) go to the client as before. The
//! URL is read in every build, so a destination or a source parses whatever
//! the features; the rest of this folder needs the `amqp` feature.
//!
//! AMQP has no URL for several servers. A cluster's nodes are written as a
//! list in the authority, `amqp://USER:PASS@HOST1:5672,HOST2:5672,HOST3/VHOST`
//! (`[::1]:5672` for an IPv6 address, 5672 or 5671 when a node gives no
//! port): the user, password, vhost and query apply to each, and every
//! connection, the first and each one made again after a loss, tries the
//! nodes in the order written and keeps the first that answers
//! ([`AmqpNodes`]). `connection_timeout=MS` bounds how long one node may
//! take to accept the TCP connection before the next is tried; a list
//! without it gets [`NODE_CONNECT_TIMEOUT_MS`], so that a node that drops
//! packets (a host gone, a partition) does not spend a whole connection
//! attempt before the next node is tried.

#[cfg(feature = "amqp")]
mod connect;
#[cfg(feature = "amqp")]
pub(crate) mod consume;
#[cfg(feature = "amqp")]
pub(crate) mod publish;

use std::path::PathBuf;

use url::Url;
use url::form_urlencoded;

/// How long one node of a list may take to accept the TCP connection when
/// the URL does not say (`connection_timeout=MS`): well under the connect
/// timeout of a whole attempt (10 s by default), so the next node is tried
/// within the same attempt.
pub(crate) const NODE_CONNECT_TIMEOUT_MS: u64 = 3000;

/// A RabbitMQ URL's nodes: the authority's host list cut apart, so that
/// each node is a URL of its own with the user-info, path and query of the
/// whole. A list (`h1:5672,h2:5672`) is no URL authority (a port list is no
/// port), so the URL parser only ever sees one node at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AmqpNodes {
    /// One URL per node, in the order written.
    pub(crate) urls: Vec<String>,
    /// The nodes as written (`HOST[:PORT]`), when the URL lists several.
    listed: Vec<String>,
}

impl AmqpNodes {
    /// Cuts `text` into its nodes. A URL with one node, or not `amqp://` or
    /// `amqps://`, is kept as it is; a
    /// list with an empty entry, or an entry that is no `HOST[:PORT]`, is
    /// refused, naming the entry (never the user-info, which holds the
    /// password).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let one = || Self {
            urls: vec![text.to_owned()],
            listed: Vec::new(),
        };
        let Some((scheme, rest)) = text.split_once("://").filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("amqp") || scheme.eq_ignore_ascii_case("amqps")
        }) else {
            return Ok(one());
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (user_info, list) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        if !list.contains(',') {
            return Ok(one());
        }
        let mut nodes = Self {
            urls: Vec::new(),
            listed: Vec::new(),
        };
        for entry in list.split(',').map(str::trim) {
            if entry.is_empty() {
                return Err(
                    "an empty node in the node list: write amqp://USER:PASS@HOST1:5672,HOST2:5672/VHOST"
                        .into(),
                );
            }
            let alone = Url::parse(&format!("{scheme}://{entry}"))
                .ok()
                .filter(|url| {
                    url.host_str().is_some_and(|h| !h.is_empty())
                        && url.path().is_empty()
                        && url.username().is_empty()
                        && url.password().is_none()
                });
            if alone.is_none() {
                return Err(format!(
                    "node {entry:?} in the node list is no HOST[:PORT] (an IPv6 address in brackets: [::1]:5672)"
                ));
            }
            nodes
                .urls
                .push(format!("{scheme}://{user_info}{entry}{tail}"));
            nodes.listed.push(entry.to_owned());
        }
        Ok(nodes)
    }

    /// `url`, written for the first node, with the whole list in its place:
    /// how a source or destination keeps the URL it was given.
    pub(crate) fn restore(&self, url: &str) -> String {
        if self.listed.is_empty() {
            return url.to_owned();
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return url.to_owned();
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let user_info = authority.rfind('@').map_or("", |at| &authority[..=at]);
        format!("{scheme}://{user_info}{}{tail}", self.listed.join(","))
    }
}

/// A RabbitMQ URL with its TLS options taken out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct AmqpServer {
    /// The URL the client is given for each node, in the order to try them:
    /// the TLS options removed.
    pub(crate) uris: Vec<String>,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<(PathBuf, PathBuf)>,
}

impl AmqpServer {
    /// Reads `url` (`amqp://` or `amqps://`, one node or a list of them).
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let nodes = AmqpNodes::parse(url)?;
        let parsed = Url::parse(&nodes.urls[0]).map_err(|e| e.to_string())?;
        let tls = match parsed.scheme() {
            "amqps" => true,
            "amqp" => false,
            other => return Err(format!("scheme {other:?} is not amqp:// or amqps://")),
        };
        let (mut ca, mut cert, mut key) = (None, None, None);
        let mut rest = form_urlencoded::Serializer::new(String::new());
        let mut kept = 0;
        for (name, value) in parsed.query_pairs() {
            let slot = match &*name {
                "cacertfile" | "tls_ca" => &mut ca,
                "certfile" | "tls_cert" => &mut cert,
                "keyfile" | "tls_key" => &mut key,
                _ => {
                    rest.append_pair(&name, &value);
                    kept += 1;
                    continue;
                }
            };
            if value.is_empty() {
                return Err(format!("{name}= names no file"));
            }
            if slot.replace(PathBuf::from(&*value)).is_some() {
                return Err(format!("gives the file of {name} twice"));
            }
        }
        let cert = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(
                    "a client certificate needs both certfile=FILE and keyfile=FILE".into(),
                );
            }
        };
        if !tls && (ca.is_some() || cert.is_some()) {
            return Err(
                "names TLS files but is not amqps://: write amqps://HOST:5671/... to connect with TLS"
                    .into(),
            );
        }
        let mut timeout_given = false;
        for (name, _) in parsed.query_pairs() {
            timeout_given |= name == "connection_timeout";
        }
        if nodes.urls.len() > 1 && !timeout_given {
            rest.append_pair("connection_timeout", &NODE_CONNECT_TIMEOUT_MS.to_string());
            kept += 1;
        }
        let query = (kept > 0).then(|| rest.finish());
        let mut uris = Vec::with_capacity(nodes.urls.len());
        for node in &nodes.urls {
            let mut uri = Url::parse(node).map_err(|e| e.to_string())?;
            uri.set_fragment(None);
            uri.set_query(query.as_deref());
            uris.push(uri.to_string());
        }
        Ok(Self { uris, ca, cert })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_tls_files_out_and_keeps_the_rest() {
        let server = AmqpServer::parse(
            "amqps://u:p@h:5671/%2f?heartbeat=10&cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem",
        )
        .unwrap();
        assert_eq!(server.uris, ["amqps://u:p@h:5671/%2f?heartbeat=10"]);
        assert_eq!(server.ca, Some("/ca.pem".into()));
        assert_eq!(server.cert, Some(("/c.pem".into(), "/k.pem".into())));
        let nats_names = AmqpServer::parse("amqps://h/v?tls_ca=/ca.pem").unwrap();
        assert_eq!(nats_names.uris, ["amqps://h/v"]);
        assert_eq!(nats_names.ca, Some("/ca.pem".into()));
        let plain = AmqpServer::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(plain.uris, ["amqp://guest:guest@127.0.0.1:5672/%2f"]);
    }

    #[test]
    fn a_node_list_is_one_url_per_node_with_the_same_credentials_vhost_and_query() {
        let server = AmqpServer::parse(
            "amqps://app:s3cret@r1:5671,r2,[::1]:5673/prod?heartbeat=10&cacertfile=/ca.pem",
        )
        .unwrap();
        assert_eq!(
            server.uris,
            [
                "amqps://app:s3cret@r1:5671/prod?heartbeat=10&connection_timeout=3000",
                "amqps://app:s3cret@r2/prod?heartbeat=10&connection_timeout=3000",
                "amqps://app:s3cret@[::1]:5673/prod?heartbeat=10&connection_timeout=3000",
            ]
        );
        assert_eq!(server.ca, Some("/ca.pem".into()));
        let given = AmqpServer::parse("amqp://r1,r2/v?connection_timeout=500").unwrap();
        assert_eq!(
            given.uris,
            [
                "amqp://r1/v?connection_timeout=500",
                "amqp://r2/v?connection_timeout=500"
            ]
        );
        let nodes = AmqpNodes::parse("amqp://u:p@h1:5672, h2:5673/v").unwrap();
        assert_eq!(nodes.urls, ["amqp://u:p@h1:5672/v", "amqp://u:p@h2:5673/v"]);
        assert_eq!(
            nodes.restore("amqp://u:p@h1:5672/v?heartbeat=5"),
            "amqp://u:p@h1:5672,h2:5673/v?heartbeat=5"
        );
        let one = AmqpNodes::parse("amqp://u:p@h1/v").unwrap();
        assert_eq!(one.urls, ["amqp://u:p@h1/v"]);
        assert_eq!(one.restore("amqp://u:p@h1/v"), "amqp://u:p@h1/v");
    }

    #[test]
    fn a_wrong_node_is_named_without_the_password() {
        for (text, expected) in [
            ("amqp://u:s3cret@h1:5672,,h3/v", "an empty node"),
            ("amqp://u:s3cret@h1:5672,h2:x/v", "\"h2:x\""),
            ("amqp://u:s3cret@h1,h2:5672:1/v", "\"h2:5672:1\""),
            ("amqp://u:s3cret@h1,::1/v", "brackets"),
        ] {
            let error = AmqpServer::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("s3cret"), "{text}: {error}");
        }
    }

    #[test]
    fn mistakes_are_explained() {
        for (text, expected) in [
            ("amqp://h/v?cacertfile=/ca.pem", "amqps://"),
            ("amqps://h/v?certfile=/c.pem", "keyfile"),
            ("amqps://h/v?cacertfile=", "names no file"),
            ("amqps://h/v?cacertfile=/a&tls_ca=/b", "twice"),
        ] {
            let error = AmqpServer::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
