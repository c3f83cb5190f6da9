//! Crash tests with real processes.
//!
//! The test binary runs itself again as a child (an ignored test that does
//! nothing unless the crash variables are set). The child applies an operation
//! and stops at a named [`CrashPoint`], printing a marker; the parent then kills
//! it with SIGKILL — no destructors, no rollback by the child — and retries the
//! operation the way a redelivery would. The effect, counted in the database,
//! must end up applied exactly once.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use idem_core::{Applied, ApplyError, Claimed, Error, LeaseStore, ManualClock, Operation, Outcome};

use crate::crash_point::MARKER;
pub use crate::crash_point::{CrashPoint, reach};
use crate::harness::{Effect, Harness, counter_outcome, op};

const LOCATION: &str = "IDEM_CRASH_LOCATION";
const POINT: &str = "IDEM_CRASH_POINT";
const AMOUNT: i64 = 10;
const COUNTER: &str = "crash";

fn crash_op() -> Operation {
    op("crash", "payment-1", "debit 10")
}

/// The child's side: does nothing unless started by [`crash_and_recover`].
pub async fn child<H: Harness>() {
    let (Ok(location), Ok(point)) = (std::env::var(LOCATION), std::env::var(POINT)) else {
        return;
    };
    let point = CrashPoint::parse(&point).expect("known crash point");
    let h = H::open(&location, ManualClock::starting_now()).await;
    let pay = crash_op();
    match point {
        CrashPoint::LeasedAfterClaim => {
            let claimed = h.store().claim(&pay.scope, &pay.key, pay.fingerprint).await;
            assert!(matches!(claimed, Ok(Claimed::Fresh(_))), "{claimed:?}");
            reach(point)
        }
        CrashPoint::LeasedEffectBeforeRecord => {
            let _ = h
                .store()
                .apply_leased(
                    &pay.scope,
                    &pay.key,
                    pay.fingerprint,
                    async |_claim| -> Result<Outcome, String> {
                        h.add_outside(COUNTER, AMOUNT).await;
                        reach(point)
                    },
                )
                .await;
            unreachable!("the child stops at {point:?}")
        }
        CrashPoint::LeasedRecordBeforeEffect => {
            let _ = h
                .store()
                .apply_at_most_once(
                    &pay.scope,
                    &pay.key,
                    pay.fingerprint,
                    sent_outcome(),
                    async |_claim| -> Result<(), String> { reach(point) },
                )
                .await;
            unreachable!("the child stops at {point:?}")
        }
        CrashPoint::AfterCommit => {
            h.apply_add(&pay, COUNTER, AMOUNT, Effect::Succeed)
                .await
                .expect("apply");
            reach(point)
        }
        CrashPoint::AfterClaim | CrashPoint::InsideEffect => {
            let result = h
                .apply_add(&pay, COUNTER, AMOUNT, Effect::Crash(point))
                .await;
            panic!("the effect should have stopped at {point:?}, got {result:?}");
        }
    }
}

/// Runs the child until it reaches `point`, kills it with SIGKILL, then retries
/// the operation and checks it was applied exactly once. `child_test` is the
/// full name of the test that calls [`child`].
pub async fn crash_and_recover<H: Harness>(h: H, point: CrashPoint, child_test: &str) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            child_test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LOCATION, h.location())
        .env(POINT, point.as_str())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child process");
    let stdout = child.stdout.take().expect("piped stdout");
    let (seen_tx, seen_rx) = mpsc::channel();
    let expected = format!("{MARKER} {}", point.as_str());
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains(&expected) {
                let _ = seen_tx.send(());
            }
        }
    });
    let reached = seen_rx.recv_timeout(Duration::from_secs(120));
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    reached.unwrap_or_else(|_| panic!("the child never reached {point:?} (status {status:?})"));
    assert_eq!(status.signal(), Some(9), "the child died by SIGKILL");

    let pay = crash_op();
    match point {
        CrashPoint::LeasedAfterClaim => {
            assert_eq!(h.counter(COUNTER).await, 0);
            let held = h.store().claim(&pay.scope, &pay.key, pay.fingerprint).await;
            assert!(matches!(held, Err(Error::InFlight { .. })), "{held:?}");
            h.clock()
                .advance(idem_core::DEFAULT_LEASE + Duration::from_secs(5));
            let Ok(Claimed::Fresh(claim)) =
                h.store().claim(&pay.scope, &pay.key, pay.fingerprint).await
            else {
                panic!("the dead worker's claim must be taken over once its lease ended")
            };
            assert!(claim.took_over);
            h.complete_add(&claim, COUNTER, AMOUNT)
                .await
                .expect("complete");
        }
        CrashPoint::LeasedEffectBeforeRecord => {
            // Record after the effect: at least once. The effect happened, the
            // key is still claimed; after the lease the retry runs it again.
            assert_eq!(h.counter(COUNTER).await, AMOUNT);
            h.clock()
                .advance(idem_core::DEFAULT_LEASE + Duration::from_secs(5));
            let retried = h
                .store()
                .apply_leased(&pay.scope, &pay.key, pay.fingerprint, async |_claim| {
                    h.add_outside(COUNTER, AMOUNT).await;
                    Ok::<_, String>(sent_outcome())
                })
                .await
                .expect("the retry");
            assert!(!retried.is_replay());
            assert_eq!(
                h.counter(COUNTER).await,
                2 * AMOUNT,
                "repeated, never lost: the order's known cost"
            );
            let again = h
                .store()
                .apply_leased(&pay.scope, &pay.key, pay.fingerprint, async |_claim| {
                    h.add_outside(COUNTER, AMOUNT).await;
                    Ok::<_, String>(sent_outcome())
                })
                .await
                .expect("a later duplicate");
            assert!(again.is_replay());
            assert_eq!(h.counter(COUNTER).await, 2 * AMOUNT);
            return;
        }
        CrashPoint::LeasedRecordBeforeEffect => {
            // Record before the effect: at most once. The key is recorded, the
            // effect never ran; every retry replays and none runs it.
            for _ in 0..2 {
                h.clock()
                    .advance(idem_core::DEFAULT_LEASE + Duration::from_secs(5));
                let retried = h
                    .store()
                    .apply_at_most_once(
                        &pay.scope,
                        &pay.key,
                        pay.fingerprint,
                        sent_outcome(),
                        async |_claim| {
                            h.add_outside(COUNTER, AMOUNT).await;
                            Ok::<_, String>(())
                        },
                    )
                    .await
                    .expect("the retry");
                assert_eq!(retried, Applied::Replayed(sent_outcome()));
            }
            assert_eq!(
                h.counter(COUNTER).await,
                0,
                "lost, never repeated: the order's known cost"
            );
            return;
        }
        _ => {
            let expected_before = if point == CrashPoint::AfterCommit {
                AMOUNT
            } else {
                0
            };
            assert_eq!(h.counter(COUNTER).await, expected_before);
            let applied = retry_while_in_flight(&h, &pay).await;
            assert_eq!(applied.outcome(), &counter_outcome(AMOUNT));
            assert_eq!(applied.is_replay(), point == CrashPoint::AfterCommit);
        }
    }
    assert_eq!(h.counter(COUNTER).await, AMOUNT, "applied exactly once");
    let again = retry_while_in_flight(&h, &pay).await;
    assert!(again.is_replay());
    assert_eq!(h.counter(COUNTER).await, AMOUNT);
}

/// What the leased crash cases record: "the message was sent".
fn sent_outcome() -> Outcome {
    Outcome::success("sent")
}

/// Redelivers until the store stops answering `InFlight` (a killed client's
/// session may take a moment to be noticed by a database server).
async fn retry_while_in_flight<H: Harness>(h: &H, pay: &Operation) -> idem_core::Applied {
    for _ in 0..500 {
        match h.apply_add(pay, COUNTER, AMOUNT, Effect::Succeed).await {
            Ok(applied) => return applied,
            Err(ApplyError::Protocol(Error::InFlight { .. })) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(other) => panic!("retry failed: {other:?}"),
        }
    }
    panic!("still in flight after 10 s of redeliveries")
}
