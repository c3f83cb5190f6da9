//! The layer in front of a real tonic server over loopback, its effects
//! counted in a SQLite ledger; an answer the store refused, kept in the
//! spool and stored by the next process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::payments::ListChargesRequest;
use common::{
    CHARGE, LIST_CHARGES, Ledger, Script, charge, config, is_replay, serve, serve_layer_on,
};
use idem::SqliteStore;
use idem_grpc::GrpcIdempotencyLayer;
use idem_http::Spool;
use idem_testkit::postgres::TestDatabase;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::Code;

async fn sqlite(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_replayed_with_headers_message_and_trailers() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(sqlite(&dir).await, config(), ledger, Script::default()).await;
    let mut client = server.client().await;

    let first = client.charge(charge("k-1", "alice", 1250)).await.unwrap();
    assert!(!is_replay(&first));
    assert_eq!(first.metadata().get("x-receipt").unwrap(), "r-1");
    let second = client.charge(charge("k-1", "alice", 1250)).await.unwrap();
    assert!(is_replay(&second));
    // The header sent with the answer and the trailer after it, both replayed.
    assert_eq!(second.metadata().get("x-ledger").unwrap(), "sqlite");
    assert_eq!(second.metadata().get("x-receipt").unwrap(), "r-1");
    assert_eq!(second.get_ref(), first.get_ref());
    assert_eq!(server.ledger.charges("alice"), 1);
    assert_eq!(server.ledger.calls(CHARGE), 1);

    // Another key is another charge.
    let third = client.charge(charge("k-2", "alice", 1250)).await.unwrap();
    assert!(!is_replay(&third));
    assert_ne!(third.get_ref().charge_id, first.get_ref().charge_id);
    assert_eq!(server.ledger.charges("alice"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_is_stored_and_replayed_with_its_status_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(sqlite(&dir).await, config(), ledger, Script::default()).await;
    let mut client = server.client().await;

    let first = client.charge(charge("k-neg", "bob", -5)).await.unwrap_err();
    assert_eq!(first.code(), Code::InvalidArgument);
    let second = client.charge(charge("k-neg", "bob", -5)).await.unwrap_err();
    assert_eq!(second.code(), Code::InvalidArgument);
    assert_eq!(second.message(), "the amount must be positive");
    assert_eq!(second.metadata().get("x-field").unwrap(), "amount_cents");
    assert_eq!(
        second.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(server.ledger.calls(CHARGE), 1);
    assert_eq!(server.ledger.charges("bob"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_duplicate_is_aborted_with_a_pushback_hint() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let gate = Arc::new(Semaphore::new(0));
    let script = Script {
        gate: Some(Arc::clone(&gate)),
        ..Script::default()
    };
    let server = serve(sqlite(&dir).await, config(), ledger, script).await;
    let mut client = server.client().await;

    let mut first_client = client.clone();
    let first = tokio::spawn(async move { first_client.charge(charge("k-c", "carol", 700)).await });
    while server.ledger.calls(CHARGE) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = client
        .charge(charge("k-c", "carol", 700))
        .await
        .unwrap_err();
    assert_eq!(duplicate.code(), Code::Aborted);
    let pushback: u64 = duplicate
        .metadata()
        .get(idem_grpc::RETRY_PUSHBACK)
        .expect("a pushback hint")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pushback > 0);

    gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert!(!is_replay(&first));
    let later = client.charge(charge("k-c", "carol", 700)).await.unwrap();
    assert!(is_replay(&later));
    assert_eq!(server.ledger.charges("carol"), 1);
    assert_eq!(server.ledger.calls(CHARGE), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_message_fails_its_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(sqlite(&dir).await, config(), ledger, Script::default()).await;
    let mut client = server.client().await;

    client.charge(charge("k-r", "dave", 100)).await.unwrap();
    let reused = client.charge(charge("k-r", "dave", 999)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert!(
        reused.message().contains("different payload"),
        "{}",
        reused.message()
    );
    assert_eq!(server.ledger.charges("dave"), 1);
    assert_eq!(server.ledger.calls(CHARGE), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_codes_release_the_key_and_the_retry_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let script = Script::default();
    script.failures.lock().unwrap().extend([
        tonic::Status::unavailable("warming up"),
        tonic::Status::resource_exhausted("busy"),
        tonic::Status::aborted("conflict"),
        tonic::Status::internal("bug"),
    ]);
    let server = serve(sqlite(&dir).await, config(), ledger, script).await;
    let mut client = server.client().await;

    for expected in [
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Aborted,
        // Without a reconcile hook, INTERNAL releases the key too.
        Code::Internal,
    ] {
        let failed = client.charge(charge("k-f", "erin", 10)).await.unwrap_err();
        assert_eq!(failed.code(), expected);
        assert!(failed.metadata().get("idempotent-replayed").is_none());
    }
    let done = client.charge(charge("k-f", "erin", 10)).await.unwrap();
    assert!(!is_replay(&done));
    assert_eq!(server.ledger.calls(CHARGE), 5);
    assert_eq!(server.ledger.charges("erin"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_calls_and_unkeyed_calls_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(sqlite(&dir).await, config(), ledger, Script::default()).await;
    let mut client = server.client().await;

    client.charge(charge("k-s", "frank", 5)).await.unwrap();
    for _ in 0..2 {
        let mut request = tonic::Request::new(ListChargesRequest {
            account: "frank".into(),
        });
        request
            .metadata_mut()
            .insert("idempotency-key", "k-stream".parse().unwrap());
        let response = client.list_charges(request).await.unwrap();
        assert!(!is_replay(&response));
        let mut stream = response.into_inner();
        let mut seen = 0;
        while let Some(reply) = stream.message().await.unwrap() {
            assert_eq!(reply.account, "frank");
            seen += 1;
        }
        assert_eq!(seen, 1);
    }
    assert_eq!(server.ledger.calls(LIST_CHARGES), 2);

    // A unary call without a key runs unprotected (the key is not required).
    for _ in 0..2 {
        let request = tonic::Request::new(common::payments::ChargeRequest {
            account: "frank".into(),
            amount_cents: 5,
        });
        client.charge(request).await.unwrap();
    }
    assert_eq!(server.ledger.charges("frank"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_key_that_is_missing_or_malformed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(
        sqlite(&dir).await,
        config().require_key(true),
        ledger,
        Script::default(),
    )
    .await;
    let mut client = server.client().await;

    let request = tonic::Request::new(common::payments::ChargeRequest {
        account: "gina".into(),
        amount_cents: 5,
    });
    let missing = client.charge(request).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing.message().contains("idempotency-key"));
    let long = "k".repeat(300);
    let malformed = client.charge(charge(&long, "gina", 5)).await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(server.ledger.calls(CHARGE), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_replayed_from_postgresql() {
    let Some(database) = TestDatabase::create("idem_grpc_t").await else {
        return;
    };
    let store = idem::PgStore::connect(database.url()).await.expect("store");
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(store, config(), ledger, Script::default()).await;
    let mut client = server.client().await;

    let first = client.charge(charge("pg-1", "hana", 300)).await.unwrap();
    let second = client.charge(charge("pg-1", "hana", 300)).await.unwrap();
    assert!(is_replay(&second));
    assert_eq!(second.metadata().get("x-receipt").unwrap(), "r-1");
    assert_eq!(second.get_ref(), first.get_ref());
    let reused = client
        .charge(charge("pg-1", "hana", 301))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(server.ledger.charges("hana"), 1);
    assert_eq!(server.ledger.calls(CHARGE), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_from_two_callers_is_two_calls() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(sqlite(&dir).await, config(), ledger, Script::default()).await;
    let mut client = server.client().await;

    let mut replies = Vec::new();
    for caller in ["Bearer one", "Bearer two", "Bearer one"] {
        let mut request = charge("k-shared", "sam", 40);
        request
            .metadata_mut()
            .insert("authorization", caller.parse().unwrap());
        replies.push(client.charge(request).await.unwrap());
    }
    assert!(!is_replay(&replies[0]));
    assert!(!is_replay(&replies[1]));
    assert!(is_replay(&replies[2]));
    assert_ne!(
        replies[0].get_ref().charge_id,
        replies[1].get_ref().charge_id
    );
    assert_eq!(replies[2].get_ref(), replies[0].get_ref());
    assert_eq!(server.ledger.charges("sam"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let server = serve(
        sqlite(&dir).await,
        config().message_limit(16),
        ledger,
        Script::default(),
    )
    .await;
    let mut client = server.client().await;

    let long = "x".repeat(64);
    let refused = client.charge(charge("k-big", &long, 1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    client.charge(charge("k-small", "tom", 1)).await.unwrap();
    assert_eq!(server.ledger.calls(CHARGE), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_store_refused_is_spooled_and_stored_by_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let spool_path = dir.path().join("answers.spool");
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let gate = Arc::new(Semaphore::new(0));

    // The first process: a runtime of its own, so that stopping it drops
    // every task it had (the completion still being retried among them).
    let (ready, started) = tokio::sync::oneshot::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let process = {
        let (db, spool_path, ledger) = (db.clone(), spool_path.clone(), ledger.clone());
        let gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let server = runtime.block_on(async move {
                let store = SqliteStore::builder(&db)
                    .busy_timeout(Duration::from_millis(100))
                    .open()
                    .await
                    .expect("store");
                let layer = GrpcIdempotencyLayer::new(store, config())
                    .with_spool(Spool::open(&spool_path).unwrap());
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let script = Script {
                    gate: Some(gate),
                    ..Script::default()
                };
                serve_layer_on(listener, layer, ledger, script).await
            });
            ready.send(server.addr).unwrap();
            stopped.recv().ok();
            drop(server);
            // Its tasks are dropped (the spool's file let go with them)
            // before this returns.
            runtime.shutdown_timeout(Duration::from_secs(10));
        })
    };
    let mut client = common::client(started.await.unwrap()).await;
    let sent = tokio::spawn(async move { client.charge(charge("k-kept", "kim", 75)).await });
    while ledger.calls(CHARGE) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The claim is taken; another connection holds the store's write lock
    // while the charge is made, so the answer cannot be stored.
    let blocker = idem::rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    gate.add_permits(1);
    let answer = sent.await.unwrap().expect("the client gets its answer");
    assert!(!is_replay(&answer));
    // The process dies before the store is back.
    stop.send(()).unwrap();
    tokio::task::spawn_blocking(move || process.join().unwrap())
        .await
        .unwrap();
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);

    let spool = Spool::open(&spool_path).expect("the first process let the spool go");
    assert_eq!(spool.pending(), 1, "the answer was kept");
    let layer = GrpcIdempotencyLayer::new(sqlite(&dir).await, config()).with_spool(spool);
    assert_eq!(layer.flush_spool().await.unwrap(), 1);
    assert_eq!(layer.spool().unwrap().pending(), 0);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = serve_layer_on(listener, layer, ledger, Script::default()).await;
    let retried = server
        .client()
        .await
        .charge(charge("k-kept", "kim", 75))
        .await
        .unwrap();
    assert!(is_replay(&retried));
    assert_eq!(retried.get_ref(), answer.get_ref());
    assert_eq!(
        server.ledger.charges("kim"),
        1,
        "charged once, across the restart"
    );
    assert_eq!(server.ledger.calls(CHARGE), 1);
}
