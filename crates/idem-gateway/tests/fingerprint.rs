//! Fingerprint rules through the gateway: a client, the gateway's service on
//! `127.0.0.1:0` with a [`FingerprintRule`], and an upstream that counts its
//! effects. Each case runs on SQLite, PostgreSQL and Redis.

#[macro_use]
mod common;

use axum::http::StatusCode;
use common::gateway::{Gateway, Options, Upstream};
use common::stores::{Kind, Store};
use common::{Client, Server};
use idem::FingerprintRule;
use idem_http::IdempotencyConfig;
use serde_json::json;

/// A gateway with `rule` in front of `upstream`, on `store`.
async fn gateway(store: &Store, upstream: &Server, rule: FingerprintRule) -> Gateway {
    let idempotency = IdempotencyConfig::default().fingerprint(rule);
    let opened = store.open(&idempotency).await;
    Gateway::start(
        upstream.addr,
        opened,
        Options {
            idempotency,
            ..Options::default()
        },
    )
    .await
}

/// Keys of this run only: Redis cases share one server and prefix.
fn key(name: &str) -> String {
    format!("{}{name}", idem_testkit::redis::test_prefix("fp"))
}

on_each_store!(a_retry_differing_only_in_an_ignored_field_is_replayed);
async fn a_retry_differing_only_in_an_ignored_field_is_replayed(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let rule = FingerprintRule::default()
        .ignore("json:/sent_at,/trace_id")
        .unwrap();
    let gw = gateway(&store, &server, rule).await;
    let client = gw.client();
    let k = key("ignored");
    let first = client
        .post("/payments")
        .key(&k)
        .json(&json!({"amount": 10, "currency": "EUR", "sent_at": 1, "trace_id": "a"}))
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = client
        .post("/payments")
        .key(&k)
        .json(&json!({"trace_id": "b", "currency": "EUR", "amount": 10, "sent_at": 2}))
        .send()
        .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    let reused = client
        .post("/payments")
        .key(&k)
        .json(&json!({"amount": 11, "currency": "EUR", "sent_at": 1, "trace_id": "a"}))
        .send()
        .await;
    reused.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.effects(), 1);
}

on_each_store!(a_retry_differing_in_a_selected_field_is_refused_as_key_reuse);
async fn a_retry_differing_in_a_selected_field_is_refused_as_key_reuse(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let rule = FingerprintRule::default()
        .select("json:/amount,/currency,/account")
        .unwrap();
    let gw = gateway(&store, &server, rule).await;
    let client = gw.client();
    let k = key("selected");
    let pay = |body: serde_json::Value| client.post("/payments").key(&k).json(&body).send();
    let first = pay(json!({"amount": 10, "currency": "EUR", "account": "a-1", "nonce": 1})).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = pay(json!({"amount": 10, "currency": "EUR", "account": "a-1", "nonce": 2})).await;
    assert!(retry.replayed(), "{:?}", retry.body);
    for other in [
        json!({"amount": 10, "currency": "USD", "account": "a-1", "nonce": 1}),
        json!({"amount": 10, "currency": "EUR", "nonce": 1}),
        json!({"amount": 10, "currency": "EUR", "account": null, "nonce": 1}),
    ] {
        let reused = pay(other.clone()).await;
        let detail = reused.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!detail.is_empty(), "{other}");
    }
    // A selected field that is missing is hashed as absent: a key first used
    // without it is replayed to a retry without it, refused with it as null.
    let k2 = key("absent");
    let without = client
        .post("/payments")
        .key(&k2)
        .json(&json!({"amount": 5, "currency": "EUR", "nonce": 1}))
        .send()
        .await;
    assert_eq!(without.status, StatusCode::CREATED);
    let again = client
        .post("/payments")
        .key(&k2)
        .json(&json!({"amount": 5, "currency": "EUR", "nonce": 2}))
        .send()
        .await;
    assert!(again.replayed());
    let null = client
        .post("/payments")
        .key(&k2)
        .json(&json!({"amount": 5, "currency": "EUR", "account": null}))
        .send()
        .await;
    null.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.effects(), 2);
}

on_each_store!(a_selected_header_is_part_of_the_fingerprint);
async fn a_selected_header_is_part_of_the_fingerprint(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let rule = FingerprintRule::default()
        .select("json:/amount")
        .unwrap()
        .header("X-Account")
        .unwrap();
    let gw = gateway(&store, &server, rule).await;
    let client = gw.client();
    let k = key("header");
    let pay = |account: Option<&'static str>, nonce: u32| {
        let call = client
            .post("/payments")
            .key(&k)
            .json(&json!({"amount": 10, "nonce": nonce}));
        match account {
            Some(account) => call.header("x-account", account),
            None => call,
        }
        .send()
    };
    let first = pay(Some("a-1"), 1).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(pay(Some("a-1"), 2).await.replayed());
    pay(Some("a-2"), 1)
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    pay(None, 1).await.problem(StatusCode::UNPROCESSABLE_ENTITY);
    // Another header changes nothing: only the chosen one is covered.
    let other = client
        .post("/payments")
        .key(&k)
        .header("x-account", "a-1")
        .header("x-request-id", "r-9")
        .json(&json!({"amount": 10, "nonce": 3}))
        .send()
        .await;
    assert!(other.replayed());
    assert_eq!(upstream.effects(), 1);
}

on_each_store!(a_rule_change_between_a_request_and_its_retry_replays_the_answer);
/// The documented behaviour of a rule change: a record fingerprinted under
/// another rule cannot be compared with the retry, so the retry is answered
/// as one (replayed), whichever way the rule changed; under the new rule,
/// key reuse is refused as before.
async fn a_rule_change_between_a_request_and_its_retry_replays_the_answer(kind: Kind) {
    let Some(store) = Store::fresh(kind).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let before = gateway(&store, &server, FingerprintRule::default()).await;
    let (k1, k2) = (key("change-1"), key("change-2"));
    let first = before
        .client()
        .post("/payments")
        .key(&k1)
        .json(&json!({"amount": 10, "sent_at": 1}))
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    drop(before);

    // The deploy: the same store, a rule that leaves `sent_at` out.
    let ignore = FingerprintRule::default().ignore("json:/sent_at").unwrap();
    let after = gateway(&store, &server, ignore.clone()).await;
    let client = after.client();
    let retry = client
        .post("/payments")
        .key(&k1)
        .json(&json!({"amount": 10, "sent_at": 2}))
        .send()
        .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    // Even a different amount: the record's payload cannot be compared.
    let uncomparable = client
        .post("/payments")
        .key(&k1)
        .json(&json!({"amount": 99}))
        .send()
        .await;
    assert!(uncomparable.replayed());

    // Under the new rule, a new key's reuse is refused as before.
    let fresh = client
        .post("/payments")
        .key(&k2)
        .json(&json!({"amount": 20, "sent_at": 1}))
        .send()
        .await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    client
        .post("/payments")
        .key(&k2)
        .json(&json!({"amount": 21, "sent_at": 1}))
        .send()
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    drop(after);

    // And back to the default rule: k2's record was made under the other one.
    let back = gateway(&store, &server, FingerprintRule::default()).await;
    let back_retry = back
        .client()
        .post("/payments")
        .key(&k2)
        .json(&json!({"amount": 20, "sent_at": 5}))
        .send()
        .await;
    assert!(back_retry.replayed());
    assert_eq!(back_retry.body, fresh.body);
    assert_eq!(upstream.effects(), 2);
}

/// The layer by itself (no gateway): the rule set on its config decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_takes_the_rule_from_its_config() {
    let Some(store) = Store::fresh(Kind::Sqlite).await else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let rule = FingerprintRule::default().select("json:/amount").unwrap();
    let gw = gateway(&store, &server, rule.clone()).await;
    assert_eq!(gw.layer.config().fingerprint_rule(), &rule);
    let client: Client = gw.client();
    let k = key("layer");
    for nonce in 0..3 {
        let reply = client
            .post("/payments")
            .key(&k)
            .json(&json!({"amount": 1, "nonce": nonce}))
            .send()
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(reply.replayed(), nonce > 0);
    }
    assert_eq!(upstream.effects(), 1);
}
