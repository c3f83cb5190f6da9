//! The conformance rows of leased mode alone, for stores that offer no atomic
//! mode (the effect is not in their database, as on Redis): every row of the
//! decision table reached through [`LeaseStore`], and the guarantees built on
//! it (one winner however many callers race, the stored outcome replayed, a
//! stale worker fenced, tokens that grow across windows, retention swept).
//!
//! A store implements [`LeasedHarness`]; every [`Harness`](crate::Harness)
//! already does, so the atomic stores run these rows too and the answers of
//! every store are checked against the same cases. The effects count their
//! runs in process memory, as an effect outside the store would.
//!
//! Use [`leased_conformance_suite!`](crate::leased_conformance_suite) in a store's tests.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{
    Applied, ApplyError, Claimed, Clock, DEFAULT_LEASE, DEFAULT_RETENTION, Error, FencingToken,
    IdempotencyKey, LeaseStore, ManualClock, Outcome, RecordCursor, RecordFilter, RecordState,
    RecordStore, Scope,
};

use crate::harness::{Gate, op, terminal_outcome};

/// One leased store under test, with a manual clock.
pub trait LeasedHarness: Sized + Send + Sync + 'static {
    /// The store.
    type Store: LeaseStore + RecordStore + Clone + 'static;

    /// A store on fresh, empty storage with a [`ManualClock`], or `None`
    /// (after printing why) when the server is not reachable and services
    /// are not required.
    fn fresh() -> impl Future<Output = Option<Self>> + Send;

    /// Another handle on the same storage, sharing the clock.
    fn reopen(&self) -> impl Future<Output = Self> + Send;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// The clock the store reads.
    fn clock(&self) -> &ManualClock;
}

impl<H: crate::Harness> LeasedHarness for H {
    type Store = <H as crate::Harness>::Store;

    fn fresh() -> impl Future<Output = Option<Self>> + Send {
        <H as crate::Harness>::fresh()
    }

    fn reopen(&self) -> impl Future<Output = Self> + Send {
        <H as crate::Harness>::reopen(self)
    }

    fn store(&self) -> &Self::Store {
        <H as crate::Harness>::store(self)
    }

    fn clock(&self) -> &ManualClock {
        <H as crate::Harness>::clock(self)
    }
}

/// The outcome of the counting effect: how many times it ran, so far.
fn runs_outcome(runs: u64) -> Outcome {
    Outcome::success(runs.to_string()).with_meta("effect", "count")
}

/// An effect outside the store: counts its runs.
async fn count_run(runs: &AtomicU64) -> Result<Outcome, String> {
    let now = runs.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(runs_outcome(now))
}

async fn claimed<H: LeasedHarness>(h: &H, op: &idem_core::Operation) -> idem_core::Claim {
    match h.store().claim(&op.scope, &op.key, op.fingerprint).await {
        Ok(Claimed::Fresh(claim)) => claim,
        other => panic!("{}/{} must be claimed, got {other:?}", op.scope, op.key),
    }
}

/// Fresh key: the effect runs once; a sequential duplicate gets the stored
/// outcome, byte for byte, and runs nothing. The first token of a key is the
/// first token of a window opening at its first claim.
pub async fn fresh_key_runs_once_and_duplicates_replay<H: LeasedHarness>(h: H) {
    let mail = op("emails", "m-1", "welcome");
    let runs = AtomicU64::new(0);
    let first = h
        .store()
        .apply_leased(&mail.scope, &mail.key, mail.fingerprint, |_| {
            count_run(&runs)
        })
        .await
        .unwrap();
    assert_eq!(first, Applied::Fresh(runs_outcome(1)));
    for _ in 0..3 {
        let again = h
            .store()
            .apply_leased(&mail.scope, &mail.key, mail.fingerprint, |_| {
                count_run(&runs)
            })
            .await
            .unwrap();
        assert_eq!(again, Applied::Replayed(runs_outcome(1)));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = h
        .store()
        .get(&mail.scope, &mail.key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.token, FencingToken::first_at(record.created_at));
    assert_eq!(record.outcome, Some(runs_outcome(1)));
    assert_eq!(record.lease_until, None);
}

/// The same key in two scopes is two operations.
pub async fn scopes_are_separate_leased<H: LeasedHarness>(h: H) {
    let a = claimed(&h, &op("tenant-a", "k", "x")).await;
    let b = claimed(&h, &op("tenant-b", "k", "x")).await;
    h.store()
        .complete(&a, &Outcome::success("a"))
        .await
        .unwrap();
    h.store()
        .complete(&b, &Outcome::success("b"))
        .await
        .unwrap();
    let again = h
        .store()
        .claim(&a.scope, &a.key, op("tenant-a", "k", "x").fingerprint)
        .await
        .unwrap();
    assert_eq!(again.replayed(), Some(&Outcome::success("a")));
}

/// Same key, different payload: `KeyReuse` whether the record is in flight,
/// released, completed or failed, and the record does not change.
pub async fn key_reuse_is_refused_in_every_state<H: LeasedHarness>(h: H) {
    let s = h.store();
    let in_flight = op("reuse", "in-flight", "a");
    claimed(&h, &in_flight).await;
    let released = op("reuse", "released", "a");
    let claim = claimed(&h, &released).await;
    s.release(&claim).await.unwrap();
    let completed = op("reuse", "completed", "a");
    let claim = claimed(&h, &completed).await;
    s.complete(&claim, &Outcome::success("ok")).await.unwrap();
    let failed = op("reuse", "failed", "a");
    let claim = claimed(&h, &failed).await;
    s.complete(&claim, &terminal_outcome()).await.unwrap();

    for op in [&in_flight, &released, &completed, &failed] {
        let before = s.get(&op.scope, &op.key).await.unwrap();
        let other = crate::harness::op(op.scope.as_str(), op.key.as_str(), "b");
        match s.claim(&other.scope, &other.key, other.fingerprint).await {
            Err(Error::KeyReuse { scope, key }) => {
                assert_eq!((scope, key), (op.scope.clone(), op.key.clone()))
            }
            answer => panic!("{}: expected KeyReuse, got {answer:?}", op.key),
        }
        assert_eq!(s.get(&op.scope, &op.key).await.unwrap(), before);
    }
}

/// A concurrent duplicate is answered `InFlight` while the first caller's
/// effect still runs, with a retry-after no longer than the setting's, and
/// replays once the first completes.
pub async fn concurrent_duplicate_is_answered_in_flight<H: LeasedHarness>(h: H) {
    let job = op("jobs", "gated", "x");
    let (gate, control) = Gate::new();
    let runs = Arc::new(AtomicU64::new(0));
    let first = {
        let (h2, job, runs) = (h.reopen().await, job.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            h2.store()
                .apply_leased(&job.scope, &job.key, job.fingerprint, |_| async move {
                    let _ = gate.enter().await;
                    count_run(&runs).await
                })
                .await
        })
    };
    control.entered.await.expect("effect started");
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        h.store().claim(&job.scope, &job.key, job.fingerprint),
    )
    .await
    .expect("a concurrent duplicate must be answered while the first still runs");
    match answer {
        Err(Error::InFlight { retry_after, .. }) => {
            assert!(retry_after > Duration::ZERO);
            assert!(retry_after <= h.store().settings().in_flight_retry_after);
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    control.proceed.send(()).unwrap();
    assert_eq!(
        first.await.unwrap().unwrap(),
        Applied::Fresh(runs_outcome(1))
    );
    assert_eq!(
        h.store()
            .claim(&job.scope, &job.key, job.fingerprint)
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(runs_outcome(1))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// 64 concurrent callers with one key, each retrying while it is in flight:
/// exactly one claim is fresh, the effect runs once, and every caller gets its
/// outcome.
pub async fn sixty_four_concurrent_claims_have_one_winner<H: LeasedHarness>(h: H) {
    let job = op("jobs", "race", "x");
    let runs = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::with_capacity(64);
    for _ in 0..64 {
        let (h, job, runs) = (h.reopen().await, job.clone(), Arc::clone(&runs));
        handles.push(tokio::spawn(async move {
            loop {
                let effect = |_| async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    count_run(&runs).await
                };
                match h
                    .store()
                    .apply_leased(&job.scope, &job.key, job.fingerprint, effect)
                    .await
                {
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
        assert_eq!(applied.outcome(), &runs_outcome(1));
        fresh += usize::from(!applied.is_replay());
    }
    assert_eq!(fresh, 1, "exactly one caller's claim was fresh");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");
    let record = h.store().get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.token, FencingToken::first_at(record.created_at));
}

/// A retryable failure releases the key, so the next retry runs at once with
/// the next token; the released token is fenced.
pub async fn retryable_failure_releases_the_key<H: LeasedHarness>(h: H) {
    let job = op("jobs", "flaky", "x");
    let s = h.store();
    let mut held = None;
    let err = s
        .apply_leased(&job.scope, &job.key, job.fingerprint, |claim| {
            held = Some(claim);
            async { Err::<Outcome, _>("upstream unavailable") }
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ApplyError::Effect("upstream unavailable")));
    let first = held.expect("the effect saw its claim");
    let record = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.lease_until),
        (RecordState::InFlight, None)
    );
    let second = claimed(&h, &job).await;
    assert_eq!(second.token, first.token.next());
    assert!(!second.took_over);
    assert!(matches!(
        s.complete(&first, &Outcome::success("late")).await,
        Err(Error::Fenced { .. })
    ));
    s.complete(&second, &Outcome::success("done"))
        .await
        .unwrap();
}

/// A terminal failure is stored and replayed, and the record says failed.
pub async fn terminal_failure_is_stored_and_replayed_leased<H: LeasedHarness>(h: H) {
    let job = op("jobs", "declined", "x");
    let s = h.store();
    let first = s
        .apply_leased(&job.scope, &job.key, job.fingerprint, |_| async {
            Ok::<_, String>(terminal_outcome())
        })
        .await
        .unwrap();
    assert_eq!(first, Applied::Fresh(terminal_outcome()));
    let again = s
        .apply_leased(&job.scope, &job.key, job.fingerprint, |_| async {
            Ok::<_, String>(Outcome::success("must not run"))
        })
        .await
        .unwrap();
    assert_eq!(again, Applied::Replayed(terminal_outcome()));
    let record = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Failed);
}

/// A zombie: A's lease ends, B takes over with the next token; A's
/// completion, renewal and release are fenced naming B's token, and B's
/// completion is the one replayed.
pub async fn takeover_fences_the_zombie<H: LeasedHarness>(h: H) {
    let job = op("jobs", "zombie", "charge");
    let s = h.store();
    let a = claimed(&h, &job).await;
    h.clock()
        .advance(s.settings().lease + Duration::from_millis(1));
    let b = claimed(&h, &job).await;
    assert!(b.took_over);
    assert_eq!(b.token, a.token.next());
    assert_eq!(b.lease_until, h.clock().now().plus(s.settings().lease));
    match s.complete(&a, &Outcome::success("zombie")).await {
        Err(Error::Fenced { held, current, .. }) => {
            assert_eq!(held, a.token);
            assert!(current.is_none_or(|c| c == b.token));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(matches!(s.renew(&a).await, Err(Error::Fenced { .. })));
    assert!(matches!(s.release(&a).await, Err(Error::Fenced { .. })));
    s.complete(&b, &Outcome::success("b")).await.unwrap();
    assert_eq!(
        s.claim(&job.scope, &job.key, job.fingerprint)
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(Outcome::success("b"))
    );
}

/// The dedupe window counts from a key's first claim, through renewals,
/// takeovers, releases and completions; a record past retention starts a new
/// window with a token above every earlier one, whatever its payload.
pub async fn the_window_counts_from_the_first_claim_leased<H: LeasedHarness>(h: H) {
    let s = h.store();
    let step = Duration::from_secs(10);
    let job = op("window", "leased", "v1");
    let t0 = h.clock().now();
    let window = |record: &idem_core::Record| (record.created_at, record.expires_at);
    let opened = (t0, t0.plus(DEFAULT_RETENTION));
    let first = claimed(&h, &job).await;
    h.clock().advance(step);
    let renewed = s.renew(&first).await.unwrap();
    assert_eq!(
        window(&s.get(&job.scope, &job.key).await.unwrap().unwrap()),
        opened
    );
    h.clock().advance(DEFAULT_LEASE + step);
    let second = claimed(&h, &job).await;
    assert!(second.took_over && second.token > renewed.token);
    s.release(&second).await.unwrap();
    h.clock().advance(step);
    let third = claimed(&h, &job).await;
    h.clock().advance(step);
    let settled_at = h.clock().now();
    s.complete(&third, &Outcome::success("v1")).await.unwrap();
    let done = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(window(&done), opened);
    assert_eq!(
        (done.state, done.updated_at),
        (RecordState::Completed, settled_at)
    );

    h.clock().advance(DEFAULT_RETENTION);
    let anew = op("window", "leased", "v2");
    let t1 = h.clock().now();
    let fourth = claimed(&h, &anew).await;
    assert!(fourth.token > third.token);
    assert_eq!(fourth.token, FencingToken::first_at(t1));
    let record = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(window(&record), (t1, t1.plus(DEFAULT_RETENTION)));
    assert_eq!(
        (record.fingerprint, record.outcome),
        (anew.fingerprint, None)
    );
}

/// Retention: a record replays until the window ends; then it counts as
/// expired, a sweep removes it in bounded batches, and the key is new again.
pub async fn retention_is_enforced_by_bounded_sweeps_leased<H: LeasedHarness>(h: H) {
    let s = h.store();
    for i in 0..26 {
        let claim = claimed(&h, &op("bulk", &format!("k{i}"), "x")).await;
        s.complete(&claim, &Outcome::success("ok")).await.unwrap();
    }
    let first = op("bulk", "k0", "x");
    h.clock()
        .advance(DEFAULT_RETENTION - Duration::from_millis(1));
    assert_eq!(
        s.claim(&first.scope, &first.key, first.fingerprint)
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(Outcome::success("ok"))
    );
    assert_eq!(s.count().await.unwrap().expired, 0);
    assert_eq!(s.sweep(10).await.unwrap(), 0);

    h.clock().advance(Duration::from_millis(1));
    let count = s.count().await.unwrap();
    assert_eq!((count.total, count.expired), (26, 26));
    assert_eq!(s.sweep_batch(10).await.unwrap(), 10);
    assert_eq!(s.sweep(10).await.unwrap(), 16);
    assert_eq!(s.count().await.unwrap().total, 0);
    let glance = s.glance().await.unwrap();
    assert_eq!((glance.records, glance.oldest_age), (0, None));
    let again = claimed(&h, &op("bulk", "k0", "another payload")).await;
    assert!(!again.took_over);
}

/// Inspection: list filters by scope and state, newest first, and honours
/// the limit; records carry their token, lease and timestamps.
pub async fn records_can_be_listed_and_shown_leased<H: LeasedHarness>(h: H) {
    let s = h.store();
    let a = claimed(&h, &op("s1", "a", "x")).await;
    s.complete(&a, &Outcome::success("a")).await.unwrap();
    h.clock().advance(Duration::from_millis(5));
    let b = claimed(&h, &op("s2", "b", "x")).await;
    s.complete(&b, &Outcome::success("b")).await.unwrap();
    h.clock().advance(Duration::from_millis(5));
    let c = claimed(&h, &op("s2", "c", "x")).await;

    let all = s.list(&RecordFilter::default()).await.unwrap();
    let keys: Vec<&str> = all.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["c", "b", "a"], "newest first");
    let s2 = s
        .list(&RecordFilter {
            scope: Some(Scope::new("s2").unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(s2.len(), 2);
    let in_flight = s
        .list(&RecordFilter {
            state: Some(RecordState::InFlight),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].key.as_str(), "c");
    assert_eq!(in_flight[0].token, c.token);
    assert_eq!(in_flight[0].lease_until, Some(c.lease_until));
    let limited = s
        .list(&RecordFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);
    assert!(
        s.get(
            &Scope::new("s1").unwrap(),
            &IdempotencyKey::new("nope").unwrap()
        )
        .await
        .unwrap()
        .is_none()
    );
    let glance = s.glance().await.unwrap();
    assert_eq!(glance.records, 3);
    assert_eq!(glance.oldest_age, Some(Duration::from_millis(10)));
}

/// Inspection: a key prefix narrows the listing, and pages that each start
/// after the last record of the one before list every record once, in the
/// listing's order, records created at the same instant included.
pub async fn records_can_be_filtered_by_prefix_and_paged_leased<H: LeasedHarness>(h: H) {
    let s = h.store();
    for (scope, key) in [
        ("s1", "order-1"),
        ("s2", "order-2"),
        ("s1", "refund-1"),
        ("s1", "order-3"),
    ] {
        let claim = claimed(&h, &op(scope, key, "x")).await;
        s.complete(&claim, &Outcome::success(key)).await.unwrap();
    }
    h.clock().advance(Duration::from_millis(5));
    claimed(&h, &op("s1", "order-4", "x")).await;

    let orders = s
        .list(&RecordFilter {
            key_prefix: Some("order-".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: Vec<&str> = orders.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["order-4", "order-1", "order-3", "order-2"]);
    let in_flight_orders = s
        .list(&RecordFilter {
            key_prefix: Some("order-".into()),
            state: Some(RecordState::InFlight),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(in_flight_orders.len(), 1);
    let none = s
        .list(&RecordFilter {
            key_prefix: Some("order-1x".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty());

    let all = s.list(&RecordFilter::default()).await.unwrap();
    assert_eq!(all.len(), 5);
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = s
            .list(&RecordFilter {
                after: after.clone(),
                limit: Some(2),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some(RecordCursor::after(last));
        paged.extend(page);
    }
    assert_eq!(paged, all, "the pages, joined, are the whole listing");
}

/// Many keys claimed over and over across several windows, each window
/// swept before the next: every key's tokens only grow.
pub async fn tokens_never_go_back_across_sweeps<H: LeasedHarness>(h: H) {
    let s = h.store();
    let keys: Vec<_> = (0..8)
        .map(|i| op("sweeps", &format!("k{i}"), "x"))
        .collect();
    let mut last: Vec<Option<FencingToken>> = vec![None; keys.len()];
    for window in 0..4 {
        for (i, key) in keys.iter().enumerate() {
            for _ in 0..=window {
                let claim = claimed(&h, key).await;
                assert!(
                    last[i].is_none_or(|t| claim.token > t),
                    "{} went back to {} after {:?}",
                    key.key,
                    claim.token,
                    last[i]
                );
                last[i] = Some(claim.token);
                s.release(&claim).await.unwrap();
            }
        }
        h.clock().advance(DEFAULT_RETENTION);
        assert_eq!(s.sweep(3).await.unwrap(), keys.len() as u64);
        assert_eq!(s.count().await.unwrap().total, 0);
    }
}
