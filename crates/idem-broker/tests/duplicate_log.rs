//! The log line of a duplicate, read from a real Kafka consumer: a record is
//! applied, the store's clock moves on by a known step, a second copy of the
//! record is produced to the same partition, and the line the consumer logs
//! for the copy carries the record's age by the store's clock, the
//! partition and offset of the copy, and how long ago the broker took it.
//!
//! The test installs the process's global subscriber (its own binary, one
//! test), which collects the fields of every event of that line.

mod consumer_support;
mod outbox_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use consumer_support::{Broker, Kafka, Running, config};
use idem::{ManualClock, Outcome, RecordStore};
use idem_broker::consume::{AtomicApply, Consumer, KeyedMessage};
use outbox_support::sqlite;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const LINE: &str = "duplicate delivery";

/// The fields of every duplicate line logged in this process.
static LINES: Mutex<Vec<HashMap<String, String>>> = Mutex::new(Vec::new());

struct Capture;

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.0.get("message").is_some_and(|m| m.starts_with(LINE)) {
            LINES.lock().unwrap().push(fields.0);
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Produces one copy of the order keyed `key` to `partition`; answers its
/// offset.
async fn produce(producer: &FutureProducer, topic: &str, partition: i32, key: &str) -> i64 {
    let headers = OwnedHeaders::new().insert(Header {
        key: "idempotency-key",
        value: Some(key),
    });
    let record = FutureRecord::<str, [u8]>::to(topic)
        .partition(partition)
        .payload(&br#"{"amount": 10}"#[..])
        .headers(headers);
    let delivered = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce to the test topic");
    assert_eq!(delivered.partition, partition);
    delivered.offset
}

fn field<'a>(line: &'a HashMap<String, String>, name: &str) -> &'a str {
    line.get(name)
        .unwrap_or_else(|| panic!("the duplicate line has no {name}: {line:?}"))
}

fn number(line: &HashMap<String, String>, name: &str) -> u64 {
    field(line, name)
        .parse()
        .unwrap_or_else(|e| panic!("{name} is not a number: {e}; {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_duplicate_is_logged_with_the_record_s_age_partition_and_offset() {
    tracing_subscriber::registry().with(Capture).init();

    let Some(kafka) = Kafka::with_partitions(2).await else {
        return;
    };
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .create()
        .expect("test producer");
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let clock_start = u64::try_from(store.now().0).unwrap();
    store
        .with_connection(|c| c.execute_batch("CREATE TABLE shipments (key TEXT)"))
        .await
        .unwrap()
        .unwrap();
    let apply = AtomicApply::new(store.clone(), |message: Arc<KeyedMessage>| {
        async move |tx: &mut idem::rusqlite::Connection| -> idem::rusqlite::Result<Outcome> {
            tx.execute("INSERT INTO shipments VALUES (?1)", [message.key.as_str()])?;
            Ok(Outcome::success("shipped"))
        }
    });
    let consumer = Consumer::new(kafka.transport().await, apply, config(kafka.key_rule()));
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));

    let first = produce(&producer, &kafka.topic, 1, "parcel-1").await;
    running
        .until("the first copy applied", |s| s.applied >= 1)
        .await;

    // The record was made at the clock's start; the copy comes 10 min later by
    // the store's clock.
    let step = Duration::from_secs(600);
    clock.advance(step);
    let produced_after = now_ms();
    let copy = produce(&producer, &kafka.topic, 1, "parcel-1").await;
    let stats = running
        .until("the copy answered from the store", |s| s.replayed >= 1)
        .await;
    let logged_by = now_ms();
    running.stop().await;
    assert_eq!((stats.applied, stats.replayed), (1, 1), "{stats:?}");
    assert!(copy > first, "the copy follows the first: {first} {copy}");

    let lines = LINES.lock().unwrap().clone();
    assert_eq!(lines.len(), 1, "one duplicate line: {lines:?}");
    let line = &lines[0];
    assert_eq!(number(line, "age_ms"), step.as_millis() as u64, "{line:?}");
    assert_eq!(field(line, "partition"), "1");
    assert_eq!(number(line, "offset"), copy as u64);
    assert_eq!(field(line, "position"), format!("{}/1/{copy}", kafka.topic));
    assert_eq!(field(line, "subject"), kafka.topic);
    // The store's clock stands at its start plus the step; the broker
    // stamped the copy by the wall clock between `produced_after` and
    // `logged_by`.
    let since_published = number(line, "since_published_ms");
    let store_now = clock_start + step.as_millis() as u64;
    let (low, high) = (store_now - logged_by, store_now - produced_after);
    assert!(
        (low.saturating_sub(1)..=high + 1).contains(&since_published),
        "since_published_ms {since_published} outside {low}..={high}: {line:?}"
    );
}
