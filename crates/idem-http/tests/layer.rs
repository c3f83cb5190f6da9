//! The layer over real sockets, in front of an inner axum service that counts
//! its effects, with the embedded SQLite store keeping the records (and, in
//! one case, Redis).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{Client, Server};
use idem::{IdempotencyKey, ManualClock, RecordStore, Scope, SqliteStore};
use idem_http::{IdempotencyConfig, IdempotencyLayer, Mode};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The inner service's state: effect counters and a gate for slow requests.
#[derive(Clone)]
struct Upstream {
    effects: Arc<AtomicUsize>,
    flaky_calls: Arc<AtomicUsize>,
    panics: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Default for Upstream {
    fn default() -> Self {
        Self {
            effects: Arc::default(),
            flaky_calls: Arc::default(),
            panics: Arc::default(),
            reads: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Upstream {
    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }
}

async fn pay(
    State(up): State<Upstream>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    let who = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("nobody")
        .to_owned();
    (
        StatusCode::CREATED,
        [
            ("location", format!("/payments/{effect}")),
            ("x-effect", effect.to_string()),
        ],
        Json(json!({ "effect": effect, "request": body, "who": who })),
    )
}

async fn slow(State(up): State<Upstream>) -> impl IntoResponse {
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    up.gate.acquire().await.expect("gate open").forget();
    (StatusCode::CREATED, Json(json!({ "effect": effect })))
}

async fn flaky(State(up): State<Upstream>) -> impl IntoResponse {
    let call = up.flaky_calls.fetch_add(1, Ordering::SeqCst) + 1;
    if call == 1 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "call": call })),
        );
    }
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        Json(json!({ "call": call, "effect": effect })),
    )
}

async fn declined(State(up): State<Upstream>) -> impl IntoResponse {
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::PAYMENT_REQUIRED,
        Json(json!({ "declined": effect })),
    )
}

async fn panics(State(up): State<Upstream>) -> &'static str {
    if up.panics.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("the handler broke after doing who knows what");
    }
    "fine"
}

async fn list(State(up): State<Upstream>) -> impl IntoResponse {
    up.reads.fetch_add(1, Ordering::SeqCst);
    Json(json!({ "effects": up.effects() }))
}

struct Fixture {
    upstream: Upstream,
    client: Client,
    _server: Server,
    _dir: tempfile::TempDir,
}

async fn start(config: IdempotencyConfig) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("store");
    let upstream = Upstream::default();
    let app = Router::new()
        .route("/payments", post(pay).get(list))
        .route("/accounts/{id}/payments", post(pay))
        .route("/required", post(pay))
        .route("/slow", post(slow))
        .route("/flaky", post(flaky))
        .route("/declined", post(declined))
        .route("/panics", post(panics))
        .route("/health", get(|| async { "ok" }))
        .layer(IdempotencyLayer::new(store, config))
        .with_state(upstream.clone());
    let server = Server::start(app).await;
    Fixture {
        upstream,
        client: server.client(),
        _server: server,
        _dir: dir,
    }
}

fn standard() -> IdempotencyConfig {
    IdempotencyConfig::default().require_key_on(["/required"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_duplicates_are_replayed_byte_for_byte() {
    let f = start(standard()).await;
    let body = json!({ "amount": 10, "to": "acc-1" });
    let first = f
        .client
        .post("/payments")
        .key("pay-1")
        .json(&body)
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.json()["effect"], 1);

    for _ in 0..3 {
        let again = f
            .client
            .post("/payments")
            .key("pay-1")
            .json(&body)
            .send()
            .await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("location"), Some("/payments/1"));
        assert_eq!(again.header("x-effect"), Some("1"));
        assert_eq!(again.header("content-type"), first.header("content-type"));
    }

    // Same JSON written differently, and the key sent bare: still a retry.
    let reordered = f
        .client
        .post("/payments")
        .raw_key(b"pay-1")
        .bytes(r#"{ "to": "acc-1",   "amount": 10 }"#)
        .header("content-type", "application/json")
        .send()
        .await;
    assert!(reordered.replayed());
    assert_eq!(reordered.body, first.body);
    assert_eq!(f.upstream.effects(), 1);

    // A new key is a new operation.
    let second = f
        .client
        .post("/payments")
        .key("pay-2")
        .json(&body)
        .send()
        .await;
    assert_eq!(second.json()["effect"], 2);
    assert_eq!(f.upstream.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_client_errors_are_replayed_too() {
    let f = start(standard()).await;
    let first = f.client.post("/declined").key("d-1").send().await;
    assert_eq!(first.status, StatusCode::PAYMENT_REQUIRED);
    let again = f.client.post("/declined").key("d-1").send().await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(f.upstream.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_requests_with_one_key_make_one_effect() {
    let f = start(standard()).await;
    let mut calls = JoinSet::new();
    for _ in 0..64 {
        let client = f.client.clone();
        calls.spawn(async move { client.post("/slow").key("same").send().await });
    }
    // The first caller is held inside the service, so the other 63 must all be
    // answered while it is in flight: 409 with Retry-After, at once.
    let mut refused = 0;
    while refused < 63 {
        let reply = tokio::time::timeout(Duration::from_secs(30), calls.join_next())
            .await
            .expect("63 answers while the first is held")
            .expect("a call")
            .expect("call task");
        reply.problem(StatusCode::CONFLICT);
        assert!(reply.retry_after() >= 1);
        refused += 1;
    }
    // The claimer may not have reached the service yet; it cannot have run twice.
    assert!(f.upstream.effects() <= 1);

    f.upstream.gate.add_permits(1);
    let first = calls
        .join_next()
        .await
        .expect("the held call")
        .expect("call task");
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());

    let retry = f.client.post("/slow").key("same").send().await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(f.upstream.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_racing_requests_get_one_effect_and_consistent_answers() {
    let f = start(standard()).await;
    common::race_one_key(&f.client, "/payments", 64, json!({ "amount": 5 })).await;
    assert_eq!(f.upstream.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_reuse_is_422_in_ietf_mode_and_400_in_stripe_mode() {
    let f = start(standard()).await;
    f.client
        .post("/payments")
        .key("k")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    let reused = f
        .client
        .post("/payments")
        .key("k")
        .json(&json!({ "amount": 2 }))
        .send()
        .await;
    let detail = reused.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(detail.contains("different payload"), "{detail}");
    // The same key on another account is another payload too.
    f.client
        .post("/accounts/1/payments")
        .key("a")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    let other_account = f
        .client
        .post("/accounts/2/payments")
        .key("a")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    other_account.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(f.upstream.effects(), 2);

    let f = start(standard().mode(Mode::Stripe)).await;
    f.client
        .post("/payments")
        .key("k")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    let reused = f
        .client
        .post("/payments")
        .key("k")
        .json(&json!({ "amount": 2 }))
        .send()
        .await;
    let message = reused.stripe_error(StatusCode::BAD_REQUEST, "idempotency_error");
    assert!(message.contains("different payload"), "{message}");
    assert_eq!(f.upstream.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_key_is_refused_only_where_required() {
    let f = start(standard()).await;
    let missing = f.client.post("/required").json(&json!({})).send().await;
    let detail = missing.problem(StatusCode::BAD_REQUEST);
    assert!(detail.contains("requires an Idempotency-Key"), "{detail}");
    assert_eq!(f.upstream.effects(), 0);

    // Elsewhere a request without a key passes through, and runs every time.
    for _ in 0..2 {
        let plain = f.client.post("/payments").json(&json!({})).send().await;
        assert_eq!(plain.status, StatusCode::CREATED);
        assert!(!plain.replayed());
    }
    assert_eq!(f.upstream.effects(), 2);

    let f = start(standard().mode(Mode::Stripe)).await;
    let missing = f.client.post("/required").json(&json!({})).send().await;
    missing.stripe_error(StatusCode::BAD_REQUEST, "idempotency_error");
    assert_eq!(f.upstream.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_keys_are_refused_naming_the_rule() {
    let f = start(standard()).await;
    let long = "k".repeat(256);
    let cases: [(Vec<u8>, &str); 6] = [
        (b"".to_vec(), "is empty"),
        (b"\"\"".to_vec(), "is empty"),
        (long.clone().into_bytes(), "at most 255"),
        (format!("\"{long}\"").into_bytes(), "at most 255"),
        (b"ab\tcd".to_vec(), "not visible ASCII"),
        (b"\"unterminated".to_vec(), "RFC 8941 String"),
    ];
    for (value, rule) in cases {
        let reply = f
            .client
            .post("/payments")
            .raw_key(&value)
            .json(&json!({}))
            .send()
            .await;
        let detail = reply.problem(StatusCode::BAD_REQUEST);
        assert!(detail.contains(rule), "{value:?}: {detail}");
    }
    let two = f
        .client
        .post("/payments")
        .key("a")
        .key("a")
        .json(&json!({}))
        .send()
        .await;
    let detail = two.problem(StatusCode::BAD_REQUEST);
    assert!(detail.contains("2 Idempotency-Key headers"), "{detail}");

    let f2 = start(standard().mode(Mode::Stripe)).await;
    let two = f2
        .client
        .post("/payments")
        .key("a")
        .key("b")
        .json(&json!({}))
        .send()
        .await;
    two.stripe_error(StatusCode::BAD_REQUEST, "idempotency_error");

    assert_eq!(f.upstream.effects() + f2.upstream.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_over_the_limit_is_413_and_never_reaches_the_service() {
    let f = start(standard().body_limit(1024)).await;
    let big = vec![b'x'; 2048];
    let declared = f
        .client
        .post("/payments")
        .key("big")
        .bytes(big.clone())
        .send()
        .await;
    declared.problem(StatusCode::PAYLOAD_TOO_LARGE);
    let chunks = big.chunks(256).map(bytes::Bytes::copy_from_slice).collect();
    let streamed = f
        .client
        .post("/payments")
        .key("big-2")
        .chunked(chunks)
        .send()
        .await;
    streamed.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(f.upstream.effects(), 0);

    // The keys were never claimed: the same keys with a small body run.
    let small = f
        .client
        .post("/payments")
        .key("big")
        .json(&json!({ "ok": true }))
        .send()
        .await;
    assert_eq!(small.status, StatusCode::CREATED);
    assert_eq!(f.upstream.effects(), 1);

    let f = start(standard().body_limit(1024).mode(Mode::Stripe)).await;
    let declared = f
        .client
        .post("/payments")
        .key("big")
        .bytes(big)
        .send()
        .await;
    declared.stripe_error(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error");
    assert_eq!(f.upstream.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_principals_with_one_key_get_two_effects_and_their_own_replays() {
    let f = start(standard()).await;
    let body = json!({ "amount": 3 });
    let alice = f
        .client
        .post("/payments")
        .key("k")
        .header("authorization", "Bearer alice")
        .json(&body)
        .send()
        .await;
    let bob = f
        .client
        .post("/payments")
        .key("k")
        .header("authorization", "Bearer bob")
        .json(&body)
        .send()
        .await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!alice.replayed() && !bob.replayed());
    assert_eq!(alice.json()["who"], "Bearer alice");
    assert_eq!(bob.json()["who"], "Bearer bob");
    assert_eq!(f.upstream.effects(), 2);

    let alice_again = f
        .client
        .post("/payments")
        .key("k")
        .header("authorization", "Bearer alice")
        .json(&body)
        .send()
        .await;
    let bob_again = f
        .client
        .post("/payments")
        .key("k")
        .header("authorization", "Bearer bob")
        .json(&body)
        .send()
        .await;
    assert!(alice_again.replayed() && bob_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(bob_again.body, bob.body);
    // An anonymous caller is a third principal.
    let anonymous = f.client.post("/payments").key("k").json(&body).send().await;
    assert!(!anonymous.replayed());
    assert_eq!(anonymous.json()["who"], "nobody");
    assert_eq!(f.upstream.effects(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_error_releases_the_key_and_the_retry_runs_again() {
    let f = start(standard()).await;
    let failed = f.client.post("/flaky").key("f-1").send().await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!failed.replayed());

    let retried = f.client.post("/flaky").key("f-1").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(retried.json()["call"], 2);

    let replayed = f.client.post("/flaky").key("f-1").send().await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, retried.body);
    assert_eq!(f.upstream.flaky_calls.load(Ordering::SeqCst), 2);
    assert_eq!(f.upstream.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_that_dies_mid_request_keeps_the_key_reserved() {
    let f = start(standard()).await;
    let broken = f.client.post("/panics").key("p-1").send().await;
    broken.problem(StatusCode::BAD_GATEWAY);
    // Whether the effect happened is unknown, so the key is not handed out
    // again before its lease ends.
    let retry = f.client.post("/panics").key("p-1").send().await;
    retry.problem(StatusCode::CONFLICT);
    assert_eq!(f.upstream.panics.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn safe_methods_pass_through_and_say_their_key_was_ignored() {
    let f = start(standard()).await;
    for _ in 0..2 {
        let reply = f.client.get("/payments").key("ignored").send().await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.replayed());
        assert_eq!(reply.header("idempotency-key-ignored"), Some("true"));
    }
    let keyless = f.client.get("/payments").send().await;
    assert!(keyless.header("idempotency-key-ignored").is_none());
    assert_eq!(f.upstream.reads.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_request_keeps_its_claim_alive_and_is_not_taken_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::starting_now();
    let store = SqliteStore::builder(dir.path().join("idem.db"))
        .clock(Arc::new(clock.clone()))
        .open()
        .await
        .expect("store");
    let upstream = Upstream::default();
    // The store's lease is the default 60 s on the manual clock; the layer is
    // told 300 ms, so it renews every 100 ms of real time.
    let config = standard().lease(Duration::from_millis(300));
    let app = Router::new()
        .route("/slow", post(slow))
        .layer(IdempotencyLayer::new(store.clone(), config))
        .with_state(upstream.clone());
    let server = Server::start(app).await;
    let client = server.client();

    let first = tokio::spawn({
        let client = client.clone();
        async move { client.post("/slow").key("long").send().await }
    });
    let scope = Scope::new("http:anon:POST:/slow").unwrap();
    let key = IdempotencyKey::new("long").unwrap();
    let lease_until = || async {
        store
            .get(&scope, &key)
            .await
            .expect("read")
            .and_then(|r| r.lease_until)
    };
    let claimed = eventually(|| async { lease_until().await }).await;

    // 50 s later (store time) the next renewal moves the lease past the first one.
    clock.advance(Duration::from_secs(50));
    eventually(|| async { lease_until().await.filter(|until| *until > claimed) }).await;

    // 70 s after the claim its first lease is over, but the request is still
    // running and renewing: a retry is refused, not run a second time.
    clock.advance(Duration::from_secs(20));
    let retry = client.post("/slow").key("long").send().await;
    retry.problem(StatusCode::CONFLICT);
    assert_eq!(upstream.effects(), 1);

    upstream.gate.add_permits(1);
    let first = first.await.expect("first call");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(upstream.effects(), 1);
}

/// Polls `probe` (every 20 ms, for at most 10 s) until it returns something.
async fn eventually<T, F, Fut>(probe: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..500 {
        if let Some(found) = probe().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_load_shed_layer_answers_503_past_its_limit_and_admits_again_when_a_place_frees() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("store");
    let upstream = Upstream::default();
    let app = Router::new()
        .route("/slow", post(slow))
        .route("/payments", post(pay))
        .layer(IdempotencyLayer::new(store, standard()))
        .layer(idem_http::LoadShedLayer::new(1, Mode::Stripe))
        .with_state(upstream.clone());
    let server = Server::start(app).await;
    let client = server.client();

    let held = tokio::spawn({
        let client = client.clone();
        async move { client.post("/slow").key("held").send().await }
    });
    eventually(|| async { (upstream.effects() == 1).then_some(()) }).await;
    // The limit is shared by every route: /payments is shed too, at once.
    let shed = client
        .post("/payments")
        .key("shed")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    shed.stripe_error(StatusCode::SERVICE_UNAVAILABLE, "api_error");
    assert_eq!(shed.retry_after(), 1);
    assert_eq!(upstream.effects(), 1, "the shed request ran nothing");

    upstream.gate.add_permits(1);
    assert_eq!(held.await.unwrap().status, StatusCode::CREATED);
    // Its key was never claimed: the retry runs as the first attempt.
    let retried = client
        .post("/payments")
        .key("shed")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(upstream.effects(), 2);
}

/// The layer over a `RedisStore` (the layer takes any `LeaseStore`): a
/// keyed POST runs once and its duplicate is replayed byte for byte; a
/// concurrent duplicate of a slow request is answered 409 while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_over_a_redis_store_runs_a_keyed_request_once() {
    if !idem_testkit::redis::machine_redis_answers() {
        return;
    }
    let config = IdempotencyConfig::default();
    let store = idem::RedisStore::builder(idem_testkit::redis::redis_url())
        .settings(config.store_settings())
        .prefix(idem_testkit::redis::test_prefix("layer"))
        .connect()
        .await
        .expect("connect the Redis store");
    runs_a_keyed_request_once(store, config).await;
}

/// The same over a `DynamoStore`, on a table of its own on moto's DynamoDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_over_a_dynamodb_store_runs_a_keyed_request_once() {
    let Some(url) = idem_testkit::dynamodb::fresh_table_url("layer") else {
        return;
    };
    let config = IdempotencyConfig::default();
    let store = idem::DynamoStore::builder(url)
        .settings(config.store_settings())
        .open()
        .await
        .expect("open the DynamoDB store on moto");
    runs_a_keyed_request_once(store, config).await;
}

/// A keyed POST through the layer over `store` runs once and is replayed; a
/// concurrent duplicate of a slow request is answered 409 while it runs.
async fn runs_a_keyed_request_once<St>(store: St, config: IdempotencyConfig)
where
    St: idem::LeaseStore + idem::RecordStore + Send + Sync + 'static,
{
    let upstream = Upstream::default();
    let app = Router::new()
        .route("/payments", post(pay))
        .route("/slow", post(slow))
        .layer(IdempotencyLayer::new(store, config))
        .with_state(upstream.clone());
    let server = Server::start(app).await;
    let client = server.client();
    let body = json!({ "amount": 5 });
    let first = client
        .post("/payments")
        .key("pay-1")
        .json(&body)
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = client
        .post("/payments")
        .key("pay-1")
        .json(&body)
        .send()
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.effects(), 1);

    let slow_client = client.clone();
    let running = tokio::spawn(async move {
        slow_client
            .post("/slow")
            .key("slow-1")
            .json(&json!({}))
            .send()
            .await
    });
    while upstream.effects() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = client
        .post("/slow")
        .key("slow-1")
        .json(&json!({}))
        .send()
        .await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    upstream.gate.add_permits(1);
    assert_eq!(running.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(upstream.effects(), 2);
}
