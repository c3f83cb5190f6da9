//! The facade's `AnyStore` on a DynamoDB table: opened from a
//! `dynamodb+http://` location, leased mode and the records through the
//! shared traits, atomic effects through the DynamoDB store inside it, and
//! the calls that need an SQL store (atomic mode with an SQL connection, the
//! outbox, fencing leases) refused with an explanation.

mod common;
mod effects;

use std::sync::Arc;
use std::time::Duration;

use effects::{counter, create_id_table};
use idem::dynamodb::Transaction;
use idem::{
    AnyStore, Applied, ApplyError, AtomicStore, ErrorKind, FenceStore, Fingerprint, IdempotencyKey,
    LeaseStore, ManualClock, OutboxMessage, OutboxStore, Outcome, RecordStore, Resource, Scope,
    Settings, StoreLocation,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_store_serves_a_dynamodb_table_and_refuses_the_sql_calls() {
    if !common::moto_answers() {
        return;
    }
    let table = common::unique_table("any");
    let location: StoreLocation = common::url_of(&table).parse().unwrap();
    assert!(matches!(location, StoreLocation::DynamoDb(_)));
    assert!(!location.offers_atomic_mode());
    let clock = ManualClock::starting_now();
    let store = AnyStore::open_with(&location, Settings::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    let AnyStore::DynamoDb(dynamo) = &store else {
        panic!("a DynamoDB location opens the DynamoDB store");
    };
    let effects = format!("{table}-effects");
    create_id_table(dynamo, &effects).await;

    // Atomic effects through the DynamoDB store; the record is read back
    // through AnyStore.
    let (scope, key) = (
        Scope::new("payments").unwrap(),
        IdempotencyKey::new("p-1").unwrap(),
    );
    for _ in 0..3 {
        let effects = effects.clone();
        let applied = dynamo
            .apply(
                &scope,
                &key,
                Fingerprint::of_bytes(b"10"),
                async move |tx: &mut Transaction| {
                    tx.update(effects::add(&effects, "alice", 10));
                    Ok::<_, String>(Outcome::success("debited"))
                },
            )
            .await
            .unwrap();
        assert_eq!(applied.outcome().body, b"debited");
    }
    assert_eq!(counter(dynamo, &effects, "alice").await, 10);
    let record = store.get(&scope, &key).await.unwrap().unwrap();
    assert!(record.state.is_settled());

    // Leased mode, as on every store.
    let leased = store
        .apply_leased(
            &scope,
            &IdempotencyKey::new("p-2").unwrap(),
            Fingerprint::of_bytes(b"x"),
            async |_claim| Ok::<_, String>(Outcome::success("sent")),
        )
        .await
        .unwrap();
    assert!(matches!(leased, Applied::Fresh(_)));

    // Through AnyStore, whose effects get an SQL connection, atomic mode is
    // refused before anything is written; so are the outbox and fences.
    let refused = store
        .apply(
            &scope,
            &IdempotencyKey::new("p-3").unwrap(),
            Fingerprint::of_bytes(b"1"),
            async |_tx| Ok::<_, String>(Outcome::success("never")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ApplyError::Protocol(idem::Error::Store(e)) if e.kind() == ErrorKind::Config),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("DynamoDB store's own apply"),
        "{refused}"
    );
    assert!(
        store
            .get(&scope, &IdempotencyKey::new("p-3").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert!(!store.offers_atomic_mode());
    let refusal = store.require_atomic_mode("idem relay").unwrap_err();
    assert!(
        refusal.to_string().contains("needs an SQL store"),
        "{refusal}"
    );
    let outbox = store
        .enqueue_now(&OutboxMessage {
            destination: None,
            key: IdempotencyKey::new("m-1").unwrap(),
            payload: b"{}".to_vec(),
            headers: Default::default(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&outbox, idem::Error::Store(e) if e.kind() == ErrorKind::Config),
        "{outbox}"
    );
    let fence = store
        .acquire(&Resource::new("printer").unwrap(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(fence.to_string().contains("DynamoDB"), "{fence}");
}
