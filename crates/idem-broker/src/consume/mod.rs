//! Consumers that apply, commit, and only then ack.
//!
//! Delivery from RabbitMQ, NATS JetStream, Kafka and Amazon SQS is at-least-once: a message is
//! redelivered when its consumer dies before acking, and publishers send
//! duplicates. A consumer built here applies each message's effect once per
//! idempotency key, in the same transaction as the dedupe record, and acks
//! only after that transaction committed. A redelivery of a committed message
//! is answered from the store and acked without running the effect again;
//! duplicates are normal and logged at info (`duplicates_suppressed_total`
//! counts them).
//!
//! # Layout
//!
//! This module only declares and re-exports; each module below imports what
//! it uses from the module that defines it. The transports themselves live
//! in the crate's transport folders, one per broker, and are re-exported
//! here; they depend on the shared modules (`transport`, `message`, `window`),
//! never the reverse, and `source` (which chooses a transport) depends on
//! them:
//!
//! - [`AmqpTransport`] (feature `amqp`): RabbitMQ through lapin (manual ack, prefetch);
//! - [`NatsTransport`] (feature `nats`): NATS JetStream through async-nats
//!   (pull, explicit ack, ack-wait);
//! - [`KafkaTransport`] (feature `kafka`): a Kafka consumer group member
//!   through rdkafka (offsets committed after the effect, partitions in parallel,
//!   each in order);
//! - [`SqsTransport`] (feature `sqs`): an Amazon SQS queue through the
//!   official SDK (long polling, the visibility timeout as the lease, deleted
//!   after the commit, FIFO groups each in order).
//!
//! The modules here:
//!
//! - `transport`: the [`Transport`] and [`Settle`] traits a broker adapter implements;
//! - `reconnect`: [`Reconnecting`], a transport that connects again after a
//!   lost connection (full-jitter backoff, [`Reconnect`]), and says so to `/healthz`;
//! - `source` (feature `amqp`, `nats`, `kafka` or `sqs`): [`Source`], a broker chosen by URL, and [`AnyTransport`];
//! - `message`: [`Message`], broker-neutral, and [`KeyedMessage`];
//! - `key`: [`KeyRule`], where keys come from and what to do without one;
//! - `apply`: [`Apply`] / [`ApplyBatch`], and [`AtomicApply`], a message's effect in any store's transaction ([`AtomicSetApply`]: one effect for a batch's messages);
//! - `store`: [`ConsumerStore`], the store's dead letters and failed attempts;
//! - `config`: [`ConsumerConfig`] with the defaults;
//! - `runtime`: [`Consumer`] and its loop in single mode (receive, work on
//!   up to the concurrency at once, drain and close on shutdown);
//! - `error`: [`ConsumeError`], why a consumer stopped;
//! - `start`: the checks before the first delivery (the dedupe window, the
//!   broker's delivery limit) and the sweep of old failure counts;
//! - `watchdog`: restarts a consumer that holds deliveries without progress;
//! - `process`: one delivery's path: its key, its effect applied patiently;
//! - `settle`: what becomes of the answer: acked, given back, or dead-lettered;
//! - `duplicate`: the log line of a duplicate;
//! - `batch`: [`Consumer::run_batched`], N messages per transaction;
//! - `stats`: [`Stats`], counters for tests and the benchmark.

mod apply;
mod batch;
mod config;
mod duplicate;
mod error;
mod key;
mod message;
mod process;
mod reconnect;
mod runtime;
mod settle;
#[cfg(any(feature = "amqp", feature = "nats", feature = "kafka", feature = "sqs"))]
mod source;
mod start;
mod stats;
mod store;
mod transport;
mod watchdog;
mod window;

pub use apply::{Apply, ApplyBatch, AtomicApply, AtomicSetApply, BatchAnswer};
pub use config::{
    Checkpoint, ConsumerConfig, DEFAULT_BATCH, DEFAULT_BATCHES_AT_ONCE, DEFAULT_CONCURRENCY,
    DEFAULT_MAX_ATTEMPTS,
};
pub use error::ConsumeError;
pub use idem_core::{AttemptStore, Failures};
pub use key::{KeyRule, KeySource, MissingKey, NoKey};
pub use message::{KeyedMessage, Message};
pub use reconnect::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_RECONNECT_MAX, DEFAULT_RECONNECT_MIN, Reconnect, Reconnecting,
};
pub use runtime::Consumer;
#[cfg(any(feature = "amqp", feature = "nats", feature = "kafka", feature = "sqs"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "amqp", feature = "nats", feature = "kafka", feature = "sqs")))
)]
pub use source::{AnySettle, AnyTransport, InvalidSource, Source, SourceOptions};
pub use stats::{Stats, StatsSnapshot};
pub use store::ConsumerStore;
pub use transport::{Delivery, Route, Settle, Transport, TransportError, TransportErrorKind};
pub use window::{BrokerHorizon, DeliveryLimit, WindowTerms};

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use crate::transport::amqp::consume::{AmqpSettle, AmqpTransport};
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use crate::transport::kafka::consume::{KafkaOptions, KafkaSettle, KafkaTransport};
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use crate::transport::nats::consume::{NatsOptions, NatsSettle, NatsTransport};
pub use crate::transport::sqs::KEY_ATTRIBUTE as SQS_KEY_ATTRIBUTE;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub use crate::transport::sqs::consume::{SqsOptions, SqsSettle, SqsTransport};
