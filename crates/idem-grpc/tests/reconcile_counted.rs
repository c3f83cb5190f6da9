//! The metrics of calls whose outcome is unknown and that the service's
//! `Lookup` method reconciled: the only test of its binary, so the process's
//! recorder counts this test's calls alone (under `cargo test` as under
//! nextest).

mod common;

use std::time::Duration;

use common::CHARGE;
use common::Script;
use common::reconcile::{applied_calls_are_reconciled, sqlite, start};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

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
        // The only test of this binary: the counts are this test's. A
        // snapshot takes the counts it reads.
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
