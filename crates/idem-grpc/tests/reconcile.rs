//! Calls whose outcome is unknown: a tonic payments service that makes the
//! charge and then answers `INTERNAL`, `DEADLINE_EXCEEDED` or `UNKNOWN`,
//! behind the layer, with and without the service's `Lookup` method asked
//! before a retry runs again. Effects are counted in the service's SQLite
//! ledger.

mod common;

use std::time::Duration;

use common::payments::payments_client::PaymentsClient;
use common::{CHARGE, LOOKUP, Ledger, Running, Script, charge, config, is_replay, serve_layer_on};
use idem::{LeaseStore, Settings, SqliteStore};
use idem_grpc::{GrpcIdempotencyLayer, GrpcProbe, ProbeMethod};
use idem_testkit::postgres::TestDatabase;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The codes a service may answer after its effect that leave the outcome
/// unknown (`INTERNAL` only because the layer has a lookup to ask).
fn unknown_after_effect() -> [Status; 3] {
    [
        Status::internal("crashed after the commit"),
        Status::deadline_exceeded("the deadline passed after the commit"),
        Status::unknown("the handler's error was not mapped"),
    ]
}

async fn sqlite(dir: &tempfile::TempDir, lease: Duration) -> SqliteStore {
    SqliteStore::builder(dir.path().join("idem.db"))
        .settings(Settings::default().with_lease(lease))
        .open()
        .await
        .expect("store")
}

/// The payments service behind the layer over `store`, asking its own
/// `Lookup` method (over a channel to itself) when `probed`.
async fn start<St: LeaseStore + 'static>(
    dir: &tempfile::TempDir,
    store: St,
    lease: Duration,
    probed: bool,
    script: Script,
) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let mut layer = GrpcIdempotencyLayer::new(store, config().lease(lease));
    if probed {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect_lazy();
        layer = layer.with_reconcile(ProbeMethod::new(GrpcProbe::every(LOOKUP), channel));
    }
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    serve_layer_on(listener, layer, ledger, script).await
}

fn reconciled<T>(response: &tonic::Response<T>) -> bool {
    response
        .metadata()
        .get("idempotency-reconciled")
        .is_some_and(|v| v == "true")
}

/// For each unknown code: the charge is made, the client told the code; the
/// retry gets the charge's reply from the lookup, stored and replayed.
async fn applied_calls_are_reconciled(server: &Running, client: &mut PaymentsClient<Channel>) {
    for (n, status) in unknown_after_effect().into_iter().enumerate() {
        let (key, account) = (format!("k-{n}"), format!("acct-{n}"));
        let code = status.code();
        server.script.after_effect.lock().unwrap().push_back(status);
        let failed = client
            .charge(charge(&key, &account, 700))
            .await
            .unwrap_err();
        assert_eq!(failed.code(), code);
        assert_eq!(server.ledger.charges(&account), 1);

        let retry = client.charge(charge(&key, &account, 700)).await.unwrap();
        assert!(
            is_replay(&retry) && reconciled(&retry),
            "{code:?}: {retry:?}"
        );
        assert_eq!(retry.get_ref().account, account);
        assert_eq!(retry.get_ref().amount_cents, 700);
        assert_eq!(retry.metadata().get("x-ledger").unwrap(), "sqlite");
        // The lookup's answer is stored: later duplicates are replayed
        // without asking again.
        let again = client.charge(charge(&key, &account, 700)).await.unwrap();
        assert!(is_replay(&again) && reconciled(&again));
        assert_eq!(again.get_ref(), retry.get_ref());
        assert_eq!(server.ledger.charges(&account), 1, "{code:?}");
    }
    assert_eq!(server.ledger.calls(CHARGE), 3);
    assert_eq!(server.ledger.calls(LOOKUP), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_applied_then_answered_unknown_is_reconciled_once_not_run_again() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let counted = recorder.install().is_ok();

    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(30);
    let server = start(
        &dir,
        sqlite(&dir, lease).await,
        lease,
        true,
        Script::default(),
    )
    .await;
    let mut client = server.client().await;
    applied_calls_are_reconciled(&server, &mut client).await;

    if counted {
        // Each test runs in a process of its own under nextest: the counts
        // are this test's. A snapshot takes the counts it reads.
        let snapshot = snapshotter.snapshot().into_vec();
        let count = |name: &str, label: &str, value: &str| -> u64 {
            snapshot
                .iter()
                .filter(|(key, ..)| {
                    key.key().name() == name
                        && key
                            .key()
                            .labels()
                            .any(|l| l.key() == label && l.value() == value)
                        && key.key().labels().any(|l| l.value() == CHARGE)
                })
                .map(|(.., value)| match value {
                    DebugValue::Counter(n) => *n,
                    _ => 0,
                })
                .sum()
        };
        assert_eq!(
            count(idem_grpc::observe::RECONCILES_TOTAL, "result", "applied"),
            3
        );
        assert_eq!(
            count(idem_grpc::observe::VERDICTS_TOTAL, "verdict", "unknown"),
            3
        );
    }
}

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
