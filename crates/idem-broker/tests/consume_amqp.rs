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

/// The same in batch mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_batches_across_a_connection_cut() {
    consumer_support::cuts::consumes_batches_across_a_cut::<Rabbit, consumer_support::SqliteBank>()
        .await
}

/// The same on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_across_a_connection_cut_on_postgres() {
    consumer_support::cuts::consumes_across_a_cut::<Rabbit, consumer_support::PgBank>().await
}

/// What connecting again cannot fix stops the consumer at once, saying what
/// to change: a queue that does not exist, credentials RabbitMQ refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_or_refused_credentials_are_not_retried() {
    use consumer_support::Broker;
    use idem_broker::consume::{Source, SourceOptions, TransportErrorKind};

    let Some(broker) = Rabbit::start().await else {
        return;
    };
    let reconnect = consumer_support::cuts::quick();
    let missing: Source = format!(
        "{}/no-such-queue-{}",
        broker.url,
        consumer_support::suffix()
    )
    .replace("/%2f/", "/")
    .parse()
    .unwrap();
    let error = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        missing.connect_reconnecting(SourceOptions::default(), reconnect),
    )
    .await
    .expect("a missing queue is not waited for")
    .unwrap_err();
    assert_eq!(error.kind(), TransportErrorKind::Missing, "{error:?}");
    assert!(
        idem_core::error_chain(&error).contains("declare it"),
        "{error:?}"
    );

    let refused: Source = format!(
        "amqp://guest:wrong-password@{}/{}",
        consumer_support::cuts::address(&broker.url),
        broker.queue
    )
    .parse()
    .unwrap();
    let error = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        refused.connect_reconnecting(SourceOptions::default(), reconnect),
    )
    .await
    .expect("refused credentials are not retried")
    .unwrap_err();
    assert_eq!(error.kind(), TransportErrorKind::Refused, "{error:?}");
}

/// A node of a list that takes the TCP connection and then says nothing is
/// given up after its bound, and the next node is connected to within the
/// same attempt: without the bound every attempt would end on the silent
/// node and the consumer would never connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_of_a_list_gives_way_to_the_next() {
    use consumer_support::Broker;
    use idem_broker::consume::{Source, SourceOptions};

    let Some(broker) = Rabbit::start().await else {
        return;
    };
    // Takes connections and never answers; holds them until the test ends.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("address");
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            kept.push(socket);
        }
    });
    let source: Source = format!(
        "amqp://guest:guest@{silent_addr},{}/{}?connection_timeout=1000",
        consumer_support::cuts::address(&broker.url),
        broker.queue
    )
    .parse()
    .unwrap();
    let connected = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        source.connect_reconnecting(SourceOptions::default(), consumer_support::cuts::quick()),
    )
    .await
    .expect("the next node is tried within the attempt");
    assert!(connected.is_ok(), "{:?}", connected.err());
    held.abort();
}

/// An effect that hangs holds its delivery for ever; the watchdog notices
/// that nothing was settled for its limit, restarts the consumer on a new
/// connection, and the broker's redelivery is applied: one effect per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_restarts_a_consumer_stuck_in_an_effect() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use consumer_support::cuts::Cuttable;
    use consumer_support::{Bank, Broker, Running, SqliteBank, config};
    use idem::ApplyError;
    use idem_broker::consume::{Apply, Consumer, KeyedMessage};

    /// The bank's effect, except that the first delivery of `stuck` never ends.
    struct HangsOnce<A> {
        inner: A,
        hung: AtomicBool,
    }

    impl<A: Apply> Apply for HangsOnce<A> {
        type Error = A::Error;
        type Store = A::Store;

        fn store(&self) -> &A::Store {
            self.inner.store()
        }

        async fn apply(
            &self,
            message: Arc<KeyedMessage>,
        ) -> Result<idem::Applied, ApplyError<A::Error>> {
            if message.key.as_str() == "stuck" && !self.hung.swap(true, Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.inner.apply(message).await
        }
    }

    let Some(broker) = Rabbit::start().await else {
        return;
    };
    let bank = SqliteBank::start().await.expect("sqlite");
    let proxy = idem_testkit::faultproxy::FaultProxy::start(broker.server())
        .await
        .unwrap();
    let transport = broker
        .reconnecting(
            proxy.addr(),
            format!("watchdog-{}", consumer_support::suffix()),
        )
        .await;
    let effect = HangsOnce {
        inner: bank.apply(false),
        hung: AtomicBool::new(false),
    };
    let consumer = Consumer::new(
        transport,
        effect,
        config(broker.key_rule())
            .concurrency(1)
            .watchdog(Duration::from_millis(500)),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    broker.publish(Some("stuck"), br#"{"amount": 1}"#).await;
    for i in 0..3 {
        broker
            .publish(Some(&format!("after-{i}")), br#"{"amount": 1}"#)
            .await;
    }
    running
        .until("the stuck message and the rest applied", |s| s.applied >= 4)
        .await;
    running.stop().await;
    let ledger = bank.ledger().await;
    assert_eq!(ledger, ["after-0", "after-1", "after-2", "stuck"]);
}

/// RabbitMQ itself closes the consumer's connection (`rabbitmqctl
/// close_connection`, the broker's `CONNECTION_FORCED`): the consumer
/// connects again and applies what is published afterwards, once per key.
/// Skipped where `rabbitmqctl` cannot reach the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_after_the_broker_closes_its_connection() {
    use std::process::Command;

    use consumer_support::{Bank, Broker, Running, SqliteBank, config};
    use idem_broker::consume::{Consumer, Reconnecting};

    /// The `pid`s of the connections named `name`, as `rabbitmqctl` lists them.
    fn connections(name: &str) -> Option<Vec<String>> {
        let out = Command::new("rabbitmqctl")
            .args(["-s", "list_connections", "pid", "client_properties"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|line| line.contains(name))
                .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
                .collect(),
        )
    }

    let Some(broker) = Rabbit::start().await else {
        return;
    };
    let bank = SqliteBank::start().await.expect("sqlite");
    let (url, queue) = (broker.url.clone(), broker.queue.clone());
    let transport = Reconnecting::connect("forced", consumer_support::cuts::quick(), move || {
        let (url, queue) = (url.clone(), queue.clone());
        async move { idem_broker::consume::AmqpTransport::connect(&url, &queue, 32).await }
    })
    .await
    .unwrap();
    let name = format!("idem consumer of {}", broker.queue);
    let Some(pids) = connections(&name) else {
        eprintln!("SKIPPED: rabbitmqctl cannot list the broker's connections here");
        return;
    };
    assert_eq!(
        pids.len(),
        1,
        "the consumer's connection is listed: {pids:?}"
    );
    let consumer = Consumer::new(transport, bank.apply(false), config(broker.key_rule()));
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    broker.publish(Some("before"), br#"{"amount": 1}"#).await;
    running.until("the first applied", |s| s.applied >= 1).await;

    let closed = Command::new("rabbitmqctl")
        .args(["-q", "close_connection", &pids[0], "closed by the test"])
        .status()
        .expect("run rabbitmqctl");
    assert!(closed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = connections(&name).unwrap_or_default();
        if now.len() == 1 && now[0] != pids[0] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer never connected again: {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    for i in 0..5 {
        broker
            .publish(Some(&format!("after-{i}")), br#"{"amount": 1}"#)
            .await;
    }
    running.until("all six applied", |s| s.applied >= 6).await;
    running.stop().await;
    assert_eq!(
        bank.ledger().await,
        [
            "after-0", "after-1", "after-2", "after-3", "after-4", "before"
        ]
    );
}
