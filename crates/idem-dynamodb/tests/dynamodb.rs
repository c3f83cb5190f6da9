//! The DynamoDB store on moto's server, beyond the shared conformance rows:
//! atomic mode with real DynamoDB effects (counted in items of their own
//! table), DynamoDB's limits, retention by time to live, the table's shape,
//! and what a consumer and an operator keep beside the records.

mod common;
mod effects;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Dynamo;
use effects::{add_in, counter, create_id_table, exists};
use idem_core::Clock as _;
use idem_core::{
    AdminStore, Applied, ApplyError, AtomicEffect, AtomicStore, AttemptStore, Claim, Claimed,
    DEFAULT_RETENTION, DeadLetterStore, Error, ErrorKind, Fingerprint, IdempotencyKey, LeaseStore,
    LetterAction, NewDeadLetter, Operation, Outcome, RecordAction, RecordState, RecordStore, Scope,
    Settings,
};
use idem_dynamodb::aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, ConditionCheck, Put, TimeToLiveStatus,
};
use idem_dynamodb::{DynamoStore, Transaction};

fn op(scope: &str, key: &str, payload: &str) -> Operation {
    Operation::new(
        Scope::new(scope).unwrap(),
        IdempotencyKey::new(key).unwrap(),
        Fingerprint::of_bytes(payload.as_bytes()),
    )
}

/// A store on a table of its own, and a table for its effects' counters.
async fn with_effects(name: &str) -> Option<(Dynamo, String)> {
    let h = Dynamo::new(name, Settings::default()).await?;
    let effects = format!("{}-effects", h.table);
    create_id_table(&h.store, &effects).await;
    Some((h, effects))
}

/// Atomic apply that adds `amount` to counter `name`.
async fn apply_add(
    store: &DynamoStore,
    op: &Operation,
    table: &str,
    name: &str,
    amount: i64,
) -> Result<Applied, ApplyError<String>> {
    let (table, name) = (table.to_owned(), name.to_owned());
    apply_op(store, op, async move |tx: &mut Transaction| {
        add_in(tx, &table, &name, amount);
        Ok::<_, String>(Outcome::success(format!("added {amount}")))
    })
    .await
}

/// Atomic apply of `op` with `effect`.
async fn apply_op<F>(
    store: &DynamoStore,
    op: &Operation,
    effect: F,
) -> Result<Applied, ApplyError<String>>
where
    F: AtomicEffect<Transaction, Outcome, String>,
{
    store
        .apply(&op.scope, &op.key, op.fingerprint, effect)
        .await
}

/// Claims `op`'s key, which must be free: `why` says why it is.
async fn claim_fresh(store: &DynamoStore, op: &Operation, why: &str) -> Claim {
    match store
        .claim(&op.scope, &op.key, op.fingerprint)
        .await
        .unwrap()
    {
        Claimed::Fresh(claim) => claim,
        Claimed::Replayed(_) => panic!("{why}"),
    }
}

/// Checks that the first answers of a batch are `expected`, in order.
fn assert_answers(answers: &[Result<Applied, Error>], expected: &[Applied]) {
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(answers[i].as_ref().unwrap(), want, "answer {i}");
    }
}

/// Checks that the counters of `effects` hold `expected`.
async fn assert_counters(store: &DynamoStore, effects: &str, expected: &[(&str, i64)]) {
    for (name, want) in expected {
        assert_eq!(counter(store, effects, name).await, *want, "counter {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_apply_the_effect_once() {
    let Some((h, effects)) = with_effects("atomic-race").await else {
        return;
    };
    let pay = op("payments", "p-1", "debit 10");
    let calls = (0..16).map(|_| {
        let (store, pay, effects) = (h.store.clone(), pay.clone(), effects.clone());
        tokio::spawn(async move { apply_add(&store, &pay, &effects, "alice", 10).await })
    });
    let answers = futures::future::join_all(calls).await;
    let mut fresh = 0;
    for answer in answers {
        match answer.unwrap() {
            Ok(Applied::Fresh(_)) => fresh += 1,
            Ok(Applied::Replayed(outcome)) => assert_eq!(outcome.body, b"added 10"),
            Err(ApplyError::Protocol(Error::InFlight { .. })) => {}
            other => panic!("a duplicate is replayed or answered in flight, got {other:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one caller ran the effect");
    assert_eq!(counter(&h.store, &effects, "alice").await, 10);
    let again = apply_add(&h.store, &pay, &effects, "alice", 10)
        .await
        .unwrap();
    assert_eq!(again, Applied::Replayed(Outcome::success("added 10")));
    assert_eq!(counter(&h.store, &effects, "alice").await, 10);
    let record = h.store.get(&pay.scope, &pay.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_effect_leaves_nothing_and_frees_the_key() {
    let Some((h, effects)) = with_effects("atomic-fail").await else {
        return;
    };
    let pay = op("payments", "p-2", "debit 5");
    let table = effects.clone();
    let failed = apply_op(&h.store, &pay, async move |tx: &mut Transaction| {
        add_in(tx, &table, "bob", 5);
        Err::<Outcome, _>("upstream refused".to_owned())
    })
    .await;
    assert!(matches!(failed, Err(ApplyError::Effect(ref e)) if e == "upstream refused"));
    assert!(
        !exists(&h.store, &effects, "bob").await,
        "the effect's write was not sent"
    );

    // An effect item whose condition fails cancels the whole transaction.
    let table = effects.clone();
    let refused = apply_op(&h.store, &pay, async move |tx: &mut Transaction| {
        add_in(tx, &table, "bob", 5);
        tx.condition_check(
            ConditionCheck::builder()
                .table_name(&table)
                .key("id", AttributeValue::S("limits".into()))
                .condition_expression("attribute_exists(id)")
                .build()
                .unwrap(),
        );
        Ok::<_, String>(Outcome::success("debited"))
    })
    .await;
    match refused {
        Err(ApplyError::Protocol(Error::Store(e))) => {
            assert!(
                e.to_string().contains("write #2 failed its condition"),
                "{e}"
            )
        }
        other => panic!("a failed condition cancels the transaction, got {other:?}"),
    }
    assert!(!exists(&h.store, &effects, "bob").await);

    // The key was given back each time: the next retry runs at once.
    let applied = apply_add(&h.store, &pay, &effects, "bob", 5).await.unwrap();
    assert!(matches!(applied, Applied::Fresh(_)));
    assert_eq!(counter(&h.store, &effects, "bob").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_claim_commits_nothing() {
    let Some((h, effects)) = with_effects("atomic-zombie").await else {
        return;
    };
    let pay = op("payments", "p-3", "x");
    let zombie = claim_fresh(&h.store, &pay, "a new key is claimed").await;
    h.clock
        .advance(Settings::default().lease + Duration::from_secs(1));
    let successor = claim_fresh(&h.store, &pay, "an expired lease is taken over").await;
    assert!(successor.took_over && successor.token > zombie.token);

    let table = effects.clone();
    let late = h
        .store
        .complete_with(&zombie, async move |tx: &mut Transaction| {
            add_in(tx, &table, "carol", 1);
            Ok::<_, String>(Outcome::success("late"))
        })
        .await;
    assert!(
        matches!(late, Err(ApplyError::Protocol(Error::Fenced { .. }))),
        "{late:?}"
    );
    assert!(!exists(&h.store, &effects, "carol").await);

    let table = effects.clone();
    let done = h
        .store
        .complete_with(&successor, async move |tx: &mut Transaction| {
            add_in(tx, &table, "carol", 1);
            Ok::<_, String>(Outcome::success("on time"))
        })
        .await
        .unwrap();
    assert_eq!(done.body, b"on time");
    assert_eq!(counter(&h.store, &effects, "carol").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_commit_their_effects_once() {
    let Some((h, effects)) = with_effects("atomic-batch").await else {
        return;
    };
    let ops = vec![
        op("orders", "o-1", "a"),
        op("orders", "o-2", "b"),
        op("orders", "o-1", "a"),
        op("orders", "o-2", "other payload"),
    ];
    let table = effects.clone();
    let answers = h
        .store
        .apply_batch(&ops, move |i| {
            let table = table.clone();
            // One transaction may write an item once: each operation its own.
            async move |tx: &mut Transaction| {
                add_in(tx, &table, &format!("op-{i}"), 1);
                Ok::<_, String>(Outcome::success(format!("op {i}")))
            }
        })
        .await
        .unwrap();
    assert_answers(
        &answers,
        &[
            Applied::Fresh(Outcome::success("op 0")),
            Applied::Fresh(Outcome::success("op 1")),
            Applied::Replayed(Outcome::success("op 0")),
        ],
    );
    assert!(matches!(answers[3], Err(Error::KeyReuse { .. })));
    assert_counters(&h.store, &effects, &[("op-0", 1), ("op-1", 1)]).await;
    assert!(!exists(&h.store, &effects, "op-2").await);

    // One effect for the set of new operations; the known ones replay.
    let ops = vec![
        op("orders", "o-1", "a"),
        op("orders", "o-3", "c"),
        op("orders", "o-4", "d"),
    ];
    let table = effects.clone();
    let answers = h
        .store
        .apply_set(&ops, move |new| {
            async move |tx: &mut Transaction| {
                add_in(tx, &table, "orders", new.len() as i64);
                Ok::<_, String>(
                    new.iter()
                        .map(|i| Outcome::success(format!("set {i}")))
                        .collect(),
                )
            }
        })
        .await
        .unwrap();
    assert_answers(
        &answers,
        &[
            Applied::Replayed(Outcome::success("op 0")),
            Applied::Fresh(Outcome::success("set 1")),
            Applied::Fresh(Outcome::success("set 2")),
        ],
    );
    assert_eq!(counter(&h.store, &effects, "orders").await, 2);

    // An effect error anywhere in a batch leaves nothing, and every key free.
    let ops = vec![op("orders", "o-5", "e"), op("orders", "o-6", "f")];
    let table = effects.clone();
    let failed = h
        .store
        .apply_batch(&ops, move |i| {
            let table = table.clone();
            async move |tx: &mut Transaction| {
                add_in(tx, &table, &format!("op-{i}"), 1);
                if i == 1 {
                    return Err("refused".to_owned());
                }
                Ok(Outcome::success("fine"))
            }
        })
        .await;
    assert!(matches!(failed, Err(ApplyError::Effect((1, _)))));
    assert_eq!(counter(&h.store, &effects, "op-0").await, 1);
    for free in &ops {
        claim_fresh(&h.store, free, "a key of a failed batch is free").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_over_dynamodbs_limits_is_refused_whole() {
    let Some((h, effects)) = with_effects("atomic-limits").await else {
        return;
    };
    let pay = op("bulk", "too-many", "x");
    let table = effects.clone();
    let refused = apply_op(&h.store, &pay, async move |tx: &mut Transaction| {
        for i in 0..100 {
            add_in(tx, &table, &format!("item-{i}"), 1);
        }
        Ok::<_, String>(Outcome::success("all of them"))
    })
    .await;
    match refused {
        Err(ApplyError::Protocol(Error::Store(e))) => {
            let message = e.to_string();
            assert!(message.contains("101 items"), "{message}");
            assert!(message.contains("limit of 100"), "{message}");
        }
        other => panic!("101 items are refused, got {other:?}"),
    }
    assert!(!exists(&h.store, &effects, "item-0").await);

    let big = op("bulk", "too-big", "x");
    let table = effects.clone();
    let refused = apply_op(&h.store, &big, async move |tx: &mut Transaction| {
        for i in 0..12 {
            tx.put(
                Put::builder()
                    .table_name(&table)
                    .item("id", AttributeValue::S(format!("blob-{i}")))
                    .item("data", AttributeValue::S("x".repeat(390 * 1024)))
                    .build()
                    .unwrap(),
            );
        }
        Ok::<_, String>(Outcome::success("stored"))
    })
    .await;
    match refused {
        Err(ApplyError::Protocol(Error::Store(e))) => {
            assert!(e.to_string().contains("(4 MB)"), "{e}")
        }
        other => panic!("over 4 MB is refused, got {other:?}"),
    }
    assert!(!exists(&h.store, &effects, "blob-0").await);

    // Both keys were given back: a smaller retry runs.
    let applied = apply_add(&h.store, &pay, &effects, "item-0", 1)
        .await
        .unwrap();
    assert!(matches!(applied, Applied::Fresh(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_400_kb_is_refused_not_cut() {
    let Some(h) = Dynamo::new("answer-limit", Settings::default()).await else {
        return;
    };
    let job = op("http", "big-answer", "x");
    let claim = claim_fresh(&h.store, &job, "a new key is claimed").await;
    let refused = h
        .store
        .complete(&claim, &Outcome::success(vec![b'a'; 410 * 1024]))
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("400 KB"), "{message}");
    assert!(message.contains("--max-answer"), "{message}");
    let Error::Store(store_error) = &refused else {
        panic!("a store error: {refused:?}");
    };
    assert!(!store_error.kind().is_transient(), "retrying cannot help");
    let record = h.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::InFlight, "nothing was stored");

    // Under the limit, the answer is kept whole and replayed. (moto counts
    // a binary value by its base64 text, DynamoDB by its bytes: 290 KB
    // fits both.)
    let fits = Outcome::success(vec![b'b'; 290 * 1024]);
    h.store.complete(&claim, &fits).await.unwrap();
    let replay = h
        .store
        .claim(&job.scope, &job.key, job.fingerprint)
        .await
        .unwrap();
    assert_eq!(replay.replayed(), Some(&fits));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_past_their_window_read_as_absent_until_dynamodb_deletes_them() {
    let Some(h) = Dynamo::new("ttl", Settings::default()).await else {
        return;
    };
    let job = op("mail", "m-1", "x");
    let claim = claim_fresh(&h.store, &job, "a new key is claimed").await;
    h.store
        .complete(&claim, &Outcome::success("sent"))
        .await
        .unwrap();
    let item = h
        .store
        .client()
        .get_item()
        .table_name(h.table.as_str())
        .key("pk", AttributeValue::S("r#4#mail#m-1".into()))
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let ttl_seconds = (claim.expires_at.0 + 999) / 1000;
    assert_eq!(
        item.get("ttl"),
        Some(&AttributeValue::N(ttl_seconds.to_string()))
    );

    h.clock.advance(DEFAULT_RETENTION);
    // DynamoDB has not deleted the item (its deletions lag): it is there,
    // but the store's reads treat it as absent.
    assert_eq!(h.store.count().await.unwrap().total, 1);
    assert!(h.store.get(&job.scope, &job.key).await.unwrap().is_none());
    assert!(h.store.list(&Default::default()).await.unwrap().is_empty());
    let anew = claim_fresh(
        &h.store,
        &job,
        "an expired record is claimed anew, not replayed",
    )
    .await;
    assert!(anew.token > claim.token && !anew.took_over);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_refuse_late_retries_until_the_grace_ends() {
    let grace = Duration::from_secs(3600);
    let Some(h) = Dynamo::new(
        "tombstones",
        Settings::default().with_tombstones(Some(grace)),
    )
    .await
    else {
        return;
    };
    let job = op("mail", "m-2", "x");
    let claim = claim_fresh(&h.store, &job, "a new key is claimed").await;
    h.store
        .complete(&claim, &Outcome::success("sent"))
        .await
        .unwrap();
    h.clock.advance(DEFAULT_RETENTION);
    assert!(matches!(
        h.store.claim(&job.scope, &job.key, job.fingerprint).await,
        Err(Error::Expired { .. })
    ));
    let other = op("mail", "m-2", "another payload");
    assert!(matches!(
        h.store
            .claim(&other.scope, &other.key, other.fingerprint)
            .await,
        Err(Error::KeyReuse { .. })
    ));
    assert_eq!(
        h.store.sweep(10).await.unwrap(),
        0,
        "a tombstone is kept through its grace"
    );
    h.clock.advance(grace);
    assert!(h.store.get(&job.scope, &job.key).await.unwrap().is_none());
    claim_fresh(&h.store, &job, "a tombstone past its grace is gone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_made_on_demand_with_its_time_to_live() {
    let Some(h) = Dynamo::new("shape", Settings::default()).await else {
        return;
    };
    let described = h
        .store
        .client()
        .describe_table()
        .table_name(h.table.as_str())
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    assert_eq!(
        described
            .billing_mode_summary()
            .and_then(|b| b.billing_mode()),
        Some(&BillingMode::PayPerRequest)
    );
    let ttl = h
        .store
        .client()
        .describe_time_to_live()
        .table_name(h.table.as_str())
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
    assert_eq!(ttl.attribute_name(), Some("ttl"));

    // Opened again, the table is found and checked, not made anew.
    let again = Dynamo::on(&h.table, Settings::default()).await;
    again.store.migrate().await.unwrap();

    // A table of another key shape is refused, saying what it needs.
    let foreign = common::unique_table("foreign");
    create_id_table(&h.store, &foreign).await;
    let refused = DynamoStore::open(&common::url_of(&foreign))
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("id (HASH)"), "{message}");
    assert!(message.contains("\"pk\""), "{message}");
    assert!(matches!(&refused, Error::Store(e) if e.kind() == ErrorKind::Config));

    // A missing table is refused when creating tables is turned off.
    let missing = DynamoStore::builder(common::url_of(&common::unique_table("missing")))
        .create_table(false)
        .open()
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("does not exist"), "{missing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_an_error() {
    if !common::moto_answers() {
        return;
    }
    let unreachable = DynamoStore::open("dynamodb+http://key:hunter2@127.0.0.1:9/idem-none")
        .await
        .unwrap_err();
    let message = idem_core::error_chain(&unreachable);
    assert!(!message.contains("hunter2"), "{message}");
    assert!(message.contains("key:***@127.0.0.1:9"), "{message}");
    let malformed = DynamoStore::open("dynamodb+http://key:hunter2@127.0.0.1:9/x?bad=1")
        .await
        .unwrap_err();
    assert!(!idem_core::error_chain(&malformed).contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_dead_letters_and_the_operators_changes_are_kept() {
    let Some(h) = Dynamo::new("beside", Settings::default()).await else {
        return;
    };
    let s = &h.store;
    let (scope, key) = (
        Scope::new("queue").unwrap(),
        IdempotencyKey::new("m-9").unwrap(),
    );
    let first = s.record_failure(&scope, &key, "timeout").await.unwrap();
    h.clock.advance(Duration::from_secs(1));
    let second = s
        .record_failure(&scope, &key, "timeout again")
        .await
        .unwrap();
    assert_eq!((first.count, second.count), (1, 2));
    assert_eq!(second.first_at, first.first_at);
    s.forget_failures(&scope, &key).await.unwrap();
    assert_eq!(s.record_failure(&scope, &key, "x").await.unwrap().count, 1);
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(s.sweep_failures(h.clock.now(), 10).await.unwrap(), 1);

    let letter = NewDeadLetter {
        origin: "amqp://broker/orders".into(),
        destination: "amqp://broker/orders".into(),
        key: key.clone(),
        payload: b"{}".to_vec(),
        headers: BTreeMap::from([("h".to_owned(), "v".to_owned())]),
        attempts: 5,
        last_error: "poison".into(),
        first_seen_at: h.clock.now(),
    };
    let one = s.record_dead_letter(&letter).await.unwrap();
    let two = s.record_dead_letter(&letter).await.unwrap();
    assert!(two > one);
    assert_eq!(s.list_dead_letters(10, false).await.unwrap().len(), 2);
    s.mark_redriven(one).await.unwrap();
    assert_eq!(s.list_dead_letters(10, false).await.unwrap().len(), 1);
    assert!(s.mark_redriven(999).await.is_err());
    assert!(matches!(
        s.archive_dead_letter(two, "ops").await.unwrap(),
        LetterAction::Done(_)
    ));
    assert!(matches!(
        s.archive_dead_letter(two, "ops").await.unwrap(),
        LetterAction::AlreadyArchived(_)
    ));
    assert!(matches!(
        s.discard_dead_letter(one, "ops").await.unwrap(),
        LetterAction::Done(_)
    ));
    assert!(s.get_dead_letter(one).await.unwrap().is_none());
    let stats = s.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.archived), (0, 1));

    let job = op("jobs", "stuck", "x");
    let claim = claim_fresh(s, &job, "a new key is claimed").await;
    let seen = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    let RecordAction::Done(_) = s.release_claim(&seen, "ops").await.unwrap() else {
        panic!("a held claim is ended");
    };
    assert!(matches!(
        s.complete(&claim, &Outcome::success("late")).await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(
        s.evict(&seen, "ops").await.unwrap(),
        RecordAction::Changed(_)
    ));
    let now = s.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert!(matches!(
        s.evict(&now, "ops").await.unwrap(),
        RecordAction::Done(_)
    ));
    assert!(s.get(&job.scope, &job.key).await.unwrap().is_none());
    assert!(matches!(
        s.evict(&now, "ops").await.unwrap(),
        RecordAction::Missing
    ));

    let log = s.audit_log(10).await.unwrap();
    let actions: Vec<&str> = log.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["evict", "release", "discard", "archive"],
        "newest first"
    );
    assert!(log.iter().all(|e| e.actor == "ops"));
}
