//! The consumer runtime against the real NATS JetStream, on SQLite and
//! PostgreSQL: each test creates a stream of its own and deletes it after.

mod consumer_support;

use consumer_support::Jet;

consumer_tests!(Jet);

/// A fingerprint rule on the consumer, on each store: a copy differing only in
/// an ignored field is a duplicate, one differing in the amount is key reuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_rule_decides_duplicates_on_sqlite() {
    consumer_support::scenarios::fingerprint_rule::<Jet, consumer_support::SqliteBank>().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_rule_decides_duplicates_on_postgres() {
    consumer_support::scenarios::fingerprint_rule::<Jet, consumer_support::PgBank>().await
}

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

/// A stream that keeps messages forever (JetStream's default max age) can
/// hand a new durable consumer every message ever published: longer than the
/// dedupe window, so the consumer refuses to start and names the stream, until
/// the caller promises no such replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_kept_forever_stops_the_start_unless_replays_are_promised_away() {
    use std::time::Duration;

    use consumer_support::{Bank, Broker, Running, SqliteBank, config};
    use idem_broker::consume::{ConsumeError, Consumer};

    let Some(forever) = Jet::with_max_age(Duration::ZERO).await else {
        return;
    };
    let bank = SqliteBank::start().await.expect("sqlite");
    forever.publish(Some("order-1"), br#"{"amount": 1}"#).await;
    let refused = Consumer::new(
        forever.transport().await,
        bank.apply(false),
        config(forever.key_rule()),
    )
    .run(std::future::pending())
    .await;
    match refused {
        Err(error @ ConsumeError::ReplayBeyondWindow { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains(&format!("stream {}", forever.stream))
                    && message.contains("keeps messages (forever)")
                    && message.contains("duplicate window 2m"),
                "{message}"
            );
        }
        other => panic!("expected ReplayBeyondWindow, got {other:?}"),
    }
    assert!(bank.ledger().await.is_empty());

    let promised = Consumer::new(
        forever.transport().await,
        bank.apply(false),
        config(forever.key_rule()).allow_replays_beyond_window(true),
    );
    let running = Running::start(promised.stats(), |stop| promised.run(stop));
    running.until("applied", |s| s.applied >= 1).await;
    running.stop().await;
    assert_eq!(bank.ledger().await, ["order-1"]);
}

/// The connection is cut under the consumer: it connects again by itself,
/// says so to the health while it is down, and applies every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_across_a_connection_cut() {
    consumer_support::cuts::consumes_across_a_cut::<
        consumer_support::Jet,
        consumer_support::SqliteBank,
    >()
    .await
}

/// The same in batch mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_batches_across_a_connection_cut() {
    consumer_support::cuts::consumes_batches_across_a_cut::<
        consumer_support::Jet,
        consumer_support::SqliteBank,
    >()
    .await
}
