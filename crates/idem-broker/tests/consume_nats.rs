//! The consumer runtime against the real NATS JetStream, on SQLite and
//! PostgreSQL: each test creates a stream of its own and deletes it after.

mod consumer_support;

use consumer_support::Jet;

consumer_tests!(Jet);

/// With the default key rule the key is `Nats-Msg-Id`; JetStream drops a
/// repeat inside its window (a second line of dedupe), and a redelivery
/// (`-NAK`) is suppressed by the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_msg_id_is_the_default_key() {
    use std::time::Duration;

    use consumer_support::{Bank, Broker, Running, SqliteBank, config};
    use idem_broker::consume::{Consumer, KeyRule, Settle, Transport};

    let Some(broker) = Jet::start().await else {
        return;
    };
    let bank = SqliteBank::start().await.expect("sqlite");
    broker
        .publish_with_msg_id("msg-1", br#"{"amount": 3}"#)
        .await;
    broker
        .publish_with_msg_id("msg-1", br#"{"amount": 3}"#)
        .await;
    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(KeyRule::default()),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running.until("applied", |s| s.applied >= 1).await;
    running.stop().await;
    assert_eq!(bank.ledger().await, ["msg-1"]);

    // Nothing else is waiting: the stream kept one copy.
    let mut transport = broker.transport().await;
    let more = tokio::time::timeout(Duration::from_millis(500), transport.receive()).await;
    if let Ok(Ok(Some(extra))) = more {
        extra.settle.ack().await.expect("ack");
        panic!("JetStream delivered a second copy: {:?}", extra.message);
    }
}
