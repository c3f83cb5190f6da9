//! Effectively-once messaging: consumers that apply, commit and only then ack; a
//! transactional outbox whose relay publishes each message with its own key;
//! dead letters that keep the key and can be redriven.
//!
//! Modules:
//! - [`consume`]: the consumer runtime and its RabbitMQ and NATS JetStream adapters;
//! - [`forward`]: the sidecar that delivers messages to an HTTP endpoint;
//! - [`outbox`]: `enqueue(tx, destination, message)` inside the business transaction;
//! - [`relay`]: claims pending outbox rows and publishes them;
//! - [`publish`]: publishers for RabbitMQ (confirms), NATS JetStream and HTTP webhooks;
//! - [`dead_letter`]: the dead-letter table: record, list, show, redrive.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Runs `$body` with `$store` bound to the concrete store inside an
/// [`idem::AnyStore`].
macro_rules! each_store {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            idem::AnyStore::Sqlite($store) => $body,
            idem::AnyStore::Postgres($store) => $body,
            #[allow(unreachable_patterns)]
            _ => Err(crate::db::unsupported_store()),
        }
    };
}

pub mod consume;
mod db;
pub mod dead_letter;
pub mod forward;
pub mod outbox;
pub mod publish;
pub mod relay;
mod schema;
