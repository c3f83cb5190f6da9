//! Conformance cases for leased claims: completion, renewal, an ended lease, release, and a zombie fenced.

use super::*;

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
