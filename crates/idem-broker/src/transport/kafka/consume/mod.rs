//! Kafka through librdkafka (rdkafka): a consumer group member that commits
//! each partition's offset only when every record before it has committed its
//! effect.
//!
//! A thread of its own polls librdkafka, so a slow effect never keeps the
//! consumer from polling and the group never evicts it for that; a partition
//! whose fetched records pile up is paused until they drain. Records go into
//! one lane per partition ([`lanes`]), handed out in order (one unsettled
//! record per partition by default, so a partition is applied strictly in
//! order while partitions run in parallel). Offsets are committed from the
//! lanes every commit interval and when partitions are revoked.
//!
//! On a rebalance that takes partitions away, nothing more is handed out from
//! them, records being worked on get a bounded grace to commit, the offsets
//! they reached are committed, and only then are the partitions released. A
//! record still unsettled after the grace is read again by the next owner,
//! which finds its record in the store if it committed meanwhile. A consumer
//! that stops polling altogether (a frozen process) is evicted after
//! `max.poll.interval.ms`; its successor reads from the last commit, and the
//! records whose effects had committed are answered from the store.
//!
//! Kafka has no per-record redelivery: a record given back is handed out
//! again by this transport after its delay, before anything later in its
//! partition, and the commit does not pass it meanwhile. Kafka counts no
//! deliveries either: the count is this process's.

mod lanes;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_core::{health, redact_url};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use self::lanes::{Lanes, Partition, Take, Ticket};
use super::refusal::{Reasons, RefusalKind, report_failures};
use super::{KEY_HEADER, Settings};
use crate::consume::{
    BrokerHorizon, Delivery, Message, Route, Settle, Transport, TransportError, TransportErrorKind,
};

/// How a Kafka consumer runs.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// Unsettled records handed out per partition at once (default 1: each
    /// partition strictly in order). In batch mode, set it to the batch
    /// size: a batch applies its records in order in one transaction, and a
    /// partition with records in a batch gives no more to another batch
    /// until that one is settled.
    pub per_partition: usize,
    /// Records fetched ahead per partition before it is paused (default
    /// 2000). A paused partition costs a fetch round trip when it resumes, so
    /// this is a memory bound, not a flow control to tune tightly.
    pub buffer: usize,
    /// How often reached offsets are committed (default 100 ms). A crash
    /// loses at most this much commit progress; the records read again are
    /// answered from the store.
    pub commit_interval: Duration,
    /// How long records of revoked partitions may take to settle before the
    /// partitions are released anyway (default 10 s).
    pub revoke_grace: Duration,
    /// librdkafka settings on top of Idem's (checked: auto commits refused).
    pub settings: Settings,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        Self {
            per_partition: 1,
            buffer: 2000,
            commit_interval: Duration::from_millis(100),
            revoke_grace: Duration::from_secs(10),
            settings: Settings::new(),
        }
    }
}

/// A Kafka consumer group member with offsets committed after the effect.
pub struct KafkaTransport {
    lanes: Arc<Lanes>,
    stop: Arc<AtomicBool>,
    started: Arc<AtomicBool>,
    topic: String,
    /// The topic's `retention.ms`: `Some(None)` forever, `None` unknown.
    retention: Option<Option<Duration>>,
    poller: Option<JoinHandle<()>>,
    route: Route,
}

impl fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

/// Settles one Kafka record: marks it done for the offset commit, or hands
/// it out again after a delay.
pub struct KafkaSettle {
    lanes: Arc<Lanes>,
    ticket: Ticket,
}

impl fmt::Debug for KafkaSettle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KafkaSettle({}/{}/{})",
            self.ticket.partition.0, self.ticket.partition.1, self.ticket.offset
        )
    }
}

impl Settle for KafkaSettle {
    async fn ack(&self) -> Result<(), TransportError> {
        self.lanes.done(&self.ticket);
        Ok(())
    }

    async fn requeue(&self, delay: Duration) -> Result<(), TransportError> {
        self.lanes.retry(&self.ticket, delay);
        Ok(())
    }
}

/// What librdkafka calls back into: rebalances, commit results, and whether
/// any broker is reachable.
struct Context {
    lanes: Arc<Lanes>,
    grace: Duration,
    brokers: Reachability,
    /// librdkafka's reasons for its errors: a refused handshake or
    /// authentication, explained if the brokers cannot be reached at start.
    reasons: Reasons,
}

/// Whether the consumer reaches any of its brokers, for `/healthz` and the
/// `consumer_connected` gauge.
///
/// librdkafka reconnects to its brokers by itself, so a lost broker is not
/// an error the transport sees: it reports `AllBrokersDown` through the error
/// callback instead, and nothing when they are back. The statistics it emits
/// every [`STATISTICS_EVERY`] say each broker's state; while the brokers are
/// down, the first that shows one `UP` again marks the connection back.
struct Reachability {
    origin: String,
    health: health::Connection,
    down: AtomicBool,
}

/// How often librdkafka reports its statistics (each broker's state), unless
/// the settings choose another interval.
const STATISTICS_EVERY: &str = "1000";

impl Reachability {
    fn new(origin: &str) -> Self {
        Self {
            origin: origin.to_owned(),
            health: health::Connection::register(origin),
            down: AtomicBool::new(false),
        }
    }

    fn lost(&self, reason: &str) {
        self.health.down(reason);
        metrics::gauge!("consumer_connected", "origin" => self.origin.clone()).set(0.0);
        self.down.store(true, Ordering::Release);
    }

    fn back(&self) {
        if self.down.swap(false, Ordering::AcqRel) {
            self.health.up();
            metrics::gauge!("consumer_connected", "origin" => self.origin.clone()).set(1.0);
            metrics::counter!("consumer_reconnects_total", "origin" => self.origin.clone())
                .increment(1);
            tracing::info!(origin = %self.origin, "a Kafka broker is reachable again");
        }
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.reasons.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.reasons.record(reason);
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            tracing::warn!(origin = %self.brokers.origin, %reason, "no Kafka broker is reachable; librdkafka keeps reconnecting, and the records in hand are committed once one is back");
            self.brokers.lost(reason);
        } else {
            tracing::error!(%error, %reason, "librdkafka reported an error");
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        // Read only while the brokers are down: the statistics are large.
        if !self.brokers.down.load(Ordering::Acquire) {
            return;
        }
        match serde_json::from_slice::<Statistics>(statistics) {
            Ok(statistics) if statistics.brokers.values().any(|b| b.state == "UP") => {
                self.brokers.back();
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "librdkafka's statistics could not be read"),
        }
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let revoked = partitions(list);
            tracing::info!(partitions = ?revoked.iter().map(|(t, p)| format!("{t}/{p}")).collect::<Vec<_>>(), "partitions revoked: finishing their records, then committing");
            let commits = self.lanes.revoke(&revoked, self.grace);
            if consumer.assignment_lost() {
                tracing::warn!(
                    "the assignment was lost (the group moved on without this consumer); the next owners read from the last commit, and the store answers what committed here"
                );
            } else if let Err(error) = commit(consumer, &commits, CommitMode::Sync) {
                tracing::warn!(%error, "the offsets of revoked partitions could not be committed; their next owner reads those records again and the store answers them");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                let assigned = partitions(list);
                tracing::info!(partitions = ?assigned.iter().map(|(t, p)| format!("{t}/{p}")).collect::<Vec<_>>(), "partitions assigned");
                self.lanes.assign(assigned);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance failed"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                for element in offsets.elements() {
                    if let Offset::Offset(offset) = element.offset() {
                        let partition = (Arc::from(element.topic()), element.partition());
                        self.lanes.committed(&partition, offset);
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%error, "an offset commit failed; the next one carries it")
            }
        }
    }
}

fn partitions(list: &TopicPartitionList) -> Vec<Partition> {
    list.elements()
        .iter()
        .map(|e| (Arc::from(e.topic()), e.partition()))
        .collect()
}

fn commit(
    consumer: &BaseConsumer<Context>,
    offsets: &[(Partition, i64)],
    mode: CommitMode,
) -> KafkaResult<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let mut list = TopicPartitionList::new();
    for ((topic, partition), offset) in offsets {
        list.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    consumer.commit(&list, mode)
}

impl KafkaTransport {
    /// A member of consumer group `group` on `brokers` (`host:port[,host:port]`)
    /// consuming `topic`. Fails if the brokers do not answer or the topic
    /// does not exist. It joins the group at its first receive.
    pub async fn connect(
        brokers: &str,
        topic: &str,
        group: &str,
        options: KafkaOptions,
    ) -> Result<Self, TransportError> {
        let mut config = options.settings.consumer(brokers, group).map_err(|e| {
            TransportError::of(
                TransportErrorKind::Config,
                "configure the Kafka consumer",
                e,
            )
        })?;
        report_failures(&mut config);
        if config.get("statistics.interval.ms").is_none() {
            config.set("statistics.interval.ms", STATISTICS_EVERY);
        }
        let origin = format!(
            "{}/{topic}?group={group}",
            redact_url(&format!("kafka://{brokers}"))
        );
        let lanes = Arc::new(Lanes::new(options.per_partition, options.buffer));
        let context = Context {
            lanes: Arc::clone(&lanes),
            grace: options.revoke_grace,
            brokers: Reachability::new(&origin),
            reasons: Reasons::default(),
        };
        let consumer: BaseConsumer<Context> = config.create_with_context(context).map_err(|e| {
            TransportError::of(TransportErrorKind::Config, "create the Kafka consumer", e)
        })?;
        let (consumer, checked) = {
            let topic = topic.to_owned();
            let brokers = brokers.to_owned();
            tokio::task::spawn_blocking(move || {
                let checked = check_topic(&consumer, &brokers, &topic);
                (consumer, checked)
            })
            .await
            .map_err(|e| TransportError::new("start the Kafka consumer", e))?
        };
        checked?;
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let poller = {
            let (lanes, stop, started) =
                (Arc::clone(&lanes), Arc::clone(&stop), Arc::clone(&started));
            let interval = options.commit_interval;
            let topic = topic.to_owned();
            std::thread::Builder::new()
                .name(format!("idem-kafka-{topic}"))
                .spawn(move || {
                    // Joining the group starts a rebalance for every member:
                    // a consumer that stops before its first receive (a
                    // failed start-up check) never joins.
                    while !started.load(Ordering::Acquire) {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        std::thread::park_timeout(Duration::from_millis(100));
                    }
                    match consumer.subscribe(&[&topic]) {
                        Ok(()) => poll(&consumer, &lanes, &stop, interval),
                        Err(error) => {
                            lanes.fail(format!("subscribing to {topic:?} failed: {error}"))
                        }
                    }
                })
                .map_err(|e| TransportError::new("start the Kafka polling thread", e))?
        };
        let retention = retention(&config, topic).await;
        Ok(Self {
            lanes,
            stop,
            started,
            topic: topic.to_owned(),
            retention,
            poller: Some(poller),
            route: Route::topic(origin, brokers, options.settings),
        })
    }
}

/// The topic's `retention.ms`, as the brokers report it; `None` when they
/// do not say.
async fn retention(config: &rdkafka::ClientConfig, topic: &str) -> Option<Option<Duration>> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;

    let admin: AdminClient<DefaultClientContext> = config.create().ok()?;
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await;
    let found = match described {
        Ok(mut results) => results.pop()?.ok()?,
        Err(error) => {
            tracing::debug!(%error, "the topic's retention could not be read");
            return None;
        }
    };
    let millis: i64 = found.get("retention.ms")?.value.as_deref()?.parse().ok()?;
    Some(u64::try_from(millis).ok().map(Duration::from_millis))
}

fn check_topic(
    consumer: &BaseConsumer<Context>,
    brokers: &str,
    topic: &str,
) -> Result<(), TransportError> {
    let metadata = fetch_metadata(consumer, topic).map_err(|e| {
        match consumer.context().reasons.refusal() {
            Some(refusal) => TransportError::of(
                match refusal.kind {
                    RefusalKind::Authentication => TransportErrorKind::Refused,
                    _ => TransportErrorKind::Config,
                },
                format!("reach the Kafka brokers at {brokers}"),
                refusal.message,
            ),
            None => TransportError::new(
                format!("reach the Kafka brokers at {brokers}"),
                format!("{e}; is a broker listening there?"),
            ),
        }
    })?;
    let found = metadata.topics().iter().find(|t| t.name() == topic);
    match found {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
        _ => Err(TransportError::of(
            TransportErrorKind::Missing,
            format!("consume Kafka topic {topic:?}"),
            "the topic does not exist on the brokers; create it (with as many partitions as consumers should share)",
        )),
    }
}

/// The topic's metadata, asked for for up to 10 s. librdkafka reports why
/// it cannot reach a broker (a refused TLS handshake or authentication) as
/// error events, which only a poll serves: between attempts they are served,
/// and a refusal ends the wait at once.
fn fetch_metadata(
    consumer: &BaseConsumer<Context>,
    topic: &str,
) -> KafkaResult<rdkafka::metadata::Metadata> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let attempt = consumer.fetch_metadata(Some(topic), Duration::from_secs(1));
        let Err(error) = attempt else {
            return attempt;
        };
        // Not subscribed yet: a poll serves events only, no records. It
        // returns at an error event, and otherwise serves the queued events
        // (logs, statistics) until its timeout.
        for _ in 0..64 {
            if consumer.poll(Duration::from_millis(20)).is_none() {
                break;
            }
        }
        let refused = consumer
            .context()
            .reasons
            .refusal()
            .is_some_and(|r| r.kind.is_final());
        if refused || Instant::now() >= deadline {
            return Err(error);
        }
    }
}

/// The polling thread: fetch into the lanes, commit what the lanes reached,
/// pause and resume partitions, until stopped; then commit a last time and
/// leave the group.
fn poll(consumer: &BaseConsumer<Context>, lanes: &Lanes, stop: &AtomicBool, interval: Duration) {
    let mut last_commit = Instant::now();
    while !stop.load(Ordering::Acquire) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(record)) => {
                let (partition, offset, message) = convert(&record);
                lanes.push(&partition, offset, message);
            }
            Some(Err(error)) => {
                if let rdkafka::error::KafkaError::MessageConsumptionFatal(_) = error {
                    lanes.fail(format!("the Kafka consumer failed: {error}"));
                    break;
                }
                tracing::warn!(%error, "Kafka consumer error; polling on");
            }
            None => {}
        }
        if last_commit.elapsed() >= interval {
            last_commit = Instant::now();
            if let Err(error) = commit(consumer, &lanes.to_commit(), CommitMode::Async) {
                tracing::debug!(%error, "offset commit not sent; trying again");
            }
        }
        flow(consumer, lanes);
    }
    if let Err(error) = commit(consumer, &lanes.to_commit(), CommitMode::Sync) {
        tracing::warn!(%error, "the last offsets could not be committed; the records after the last commit are read again and the store answers them");
    }
    consumer.unsubscribe();
    // Dropping the consumer closes it: it leaves the group, so its partitions
    // move at once instead of after the session timeout.
}

fn flow(consumer: &BaseConsumer<Context>, lanes: &Lanes) {
    let (pause, resume) = lanes.flow();
    for (list, what) in [(pause, "pause"), (resume, "resume")] {
        if list.is_empty() {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in &list {
            tpl.add_partition(topic, *partition);
        }
        let done = if what == "pause" {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if let Err(error) = done {
            tracing::warn!(%error, "could not {what} Kafka partitions");
        }
    }
}

fn convert(record: &BorrowedMessage<'_>) -> (Partition, i64, Message) {
    let topic = record.topic();
    let mut headers = BTreeMap::new();
    if let Some(list) = record.headers() {
        for header in list.iter() {
            if let Some(value) = header.value.and_then(|v| std::str::from_utf8(v).ok()) {
                headers.insert(header.key.to_owned(), value.to_owned());
            }
        }
    }
    let mut message = Message::new(Bytes::copy_from_slice(record.payload().unwrap_or_default()));
    message.headers = headers;
    message.message_id = message.header(KEY_HEADER).map(str::to_owned);
    message.content_type = message.header("content-type").map(str::to_owned);
    message.record_key = record.key().map(Bytes::copy_from_slice);
    message.subject = topic.to_owned();
    message.coordinates = Some(format!(
        "{topic}/{}/{}",
        record.partition(),
        record.offset()
    ));
    message.published_at = record.timestamp().to_millis().map(idem_core::Timestamp);
    (
        (Arc::from(topic), record.partition()),
        record.offset(),
        message,
    )
}

impl Transport for KafkaTransport {
    type Settle = KafkaSettle;

    async fn receive(&mut self) -> Result<Option<Delivery<KafkaSettle>>, TransportError> {
        if !self.started.swap(true, Ordering::AcqRel)
            && let Some(poller) = &self.poller
        {
            poller.thread().unpark();
        }
        loop {
            let notified = self.lanes.ready.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match self.lanes.take(Instant::now()) {
                Take::Record(ticket, message) => {
                    return Ok(Some(Delivery {
                        message: *message,
                        settle: KafkaSettle {
                            lanes: Arc::clone(&self.lanes),
                            ticket,
                        },
                    }));
                }
                Take::Failed(why) => {
                    return Err(TransportError::new("receive from Kafka", why));
                }
                Take::Wait(Some(at)) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                Take::Wait(None) => notified.await,
            }
        }
    }

    fn route(&self) -> Route {
        self.route.clone()
    }

    fn end_batch(&mut self) {
        self.lanes.end_batch();
    }

    fn replay_horizon(&self) -> Option<BrokerHorizon> {
        self.retention.map(|keeps| BrokerHorizon {
            keeps,
            origin: format!("topic {}", self.topic),
        })
    }

    async fn close(mut self) {
        if self.lanes.unsettled() > 0 {
            tracing::debug!("closing with unsettled records; their offsets are not committed");
        }
        self.stop.store(true, Ordering::Release);
        if let Some(poller) = self.poller.take() {
            poller.thread().unpark();
            let _ = tokio::task::spawn_blocking(move || poller.join()).await;
        }
    }
}

impl Drop for KafkaTransport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(poller) = &self.poller {
            poller.thread().unpark();
        }
    }
}
