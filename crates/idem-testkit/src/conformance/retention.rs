//! Conformance cases for the dedupe window: bounded sweeps, the window counted from the first claim, expired records replaced with a greater token, a stalled worker fenced past its window, tombstones.

use super::*;

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
