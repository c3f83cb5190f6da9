//! Calls whose outcome is unknown: a tonic payments service that makes the
//! charge and then answers `INTERNAL`, `DEADLINE_EXCEEDED` or `UNKNOWN`,
//! behind the layer, with and without the service's `Lookup` method asked
//! before a retry runs again. Effects are counted in the service's SQLite
//! ledger; the metrics of such calls are counted in `reconcile_counted`, a
//! process of its own.

mod common;

use std::time::Duration;

use common::reconcile::{applied_calls_are_reconciled, reconciled, sqlite, start};
use common::{CHARGE, LOOKUP, Script, charge, is_replay};
use idem_testkit::postgres::TestDatabase;
use tonic::{Code, Status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_call_applied_then_answered_unknown_is_reconciled_once() {
    let Some(database) = TestDatabase::create("idem_grpc_rec").await else {
        return;
    };
    let store = idem::PgStore::connect(database.url()).await.expect("store");
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir, store, idem::DEFAULT_LEASE, true, Script::default()).await;
    let mut client = server.client().await;
    applied_calls_are_reconciled(&server, &mut client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_not_applied_runs_and_a_lookup_that_cannot_tell_is_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(30);
    let script = Script::default();
    // The first charge gives up before its effect; the lookup says so.
    script
        .failures
        .lock()
        .unwrap()
        .push_back(Status::deadline_exceeded("gave up before the charge"));
    let server = start(&dir, sqlite(&dir, lease).await, lease, true, script).await;
    let mut client = server.client().await;

    let failed = client.charge(charge("k-n", "nora", 40)).await.unwrap_err();
    assert_eq!(failed.code(), Code::DeadlineExceeded);
    assert_eq!(server.ledger.charges("nora"), 0);
    let ran = client.charge(charge("k-n", "nora", 40)).await.unwrap();
    assert!(!is_replay(&ran) && !reconciled(&ran));
    assert_eq!(server.ledger.charges("nora"), 1);
    assert_eq!(server.ledger.calls(LOOKUP), 1);
    assert!(is_replay(
        &client.charge(charge("k-n", "nora", 40)).await.unwrap()
    ));

    // The charge is made and answered INTERNAL; the lookup then fails
    // once: the retry is refused, nothing runs, and the next one asks again.
    server
        .script
        .after_effect
        .lock()
        .unwrap()
        .push_back(Status::internal("crashed after the commit"));
    server
        .script
        .lookup_failures
        .lock()
        .unwrap()
        .push_back(Status::unavailable("the ledger is restarting"));
    let failed = client.charge(charge("k-o", "omar", 50)).await.unwrap_err();
    assert_eq!(failed.code(), Code::Internal);
    let refused = client.charge(charge("k-o", "omar", 50)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(
        refused.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1000"
    );
    assert!(
        refused.message().contains("the ledger is restarting"),
        "{refused:?}"
    );
    let retry = client.charge(charge("k-o", "omar", 50)).await.unwrap();
    assert!(is_replay(&retry) && reconciled(&retry));
    assert_eq!(server.ledger.charges("omar"), 1);
    assert_eq!(server.ledger.calls(LOOKUP), 3);
    assert_eq!(server.ledger.calls(CHARGE), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lookup_internal_is_released_and_deadline_exceeded_holds_the_key_for_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(3);
    let server = start(
        &dir,
        sqlite(&dir, lease).await,
        lease,
        false,
        Script::default(),
    )
    .await;
    let mut client = server.client().await;
    let after_effect =
        |status: Status| server.script.after_effect.lock().unwrap().push_back(status);

    // INTERNAL releases the key: the retry runs, and charges again. This is
    // what the policy says without a lookup to ask.
    after_effect(Status::internal("crashed after the commit"));
    let failed = client.charge(charge("k-i", "ines", 10)).await.unwrap_err();
    assert_eq!(failed.code(), Code::Internal);
    let ran = client.charge(charge("k-i", "ines", 10)).await.unwrap();
    assert!(!is_replay(&ran));
    assert_eq!(server.ledger.charges("ines"), 2);

    // DEADLINE_EXCEEDED holds the key: the retry is told how long it stays
    // reserved, and runs again only after the lease.
    after_effect(Status::deadline_exceeded(
        "the deadline passed after the commit",
    ));
    let failed = client.charge(charge("k-d", "dara", 10)).await.unwrap_err();
    assert_eq!(failed.code(), Code::DeadlineExceeded);
    let refused = client.charge(charge("k-d", "dara", 10)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    let pushback: u64 = refused
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (2000..=3000).contains(&pushback),
        "the time left of a 3s lease: {pushback}"
    );
    assert!(refused.message().contains("unknown outcome"), "{refused:?}");
    assert_eq!(server.ledger.charges("dara"), 1);
    tokio::time::sleep(Duration::from_millis(pushback + 100)).await;
    let ran = client.charge(charge("k-d", "dara", 10)).await.unwrap();
    assert!(!is_replay(&ran));
    assert_eq!(server.ledger.charges("dara"), 2);
    assert_eq!(server.ledger.calls(LOOKUP), 0);
}
