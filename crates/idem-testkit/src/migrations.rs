//! Checks that a store reads back, after its migrations, the rows an earlier
//! version of its outbox, dead-letter and attempt tables held. Each store's
//! test writes those rows in its own SQL, migrates, and calls
//! [`earlier_rows_read_back`].

use std::time::Duration;

use idem_core::{AttemptStore, DeadLetterStore, IdempotencyKey, OutboxStore, Scope, Timestamp};

/// The rows every store's migration test seeds in the earlier tables, read
/// back through the store's API: one pending outbox message (`order-1/created`,
/// created at 1000, header `tenant: 7`), one dead letter (`order-0/created`
/// for `http://127.0.0.1:9/hook`), and a consumer's key `ledger/poison-1`
/// with two failures since 500 (so the next is the third).
pub async fn earlier_rows_read_back<S>(store: &S)
where
    S: OutboxStore + DeadLetterStore + AttemptStore,
{
    let claimed = store
        .claim_outbox(
            "relay-a",
            Timestamp(2_000),
            Duration::from_secs(30),
            10,
            true,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let row = &claimed[0];
    assert_eq!(row.message.key.as_str(), "order-1/created");
    assert_eq!(row.message.payload, b"{}");
    assert_eq!(
        row.message.headers.get("tenant").map(String::as_str),
        Some("7")
    );
    assert_eq!((row.attempts, row.created_at), (1, Timestamp(1000)));

    let letters = store.list_dead_letters(10, false).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].key.as_str(), "order-0/created");
    assert_eq!(letters[0].destination, "http://127.0.0.1:9/hook");

    let failures = store
        .record_failure(
            &Scope::new("ledger").unwrap(),
            &IdempotencyKey::new("poison-1").unwrap(),
            "boom again",
        )
        .await
        .unwrap();
    assert_eq!((failures.count, failures.first_at), (3, Timestamp(500)));
}
