//! Claims and completions share commits under concurrency (group commit); a
//! refused or failing write in a group must not undo or block the others.

use std::sync::Arc;

use idem_core::{
    Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore, ManualClock, Outcome, RecordState,
    RecordStore, Scope,
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
