//! Effectively-once messaging: consumers that apply, commit and only then ack; a
//! transactional outbox whose relay publishes each message with its own key;
//! dead letters that keep the key and can be redriven.
//!
//! The tables (outbox, dead letters, consumers' failed attempts) are the
//! stores': their contracts are in `idem-core` ([`idem_core::OutboxStore`],
//! [`idem_core::AtomicOutbox`], [`idem_core::DeadLetterStore`],
//! [`idem_core::AttemptStore`]), their SQL and migrations in `idem-sqlite`
//! and `idem-postgres`. This crate is written once over those contracts.
//!
//! Modules:
//! - [`consume`]: the consumer runtime, and its RabbitMQ (feature `amqp`),
//!   NATS JetStream (feature `nats`), Kafka (feature `kafka`) and Amazon SQS
//!   (feature `sqs`) transports;
//! - [`kafka`]: the settings Kafka clients are checked against, and
//!   consume-transform-produce inside a Kafka transaction (feature `kafka`);
//! - [`forward`]: the sidecar that delivers consumed messages to an HTTP
//!   endpoint (feature `webhook`, and a transport);
//! - [`outbox`]: [`Outbox::enqueue`](outbox::Outbox::enqueue) inside the business transaction;
//! - [`relay`]: claims pending outbox rows and publishes them;
//! - [`publish`]: publishers for RabbitMQ (confirms; `amqp`), NATS JetStream
//!   (`nats`), Kafka (the idempotent producer; `kafka`), Amazon SQS (`sqs`)
//!   and HTTP webhooks (`webhook`);
//! - [`dead_letter`]: redrive, and the dead-letter types.
//!
//! Features: `amqp`, `nats`, `kafka`, `sqs` and `webhook`, all on by default. A destination
//! or source whose feature is off is refused when connecting, with the
//! feature to enable.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(not(any(
    feature = "amqp",
    feature = "nats",
    feature = "webhook",
    feature = "kafka",
    feature = "sqs"
)))]
compile_error!(
    "idem-broker publishes and consumes through at least one transport: enable the crate feature amqp, nats, kafka, sqs or webhook"
);

mod amqp_conn;
pub mod consume;
pub mod dead_letter;
#[cfg(all(feature = "webhook", any(feature = "amqp", feature = "nats")))]
pub mod forward;
pub mod kafka;
mod nats_conn;
pub mod outbox;
pub mod publish;
pub mod relay;
mod sqs_conn;
