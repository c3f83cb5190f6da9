//! Atomic and batch apply against a real PostgreSQL: the effect is a real
//! `UPDATE`, and the tests check the balance it leaves.

mod common;

use std::sync::{Arc, Mutex};

use common::TestDb;
use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, Error, Fingerprint, IdempotencyKey, Operation,
    Outcome, RecordState, RecordStore, Scope,
};
use idem_postgres::PgStore;
use sqlx::PgConnection;
use tokio::sync::oneshot;

fn scope() -> Scope {
    Scope::new("payments").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

/// Debits `amount` from account 1; the outcome is the new balance.
fn debit(amount: i64) -> impl AtomicEffect<PgConnection, Outcome, sqlx::Error> {
    async move |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        let balance: i64 = sqlx::query_scalar(
            "UPDATE accounts SET balance = balance - $1 WHERE id = 1 RETURNING balance",
        )
        .bind(amount)
        .fetch_one(&mut *conn)
        .await?;
        Ok(Outcome::success(balance.to_string()).with_meta("currency", "EUR"))
    }
}

async fn apply_debit(
    store: &PgStore,
    k: &str,
    amount: i64,
) -> Result<Applied, ApplyError<sqlx::Error>> {
    let fp = Fingerprint::of_bytes(format!("debit {amount}").as_bytes());
    store.apply(&scope(), &key(k), fp, debit(amount)).await
}

#[tokio::test]
async fn apply_runs_the_effect_once_and_replays_the_stored_outcome() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;

    let first = apply_debit(&store, "order-1", 10).await.unwrap();
    assert!(!first.is_replay());
    assert_eq!(first.outcome().body, b"90");

    let again = apply_debit(&store, "order-1", 10).await.unwrap();
    assert!(again.is_replay());
    assert_eq!(again.outcome(), first.outcome());
    assert_eq!(db.balance(&store, 1).await, 90);

    let record = store.get(&scope(), &key("order-1")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(
        record.token,
        idem_core::FencingToken::first_at(record.created_at)
    );
    assert_eq!(record.outcome.as_ref(), Some(first.outcome()));
    assert_eq!(record.lease_until, None);
}

#[tokio::test]
async fn same_key_with_another_payload_is_key_reuse_and_changes_nothing() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    apply_debit(&store, "order-1", 10).await.unwrap();

    let err = apply_debit(&store, "order-1", 25).await.unwrap_err();
    assert!(
        matches!(err, ApplyError::Protocol(Error::KeyReuse { .. })),
        "{err:?}"
    );
    assert_eq!(db.balance(&store, 1).await, 90);
}

#[tokio::test]
async fn concurrent_duplicate_is_answered_in_flight_while_the_first_runs() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let (entered_tx, entered) = oneshot::channel::<()>();
    let (proceed, proceed_rx) = oneshot::channel::<()>();

    let first = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .apply(
                    &scope(),
                    &key("order-1"),
                    Fingerprint::of_bytes(b"debit 10"),
                    async move |conn| {
                        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
                            .execute(&mut *conn)
                            .await?;
                        entered_tx.send(()).unwrap();
                        proceed_rx.await.unwrap();
                        Ok::<_, sqlx::Error>(Outcome::success("first"))
                    },
                )
                .await
        }
    });
    entered.await.unwrap();

    let err = apply_debit(&store, "order-1", 10).await.unwrap_err();
    match err {
        ApplyError::Protocol(Error::InFlight { retry_after, .. }) => {
            assert_eq!(retry_after, store.settings().in_flight_retry_after)
        }
        other => panic!("expected InFlight, got {other:?}"),
    }

    proceed.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first, Applied::Fresh(Outcome::success("first")));
    let replay = apply_debit(&store, "order-1", 10).await.unwrap();
    assert_eq!(replay, Applied::Replayed(Outcome::success("first")));
    assert_eq!(db.balance(&store, 1).await, 90);
}

#[tokio::test]
async fn effect_error_rolls_back_and_the_retry_runs_again() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let fp = Fingerprint::of_bytes(b"debit 10");

    let err = store
        .apply(&scope(), &key("order-1"), fp, async |conn| {
            sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
                .execute(&mut *conn)
                .await
                .map_err(|e| e.to_string())?;
            Err::<Outcome, _>("upstream said no".to_owned())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ApplyError::Effect(ref e) if e == "upstream said no"));
    assert_eq!(db.balance(&store, 1).await, 100);
    assert!(
        store
            .get(&scope(), &key("order-1"))
            .await
            .unwrap()
            .is_none()
    );

    let retry = apply_debit(&store, "order-1", 10).await.unwrap();
    assert!(!retry.is_replay());
    assert_eq!(db.balance(&store, 1).await, 90);
}

/// An effect that declines: a terminal failure, stored and replayed.
fn decline() -> impl AtomicEffect<PgConnection, Outcome, sqlx::Error> {
    async |_: &mut PgConnection| -> sqlx::Result<Outcome> {
        Ok(Outcome::terminal_failure("insufficient funds"))
    }
}

#[tokio::test]
async fn terminal_failure_is_stored_and_replayed() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let fp = Fingerprint::of_bytes(b"debit 1000");
    let first = store
        .apply(&scope(), &key("order-9"), fp, decline())
        .await
        .unwrap();
    assert!(!first.is_replay() && first.outcome().is_failure());
    let again = store
        .apply(&scope(), &key("order-9"), fp, decline())
        .await
        .unwrap();
    assert_eq!(again, Applied::Replayed(first.into_outcome()));
    let record = store.get(&scope(), &key("order-9")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Failed);
}

fn op(k: &str, payload: &str) -> Operation {
    Operation::new(scope(), key(k), Fingerprint::of_bytes(payload.as_bytes()))
}

#[tokio::test]
async fn batch_dedupes_against_stored_records_and_inside_itself() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    apply_debit(&store, "a", 10).await.unwrap();

    let ops = [
        op("a", "debit 10"), // stored: replayed
        op("b", "debit 1"),  // new
        op("b", "debit 1"),  // duplicate inside the batch: replays b
        op("c", "debit 2"),  // new
        op("c", "debit 3"),  // same key, other payload: key reuse
    ];
    let amounts = [10, 1, 1, 2, 3];
    // The indexes the factory was called for: the new operations only.
    let ran = Arc::new(Mutex::new(Vec::new()));
    let results = store
        .apply_batch(&ops, {
            let ran = Arc::clone(&ran);
            move |i| {
                ran.lock().unwrap().push(i);
                let amount = amounts[i];
                async move |conn: &mut PgConnection| {
                    sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = 1")
                        .bind(amount)
                        .execute(&mut *conn)
                        .await?;
                    Ok::<_, sqlx::Error>(Outcome::success(format!("op {i}")))
                }
            }
        })
        .await
        .unwrap();

    assert_eq!(*ran.lock().unwrap(), vec![1, 3]);
    assert_eq!(results.len(), 5);
    assert_eq!(results[0].as_ref().unwrap().outcome().body, b"90");
    assert!(results[0].as_ref().unwrap().is_replay());
    assert_eq!(
        results[1].as_ref().unwrap(),
        &Applied::Fresh(Outcome::success("op 1"))
    );
    assert_eq!(
        results[2].as_ref().unwrap(),
        &Applied::Replayed(Outcome::success("op 1"))
    );
    assert_eq!(
        results[3].as_ref().unwrap(),
        &Applied::Fresh(Outcome::success("op 3"))
    );
    assert!(matches!(results[4], Err(Error::KeyReuse { .. })));
    assert_eq!(db.balance(&store, 1).await, 100 - 10 - 1 - 2);
    assert_eq!(store.count().await.unwrap().total, 3);

    // The same batch again changes nothing.
    let again = store
        .apply_batch(&ops, |i| {
            async move |_: &mut PgConnection| Err::<Outcome, String>(format!("op {i} ran twice"))
        })
        .await
        .unwrap();
    assert!(again[..4].iter().all(|r| r.as_ref().unwrap().is_replay()));
    assert_eq!(db.balance(&store, 1).await, 87);
}

#[tokio::test]
async fn batch_effect_error_rolls_back_the_whole_batch() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let ops = [op("x", "1"), op("y", "2")];
    let err = store
        .apply_batch(&ops, |i| {
            async move |conn: &mut PgConnection| {
                sqlx::query("UPDATE accounts SET balance = balance - 5 WHERE id = 1")
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if i == 1 {
                    return Err("second failed".to_owned());
                }
                Ok(Outcome::empty())
            }
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ApplyError::Effect((1, ref e)) if e == "second failed"));
    assert_eq!(db.balance(&store, 1).await, 100);
    assert_eq!(store.count().await.unwrap().total, 0);
}

#[tokio::test]
async fn batch_answers_a_key_held_elsewhere_in_flight_and_applies_the_rest() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let (entered_tx, entered) = oneshot::channel::<()>();
    let (proceed, proceed_rx) = oneshot::channel::<()>();
    let holder = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .apply(
                    &scope(),
                    &key("held"),
                    Fingerprint::of_bytes(b"h"),
                    async move |_conn| {
                        entered_tx.send(()).unwrap();
                        proceed_rx.await.unwrap();
                        Ok::<_, sqlx::Error>(Outcome::success("holder"))
                    },
                )
                .await
        }
    });
    entered.await.unwrap();

    let ops = [op("held", "h"), op("free", "f")];
    let results = store
        .apply_batch(&ops, |i| {
            async move |_: &mut PgConnection| {
                Ok::<_, sqlx::Error>(Outcome::success(format!("batch {i}")))
            }
        })
        .await
        .unwrap();
    assert!(matches!(results[0], Err(Error::InFlight { .. })));
    assert_eq!(
        results[1].as_ref().unwrap(),
        &Applied::Fresh(Outcome::success("batch 1"))
    );

    proceed.send(()).unwrap();
    assert!(!holder.await.unwrap().unwrap().is_replay());
}

#[tokio::test]
async fn sixty_four_concurrent_callers_apply_the_effect_once() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let callers = (0..64).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { apply_debit(&store, "hot", 10).await })
    });
    let results = futures::future::join_all(callers).await;
    let mut fresh = 0;
    for result in results {
        match result.unwrap() {
            Ok(Applied::Fresh(_)) => fresh += 1,
            Ok(Applied::Replayed(outcome)) => assert_eq!(outcome.body, b"90"),
            Err(ApplyError::Protocol(Error::InFlight { .. })) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(db.balance(&store, 1).await, 90);
    assert_eq!(
        apply_debit(&store, "hot", 10).await.unwrap(),
        Applied::Replayed(Outcome::success("90").with_meta("currency", "EUR"))
    );
}
