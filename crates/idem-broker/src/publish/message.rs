//! What every publisher shares: the [`Message`] it sends, with its own key,
//! and the [`Publish`] trait each transport implements. A module of its own so
//! the transports depend on it, and the module that chooses between them
//! (`publish`) depends on the transports, never the other way round.

use std::collections::BTreeMap;
use std::future::Future;

use idem_core::IdempotencyKey;

use super::error::PublishError;

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
