//! Replays from memory: a cached replay is the stored answer byte for byte
//! and needs no store; an evicted key stops being replayed once the
//! staleness bound has passed; with the cache off, every replay reads the
//! store. Each case runs on SQLite, PostgreSQL and Redis.

#[macro_use]
mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::gateway::{Gateway, Options, Upstream};
use common::stores::{Kind, Store};
use idem::{AdminStore, IdempotencyKey, RecordStore};
use idem_http::{IdempotencyConfig, ReplayCache};
use serde_json::json;

async fn gateway(
    store: &Store,
    upstream: &common::Server,
    cache: ReplayCache,
) -> (Gateway, idem::AnyStore) {
    let idempotency = IdempotencyConfig::default().replay_cache(cache);
    let opened = store.open(&idempotency).await;
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

fn key(name: &str) -> String {
    format!("{}{name}", idem_testkit::redis::test_prefix("cache"))
}

/// Evicts the record of key `k`, as `idem keys rm` does.
async fn evict(store: &idem::AnyStore, k: &str) {
    let key = IdempotencyKey::new(k).unwrap();
    let records = store.list(&idem::RecordFilter::default()).await.unwrap();
    let record = records
        .into_iter()
        .find(|r| r.key == key)
        .expect("the key's record");
    store.evict(&record, "test").await.unwrap();
}

on_each_store!(an_evicted_key_is_replayed_from_memory_only_within_the_bound);
async fn an_evicted_key_is_replayed_from_memory_only_within_the_bound(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    // Long enough for the three requests and the eviction below to fit in
    // it on a busy machine: the bound runs from the first answer.
    let bound = Duration::from_secs(3);
    let (gw, opened) = gateway(
        &store,
        &server,
        ReplayCache::bytes(1 << 20).staleness(bound),
    )
    .await;
    let client = gw.client();
    let k = key("evicted");
    let pay = || {
        client
            .post("/payments")
            .key(&k)
            .json(&json!({"amount": 10}))
            .send()
    };
    let first = pay().await;
    assert_eq!(first.status, StatusCode::CREATED);
    let from_store = pay().await;
    assert!(from_store.replayed());
    // The record is gone from the store: the replay comes from memory, the
    // same bytes and headers as the store's.
    evict(&opened, &k).await;
    let from_memory = pay().await;
    assert!(from_memory.replayed());
    assert_eq!(from_memory.body, first.body);
    assert_eq!(from_memory.body, from_store.body);
    for name in [
        "content-type",
        "idempotency-key-expires",
        "idempotent-replayed",
    ] {
        assert_eq!(from_memory.header(name), from_store.header(name), "{name}");
    }
    assert_eq!(upstream.effects(), 1);
    // Past the staleness bound the eviction is seen: the key runs again.
    tokio::time::sleep(bound + Duration::from_millis(100)).await;
    let again = pay().await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_eq!(upstream.effects(), 2);
}

on_each_store!(with_the_cache_off_every_replay_reads_the_store);
async fn with_the_cache_off_every_replay_reads_the_store(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let (gw, opened) = gateway(&store, &server, ReplayCache::off()).await;
    let client = gw.client();
    let k = key("off");
    let pay = || {
        client
            .post("/payments")
            .key(&k)
            .json(&json!({"amount": 10}))
            .send()
    };
    assert_eq!(pay().await.status, StatusCode::CREATED);
    assert!(pay().await.replayed());
    evict(&opened, &k).await;
    let again = pay().await;
    assert!(!again.replayed());
    assert_eq!(upstream.effects(), 2);
}

on_each_store!(another_payload_under_a_cached_key_is_still_key_reuse);
async fn another_payload_under_a_cached_key_is_still_key_reuse(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let (gw, _) = gateway(&store, &server, ReplayCache::default()).await;
    let client = gw.client();
    let k = key("reuse");
    let pay = |amount: u64| {
        client
            .post("/payments")
            .key(&k)
            .json(&json!({ "amount": amount }))
            .send()
    };
    assert_eq!(pay(10).await.status, StatusCode::CREATED);
    assert!(pay(10).await.replayed());
    pay(11).await.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.effects(), 1);
}
