//! The HTTPS clients against a real TLS server: `forward` to an `https://`
//! endpoint and the relay's webhook publisher to an `https://` webhook, each
//! with the endpoint's CA given (delivered, once per key), with webpki's
//! bundled roots only, and with another CA (nothing delivered, and the error
//! says the certificate did not verify).
//!
//! The endpoint is axum behind idem-http's Idempotency-Key layer, served over
//! tokio-rustls (ring) with a certificate from idem-testkit's test CA.

mod consumer_support;
mod outbox_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use consumer_support::{Broker, Rabbit, Running, config};
use idem::{AnyStore, IdempotencyKey, ManualClock, SqliteStore};
use idem_broker::consume::{Consumer, Source, SourceOptions};
use idem_broker::dead_letter::DeadLetterStore;
use idem_broker::forward::{ForwardConfig, HttpForward};
use idem_broker::outbox::{self, OutboxStore, Route};
use idem_broker::publish::{self, ConnectOptions, Destination, Message, Publish};
use idem_broker::relay::{Relay, RelayConfig};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use idem_testkit::tls::TestCa;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration trusting `ca` only.
fn trusting(ca: CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).expect("a CA certificate");
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// What a client says when the server's certificate does not verify.
fn says_the_certificate_did_not_verify(error: &str) -> bool {
    error.contains("invalid peer certificate") && error.contains("UnknownIssuer")
}

/// TLS connections accepted one after the other; a failed handshake is
/// skipped.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: Arc<AtomicUsize>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            let handshake = self.acceptor.accept(stream);
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                self.handshakes.fetch_add(1, Ordering::SeqCst);
                return (stream, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// An HTTPS endpoint on 127.0.0.1 with a certificate signed by its own CA;
/// `/orders` applies each Idempotency-Key once.
struct HttpsEndpoint {
    ca: TestCa,
    addr: SocketAddr,
    /// Requests that reached the handler (replays answered by the layer
    /// do not).
    effects: Arc<AtomicUsize>,
    /// TLS handshakes that succeeded.
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for HttpsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn orders(State(effects): State<Arc<AtomicUsize>>, body: String) -> (StatusCode, String) {
    let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("effect {n}: {body}"))
}

impl HttpsEndpoint {
    async fn start() -> Self {
        let ca = TestCa::new("Idem forward test CA");
        let issued = ca.server("localhost");
        let tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![issued.der.clone()],
                PrivateKeyDer::try_from(issued.key_der.clone()).expect("a PKCS#8 key"),
            )
            .expect("the server's certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("endpoint.db"))
            .await
            .expect("endpoint store");
        let effects = Arc::new(AtomicUsize::new(0));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/orders", post(orders))
            .layer(IdempotencyLayer::new(store, IdempotencyConfig::default()))
            .with_state(Arc::clone(&effects));
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("address");
        let listener = TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            handshakes: Arc::clone(&handshakes),
        };
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self {
            ca,
            addr,
            effects,
            handshakes,
            task,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/orders", self.addr.port())
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

// ---- forward ----

/// Forwards from a queue of the test's own, with at most two attempts per
/// message; returns the counters once `settled` messages were acked, and the
/// sidecar's dead letters.
async fn forward(
    endpoint: &HttpsEndpoint,
    tls: Option<Arc<rustls::ClientConfig>>,
    publish: &[&str],
    settled: u64,
) -> Option<(
    idem_broker::consume::StatsSnapshot,
    Vec<idem_broker::dead_letter::DeadLetter>,
)> {
    let broker = Rabbit::start().await?;
    for key in publish {
        broker.publish(Some(key), br#"{"amount": 10}"#).await;
    }
    let source: Source = format!("{}/{}", broker.url.trim_end_matches("/%2f"), broker.queue)
        .parse()
        .expect("source URL");
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("sidecar.db"))
        .await
        .expect("sidecar store");
    let transport = source
        .connect(SourceOptions::default())
        .await
        .expect("connect the source");
    let mut forward_config = ForwardConfig::new(endpoint.url().parse().expect("endpoint URL"));
    forward_config.timeout = Duration::from_secs(10);
    forward_config.tls = tls;
    let consumer = Consumer::new(
        transport,
        HttpForward::new(store.clone(), forward_config),
        config(broker.key_rule()).concurrency(1).max_attempts(2),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("every message settled", |s| s.acked() >= settled)
        .await;
    let stats = running.stop().await;
    let letters = store.list_dead_letters(10, false).await.expect("letters");
    Some((stats, letters))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_with_the_endpoints_ca_delivers_each_key_once_over_https() {
    let endpoint = HttpsEndpoint::start().await;
    let tls = trusting(endpoint.ca.der());
    let Some((stats, letters)) =
        forward(&endpoint, Some(tls), &["order-1", "order-1", "order-2"], 3).await
    else {
        return;
    };
    assert_eq!(endpoint.effects(), 2, "{stats:?}");
    assert_eq!(
        (stats.applied, stats.replayed, stats.dead_lettered),
        (2, 1, 0),
        "{stats:?}"
    );
    assert!(letters.is_empty(), "{letters:?}");
    assert!(endpoint.handshakes() >= 1);
}

async fn refused(tls: Option<Arc<rustls::ClientConfig>>) {
    let endpoint = HttpsEndpoint::start().await;
    let Some((stats, letters)) = forward(&endpoint, tls, &["order-1"], 1).await else {
        return;
    };
    assert_eq!(endpoint.effects(), 0, "{stats:?}");
    assert_eq!(endpoint.handshakes(), 0, "no handshake completed");
    assert_eq!(
        (stats.applied, stats.replayed, stats.dead_lettered),
        (0, 0, 1),
        "{stats:?}"
    );
    assert!(stats.requeued >= 1, "retried before giving up: {stats:?}");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].key.as_str(), "order-1");
    let error = &letters[0].last_error;
    assert!(says_the_certificate_did_not_verify(error), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_with_the_bundled_roots_only_refuses_a_private_ca() {
    refused(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_with_another_ca_refuses_the_endpoint() {
    refused(Some(trusting(TestCa::new("Idem other CA").der()))).await;
}

// ---- the relay's webhook publisher ----

fn webhook_options(ca: CertificateDer<'static>) -> ConnectOptions {
    ConnectOptions {
        webhook_tls: Some(trusting(ca)),
    }
}

fn message(key: &str) -> Message {
    Message::new(IdempotencyKey::new(key).unwrap(), key.as_bytes().to_vec())
}

#[tokio::test]
async fn the_relay_delivers_an_outbox_row_to_an_https_webhook_once() {
    let endpoint = HttpsEndpoint::start().await;
    let to: Destination = endpoint.url().parse().expect("destination");
    let clock = ManualClock::starting_now();
    let (_dir, store) = outbox_support::sqlite(&clock).await;
    let any = AnyStore::Sqlite(store.clone());
    outbox::enqueue_now(&any, Route::To(&to), &message("invoice-7/paid"))
        .await
        .unwrap();
    let relay = Relay::new(
        any.clone(),
        RelayConfig {
            connect: webhook_options(endpoint.ca.der()),
            ..RelayConfig::default()
        },
    );
    let pass = relay.drain().await.unwrap();
    assert_eq!(
        (pass.sent, pass.retried, pass.dead_lettered),
        (1, 0, 0),
        "{pass:?}"
    );
    assert_eq!(relay.run_once().await.unwrap().claimed, 0, "sent once");
    assert_eq!(endpoint.effects(), 1);
    let stats = any.outbox_stats().await.unwrap();
    assert_eq!((stats.pending, stats.sent), (0, 1));
}

#[tokio::test]
async fn the_relay_does_not_deliver_to_an_https_webhook_whose_certificate_does_not_verify() {
    let endpoint = HttpsEndpoint::start().await;
    let to: Destination = endpoint.url().parse().expect("destination");
    let clock = ManualClock::starting_now();
    let (_dir, store) = outbox_support::sqlite(&clock).await;
    let any = AnyStore::Sqlite(store.clone());
    outbox::enqueue_now(&any, Route::To(&to), &message("invoice-8/paid"))
        .await
        .unwrap();
    let relay = Relay::new(
        any.clone(),
        RelayConfig {
            connect: webhook_options(TestCa::new("Idem other CA").der()),
            max_attempts: 1,
            ..RelayConfig::default()
        },
    );
    let pass = relay.drain().await.unwrap();
    assert_eq!((pass.sent, pass.dead_lettered), (0, 1), "{pass:?}");
    assert_eq!(endpoint.effects(), 0);
    assert_eq!(endpoint.handshakes(), 0);
    let letters = store.list_dead_letters(10, false).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].key.as_str(), "invoice-8/paid");
    let error = &letters[0].last_error;
    assert!(says_the_certificate_did_not_verify(error), "{error}");
}

#[tokio::test]
async fn the_webhook_publisher_says_when_the_certificate_does_not_verify() {
    let endpoint = HttpsEndpoint::start().await;
    let to: Destination = endpoint.url().parse().expect("destination");

    let trusted = publish::connect_with(&to, &webhook_options(endpoint.ca.der()))
        .await
        .unwrap();
    trusted.publish(&message("hook-1")).await.unwrap();
    trusted.publish(&message("hook-1")).await.unwrap();
    assert_eq!(endpoint.effects(), 1, "the receiver dedupes the key");

    for (what, options) in [
        ("bundled roots", ConnectOptions::default()),
        (
            "another CA",
            webhook_options(TestCa::new("Idem other CA").der()),
        ),
    ] {
        let publisher = publish::connect_with(&to, &options).await.unwrap();
        let error = publisher.publish(&message("hook-2")).await.unwrap_err();
        assert!(
            says_the_certificate_did_not_verify(&error.to_string()),
            "{what}: {error}"
        );
    }
    assert_eq!(endpoint.effects(), 1);
}
