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

mod config;
mod error;
mod records;
mod worker;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub use self::config::PipeConfig;
use self::config::client_configs;
pub use self::error::PipeError;
pub use self::records::{Input, Output};
use self::worker::Worker;

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

/// Set when the pipe is to stop; its thread waits on it between attempts.
#[derive(Default)]
pub(super) struct Stop {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl Stop {
    pub(super) fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    pub(super) fn is_set(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `timeout`; whether the pipe is to stop.
    pub(super) fn wait(&self, timeout: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (stopped, _) = self
            .changed
            .wait_timeout_while(stopped, timeout, |stopped| !*stopped)
            .unwrap_or_else(|e| e.into_inner());
        *stopped
    }
}

pub(super) struct StopOnDrop(Arc<Stop>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}
