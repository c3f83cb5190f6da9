//! Atomic tonic handlers over loopback: the charge is a row in the store's own
//! database, committed with the key's record.

mod common;

use std::time::Duration;

use common::atomic::{charges, serve, serve_on};
use common::payments::{ChargeReply, ChargeRequest};
use common::{CHARGE, Ledger, Script, charge, is_replay, process};
use idem::IdempotencyKey;
use idem_grpc::{GrpcIdempotencyConfig, atomic};
use tonic::{Code, Status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_charge_commits_once_and_duplicates_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path()).await;
    let mut client = common::client(server.addr).await;

    let first = client.charge(charge("a-1", "olga", 500)).await.unwrap();
    assert!(!is_replay(&first));
    let second = client.charge(charge("a-1", "olga", 500)).await.unwrap();
    assert!(is_replay(&second));
    assert_eq!(second.get_ref(), first.get_ref());
    assert_eq!(charges(dir.path(), "olga"), 1);

    let reused = client.charge(charge("a-1", "olga", 501)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);

    let refused = client.charge(charge("a-2", "olga", 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let again = client.charge(charge("a-2", "olga", 0)).await.unwrap_err();
    assert_eq!(again.code(), Code::InvalidArgument);
    assert_eq!(again.message(), "the amount must be positive");
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(charges(dir.path(), "olga"), 1);
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    assert_eq!(ledger.calls(CHARGE), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_releasing_status_rolls_the_write_back_and_the_retry_commits() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path()).await;
    server.script.after_effect.lock().unwrap().extend([
        Status::unavailable("the ledger is busy"),
        Status::internal("bug"),
    ]);
    let mut client = common::client(server.addr).await;

    for expected in [Code::Unavailable, Code::Internal] {
        let failed = client.charge(charge("a-3", "petr", 70)).await.unwrap_err();
        assert_eq!(failed.code(), expected);
        assert_eq!(charges(dir.path(), "petr"), 0);
    }
    let done = client.charge(charge("a-3", "petr", 70)).await.unwrap();
    assert!(!is_replay(&done));
    assert_eq!(charges(dir.path(), "petr"), 1);
}

/// The server process of `a_server_killed_inside_the_transaction_commits_once`.
#[test]
#[ignore = "the server process of a_server_killed_inside_the_transaction_commits_once"]
fn atomic_child_server() {
    process::serve_until_killed(async |listener, started| {
        let script = Script {
            hang: started.hang,
            ..Script::default()
        };
        serve_on(listener, &started.dir, Duration::from_secs(1), script).await
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_inside_the_transaction_commits_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let port = process::free_port();
    let mut first = process::start("atomic_child_server", dir.path(), port, true);

    let client = common::client(([127, 0, 0, 1], port).into()).await;
    let retry = process::until_restarted();
    let call = tokio::spawn(async move {
        retry
            .call(
                IdempotencyKey::new("a-kill").unwrap(),
                ChargeRequest {
                    account: "rita".into(),
                    amount_cents: 4100,
                },
                |request| {
                    let mut client = client.clone();
                    async move { client.charge(request).await }
                },
            )
            .await
    });

    // The charge is written and the transaction still open when the process dies.
    process::first_charge(&ledger).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(charges(dir.path(), "rita"), 0);
    let mut second = process::start("atomic_child_server", dir.path(), port, false);

    let reply = call.await.unwrap();
    second.kill().ok();
    second.wait().ok();
    let reply = reply.expect("the retries reach the restarted server");
    assert_eq!(reply.get_ref().amount_cents, 4100);
    assert_eq!(charges(dir.path(), "rita"), 1);
    assert_eq!(ledger.calls(CHARGE), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_charges_on_postgresql_commit_once_and_roll_back_released_codes() {
    use idem::sqlx::{self, PgConnection};

    let Some(database) = idem_testkit::postgres::TestDatabase::create("idem_grpc_a").await else {
        return;
    };
    let store = idem::PgStore::connect(database.url()).await.expect("store");
    sqlx::query("CREATE TABLE charges (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount_cents BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let config = GrpcIdempotencyConfig::default();
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM charges")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    let pay = async |key: &str, amount_cents: i64, fail: Option<Status>| {
        atomic::apply(
            &store,
            &config,
            CHARGE,
            charge(key, "uma", amount_cents),
            |request: ChargeRequest| {
                async move |tx: &mut PgConnection| -> Result<ChargeReply, Status> {
                    let id: i64 = sqlx::query_scalar(
                        "INSERT INTO charges (account, amount_cents) VALUES ($1, $2) RETURNING id",
                    )
                    .bind(&request.account)
                    .bind(request.amount_cents)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
                    if let Some(status) = fail {
                        return Err(status);
                    }
                    Ok(ChargeReply {
                        charge_id: id,
                        account: request.account,
                        amount_cents: request.amount_cents,
                    })
                }
            },
        )
        .await
    };

    let first = pay("pg-a", 900, None).await.unwrap();
    let again = pay("pg-a", 900, None).await.unwrap();
    assert!(is_replay(&again));
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(count().await, 1);

    let failed = pay("pg-b", 10, Some(Status::unavailable("busy")))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert_eq!(count().await, 1);
    let done = pay("pg-b", 10, None).await.unwrap();
    assert!(!is_replay(&done));
    assert_eq!(count().await, 2);

    let reused = pay("pg-b", 11, None).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(count().await, 2);
}
