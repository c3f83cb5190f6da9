//! Leased mode against a real PostgreSQL, with a manual clock: claims, fenced
//! completions, takeovers, releases and renewals.

mod common;

use std::time::Duration;

use common::{TestDb, clock};
use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, Claim, Claimed, Clock, Error, Fingerprint,
    IdempotencyKey, LeaseStore, Outcome, RecordState, RecordStore, Scope,
};
use sqlx::PgConnection;

fn scope() -> Scope {
    Scope::new("emails").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes(b"welcome")
}

fn fresh(claimed: Claimed) -> Claim {
    match claimed {
        Claimed::Fresh(claim) => claim,
        Claimed::Replayed(replay) => panic!("expected a fresh claim, got replay {replay:?}"),
    }
}

#[tokio::test]
async fn claim_complete_then_replay() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let claim = fresh(store.claim(&scope(), &key("user-7"), fp()).await.unwrap());
    assert_eq!(claim.token, idem_core::FencingToken::first_at(clock.now()));
    assert!(!claim.took_over);
    assert_eq!(claim.lease_until, clock.now().plus(Duration::from_secs(60)));

    let err = store
        .claim(&scope(), &key("user-7"), fp())
        .await
        .unwrap_err();
    match err {
        Error::InFlight { retry_after, .. } => assert_eq!(retry_after, Duration::from_secs(1)),
        other => panic!("expected InFlight, got {other:?}"),
    }

    let sent = Outcome::success("sent").with_meta("provider", "smtp");
    store.complete(&claim, &sent).await.unwrap();
    assert_eq!(
        store
            .claim(&scope(), &key("user-7"), fp())
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(sent.clone())
    );

    let record = store.get(&scope(), &key("user-7")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.outcome, Some(sent.clone()));
    assert_eq!(record.lease_until, None);

    // The generic leased apply sees the replay too and runs nothing.
    let applied = store
        .apply_leased(&scope(), &key("user-7"), fp(), |_| async {
            Err::<Outcome, &str>("must not run")
        })
        .await
        .unwrap();
    assert_eq!(applied, Applied::Replayed(sent));
}

#[tokio::test]
async fn expired_lease_is_taken_over_and_the_zombie_is_fenced() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let claimed_at = clock.now();
    let zombie = fresh(store.claim(&scope(), &key("user-7"), fp()).await.unwrap());
    clock.advance(Duration::from_secs(61));
    let heir = fresh(store.claim(&scope(), &key("user-7"), fp()).await.unwrap());
    assert_eq!(heir.token, zombie.token.next());
    assert!(heir.took_over);

    let err = store
        .complete(&zombie, &Outcome::success("zombie"))
        .await
        .unwrap_err();
    match err {
        Error::Fenced { held, current, .. } => {
            assert_eq!(held, zombie.token);
            assert_eq!(current, Some(heir.token));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(matches!(
        store.renew(&zombie).await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(
        store.release(&zombie).await,
        Err(Error::Fenced { .. })
    ));

    store
        .complete(&heir, &Outcome::success("heir"))
        .await
        .unwrap();
    let record = store.get(&scope(), &key("user-7")).await.unwrap().unwrap();
    assert_eq!(record.token, heir.token);
    assert_eq!(record.outcome, Some(Outcome::success("heir")));
    // A takeover keeps the window of the first claim.
    assert_eq!(record.created_at, claimed_at);
    assert_eq!(
        record.expires_at,
        claimed_at.plus(Duration::from_secs(3600))
    );
}

#[tokio::test]
async fn release_then_claim_again_gets_the_next_token() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let first = fresh(store.claim(&scope(), &key("user-7"), fp()).await.unwrap());
    store.release(&first).await.unwrap();
    let second = fresh(store.claim(&scope(), &key("user-7"), fp()).await.unwrap());
    assert_eq!(second.token, first.token.next());
    assert!(matches!(
        store.complete(&first, &Outcome::empty()).await,
        Err(Error::Fenced { .. })
    ));
    store.complete(&second, &Outcome::empty()).await.unwrap();
}

#[tokio::test]
async fn renewed_lease_is_not_taken_over() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let claim = fresh(store.claim(&scope(), &key("user-7"), fp()).await.unwrap());
    clock.advance(Duration::from_secs(40));
    let renewed = store.renew(&claim).await.unwrap();
    assert_eq!(renewed.token, claim.token);
    assert_eq!(
        renewed.lease_until,
        clock.now().plus(Duration::from_secs(60))
    );

    clock.advance(Duration::from_secs(40)); // 80 s after the claim, 40 s after the renewal
    assert!(matches!(
        store.claim(&scope(), &key("user-7"), fp()).await,
        Err(Error::InFlight { .. })
    ));
    store.complete(&renewed, &Outcome::empty()).await.unwrap();
}

/// Debits 10 from account 1 in the completion's transaction.
fn debit() -> impl AtomicEffect<PgConnection, Outcome, sqlx::Error> {
    async |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
            .execute(&mut *conn)
            .await?;
        Ok(Outcome::success("debited"))
    }
}

#[tokio::test]
async fn complete_with_commits_the_effect_only_for_the_current_token() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let zombie = fresh(store.claim(&scope(), &key("pay-1"), fp()).await.unwrap());
    clock.advance(Duration::from_secs(61));
    let heir = fresh(store.claim(&scope(), &key("pay-1"), fp()).await.unwrap());

    let err = store.complete_with(&zombie, debit()).await.unwrap_err();
    assert!(
        matches!(err, ApplyError::Protocol(Error::Fenced { .. })),
        "{err:?}"
    );
    assert_eq!(db.balance(&store, 1).await, 100);

    let outcome = store.complete_with(&heir, debit()).await.unwrap();
    assert_eq!(outcome, Outcome::success("debited"));
    assert_eq!(db.balance(&store, 1).await, 90);
    assert_eq!(
        store
            .claim(&scope(), &key("pay-1"), fp())
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(outcome)
    );
}

#[tokio::test]
async fn sixty_four_concurrent_claims_give_one_claim() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;
    let claims = (0..64).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.claim(&scope(), &key("hot"), fp()).await })
    });
    let mut fresh = 0;
    for result in futures::future::join_all(claims).await {
        match result.unwrap() {
            Ok(Claimed::Fresh(claim)) => {
                assert_eq!(claim.token, idem_core::FencingToken::first_at(clock.now()));
                fresh += 1;
            }
            Err(Error::InFlight { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(fresh, 1);
}

#[tokio::test]
async fn concurrent_claims_and_completions_of_many_keys_settle_each_key_once() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.grouped_store_at(&clock).await;
    // 50 keys, each claimed by four callers at once: the groups mix new keys,
    // copies of a key in the same group, and keys settled a moment before.
    let callers = (0..200).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let name = format!("order-{}", i % 50);
            match store.claim(&scope(), &key(&name), fp()).await {
                Ok(Claimed::Fresh(claim)) => {
                    let outcome = Outcome::success(format!("done {name}"));
                    store.complete(&claim, &outcome).await.unwrap();
                    Some(name)
                }
                Ok(Claimed::Replayed(replay)) => {
                    assert_eq!(replay.outcome, Outcome::success(format!("done {name}")));
                    None
                }
                Err(Error::InFlight { .. }) => None,
                Err(other) => panic!("unexpected {other:?}"),
            }
        })
    });
    let mut ran = std::collections::HashMap::<String, u32>::new();
    for caller in futures::future::join_all(callers).await {
        if let Some(name) = caller.unwrap() {
            *ran.entry(name).or_default() += 1;
        }
    }
    assert_eq!(ran.len(), 50, "every key was claimed");
    assert!(ran.values().all(|&n| n == 1), "a key ran twice: {ran:?}");
    for i in 0..50 {
        let name = format!("order-{i}");
        assert_eq!(
            store
                .claim(&scope(), &key(&name), fp())
                .await
                .unwrap()
                .replayed()
                .cloned(),
            Some(Outcome::success(format!("done {name}")))
        );
    }
}

#[tokio::test]
async fn completions_in_one_group_fence_the_zombie_and_settle_the_others() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.grouped_store_at(&clock).await;
    let zombie = fresh(store.claim(&scope(), &key("a"), fp()).await.unwrap());
    clock.advance(Duration::from_secs(61));
    let successor = fresh(store.claim(&scope(), &key("a"), fp()).await.unwrap());
    assert!(successor.took_over);
    let other = fresh(store.claim(&scope(), &key("b"), fp()).await.unwrap());

    let late = Outcome::success("zombie");
    let won = Outcome::success("successor");
    let done = Outcome::success("b");
    let (z, s, o) = tokio::join!(
        store.complete(&zombie, &late),
        store.complete(&successor, &won),
        store.complete(&other, &done),
    );
    match z {
        Err(Error::Fenced { held, current, .. }) => {
            assert_eq!(held, zombie.token);
            assert_eq!(current, Some(successor.token));
        }
        other => panic!("expected Fenced for the zombie, got {other:?}"),
    }
    s.unwrap();
    o.unwrap();
    assert_eq!(
        store
            .claim(&scope(), &key("a"), fp())
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(won)
    );
    assert_eq!(
        store
            .claim(&scope(), &key("b"), fp())
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(done)
    );
}

#[tokio::test]
async fn a_claim_whose_caller_gave_up_in_the_queue_is_released() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.grouped_store_at(&clock).await;
    // Polled once (queued in a group), then dropped.
    let gave_up =
        tokio::time::timeout(Duration::ZERO, store.claim(&scope(), &key("left"), fp())).await;
    assert!(gave_up.is_err(), "the claim was still queued");
    // The clock stands still, so only the release can free the key before
    // its 60 s lease ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let claim = loop {
        match store.claim(&scope(), &key("left"), fp()).await {
            Ok(Claimed::Fresh(claim)) => break claim,
            Err(Error::InFlight { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("expected the key to be freed, got {other:?}"),
        }
    };
    assert!(
        !claim.took_over,
        "freed by the release, not by the lease's end"
    );
}

/// A completion whose effect runs in its transaction (`complete_with`) holds
/// the key while the effect runs; a claim of the same key meanwhile is
/// answered `InFlight` at once, neither queued behind it nor claimed, and
/// replays once the completion commits.
#[tokio::test]
async fn a_claim_while_complete_with_runs_is_answered_at_once() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let claim = fresh(store.claim(&scope(), &key("pay-2"), fp()).await.unwrap());
    let (entered, started) = tokio::sync::oneshot::channel::<()>();
    let (proceed, go) = tokio::sync::oneshot::channel::<()>();
    let completing = {
        let store = store.clone();
        let claim = claim.clone();
        tokio::spawn(async move {
            store
                .complete_with(
                    &claim,
                    async move |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
                        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
                            .execute(&mut *conn)
                            .await?;
                        entered.send(()).ok();
                        go.await.ok();
                        Ok(Outcome::success("debited"))
                    },
                )
                .await
        })
    };
    started.await.expect("the effect started");
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        store.claim(&scope(), &key("pay-2"), fp()),
    )
    .await
    .expect("a claim is answered while the completion's effect runs");
    assert!(matches!(answer, Err(Error::InFlight { .. })), "{answer:?}");
    proceed.send(()).unwrap();
    assert_eq!(
        completing.await.unwrap().unwrap(),
        Outcome::success("debited")
    );
    assert_eq!(db.balance(&store, 1).await, 90);
    assert_eq!(
        store
            .claim(&scope(), &key("pay-2"), fp())
            .await
            .unwrap()
            .replayed()
            .cloned(),
        Some(Outcome::success("debited"))
    );
}

/// The one-statement claim takes a record past its window (a new window,
/// a greater token) and a released one (the next token, the same window),
/// and leaves a stored answer to the replay.
#[tokio::test]
async fn one_statement_claims_of_released_and_expired_records() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;

    let first = fresh(store.claim(&scope(), &key("k-9"), fp()).await.unwrap());
    store.release(&first).await.unwrap();
    let second = fresh(store.claim(&scope(), &key("k-9"), fp()).await.unwrap());
    assert_eq!(second.token, first.token.next());
    assert_eq!(second.expires_at, first.expires_at);
    assert!(!second.took_over);
    store
        .complete(&second, &Outcome::success("sent"))
        .await
        .unwrap();
    assert!(matches!(
        store.claim(&scope(), &key("k-9"), fp()).await.unwrap(),
        Claimed::Replayed(_)
    ));

    clock.advance(Duration::from_secs(2 * 3_600));
    let third = fresh(store.claim(&scope(), &key("k-9"), fp()).await.unwrap());
    assert!(third.token > second.token);
    assert!(third.expires_at > second.expires_at);
    assert!(!third.took_over);
    let found = store
        .get(&scope(), &key("k-9"))
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(found.state, RecordState::InFlight);
    assert_eq!(found.token, third.token);
    assert_eq!(found.created_at, clock.now());
}
