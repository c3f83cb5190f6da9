//! SQS end to end: an HTTP request with `Idempotency-Key` → an atomic
//! handler that writes the order and enqueues its event in the outbox → the
//! relay → an SQS queue (moto's server) → the effectively-once consumer.
//! Duplicates are injected at every hop (the client retries, the relay dies
//! after SQS accepted the message and sends again, a producer repeats it);
//! the key is the same at every hop and the effects happen once. Also: what
//! the SQS publisher puts on a message, on a standard and a FIFO queue.

mod consumer_support;
mod outbox_support;

use std::time::Duration;

use consumer_support::shipments::ship;
use consumer_support::{Broker, Sqs};
use idem::IdempotencyKey;
use idem_broker::consume::Transport;
use idem_broker::publish::{self, Destination, Message, Publish};
use outbox_support::checkout::Checkout;
use outbox_support::sqlite;

fn destination(queue: &Sqs, query: &str) -> Destination {
    let joiner = if query.is_empty() { "" } else { "&" };
    format!("{}{joiner}{query}", queue.url)
        .parse()
        .expect("an sqs destination")
}

/// The HTTP service, the outbox and a relay that dies after SQS accepted the
/// message; then the consumer. Returns the consumer's (applied, replayed)
/// and the keys of its effects.
async fn through_the_outbox(
    queue: &Sqs,
    to: Destination,
    repeat: bool,
) -> ((u64, u64), Vec<String>) {
    // Hop 1: the HTTP service writes the order and enqueues its event in one
    // transaction, keyed from the request's key. The client sends it 3 times.
    let checkout = Checkout::ordered(to, b"{\"amount\": 10}").await;

    // Hop 2: the relay dies after SQS accepted the message, before marking
    // the row sent; the next relay sends it again.
    checkout.relay_dying_after_publish().await;
    if repeat {
        // And a producer elsewhere repeats it once more.
        queue
            .publish(Some("checkout-1/order-created"), b"{\"amount\": 10}")
            .await;
    }

    // Hop 3: the consumer applies under the idempotency-key attribute;
    // anything more the queue would hand out arrives within a poll.
    let (_consumer_dir, shipments) = sqlite(&checkout.clock).await;
    let copies = if repeat { 3 } else { 1 };
    let (stats, keys) = ship(queue, &shipments, copies, Duration::from_millis(1500)).await;
    ((stats.applied, stats.replayed), keys)
}

/// A standard queue keeps every copy: the relay's two sends and the
/// producer's repeat reach the consumer, which applies one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flows_from_http_through_the_outbox_and_sqs_to_the_consumer() {
    let Some(queue) = Sqs::start().await else {
        return;
    };
    let to = destination(&queue, "");
    let (counts, keys) = through_the_outbox(&queue, to, true).await;
    assert_eq!(counts, (1, 2), "one applied, two answered from the record");
    assert_eq!(keys, ["checkout-1/order-created"], "one effect, same key");
    assert_eq!(queue.depth().await, (0, 0));
}

/// A FIFO queue drops the relay's second send (the same deduplication id,
/// the key, within five minutes): one copy reaches the consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_drops_the_relays_second_send_within_its_five_minutes() {
    let Some(queue) = Sqs::create(true, &[]).await else {
        return;
    };
    let to = destination(&queue, "group=orders");
    let (counts, keys) = through_the_outbox(&queue, to, false).await;
    assert_eq!(counts, (1, 0), "the queue kept one copy");
    assert_eq!(keys, ["checkout-1/order-created"]);
    assert_eq!(queue.depth().await, (0, 0));
}

/// The key travels as the `idempotency-key` attribute; on a FIFO queue also
/// as the deduplication id, and the group comes from a header when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sends_the_key_as_an_attribute_and_the_fifo_ids() {
    let Some(queue) = Sqs::create(true, &[]).await else {
        return;
    };
    let publisher = publish::connect(&destination(&queue, "group=header%3Aorder-id"))
        .await
        .expect("connect");
    let message = Message::new(IdempotencyKey::new("order-7/paid").unwrap(), b"{}".to_vec())
        .with_header("order-id", "order-7");
    publisher.publish(&message).await.expect("accepted");

    let mut transport = queue.transport().await;
    let delivery = tokio::time::timeout(Duration::from_secs(10), transport.receive())
        .await
        .expect("a message within 10 s")
        .expect("receive")
        .expect("a message");
    assert_eq!(delivery.message.message_id.as_deref(), Some("order-7/paid"));
    assert_eq!(delivery.message.header("order-id"), Some("order-7"));
    assert_eq!(delivery.message.header("MessageGroupId"), Some("order-7"));
    assert_eq!(
        delivery.message.header("MessageDeduplicationId"),
        Some("order-7/paid")
    );
    assert_eq!(delivery.message.delivery_count, Some(1));
    assert!(
        delivery
            .message
            .coordinates
            .as_deref()
            .is_some_and(|c| c.starts_with(&format!("{}/", queue.queue))),
        "{:?}",
        delivery.message.coordinates
    );
    transport.close().await;

    let binary = Message::new(IdempotencyKey::new("bin-1").unwrap(), vec![0xff, 0xfe]);
    let error = publisher.publish(&binary).await.expect_err("not text");
    assert_eq!(
        error.kind(),
        idem_broker::publish::PublishErrorKind::Rejected,
        "{error}"
    );
    let missing = publish::connect(
        &consumer_support::sqs::queue_url("idem-t-no-such-queue")
            .parse::<Destination>()
            .unwrap(),
    )
    .await
    .expect_err("no such queue");
    assert!(
        missing.to_string().contains("idem-t-no-such-queue"),
        "{missing}"
    );
}
