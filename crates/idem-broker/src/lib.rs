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
//! - [`consume`]: the consumer runtime (keys, single and batch mode, dedupe
//!   windows, reconnects, the [`Transport`](consume::Transport) trait) and
//!   [`Source`](consume::Source), a broker chosen by URL;
//! - [`publish`]: the [`Message`](publish::Message), the
//!   [`Publish`](publish::Publish) trait and its errors, and
//!   [`Destination`](publish::Destination), a broker or webhook chosen by URL;
//! - `transport`: one folder per transport, each whole (its URL and TLS
//!   options, connecting, its consumer transport, its publisher): RabbitMQ
//!   (feature `amqp`; confirms), NATS JetStream (`nats`), Kafka (`kafka`; the
//!   idempotent producer), Amazon SQS (`sqs`) and HTTP webhooks (`webhook`).
//!   Their consumer transports are re-exported from [`consume`], their
//!   publishers from [`publish`];
//! - [`kafka`]: the settings Kafka clients are checked against, and
//!   consume-transform-produce inside a Kafka transaction (feature `kafka`);
//!   the Kafka transport's folder, public for those;
//! - [`forward`]: the sidecar that delivers consumed messages to an HTTP
//!   endpoint (feature `webhook`, and a transport);
//! - [`outbox`]: [`Outbox::enqueue`](outbox::Outbox::enqueue) inside the business transaction;
//! - [`relay`]: claims pending outbox rows and publishes them;
//! - [`dead_letter`]: redrive, and the dead-letter types.
//!
//! Features: `amqp`, `nats`, `kafka`, `sqs` and `webhook`, all on by default. A destination
//! or source whose feature is off is refused when connecting, with the
//! feature to enable.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

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

pub mod consume;
pub mod dead_letter;
#[cfg(all(feature = "webhook", any(feature = "amqp", feature = "nats")))]
#[cfg_attr(
    docsrs,
    doc(cfg(all(feature = "webhook", any(feature = "amqp", feature = "nats"))))
)]
pub mod forward;
pub mod outbox;
pub mod publish;
pub mod relay;
mod transport;

pub use transport::kafka;
