//! Claims and completions share commits under concurrency (group commit); a
//! refused or failing write in a group must not undo or block the others.

use std::sync::Arc;

use idem_core::{
    ApplyError, AtomicStore, Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore, ManualClock,
    Outcome, RecordState, RecordStore, Scope,
};
use idem_sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_writes_in_a_group_leave_the_others_committed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = SqliteStore::builder(dir.path().join("idem.db"))
        .clock(Arc::new(clock.clone()))
        .open()
        .await
        .unwrap();
    let scope = Scope::new("group").unwrap();
    let key = |i: usize| IdempotencyKey::new(format!("k{i}")).unwrap();

    let mut claims = Vec::new();
    for i in 0..200 {
        match store
            .claim(&scope, &key(i), Fingerprint::of_bytes(b"x"))
            .await
            .unwrap()
        {
            Claimed::Fresh(claim) => claims.push(claim),
            Claimed::Replayed(_) => panic!("fresh keys"),
        }
    }
    // Half of the completions carry a stale token: they must be refused while
    // the valid ones, committed in the same groups, stay.
    let tasks: Vec<_> = claims
        .into_iter()
        .enumerate()
        .map(|(i, mut claim)| {
            let store = store.clone();
            tokio::spawn(async move {
                let stale = i % 2 == 1;
                if stale {
                    claim.token = claim.token.next();
                }
                let answer = store
                    .complete(&claim, &Outcome::success(i.to_string()))
                    .await;
                (i, stale, answer)
            })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        let (i, stale, answer) = task.unwrap();
        if stale {
            assert!(
                matches!(answer, Err(Error::Fenced { .. })),
                "{i}: {answer:?}"
            );
        } else {
            answer.unwrap();
        }
    }
    for i in 0..200 {
        let record = store.get(&scope, &key(i)).await.unwrap().unwrap();
        if i % 2 == 0 {
            assert_eq!(record.state, RecordState::Completed, "{i}");
            assert_eq!(record.outcome.unwrap().body, i.to_string().into_bytes());
        } else {
            assert_eq!(record.state, RecordState::InFlight, "{i}");
        }
    }

    // A reopened store sees every completion: they were committed before their
    // callers were answered.
    drop(store);
    let reopened = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    let completed = reopened
        .list(&idem_core::RecordFilter {
            state: Some(RecordState::Completed),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(completed.len(), 100);
}

/// Atomic applies queued together share one transaction, each in its own
/// savepoint: an effect that fails or panics undoes only its own writes and
/// record, the others' effects and records commit, and each caller is
/// answered after the commit (a reopened store sees every answered apply).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_atomic_applies_in_a_group_undo_only_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .with_connection(|conn| conn.execute_batch("CREATE TABLE effects (key TEXT PRIMARY KEY)"))
        .await
        .unwrap()
        .unwrap();
    let scope = Scope::new("group").unwrap();

    let tasks: Vec<_> = (0..240)
        .map(|i: usize| {
            let (store, scope) = (store.clone(), scope.clone());
            tokio::spawn(async move {
                let key = IdempotencyKey::new(format!("k{i}")).unwrap();
                let answer = store
                    .apply(
                        &scope,
                        &key,
                        Fingerprint::of_bytes(b"x"),
                        async move |conn: &mut rusqlite::Connection| {
                            conn.execute(
                                "INSERT INTO effects (key) VALUES (?1)",
                                [format!("k{i}")],
                            )
                            .map_err(|e| e.to_string())?;
                            match i % 3 {
                                1 => Err(format!("effect {i} failed")),
                                2 if i.is_multiple_of(2) => panic!("effect {i} panicked"),
                                _ => Ok(Outcome::success(i.to_string())),
                            }
                        },
                    )
                    .await;
                (i, answer)
            })
        })
        .collect();
    let mut applied = 0;
    for task in futures::future::join_all(tasks).await {
        let (i, answer) = task.unwrap();
        match (i % 3, i % 2) {
            (1, _) => assert!(
                matches!(answer, Err(ApplyError::Effect(_))),
                "{i}: {answer:?}"
            ),
            (2, 0) => assert!(answer.is_err(), "{i}: {answer:?}"),
            _ => {
                assert!(!answer.unwrap().is_replay(), "{i}");
                applied += 1;
            }
        }
    }
    drop(store);

    let reopened = SqliteStore::open(&path).await.unwrap();
    let effects: Vec<String> = reopened
        .with_connection(|conn| {
            let mut stmt = conn
                .prepare("SELECT key FROM effects ORDER BY key")
                .unwrap();
            stmt.query_map([], |row| row.get(0))
                .unwrap()
                .collect::<Result<Vec<String>, _>>()
                .unwrap()
        })
        .await
        .unwrap();
    assert_eq!(effects.len(), applied);
    for i in 0..240usize {
        let key = IdempotencyKey::new(format!("k{i}")).unwrap();
        let record = reopened.get(&scope, &key).await.unwrap();
        let kept = i % 3 == 0 || (i % 3 == 2 && i % 2 == 1);
        assert_eq!(record.is_some(), kept, "{i}");
        assert_eq!(effects.contains(&format!("k{i}")), kept, "{i}");
    }
}

/// Duplicates of a settled key arriving together are all replays: the one
/// that finds another duplicate holding the key reads the stored answer
/// instead of being told the key is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_of_a_settled_key_are_all_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::builder(dir.path().join("idem.db"))
        .open()
        .await
        .unwrap();
    let scope = Scope::new("replays").unwrap();
    let key = IdempotencyKey::new("settled").unwrap();
    let fingerprint = Fingerprint::of_bytes(b"x");
    let Claimed::Fresh(claim) = store.claim(&scope, &key, fingerprint).await.unwrap() else {
        panic!("a fresh key");
    };
    store
        .complete(&claim, &Outcome::success(b"paid".to_vec()))
        .await
        .unwrap();

    for _round in 0..20 {
        let duplicates: Vec<_> = (0..32)
            .map(|_| {
                let (store, scope, key) = (store.clone(), scope.clone(), key.clone());
                tokio::spawn(async move { store.claim(&scope, &key, fingerprint).await })
            })
            .collect();
        for duplicate in duplicates {
            match duplicate.await.unwrap() {
                Ok(Claimed::Replayed(replay)) => assert_eq!(replay.outcome.body, b"paid"),
                other => panic!("a duplicate of a settled key must be replayed: {other:?}"),
            }
        }
    }
}
