//! The consumer runtime against a real Kafka-protocol broker, on SQLite and
//! PostgreSQL: each test creates a topic and a consumer group of its own.

mod consumer_support;

use consumer_support::Kafka;

consumer_tests!(Kafka);

mod window {
    //! A topic's retention is how far back a replay (an offset reset, a new
    //! consumer group) can reach: longer than the dedupe window, and a
    //! replayed record would be applied again.

    use idem_broker::consume::{ConsumeError, Consumer};

    use super::consumer_support::{Bank, Broker, Kafka, Running, SqliteBank, config};

    const EIGHT_DAYS_MS: &str = "691200000";
    const ONE_HOUR_MS: &str = "3600000";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_kept_longer_than_the_window_stops_the_start_and_a_shorter_one_runs() {
        let Some(long) = Kafka::create(1, &[("retention.ms", EIGHT_DAYS_MS)]).await else {
            return;
        };
        let bank = SqliteBank::start().await.expect("sqlite");
        long.publish(Some("order-1"), br#"{"amount": 1}"#).await;
        let refused = Consumer::new(
            long.transport().await,
            bank.apply(false),
            config(long.key_rule()),
        )
        .run(std::future::pending())
        .await;
        match refused {
            Err(error @ ConsumeError::ReplayBeyondWindow { .. }) => {
                let message = error.to_string();
                assert!(
                    message.contains("7days")
                        && message.contains("8days")
                        && message.contains(&long.topic),
                    "{message}"
                );
            }
            other => panic!("expected ReplayBeyondWindow, got {other:?}"),
        }
        assert!(bank.ledger().await.is_empty());

        // The caller's promise that nothing older than the window is replayed.
        let promised = Consumer::new(
            long.transport().await,
            bank.apply(false),
            config(long.key_rule()).allow_replays_beyond_window(true),
        );
        let running = Running::start(promised.stats(), |stop| promised.run(stop));
        running.until("applied", |s| s.applied >= 1).await;
        running.stop().await;

        let short = Kafka::create(1, &[("retention.ms", ONE_HOUR_MS)])
            .await
            .expect("kafka");
        short.publish(Some("order-2"), br#"{"amount": 1}"#).await;
        let fits = Consumer::new(
            short.transport().await,
            bank.apply(false),
            config(short.key_rule()),
        );
        let running = Running::start(fits.stats(), |stop| fits.run(stop));
        running.until("applied", |s| s.applied >= 1).await;
        running.stop().await;
        assert_eq!(bank.ledger().await, ["order-1", "order-2"]);
    }
}

mod rebalance {
    //! The rebalance that hands processed-but-uncommitted records to another
    //! consumer. Consumer A (a child process) applies a batch, commits it in
    //! the database, and is frozen (SIGSTOP) before it commits the offsets:
    //! its heartbeats stop, the group evicts it after the session timeout,
    //! and consumer B reads the topic again from the last commit. Every
    //! effect happens once; the re-read records are answered from the store
    //! and counted by `duplicates_suppressed_total`.

    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::Duration;

    use idem_broker::consume::{Checkpoint, Consumer, KafkaOptions};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::consumer_support::{Bank, Broker, Kafka, OPENING_BALANCE, PgBank, Running, config};

    const RECORDS: usize = 200;
    const BATCH: usize = 50;
    const MARKER: &str = "IDEM-BATCH-COMMITTED";

    fn batch_options() -> KafkaOptions {
        KafkaOptions {
            per_partition: BATCH,
            commit_interval: Duration::from_millis(20),
            settings: idem_broker::kafka::Settings::new().set("max.poll.interval.ms", "7000"),
            ..KafkaOptions::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_evicted_after_its_commit_hands_its_records_over_and_they_apply_once() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _ = recorder.install();

        let Some(broker) = Kafka::with_partitions(2).await else {
            return;
        };
        let Some(bank) = PgBank::start().await else {
            return;
        };
        for i in 0..RECORDS {
            broker
                .publish(Some(&format!("r-{i:03}")), br#"{"amount": 1}"#)
                .await;
        }

        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe);
        child
            .args([
                "--exact",
                "rebalance::child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IDEM_T_REBALANCE_STORE", bank.location())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in broker.env() {
            child.env(name, value);
        }
        let mut child = child.spawn().expect("start consumer A");
        let stdout = child.stdout.take().expect("piped stdout");
        let (seen_tx, seen_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains(MARKER) {
                    let _ = seen_tx.send(());
                }
            }
        });
        let committed = seen_rx.recv_timeout(Duration::from_secs(120));
        // Frozen, as by a long pause: no more polls, no more heartbeats.
        let frozen = Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .expect("SIGSTOP consumer A");
        assert!(frozen.success());
        committed.expect("consumer A never committed a batch");

        let applied_by_a = bank.ledger().await.len();
        assert!(
            applied_by_a > 0 && applied_by_a < RECORDS,
            "A applied {applied_by_a} records before it was frozen"
        );

        let consumer = Consumer::new(
            broker.transport_with(batch_options()).await,
            bank.apply(false),
            config(broker.key_rule()).batch(BATCH, Duration::from_millis(50)),
        );
        let running = Running::start(consumer.stats(), |stop| consumer.run_batched(stop));
        let stats = running
            .until("every record settled by B", |s| {
                (s.applied + s.replayed) as usize >= RECORDS
            })
            .await;
        running.stop().await;
        child.kill().expect("SIGKILL consumer A");
        let _ = child.wait();

        let ledger = bank.ledger().await;
        assert_eq!(ledger.len(), RECORDS, "every record applied");
        ledger
            .windows(2)
            .for_each(|w| assert_ne!(w[0], w[1], "applied twice"));
        assert_eq!(bank.balance().await, OPENING_BALANCE - RECORDS as i64);
        assert_eq!(
            stats.replayed as usize, applied_by_a,
            "B re-read exactly what A had applied without committing its offsets: {stats:?}"
        );
        assert_eq!(stats.applied as usize, RECORDS - applied_by_a, "{stats:?}");

        let suppressed: u64 = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "duplicates_suppressed_total")
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum();
        assert_eq!(
            suppressed as usize, applied_by_a,
            "duplicates_suppressed_total"
        );
    }

    /// Consumer A: applies batches and, once the first has committed in the
    /// database, says so and stops before its offsets are committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "consumer A of the rebalance test; does nothing on its own"]
    async fn child() {
        let Ok(location) = std::env::var("IDEM_T_REBALANCE_STORE") else {
            return;
        };
        let broker = Kafka::from_env().await;
        let bank = PgBank::at(&location).await;
        // One batch at a time: when the checkpoint below holds the first
        // batch, no other batch's transaction is open (and holding its rows)
        // in the process that is about to be frozen.
        let settings = config(broker.key_rule())
            .batch(BATCH, Duration::from_millis(200))
            .batches_at_once(1)
            .checkpoint(|at| {
                if at == Checkpoint::AfterCommit {
                    println!("{MARKER}");
                    // Holds the batch's acks until the parent freezes us.
                    std::thread::sleep(Duration::from_secs(600));
                }
            });
        let consumer = Consumer::new(
            broker.transport_with(batch_options()).await,
            bank.apply(false),
            settings,
        );
        let result = consumer.run_batched(std::future::pending()).await;
        panic!("consumer A should have been frozen and killed, but it ended: {result:?}");
    }
}

mod restart {
    //! A broker restart under a consumer: the test's own tansu broker is
    //! killed (SIGKILL), records are published while it is down, and it is
    //! started again on the same port and file; the consumer goes on by
    //! itself. Every key is applied once, the copy of an early one is
    //! answered from the store, and nothing published before, during or
    //! after the outage is lost.

    use std::time::Duration;

    use idem_broker::consume::{Consumer, Source, SourceOptions};

    use super::consumer_support::brokers::kafka_test_settings;
    use super::consumer_support::cuts::{quick, wait_until};
    use super::consumer_support::tansu::Tansu;
    use super::consumer_support::{
        Bank, Broker, Kafka, OPENING_BALANCE, Running, SqliteBank, config,
    };

    const ORDER_1: &[u8] = br#"{"amount": 1}"#;

    fn reported_down(name: &str) -> bool {
        idem::health::unready().iter().any(|down| down.name == name)
    }

    /// Whether `/healthz` names a connection to `topic` as down.
    fn topic_reported_down(topic: &str) -> bool {
        idem::health::unready()
            .iter()
            .any(|down| down.name.contains(topic))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_keeps_consuming_across_a_broker_restart() {
        across_a_restart(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batched_consumer_keeps_consuming_across_a_broker_restart() {
        across_a_restart(true).await
    }

    async fn across_a_restart(batched: bool) {
        let Some(mut tansu) = Tansu::start().await else {
            return;
        };
        let broker = Kafka::create_at(tansu.brokers(), 2, &[])
            .await
            .expect("create a topic on the test's own broker");
        let bank = SqliteBank::start().await.expect("sqlite");
        let source = Source::Kafka {
            brokers: broker.brokers.clone(),
            topic: broker.topic.clone(),
            group: broker.group.clone(),
            settings: kafka_test_settings(),
        };
        let name = source.to_string();
        let options = SourceOptions {
            per_partition: if batched { 4 } else { 1 },
            ..SourceOptions::default()
        };
        let transport = source
            .connect_reconnecting(options, quick())
            .await
            .expect("consume the test topic");
        let consumer = Consumer::new(
            transport,
            bank.apply(false),
            config(broker.key_rule()).batch(4, Duration::from_millis(10)),
        );
        let running = if batched {
            Running::start(consumer.stats(), |stop| consumer.run_batched(stop))
        } else {
            Running::start(consumer.stats(), |stop| consumer.run(stop))
        };

        for i in 0..10 {
            broker.publish(Some(&format!("before-{i}")), ORDER_1).await;
        }
        running.until("ten applied", |s| s.applied >= 10).await;

        tansu.kill();
        // Published while the broker is down: the producer holds them until
        // it is back.
        let during = async {
            for i in 0..10 {
                broker.publish(Some(&format!("during-{i}")), ORDER_1).await;
            }
        };
        let back = async {
            wait_until("the consumer reports its brokers unreachable", || {
                topic_reported_down(&broker.topic)
            })
            .await;
            tansu.restart().await;
        };
        tokio::join!(during, back);

        running
            .until("the ten published during the outage applied", |s| {
                s.applied >= 20
            })
            .await;
        for i in 0..10 {
            broker.publish(Some(&format!("after-{i}")), ORDER_1).await;
        }
        broker.publish(Some("before-3"), ORDER_1).await;
        running
            .until("thirty applied and the copy answered", |s| {
                s.applied >= 30 && s.replayed >= 1
            })
            .await;
        wait_until("the consumer reports its connection up", || {
            !reported_down(&name) && !topic_reported_down(&broker.topic)
        })
        .await;
        let stats = running.stop().await;

        let ledger = bank.ledger().await;
        let mut keys = ledger.clone();
        keys.sort();
        keys.dedup();
        assert_eq!(ledger.len(), 30, "one effect per key: {ledger:?}");
        assert_eq!(keys.len(), 30, "no key applied twice: {ledger:?}");
        assert_eq!(bank.balance().await, OPENING_BALANCE - 30);
        assert_eq!(stats.applied, 30, "{stats:?}");
    }
}
