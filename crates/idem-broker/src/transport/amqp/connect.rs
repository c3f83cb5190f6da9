//! Connecting to RabbitMQ: the TLS files the URL names are read, the
//! connection is made with them, and a failure is explained in words that
//! say what to change.
//!
//! A URL that lists several nodes of a cluster is tried node by node, in the
//! order written, on every connection: the first that accepts the
//! connection is kept. The client holds one connection and does not move it
//! by itself; when it is lost, the transport or publisher above calls
//! [`connect`] again, which starts from the first node once more, so a node
//! back from a restart is used again for the next connection.
//!
//! Each node of a list but the last has a bound on its whole attempt — TCP,
//! TLS and the AMQP handshake — of its `connection_timeout` (3 s unless the
//! URL says), so a node that takes the TCP connection and then says
//! nothing (a broker half up, a proxy in front of a dead node) is given up
//! in time for the next one to be tried within the same attempt. The last
//! node has the rest of the attempt.

use std::path::PathBuf;
use std::time::Duration;

use idem_core::redact_url;
use url::Url;

use super::AmqpServer;

/// A node's URL as the client's own type. The client's parser takes the
/// host from the URL's domain name only and puts `localhost` in place of an
/// IP address, so an address is set here from the URL itself.
fn client_uri(node: &str) -> Result<lapin::uri::AMQPUri, String> {
    let mut uri: lapin::uri::AMQPUri = node.parse()?;
    match Url::parse(node).map_err(|e| e.to_string())?.host() {
        Some(url::Host::Ipv4(ip)) => uri.authority.host = ip.to_string(),
        Some(url::Host::Ipv6(ip)) => uri.authority.host = ip.to_string(),
        _ => {}
    }
    Ok(uri)
}

/// Why a RabbitMQ connection was not made.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// The URL or a file it names is wrong.
    Config(String),
    /// The server's certificate did not verify, or the handshake failed.
    Tls(String),
    /// A node of a list did not finish connecting within its bound (it took
    /// the TCP connection, or never answered, and the handshake did not
    /// complete): the next node is tried.
    Silent(Duration),
    /// What the client said, and advice when there is some: the failure
    /// may pass (a broker restarting), so connecting again is tried.
    Client(lapin::Error, Option<&'static str>),
}

/// Connects to the RabbitMQ `url` names, with TLS as its options say.
pub(crate) async fn connect(
    url: &str,
    properties: lapin::ConnectionProperties,
) -> Result<lapin::Connection, ConnectFailure> {
    use lapin::tcp::OwnedIdentity;

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
    let tls = server.ca.is_some() || server.cert.is_some() || url.starts_with("amqps:");
    let mut failure = None;
    for (index, node) in server.uris.iter().enumerate() {
        let attempt = connect_node(
            node,
            properties.clone(),
            &server,
            tls,
            cert_chain.clone(),
            identity.clone(),
        );
        let tried = if index + 1 < server.uris.len() {
            let bound = node_bound(node)?;
            match tokio::time::timeout(bound, attempt).await {
                Ok(tried) => tried,
                Err(_) => Err(ConnectFailure::Silent(bound)),
            }
        } else {
            attempt.await
        };
        match tried {
            Ok(connection) => {
                if index > 0 {
                    tracing::info!(
                        node = %redact_url(node),
                        "connected to RabbitMQ through node {} of {} of the URL",
                        index + 1,
                        server.uris.len()
                    );
                }
                return Ok(connection);
            }
            // A wrong URL or file is wrong for every node.
            Err(config @ ConnectFailure::Config(_)) => return Err(config),
            Err(other) => {
                if server.uris.len() > 1 {
                    tracing::warn!(
                        node = %redact_url(node),
                        error = %other,
                        "a RabbitMQ node of the URL did not take the connection; trying the next"
                    );
                }
                failure = Some(other);
            }
        }
    }
    Err(failure.unwrap_or_else(|| ConnectFailure::Config("the URL names no node".into())))
}

/// How long a node of a list that is not the last may take over its whole
/// attempt: its `connection_timeout`, which a list always has.
fn node_bound(node: &str) -> Result<Duration, ConnectFailure> {
    let uri = client_uri(node).map_err(ConnectFailure::Config)?;
    Ok(Duration::from_millis(
        uri.query
            .connection_timeout
            .unwrap_or(super::NODE_CONNECT_TIMEOUT_MS),
    ))
}

/// One attempt on one node.
async fn connect_node(
    node: &str,
    properties: lapin::ConnectionProperties,
    server: &AmqpServer,
    tls: bool,
    cert_chain: Option<String>,
    identity: Option<lapin::tcp::OwnedIdentity>,
) -> Result<lapin::Connection, ConnectFailure> {
    let runtime = lapin::runtime::default_runtime().map_err(|e| ConnectFailure::Client(e, None))?;
    lapin::Connection::connect_uri_with_config(
        client_uri(node).map_err(ConnectFailure::Config)?,
        properties,
        lapin::tcp::OwnedTLSConfig {
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

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(why) | Self::Tls(why) => f.write_str(why),
            Self::Silent(bound) => write!(
                f,
                "the node did not complete the connection (TCP, TLS and the AMQP handshake) within {} ms; set connection_timeout=MS in the URL to give each node longer",
                bound.as_millis()
            ),
            Self::Client(error, None) => write!(f, "{error}"),
            Self::Client(error, Some(advice)) => write!(f, "{error}; {advice}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_given_the_host_as_the_url_names_it() {
        let by_address = AmqpServer::parse("amqp://u:p@10.1.2.3:5673/v").unwrap();
        let uri = client_uri(&by_address.uris[0]).unwrap();
        assert_eq!(uri.authority.host, "10.1.2.3");
        assert_eq!(uri.authority.port, 5673);
        let v6 = client_uri(&AmqpServer::parse("amqps://[::1]/v").unwrap().uris[0]).unwrap();
        assert_eq!(v6.authority.host, "::1");
        let named =
            client_uri(&AmqpServer::parse("amqp://rabbit.internal/v").unwrap().uris[0]).unwrap();
        assert_eq!(named.authority.host, "rabbit.internal");
    }

    #[test]
    fn each_node_of_a_list_gets_its_host_and_port_and_the_default_port() {
        let server =
            AmqpServer::parse("amqp://app:pw@10.0.0.1:5673,rabbit-2,[fd00::3]/prod?heartbeat=7")
                .unwrap();
        let nodes: Vec<(String, u16, String, u16)> = server
            .uris
            .iter()
            .map(|node| {
                let uri = client_uri(node).unwrap();
                (
                    uri.authority.host,
                    uri.authority.port,
                    uri.vhost,
                    uri.query.heartbeat.unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [
                ("10.0.0.1".into(), 5673, "prod".into(), 7),
                ("rabbit-2".into(), 5672, "prod".into(), 7),
                ("fd00::3".into(), 5672, "prod".into(), 7),
            ]
        );
        for node in &server.uris {
            let uri = client_uri(node).unwrap();
            assert_eq!(uri.authority.userinfo.username, "app");
            assert_eq!(uri.authority.userinfo.password, "pw");
        }
        assert_eq!(
            client_uri(&server.uris[1])
                .unwrap()
                .query
                .connection_timeout,
            Some(super::super::NODE_CONNECT_TIMEOUT_MS)
        );
        let tls = AmqpServer::parse("amqps://a,b:5999/v").unwrap();
        let ports: Vec<u16> = tls
            .uris
            .iter()
            .map(|node| client_uri(node).unwrap().authority.port)
            .collect();
        assert_eq!(ports, [5671, 5999]);
    }
}
