//! The publishers on their own, against the real brokers: the key travels as
//! `message_id` / `Nats-Msg-Id`, confirmations are awaited, and failures say
//! whether a retry can help.

mod outbox_support;

use idem::IdempotencyKey;
use idem_broker::publish::{self, Destination, Message, Publish, PublishErrorKind};
use outbox_support::{AMQP_URL, NATS_URL, Nats, Rabbit, unique};

fn message(key: &str) -> Message {
    Message::new(IdempotencyKey::new(key).unwrap(), b"body".to_vec()).with_header("trace", "t-1")
}

#[tokio::test]
async fn amqp_publishes_with_message_id_and_reports_unroutable_messages_as_not_taken() {
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let publisher = publish::connect(&Rabbit::destination(&queue))
        .await
        .unwrap();
    publisher.publish(&message("amqp-key-1")).await.unwrap();
    publisher.publish(&message("amqp-key-1")).await.unwrap();
    let received = rabbit.drain(&queue).await;
    assert_eq!(
        received.len(),
        2,
        "RabbitMQ does not dedupe: the consumer must"
    );
    assert!(
        received
            .iter()
            .all(|r| r.message_id.as_deref() == Some("amqp-key-1"))
    );

    let nowhere: Destination = format!("{AMQP_URL}?queue={}", unique("no_such_queue"))
        .parse()
        .unwrap();
    let error = publish::connect(&nowhere)
        .await
        .unwrap()
        .publish(&message("k"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), PublishErrorKind::NotTaken, "{error}");
    assert!(error.is_retryable());
    assert!(error.to_string().contains("NO_ROUTE"), "{error}");
}

#[tokio::test]
async fn nats_publishes_with_nats_msg_id_and_the_stream_drops_the_duplicate() {
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let publisher = publish::connect(&Nats::destination(&subject))
        .await
        .unwrap();
    publisher.publish(&message("nats-key-1")).await.unwrap();
    publisher.publish(&message("nats-key-1")).await.unwrap();
    let stored = nats.messages(&stream).await;
    assert_eq!(
        stored.len(),
        1,
        "JetStream's duplicate window dropped the second"
    );
    assert_eq!(stored[0].msg_id.as_deref(), Some("nats-key-1"));

    let nowhere: Destination = format!("{NATS_URL}/{}.nothing", unique("no_stream"))
        .parse()
        .unwrap();
    let error = publish::connect(&nowhere)
        .await
        .unwrap()
        .publish(&message("k"))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
}

#[tokio::test]
async fn an_unreachable_destination_is_unavailable_and_retryable() {
    for text in [
        "amqp://guest:guest@127.0.0.1:1/%2f?queue=q",
        "nats://127.0.0.1:1/a.b",
    ] {
        let error = publish::connect(&text.parse().unwrap()).await.unwrap_err();
        assert_eq!(
            error.kind(),
            PublishErrorKind::Unavailable,
            "{text}: {error}"
        );
        assert!(error.is_retryable());
        assert!(!error.to_string().contains("guest:guest"), "{error}");
    }
    let http = publish::connect(&"http://127.0.0.1:1/hook".parse().unwrap())
        .await
        .unwrap();
    let error = http.publish(&message("k")).await.unwrap_err();
    assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error}");
}
