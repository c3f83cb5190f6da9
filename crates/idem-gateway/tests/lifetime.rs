//! A key's lifetime told to clients, and late retries refused: the
//! `Idempotency-Key-Expires` header on fresh and replayed answers, and the
//! tombstone that answers a retry past the window with 410 Gone until its
//! grace period ends. A manual clock moves time; each case runs on SQLite,
//! PostgreSQL, Redis and DynamoDB.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::gateway::{Gateway, Options, Upstream};
use common::stores::{Kind, Store};
use idem::{AnyStore, Clock, ManualClock, RecordStore, Timestamp};
use idem_http::IdempotencyConfig;
use serde_json::json;

const WINDOW: Duration = Duration::from_secs(3600);
const GRACE: Duration = Duration::from_secs(24 * 3600);

/// A gateway on `store` whose store reads `clock`, with a one-hour window
/// and tombstones kept for `grace`.
async fn gateway(
    store: &Store,
    upstream: &common::Server,
    clock: &Arc<ManualClock>,
    grace: Option<Duration>,
) -> (Gateway, AnyStore) {
    let idempotency = IdempotencyConfig::default()
        .lease(Duration::from_secs(60))
        .retention(WINDOW)
        .tombstones(grace);
    let opened = store.open_at(&idempotency, clock.clone()).await;
    let gateway = Gateway::start(
        upstream.addr,
        opened.clone(),
        Options {
            idempotency,
            ..Options::default()
        },
    )
    .await;
    (gateway, opened)
}

/// Keys of this run only: Redis cases share one server and prefix.
fn key(name: &str) -> String {
    format!("{}{name}", idem_testkit::redis::test_prefix("life"))
}

fn http_date(at: Timestamp) -> String {
    httpdate::fmt_http_date(at.system_time())
}

on_each_store!(every_keyed_answer_says_until_when_its_key_is_remembered);
async fn every_keyed_answer_says_until_when_its_key_is_remembered(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let clock = Arc::new(ManualClock::starting_now());
    let (gw, _) = gateway(&store, &server, &clock, None).await;
    let client = gw.client();
    let k = key("told");
    let claimed_at = clock.now();
    let expires = http_date(claimed_at.plus(WINDOW));
    let pay = || {
        client
            .post("/payments")
            .key(&k)
            .json(&json!({"amount": 10}))
            .send()
    };
    let first = pay().await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.header("idempotency-key-expires"),
        Some(expires.as_str())
    );
    // A replay later in the window carries the first claim's date, not a
    // date counted from the retry.
    clock.advance(Duration::from_secs(600));
    let retry = pay().await;
    assert!(retry.replayed());
    assert_eq!(
        retry.header("idempotency-key-expires"),
        Some(expires.as_str())
    );
    // Keyless requests say nothing of a key.
    let keyless = client
        .post("/payments")
        .json(&json!({"amount": 1}))
        .send()
        .await;
    assert_eq!(keyless.header("idempotency-key-expires"), None);
    // Without tombstones, past the window the key is new again.
    clock.advance(WINDOW);
    let late = pay().await;
    assert_eq!(late.status, StatusCode::CREATED);
    assert!(!late.replayed());
    assert_eq!(
        late.header("idempotency-key-expires"),
        Some(http_date(clock.now().plus(WINDOW)).as_str())
    );
    assert_eq!(upstream.effects(), 3);
}

on_each_store!(a_late_retry_meets_a_tombstone_and_is_refused_until_the_grace_ends);
async fn a_late_retry_meets_a_tombstone_and_is_refused_until_the_grace_ends(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let clock = Arc::new(ManualClock::starting_now());
    let (gw, opened) = gateway(&store, &server, &clock, Some(GRACE)).await;
    let client = gw.client();
    let k = key("late");
    let expired_at = clock.now().plus(WINDOW);
    let pay = |amount: u64| {
        client
            .post("/payments")
            .key(&k)
            .json(&json!({ "amount": amount }))
            .send()
    };
    assert_eq!(pay(10).await.status, StatusCode::CREATED);
    clock.advance(WINDOW);

    let refused_as_late = |reply: common::Reply| {
        let detail = reply.problem(StatusCode::GONE);
        let body = reply.json();
        assert_eq!(body["type"], "urn:idem:problem:idempotency-key-expired");
        assert_eq!(body["expired_at"], expired_at.rfc3339());
        assert_eq!(
            reply.header("idempotency-key-expires"),
            Some(http_date(expired_at).as_str())
        );
        assert!(detail.contains("expired"), "{detail}");
    };
    // Past the window, before any sweep: the record itself refuses.
    refused_as_late(pay(10).await);
    // Another payload under the expired key is key reuse, as inside it.
    pay(11).await.problem(StatusCode::UNPROCESSABLE_ENTITY);
    // Swept: the tombstone refuses in the record's place.
    opened.sweep(100).await.expect("sweep");
    clock.advance(GRACE / 2);
    refused_as_late(pay(10).await);
    assert_eq!(upstream.effects(), 1, "a late retry must not run");

    // After the grace period the key is new again, and the sweep forgets
    // the tombstone.
    clock.advance(GRACE / 2);
    let again = pay(10).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_eq!(upstream.effects(), 2);
}

on_each_store!(the_sweep_keeps_tombstones_for_the_grace_period_only);
async fn the_sweep_keeps_tombstones_for_the_grace_period_only(kind: Kind) {
    if matches!(kind, Kind::Redis) {
        // Redis expires a record itself, its grace period included (the
        // record is its own tombstone); there is no sweep to check.
        return;
    }
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let clock = Arc::new(ManualClock::starting_now());
    let (gw, opened) = gateway(&store, &server, &clock, Some(GRACE)).await;
    let client = gw.client();
    let keys: Vec<String> = (0..5).map(|i| key(&format!("swept-{i}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        let reply = client
            .post("/payments")
            .key(k)
            .json(&json!({ "amount": i }))
            .send()
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    clock.advance(WINDOW);
    assert_eq!(opened.count().await.unwrap().expired, 5);
    if matches!(kind, Kind::DynamoDb) {
        // A DynamoDB record outlives its window by the grace period, as its
        // own tombstone: nothing to sweep yet.
        assert_eq!(opened.sweep(2).await.unwrap(), 0);
        assert_eq!(opened.count().await.unwrap().total, 5);
    } else {
        // Five records become five tombstones; the records are gone.
        assert_eq!(opened.sweep(2).await.unwrap(), 5);
        assert_eq!(opened.count().await.unwrap().total, 0);
    }
    for (i, k) in keys.iter().enumerate() {
        let reply = client
            .post("/payments")
            .key(k)
            .json(&json!({ "amount": i }))
            .send()
            .await;
        reply.problem(StatusCode::GONE);
    }
    // Nothing more to delete inside the grace period; after it, the five
    // tombstones go.
    assert_eq!(opened.sweep(2).await.unwrap(), 0);
    clock.advance(GRACE);
    assert_eq!(opened.sweep(2).await.unwrap(), 5);
    assert_eq!(opened.sweep(2).await.unwrap(), 0);
    assert_eq!(upstream.effects(), 5);
}
