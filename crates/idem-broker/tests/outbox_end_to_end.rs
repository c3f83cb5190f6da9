//! End to end through the outbox: an HTTP request with `Idempotency-Key` →
//! an atomic handler that writes the order and enqueues a message keyed from
//! the request's key → the relay → RabbitMQ → a deduping consumer. Duplicates
//! are injected at every hop (the client retries, the relay dies after the
//! broker confirmed, the broker redelivers); each hop sees the same key and the
//! effects happen once.

mod outbox_support;

use idem::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, RecordStore, Scope};
use outbox_support::checkout::{Checkout, count};
use outbox_support::{Rabbit, sqlite};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flows_from_http_through_the_outbox_and_broker_to_the_consumer() {
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;

    // Hop 1: the HTTP service. Its handler writes the order and enqueues the
    // event in the same transaction, keyed from the request's key; the
    // client sends the request three times.
    let checkout = Checkout::ordered(Rabbit::destination(&queue), b"{\"sku\":\"tea\"}").await;
    let outbox_key: String = checkout
        .store
        .with_connection(|c| c.query_row("SELECT key FROM idem_outbox", [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outbox_key, "checkout-1/order-created");

    // Hop 2: the relay dies after the broker confirmed; the next one sends again.
    checkout.relay_dying_after_publish().await;
    let received = rabbit.drain(&queue).await;
    assert_eq!(received.len(), 2);

    // Hop 3: the consumer, which also sees every delivery twice (a redelivery
    // after a lost ack), applies under the message_id.
    let (_consumer_dir, consumer) = sqlite(&checkout.clock).await;
    let scope = Scope::new("order-events").unwrap();
    let mut fresh = 0;
    for delivery in received.iter().chain(received.iter()) {
        let message_id = delivery.message_id.clone().expect("message_id");
        let key = IdempotencyKey::new(message_id).unwrap();
        let applied = consumer
            .apply(
                &scope,
                &key,
                Fingerprint::of_bytes(&delivery.payload),
                async |tx| -> idem::rusqlite::Result<Outcome> {
                    tx.execute_batch(
                        "CREATE TABLE IF NOT EXISTS shipments (n INTEGER); INSERT INTO shipments VALUES (1);",
                    )?;
                    Ok(Outcome::success("shipped"))
                },
            )
            .await
            .unwrap();
        fresh += usize::from(!applied.is_replay());
    }
    assert_eq!(fresh, 1);
    assert_eq!(count(&consumer, "SELECT count(*) FROM shipments").await, 1);
    let record = RecordStore::get(
        &consumer,
        &scope,
        &IdempotencyKey::new("checkout-1/order-created").unwrap(),
    )
    .await
    .unwrap();
    assert!(record.is_some(), "the consumer deduped on the same key");
}
