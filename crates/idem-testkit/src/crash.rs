//! Crash tests with real processes that abort at Idem's own crash points.
//!
//! The test binary runs itself again as a child (an ignored test that does
//! nothing unless started by [`crash_and_recover`]), with one of
//! [`idem_core::crash`]'s points armed through `IDEM_CRASH`, the variable the
//! binaries read. The child applies an operation and aborts itself when the
//! store (or, for a test's own effect, the effect) reaches that point: no
//! destructor, no rollback by the child, as with a `kill -9` at that instant.
//! The parent then retries the operation the way a redelivery would. The
//! effect, counted in the database, must end up applied exactly once (or, in
//! the leased orders, repeated or lost exactly as the order promises).

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use idem_core::{
    Applied, ApplyError, Claimed, Error, LeaseStore, ManualClock, Operation, Outcome, crash,
};

use crate::harness::{Effect, Harness, counter_outcome, op};

/// Where the child finds the store ([`Harness::location`]).
const STORE: &str = "IDEM_TESTKIT_CHILD_STORE";
/// Which [`CrashCase`] the child runs.
const CASE: &str = "IDEM_TESTKIT_CHILD_CASE";
const AMOUNT: i64 = 10;
const COUNTER: &str = "crash";

/// A crash test: the path the child takes, and the crash point of
/// [`idem_core::crash`] it dies at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashCase {
    /// Atomic apply, at `apply.after-claim`: the key is held, the effect has
    /// not written yet.
    AfterClaim,
    /// Atomic apply, at `apply.inside-effect`: the effect wrote, the record
    /// and the commit have not happened.
    InsideEffect,
    /// Atomic apply, at `apply.after-commit`: committed, but the caller was
    /// never told (no ack).
    AfterCommit,
    /// Leased apply, at `apply.after-claim`: the claim is committed, the
    /// effect never runs.
    LeasedAfterClaim,
    /// Leased apply, record after the effect, at `apply.inside-effect`: the
    /// effect outside the database happened, its record did not.
    LeasedEffectBeforeRecord,
    /// At most once, record before the effect, at `apply.after-claim`: the
    /// record is committed, the effect never ran.
    LeasedRecordBeforeEffect,
}

impl CrashCase {
    /// Every case.
    pub const ALL: [CrashCase; 6] = [
        Self::AfterClaim,
        Self::InsideEffect,
        Self::AfterCommit,
        Self::LeasedAfterClaim,
        Self::LeasedEffectBeforeRecord,
        Self::LeasedRecordBeforeEffect,
    ];

    /// The case's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterClaim => "after-claim",
            Self::InsideEffect => "inside-effect",
            Self::AfterCommit => "after-commit",
            Self::LeasedAfterClaim => "leased-after-claim",
            Self::LeasedEffectBeforeRecord => "leased-effect-before-record",
            Self::LeasedRecordBeforeEffect => "leased-record-before-effect",
        }
    }

    /// The crash point (a name of [`idem_core::crash::POINTS`]) the child
    /// dies at.
    pub fn point(self) -> &'static str {
        match self {
            Self::AfterClaim | Self::LeasedAfterClaim | Self::LeasedRecordBeforeEffect => {
                crash::AFTER_CLAIM
            }
            Self::InsideEffect | Self::LeasedEffectBeforeRecord => crash::INSIDE_EFFECT,
            Self::AfterCommit => crash::AFTER_COMMIT,
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

fn crash_op() -> Operation {
    op("crash", "payment-1", "debit 10")
}

/// The child's side: does nothing unless started by [`crash_and_recover`].
/// The operation it starts never returns: the armed point aborts the process.
pub async fn child<H: Harness>() {
    let (Ok(location), Ok(case)) = (std::env::var(STORE), std::env::var(CASE)) else {
        return;
    };
    let case = CrashCase::parse(&case).expect("known crash case");
    crash::arm_from_env().expect("the parent arms a known crash point");
    let h = H::open(&location, ManualClock::starting_now()).await;
    let pay = crash_op();
    match case {
        CrashCase::LeasedAfterClaim => {
            let result = h
                .store()
                .apply_leased(
                    &pay.scope,
                    &pay.key,
                    pay.fingerprint,
                    async |_claim| -> Result<Outcome, String> {
                        h.add_outside(COUNTER, AMOUNT).await;
                        Ok(sent_outcome())
                    },
                )
                .await;
            panic!("the child should have aborted at {case:?}, got {result:?}");
        }
        CrashCase::LeasedEffectBeforeRecord => {
            let result = h
                .store()
                .apply_leased(
                    &pay.scope,
                    &pay.key,
                    pay.fingerprint,
                    async |_claim| -> Result<Outcome, String> {
                        h.add_outside(COUNTER, AMOUNT).await;
                        Ok(sent_outcome())
                    },
                )
                .await;
            panic!("the child should have aborted at {case:?}, got {result:?}");
        }
        CrashCase::LeasedRecordBeforeEffect => {
            let result = h
                .store()
                .apply_at_most_once(
                    &pay.scope,
                    &pay.key,
                    pay.fingerprint,
                    sent_outcome(),
                    async |_claim| -> Result<(), String> {
                        h.add_outside(COUNTER, AMOUNT).await;
                        Ok(())
                    },
                )
                .await;
            panic!("the child should have aborted at {case:?}, got {result:?}");
        }
        CrashCase::AfterClaim | CrashCase::InsideEffect | CrashCase::AfterCommit => {
            let result = h.apply_add(&pay, COUNTER, AMOUNT, Effect::Succeed).await;
            panic!("the child should have aborted at {case:?}, got {result:?}");
        }
    }
}

/// Starts `child` (a test binary running one ignored test) with `point`
/// armed through `IDEM_CRASH`, and waits until it aborts there: the child
/// must say on stderr that it reached the point, and die by SIGABRT. Its
/// stderr is passed on to this process's.
pub fn run_until_crash(mut child: Command, point: &str) {
    child
        .env(crash::ENV, point)
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    let mut child = child.spawn().expect("start the child process");
    let stderr = child.stderr.take().expect("piped stderr");
    let (seen_tx, seen_rx) = mpsc::channel();
    let expected = format!("crash point {point} reached");
    std::thread::spawn(move || {
        let mut seen = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            seen |= line.contains(&expected);
        }
        let _ = seen_tx.send(seen);
    });
    // The stderr reader ends when the child does.
    let seen = match seen_rx.recv_timeout(Duration::from_secs(120)) {
        Ok(seen) => seen,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child never reached {point} in 120 s");
        }
    };
    let status = child.wait().expect("reap the child");
    assert!(seen, "the child ended without reaching {point}: {status:?}");
    assert_eq!(
        status.signal(),
        Some(6),
        "the child aborted itself (SIGABRT) at {point}: {status:?}"
    );
}

/// Runs the child until it aborts at `case`'s crash point, then retries the
/// operation and checks it was applied exactly once (or, for the leased
/// orders, repeated or lost as promised). `child_test` is the full name of
/// the test that calls [`child`].
pub async fn crash_and_recover<H: Harness>(h: H, case: CrashCase, child_test: &str) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe);
    child
        .args([
            "--exact",
            child_test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STORE, h.location())
        .env(CASE, case.as_str());
    run_until_crash(child, case.point());

    let pay = crash_op();
    match case {
        CrashCase::LeasedAfterClaim => {
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
        CrashCase::LeasedEffectBeforeRecord => {
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
        CrashCase::LeasedRecordBeforeEffect => {
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
            let expected_before = if case == CrashCase::AfterCommit {
                AMOUNT
            } else {
                0
            };
            assert_eq!(h.counter(COUNTER).await, expected_before);
            let applied = retry_while_in_flight(&h, &pay).await;
            assert_eq!(applied.outcome(), &counter_outcome(AMOUNT));
            assert_eq!(applied.is_replay(), case == CrashCase::AfterCommit);
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
