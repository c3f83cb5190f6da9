//! RabbitMQ publisher: persistent, mandatory messages on a channel in confirm
//! mode, `message_id` = the key.
//!
//! `Ok` means the broker confirmed the message (`basic.ack`) *and* routed it to
//! at least one queue: with `mandatory` set, an unroutable message comes back
//! (`basic.return`) before its ack, and is reported as not taken, so a relay
//! retries it instead of marking sent a message that nobody will ever read.
//! A broken connection is reopened on the next publish, and so is one whose
//! channel refused a message (`basic.nack`): a channel opened while a
//! quorum queue was electing a leader can go on refusing every publish to it
//! after the election (seen on RabbitMQ 3.10), and a new one is not.

use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::IDEMPOTENCY_KEY_HEADER;
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::connect::{ConnectFailure, connect};
use crate::publish::destination::Destination;
use crate::publish::error::{PublishError, PublishErrorKind};
use crate::publish::message::{Message, Publish};

/// Persistent delivery (survives a broker restart on a durable queue).
const PERSISTENT: u8 = 2;

/// Publishes to one exchange and routing key, with publisher confirms.
#[derive(Debug)]
pub struct AmqpPublisher {
    destination: Destination,
    uri: String,
    exchange: ShortString,
    routing_key: ShortString,
    link: Mutex<Option<Link>>,
    /// Connections opened so far: each link's number, so that a refusal on
    /// an old one never closes its successor.
    opened: AtomicU64,
}

#[derive(Debug)]
struct Link {
    // Kept so the connection lives as long as the channel, and closed with it.
    connection: Connection,
    channel: Channel,
    number: u64,
}

impl AmqpPublisher {
    /// Connects and opens a channel in confirm mode.
    pub async fn connect(destination: &Destination) -> Result<Self, PublishError> {
        let Destination::Amqp {
            url,
            exchange,
            routing_key,
        } = destination
        else {
            return Err(PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                "not an amqp:// destination",
            ));
        };
        let short = |what: &str, value: &str| {
            ShortString::try_new(value).map_err(|e| {
                PublishError::new(
                    PublishErrorKind::Config,
                    destination.redacted(),
                    format!("the {what} is longer than AMQP's 255 bytes"),
                )
                .with_source(e)
            })
        };
        let publisher = Self {
            destination: destination.clone(),
            uri: url.clone(),
            exchange: short("exchange", exchange)?,
            routing_key: short("routing key", routing_key)?,
            link: Mutex::new(None),
            opened: AtomicU64::new(0),
        };
        let link = publisher.open().await?;
        *publisher.link.lock().await = Some(link);
        Ok(publisher)
    }

    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    fn fail(&self, kind: PublishErrorKind, message: impl Into<String>) -> PublishError {
        PublishError::new(kind, self.destination.redacted(), message)
    }

    async fn open(&self) -> Result<Link, PublishError> {
        let unavailable = |doing: &str, e: lapin::Error| {
            self.fail(
                PublishErrorKind::Unavailable,
                format!("could not {doing}: {e}; is RabbitMQ running there, and are the user, password and vhost right?"),
            )
            .with_source(e)
        };
        let connection = connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(|failure| match failure {
                ConnectFailure::Client(e, None) => unavailable("connect", e),
                ConnectFailure::Client(e, Some(advice)) => self
                    .fail(
                        PublishErrorKind::Unavailable,
                        format!("could not connect: {e}; {advice}"),
                    )
                    .with_source(e),
                silent @ ConnectFailure::Silent(_) => self.fail(
                    PublishErrorKind::Unavailable,
                    format!("could not connect: {silent}"),
                ),
                ConnectFailure::Config(why) | ConnectFailure::Tls(why) => self.fail(
                    PublishErrorKind::Config,
                    format!("could not connect: {why}"),
                ),
            })?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| unavailable("open a channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| unavailable("turn on publisher confirms", e))?;
        Ok(Link {
            connection,
            channel,
            number: self.opened.fetch_add(1, Ordering::Relaxed) + 1,
        })
    }

    /// Closes link `number` if it is still the open one: the next publish
    /// connects again (through the URL's nodes in order).
    async fn retire(&self, number: u64) {
        let mut link = self.link.lock().await;
        let same = link.as_ref().is_some_and(|open| open.number == number);
        if same
            && let Some(old) = link.take()
            && let Err(error) = old
                .connection
                .close(200, "reopened after a refusal".into())
                .await
        {
            tracing::debug!(%error, "closing a RabbitMQ connection after a nack failed");
        }
    }

    /// The open channel, reopening the connection if it broke.
    async fn channel(&self) -> Result<(Channel, u64), PublishError> {
        let mut link = self.link.lock().await;
        if let Some(open) = link.as_ref()
            && open.channel.status().connected()
        {
            return Ok((open.channel.clone(), open.number));
        }
        *link = None;
        let fresh = self.open().await?;
        let channel = (fresh.channel.clone(), fresh.number);
        *link = Some(fresh);
        Ok(channel)
    }

    fn properties(message: &Message) -> Result<BasicProperties, String> {
        let message_id = ShortString::try_new(message.key.as_str())
            .map_err(|e| format!("the key does not fit an AMQP message_id: {e}"))?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            let name = ShortString::try_new(name.as_str())
                .map_err(|_| format!("header name {name:?} is longer than 255 bytes"))?;
            headers.insert(
                name,
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
        if !message.headers.contains_key(IDEMPOTENCY_KEY_HEADER) {
            headers.insert(
                IDEMPOTENCY_KEY_HEADER.into(),
                AMQPValue::LongString(LongString::from(message.key.as_str())),
            );
        }
        Ok(BasicProperties::default()
            .with_message_id(message_id)
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers))
    }
}

impl Publish for AmqpPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let properties =
            Self::properties(message).map_err(|m| self.fail(PublishErrorKind::Rejected, m))?;
        let (channel, link) = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let broken = |e: lapin::Error| {
            self.fail(
                PublishErrorKind::Unavailable,
                format!("the publish was not confirmed: {e}"),
            )
            .with_source(e)
        };
        let confirm = channel
            .basic_publish(
                self.exchange.clone(),
                self.routing_key.clone(),
                options,
                &message.payload,
                properties,
            )
            .await
            .map_err(broken)?;
        match confirm.await.map_err(broken)? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => Err(self.fail(
                PublishErrorKind::NotTaken,
                format!(
                    "RabbitMQ returned the message ({} {}): no queue is bound to exchange {:?} with routing key {:?}; declare and bind the queue",
                    returned.reply_code, returned.reply_text, self.exchange.as_str(), self.routing_key.as_str()
                ),
            )),
            Confirmation::Nack(None) => {
                self.retire(link).await;
                Err(self.fail(
                    PublishErrorKind::NotTaken,
                    "RabbitMQ refused the message (basic.nack): it could not store it; the next publish connects again",
                ))
            }
            Confirmation::NotRequested => Err(self.fail(
                PublishErrorKind::Unavailable,
                "the channel is not in confirm mode, so the broker never confirmed the message",
            )),
        }
    }
}
