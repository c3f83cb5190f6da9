//! Publishers: hand a message to a broker or a webhook and return only once it
//! was confirmed, with the message's own key attached so the next hop can
//! dedupe it.
//!
//! Why "only once confirmed": the outbox relay marks a row sent, and the
//! dead-letter redrive marks a letter redriven, right after [`Publish::publish`]
//! returns `Ok`. A publish that returned before the broker took responsibility
//! for the message would let a broker crash lose it. So:
//!
//! | destination | the key travels as | `Ok` means |
//! | --- | --- | --- |
//! | RabbitMQ (`amqp://`) | `message_id` property (and an `Idempotency-Key` header) | the broker's publisher confirm (`basic.ack`), and the message was routed to a queue |
//! | NATS JetStream (`nats://`) | `Nats-Msg-Id` header (the stream's duplicate window is a second line of dedupe) | the stream's `PubAck` (a `duplicate` ack counts: the stream has it) |
//! | HTTP webhook (`http(s)://`) | `Idempotency-Key: "key"` header (RFC 8941 string) | a 2xx answer |
//!
//! A failure says whether another attempt may help ([`PublishError::verdict`],
//! an [`idem_retry::Verdict`]): a broker that is down, a nack, a 5xx or a 429
//! are retried; a webhook's 400 or 422 is not, and goes to the dead letters.
//!
//! Modules: [`Destination`] parsing (`destination`), the error (`error`), and one
//! module per transport (`amqp`, `nats`, `http`).

mod amqp;
mod destination;
mod error;
mod http;
mod nats;

use std::collections::BTreeMap;
use std::future::Future;

use idem_core::IdempotencyKey;

pub use self::amqp::AmqpPublisher;
pub use self::destination::{Destination, DestinationError};
pub use self::error::{PublishError, PublishErrorKind, classify};
pub use self::http::HttpPublisher;
pub use self::nats::NatsPublisher;

/// The header JetStream dedupes on.
pub const NATS_MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// One message: its own idempotency key, the payload bytes, and string headers.
///
/// The key is made where the intent is formed (derived from the originating
/// request's key with [`crate::outbox::derive_key`] when there is one) and never
/// changes on the way: outbox row, broker message id, consumer dedupe key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message's idempotency key.
    pub key: IdempotencyKey,
    /// The body.
    pub payload: Vec<u8>,
    /// Extra headers (AMQP headers table, NATS headers, HTTP headers).
    pub headers: BTreeMap<String, String>,
}

impl Message {
    /// A message with no headers.
    pub fn new(key: IdempotencyKey, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            key,
            payload: payload.into(),
            headers: BTreeMap::new(),
        }
    }

    /// Adds one header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

/// Something that delivers messages and says when the receiver confirmed them.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_broker::publish::PublishError> {
/// use idem_broker::publish::{self, Destination, Message, Publish};
/// use idem_core::IdempotencyKey;
///
/// let to: Destination = "nats://127.0.0.1:4222/orders.created".parse()?;
/// let publisher = publish::connect(&to).await?;
/// let key = IdempotencyKey::new("order-42/created").unwrap();
/// publisher.publish(&Message::new(key, br#"{"order":42}"#.to_vec())).await?;
/// // Here the stream has stored it, under Nats-Msg-Id = order-42/created.
/// # Ok(()) }
/// ```
pub trait Publish: Send + Sync {
    /// Publishes `message` and waits for the confirmation.
    fn publish(&self, message: &Message) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// A publisher for any [`Destination`], made by [`connect`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Publisher {
    /// RabbitMQ with publisher confirms.
    Amqp(AmqpPublisher),
    /// NATS JetStream.
    Nats(NatsPublisher),
    /// An HTTP webhook.
    Http(HttpPublisher),
}

impl Publisher {
    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        match self {
            Self::Amqp(p) => p.destination(),
            Self::Nats(p) => p.destination(),
            Self::Http(p) => p.destination(),
        }
    }
}

impl Publish for Publisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let result = match self {
            Self::Amqp(p) => p.publish(message).await,
            Self::Nats(p) => p.publish(message).await,
            Self::Http(p) => p.publish(message).await,
        };
        let outcome = if result.is_ok() {
            "confirmed"
        } else {
            "failed"
        };
        metrics::counter!(
            "messages_published_total",
            "transport" => self.destination().kind(),
            "outcome" => outcome
        )
        .increment(1);
        result
    }
}

/// Connects to `destination`: opens the connection (and, for RabbitMQ, a
/// channel in confirm mode) once; the publisher is then reused for many messages.
pub async fn connect(destination: &Destination) -> Result<Publisher, PublishError> {
    Ok(match destination {
        Destination::Amqp { .. } => Publisher::Amqp(AmqpPublisher::connect(destination).await?),
        Destination::Nats { .. } => Publisher::Nats(NatsPublisher::connect(destination).await?),
        Destination::Http { .. } => Publisher::Http(HttpPublisher::new(destination)?),
    })
}
