//! A small bank served by atomic handlers, and the scenarios both stores must
//! pass. Account `acc-1` starts with 100; `POST /debit` takes
//! `{"account": "...", "amount": N}`. A request header `x-then` makes the
//! handler misbehave *after* its writes: `fail` returns a [`Failure`], and
//! `unavailable` answers 503; both must leave nothing behind.

use std::future::Future;
use std::pin::Pin;

use http::StatusCode;
use idem_http::StoredResponse;
use idem_http::atomic::{AtomicRequest, Failure};
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinSet;

use super::Client;

#[derive(Debug, Deserialize)]
pub struct Debit {
    pub account: String,
    pub amount: i64,
}

/// What the handler does after its writes.
pub enum Then {
    Answer,
    Fail,
    Unavailable,
}

pub fn then(request: &AtomicRequest) -> Then {
    match request
        .headers()
        .get("x-then")
        .and_then(|v| v.to_str().ok())
    {
        Some("fail") => Then::Fail,
        Some("unavailable") => Then::Unavailable,
        _ => Then::Answer,
    }
}

/// The answer after a debit of `debit` to `balance` (the new balance).
pub fn debited(
    then: Then,
    debit: &Debit,
    id: i64,
    balance: i64,
) -> Result<StoredResponse, Failure> {
    match then {
        Then::Answer => Ok(StoredResponse::json(
            StatusCode::CREATED,
            &json!({ "debit": id, "account": debit.account, "amount": debit.amount, "balance": balance }),
        )),
        Then::Fail => Err(Failure::new("injected failure after the writes")),
        Then::Unavailable => Ok(StoredResponse::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "try later",
        )),
    }
}

pub fn insufficient(balance: i64) -> StoredResponse {
    StoredResponse::json(
        StatusCode::PAYMENT_REQUIRED,
        &json!({ "error": "insufficient funds", "balance": balance }),
    )
}

pub fn unreadable(error: serde_json::Error) -> StoredResponse {
    StoredResponse::json(
        StatusCode::BAD_REQUEST,
        &json!({ "error": error.to_string() }),
    )
}

/// Reads the bank's state, whatever the database.
pub trait Ledger: Send + Sync {
    fn balance(&self) -> Pin<Box<dyn Future<Output = i64> + Send + '_>>;
    fn debits(&self) -> Pin<Box<dyn Future<Output = i64> + Send + '_>>;
}

fn debit(amount: i64) -> serde_json::Value {
    json!({ "account": "acc-1", "amount": amount })
}

pub async fn duplicates_debit_once(client: &Client, ledger: &dyn Ledger) {
    let first = client
        .post("/debit")
        .key("pay-1")
        .json(&debit(30))
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(!first.replayed());
    assert_eq!(first.json()["balance"], 70);
    for _ in 0..3 {
        let again = client
            .post("/debit")
            .key("pay-1")
            .json(&debit(30))
            .send()
            .await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("content-type"), Some("application/json"));
    }
    assert_eq!(ledger.balance().await, 70);
    assert_eq!(ledger.debits().await, 1);

    let second = client
        .post("/debit")
        .key("pay-2")
        .json(&debit(20))
        .send()
        .await;
    assert_eq!(second.json()["balance"], 50);
    assert_eq!(ledger.balance().await, 50);
    assert_eq!(ledger.debits().await, 2);
}

pub async fn a_declined_debit_is_stored_and_replayed(client: &Client, ledger: &dyn Ledger) {
    let declined = client
        .post("/debit")
        .key("big")
        .json(&debit(500))
        .send()
        .await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let again = client
        .post("/debit")
        .key("big")
        .json(&debit(500))
        .send()
        .await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(again.body, declined.body);
    assert_eq!(ledger.balance().await, 100);
    assert_eq!(ledger.debits().await, 0);
}

pub async fn concurrent_duplicates_debit_once(client: &Client, ledger: &dyn Ledger) {
    let mut calls = JoinSet::new();
    for _ in 0..64 {
        let client = client.clone();
        calls.spawn(async move {
            client
                .post("/debit")
                .key("race")
                .json(&debit(10))
                .send()
                .await
        });
    }
    let replies = calls.join_all().await;
    let fresh: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one debit ran");
    for reply in &replies {
        match reply.status {
            StatusCode::CREATED => assert_eq!(reply.body, fresh[0].body),
            StatusCode::CONFLICT => assert!(reply.retry_after() >= 1),
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
    assert_eq!(ledger.balance().await, 90);
    assert_eq!(ledger.debits().await, 1);
}

pub async fn a_failed_handler_leaves_nothing_and_the_retry_runs(
    client: &Client,
    ledger: &dyn Ledger,
) {
    let failed = client
        .post("/debit")
        .key("f")
        .header("x-then", "fail")
        .json(&debit(10))
        .send()
        .await;
    let detail = failed.problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(detail.contains("retry"), "{detail}");
    assert!(
        !detail.contains("injected"),
        "the error itself is not sent: {detail}"
    );
    assert_eq!(ledger.balance().await, 100);
    assert_eq!(ledger.debits().await, 0);

    let unavailable = client
        .post("/debit")
        .key("f")
        .header("x-then", "unavailable")
        .json(&debit(10))
        .send()
        .await;
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(unavailable.body.as_ref(), b"try later");
    assert_eq!(ledger.balance().await, 100);
    assert_eq!(ledger.debits().await, 0);

    let retried = client.post("/debit").key("f").json(&debit(10)).send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(ledger.balance().await, 90);
    assert_eq!(ledger.debits().await, 1);
}

pub async fn refusals_follow_the_table(client: &Client, ledger: &dyn Ledger) {
    client.post("/debit").key("k").json(&debit(10)).send().await;
    let reused = client.post("/debit").key("k").json(&debit(11)).send().await;
    reused.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let missing = client.post("/debit").json(&debit(10)).send().await;
    missing.problem(StatusCode::BAD_REQUEST);
    let malformed = client
        .post("/debit")
        .raw_key(b"")
        .json(&debit(10))
        .send()
        .await;
    malformed.problem(StatusCode::BAD_REQUEST);
    let big = client
        .post("/debit")
        .key("huge")
        .bytes(vec![b' '; 32 * 1024])
        .send()
        .await;
    big.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(ledger.balance().await, 90);
    assert_eq!(ledger.debits().await, 1);
}

pub async fn keyless_requests_run_each_time_where_allowed(client: &Client, ledger: &dyn Ledger) {
    for _ in 0..2 {
        let reply = client.post("/debit-optional").json(&debit(5)).send().await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let failed = client
        .post("/debit-optional")
        .header("x-then", "fail")
        .json(&debit(5))
        .send()
        .await;
    failed.problem(StatusCode::INTERNAL_SERVER_ERROR);
    // After `refusals_follow_the_table`: 90, one debit; now two more of 5.
    assert_eq!(ledger.balance().await, 80);
    assert_eq!(ledger.debits().await, 3);
}
