//! Kafka end to end: an HTTP request with `Idempotency-Key` → an atomic
//! handler that writes the order and enqueues its event in the outbox → the
//! relay, with the idempotent producer → Kafka → the effectively-once
//! consumer. Duplicates are injected at every hop (the client retries, the
//! relay dies after Kafka confirmed and sends again, a producer repeats the
//! record); the key is the same at every hop and the effects happen once.
//! Also: what the Kafka publisher puts on a record, and the producer settings
//! it refuses.

mod consumer_support;
mod outbox_support;

use std::time::Duration;

use consumer_support::shipments::ship;
use consumer_support::{Broker, Kafka};
use idem::IdempotencyKey;
use idem_broker::consume::Transport;
use idem_broker::publish::{self, Destination, Message, Publish, PublishErrorKind};
use outbox_support::checkout::Checkout;
use outbox_support::sqlite;

fn destination(kafka: &Kafka, query: &str) -> Destination {
    format!("kafka://{}/{}{query}", kafka.brokers, kafka.topic)
        .parse()
        .expect("a kafka destination")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flows_from_http_through_the_outbox_and_kafka_to_the_consumer() {
    let Some(kafka) = Kafka::with_partitions(2).await else {
        return;
    };

    // Hop 1: the HTTP service writes the order and enqueues its event in one
    // transaction, keyed from the request's key. The client sends it 3 times.
    let checkout =
        Checkout::ordered(destination(&kafka, "?record_key=key"), b"{\"amount\": 10}").await;

    // Hop 2: the relay dies after Kafka confirmed the record, before marking
    // the row sent; the next relay sends it again.
    checkout.relay_dying_after_publish().await;
    // And a producer elsewhere repeats it once more.
    kafka
        .publish(Some("checkout-1/order-created"), b"{\"amount\": 10}")
        .await;

    // Hop 3: the consumer applies under the idempotency-key header.
    let (_consumer_dir, shipments) = sqlite(&checkout.clock).await;
    let (stats, keys) = ship(&kafka, &shipments, 3, Duration::ZERO).await;
    assert_eq!((stats.applied, stats.replayed), (1, 2), "{stats:?}");
    assert_eq!(keys, ["checkout-1/order-created"], "one effect, same key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sends_the_key_as_a_header_and_the_record_key_on_request() {
    let Some(kafka) = Kafka::with_partitions(1).await else {
        return;
    };
    let publisher = publish::connect(&destination(&kafka, "?record_key=header:order-id"))
        .await
        .expect("connect");
    let message = Message::new(IdempotencyKey::new("order-7/paid").unwrap(), b"{}".to_vec())
        .with_header("order-id", "order-7");
    publisher.publish(&message).await.expect("confirmed");

    let mut transport = kafka.transport().await;
    let delivery = tokio::time::timeout(Duration::from_secs(30), transport.receive())
        .await
        .expect("a record within 30 s")
        .expect("receive")
        .expect("a record");
    assert_eq!(delivery.message.message_id.as_deref(), Some("order-7/paid"));
    assert_eq!(delivery.message.header("order-id"), Some("order-7"));
    assert_eq!(
        delivery.message.record_key.as_deref(),
        Some(b"order-7".as_slice())
    );
    assert_eq!(
        delivery.message.coordinates.as_deref(),
        Some(format!("{}/0/0", kafka.topic).as_str())
    );
    transport.close().await;

    for unsafe_setting in ["acks=1", "enable.idempotence=false", "max.in.flight=10"] {
        let error = publish::connect(&destination(&kafka, &format!("?{unsafe_setting}")))
            .await
            .expect_err(unsafe_setting);
        assert_eq!(error.kind(), PublishErrorKind::Config, "{error}");
        let name = unsafe_setting.split('=').next().unwrap();
        assert!(error.to_string().contains(name), "{error}");
    }
    let missing = publish::connect(
        &"kafka://127.0.0.1:9092/idem-t-no-such-topic"
            .parse::<Destination>()
            .unwrap(),
    )
    .await
    .expect_err("no such topic");
    assert!(missing.to_string().contains("no topic"), "{missing}");
}
