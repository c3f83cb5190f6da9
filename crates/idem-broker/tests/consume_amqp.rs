//! The consumer runtime against the real RabbitMQ, on SQLite and PostgreSQL:
//! each test declares a queue of its own and deletes it after.

mod consumer_support;

use consumer_support::Rabbit;

consumer_tests!(Rabbit);

/// On a quorum queue RabbitMQ counts deliveries (`x-delivery-count`); the
/// poison message is dead-lettered after 5 of them all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queue_delivery_count_dead_letters_after_five() {
    use consumer_support::{Bank, Broker, Running, SqliteBank, config};
    use idem_broker::consume::Consumer;
    use idem_broker::dead_letter::DeadLetterStore;

    let Some(broker) = Rabbit::declare("quorum").await else {
        return;
    };
    let bank = SqliteBank::start().await.expect("sqlite");
    broker
        .publish(Some("poison-q"), br#"{"amount": 7, "poison": true}"#)
        .await;
    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let stats = running
        .until("dead-lettered", |s| s.dead_lettered >= 1)
        .await;
    running.stop().await;
    assert_eq!(stats.requeued, 4, "{stats:?}");
    let letters = bank
        .store()
        .list_dead_letters(10, false)
        .await
        .expect("list");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].key.as_str(), "poison-q");
    assert_eq!(letters[0].attempts, 5);
}

/// The connection is cut under the consumer: it connects again by itself,
/// says so to the health while it is down, and applies every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_across_a_connection_cut() {
    consumer_support::cuts::consumes_across_a_cut::<Rabbit, consumer_support::SqliteBank>().await
}

/// The same on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_across_a_connection_cut_on_postgres() {
    consumer_support::cuts::consumes_across_a_cut::<Rabbit, consumer_support::PgBank>().await
}
