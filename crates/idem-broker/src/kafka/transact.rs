//! Consume-transform-produce inside one Kafka transaction, for pipelines that
//! read from Kafka and write only to Kafka.
//!
//! A [`TransactionalPipe`] reads a batch of records from its input topic, hands
//! each to a transform (a closure from an [`Input`] to zero or more
//! [`Output`]s), and then, inside one Kafka transaction, writes the outputs and
//! commits the input offsets past the batch. Either all of that becomes
//! visible or none of it does: a reader with `isolation.level=read_committed`
//! sees each output once, and the group's committed offset moves with the
//! outputs, never ahead of them and never behind.
//!
//! # What Kafka's exactly-once covers, and what it does not
//!
//! Kafka's exactly-once (the idempotent producer, transactions,
//! `read_committed` readers) covers writes to Kafka and the consumer offsets,
//! and nothing else. A database write, an e-mail or a payment-gateway call
//! made inside the transform is outside the transaction: when a transaction
//! aborts (a broker failure, a rebalance, this process dying before the
//! commit) the batch is read and transformed again, and that effect happens
//! again. So the transform must be a function of its input that only
//! computes records. Effects outside Kafka belong in Idem's store-backed
//! consumer ([`crate::consume`]), where the dedupe record commits in the same
//! database transaction as the effect and the offset is committed after it.
//!
//! # Fencing
//!
//! Each pipe has a `transactional.id`. Starting a pipe initialises the
//! transactional producer, which bumps the producer epoch for that id and
//! fences every older instance with the same id: the brokers refuse the older
//! one's transactions from then on, and its open transaction is aborted. So a
//! pipe that was paused (a long GC, a frozen VM) and wakes up after its
//! replacement started cannot commit stale work. A fenced pipe stops with
//! [`PipeError::Fenced`]; it must not go on, and must not be restarted while the
//! newer instance runs (that would fence the newer one in turn). Give each
//! running instance its own, stable id (for example the pipeline's name and
//! the instance's ordinal), so a restarted instance fences exactly its own
//! predecessor.
//!
//! # Aborts
//!
//! When a transaction cannot commit (the transform failed, or Kafka answered
//! with an error after which the transaction must be aborted), the pipe
//! aborts it, so its outputs are never visible to `read_committed` readers,
//! rewinds the consumer to where the batch started, which is the last
//! committed position, and reads the records again after
//! [`PipeConfig::retry_delay`]. A transform that keeps failing on the same
//! records stops the pipe after [`PipeConfig::transform_attempts`] attempts
//! instead of spinning; to skip records it cannot handle, let the transform
//! return an output to a dead-letter topic instead of an error.
//!
//! # Threads
//!
//! librdkafka's transactional calls (`init_transactions`,
//! `commit_transaction`, `abort_transaction`) and its consumer poll block.
//! They run on a thread of the pipe's own, and so does the transform, never on
//! the async runtime. The producer serves its delivery reports on a thread of
//! its own (rdkafka's `ThreadedProducer`): an abort waits until the reports
//! of the records it discards were served, and would time out otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::Settings;

/// What a [`TransactionalPipe`] reads, writes, and how it batches.
///
/// Build it with [`PipeConfig::new`] and change the defaults with struct
/// update syntax: `PipeConfig { batch_size: 100, ..PipeConfig::new(...) }`.
#[derive(Debug, Clone)]
pub struct PipeConfig {
    /// The brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic read.
    pub input_topic: String,
    /// The consumer group; its committed offsets move only inside the pipe's
    /// transactions.
    pub group: String,
    /// The topics the transform may write to. Checked to exist at start; an
    /// output to any other topic stops the pipe (after aborting its
    /// transaction), so a typo cannot create topics or write elsewhere.
    pub output_topics: Vec<String>,
    /// The producer's `transactional.id`: stable for one instance across its
    /// restarts and distinct between instances running at once. Starting a
    /// pipe fences every older one with the same id.
    pub transactional_id: String,
    /// Records per transaction at most (default 500).
    pub batch_size: usize,
    /// How long a batch waits for more records after its first one before it
    /// is transacted anyway (default 100 ms).
    pub linger: Duration,
    /// The broker aborts a transaction left open longer than this
    /// (`transaction.timeout.ms`, default 60 s); also the bound on each
    /// blocking transactional call.
    pub transaction_timeout: Duration,
    /// The pause after an aborted transaction before its records are read
    /// again (default 1 s).
    pub retry_delay: Duration,
    /// Attempts in a row whose transform fails before the pipe stops
    /// (default 3).
    pub transform_attempts: u32,
    /// librdkafka settings on top of Idem's, given to both the consumer and
    /// the producer (checked: auto commits, a non-idempotent producer and
    /// `read_uncommitted` are refused).
    pub settings: Settings,
}

impl PipeConfig {
    /// A pipe reading `input_topic` in consumer group `group` on `brokers`
    /// and writing to `output_topics` as `transactional_id`, with the default
    /// batching and timeouts.
    pub fn new(
        brokers: impl Into<String>,
        input_topic: impl Into<String>,
        group: impl Into<String>,
        output_topics: impl IntoIterator<Item = impl Into<String>>,
        transactional_id: impl Into<String>,
    ) -> Self {
        Self {
            brokers: brokers.into(),
            input_topic: input_topic.into(),
            group: group.into(),
            output_topics: output_topics.into_iter().map(Into::into).collect(),
            transactional_id: transactional_id.into(),
            batch_size: 500,
            linger: Duration::from_millis(100),
            transaction_timeout: Duration::from_secs(60),
            retry_delay: Duration::from_secs(1),
            transform_attempts: 3,
            settings: Settings::new(),
        }
    }
}

/// One input record, as the transform sees it: an owned copy, so the
/// transform may keep parts of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The topic it was read from.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// The record key, if any.
    pub key: Option<Bytes>,
    /// The payload; `None` for a tombstone.
    pub payload: Option<Bytes>,
    /// The headers in order; a name may repeat, a value may be null.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// The record's timestamp in milliseconds since the Unix epoch, if any.
    pub timestamp: Option<i64>,
}

impl Input {
    /// The value of the first header named `name` (ASCII case-insensitive),
    /// if it is there and not null.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_deref())
    }

    /// `topic/partition/offset`, for logs and errors.
    pub fn coordinates(&self) -> String {
        format!("{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// One record the transform asks to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The topic; one of [`PipeConfig::output_topics`].
    pub topic: String,
    /// The record key (the partition is chosen from it), if any.
    pub key: Option<Bytes>,
    /// The payload; `None` writes a tombstone.
    pub payload: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<(String, Bytes)>,
}

impl Output {
    /// A record with `payload` for `topic`, without key or headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            key: None,
            payload: Some(payload.into()),
            headers: Vec::new(),
        }
    }

    /// A tombstone for `key` in `topic` (a compacted topic then drops the key).
    pub fn tombstone(topic: impl Into<String>, key: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            key: Some(key.into()),
            payload: None,
            headers: Vec::new(),
        }
    }

    /// With this record key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// With one more header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What a pipe did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipeStats {
    /// Records handed to the transform, counting again those read again after
    /// an aborted transaction.
    pub records_read: u64,
    /// Output records in committed transactions.
    pub records_written: u64,
    /// Transactions committed.
    pub transactions_committed: u64,
    /// Transactions aborted.
    pub transactions_aborted: u64,
    /// For each input partition, by topic and partition, the offset the last
    /// committed transaction committed for the group: the next record to read.
    pub committed_offsets: BTreeMap<(String, i32), i64>,
}

/// Why a pipe could not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipeError {
    /// The configuration or a setting was refused, or a topic is missing.
    #[error("Kafka transactional pipe: {0}")]
    Config(String),
    /// The brokers or the transaction coordinator did not answer.
    #[error("Kafka transactional pipe: could not {doing}: {detail}")]
    Unavailable {
        /// What was being done.
        doing: String,
        /// What went wrong, and what to check.
        detail: String,
    },
    /// Another instance with the same `transactional.id` initialised after
    /// this one: the brokers refuse this one's transactions. It must stop.
    #[error(
        "Kafka transactional pipe fenced: a newer instance with the same transactional.id {transactional_id:?} started, so the brokers refuse this instance's transactions ({detail}); this instance must not continue: its uncommitted transaction was discarded and the newer instance reads from the last committed offsets; stop this one, and do not restart it while the newer one runs (that would fence the newer one in turn)"
    )]
    Fenced {
        /// The `transactional.id` both instances use.
        transactional_id: String,
        /// librdkafka's report.
        detail: String,
    },
    /// The transform kept failing on a batch.
    #[error(
        "Kafka transactional pipe: the transform failed {attempts} times in a row, last on record {at}: {message}; each failed transaction was aborted, nothing of it is visible and the offsets stay before it; fix the transform, or have it write records it cannot handle to a dead-letter topic instead of failing"
    )]
    Transform {
        /// `topic/partition/offset` of the record the transform failed on.
        at: String,
        /// Failed attempts in a row.
        attempts: u32,
        /// The transform's error.
        message: String,
    },
    /// librdkafka reported an error after which this producer or consumer
    /// cannot go on.
    #[error(
        "Kafka transactional pipe: fatal error while {doing}: {detail}; the open transaction is not committed and the offsets stay before it; start a new instance"
    )]
    Fatal {
        /// What was being done.
        doing: String,
        /// librdkafka's report.
        detail: String,
    },
}

/// A consume-transform-produce pipe whose every batch is one Kafka
/// transaction. [`connect`](Self::connect) starts it (and fences older
/// instances with the same `transactional.id`), [`run`](Self::run) runs it.
pub struct TransactionalPipe {
    worker: Worker,
}

impl fmt::Debug for TransactionalPipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalPipe")
            .field("input_topic", &self.worker.config.input_topic)
            .field("group", &self.worker.config.group)
            .field("output_topics", &self.worker.config.output_topics)
            .field("transactional_id", &self.worker.config.transactional_id)
            .finish_non_exhaustive()
    }
}

impl TransactionalPipe {
    /// Creates the consumer and the transactional producer, checks that the
    /// topics exist, and initialises the producer's transactions, which
    /// fences every older instance with the same `transactional.id` (their
    /// open transactions are aborted). The consumer joins its group only when
    /// [`run`](Self::run) starts.
    pub async fn connect(config: PipeConfig) -> Result<Self, PipeError> {
        let (consumer_config, producer_config) = client_configs(&config)?;
        let worker = tokio::task::spawn_blocking(move || {
            Worker::start(config, consumer_config, producer_config)
        })
        .await
        .map_err(|e| PipeError::Unavailable {
            doing: "start the Kafka clients".into(),
            detail: e.to_string(),
        })??;
        Ok(Self { worker })
    }

    /// Reads, transforms and writes in transactions until `shutdown`
    /// completes, then finishes the transaction under way, leaves the group
    /// and returns what it did.
    ///
    /// `transform` runs on the pipe's thread, once per record and again for
    /// a record read again after an aborted transaction: it must only compute
    /// records (see the module documentation for where other effects go).
    /// An `Err` aborts the batch's transaction; the batch is read again after
    /// [`PipeConfig::retry_delay`].
    ///
    /// Returns an error if the pipe was fenced by a newer instance, the
    /// transform kept failing, or Kafka failed fatally. If the returned
    /// future is dropped, the pipe stops as on shutdown.
    pub async fn run<F, E>(
        self,
        transform: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<PipeStats, PipeError>
    where
        F: FnMut(&Input) -> Result<Vec<Output>, E> + Send + 'static,
        E: fmt::Display,
    {
        let stop = Arc::new(Stop::default());
        let _stop_on_drop = StopOnDrop(Arc::clone(&stop));
        let (done, mut result) = tokio::sync::oneshot::channel();
        let worker = self.worker;
        let name = format!("idem-kafka-tx-{}", worker.config.transactional_id);
        {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let _ = done.send(worker.run(transform, &stop));
                })
                .map_err(|e| PipeError::Unavailable {
                    doing: "start the pipe's thread".into(),
                    detail: e.to_string(),
                })?;
        }
        let mut shutdown = pin!(shutdown);
        let finished = tokio::select! {
            finished = &mut result => finished,
            () = &mut shutdown => {
                stop.set();
                result.await
            }
        };
        finished.unwrap_or_else(|_| {
            Err(PipeError::Fatal {
                doing: "running the pipe".into(),
                detail: "its thread ended without a result (did the transform panic?)".into(),
            })
        })
    }
}

/// The consumer's and the producer's configurations: Idem's checked settings,
/// `read_committed`, the transactional id and timeout.
fn client_configs(config: &PipeConfig) -> Result<(ClientConfig, ClientConfig), PipeError> {
    let refuse = |what: String| Err(PipeError::Config(what));
    if config.transactional_id.trim().is_empty() {
        return refuse("the transactional.id is empty; give each running instance its own stable id, e.g. the pipeline's name and the instance's ordinal".into());
    }
    if config.output_topics.is_empty() {
        return refuse("no output topic; name the topics the transform writes to".into());
    }
    if config.batch_size == 0 {
        return refuse("batch_size is 0; a transaction needs at least one record".into());
    }
    if config.transform_attempts == 0 {
        return refuse("transform_attempts is 0; give the transform at least one attempt".into());
    }
    for (name, value) in config.settings.iter() {
        let why = match name {
            "isolation.level" if value != "read_committed" => {
                "the pipe would transform records of transactions that later abort; leave it out (Idem reads read_committed)"
            }
            "transactional.id" => "give it as PipeConfig::transactional_id",
            "transaction.timeout.ms" => "give it as PipeConfig::transaction_timeout",
            _ => continue,
        };
        return refuse(format!("setting {name}={value} refused: {why}"));
    }
    let consumer = config
        .settings
        .consumer(&config.brokers, &config.group)
        .map_err(|e| PipeError::Config(e.to_string()))?;
    let mut producer = config
        .settings
        .producer(&config.brokers)
        .map_err(|e| PipeError::Config(e.to_string()))?;
    let transaction_ms = millis(config.transaction_timeout);
    // librdkafka refuses a message timeout longer than the transaction's: a
    // record must fail before the transaction it belongs to times out.
    // Idem's default is message.timeout.ms; a delivery.timeout.ms (its
    // alias) can only have come from the caller, so it wins.
    let message_ms = ["delivery.timeout.ms", "message.timeout.ms"]
        .iter()
        .find_map(|name| producer.get(name).and_then(|v| v.parse::<u64>().ok()))
        .map_or(transaction_ms, |ms| ms.min(transaction_ms));
    producer
        .remove("delivery.timeout.ms")
        .set("message.timeout.ms", message_ms.to_string())
        .set("transactional.id", &config.transactional_id)
        .set("transaction.timeout.ms", transaction_ms.to_string());
    Ok((consumer, producer))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// What librdkafka calls back into: the partitions a rebalance takes away, so
/// the records of the batch being gathered that came from them are dropped
/// (their next owner reads them from the last committed offset).
#[derive(Default)]
struct PipeContext {
    revoked: Mutex<Vec<(String, i32)>>,
}

impl ClientContext for PipeContext {}

impl ConsumerContext for PipeContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let mut revoked = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
            for element in list.elements() {
                revoked.push((element.topic().to_owned(), element.partition()));
            }
        }
    }
}

/// Set when the pipe is to stop; its thread waits on it between attempts.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl Stop {
    fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    fn is_set(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `timeout`; whether the pipe is to stop.
    fn wait(&self, timeout: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (stopped, _) = self
            .changed
            .wait_timeout_while(stopped, timeout, |stopped| !*stopped)
            .unwrap_or_else(|e| e.into_inner());
        *stopped
    }
}

struct StopOnDrop(Arc<Stop>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// Why a transaction did not commit.
enum Failure {
    /// Kafka answered so that the transaction must be aborted; its records
    /// are read again.
    Abort(String),
    /// The transform failed on a record; the transaction is aborted and its
    /// records read again.
    Transform { at: String, message: String },
    /// The transform broke a rule the pipe cannot retry past; the transaction
    /// is aborted and the pipe stops.
    Refused(PipeError),
    /// The producer or consumer cannot go on (fenced, or fatal); nothing can
    /// be aborted any more.
    Stop(PipeError),
}

/// The clients and the loop, on the pipe's own thread.
struct Worker {
    config: PipeConfig,
    outputs: BTreeSet<String>,
    consumer: BaseConsumer<PipeContext>,
    producer: ThreadedProducer<DefaultProducerContext>,
}

impl Worker {
    /// Creates the clients, checks the topics and initialises transactions
    /// (blocking).
    fn start(
        config: PipeConfig,
        consumer_config: ClientConfig,
        producer_config: ClientConfig,
    ) -> Result<Self, PipeError> {
        let consumer: BaseConsumer<PipeContext> = consumer_config
            .create_with_context(PipeContext::default())
            .map_err(|e| PipeError::Config(format!("could not create the Kafka consumer: {e}")))?;
        let producer: ThreadedProducer<DefaultProducerContext> =
            producer_config.create().map_err(|e| {
                PipeError::Config(format!(
                    "could not create the transactional Kafka producer: {e}"
                ))
            })?;
        let timeout = config.transaction_timeout.min(Duration::from_secs(10));
        for topic in std::iter::once(&config.input_topic).chain(&config.output_topics) {
            let metadata = consumer.fetch_metadata(Some(topic), timeout).map_err(|e| {
                PipeError::Unavailable {
                    doing: format!("reach the Kafka brokers at {}", config.brokers),
                    detail: format!("{e}; is a broker listening there?"),
                }
            })?;
            let found = metadata.topics().iter().any(|t| {
                t.name() == topic.as_str() && t.error().is_none() && !t.partitions().is_empty()
            });
            if !found {
                return Err(PipeError::Config(format!(
                    "the brokers have no topic {topic:?}; create it"
                )));
            }
        }
        producer
            .init_transactions(config.transaction_timeout)
            .map_err(|e| {
                if let Some(stop) = fatal(&producer, &e, &config.transactional_id) {
                    return stop;
                }
                match e.rdkafka_error_code() {
                    Some(RDKafkaErrorCode::UnsupportedFeature) => PipeError::Config(format!(
                        "the brokers at {} do not support transactions ({e}); a consume-transform-produce pipe needs a broker with the transaction coordinator (Apache Kafka 0.11 or later)",
                        config.brokers
                    )),
                    _ => PipeError::Unavailable {
                        doing: format!(
                            "initialise transactions for transactional.id {:?}",
                            config.transactional_id
                        ),
                        detail: format!(
                            "{e}; does the transaction coordinator answer (transaction.state.log replicas available)?"
                        ),
                    },
                }
            })?;
        tracing::info!(
            transactional_id = %config.transactional_id,
            input = %config.input_topic,
            group = %config.group,
            "transactions initialised; older instances with this transactional.id are fenced"
        );
        let outputs = config.output_topics.iter().cloned().collect();
        Ok(Self {
            config,
            outputs,
            consumer,
            producer,
        })
    }

    /// The loop: gather a batch, transact it, and on an abort rewind and
    /// read it again; until stopped.
    fn run<F, E>(self, mut transform: F, stop: &Stop) -> Result<PipeStats, PipeError>
    where
        F: FnMut(&Input) -> Result<Vec<Output>, E>,
        E: fmt::Display,
    {
        self.consumer
            .subscribe(&[&self.config.input_topic])
            .map_err(|e| PipeError::Fatal {
                doing: format!("subscribing to {:?}", self.config.input_topic),
                detail: e.to_string(),
            })?;
        let mut stats = PipeStats::default();
        let mut failures = 0u32;
        let outcome = loop {
            let batch = match self.gather(stop) {
                Ok(batch) => batch,
                Err(error) => break Err(error),
            };
            if batch.is_empty() {
                if stop.is_set() {
                    break Ok(());
                }
                continue;
            }
            stats.records_read += batch.len() as u64;
            let failure = match self.transact(&batch, &mut transform) {
                Ok(written) => {
                    failures = 0;
                    stats.records_written += written;
                    stats.transactions_committed += 1;
                    for ((topic, partition), next) in next_offsets(&batch) {
                        stats
                            .committed_offsets
                            .insert((topic.to_owned(), partition), next);
                    }
                    continue;
                }
                Err(Failure::Stop(error)) => break Err(error),
                Err(failure) => failure,
            };
            if let Err(error) = self.abort() {
                break Err(error);
            }
            stats.transactions_aborted += 1;
            match failure {
                Failure::Refused(error) => break Err(error),
                Failure::Transform { at, message } => {
                    failures += 1;
                    tracing::warn!(record = %at, error = %message, attempt = failures, "the transform failed; transaction aborted, the batch is read again");
                    if failures >= self.config.transform_attempts {
                        break Err(PipeError::Transform {
                            at,
                            attempts: failures,
                            message,
                        });
                    }
                }
                Failure::Abort(why) => {
                    tracing::warn!(error = %why, "Kafka transaction aborted; the batch is read again");
                }
                // Not reached: a stopped producer has nothing to abort and
                // left the loop above.
                Failure::Stop(error) => break Err(error),
            }
            if let Err(error) = self.rewind(&batch) {
                break Err(error);
            }
            if stop.wait(self.config.retry_delay) {
                break Ok(());
            }
        };
        if let Err(error) = &outcome {
            tracing::error!(%error, "Kafka transactional pipe stopped");
        }
        let Self {
            consumer, producer, ..
        } = self;
        consumer.unsubscribe();
        // Dropping the consumer closes it: it leaves the group, so its
        // partitions move to the other members at once.
        drop(consumer);
        drop(producer);
        tracing::debug!("Kafka transactional pipe closed; it left its group");
        outcome.map(|()| stats)
    }

    /// Up to `batch_size` records, waiting at most `linger` after the first;
    /// fewer if the pipe is to stop.
    fn gather(&self, stop: &Stop) -> Result<Vec<Input>, PipeError> {
        let mut batch: Vec<Input> = Vec::new();
        let mut deadline: Option<Instant> = None;
        while batch.len() < self.config.batch_size && !stop.is_set() {
            let wait = match deadline {
                Some(at) => match at.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break,
                },
                None => Duration::from_millis(100),
            };
            match self.consumer.poll(wait.min(Duration::from_millis(100))) {
                Some(Ok(record)) => {
                    batch.push(input(&record));
                    deadline.get_or_insert_with(|| Instant::now() + self.config.linger);
                }
                Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                    return Err(PipeError::Fatal {
                        doing: format!("consuming {:?}", self.config.input_topic),
                        detail: code.to_string(),
                    });
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "Kafka consumer error; polling on");
                }
                None => {}
            }
            let revoked = std::mem::take(
                &mut *self
                    .consumer
                    .context()
                    .revoked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            if !revoked.is_empty() {
                // Nothing of the batch is written yet: its records from the
                // revoked partitions are left to their next owner.
                batch.retain(|r| {
                    !revoked
                        .iter()
                        .any(|(t, p)| *t == r.topic && *p == r.partition)
                });
            }
        }
        Ok(batch)
    }

    /// One transaction: the outputs of every record of `batch` and the
    /// offsets past it; the outputs written.
    fn transact<F, E>(&self, batch: &[Input], transform: &mut F) -> Result<u64, Failure>
    where
        F: FnMut(&Input) -> Result<Vec<Output>, E>,
        E: fmt::Display,
    {
        let id = &self.config.transactional_id;
        self.producer
            .begin_transaction()
            .map_err(|e| self.failure(e, "beginning a transaction"))?;
        let mut written = 0u64;
        for record in batch {
            let outputs = transform(record).map_err(|e| Failure::Transform {
                at: record.coordinates(),
                message: e.to_string(),
            })?;
            for output in outputs {
                if !self.outputs.contains(&output.topic) {
                    return Err(Failure::Refused(PipeError::Config(format!(
                        "the transform wrote to topic {:?} for record {}, which is not among the output topics {:?}; add it to PipeConfig::output_topics (the transaction was aborted)",
                        output.topic,
                        record.coordinates(),
                        self.config.output_topics
                    ))));
                }
                self.send(&output)?;
                written += 1;
            }
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), next) in next_offsets(batch) {
            offsets
                .add_partition_offset(topic, partition, Offset::Offset(next))
                .map_err(|e| Failure::Abort(format!("listing the offsets to commit: {e}")))?;
        }
        let group = self.consumer.group_metadata().ok_or_else(|| {
            Failure::Abort("the consumer has no group metadata yet (not in the group)".into())
        })?;
        self.retrying("sending the offsets to the transaction", || {
            self.producer.send_offsets_to_transaction(
                &offsets,
                &group,
                self.config.transaction_timeout,
            )
        })?;
        self.retrying("committing the transaction", || {
            self.producer
                .commit_transaction(self.config.transaction_timeout)
        })?;
        tracing::debug!(transactional_id = %id, records = batch.len(), outputs = written, "transaction committed");
        Ok(written)
    }

    /// Queues one output in the open transaction, waiting while librdkafka's
    /// queue is full.
    fn send(&self, output: &Output) -> Result<(), Failure> {
        loop {
            let headers = output.headers.iter().fold(
                OwnedHeaders::new_with_capacity(output.headers.len()),
                |headers, (key, value)| {
                    headers.insert(Header {
                        key,
                        value: Some(value.as_ref()),
                    })
                },
            );
            let record: BaseRecord<'_, [u8], [u8]> = BaseRecord {
                topic: &output.topic,
                partition: None,
                payload: output.payload.as_deref(),
                key: output.key.as_deref(),
                timestamp: None,
                headers: Some(headers),
                delivery_opaque: (),
            };
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    // The producer's own thread serves delivery reports and
                    // so drains the queue.
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err((error, _)) => return Err(self.failure(error, "writing an output record")),
            }
        }
    }

    /// Runs `call` again while librdkafka says the call itself may be retried
    /// (a timeout, a coordinator moving), for up to the transaction timeout.
    fn retrying(
        &self,
        doing: &str,
        mut call: impl FnMut() -> Result<(), KafkaError>,
    ) -> Result<(), Failure> {
        let give_up = Instant::now() + self.config.transaction_timeout;
        loop {
            match call() {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(error))
                    if error.is_retriable()
                        && !error.is_fatal()
                        && !error.txn_requires_abort()
                        && Instant::now() < give_up =>
                {
                    tracing::debug!(%error, "{doing} failed; trying again");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(self.failure(error, doing)),
            }
        }
    }

    /// What an error while `doing` means for the transaction.
    fn failure(&self, error: KafkaError, doing: &str) -> Failure {
        match fatal(&self.producer, &error, &self.config.transactional_id) {
            Some(PipeError::Fatal { detail, .. }) => Failure::Stop(PipeError::Fatal {
                doing: doing.to_owned(),
                detail,
            }),
            Some(stop) => Failure::Stop(stop),
            None => Failure::Abort(format!("{doing}: {error}")),
        }
    }

    /// Aborts the open transaction: its records are never visible to
    /// `read_committed` readers.
    fn abort(&self) -> Result<(), PipeError> {
        self.retrying("aborting the transaction", || {
            self.producer
                .abort_transaction(self.config.transaction_timeout)
        })
        .map_err(|failure| match failure {
            Failure::Stop(error) | Failure::Refused(error) => error,
            Failure::Abort(detail)
            | Failure::Transform {
                message: detail, ..
            } => PipeError::Fatal {
                doing: "aborting the transaction".into(),
                detail,
            },
        })
    }

    /// Moves the consumer back to where `batch` started in each partition:
    /// the positions the last committed transaction left, so the aborted
    /// records are read again. A partition that cannot be rewound stops the
    /// pipe rather than let it commit past records never written.
    fn rewind(&self, batch: &[Input]) -> Result<(), PipeError> {
        let mut first: BTreeMap<(&str, i32), i64> = BTreeMap::new();
        for record in batch {
            first
                .entry((record.topic.as_str(), record.partition))
                .and_modify(|o| *o = (*o).min(record.offset))
                .or_insert(record.offset);
        }
        for ((topic, partition), offset) in first {
            self.consumer
                .seek(
                    topic,
                    partition,
                    Offset::Offset(offset),
                    Duration::from_secs(10),
                )
                .map_err(|e| PipeError::Fatal {
                    doing: format!("rewinding {topic}/{partition} to offset {offset} after an aborted transaction"),
                    detail: format!("{e}; the pipe stops rather than skip the aborted records, and a new instance reads them from the last committed offset"),
                })?;
        }
        Ok(())
    }
}

/// The error that ends the pipe, if `error` (or the producer's state) is
/// fatal: fenced by a newer instance, or another fatal error.
fn fatal(
    producer: &ThreadedProducer<DefaultProducerContext>,
    error: &KafkaError,
    transactional_id: &str,
) -> Option<PipeError> {
    let reported = match error {
        KafkaError::Transaction(e) if e.is_fatal() => Some((e.code(), e.to_string())),
        _ => None,
    };
    let (code, detail) = reported.or_else(|| producer.client().fatal_error())?;
    let fenced = matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    );
    Some(if fenced {
        PipeError::Fenced {
            transactional_id: transactional_id.to_owned(),
            detail,
        }
    } else {
        PipeError::Fatal {
            doing: "running a transaction".into(),
            detail,
        }
    })
}

/// For each partition in `batch`, the offset after its last record.
fn next_offsets(batch: &[Input]) -> BTreeMap<(&str, i32), i64> {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for record in batch {
        let entry = next
            .entry((record.topic.as_str(), record.partition))
            .or_insert(record.offset + 1);
        *entry = (*entry).max(record.offset + 1);
    }
    next
}

fn input(record: &BorrowedMessage<'_>) -> Input {
    let headers = record
        .headers()
        .map(|list| {
            list.iter()
                .map(|h| (h.key.to_owned(), h.value.map(Bytes::copy_from_slice)))
                .collect()
        })
        .unwrap_or_default();
    Input {
        topic: record.topic().to_owned(),
        partition: record.partition(),
        offset: record.offset(),
        key: record.key().map(Bytes::copy_from_slice),
        payload: record.payload().map(Bytes::copy_from_slice),
        headers,
        timestamp: record.timestamp().to_millis(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PipeConfig {
        PipeConfig::new("k:9092", "orders", "pricing", ["priced"], "pricing-0")
    }

    #[test]
    fn the_clients_read_committed_and_write_in_transactions() {
        let (consumer, producer) = client_configs(&config()).unwrap();
        assert_eq!(consumer.get("isolation.level"), Some("read_committed"));
        assert_eq!(consumer.get("enable.auto.commit"), Some("false"));
        assert_eq!(producer.get("transactional.id"), Some("pricing-0"));
        assert_eq!(producer.get("transaction.timeout.ms"), Some("60000"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(producer.get("message.timeout.ms"), Some("30000"));
    }

    #[test]
    fn a_record_times_out_before_its_transaction() {
        let short = PipeConfig {
            transaction_timeout: Duration::from_secs(5),
            settings: Settings::new().set("delivery.timeout.ms", "20000"),
            ..config()
        };
        let (_, producer) = client_configs(&short).unwrap();
        assert_eq!(producer.get("message.timeout.ms"), Some("5000"));
        assert_eq!(producer.get("delivery.timeout.ms"), None);
        let given = PipeConfig {
            settings: Settings::new().set("delivery.timeout.ms", "20000"),
            ..config()
        };
        let (_, producer) = client_configs(&given).unwrap();
        assert_eq!(producer.get("message.timeout.ms"), Some("20000"));
        assert_eq!(producer.get("delivery.timeout.ms"), None);
    }

    #[test]
    fn settings_that_break_the_transaction_are_refused() {
        for (name, value) in [
            ("isolation.level", "read_uncommitted"),
            ("transactional.id", "other"),
            ("transaction.timeout.ms", "1000"),
            ("enable.auto.commit", "true"),
            ("enable.idempotence", "false"),
        ] {
            let refused = client_configs(&PipeConfig {
                settings: Settings::new().set(name, value),
                ..config()
            })
            .unwrap_err();
            assert!(
                matches!(&refused, PipeError::Config(why) if why.contains(name)),
                "{refused}"
            );
        }
        for broken in [
            PipeConfig {
                transactional_id: " ".into(),
                ..config()
            },
            PipeConfig {
                output_topics: Vec::new(),
                ..config()
            },
            PipeConfig {
                batch_size: 0,
                ..config()
            },
        ] {
            assert!(matches!(client_configs(&broken), Err(PipeError::Config(_))));
        }
    }

    #[test]
    fn offsets_point_past_the_last_record_of_each_partition() {
        let record = |partition, offset| Input {
            topic: "orders".into(),
            partition,
            offset,
            key: None,
            payload: None,
            headers: Vec::new(),
            timestamp: None,
        };
        let batch = [record(0, 4), record(1, 9), record(0, 5), record(0, 6)];
        let next = next_offsets(&batch);
        assert_eq!(next.get(&("orders", 0)), Some(&7));
        assert_eq!(next.get(&("orders", 1)), Some(&10));
    }

    #[test]
    fn the_fenced_error_says_what_happened_and_what_to_do() {
        let shown = PipeError::Fenced {
            transactional_id: "pricing-0".into(),
            detail: "Producer fenced by newer instance".into(),
        }
        .to_string();
        for expected in [
            "fenced",
            "newer instance",
            "\"pricing-0\"",
            "must not continue",
        ] {
            assert!(shown.contains(expected), "{shown}");
        }
    }
}
