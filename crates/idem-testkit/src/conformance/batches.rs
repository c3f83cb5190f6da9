//! Conformance cases for batches (deduplicated, one set effect, a busy key answered in flight) and the record listing.

use super::*;

/// Batch apply: new keys run once, known keys replay, keys repeated inside the
/// batch replay the first, reused keys are refused; one effect failure rolls
/// back the whole batch.
pub async fn batch_apply_dedupes_and_commits_once<H: Harness>(h: H) {
    h.apply_add(&op("b", "known", "x"), "c", 100, Effect::Succeed)
        .await
        .unwrap();
    let ops = vec![
        op("b", "n1", "x"),
        op("b", "known", "x"),
        op("b", "n2", "x"),
        op("b", "n1", "x"),
        op("b", "known", "other payload"),
        op("b", "n3", "x"),
    ];
    let adds: Vec<(String, i64)> = [1, 1000, 2, 1000, 1000, 4]
        .iter()
        .map(|&a| ("c".to_owned(), a))
        .collect();
    let answers = h.apply_batch_add(&ops, &adds).await.unwrap();
    assert_eq!(answers.len(), ops.len());
    assert_eq!(
        answers[0].as_ref().unwrap(),
        &Applied::Fresh(counter_outcome(101))
    );
    assert_eq!(
        answers[1].as_ref().unwrap(),
        &Applied::Replayed(counter_outcome(100))
    );
    assert_eq!(
        answers[2].as_ref().unwrap(),
        &Applied::Fresh(counter_outcome(103))
    );
    assert_eq!(
        answers[3].as_ref().unwrap(),
        &Applied::Replayed(counter_outcome(101))
    );
    assert!(matches!(answers[4], Err(Error::KeyReuse { .. })));
    assert_eq!(
        answers[5].as_ref().unwrap(),
        &Applied::Fresh(counter_outcome(107))
    );
    assert_eq!(h.counter("c").await, 107);

    let again = h.apply_batch_add(&ops[..3], &adds[..3]).await.unwrap();
    assert!(again.iter().all(|a| a.as_ref().unwrap().is_replay()));

    let failing = vec![op("b", "f1", "x"), op("b", "f2", "x")];
    let failing_adds = vec![("c".to_owned(), 5), ("c".to_owned(), i64::MIN)];
    match h.apply_batch_add(&failing, &failing_adds).await {
        Err(ApplyError::Effect((1, _))) => {}
        other => panic!("expected the second effect's failure, got {other:?}"),
    }
    assert_eq!(h.counter("c").await, 107, "the whole batch rolled back");
    assert!(
        h.store()
            .get(&failing[0].scope, &failing[0].key)
            .await
            .unwrap()
            .is_none()
    );
}

/// Set apply: one effect for all new operations of a batch, given their
/// indexes; known keys replay, keys repeated inside the batch replay the
/// first, reused keys are refused; an effect failure, or an effect that
/// answers the wrong number of outcomes, rolls back the whole batch.
pub async fn set_apply_runs_one_effect_for_the_new_operations<H: Harness>(h: H) {
    h.apply_add(&op("s", "known", "x"), "c", 100, Effect::Succeed)
        .await
        .unwrap();
    let ops = vec![
        op("s", "n1", "x"),
        op("s", "known", "x"),
        op("s", "n2", "x"),
        op("s", "n1", "x"),
        op("s", "known", "other payload"),
        op("s", "n3", "x"),
        op("s", "n2", "other payload"),
    ];
    let adds: Vec<(String, i64)> = [1, 1000, 2, 1000, 1000, 4, 1000]
        .iter()
        .map(|&a| ("c".to_owned(), a))
        .collect();
    let given = Arc::new(std::sync::Mutex::new(Vec::new()));
    let answers = h
        .apply_set_add(&ops, &adds, Arc::clone(&given))
        .await
        .unwrap();
    assert_eq!(*given.lock().unwrap(), vec![0, 2, 5], "the new operations");
    let fresh = |v| Applied::Fresh(counter_outcome(v));
    let replayed = |v| Applied::Replayed(counter_outcome(v));
    assert_eq!(answers.len(), ops.len());
    assert_eq!(answers[0].as_ref().unwrap(), &fresh(101));
    assert_eq!(answers[1].as_ref().unwrap(), &replayed(100));
    assert_eq!(answers[2].as_ref().unwrap(), &fresh(103));
    assert_eq!(answers[3].as_ref().unwrap(), &replayed(101));
    assert!(matches!(answers[4], Err(Error::KeyReuse { .. })));
    assert_eq!(answers[5].as_ref().unwrap(), &fresh(107));
    assert!(matches!(answers[6], Err(Error::KeyReuse { .. })));
    assert_eq!(h.counter("c").await, 107);

    // Nothing new: the effect is not called.
    let given = Arc::new(std::sync::Mutex::new(vec![usize::MAX]));
    let again = h
        .apply_set_add(&ops[..3], &adds[..3], Arc::clone(&given))
        .await
        .unwrap();
    assert!(again.iter().all(|a| a.as_ref().unwrap().is_replay()));
    assert_eq!(*given.lock().unwrap(), vec![usize::MAX], "not called");

    let failing = vec![op("s", "f1", "x"), op("s", "f2", "x")];
    let failing_adds = vec![("c".to_owned(), 5), ("c".to_owned(), i64::MIN)];
    let given = Arc::new(std::sync::Mutex::new(Vec::new()));
    match h.apply_set_add(&failing, &failing_adds, given).await {
        Err(ApplyError::Effect(_)) => {}
        other => panic!("expected the effect's failure, got {other:?}"),
    }
    assert_eq!(h.counter("c").await, 107, "the whole batch rolled back");
    assert!(
        h.store()
            .get(&failing[0].scope, &failing[0].key)
            .await
            .unwrap()
            .is_none()
    );

    // One outcome short: rolled back, then the call panics.
    let short_adds = vec![("c".to_owned(), 5), ("c".to_owned(), i64::MAX)];
    let given = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = h.reopen().await;
    let short = {
        let failing = failing.clone();
        tokio::spawn(async move { store.apply_set_add(&failing, &short_adds, given).await })
    };
    let panicked = short.await.expect_err("a short answer panics");
    assert!(panicked.is_panic());
    assert_eq!(h.counter("c").await, 107, "rolled back before the panic");
    // The keys are free again.
    let answers = h
        .apply_set_add(
            &failing,
            &[("c".to_owned(), 5), ("c".to_owned(), 6)],
            Arc::default(),
        )
        .await
        .unwrap();
    assert!(answers.iter().all(|a| !a.as_ref().unwrap().is_replay()));
    assert_eq!(h.counter("c").await, 118);
}

/// A batch does not wait for a key another caller is applying: that operation
/// is answered `InFlight` while the other caller's effect is still running.
/// (On SQLite, operations on other keys need the single writer and so run after
/// that caller's transaction; on PostgreSQL they go ahead at once.)
pub async fn batch_answers_a_busy_key_in_flight<H: Harness>(h: H) {
    let busy = op("b", "busy", "x");
    let (gate, control) = Gate::new();
    let first = {
        let h2 = h.reopen().await;
        let busy = busy.clone();
        tokio::spawn(async move { h2.apply_add(&busy, "d", 1, Effect::Gate(gate)).await })
    };
    control.entered.await.unwrap();
    let ops = vec![busy.clone(), busy.clone()];
    let adds = vec![("d".to_owned(), 1), ("d".to_owned(), 1)];
    let answers = tokio::time::timeout(Duration::from_secs(20), h.apply_batch_add(&ops, &adds))
        .await
        .expect("the batch must not wait for the busy key")
        .unwrap();
    for answer in &answers {
        assert!(matches!(answer, Err(Error::InFlight { .. })), "{answer:?}");
    }
    control.proceed.send(()).unwrap();
    first.await.unwrap().unwrap();
    let ops = vec![busy, op("b", "free", "x")];
    let adds = vec![("d".to_owned(), 1), ("e".to_owned(), 1)];
    let answers = h.apply_batch_add(&ops, &adds).await.unwrap();
    assert!(answers[0].as_ref().unwrap().is_replay());
    assert!(!answers[1].as_ref().unwrap().is_replay());
    assert_eq!((h.counter("d").await, h.counter("e").await), (1, 1));
}

/// Inspection: list filters by scope and state; records carry their token,
/// lease and timestamps.
pub async fn records_can_be_listed_and_shown<H: Harness>(h: H) {
    h.apply_add(&op("s1", "a", "x"), "z", 1, Effect::Succeed)
        .await
        .unwrap();
    h.apply_add(&op("s2", "b", "x"), "z", 1, Effect::Succeed)
        .await
        .unwrap();
    let leased = op("s2", "c", "x");
    h.store()
        .claim(&leased.scope, &leased.key, leased.fingerprint)
        .await
        .unwrap();
    let all = h.store().list(&RecordFilter::default()).await.unwrap();
    assert_eq!(all.len(), 3);
    let s2 = h
        .store()
        .list(&RecordFilter {
            scope: Some(Scope::new("s2").unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(s2.len(), 2);
    let in_flight = h
        .store()
        .list(&RecordFilter {
            state: Some(RecordState::InFlight),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].key.as_str(), "c");
    assert!(in_flight[0].lease_until.is_some());
    let limited = h
        .store()
        .list(&RecordFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);
    assert!(
        h.store()
            .get(
                &Scope::new("s1").unwrap(),
                &IdempotencyKey::new("nope").unwrap()
            )
            .await
            .unwrap()
            .is_none()
    );
}
