//! The pipe's thread: the clients, the batches and their transactions.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::error::fatal;
use super::records::{input, next_offsets};
use super::{Input, Output, PipeConfig, PipeError, PipeStats, Stop};

/// What librdkafka calls back into: the partitions a rebalance takes away, so
/// the records of the batch being gathered that came from them are dropped
/// (their next owner reads them from the last committed offset).
#[derive(Default)]
pub(super) struct PipeContext {
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

/// Why a transaction did not commit.
pub(super) enum Failure {
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
pub(super) struct Worker {
    pub(super) config: PipeConfig,
    outputs: BTreeSet<String>,
    consumer: BaseConsumer<PipeContext>,
    producer: ThreadedProducer<DefaultProducerContext>,
}

impl Worker {
    /// Creates the clients, checks the topics and initialises transactions
    /// (blocking).
    pub(super) fn start(
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
    pub(super) fn run<F, E>(self, mut transform: F, stop: &Stop) -> Result<PipeStats, PipeError>
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
    pub(super) fn gather(&self, stop: &Stop) -> Result<Vec<Input>, PipeError> {
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
    pub(super) fn transact<F, E>(&self, batch: &[Input], transform: &mut F) -> Result<u64, Failure>
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
    pub(super) fn send(&self, output: &Output) -> Result<(), Failure> {
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
    pub(super) fn retrying(
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
    pub(super) fn failure(&self, error: KafkaError, doing: &str) -> Failure {
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
    pub(super) fn abort(&self) -> Result<(), PipeError> {
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
    pub(super) fn rewind(&self, batch: &[Input]) -> Result<(), PipeError> {
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
