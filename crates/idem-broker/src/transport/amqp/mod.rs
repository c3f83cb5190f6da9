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

#[cfg(feature = "amqp")]
mod connect;
#[cfg(feature = "amqp")]
pub(crate) mod consume;
#[cfg(feature = "amqp")]
pub(crate) mod publish;

use std::path::PathBuf;

use url::Url;
use url::form_urlencoded;

/// A RabbitMQ URL with its TLS options taken out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct AmqpServer {
    /// The URL the client is given: the TLS options removed.
    pub(crate) uri: String,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<(PathBuf, PathBuf)>,
}

impl AmqpServer {
    /// Reads `url` (`amqp://` or `amqps://`).
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let parsed = Url::parse(url).map_err(|e| e.to_string())?;
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
        let mut uri = parsed;
        uri.set_fragment(None);
        if kept == 0 {
            uri.set_query(None);
        } else {
            uri.set_query(Some(&rest.finish()));
        }
        Ok(Self {
            uri: uri.to_string(),
            ca,
            cert,
        })
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
        assert_eq!(server.uri, "amqps://u:p@h:5671/%2f?heartbeat=10");
        assert_eq!(server.ca, Some("/ca.pem".into()));
        assert_eq!(server.cert, Some(("/c.pem".into(), "/k.pem".into())));
        let nats_names = AmqpServer::parse("amqps://h/v?tls_ca=/ca.pem").unwrap();
        assert_eq!(nats_names.uri, "amqps://h/v");
        assert_eq!(nats_names.ca, Some("/ca.pem".into()));
        let plain = AmqpServer::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(plain.uri, "amqp://guest:guest@127.0.0.1:5672/%2f");
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
