//! One folder per transport: RabbitMQ (`amqp`), NATS JetStream (`nats`),
//! Kafka (`kafka`), Amazon SQS (`sqs`) and HTTP (`http`).
//!
//! Each folder holds its transport whole: `mod.rs` reads its URL (TLS
//! options, credentials) and names what the key travels in; `connect.rs`
//! reaches the broker; `consume.rs` is its consumer transport (a
//! [`Transport`](crate::consume::Transport)); `publish.rs` its publisher (a
//! [`Publish`](crate::publish::Publish)). Above them, [`crate::consume`]
//! holds the runtime and [`crate::publish`] the message and its errors, each
//! with the dispatch that chooses a transport from a URL
//! ([`Source`](crate::consume::Source),
//! [`Destination`](crate::publish::Destination)); the transports depend on
//! those shared modules, and only the dispatch depends on the transports.
//!
//! Every build reads every URL: a source or a destination parses whatever
//! the features, and connecting to one whose transport was left out is
//! refused with the feature to enable. So each folder's `mod.rs` is built
//! always, and gates the rest of its folder on its feature in one block at
//! its top; HTTP, which has no URL of its own to read, is gated whole here.

pub(crate) mod amqp;
#[cfg(feature = "webhook")]
pub(crate) mod http;
pub mod kafka;
pub(crate) mod nats;
pub(crate) mod sqs;
