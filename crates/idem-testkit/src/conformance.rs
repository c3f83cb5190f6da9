//! The store conformance suite: every row of the decision table in
//! [`idem_core::protocol`] and the guarantees built on it (one application per
//! key however many callers race, the stored outcome replayed, a reused key
//! refused, a stale worker fenced, retention swept in bounded steps), written
//! once and run against every store through [`Harness`]. Each case checks real data — counters updated by the effects,
//! stored records — not logs.
//!
//! Use [`conformance_suite!`](crate::conformance_suite) in a store's tests.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Applied, ApplyError, Claimed, Clock, DEFAULT_RETENTION, Error, FencingToken, IdempotencyKey,
    LeaseStore, Operation, Record, RecordFilter, RecordState, RecordStore, Scope, Timestamp,
};

use crate::harness::{Effect, Gate, Harness, RETRYABLE_FAILURE, counter_outcome, terminal_outcome};

pub use crate::harness::op;

fn lease<H>(h: &H) -> Duration {
    let _ = h;
    idem_core::DEFAULT_LEASE
}

/// Fresh key: the effect runs once; a sequential duplicate gets the stored
/// outcome, byte for byte, and runs nothing.
pub async fn fresh_key_applies_once_and_duplicates_replay<H: Harness>(h: H) {
    let pay = op("payments", "p-1", "debit 10");
    let first = h.apply_add(&pay, "acc", 10, Effect::Succeed).await.unwrap();
    assert_eq!(first, Applied::Fresh(counter_outcome(10)));
    for _ in 0..3 {
        let again = h.apply_add(&pay, "acc", 10, Effect::Succeed).await.unwrap();
        assert_eq!(again, Applied::Replayed(counter_outcome(10)));
    }
    assert_eq!(h.counter("acc").await, 10);
    let record = h.store().get(&pay.scope, &pay.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.token, FencingToken::first_at(record.created_at));
    assert_eq!(record.outcome, Some(counter_outcome(10)));
}

/// The same key in two scopes is two operations.
pub async fn scopes_are_separate<H: Harness>(h: H) {
    h.apply_add(&op("tenant-a", "k", "x"), "a", 1, Effect::Succeed)
        .await
        .unwrap();
    let other = h
        .apply_add(&op("tenant-b", "k", "x"), "b", 1, Effect::Succeed)
        .await
        .unwrap();
    assert!(!other.is_replay());
    assert_eq!((h.counter("a").await, h.counter("b").await), (1, 1));
}

/// Same key, different payload: `KeyReuse`, in every state, and nothing changes.
pub async fn key_reuse_is_refused_and_changes_nothing<H: Harness>(h: H) {
    let pay = op("payments", "p-2", "debit 10");
    h.apply_add(&pay, "acc", 10, Effect::Succeed).await.unwrap();
    let before = h.store().get(&pay.scope, &pay.key).await.unwrap();
    let reused = op("payments", "p-2", "debit 99");
    let err = h
        .apply_add(&reused, "acc", 99, Effect::Succeed)
        .await
        .unwrap_err();
    assert!(
        matches!(err.protocol(), Some(Error::KeyReuse { .. })),
        "{err:?}"
    );
    assert!(matches!(
        h.store()
            .claim(&reused.scope, &reused.key, reused.fingerprint)
            .await,
        Err(Error::KeyReuse { .. })
    ));
    assert_eq!(h.counter("acc").await, 10);
    assert_eq!(h.store().get(&pay.scope, &pay.key).await.unwrap(), before);

    let leased = op("payments", "p-3", "a");
    let Claimed::Fresh(_) = h
        .store()
        .claim(&leased.scope, &leased.key, leased.fingerprint)
        .await
        .unwrap()
    else {
        panic!("fresh key must be claimed")
    };
    let err = h
        .apply_add(&op("payments", "p-3", "b"), "acc", 1, Effect::Succeed)
        .await
        .unwrap_err();
    assert!(
        matches!(err.protocol(), Some(Error::KeyReuse { .. })),
        "{err:?}"
    );
}

/// A concurrent duplicate is answered `InFlight` while the first caller's
/// effect is still running (it cannot have waited for that caller's lock), and
/// replays once the first commits.
pub async fn concurrent_duplicate_is_answered_not_queued<H: Harness>(h: H) {
    let pay = op("payments", "p-4", "debit 5");
    let (gate, control) = Gate::new();
    let first = {
        let h2 = h.reopen().await;
        let pay = pay.clone();
        tokio::spawn(async move { h2.apply_add(&pay, "acc", 5, Effect::Gate(gate)).await })
    };
    control.entered.await.expect("effect started");
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        h.apply_add(&pay, "acc", 5, Effect::Succeed),
    )
    .await
    .expect("a concurrent duplicate must be answered while the first still runs");
    match answer {
        Err(ApplyError::Protocol(Error::InFlight { retry_after, .. })) => {
            assert!(retry_after <= Duration::from_secs(60))
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    let leased = h.store().claim(&pay.scope, &pay.key, pay.fingerprint).await;
    assert!(matches!(leased, Err(Error::InFlight { .. })), "{leased:?}");
    control.proceed.send(()).unwrap();
    assert_eq!(
        first.await.unwrap().unwrap(),
        Applied::Fresh(counter_outcome(5))
    );
    assert_eq!(
        h.apply_add(&pay, "acc", 5, Effect::Succeed).await.unwrap(),
        Applied::Replayed(counter_outcome(5))
    );
    assert_eq!(h.counter("acc").await, 5);
}

/// 64 concurrent callers with one key, each retrying until answered: the
/// effect (a row update) happens once and all callers see the same outcome.
pub async fn sixty_four_concurrent_callers_apply_once<H: Harness>(h: H) {
    let pay = op("payments", "p-64", "debit 7");
    let mut handles = Vec::with_capacity(64);
    for _ in 0..64 {
        let (h, pay) = (h.reopen().await, pay.clone());
        handles.push(tokio::spawn(async move {
            loop {
                match h.apply_add(&pay, "acc", 7, Effect::Succeed).await {
                    Ok(applied) => return applied,
                    Err(ApplyError::Protocol(Error::InFlight { .. })) => {
                        tokio::time::sleep(Duration::from_millis(2)).await
                    }
                    Err(other) => panic!("unexpected error: {other:?}"),
                }
            }
        }));
    }
    let mut fresh = 0;
    for handle in futures::future::join_all(handles).await {
        let applied = handle.unwrap();
        assert_eq!(applied.outcome(), &counter_outcome(7));
        fresh += usize::from(!applied.is_replay());
    }
    assert_eq!(fresh, 1, "exactly one caller ran the effect");
    assert_eq!(h.counter("acc").await, 7);
}

/// A retryable failure rolls back the effect and releases the key, so the next
/// retry runs at once.
pub async fn retryable_failure_rolls_back_and_releases<H: Harness>(h: H) {
    let pay = op("payments", "p-5", "debit 3");
    let err = h
        .apply_add(&pay, "acc", 3, Effect::FailRetryable)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ApplyError::Effect(e) if e == RETRYABLE_FAILURE),
        "{err:?}"
    );
    assert_eq!(h.counter("acc").await, 0, "the failed effect rolled back");
    let retry = h.apply_add(&pay, "acc", 3, Effect::Succeed).await.unwrap();
    assert_eq!(retry, Applied::Fresh(counter_outcome(3)));
    assert_eq!(h.counter("acc").await, 3);
}

/// A terminal failure is stored and replayed, and the record says failed.
pub async fn terminal_failure_is_stored_and_replayed<H: Harness>(h: H) {
    let pay = op("payments", "p-6", "debit 1000");
    let first = h
        .apply_add(&pay, "acc", 1000, Effect::FailTerminal)
        .await
        .unwrap();
    assert_eq!(first, Applied::Fresh(terminal_outcome()));
    let again = h
        .apply_add(&pay, "acc", 1000, Effect::Succeed)
        .await
        .unwrap();
    assert_eq!(again, Applied::Replayed(terminal_outcome()));
    assert_eq!(h.counter("acc").await, 0);
    let record = h.store().get(&pay.scope, &pay.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Failed);
}

/// Leased mode: claim, complete, then duplicates replay; a duplicate during
/// the claim is answered `InFlight`.
pub async fn leased_claim_complete_replay<H: crate::leased::LeasedHarness>(h: H) {
    let mail = op("emails", "welcome-1", "welcome");
    let s = h.store();
    let Claimed::Fresh(claim) = s
        .claim(&mail.scope, &mail.key, mail.fingerprint)
        .await
        .unwrap()
    else {
        panic!("fresh key must be claimed")
    };
    assert_eq!(claim.token, FencingToken::first_at(h.clock().now()));
    assert!(!claim.took_over);
    assert_eq!(claim.lease_until, h.clock().now().plus(lease(&h)));
    match s.claim(&mail.scope, &mail.key, mail.fingerprint).await {
        Err(Error::InFlight { retry_after, .. }) => assert!(retry_after <= lease(&h)),
        other => panic!("expected InFlight, got {other:?}"),
    }
    let record = s.get(&mail.scope, &mail.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::InFlight);
    s.complete(&claim, &counter_outcome(1)).await.unwrap();
    assert_eq!(
        s.claim(&mail.scope, &mail.key, mail.fingerprint)
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(counter_outcome(1))
    );
    assert!(matches!(
        s.complete(&claim, &counter_outcome(2)).await,
        Err(Error::Fenced { .. })
    ));
    let record = s.get(&mail.scope, &mail.key).await.unwrap().unwrap();
    assert_eq!(record.outcome, Some(counter_outcome(1)));
}

/// A zombie: worker A's lease ends, B takes over with token 2; A's late
/// completion and its effect are both rejected, B's are applied.
pub async fn zombie_is_fenced<H: Harness>(h: H) {
    let job = op("jobs", "j-1", "charge");
    let s = h.store();
    let Claimed::Fresh(a) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("A claims")
    };
    h.clock().advance(lease(&h) + Duration::from_millis(1));
    let Claimed::Fresh(b) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("B takes over")
    };
    assert!(b.took_over);
    assert_eq!(b.token, a.token.next());

    let late = h.complete_add(&a, "x", 1).await.unwrap_err();
    match late.protocol() {
        Some(Error::Fenced { held, current, .. }) => {
            assert_eq!(*held, a.token);
            assert!(current.is_none_or(|c| c == b.token));
            assert!(late.to_string().contains("must not retry"), "{late}");
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(matches!(
        s.complete(&a, &counter_outcome(99)).await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(s.renew(&a).await, Err(Error::Fenced { .. })));
    assert!(matches!(s.release(&a).await, Err(Error::Fenced { .. })));
    assert_eq!(
        h.counter("x").await,
        0,
        "the zombie's effect was rolled back"
    );

    assert_eq!(
        h.complete_add(&b, "x", 2).await.unwrap(),
        counter_outcome(2)
    );
    assert_eq!(h.counter("x").await, 2);
    assert_eq!(
        s.claim(&job.scope, &job.key, job.fingerprint)
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(counter_outcome(2))
    );
}

/// Atomic apply also takes over an in-flight record whose lease ended.
pub async fn atomic_apply_takes_over_an_expired_claim<H: Harness>(h: H) {
    let job = op("jobs", "j-2", "charge");
    let Claimed::Fresh(dead) = h
        .store()
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let err = h
        .apply_add(&job, "y", 1, Effect::Succeed)
        .await
        .unwrap_err();
    assert!(
        matches!(err.protocol(), Some(Error::InFlight { .. })),
        "{err:?}"
    );
    h.clock().advance(lease(&h));
    assert!(
        h.apply_add(&job, "y", 1, Effect::Succeed).await.unwrap()
            == Applied::Fresh(counter_outcome(1))
    );
    let record = h.store().get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.token, dead.token.next());
    assert!(h.complete_add(&dead, "y", 1).await.is_err());
    assert_eq!(h.counter("y").await, 1);
}

/// Renewal keeps a long effect's claim; the lease then ends from the renewal.
pub async fn renewal_extends_the_lease<H: crate::leased::LeasedHarness>(h: H) {
    let job = op("jobs", "long", "report");
    let s = h.store();
    let Claimed::Fresh(claim) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    h.clock().advance(lease(&h) - Duration::from_secs(1));
    let renewed = s.renew(&claim).await.unwrap();
    assert_eq!(renewed.token, claim.token);
    assert_eq!(renewed.lease_until, h.clock().now().plus(lease(&h)));
    h.clock().advance(Duration::from_secs(2));
    assert!(matches!(
        s.claim(&job.scope, &job.key, job.fingerprint).await,
        Err(Error::InFlight { .. })
    ));
    h.clock().advance(lease(&h));
    let Claimed::Fresh(next) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("taken over after the renewed lease ended")
    };
    assert_eq!(next.token, claim.token.next());
}

/// An ended lease keeps the key reserved but lets the next claim take it
/// over at once (`took_over`, the next token), and fences the old holder.
pub async fn an_ended_lease_is_taken_over_at_once<H: crate::leased::LeasedHarness>(h: H) {
    let job = op("jobs", "ambiguous", "charge");
    let s = h.store();
    let Claimed::Fresh(first) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    assert!(!first.took_over);
    s.end_lease(&first).await.unwrap();
    let record = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::InFlight);
    let Claimed::Fresh(next) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("taken over at once")
    };
    assert!(next.took_over, "the next claim is a takeover");
    assert_eq!(next.token, first.token.next());
    assert!(matches!(
        s.complete(&first, &idem_core::Outcome::success("late"))
            .await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(
        s.end_lease(&first).await,
        Err(Error::Fenced { .. })
    ));
    s.complete(&next, &idem_core::Outcome::success("done"))
        .await
        .unwrap();
    let Claimed::Replayed(replay) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("replayed")
    };
    assert_eq!(replay.outcome.body, b"done");
}

/// Release gives the key back at once; the next claim has a greater token, so
/// the released token can never complete.
pub async fn release_lets_the_next_retry_run_at_once<H: crate::leased::LeasedHarness>(h: H) {
    let job = op("jobs", "j-3", "x");
    let s = h.store();
    let Claimed::Fresh(first) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    s.release(&first).await.unwrap();
    let Claimed::Fresh(second) = s
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("claimed again at once")
    };
    assert_eq!(second.token, first.token.next());
    assert!(
        !second.took_over,
        "a released key is claimed, not taken over"
    );
    assert!(matches!(
        s.complete(&first, &counter_outcome(0)).await,
        Err(Error::Fenced { .. })
    ));
    s.complete(&second, &counter_outcome(1)).await.unwrap();
}

/// Retention: a record replays until the window ends; then it counts as
/// expired, a sweep removes it in bounded batches, and the key is new again.
pub async fn retention_is_enforced_by_bounded_sweeps<H: Harness>(h: H) {
    let retention = idem_core::DEFAULT_RETENTION;
    for i in 0..25 {
        h.apply_add(
            &op("bulk", &format!("k{i}"), "x"),
            "bulk",
            1,
            Effect::Succeed,
        )
        .await
        .unwrap();
    }
    let pay = op("payments", "p-7", "debit 1");
    h.apply_add(&pay, "acc", 1, Effect::Succeed).await.unwrap();
    h.clock().advance(retention - Duration::from_millis(1));
    assert!(
        h.apply_add(&pay, "acc", 1, Effect::Succeed)
            .await
            .unwrap()
            .is_replay()
    );
    assert_eq!(h.store().count().await.unwrap().expired, 0);
    assert_eq!(h.store().sweep(10).await.unwrap(), 0);

    h.clock().advance(Duration::from_millis(1));
    let count = h.store().count().await.unwrap();
    assert_eq!((count.total, count.expired), (26, 26));
    assert_eq!(h.store().sweep_batch(10).await.unwrap(), 10);
    assert_eq!(h.store().sweep(10).await.unwrap(), 16);
    assert_eq!(h.store().count().await.unwrap().total, 0);

    let again = h
        .apply_add(
            &op("payments", "p-7", "a different payload"),
            "acc",
            1,
            Effect::Succeed,
        )
        .await
        .unwrap();
    assert_eq!(again, Applied::Fresh(counter_outcome(2)));
}

/// Retention runs itself: under a steady stream of new keys, with the clock
/// moving a twentieth of the retention per tick, a spawned [`idem::Sweeper`]
/// keeps the table near the twenty ticks' worth the window holds (without it
/// the table would hold every key ever applied), its gauges say how old the
/// oldest record is, and once the load stops and the window passes the table
/// empties.
pub async fn the_sweeper_keeps_the_table_bounded_under_steady_load<H: Harness>(h: H) {
    let retention = h.store().settings().retention;
    let step = retention / 20;
    let (ticks, per_tick): (i64, i64) = (100, 10);
    let sweeper = idem::Sweeper::new(h.store().clone())
        .interval(Duration::from_millis(10))
        .batch(7)
        .spawn();
    let mut most = 0;
    for tick in 0..ticks {
        for i in 0..per_tick {
            let key = format!("t{tick}-{i}");
            h.apply_add(&op("steady", &key, "x"), "steady", 1, Effect::Succeed)
                .await
                .unwrap();
        }
        h.clock().advance(step);
        tokio::time::sleep(Duration::from_millis(20)).await;
        most = most.max(h.store().count().await.unwrap().total);
    }
    assert_eq!(h.counter("steady").await, ticks * per_tick);
    assert!(
        most <= 20 * per_tick as u64 + 8 * per_tick as u64,
        "the table held {most} records; the window holds {}",
        20 * per_tick
    );

    let glance = idem::Sweeper::new(h.store().clone())
        .pass()
        .await
        .unwrap()
        .glance;
    let oldest = glance.oldest_age.expect("records in the window");
    assert!(
        oldest <= retention + step,
        "the oldest record is {oldest:?} old, past the {retention:?} window"
    );

    h.clock().advance(retention);
    let mut left = u64::MAX;
    for _ in 0..500 {
        left = h.store().count().await.unwrap().total;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        left, 0,
        "the sweeper empties the table once the window passes"
    );
    sweeper.stop().await;
    let empty = h.store().glance().await.unwrap();
    assert_eq!((empty.records, empty.oldest_age), (0, None));
}

/// The record of `op`, which must exist.
async fn record_of<H: Harness>(h: &H, op: &Operation) -> Record {
    h.store()
        .get(&op.scope, &op.key)
        .await
        .unwrap()
        .expect("a stored record")
}

/// Asserts that `record`'s dedupe window opened at `first_claim`.
fn assert_window(record: &Record, first_claim: Timestamp) {
    assert_eq!(
        (record.created_at, record.expires_at),
        (first_claim, first_claim.plus(DEFAULT_RETENTION)),
        "the window of {}/{} counts from its first claim",
        record.scope,
        record.key
    );
}

/// The dedupe window counts from a key's first claim: `created_at` is that
/// moment and `expires_at` is `created_at + retention`, whether the key was
/// applied atomically, in a batch or leased, and however many replays,
/// takeovers, releases, renewals and completions follow. Only a record past
/// retention starts a new window.
pub async fn the_window_counts_from_the_first_claim<H: Harness>(h: H) {
    let step = Duration::from_secs(10);

    let pay = op("window", "atomic", "debit 1");
    let t0 = h.clock().now();
    h.apply_add(&pay, "w", 1, Effect::Succeed).await.unwrap();
    let applied = record_of(&h, &pay).await;
    assert_window(&applied, t0);
    assert_eq!(applied.updated_at, t0);
    h.clock().advance(step);
    assert!(
        h.apply_add(&pay, "w", 1, Effect::Succeed)
            .await
            .unwrap()
            .is_replay()
    );
    assert_eq!(
        record_of(&h, &pay).await,
        applied,
        "a replay writes nothing"
    );

    let batched = op("window", "batch", "x");
    let t1 = h.clock().now();
    let answers = h
        .apply_batch_add(std::slice::from_ref(&batched), &[("w".to_owned(), 1)])
        .await
        .unwrap();
    assert!(matches!(answers[..], [Ok(Applied::Fresh(_))]));
    assert_window(&record_of(&h, &batched).await, t1);

    let job = op("window", "leased", "charge");
    let t2 = h.clock().now();
    let Claimed::Fresh(first) = h
        .store()
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };
    assert_window(&record_of(&h, &job).await, t2);
    h.clock().advance(step);
    let renewed = h.store().renew(&first).await.unwrap();
    assert_window(&record_of(&h, &job).await, t2);
    h.clock().advance(lease(&h) + step);
    let Claimed::Fresh(second) = h
        .store()
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("an ended lease is taken over")
    };
    assert!(second.took_over && second.token > renewed.token);
    assert_window(&record_of(&h, &job).await, t2);
    h.store().release(&second).await.unwrap();
    h.clock().advance(step);
    let Claimed::Fresh(third) = h
        .store()
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap()
    else {
        panic!("a released key is claimed again")
    };
    assert_window(&record_of(&h, &job).await, t2);
    h.clock().advance(step);
    let t3 = h.clock().now();
    h.complete_add(&third, "w", 1).await.unwrap();
    let completed = record_of(&h, &job).await;
    assert_window(&completed, t2);
    assert_eq!(
        (completed.state, completed.updated_at),
        (RecordState::Completed, t3)
    );

    let stalled = op("window", "atomic-takeover", "debit 2");
    let t4 = h.clock().now();
    let Claimed::Fresh(_) = h
        .store()
        .claim(&stalled.scope, &stalled.key, stalled.fingerprint)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    h.clock().advance(lease(&h));
    assert!(
        !h.apply_add(&stalled, "w", 1, Effect::Succeed)
            .await
            .unwrap()
            .is_replay()
    );
    assert_window(&record_of(&h, &stalled).await, t4);

    h.clock().advance(DEFAULT_RETENTION);
    let t5 = h.clock().now();
    assert!(
        !h.apply_add(&pay, "w", 1, Effect::Succeed)
            .await
            .unwrap()
            .is_replay()
    );
    assert_window(&record_of(&h, &pay).await, t5);
}

/// A record past retention that was not swept yet is replaced as a new
/// operation, and its token keeps growing.
pub async fn expired_records_are_replaced_with_a_greater_token<H: Harness>(h: H) {
    let pay = op("payments", "p-8", "v1");
    h.apply_add(&pay, "acc", 1, Effect::Succeed).await.unwrap();
    let old = h.store().get(&pay.scope, &pay.key).await.unwrap().unwrap();
    h.clock().advance(idem_core::DEFAULT_RETENTION);
    let fresh = op("payments", "p-8", "v2");
    assert!(
        !h.apply_add(&fresh, "acc", 1, Effect::Succeed)
            .await
            .unwrap()
            .is_replay()
    );
    let record = h.store().get(&pay.scope, &pay.key).await.unwrap().unwrap();
    assert!(record.token > old.token);
    assert_eq!(record.token, FencingToken::first_at(record.created_at));
    assert_eq!(record.fingerprint, fresh.fingerprint);
}

/// A worker that stalls past its key's whole window, while the sweeper
/// deletes the record and another worker claims the key anew, stays fenced:
/// the new window's tokens start above every token of the old one.
pub async fn a_worker_stalled_past_a_swept_window_stays_fenced<H: crate::leased::LeasedHarness>(
    h: H,
) {
    let pay = op("payments", "p-swept", "v1");
    let s = h.store();
    let Claimed::Fresh(stalled) = s
        .claim(&pay.scope, &pay.key, pay.fingerprint)
        .await
        .unwrap()
    else {
        panic!("fresh key must be claimed")
    };
    h.clock().advance(idem_core::DEFAULT_RETENTION);
    assert_eq!(s.sweep(100).await.unwrap(), 1);
    assert!(s.get(&pay.scope, &pay.key).await.unwrap().is_none());
    let Claimed::Fresh(anew) = s
        .claim(&pay.scope, &pay.key, pay.fingerprint)
        .await
        .unwrap()
    else {
        panic!("a swept key is claimed anew")
    };
    assert!(anew.token > stalled.token);
    assert!(matches!(
        s.complete(&stalled, &idem_core::Outcome::success("late"))
            .await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(s.renew(&stalled).await, Err(Error::Fenced { .. })));
    s.complete(&anew, &idem_core::Outcome::success("on time"))
        .await
        .unwrap();
    let record = s.get(&pay.scope, &pay.key).await.unwrap().unwrap();
    assert_eq!(record.outcome, Some(idem_core::Outcome::success("on time")));
}

/// With tombstones kept, a late apply — past its window, whether the record
/// is still there or swept to a tombstone — is refused as `Expired` and its
/// effect does not run, alone or in a batch; another payload is key reuse;
/// after the grace period the key is new again with a greater token.
pub async fn late_applies_meet_the_tombstone_until_the_grace_ends<H: Harness>(h: H) {
    let retention = idem_core::DEFAULT_RETENTION;
    let grace = Duration::from_secs(3600);
    let h = h.with_tombstones(grace).await;
    let pay = op("payments", "late-1", "debit 1");
    h.apply_add(&pay, "late", 1, Effect::Succeed).await.unwrap();
    let first_token = h
        .store()
        .get(&pay.scope, &pay.key)
        .await
        .unwrap()
        .unwrap()
        .token;
    h.clock().advance(retention);
    let refused_late = |answer: Result<Applied, ApplyError<String>>| {
        assert!(
            matches!(answer, Err(ApplyError::Protocol(Error::Expired { .. }))),
            "{answer:?}"
        );
    };
    // Not swept yet: the record refuses.
    refused_late(h.apply_add(&pay, "late", 1, Effect::Succeed).await);
    // Swept: the tombstone refuses, alone and in a batch.
    assert_eq!(h.store().sweep(10).await.unwrap(), 1);
    assert_eq!(h.store().count().await.unwrap().total, 0);
    refused_late(h.apply_add(&pay, "late", 1, Effect::Succeed).await);
    let other = op("payments", "late-1", "debit 2");
    assert!(matches!(
        h.apply_add(&other, "late", 1, Effect::Succeed).await,
        Err(ApplyError::Protocol(Error::KeyReuse { .. }))
    ));
    let batch = vec![pay.clone(), op("payments", "new-1", "debit 1")];
    let adds = vec![("late".to_owned(), 1), ("late".to_owned(), 10)];
    let answers = h.apply_batch_add(&batch, &adds).await.unwrap();
    assert!(
        matches!(answers[0], Err(Error::Expired { .. })),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Ok(Applied::Fresh(_))),
        "{:?}",
        answers[1]
    );
    assert_eq!(h.counter("late").await, 11, "no late apply ran");

    // After the grace period the key is new again, and its tombstone swept.
    h.clock().advance(grace);
    assert!(h.store().sweep(10).await.unwrap() >= 1);
    assert!(matches!(
        h.apply_add(&pay, "late", 1, Effect::Succeed).await,
        Ok(Applied::Fresh(_))
    ));
    let token = h
        .store()
        .get(&pay.scope, &pay.key)
        .await
        .unwrap()
        .unwrap()
        .token;
    assert!(token > first_token);
    assert_eq!(h.counter("late").await, 12);
}

/// Batch apply: new keys run once, known keys replay, keys repeated inside the
/// batch replay the first, reused keys are refused; one effect failure rolls
/// back the whole batch.
pub async fn batch_apply_dedupes_and_commits_once<H: Harness>(h: H) {
    h.apply_add(&op("b", "known", "x"), "c", 100, Effect::Succeed)
        .await
        .unwrap();
    let ops = vec![
        op("b", "n1", "x"),
        op("b", "known", "x"),
        op("b", "n2", "x"),
        op("b", "n1", "x"),
        op("b", "known", "other payload"),
        op("b", "n3", "x"),
    ];
    let adds: Vec<(String, i64)> = [1, 1000, 2, 1000, 1000, 4]
        .iter()
        .map(|&a| ("c".to_owned(), a))
        .collect();
    let answers = h.apply_batch_add(&ops, &adds).await.unwrap();
    assert_eq!(answers.len(), ops.len());
    assert_eq!(
        answers[0].as_ref().unwrap(),
        &Applied::Fresh(counter_outcome(101))
    );
    assert_eq!(
        answers[1].as_ref().unwrap(),
        &Applied::Replayed(counter_outcome(100))
    );
    assert_eq!(
        answers[2].as_ref().unwrap(),
        &Applied::Fresh(counter_outcome(103))
    );
    assert_eq!(
        answers[3].as_ref().unwrap(),
        &Applied::Replayed(counter_outcome(101))
    );
    assert!(matches!(answers[4], Err(Error::KeyReuse { .. })));
    assert_eq!(
        answers[5].as_ref().unwrap(),
        &Applied::Fresh(counter_outcome(107))
    );
    assert_eq!(h.counter("c").await, 107);

    let again = h.apply_batch_add(&ops[..3], &adds[..3]).await.unwrap();
    assert!(again.iter().all(|a| a.as_ref().unwrap().is_replay()));

    let failing = vec![op("b", "f1", "x"), op("b", "f2", "x")];
    let failing_adds = vec![("c".to_owned(), 5), ("c".to_owned(), i64::MIN)];
    match h.apply_batch_add(&failing, &failing_adds).await {
        Err(ApplyError::Effect((1, _))) => {}
        other => panic!("expected the second effect's failure, got {other:?}"),
    }
    assert_eq!(h.counter("c").await, 107, "the whole batch rolled back");
    assert!(
        h.store()
            .get(&failing[0].scope, &failing[0].key)
            .await
            .unwrap()
            .is_none()
    );
}

/// Set apply: one effect for all new operations of a batch, given their
/// indexes; known keys replay, keys repeated inside the batch replay the
/// first, reused keys are refused; an effect failure, or an effect that
/// answers the wrong number of outcomes, rolls back the whole batch.
pub async fn set_apply_runs_one_effect_for_the_new_operations<H: Harness>(h: H) {
    h.apply_add(&op("s", "known", "x"), "c", 100, Effect::Succeed)
        .await
        .unwrap();
    let ops = vec![
        op("s", "n1", "x"),
        op("s", "known", "x"),
        op("s", "n2", "x"),
        op("s", "n1", "x"),
        op("s", "known", "other payload"),
        op("s", "n3", "x"),
        op("s", "n2", "other payload"),
    ];
    let adds: Vec<(String, i64)> = [1, 1000, 2, 1000, 1000, 4, 1000]
        .iter()
        .map(|&a| ("c".to_owned(), a))
        .collect();
    let given = Arc::new(std::sync::Mutex::new(Vec::new()));
    let answers = h
        .apply_set_add(&ops, &adds, Arc::clone(&given))
        .await
        .unwrap();
    assert_eq!(*given.lock().unwrap(), vec![0, 2, 5], "the new operations");
    let fresh = |v| Applied::Fresh(counter_outcome(v));
    let replayed = |v| Applied::Replayed(counter_outcome(v));
    assert_eq!(answers.len(), ops.len());
    assert_eq!(answers[0].as_ref().unwrap(), &fresh(101));
    assert_eq!(answers[1].as_ref().unwrap(), &replayed(100));
    assert_eq!(answers[2].as_ref().unwrap(), &fresh(103));
    assert_eq!(answers[3].as_ref().unwrap(), &replayed(101));
    assert!(matches!(answers[4], Err(Error::KeyReuse { .. })));
    assert_eq!(answers[5].as_ref().unwrap(), &fresh(107));
    assert!(matches!(answers[6], Err(Error::KeyReuse { .. })));
    assert_eq!(h.counter("c").await, 107);

    // Nothing new: the effect is not called.
    let given = Arc::new(std::sync::Mutex::new(vec![usize::MAX]));
    let again = h
        .apply_set_add(&ops[..3], &adds[..3], Arc::clone(&given))
        .await
        .unwrap();
    assert!(again.iter().all(|a| a.as_ref().unwrap().is_replay()));
    assert_eq!(*given.lock().unwrap(), vec![usize::MAX], "not called");

    let failing = vec![op("s", "f1", "x"), op("s", "f2", "x")];
    let failing_adds = vec![("c".to_owned(), 5), ("c".to_owned(), i64::MIN)];
    let given = Arc::new(std::sync::Mutex::new(Vec::new()));
    match h.apply_set_add(&failing, &failing_adds, given).await {
        Err(ApplyError::Effect(_)) => {}
        other => panic!("expected the effect's failure, got {other:?}"),
    }
    assert_eq!(h.counter("c").await, 107, "the whole batch rolled back");
    assert!(
        h.store()
            .get(&failing[0].scope, &failing[0].key)
            .await
            .unwrap()
            .is_none()
    );

    // One outcome short: rolled back, then the call panics.
    let short_adds = vec![("c".to_owned(), 5), ("c".to_owned(), i64::MAX)];
    let given = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = h.reopen().await;
    let short = {
        let failing = failing.clone();
        tokio::spawn(async move { store.apply_set_add(&failing, &short_adds, given).await })
    };
    let panicked = short.await.expect_err("a short answer panics");
    assert!(panicked.is_panic());
    assert_eq!(h.counter("c").await, 107, "rolled back before the panic");
    // The keys are free again.
    let answers = h
        .apply_set_add(
            &failing,
            &[("c".to_owned(), 5), ("c".to_owned(), 6)],
            Arc::default(),
        )
        .await
        .unwrap();
    assert!(answers.iter().all(|a| !a.as_ref().unwrap().is_replay()));
    assert_eq!(h.counter("c").await, 118);
}

/// A batch does not wait for a key another caller is applying: that operation
/// is answered `InFlight` while the other caller's effect is still running.
/// (On SQLite, operations on other keys need the single writer and so run after
/// that caller's transaction; on PostgreSQL they go ahead at once.)
pub async fn batch_answers_a_busy_key_in_flight<H: Harness>(h: H) {
    let busy = op("b", "busy", "x");
    let (gate, control) = Gate::new();
    let first = {
        let h2 = h.reopen().await;
        let busy = busy.clone();
        tokio::spawn(async move { h2.apply_add(&busy, "d", 1, Effect::Gate(gate)).await })
    };
    control.entered.await.unwrap();
    let ops = vec![busy.clone(), busy.clone()];
    let adds = vec![("d".to_owned(), 1), ("d".to_owned(), 1)];
    let answers = tokio::time::timeout(Duration::from_secs(20), h.apply_batch_add(&ops, &adds))
        .await
        .expect("the batch must not wait for the busy key")
        .unwrap();
    for answer in &answers {
        assert!(matches!(answer, Err(Error::InFlight { .. })), "{answer:?}");
    }
    control.proceed.send(()).unwrap();
    first.await.unwrap().unwrap();
    let ops = vec![busy, op("b", "free", "x")];
    let adds = vec![("d".to_owned(), 1), ("e".to_owned(), 1)];
    let answers = h.apply_batch_add(&ops, &adds).await.unwrap();
    assert!(answers[0].as_ref().unwrap().is_replay());
    assert!(!answers[1].as_ref().unwrap().is_replay());
    assert_eq!((h.counter("d").await, h.counter("e").await), (1, 1));
}

/// Inspection: list filters by scope and state; records carry their token,
/// lease and timestamps.
pub async fn records_can_be_listed_and_shown<H: Harness>(h: H) {
    h.apply_add(&op("s1", "a", "x"), "z", 1, Effect::Succeed)
        .await
        .unwrap();
    h.apply_add(&op("s2", "b", "x"), "z", 1, Effect::Succeed)
        .await
        .unwrap();
    let leased = op("s2", "c", "x");
    h.store()
        .claim(&leased.scope, &leased.key, leased.fingerprint)
        .await
        .unwrap();
    let all = h.store().list(&RecordFilter::default()).await.unwrap();
    assert_eq!(all.len(), 3);
    let s2 = h
        .store()
        .list(&RecordFilter {
            scope: Some(Scope::new("s2").unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(s2.len(), 2);
    let in_flight = h
        .store()
        .list(&RecordFilter {
            state: Some(RecordState::InFlight),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].key.as_str(), "c");
    assert!(in_flight[0].lease_until.is_some());
    let limited = h
        .store()
        .list(&RecordFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);
    assert!(
        h.store()
            .get(
                &Scope::new("s1").unwrap(),
                &IdempotencyKey::new("nope").unwrap()
            )
            .await
            .unwrap()
            .is_none()
    );
}

/// Property: a random multiset of operations, and the same multiset with each
/// element delivered 1–3 times in shuffled order, reach the same final state.
/// Runs proptest with its own runtime; each case uses its own counters.
pub fn duplicated_and_shuffled_deliveries_reach_the_same_state<H: Harness>() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let Some(h) = runtime.block_on(H::fresh()) else {
        return;
    };
    let h = Arc::new(h);
    let case = std::sync::atomic::AtomicUsize::new(0);
    let operations = proptest::collection::vec((0usize..4, 1i64..100), 1..12);
    let strategy = operations.prop_flat_map(|ops| {
        let indexed: Vec<(usize, usize, i64)> = ops
            .into_iter()
            .enumerate()
            .map(|(i, (account, amount))| (i, account, amount))
            .collect();
        (
            Just(indexed.clone()),
            crate::deliveries::redelivered(indexed),
        )
    });
    let mut runner = TestRunner::new(Config::with_cases(24));
    runner
        .run(&strategy, |(once, redelivered)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let h = Arc::clone(&h);
            runtime.block_on(async move {
                for (run, deliveries) in [("once", &once), ("dup", &redelivered)] {
                    for (i, account, amount) in deliveries {
                        let operation = op(
                            &format!("prop-{n}-{run}"),
                            &format!("op-{i}"),
                            &amount.to_string(),
                        );
                        h.apply_add(
                            &operation,
                            &format!("{n}-{run}-{account}"),
                            *amount,
                            Effect::Succeed,
                        )
                        .await
                        .expect("apply");
                    }
                }
                for account in 0..4 {
                    let single = h.counter(&format!("{n}-once-{account}")).await;
                    let duplicated = h.counter(&format!("{n}-dup-{account}")).await;
                    prop_assert_eq!(single, duplicated, "account {} diverged", account);
                }
                Ok(())
            })
        })
        .unwrap();
}
