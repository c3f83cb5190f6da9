//! The store conformance suite: every row of the decision table in
//! [`idem_core::protocol`] and the guarantees built on it (one application per
//! key however many callers race, the stored outcome replayed, a reused key
//! refused, a stale worker fenced, retention swept in bounded steps), written
//! once and run against every store through [`Harness`]. Each case checks real data — counters updated by the effects,
//! stored records — not logs.
//!
//! Use [`conformance_suite!`](crate::conformance_suite) in a store's tests.
//! The cases are grouped: the decision table's rows and the shuffled
//! deliveries here, claims, leases and fences in `leases`, the window,
//! sweeps and tombstones in `retention`, batches and the record listing in
//! `batches`.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Applied, ApplyError, Claimed, Clock, DEFAULT_RETENTION, Error, FencingToken, IdempotencyKey,
    LeaseStore, Operation, Record, RecordFilter, RecordState, RecordStore, Scope, Timestamp,
};

use crate::harness::{Effect, Gate, Harness, RETRYABLE_FAILURE, counter_outcome, terminal_outcome};

pub use crate::harness::op;

mod batches;
mod leases;
mod retention;

pub use batches::*;
pub use leases::*;
pub use retention::*;

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
