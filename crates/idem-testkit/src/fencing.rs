//! Conformance cases for fencing tokens and guarded writes ([`FenceStore`]),
//! reproducing the two failures dedupe alone cannot stop: the zombie that wakes
//! after a pause, and messages that arrive out of order.

use std::time::Duration;

use idem_core::{Applied, Clock, Error, FenceStore, FencingToken, GuardOrdering, Resource};

use crate::harness::{Harness, op, set_outcome, stale_outcome};

const TTL: Duration = Duration::from_secs(30);

/// Tokens grow with every acquisition, a live lease is not handed out twice,
/// a stale holder cannot renew or release, and a store opened again on the same
/// database continues the sequence (tokens are never reused).
pub async fn fencing_tokens_grow_and_are_never_reused<H: Harness>(h: H) {
    let report = Resource::new("nightly-report").unwrap();
    let first = h.store().acquire(&report, TTL).await.unwrap();
    assert_eq!(first.token, FencingToken::FIRST);
    match h.store().acquire(&report, TTL).await {
        Err(Error::LeaseHeld { retry_after, .. }) => assert_eq!(retry_after, TTL),
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    h.store().release(&first).await.unwrap();
    let second = h.store().acquire(&report, TTL).await.unwrap();
    assert_eq!(second.token, first.token.next());
    assert!(matches!(
        h.store().renew(&first, TTL).await,
        Err(Error::Stale { .. })
    ));
    assert!(matches!(
        h.store().release(&first).await,
        Err(Error::Stale { .. })
    ));

    h.clock().advance(TTL / 2);
    let renewed = h.store().renew(&second, TTL).await.unwrap();
    assert_eq!(renewed.until, h.clock().now().plus(TTL));
    h.clock().advance(TTL);
    let third = h.store().acquire(&report, TTL).await.unwrap();
    assert_eq!(
        third.token,
        second.token.next(),
        "an ended lease is taken over"
    );

    h.store().release(&third).await.unwrap();
    let restarted = H::open(&h.location(), h.clock().clone()).await;
    let fourth = restarted.store().acquire(&report, TTL).await.unwrap();
    assert_eq!(
        fourth.token,
        third.token.next(),
        "tokens continue after a restart"
    );
    let other = Resource::new("another").unwrap();
    assert_eq!(
        restarted.store().acquire(&other, TTL).await.unwrap().token,
        FencingToken::FIRST
    );
}

/// The pause: A takes token 1 and stalls past its lease; B takes token 2 and
/// writes x = 2; A wakes and writes x = 1 with token 1 — rejected, x stays 2.
pub async fn a_paused_worker_cannot_overwrite_its_successor<H: Harness>(h: H) {
    let x = Resource::new("register/x").unwrap();
    let a = h.store().acquire(&x, TTL).await.unwrap();
    h.clock().advance(TTL + Duration::from_millis(1));
    let b = h.store().acquire(&x, TTL).await.unwrap();
    assert_eq!(b.token, a.token.next());
    h.guarded_set("x", 2, b.token.get(), GuardOrdering::Fence)
        .await
        .unwrap();
    h.guarded_set("x", 2, b.token.get(), GuardOrdering::Fence)
        .await
        .expect("the holder may write again with its token");

    let late = h
        .guarded_set("x", 1, a.token.get(), GuardOrdering::Fence)
        .await
        .unwrap_err();
    match &late {
        Error::Stale {
            carried, stored, ..
        } => {
            assert_eq!((*carried, *stored), (a.token.get(), Some(b.token.get())));
            assert!(!late.is_retryable());
            assert!(late.to_string().contains("must not be retried"), "{late}");
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(h.register("x").await, (2, 0, b.token.get()));
    assert_eq!(h.counter("writes:x").await, 2);
}

/// Reordering: `set(x, 1)` v1 and `set(x, 2)` v2 delivered as v2, v1, each
/// duplicated: x ends at 2, each message is applied at most once, and the late
/// v1 is answered (and replayed) as stale.
pub async fn reordered_versions_keep_the_newest_and_apply_once<H: Harness>(h: H) {
    let v1 = op("registers", "set-x-v1", "x=1");
    let v2 = op("registers", "set-x-v2", "x=2");
    let deliveries = [
        (&v2, 2, 2),
        (&v2, 2, 2),
        (&v1, 1, 1),
        (&v1, 1, 1),
        (&v2, 2, 2),
    ];
    let mut answers = Vec::new();
    for (message, value, version) in deliveries {
        answers.push(
            h.apply_versioned_set(message, "x", value, version)
                .await
                .unwrap(),
        );
    }
    assert_eq!(answers[0], Applied::Fresh(set_outcome(2)));
    assert_eq!(answers[1], Applied::Replayed(set_outcome(2)));
    assert_eq!(answers[2], Applied::Fresh(stale_outcome()));
    assert_eq!(answers[3], Applied::Replayed(stale_outcome()));
    assert_eq!(answers[4], Applied::Replayed(set_outcome(2)));
    assert_eq!(h.register("x").await, (2, 2, 0));
    assert_eq!(h.counter("writes:x").await, 1, "only v2 was written, once");

    let v3 = op("registers", "set-x-v3", "x=3");
    assert_eq!(
        h.apply_versioned_set(&v3, "x", 3, 3).await.unwrap(),
        Applied::Fresh(set_outcome(3))
    );
    assert_eq!(h.register("x").await, (3, 3, 0));
}
