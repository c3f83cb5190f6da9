//! A TLS-terminating proxy for tests: listens with TLS on a loopback port
//! (a certificate from [`TestCa`](crate::tls::TestCa)) and forwards each
//! connection's plain bytes to a loopback target, for a server that speaks
//! no TLS of its own (a Kafka-protocol broker, say).
//!
//! Clients see a real TLS server: a client that does not trust the CA, that
//! speaks no TLS, or (with [`TlsProxy::start_requiring_client_certs`]) that
//! presents no certificate signed by the given CA fails the handshake and
//! never reaches the target. The proxy can listen before the target does (a
//! server that must advertise the proxy's address is started after it): each
//! connection reaches for the target only once its handshake succeeded.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use idem_testkit::tls::TestCa;
//! use idem_testkit::tlsproxy::TlsProxy;
//!
//! let ca = TestCa::new("test CA");
//! let proxy = TlsProxy::start("127.0.0.1:9092".parse().unwrap(), &ca.server("broker")).await?;
//! // clients connect with TLS to proxy.addr(), trusting ca.pem()
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

use crate::tls::Issued;

/// A running proxy; stops accepting when dropped (connections already
/// forwarded end when either side closes).
#[derive(Debug)]
pub struct TlsProxy {
    addr: SocketAddr,
    failures: Arc<Mutex<Vec<String>>>,
    accept: JoinHandle<()>,
}

impl TlsProxy {
    /// Listens on `127.0.0.1:0` with `server`'s certificate and forwards to
    /// `target`, which must be a loopback address.
    pub async fn start(target: SocketAddr, server: &Issued) -> std::io::Result<Self> {
        Self::listen(target, server, None).await
    }

    /// Like [`start`](Self::start), and every client must present a
    /// certificate signed by `client_ca`.
    pub async fn start_requiring_client_certs(
        target: SocketAddr,
        server: &Issued,
        client_ca: CertificateDer<'static>,
    ) -> std::io::Result<Self> {
        Self::listen(target, server, Some(client_ca)).await
    }

    async fn listen(
        target: SocketAddr,
        server: &Issued,
        client_ca: Option<CertificateDer<'static>>,
    ) -> std::io::Result<Self> {
        if !target.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the TLS proxy only forwards to loopback addresses, not {target}"),
            ));
        }
        let config = server_config(server, client_ca).map_err(std::io::Error::other)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let failures = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(Arc::new(config)),
            target,
            Arc::clone(&failures),
        ));
        Ok(Self {
            addr,
            failures,
            accept,
        })
    }

    /// Where clients connect (with TLS).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Why handshakes failed so far, oldest first (rustls's errors, or a
    /// target that could not be reached).
    pub fn failures(&self) -> Vec<String> {
        self.failures.lock().expect("the failures").clone()
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn server_config(
    server: &Issued,
    client_ca: Option<CertificateDer<'static>>,
) -> Result<ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca)?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| rustls::Error::General(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(
        vec![server.der.clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key_der.clone())),
    )
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    target: SocketAddr,
    failures: Arc<Mutex<Vec<String>>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, failures) = (acceptor.clone(), Arc::clone(&failures));
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let mut tls = match acceptor.accept(client).await {
                Ok(tls) => tls,
                Err(error) => {
                    failures
                        .lock()
                        .expect("the failures")
                        .push(format!("TLS handshake: {error}"));
                    return;
                }
            };
            let mut server = match TcpStream::connect(target).await {
                Ok(server) => server,
                Err(error) => {
                    failures
                        .lock()
                        .expect("the failures")
                        .push(format!("connect to {target}: {error}"));
                    return;
                }
            };
            let _ = server.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TestCa;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;
    use tokio_rustls::rustls::ClientConfig;

    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    fn client(ca: &TestCa, identity: Option<&Issued>) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        roots.add(ca.der()).unwrap();
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some(issued) => builder
                .with_client_auth_cert(
                    vec![issued.der.clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(issued.key_der.clone())),
                )
                .unwrap(),
        };
        TlsConnector::from(Arc::new(config))
    }

    async fn round_trip(connector: &TlsConnector, addr: SocketAddr) -> std::io::Result<[u8; 4]> {
        let stream = TcpStream::connect(addr).await?;
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, stream).await?;
        tls.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        tls.read_exact(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn forwards_over_tls_and_refuses_an_untrusted_client() {
        let ca = TestCa::new("proxy CA");
        let proxy = TlsProxy::start(echo().await, &ca.server("proxy"))
            .await
            .unwrap();
        assert_eq!(
            &round_trip(&client(&ca, None), proxy.addr()).await.unwrap(),
            b"ping"
        );

        let other = TestCa::new("other CA");
        let refused = round_trip(&client(&other, None), proxy.addr())
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");

        // Plain bytes are not a TLS handshake: nothing reaches the target.
        let mut plain = TcpStream::connect(proxy.addr()).await.unwrap();
        plain.write_all(b"ping, in the clear").await.unwrap();
        let mut answer = Vec::new();
        let _ = plain.read_to_end(&mut answer).await;
        assert!(!answer.starts_with(b"ping"), "{answer:?}");
    }

    #[tokio::test]
    async fn requires_client_certificates_when_asked() {
        let ca = TestCa::new("proxy CA");
        let proxy =
            TlsProxy::start_requiring_client_certs(echo().await, &ca.server("proxy"), ca.der())
                .await
                .unwrap();
        let with = client(&ca, Some(&ca.client("app")));
        assert_eq!(&round_trip(&with, proxy.addr()).await.unwrap(), b"ping");
        // TLS 1.3: the client learns of the refusal at its first read.
        assert!(round_trip(&client(&ca, None), proxy.addr()).await.is_err());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !proxy.failures().iter().any(|f| f.contains("certificate")) {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                proxy.failures()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn refuses_a_target_off_loopback() {
        let ca = TestCa::new("proxy CA");
        let error = TlsProxy::start("192.0.2.1:9092".parse().unwrap(), &ca.server("proxy"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("loopback"));
    }
}
