//! The gateway's `--probe`: before a retry takes over a claim whose earlier
//! attempt ended unknown (here: the upstream timed out), the gateway asks the
//! upstream whether that attempt was applied. Each test counts the upstream's
//! effects.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::gateway::embedded;
use common::{Client, Server};
use idem::ManualClock;
use idem_gateway::{self as gateway, Gateway, GatewayConfig, IDEMPOTENCY_ORIGINAL_STATUS};
use idem_http::{IdempotencyConfig, IdempotencyLayer, parse_key};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(60);

/// A payments upstream with its own table of keys, answering the probe from
/// it. A request with `x-stall: after` applies its effect and then never
/// answers; `x-stall: before` never answers and applies nothing.
#[derive(Clone, Default)]
struct Payments {
    effects: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
    by_key: Arc<Mutex<HashMap<String, usize>>>,
    probe_broken: Arc<AtomicBool>,
}

async fn pay(State(up): State<Payments>, headers: HeaderMap) -> Response {
    up.calls.fetch_add(1, Ordering::SeqCst);
    let key =
        parse_key(headers["idempotency-key"].as_bytes()).expect("the gateway forwards the key");
    let stall = headers
        .get("x-stall")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if stall == "before" {
        std::future::pending::<()>().await;
    }
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    up.by_key
        .lock()
        .unwrap()
        .insert(key.as_str().to_owned(), effect);
    if stall == "after" {
        std::future::pending::<()>().await;
    }
    (StatusCode::CREATED, Json(json!({ "payment": effect }))).into_response()
}

async fn by_key(
    State(up): State<Payments>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    up.probes.fetch_add(1, Ordering::SeqCst);
    assert_eq!(
        parse_key(headers["idempotency-key"].as_bytes())
            .unwrap()
            .as_str(),
        key,
        "the probe carries the key"
    );
    if up.probe_broken.load(Ordering::SeqCst) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the table is away").into_response();
    }
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
    client: Client,
    clock: ManualClock,
    _upstream: Server,
    _gateway: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn start() -> Fixture {
        let up = Payments::default();
        let app = Router::new()
            .route("/pay", post(pay))
            .route("/pay/by-key/{key}", get(by_key))
            .with_state(up.clone());
        let upstream = Server::start(app).await;
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::starting_now();
        let config = IdempotencyConfig::default().lease(LEASE);
        let store = embedded(dir.path(), &config, Arc::new(clock.clone())).await;
        let layer = IdempotencyLayer::new(store, config);
        let gateway_config =
            GatewayConfig::new(format!("http://{}", upstream.addr).parse().unwrap())
                .upstream_timeout(Duration::from_secs(1))
                .probe("GET /pay/by-key/{key}".parse().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = Client::to(listener.local_addr().unwrap());
        let task = tokio::spawn(gateway::run(
            listener,
            Gateway::new(layer, gateway_config),
            std::future::pending(),
        ));
        Fixture {
            up,
            client,
            clock,
            _upstream: upstream,
            _gateway: task,
            _dir: dir,
        }
    }

    fn effects(&self) -> usize {
        self.up.effects.load(Ordering::SeqCst)
    }

    fn calls(&self) -> usize {
        self.up.calls.load(Ordering::SeqCst)
    }

    fn probes(&self) -> usize {
        self.up.probes.load(Ordering::SeqCst)
    }

    /// A payment that times out at the gateway (504), then the lease ends.
    async fn lost(&self, key: &str, stall: &str) {
        let first = self
            .client
            .post("/pay")
            .key(key)
            .header("x-stall", stall)
            .send()
            .await;
        assert_eq!(
            first.status,
            StatusCode::GATEWAY_TIMEOUT,
            "{:?}",
            first.body
        );
        self.clock.advance(LEASE + Duration::from_secs(1));
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self._gateway.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_applied_attempt_is_stored_and_replayed_without_running_again() {
    let f = Fixture::start().await;
    f.lost("p-1", "after").await;
    assert_eq!(f.effects(), 1);

    let retried = f.client.post("/pay").key("p-1").send().await;
    assert_eq!(retried.status, StatusCode::CREATED, "the original status");
    assert!(retried.replayed());
    assert_eq!(retried.header("idempotency-reconciled"), Some("true"));
    assert_eq!(retried.json()["payment"], 1);
    assert_eq!(retried.header(IDEMPOTENCY_ORIGINAL_STATUS.as_str()), None);
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 1, 1));

    // Stored: later copies are replayed from the store, not probed.
    let again = f.client.post("/pay").key("p-1").send().await;
    assert!(again.replayed());
    assert_eq!(again.body, retried.body);
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_the_upstream_never_applied_is_forwarded() {
    let f = Fixture::start().await;
    f.lost("p-2", "before").await;
    assert_eq!(f.effects(), 0);

    let retried = f.client.post("/pay").key("p-2").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(retried.header("idempotency-reconciled"), None);
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 2, 1));
    assert!(f.client.post("/pay").key("p-2").send().await.replayed());
    assert_eq!(f.effects(), 1, "applied once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_probe_is_503_and_nothing_is_forwarded_until_it_answers() {
    let f = Fixture::start().await;
    f.lost("p-3", "after").await;
    f.up.probe_broken.store(true, Ordering::SeqCst);

    let refused = f.client.post("/pay").key("p-3").send().await;
    let detail = refused.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(detail.contains("500"), "{detail}");
    assert_eq!(refused.retry_after(), 1, "asked again at the next retry");
    assert_eq!(
        refused.json()["type"],
        "urn:idem:problem:reconcile-outcome-unknown"
    );
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 1, 1));

    // The key stays reserved and nothing is forwarded: the next copy asks
    // the probe again, at once.
    let again = f.client.post("/pay").key("p-3").send().await;
    again.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 1, 2));

    // Once the probe answers, the applied attempt's answer is replayed.
    f.up.probe_broken.store(false, Ordering::SeqCst);
    let answered = f.client.post("/pay").key("p-3").send().await;
    assert_eq!(answered.status, StatusCode::CREATED);
    assert!(answered.replayed());
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 1, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_out_attempt_is_reconciled_by_the_next_retry_not_a_lease_later() {
    let f = Fixture::start().await;
    let first = f
        .client
        .post("/pay")
        .key("p-4")
        .header("x-stall", "after")
        .send()
        .await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(first.retry_after(), 1, "the next retry is reconciled");
    let retried = f.client.post("/pay").key("p-4").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(retried.replayed());
    assert_eq!((f.effects(), f.calls(), f.probes()), (1, 1, 1));
}
