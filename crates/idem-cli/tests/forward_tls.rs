//! `idem forward --to https://… --to-ca FILE`, run as a user would, against
//! an HTTPS endpoint (axum over tokio-rustls) whose certificate comes from a
//! test CA: with that CA every message arrives; with another CA nothing
//! does, and the dead letter says the certificate did not verify.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use idem_testkit::tls::TestCa;
use rustls::pki_types::PrivateKeyDer;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use common::store::sqlite_in;

/// Calls per key.
type Calls = Arc<Mutex<HashMap<String, u32>>>;

async fn receive(State(calls): State<Calls>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    *calls.lock().unwrap().entry(key).or_default() += 1;
    StatusCode::OK
}

/// TLS connections accepted one after the other; a failed handshake is
/// skipped, a completed one counted.
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

/// An HTTPS endpoint on 127.0.0.1 with a certificate signed by `ca`.
async fn https_endpoint(ca: &TestCa) -> (Calls, Arc<AtomicUsize>, SocketAddr) {
    let issued = ca.server("localhost");
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![issued.der.clone()],
        PrivateKeyDer::try_from(issued.key_der.clone()).unwrap(),
    )
    .unwrap();
    let calls = Calls::default();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(Arc::clone(&calls));
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(Arc::new(tls)),
        handshakes: Arc::clone(&handshakes),
    };
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    (calls, handshakes, addr)
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills the process when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn forward(store: &str, from: &str, to: &str, ca: &Path) -> Running {
    Running(
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", store, "forward", "--from", from, "--to", to])
            .arg("--to-ca")
            .arg(ca)
            .args(["--max-attempts", "1"])
            .env_remove("IDEM_STORE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start idem forward"),
    )
}

async fn dead_letters(store: &str) -> serde_json::Value {
    let store = store.to_owned();
    let out: Output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", &store, "dlq", "ls", "--json"])
            .env_remove("IDEM_STORE")
            .output()
            .expect("run idem dlq ls")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("dlq ls --json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_forward_reaches_an_https_endpoint_with_to_ca_and_refuses_another_ca() {
    let Some(queue) = common::TestQueue::declare("idem-t-forward-tls").await else {
        return;
    };
    let publish = async |key: &str| queue.publish(key).await;

    let ca = TestCa::new("Idem forward CLI test CA");
    let (calls, handshakes, addr) = https_endpoint(&ca).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let other_ca_file = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca_file, TestCa::new("Idem other CA").pem()).unwrap();
    let store = sqlite_in(dir.path());
    let from = format!("amqp://guest:guest@127.0.0.1:5672/{}", queue.name);
    let to = format!("https://127.0.0.1:{}/hook", addr.port());

    // The endpoint's CA: every message arrives, each with its key.
    publish("order-1").await;
    publish("order-2").await;
    let trusting = forward(&store, &from, &to, &ca_file);
    until("both messages reached the endpoint", async || {
        calls.lock().unwrap().len() >= 2
    })
    .await;
    drop(trusting);
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.get("order-1"), Some(&1), "{calls:?}");
        assert_eq!(calls.get("order-2"), Some(&1), "{calls:?}");
    }
    assert!(handshakes.load(Ordering::SeqCst) >= 1);
    assert_eq!(dead_letters(&store).await, serde_json::json!([]));

    // Another CA: the message never reaches the endpoint, and its dead
    // letter says why.
    let before = handshakes.load(Ordering::SeqCst);
    publish("order-3").await;
    let _refusing = forward(&store, &from, &to, &other_ca_file);
    let mut letters = serde_json::Value::Null;
    until("the message is dead-lettered", async || {
        letters = dead_letters(&store).await;
        letters.as_array().is_some_and(|l| !l.is_empty())
    })
    .await;
    assert_eq!(letters[0]["key"], "order-3", "{letters}");
    let error = letters[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("invalid peer certificate") && error.contains("UnknownIssuer"),
        "{error}"
    );
    assert_eq!(calls.lock().unwrap().get("order-3"), None);
    assert_eq!(handshakes.load(Ordering::SeqCst), before, "no handshake");

    queue.delete().await;
}
