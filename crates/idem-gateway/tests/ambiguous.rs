//! Answers that say nothing about whether the effect happened: an upstream
//! that applies each payment and then answers 502, 504 or 500 (a load
//! balancer in front of a slow application, an application that crashed
//! after its commit), or breaks the connection after applying. The client
//! retries with its key. Each test counts the upstream's effects against
//! what the status policy says.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::gateway::{embedded, on_both_runtimes};
use common::{Client, Server};
use idem::ManualClock;
use idem_gateway::{self as gateway, Gateway, GatewayConfig, IDEMPOTENCY_ORIGINAL_STATUS};
use idem_http::{IdempotencyConfig, IdempotencyLayer, StatusPolicy, parse_key};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(60);

/// A payments upstream with its own table of keys. The first attempt of a
/// key applies the payment and then answers with the status in `x-fail-with`
/// (or, for `x-fail-with: break`, starts a 201 and breaks off its body); later
/// attempts apply and answer 201.
#[derive(Clone, Default)]
struct Payments {
    effects: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
    by_key: Arc<Mutex<HashMap<String, usize>>>,
}

async fn pay(State(up): State<Payments>, headers: HeaderMap) -> Response {
    let key = parse_key(headers["idempotency-key"].as_bytes()).expect("the key is forwarded");
    let first = !up.by_key.lock().unwrap().contains_key(key.as_str());
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    up.by_key
        .lock()
        .unwrap()
        .insert(key.as_str().to_owned(), effect);
    let fail = headers
        .get("x-fail-with")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match (first, fail) {
        (true, "break") => {
            let broken = futures::stream::once(async {
                Err::<bytes::Bytes, _>(std::io::Error::other("the application crashed"))
            });
            (StatusCode::CREATED, Body::from_stream(broken)).into_response()
        }
        (true, code) if !code.is_empty() => {
            let status = StatusCode::from_bytes(code.as_bytes()).unwrap();
            (status, "upstream trouble").into_response()
        }
        _ => (StatusCode::CREATED, Json(json!({ "payment": effect }))).into_response(),
    }
}

async fn by_key(State(up): State<Payments>, Path(key): Path<String>) -> Response {
    up.probes.fetch_add(1, Ordering::SeqCst);
    match up.by_key.lock().unwrap().get(&key) {
        Some(effect) => (
            StatusCode::OK,
            [(IDEMPOTENCY_ORIGINAL_STATUS, "201")],
            Json(json!({ "payment": effect })),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

struct Fixture {
    up: Payments,
    addr: std::net::SocketAddr,
    client: Client,
    clock: ManualClock,
    _upstream: Server,
    gateway: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn start(probe: bool, policy: StatusPolicy) -> Fixture {
        let up = Payments::default();
        let app = Router::new()
            .route("/pay", post(pay))
            .route("/pay/by-key/{key}", get(by_key))
            .with_state(up.clone());
        let upstream = Server::start(app).await;
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::starting_now();
        let config = IdempotencyConfig::default().lease(LEASE).on_status(policy);
        let store = embedded(dir.path(), &config, Arc::new(clock.clone())).await;
        let layer = IdempotencyLayer::new(store, config);
        let mut gateway_config =
            GatewayConfig::new(format!("http://{}", upstream.addr).parse().unwrap())
                .upstream_timeout(Duration::from_secs(5));
        if probe {
            gateway_config = gateway_config.probe("GET /pay/by-key/{key}".parse().unwrap());
        }
        let runtime = common::gateway::SERVING
            .try_with(|runtime| *runtime)
            .unwrap_or_default();
        gateway_config = gateway_config.runtime(runtime);
        let local = "127.0.0.1:0".parse().unwrap();
        let listener = match runtime {
            gateway::Runtime::PerCore => gateway::bind_per_core(local).await.unwrap(),
            _ => tokio::net::TcpListener::bind(local).await.unwrap(),
        };
        let addr = listener.local_addr().unwrap();
        let client = Client::to(addr);
        let gateway = tokio::spawn(gateway::run(
            listener,
            Gateway::new(layer, gateway_config),
            std::future::pending(),
        ));
        Fixture {
            up,
            addr,
            client,
            clock,
            _upstream: upstream,
            gateway,
            _dir: dir,
        }
    }

    fn effects(&self) -> usize {
        self.up.effects.load(Ordering::SeqCst)
    }

    fn probes(&self) -> usize {
        self.up.probes.load(Ordering::SeqCst)
    }

    async fn first(&self, key: &str, fail_with: &str) -> common::Reply {
        self.client
            .post("/pay")
            .key(key)
            .header("x-fail-with", fail_with)
            .send()
            .await
    }

    async fn retry(&self, key: &str) -> common::Reply {
        self.client.post("/pay").key(key).send().await
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.gateway.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_probe_every_ambiguous_answer_is_applied_once_and_the_retry_gets_it() {
    let f = Fixture::start(true, StatusPolicy::standard()).await;
    for (n, fail_with) in ["502", "504", "500", "break"].into_iter().enumerate() {
        let key = format!("pay-{fail_with}");
        let first = f.first(&key, fail_with).await;
        assert_ne!(first.status, StatusCode::CREATED, "{fail_with}");
        assert_eq!(
            f.effects(),
            n + 1,
            "{fail_with}: applied by the first attempt"
        );

        // At once, not a lease later: the retry asks the probe.
        let retried = f.retry(&key).await;
        assert_eq!(
            retried.status,
            StatusCode::CREATED,
            "{fail_with}: {:?}",
            retried.body
        );
        assert!(retried.replayed(), "{fail_with}");
        assert_eq!(retried.header("idempotency-reconciled"), Some("true"));
        assert_eq!(retried.json()["payment"], n + 1);
        assert_eq!(f.effects(), n + 1, "{fail_with}: one effect per key");
        assert_eq!(f.probes(), n + 1, "{fail_with}: asked once");

        // Stored: later copies are replays, neither probed nor forwarded.
        let again = f.retry(&key).await;
        assert!(again.replayed());
        assert_eq!(again.body, retried.body);
        assert_eq!((f.effects(), f.probes()), (n + 1, n + 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_probe_an_attempt_that_was_not_applied_is_forwarded_at_once() {
    let f = Fixture::start(true, StatusPolicy::standard()).await;
    // The upstream's answer is ambiguous but its table has nothing: a 502
    // from a proxy that never reached it.
    let answer = f.first("pay-none", "502").await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    f.up.by_key.lock().unwrap().clear();
    let retried = f.retry("pay-none").await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(f.probes(), 1);
    assert_eq!(f.effects(), 2, "the probe said not applied: forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_probe_502_and_504_hold_the_key_for_the_lease_and_say_so() {
    let f = Fixture::start(false, StatusPolicy::standard()).await;
    for fail_with in ["502", "504", "break"] {
        let key = format!("held-{fail_with}");
        let before = f.effects();
        f.first(&key, fail_with).await;
        assert_eq!(f.effects(), before + 1);

        let refused = f.retry(&key).await;
        let detail = refused.problem(StatusCode::CONFLICT);
        assert!(detail.contains("unknown"), "{fail_with}: {detail}");
        assert_eq!(
            refused.retry_after(),
            LEASE.as_secs(),
            "{fail_with}: the real time left on the lease"
        );
        assert_eq!(f.effects(), before + 1, "{fail_with}: nothing forwarded");

        f.clock.advance(LEASE / 2);
        let later = f.retry(&key).await;
        later.problem(StatusCode::CONFLICT);
        assert_eq!(later.retry_after(), LEASE.as_secs() / 2);

        // After the lease the retry is forwarded again, with its key: the
        // table's one case where an upstream that does not dedupe on the
        // key applies twice.
        f.clock.advance(LEASE / 2 + Duration::from_secs(1));
        let forwarded = f.retry(&key).await;
        assert_eq!(forwarded.status, StatusCode::CREATED);
        assert!(!forwarded.replayed());
        assert_eq!(f.effects(), before + 2, "{fail_with}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_probe_500_and_503_release_the_key_and_the_retry_runs_at_once() {
    let f = Fixture::start(false, StatusPolicy::standard()).await;
    for (n, fail_with) in ["500", "503", "429"].into_iter().enumerate() {
        let key = format!("released-{fail_with}");
        f.first(&key, fail_with).await;
        let retried = f.retry(&key).await;
        assert_eq!(retried.status, StatusCode::CREATED, "{fail_with}");
        assert!(!retried.replayed());
        assert_eq!(
            f.effects(),
            2 * (n + 1),
            "{fail_with}: released, so forwarded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_policy_is_settable_per_status() {
    let policy: StatusPolicy = "500=unknown,502=store".parse().unwrap();
    let f = Fixture::start(false, policy).await;

    f.first("custom-500", "500").await;
    f.retry("custom-500").await.problem(StatusCode::CONFLICT);
    assert_eq!(f.effects(), 1, "500 held");

    let stored = f.first("custom-502", "502").await;
    assert_eq!(stored.status, StatusCode::BAD_GATEWAY);
    let replayed = f.retry("custom-502").await;
    assert_eq!(replayed.status, StatusCode::BAD_GATEWAY);
    assert!(replayed.replayed(), "502 stored and replayed");
    assert_eq!(f.effects(), 2);
}

on_both_runtimes!(a_client_that_hangs_up_right_after_sending_leaves_no_claim_behind);
async fn a_client_that_hangs_up_right_after_sending_leaves_no_claim_behind() {
    use tokio::io::AsyncWriteExt;

    let f = Fixture::start(false, StatusPolicy::standard()).await;
    let addr = f.addr;
    for n in 0..20 {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = br#"{"amount":10}"#;
        let head = format!(
            "POST /pay HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: \"gone-{n}\"\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(body).await.unwrap();
        drop(socket);
    }
    // The lease (60 s on a clock that does not move) never ends here: a
    // claim stranded by a hang-up would answer 409 for ever.
    for n in 0..20 {
        let key = format!("gone-{n}");
        let retry = || {
            f.client
                .post("/pay")
                .key(&key)
                .json(&json!({"amount": 10}))
                .send()
        };
        let mut answer = retry().await;
        for _ in 0..100 {
            if answer.status != StatusCode::CONFLICT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer = retry().await;
        }
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{key}: {:?}",
            answer.body
        );
    }
    assert_eq!(
        f.effects(),
        20,
        "each hung-up request ran once, and its retry got its answer"
    );
}
