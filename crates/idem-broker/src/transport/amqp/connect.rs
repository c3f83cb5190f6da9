//! Connecting to RabbitMQ: the TLS files the URL names are read, the
//! connection is made with them, and a failure is explained in words that
//! say what to change.

use std::path::PathBuf;

use url::Url;

use super::AmqpServer;

impl AmqpServer {
    /// The URL as the client's own type. The client's parser takes the host
    /// from the URL's domain name only and puts `localhost` in place of an IP
    /// address, so an address is set here from the URL itself.
    fn client_uri(&self) -> Result<lapin::uri::AMQPUri, String> {
        let mut uri: lapin::uri::AMQPUri = self.uri.parse()?;
        match Url::parse(&self.uri).map_err(|e| e.to_string())?.host() {
            Some(url::Host::Ipv4(ip)) => uri.authority.host = ip.to_string(),
            Some(url::Host::Ipv6(ip)) => uri.authority.host = ip.to_string(),
            _ => {}
        }
        Ok(uri)
    }
}

/// Why a RabbitMQ connection was not made.
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
    fn the_client_is_given_the_host_as_the_url_names_it() {
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
