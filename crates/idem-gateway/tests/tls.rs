//! The gateway over real TLS: throwaway CAs and certificates (rcgen), an
//! HTTPS upstream (axum over tokio-rustls), and the gateway's HTTPS listener
//! in front of it, with certificate reload, client certificates, and the
//! admin listener's bearer token.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use idem::StoreLocation;
use idem_gateway::admin::{AdminError, AdminToken};
use idem_gateway::{
    self as gateway, self, CertReloader, Gateway, GatewayConfig, ListenerTls, TLS_SUBJECT_HEADER,
    UpstreamTls,
};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use idem_testkit::tls::{Issued, TestCa as Ca};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The upstream over TLS: counts its effects, and echoes the principal
/// header it was given.
struct HttpsUpstream {
    addr: SocketAddr,
    effects: Arc<AtomicUsize>,
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn pay(State(effects): State<Arc<AtomicUsize>>, headers: HeaderMap) -> (StatusCode, String) {
    let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
    let subject = headers
        .get(TLS_SUBJECT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    (
        StatusCode::CREATED,
        format!("payment {n} for {subject} via {proto}"),
    )
}

impl HttpsUpstream {
    async fn start(cert: &Issued) -> Self {
        Self::serving(
            cert.der.clone(),
            PrivateKeyDer::try_from(cert.key_der.clone()).unwrap(),
        )
        .await
    }

    /// The upstream serving `cert` (alone) with `key`.
    async fn serving(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> Self {
        let effects = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/pay", post(pay))
            .with_state(Arc::clone(&effects));
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request: Request<_>| {
                        let app = app.clone();
                        async move {
                            use tower::ServiceExt;
                            Ok::<_, Infallible>(
                                app.oneshot(request.map(axum::body::Body::new))
                                    .await
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            effects,
            _task: AbortOnDrop(task),
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }
}

/// A running gateway over TLS.
struct RunningGateway {
    addr: SocketAddr,
    reloader: CertReloader,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl RunningGateway {
    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).ok();
        (&mut self.task).await.unwrap().unwrap();
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The gateway's files: its certificate and key, and the upstream's CA.
struct Setup {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    upstream_ca: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    runtime: idem_gateway::Runtime,
}

impl Setup {
    fn new(server: &Issued) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cert = write(dir.path(), "gateway.pem", &server.cert_pem);
        let key = write(dir.path(), "gateway.key", &server.key_pem);
        Self {
            dir,
            cert,
            key,
            upstream_ca: None,
            client_ca: None,
            runtime: idem_gateway::Runtime::default(),
        }
    }

    fn serving_on(mut self, runtime: idem_gateway::Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    fn trust_upstream(mut self, ca: &Ca) -> Self {
        self.upstream_ca = Some(write(self.dir.path(), "upstream-ca.pem", &ca.pem()));
        self
    }

    fn require_clients(mut self, ca: &Ca) -> Self {
        self.client_ca = Some(write(self.dir.path(), "client-ca.pem", &ca.pem()));
        self
    }

    async fn start(self, upstream: &str) -> RunningGateway {
        let tls = ListenerTls {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: self.client_ca.clone(),
        };
        let (server_config, reloader) = tls.load().unwrap();
        let mut idempotency = IdempotencyConfig::default();
        let mut config = GatewayConfig::new(upstream.parse().unwrap()).runtime(self.runtime);
        if self.client_ca.is_some() {
            idempotency =
                idempotency.principal_header(http::HeaderName::from_static(TLS_SUBJECT_HEADER));
            config = config.principal_from_tls_subject();
        }
        let upstream_tls = UpstreamTls {
            ca: self.upstream_ca.clone(),
            ..UpstreamTls::default()
        };
        config = config.upstream_tls(upstream_tls.client_config().unwrap());
        let location = StoreLocation::Sqlite(self.dir.path().join("idem.db"));
        let layer = IdempotencyLayer::open(&location, idempotency)
            .await
            .unwrap();
        let gateway = Gateway::new(layer, config).with_tls(server_config);
        let local = "127.0.0.1:0".parse().unwrap();
        let listener = match self.runtime {
            idem_gateway::Runtime::PerCore => gateway::bind_per_core(local).await.unwrap(),
            _ => TcpListener::bind(local).await.unwrap(),
        };
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(gateway::run(listener, gateway, async {
            stopped.await.ok();
        }));
        RunningGateway {
            addr,
            reloader,
            stop: Some(stop),
            task,
            _dir: self.dir,
        }
    }
}

/// A TLS client connection (HTTP/1.1, kept alive) to `addr`, trusting
/// `roots`, showing `identity` if given.
async fn connect(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
    identity: Option<&Issued>,
) -> Result<SendRequest<Full<Bytes>>, String> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder
            .with_client_auth_cert(
                vec![id.der.clone()],
                PrivateKeyDer::try_from(id.key_der.clone()).unwrap(),
            )
            .unwrap(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// The certificate the server at `addr` shows.
async fn served_cert(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
) -> CertificateDer<'static> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// A keyed POST; its status, whether it was a replay, and its body.
async fn post_keyed(
    sender: &mut SendRequest<Full<Bytes>>,
    key: &str,
) -> Result<(StatusCode, bool, String), String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let request = Request::post("/pay")
        .header("host", "localhost")
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":5}")))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Ok((
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

#[tokio::test]
async fn a_keyed_post_over_https_is_forwarded_to_an_https_upstream_and_replayed() {
    keyed_post_over_https(idem_gateway::Runtime::PerCore).await;
}

#[tokio::test]
async fn a_keyed_post_over_https_is_forwarded_and_replayed_on_the_shared_runtime() {
    keyed_post_over_https(idem_gateway::Runtime::Shared).await;
}

async fn keyed_post_over_https(runtime: idem_gateway::Runtime) {
    let ca = Ca::new("test CA");
    let upstream = HttpsUpstream::start(&ca.server("upstream")).await;
    let gateway = Setup::new(&ca.server("gateway"))
        .trust_upstream(&ca)
        .serving_on(runtime)
        .start(&upstream.url())
        .await;

    let mut client = connect(gateway.addr, &[ca.der()], None).await.unwrap();
    let (status, replayed, body) = post_keyed(&mut client, "k-1").await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!replayed);
    assert_eq!(body, "payment 1 for - via https");
    let (status, replayed, again) = post_keyed(&mut client, "k-1").await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed, "the retry is a replay");
    assert_eq!(again, body);
    assert_eq!(upstream.effects(), 1);
    gateway.stop().await;
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_gateway_ca_is_refused() {
    let ca = Ca::new("test CA");
    let other = Ca::new("another CA");
    let upstream = HttpsUpstream::start(&ca.server("upstream")).await;
    let gateway = Setup::new(&ca.server("gateway"))
        .trust_upstream(&ca)
        .start(&upstream.url())
        .await;
    let error = connect(gateway.addr, &[other.der()], None)
        .await
        .expect_err("the handshake fails");
    assert!(
        error.contains("invalid peer certificate") && error.contains("UnknownIssuer"),
        "{error}"
    );
    assert_eq!(upstream.effects(), 0);
}

#[tokio::test]
async fn an_upstream_whose_certificate_does_not_verify_gives_a_502_that_says_so() {
    let ca = Ca::new("test CA");
    let upstream = HttpsUpstream::start(&ca.server("upstream")).await;
    // No upstream CA: webpki's bundled roots, which do not know the test CA.
    let gateway = Setup::new(&ca.server("gateway"))
        .start(&upstream.url())
        .await;
    let mut client = connect(gateway.addr, &[ca.der()], None).await.unwrap();
    let (status, replayed, body) = post_keyed(&mut client, "k-1").await.unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(!replayed);
    assert!(body.contains("certificate"), "{body}");
    assert_eq!(upstream.effects(), 0);
    // Nothing was sent, so the key was released: the retry goes upstream.
    let (status, _, _) = post_keyed(&mut client, "k-1").await.unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn a_reloaded_certificate_is_served_to_new_connections_while_open_ones_go_on() {
    let ca = Ca::new("test CA");
    let upstream = HttpsUpstream::start(&ca.server("upstream")).await;
    let first = ca.server("gateway-1");
    let setup = Setup::new(&first).trust_upstream(&ca);
    let (cert_path, key_path) = (setup.cert.clone(), setup.key.clone());
    let gateway = setup.start(&upstream.url()).await;

    let mut open = connect(gateway.addr, &[ca.der()], None).await.unwrap();
    let (status, _, _) = post_keyed(&mut open, "before").await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(served_cert(gateway.addr, &[ca.der()]).await, first.der);

    // A bad new file: the old certificate stays.
    std::fs::write(&cert_path, "not a certificate").unwrap();
    let error = gateway.reloader.reload().unwrap_err().to_string();
    assert!(error.contains("gateway.pem"), "{error}");
    assert_eq!(served_cert(gateway.addr, &[ca.der()]).await, first.der);

    let second = ca.server("gateway-2");
    std::fs::write(&cert_path, &second.cert_pem).unwrap();
    std::fs::write(&key_path, &second.key_pem).unwrap();
    gateway.reloader.reload().unwrap();
    assert_eq!(served_cert(gateway.addr, &[ca.der()]).await, second.der);

    // The connection opened before the reload is still served.
    let (status, replayed, _) = post_keyed(&mut open, "after").await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert!(!replayed);
    let (_, replayed, _) = post_keyed(&mut open, "before").await.unwrap();
    assert!(replayed);
    assert_eq!(upstream.effects(), 2);
    gateway.stop().await;
}

#[tokio::test]
async fn the_certificate_is_reloaded_when_its_files_change() {
    let ca = Ca::new("test CA");
    let upstream = HttpsUpstream::start(&ca.server("upstream")).await;
    let setup = Setup::new(&ca.server("gateway-1")).trust_upstream(&ca);
    let (cert_path, key_path) = (setup.cert.clone(), setup.key.clone());
    let gateway = setup.start(&upstream.url()).await;
    let watch = gateway.reloader.watch(std::time::Duration::from_millis(50));
    let second = ca.server("gateway-2");
    std::fs::write(&key_path, &second.key_pem).unwrap();
    std::fs::write(&cert_path, &second.cert_pem).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while served_cert(gateway.addr, &[ca.der()]).await != second.der {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    watch.abort();
}

#[tokio::test]
async fn with_client_certificates_required_their_subject_scopes_the_keys() {
    let ca = Ca::new("test CA");
    let clients = Ca::new("client CA");
    let upstream = HttpsUpstream::start(&ca.server("upstream")).await;
    let gateway = Setup::new(&ca.server("gateway"))
        .trust_upstream(&ca)
        .require_clients(&clients)
        .start(&upstream.url())
        .await;

    // No client certificate: refused (TLS 1.3 reports it on the first use).
    let refused = match connect(gateway.addr, &[ca.der()], None).await {
        Err(error) => error,
        Ok(mut sender) => post_keyed(&mut sender, "k").await.unwrap_err(),
    };
    assert!(!refused.is_empty());
    // A certificate from a CA the gateway does not accept: refused too.
    let stranger = ca.client("mallory");
    let refused = match connect(gateway.addr, &[ca.der()], Some(&stranger)).await {
        Err(error) => error,
        Ok(mut sender) => post_keyed(&mut sender, "k").await.unwrap_err(),
    };
    assert!(!refused.is_empty());
    assert_eq!(upstream.effects(), 0);

    let alice = clients.client("alice");
    let bob = clients.client("bob");
    let mut as_alice = connect(gateway.addr, &[ca.der()], Some(&alice))
        .await
        .unwrap();
    let mut as_bob = connect(gateway.addr, &[ca.der()], Some(&bob))
        .await
        .unwrap();
    let (status, _, body) = post_keyed(&mut as_alice, "same").await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body, "payment 1 for alice via https");
    // The same key from another subject is not a duplicate.
    let (status, replayed, body) = post_keyed(&mut as_bob, "same").await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert!(!replayed);
    assert_eq!(body, "payment 2 for bob via https");
    // Alice's retry is replayed, and a spoofed subject header changes nothing.
    as_alice.ready().await.unwrap();
    let spoofed = Request::post("/pay")
        .header("host", "localhost")
        .header("idempotency-key", "\"same\"")
        .header(TLS_SUBJECT_HEADER, "bob")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":5}")))
        .unwrap();
    let response = as_alice.send_request(spoofed).await.unwrap();
    assert!(response.headers().contains_key("idempotent-replayed"));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"payment 1 for alice via https");
    assert_eq!(upstream.effects(), 2);
    gateway.stop().await;
}

#[tokio::test]
async fn bad_tls_files_are_refused_with_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let good = ca.server("gateway");
    let cert = write(dir.path(), "cert.pem", &good.cert_pem);
    let key = write(dir.path(), "key.pem", &good.key_pem);
    let garbage = write(dir.path(), "garbage.pem", "hello");
    let other_key = write(dir.path(), "other.key", &ca.server("x").key_pem);
    let missing = dir.path().join("missing.pem");
    for (cert, key, expected) in [
        (&missing, &key, "cannot read the TLS certificate"),
        (&garbage, &key, "no certificate in it"),
        (&cert, &garbage, "no private key in it"),
        (&cert, &other_key, "does not belong to"),
    ] {
        let tls = ListenerTls {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: None,
        };
        let error = tls.load().unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
    let upstream = UpstreamTls {
        ca: Some(garbage.clone()),
        ..UpstreamTls::default()
    };
    let error = upstream.client_config().unwrap_err().to_string();
    assert!(
        error.contains("upstream CA file") && error.contains("garbage.pem"),
        "{error}"
    );
}

async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (StatusCode, HeaderMap) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = Request::get(path).header("host", "admin");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    (response.status(), response.headers().clone())
}

#[tokio::test]
async fn a_non_loopback_admin_listener_needs_a_token_and_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::Sqlite(dir.path().join("idem.db"));
    let store = idem::AnyStore::open(&location).await.unwrap();

    let refused = idem_gateway::admin::start_admin("0.0.0.0:0".parse().unwrap(), store.clone())
        .await
        .unwrap_err();
    assert!(matches!(refused, AdminError::TokenRequired { .. }));
    assert!(
        refused.to_string().contains("--admin-token-file"),
        "{refused}"
    );

    let empty = write(dir.path(), "empty", "\n");
    assert!(AdminToken::read(&empty).is_err());
    let file = write(dir.path(), "token", "s3cret-token\n");
    let token = AdminToken::read(&file).unwrap();
    assert!(!format!("{token:?}").contains("s3cret"));
    let admin = idem_gateway::admin::start_admin_with_token(
        "0.0.0.0:0".parse().unwrap(),
        store,
        Some(token),
    )
    .await
    .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], admin.local_addr().port()));

    let (status, headers) = get(addr, "/metrics", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    let (status, _) = get(addr, "/metrics", Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = get(addr, "/metrics", Some("s3cret-token")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = get(addr, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    admin.stop().await;
}

/// A self-signed certificate as `openssl req -x509` makes it, in `dir`:
/// `NAME.pem` and `NAME.key`, with `extra` arguments.
fn openssl_self_signed(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ])
        .args(extra)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    (cert, key)
}

#[tokio::test]
async fn an_upstream_serving_a_ca_certificate_gets_a_502_that_explains_what_to_make() {
    let made = tempfile::tempdir().unwrap();
    // `openssl req -x509` makes a CA certificate (basicConstraints CA:TRUE).
    let (ca_cert, ca_key) = openssl_self_signed(made.path(), "self-signed", &[]);
    let upstream = HttpsUpstream::serving(
        gateway::load_certs("the upstream certificate", &ca_cert).unwrap()[0].clone(),
        gateway::load_key("the upstream key", &ca_key).unwrap(),
    )
    .await;
    let ca = Ca::new("test CA");
    let mut setup = Setup::new(&ca.server("gateway"));
    setup.upstream_ca = Some(ca_cert.clone());
    let gateway = setup.start(&upstream.url()).await;
    let mut client = connect(gateway.addr, &[ca.der()], None).await.unwrap();
    let (status, _, body) = post_keyed(&mut client, "k-1").await.unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    for says in [
        "CaUsedAsEndEntity",
        "serves a CA certificate",
        "basicConstraints=critical,CA:FALSE",
        "signed by that CA",
        "--upstream-ca",
    ] {
        assert!(body.contains(says), "{says}: {body}");
    }
    assert_eq!(upstream.effects(), 0);
    gateway.stop().await;

    // What the explanation says to do works: the same command told CA:FALSE.
    let (leaf_cert, leaf_key) = openssl_self_signed(
        made.path(),
        "server",
        &["-addext", "basicConstraints=critical,CA:FALSE"],
    );
    let upstream = HttpsUpstream::serving(
        gateway::load_certs("the upstream certificate", &leaf_cert).unwrap()[0].clone(),
        gateway::load_key("the upstream key", &leaf_key).unwrap(),
    )
    .await;
    let mut setup = Setup::new(&ca.server("gateway"));
    setup.upstream_ca = Some(leaf_cert);
    let gateway = setup.start(&upstream.url()).await;
    let mut client = connect(gateway.addr, &[ca.der()], None).await.unwrap();
    let (status, _, body) = post_keyed(&mut client, "k-1").await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(upstream.effects(), 1);
    gateway.stop().await;
}
