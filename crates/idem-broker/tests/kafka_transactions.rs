//! Consume-transform-produce in Kafka transactions
//! ([`idem_broker::kafka::transact`]), checked on records read back with a
//! `read_committed` consumer.
//!
//! These tests run on librdkafka's built-in mock cluster
//! (`rdkafka::mocking::MockCluster`), not on the test broker the other Kafka
//! tests use: that broker (tansu) cannot run transactions (librdkafka:
//! "EndTxnRequest not supported by broker").
//!
//! The mock cluster speaks the whole transactional protocol (InitProducerId,
//! AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn), so the
//! pipe's calls, librdkafka's state machine and its error handling are the
//! real ones. It does not keep their effects, though (librdkafka 2.12's
//! `rdkafka_mock_handlers.c`): EndTxn writes no commit or abort markers and a
//! fetch reports no aborted transactions, so a record of an aborted
//! transaction that reached its log would be visible; TxnOffsetCommit stores
//! no offset, so the group's committed offsets cannot be read back; and
//! InitProducerId for a `transactional.id` already in use hands out a new
//! producer id instead of bumping the epoch, so it fences nobody by itself.
//! Where a test depends on one of these, it says how it stands in for it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_broker::kafka::Settings;
use idem_broker::kafka::transact::{
    Input, Output, PipeConfig, PipeError, PipeStats, TransactionalPipe,
};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const INPUT: &str = "orders";
const OUTPUT: &str = "priced";
const GROUP: &str = "pricing";

/// A mock cluster of one broker with the input and output topics.
fn cluster(partitions: i32) -> MockCluster<'static, DefaultProducerContext> {
    // RUST_LOG=idem_broker=debug shows what the pipe did.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = MockCluster::new(1).expect("librdkafka's mock cluster should start");
    for topic in [INPUT, OUTPUT] {
        cluster
            .create_topic(topic, partitions, 1)
            .unwrap_or_else(|e| panic!("creating topic {topic} on the mock cluster: {e}"));
    }
    cluster
}

/// Writes `count` input records `order-{i}` with key `k{i}` (plainly, not in
/// a transaction).
async fn write_inputs(brokers: &str, count: usize) {
    let brokers = brokers.to_owned();
    tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a plain producer for the inputs");
        for i in 0..count {
            let (key, payload) = (format!("k{i}"), format!("order-{i}"));
            producer
                .send(BaseRecord::to(INPUT).key(&key).payload(&payload))
                .unwrap_or_else(|(e, _)| panic!("queueing input {i}: {e}"));
        }
        producer
            .flush(Duration::from_secs(10))
            .expect("the inputs should reach the mock cluster within 10 s");
    })
    .await
    .expect("the input writer panicked");
}

/// The pipeline under test: one output per input, its payload the input's
/// with `tag`, its key the input's, its origin in a header.
fn price(tag: &'static str) -> impl FnMut(&Input) -> Result<Vec<Output>, Infallible> + Send {
    move |input| {
        let payload = String::from_utf8_lossy(input.payload.as_deref().unwrap_or_default());
        let mut output = Output::new(OUTPUT, format!("{payload}:priced:{tag}"))
            .header("source", input.coordinates());
        if let Some(key) = &input.key {
            output = output.key(key.clone());
        }
        Ok(vec![output])
    }
}

fn config(brokers: &str, transactional_id: &str) -> PipeConfig {
    PipeConfig {
        batch_size: 8,
        linger: Duration::from_millis(50),
        transaction_timeout: Duration::from_secs(10),
        retry_delay: Duration::from_millis(100),
        // After a member leaves, the mock cluster lets new members into the
        // group only once the session timeout less a second has passed (45 s
        // by default): the fenced instance's successor joins after 2 s.
        settings: Settings::new()
            .set("session.timeout.ms", "3000")
            .set("heartbeat.interval.ms", "500"),
        ..PipeConfig::new(brokers, INPUT, GROUP, [OUTPUT], transactional_id)
    }
}

async fn connect(config: PipeConfig) -> TransactionalPipe {
    let id = config.transactional_id.clone();
    tokio::time::timeout(Duration::from_secs(30), TransactionalPipe::connect(config))
        .await
        .unwrap_or_else(|_| panic!("connecting pipe {id:?} to the mock cluster took over 30 s"))
        .unwrap_or_else(|e| panic!("connecting pipe {id:?}: {e}"))
}

/// A pipe running until the sender is used or dropped.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<PipeStats, PipeError>>,
}

fn start<F>(pipe: TransactionalPipe, transform: F) -> Running
where
    F: FnMut(&Input) -> Result<Vec<Output>, String> + Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(pipe.run(transform, async move {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    async fn stop(self) -> Result<PipeStats, PipeError> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the pipe should stop within 30 s of its shutdown")
            .expect("the pipe's task panicked")
    }
}

fn infallible<F>(mut transform: F) -> impl FnMut(&Input) -> Result<Vec<Output>, String> + Send
where
    F: FnMut(&Input) -> Result<Vec<Output>, Infallible> + Send,
{
    move |input| transform(input).map_err(|never| match never {})
}

/// One output record as read back.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Read {
    key: String,
    payload: String,
    source: String,
}

/// Reads `topic` from the start as a new group with `isolation.level =
/// read_committed` until `expected` records arrived and then nothing more
/// for a second (so a duplicate would be seen too).
async fn read_committed(brokers: &str, topic: &str, expected: usize) -> Vec<Read> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let group = format!("reader-{}", rand_suffix());
        let config = Settings::new()
            .consumer(&brokers, &group)
            .expect("Idem's consumer settings");
        assert_eq!(config.get("isolation.level"), Some("read_committed"));
        let consumer: BaseConsumer = config.create().expect("a read_committed reader");
        consumer.subscribe(&[&topic]).expect("subscribing the reader");
        let mut read = Vec::new();
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut quiet_since = Instant::now();
        loop {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(record)) => {
                    let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
                    let source = record
                        .headers()
                        .and_then(|h| h.iter().find(|h| h.key == "source").map(|h| text(h.value)))
                        .unwrap_or_default();
                    read.push(Read {
                        key: text(record.key()),
                        payload: text(record.payload()),
                        source,
                    });
                    quiet_since = Instant::now();
                }
                Some(Err(e)) => panic!("the read_committed reader failed: {e}"),
                None => {}
            }
            if read.len() >= expected && quiet_since.elapsed() > Duration::from_secs(1) {
                return read;
            }
            assert!(
                Instant::now() < give_up,
                "read {} of the {expected} committed records expected in {topic:?} within 30 s: {read:?}",
                read.len()
            );
        }
    })
    .await
    .expect("the reader panicked")
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Asserts each of the `count` inputs has exactly one output, tagged `tag`.
fn assert_once(read: &[Read], count: usize, tag: &str) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for record in read {
        *seen.entry(record.payload.as_str()).or_default() += 1;
    }
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "outputs written more than once: {duplicated:?}"
    );
    assert_eq!(read.len(), count, "one output per input: {read:?}");
    for i in 0..count {
        let payload = format!("order-{i}:priced:{tag}");
        let record = read
            .iter()
            .find(|r| r.payload == payload)
            .unwrap_or_else(|| panic!("no output {payload:?} in {read:?}"));
        assert_eq!(
            record.key,
            format!("k{i}"),
            "the output keeps the input's key"
        );
        assert!(record.source.starts_with("orders/"), "{record:?}");
    }
}

/// The high watermarks of the input's partitions: where the offsets
/// committed past every input must stand.
async fn input_ends(brokers: &str, partitions: i32) -> BTreeMap<(String, i32), i64> {
    let brokers = brokers.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a consumer for the watermarks");
        (0..partitions)
            .map(|p| {
                let (_, high) = consumer
                    .fetch_watermarks(INPUT, p, Duration::from_secs(10))
                    .expect("the input's watermarks");
                ((INPUT.to_owned(), p), high)
            })
            .collect()
    })
    .await
    .expect("the watermark reader panicked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_input_is_written_once_and_the_transactions_carry_the_offsets_past_it() {
    let cluster = cluster(2);
    let brokers = cluster.bootstrap_servers();
    let count = 40;
    write_inputs(&brokers, count).await;

    let pipe = connect(config(&brokers, "pricing-0")).await;
    let running = start(pipe, infallible(price("a")));
    let read = read_committed(&brokers, OUTPUT, count).await;
    let stats = running.stop().await.expect("the pipe should stop cleanly");

    assert_once(&read, count, "a");
    assert_eq!(stats.records_read, count as u64, "{stats:?}");
    assert_eq!(stats.records_written, count as u64, "{stats:?}");
    assert_eq!(stats.transactions_aborted, 0, "{stats:?}");
    assert!(
        stats.transactions_committed >= (count as u64).div_ceil(8),
        "at most 8 records per transaction: {stats:?}"
    );
    // The offsets the committed transactions carried for the group: past
    // every input, in each partition. (A real broker would also hand them
    // back through the group's committed offsets; the mock cluster does not
    // store TxnOffsetCommit, so they are checked as the pipe committed them.)
    assert_eq!(
        stats.committed_offsets,
        input_ends(&brokers, 2).await,
        "{stats:?}"
    );
    assert_eq!(stats.committed_offsets.values().sum::<i64>(), count as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_fenced_by_a_newer_one_stops_and_its_transaction_stays_invisible() {
    let cluster = cluster(1);
    let brokers = cluster.bootstrap_servers();
    let count = 20;
    write_inputs(&brokers, count).await;

    let older = connect(config(&brokers, "t")).await;
    // The newer instance initialises transactions for the same
    // transactional.id: on a real broker that bumps the producer epoch, and
    // the coordinator answers the older instance's next transaction with
    // PRODUCER_FENCED. The mock cluster hands the newer instance a new
    // producer id instead, so the test gives the older instance's next
    // AddPartitionsToTxn the coordinator's answer itself.
    let newer = connect(config(&brokers, "t")).await;
    cluster.request_errors(
        RDKafkaApiKey::AddPartitionsToTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
    );

    let transformed = Arc::new(AtomicU64::new(0));
    let older_transform = {
        let (transformed, mut price) = (Arc::clone(&transformed), price("older"));
        move |input: &Input| {
            transformed.fetch_add(1, Ordering::SeqCst);
            price(input).map_err(|never| match never {})
        }
    };
    let fenced = tokio::time::timeout(
        Duration::from_secs(30),
        older.run(older_transform, std::future::pending::<()>()),
    )
    .await
    .expect("the fenced instance should stop by itself within 30 s")
    .expect_err("the older instance must not go on after it was fenced");
    match &fenced {
        PipeError::Fenced {
            transactional_id, ..
        } => assert_eq!(transactional_id, "t"),
        other => panic!("expected the fenced error, got: {other}"),
    }
    let said = fenced.to_string();
    for words in ["fenced", "newer instance", "\"t\"", "must not continue"] {
        assert!(said.contains(words), "{said:?} should say {words:?}");
    }
    assert!(
        transformed.load(Ordering::SeqCst) > 0,
        "the older instance had a transaction under way when it was fenced"
    );

    let running = start(newer, infallible(price("newer")));
    let read = read_committed(&brokers, OUTPUT, count).await;
    let stats = running
        .stop()
        .await
        .expect("the newer instance goes on and stops cleanly");
    // Every output is the newer instance's, once: nothing of the fenced
    // instance's transaction is visible.
    assert_once(&read, count, "newer");
    assert_eq!(stats.records_written, count as u64, "{stats:?}");
    assert_eq!(
        stats.committed_offsets.get(&(INPUT.to_owned(), 0)),
        Some(&(count as i64)),
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_is_read_again_and_its_outputs_appear_once() {
    let cluster = cluster(1);
    let brokers = cluster.bootstrap_servers();
    let count = 16;
    write_inputs(&brokers, count).await;

    let pipe = connect(PipeConfig {
        batch_size: 4,
        // Keeps the outputs of the transaction that is aborted in the
        // producer's queue until the abort discards them: the mock cluster
        // writes no abort markers, so outputs of an aborted transaction that
        // reached its log would show. A real broker hides those from
        // read_committed readers either way.
        settings: config(&brokers, "").settings.set("linger.ms", "1000"),
        ..config(&brokers, "pricing-abort")
    })
    .await;
    let failed_once = Arc::new(AtomicBool::new(false));
    let transform = {
        let (failed_once, mut price) = (Arc::clone(&failed_once), price("a"));
        move |input: &Input| {
            // The third record of the second batch fails the first time, after
            // the batch's first two outputs went into the transaction.
            if input.offset == 6 && !failed_once.swap(true, Ordering::SeqCst) {
                return Err(format!("no price for {} yet", input.coordinates()));
            }
            price(input).map_err(|never| match never {})
        }
    };
    let running = start(pipe, transform);
    let read = read_committed(&brokers, OUTPUT, count).await;
    let stats = running.stop().await.expect("the pipe should stop cleanly");

    assert!(
        failed_once.load(Ordering::SeqCst),
        "the transform failed once"
    );
    assert_once(&read, count, "a");
    assert_eq!(stats.transactions_aborted, 1, "{stats:?}");
    assert_eq!(stats.records_written, count as u64, "{stats:?}");
    assert!(
        stats.records_read > count as u64,
        "the aborted batch was read again: {stats:?}"
    );
    assert_eq!(
        stats.committed_offsets.get(&(INPUT.to_owned(), 0)),
        Some(&(count as i64)),
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_that_keeps_failing_stops_the_pipe_with_nothing_written() {
    let cluster = cluster(1);
    let brokers = cluster.bootstrap_servers();
    write_inputs(&brokers, 3).await;

    let pipe = connect(PipeConfig {
        transform_attempts: 2,
        ..config(&brokers, "pricing-broken")
    })
    .await;
    let error = tokio::time::timeout(
        Duration::from_secs(30),
        pipe.run(
            |input: &Input| -> Result<Vec<Output>, String> {
                Err(format!("cannot price {}", input.coordinates()))
            },
            std::future::pending::<()>(),
        ),
    )
    .await
    .expect("the pipe should give up within 30 s")
    .expect_err("a transform that always fails stops the pipe");
    match &error {
        PipeError::Transform { at, attempts, .. } => {
            assert_eq!(at, "orders/0/0");
            assert_eq!(*attempts, 2);
        }
        other => panic!("expected the transform error, got: {other}"),
    }
    assert!(
        error.to_string().contains("cannot price orders/0/0"),
        "{error}"
    );

    // Nothing was written: read the output's end, which stays at 0.
    let brokers2 = brokers.clone();
    let high = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers2)
            .create()
            .expect("a consumer for the watermarks");
        consumer
            .fetch_watermarks(OUTPUT, 0, Duration::from_secs(10))
            .expect("the output's watermarks")
            .1
    })
    .await
    .expect("the watermark reader panicked");
    assert_eq!(high, 0, "no output record reached the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_to_an_undeclared_topic_is_refused() {
    let cluster = cluster(1);
    let brokers = cluster.bootstrap_servers();
    write_inputs(&brokers, 1).await;

    let pipe = connect(config(&brokers, "pricing-typo")).await;
    let error = tokio::time::timeout(
        Duration::from_secs(30),
        pipe.run(
            |_: &Input| Ok::<_, Infallible>(vec![Output::new("prcied", "x")]),
            std::future::pending::<()>(),
        ),
    )
    .await
    .expect("the pipe should stop within 30 s")
    .expect_err("writing to an undeclared topic stops the pipe");
    assert!(
        matches!(&error, PipeError::Config(why) if why.contains("\"prcied\"")),
        "{error}"
    );
}
