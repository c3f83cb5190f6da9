//! How a RabbitMQ URL's TLS options are read, for sources and destinations
//! alike.
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
//! `connection_timeout`, `auth_mechanism`) go to the client as before.

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
    /// The URL as the client's own type. The client's parser takes the host
    /// from the URL's domain name only and puts `localhost` in place of an IP
    /// address, so an address is set here from the URL itself.
    #[cfg(feature = "amqp")]
    pub(crate) fn client_uri(&self) -> Result<lapin::uri::AMQPUri, String> {
        let mut uri: lapin::uri::AMQPUri = self.uri.parse()?;
        match Url::parse(&self.uri).map_err(|e| e.to_string())?.host() {
            Some(url::Host::Ipv4(ip)) => uri.authority.host = ip.to_string(),
            Some(url::Host::Ipv6(ip)) => uri.authority.host = ip.to_string(),
            _ => {}
        }
        Ok(uri)
    }

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

/// Why a RabbitMQ connection was not made.
#[cfg(feature = "amqp")]
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// The URL or a file it names is wrong.
    Config(String),
    /// The server's certificate did not verify, or the handshake failed.
    Tls(String),
    /// What the client said, and advice when there is some: the failure
    /// may pass (a broker restarting), so connecting again is tried.
    Client(lapin::Error, Option<&'static str>),
}

/// Connects to the RabbitMQ `url` names, with TLS as its options say.
#[cfg(feature = "amqp")]
pub(crate) async fn connect(
    url: &str,
    properties: lapin::ConnectionProperties,
) -> Result<lapin::Connection, ConnectFailure> {
    use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};

    let server = AmqpServer::parse(url).map_err(ConnectFailure::Config)?;
    let read = |what: &str, path: &PathBuf| {
        std::fs::read(path)
            .map_err(|e| ConnectFailure::Config(format!("{what} file {}: {e}", path.display())))
    };
    let cert_chain = match &server.ca {
        Some(path) => Some(String::from_utf8(read("cacertfile", path)?).map_err(|_| {
            ConnectFailure::Config(format!(
                "cacertfile file {} is not PEM text",
                path.display()
            ))
        })?),
        None => None,
    };
    let identity = match &server.cert {
        Some((cert, key)) => Some(OwnedIdentity::PKCS8 {
            pem: read("certfile", cert)?,
            key: read("keyfile", key)?,
        }),
        None => None,
    };
    let runtime = lapin::runtime::default_runtime().map_err(|e| ConnectFailure::Client(e, None))?;
    let tls = server.ca.is_some() || server.cert.is_some() || url.starts_with("amqps:");
    lapin::Connection::connect_uri_with_config(
        server.client_uri().map_err(ConnectFailure::Config)?,
        properties,
        OwnedTLSConfig {
            identity,
            cert_chain,
        },
        runtime,
    )
    .await
    .map_err(|error| {
        let text = error.to_string();
        if tls && text.contains("CertificateRequired") {
            ConnectFailure::Tls(format!(
                "the server requires a client certificate ({text}): give certfile=FILE&keyfile=FILE"
            ))
        } else if tls && text.contains("certificate") {
            ConnectFailure::Tls(format!(
                "the server's certificate did not verify ({text}); give the CA that signed it with cacertfile=FILE, and connect by a name or address the certificate holds"
            ))
        } else if tls && (text.contains("tls") || text.contains("TLS") || text.contains("alert")) {
            ConnectFailure::Tls(format!(
                "TLS failed ({text}); check cacertfile=, certfile= and keyfile=, and that the port speaks TLS (RabbitMQ's is 5671)"
            ))
        } else if tls && server.cert.is_none() && (text.contains("reset") || text.contains("closed")) {
            // TLS 1.3: a server that wants a client certificate says so by
            // ending the connection after the handshake.
            ConnectFailure::Client(
                error,
                Some("the server ended the TLS connection: if it requires a client certificate, give certfile=FILE&keyfile=FILE"),
            )
        } else {
            ConnectFailure::Client(error, None)
        }
    })
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
        #[cfg(feature = "amqp")]
        {
            let by_address = AmqpServer::parse("amqp://u:p@10.1.2.3:5673/v").unwrap();
            let uri = by_address.client_uri().unwrap();
            assert_eq!(uri.authority.host, "10.1.2.3");
            assert_eq!(uri.authority.port, 5673);
            let v6 = AmqpServer::parse("amqps://[::1]/v")
                .unwrap()
                .client_uri()
                .unwrap();
            assert_eq!(v6.authority.host, "::1");
            let named = AmqpServer::parse("amqp://rabbit.internal/v")
                .unwrap()
                .client_uri()
                .unwrap();
            assert_eq!(named.authority.host, "rabbit.internal");
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
