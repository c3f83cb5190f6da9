//! Leased claims and completions queued together are decided and written by
//! the writer in one transaction: each is decided on what the jobs before it
//! in the batch wrote, a failing write fails only itself, and a write that
//! ends the whole transaction fails every job of it — no claim is answered
//! `Fresh` for a row that is not committed.
//!
//! Each test holds the writer with a job that waits on a gate, queues the
//! claims and completions behind it (on a current-thread runtime, spawned
//! tasks run up to their wait for the writer before the test goes on), then
//! opens the gate: the writer takes everything queued as one batch.

use std::sync::{Arc, mpsc};

use futures::future::join_all;
use idem_core::{
    Claim, Claimed, Error, ErrorKind, Fingerprint, IdempotencyKey, LeaseStore, ManualClock,
    Outcome, RecordState, RecordStore, Scope,
};
use idem_sqlite::SqliteStore;
use tokio::task::JoinHandle;

async fn store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::builder(dir.path().join("idem.db"))
        .clock(Arc::new(ManualClock::starting_now()))
        .open()
        .await
        .unwrap()
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(name).unwrap()
}

/// Holds the writer until the returned sender is dropped or sent to.
async fn hold_writer(store: &SqliteStore) -> (mpsc::Sender<()>, JoinHandle<()>) {
    let (open, gate) = mpsc::channel::<()>();
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .with_connection(move |_| {
                    let _ = gate.recv();
                })
                .await
                .unwrap();
        })
    };
    settle().await;
    (open, held)
}

/// Lets every spawned task run up to its wait for the writer.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

fn spawn_claim(
    store: &SqliteStore,
    scope: &Scope,
    name: &str,
) -> JoinHandle<Result<Claimed, Error>> {
    let (store, scope, key) = (store.clone(), scope.clone(), key(name));
    tokio::spawn(async move {
        store
            .claim(&scope, &key, Fingerprint::of_bytes(b"same"))
            .await
    })
}

async fn fresh(store: &SqliteStore, scope: &Scope, name: &str) -> Claim {
    match store
        .claim(scope, &key(name), Fingerprint::of_bytes(b"same"))
        .await
        .unwrap()
    {
        Claimed::Fresh(claim) => claim,
        other => panic!("{name}: a new key is claimed: {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn distinct_keys_and_one_repeated_key_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let scope = Scope::new("batch").unwrap();
    let (open, held) = hold_writer(&store).await;
    let distinct: Vec<_> = (0..100)
        .map(|i| spawn_claim(&store, &scope, &format!("k{i}")))
        .collect();
    let repeated: Vec<_> = (0..16)
        .map(|_| spawn_claim(&store, &scope, "shared"))
        .collect();
    settle().await;
    open.send(()).unwrap();
    held.await.unwrap();

    let mut tokens = Vec::new();
    for (i, answer) in join_all(distinct).await.into_iter().enumerate() {
        match answer.unwrap() {
            Ok(Claimed::Fresh(claim)) => tokens.push((format!("k{i}"), claim.token)),
            other => panic!("k{i}: {other:?}"),
        }
    }
    let mut fresh_shared = 0;
    for answer in join_all(repeated).await {
        match answer.unwrap() {
            Ok(Claimed::Fresh(claim)) => {
                fresh_shared += 1;
                tokens.push(("shared".to_owned(), claim.token));
            }
            Err(Error::InFlight { .. }) => {}
            other => panic!("a repeated key is claimed once, in flight for the rest: {other:?}"),
        }
    }
    assert_eq!(fresh_shared, 1);

    // Every claim answered Fresh is committed, with the token it was given.
    drop(store);
    let reopened = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    for (name, token) in tokens {
        let record = reopened.get(&scope, &key(&name)).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::InFlight, "{name}");
        assert_eq!(record.token, token, "{name}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_completion_and_a_claim_of_one_key_in_one_batch_are_decided_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let scope = Scope::new("batch").unwrap();
    let first = fresh(&store, &scope, "completed-first").await;
    let second = fresh(&store, &scope, "claimed-first").await;

    let (open, held) = hold_writer(&store).await;
    let complete = |claim: Claim| {
        let store = store.clone();
        tokio::spawn(async move { store.complete(&claim, &Outcome::success("paid")).await })
    };
    // The completion queued before the claim: the claim finds the key
    // settled and replays it.
    let completed_first = complete(first);
    let replayed = spawn_claim(&store, &scope, "completed-first");
    // The claim queued before the completion: it finds the key in flight.
    let in_flight = spawn_claim(&store, &scope, "claimed-first");
    let completed_second = complete(second);
    settle().await;
    open.send(()).unwrap();
    held.await.unwrap();

    completed_first.await.unwrap().unwrap();
    completed_second.await.unwrap().unwrap();
    match replayed.await.unwrap() {
        Ok(Claimed::Replayed(replay)) => assert_eq!(replay.outcome.body, b"paid"),
        other => panic!("the claim after the completion replays it: {other:?}"),
    }
    match in_flight.await.unwrap() {
        Err(Error::InFlight { .. }) => {}
        other => panic!("the claim before the completion finds the key in flight: {other:?}"),
    }
    for name in ["completed-first", "claimed-first"] {
        let record = store.get(&scope, &key(name)).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Completed, "{name}");
    }
}

/// A write refused by a constraint fails only its own job; a write whose
/// error rolls back the whole transaction fails every job before it in that
/// transaction, and the jobs after it commit in a new one.
#[tokio::test(flavor = "current_thread")]
async fn failing_writes_in_a_batch_never_answer_fresh_for_an_uncommitted_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let scope = Scope::new("batch").unwrap();
    store
        .with_connection(|conn| {
            conn.execute_batch(
                "CREATE TRIGGER refuse_bad BEFORE INSERT ON idem_records \
                   WHEN NEW.key LIKE 'bad%' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END; \
                 CREATE TRIGGER end_doom BEFORE INSERT ON idem_records \
                   WHEN NEW.key = 'doom' BEGIN SELECT RAISE(ROLLBACK, 'rolled back by the test'); END;",
            )
        })
        .await
        .unwrap()
        .unwrap();

    // One batch: good and refused keys, then the key that ends the
    // transaction, then more good and refused keys.
    let (open, held) = hold_writer(&store).await;
    let names: Vec<String> = (0..10)
        .map(|i| format!("before{i}"))
        .chain(["bad-before".to_owned(), "doom".to_owned()])
        .chain((0..10).map(|i| format!("after{i}")))
        .chain(["bad-after".to_owned()])
        .collect();
    let claims: Vec<_> = names
        .iter()
        .map(|name| spawn_claim(&store, &scope, name))
        .collect();
    settle().await;
    open.send(()).unwrap();
    held.await.unwrap();

    let answers: Vec<_> = join_all(claims)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (name, answer) in names.iter().zip(&answers) {
        let record = store.get(&scope, &key(name)).await.unwrap();
        match answer {
            Ok(Claimed::Fresh(claim)) => {
                let record =
                    record.unwrap_or_else(|| panic!("{name}: answered Fresh, not committed"));
                assert_eq!(record.token, claim.token, "{name}");
                assert!(name.starts_with("after"), "{name} is committed");
            }
            Ok(replayed) => panic!("{name}: {replayed:?}"),
            Err(error) => {
                assert!(record.is_none(), "{name}: refused but committed");
                if name.starts_with("before") {
                    assert!(
                        matches!(error, Error::Store(e) if e.kind() == ErrorKind::CommitUnknown),
                        "{name}: {error}"
                    );
                } else {
                    assert!(name == "doom" || name.starts_with("bad"), "{name}: {error}");
                    assert!(error.to_string().contains("by the test"), "{name}: {error}");
                }
            }
        }
    }
    // A failed claim left nothing behind: running it again claims the key.
    fresh(&store, &scope, "before0").await;
}
