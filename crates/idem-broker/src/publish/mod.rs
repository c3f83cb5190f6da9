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
//! | Kafka (`kafka://`) | `idempotency-key` header (and the record key, if the destination asks) | the idempotent producer's delivery report: every in-sync replica has it |
//! | Amazon SQS (`sqs://`) | `idempotency-key` message attribute (and, on a FIFO queue, `MessageDeduplicationId`) | `SendMessage` answered with a message id: SQS stored it |
//!
//! A failure says whether another attempt may help ([`PublishError::verdict`],
//! an [`idem_retry::Verdict`]): a broker that is down, a nack, a 5xx or a 429
//! are retried; a webhook's 400 or 422 is not, and goes to the dead letters.
//!
//! Modules: [`Destination`] parsing (`destination`), the error (`error`), the
//! [`Message`] and the [`Publish`] trait every publisher shares (`message`),
//! and [`Publisher`] and [`connect`] here, choosing among the transports. The
//! publishers themselves live in the crate's transport folders, one per
//! broker, each behind its crate feature, and are re-exported here:
//! `AmqpPublisher` (feature `amqp`), `NatsPublisher` (feature `nats`),
//! `HttpPublisher` (feature `webhook`), `KafkaPublisher` (feature `kafka`),
//! `SqsPublisher` (feature `sqs`). Every destination parses
//! whatever the features; connecting to one whose transport was left out is
//! a [`PublishErrorKind::Config`] error.

pub(crate) mod destination;
pub(crate) mod error;
pub(crate) mod message;

pub use self::destination::{Destination, DestinationError, RecordKey, SqsGroup, redact};
pub use self::error::{PublishError, PublishErrorKind, classify};
pub use self::message::{Message, Publish};
#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use crate::transport::amqp::publish::AmqpPublisher;
#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub use crate::transport::http::publish::HttpPublisher;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use crate::transport::kafka::publish::KafkaPublisher;
pub use crate::transport::nats::MSG_ID_HEADER as NATS_MSG_ID_HEADER;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use crate::transport::nats::publish::NatsPublisher;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub use crate::transport::sqs::publish::SqsPublisher;

/// A publisher for any [`Destination`], made by [`connect`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Publisher {
    /// RabbitMQ with publisher confirms.
    #[cfg(feature = "amqp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
    Amqp(AmqpPublisher),
    /// NATS JetStream.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    Nats(NatsPublisher),
    /// An HTTP webhook.
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
    Http(HttpPublisher),
    /// Kafka, with the idempotent producer.
    #[cfg(feature = "kafka")]
    #[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
    Kafka(KafkaPublisher),
    /// Amazon SQS.
    #[cfg(feature = "sqs")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
    Sqs(SqsPublisher),
}

impl Publisher {
    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        match *self {
            #[cfg(feature = "amqp")]
            Self::Amqp(ref p) => p.destination(),
            #[cfg(feature = "nats")]
            Self::Nats(ref p) => p.destination(),
            #[cfg(feature = "webhook")]
            Self::Http(ref p) => p.destination(),
            #[cfg(feature = "kafka")]
            Self::Kafka(ref p) => p.destination(),
            #[cfg(feature = "sqs")]
            Self::Sqs(ref p) => p.destination(),
        }
    }
}

impl Publish for Publisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let result = match *self {
            #[cfg(feature = "amqp")]
            Self::Amqp(ref p) => p.publish(message).await,
            #[cfg(feature = "nats")]
            Self::Nats(ref p) => p.publish(message).await,
            #[cfg(feature = "webhook")]
            Self::Http(ref p) => p.publish(message).await,
            #[cfg(feature = "kafka")]
            Self::Kafka(ref p) => p.publish(message).await,
            #[cfg(feature = "sqs")]
            Self::Sqs(ref p) => p.publish(message).await,
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

/// What connecting may need beyond the destination itself.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// How an `https://` webhook destination is reached (the roots its
    /// certificate is checked against, a client certificate); `None`:
    /// webpki's bundled roots.
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
    pub webhook_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// Connects to `destination`: opens the connection (and, for RabbitMQ, a
/// channel in confirm mode) once; the publisher is then reused for many messages.
pub async fn connect(destination: &Destination) -> Result<Publisher, PublishError> {
    connect_with(destination, &ConnectOptions::default()).await
}

/// [`connect`], with `options`.
#[cfg_attr(not(feature = "webhook"), allow(unused_variables))]
pub async fn connect_with(
    destination: &Destination,
    options: &ConnectOptions,
) -> Result<Publisher, PublishError> {
    Ok(match destination {
        #[cfg(feature = "amqp")]
        Destination::Amqp { .. } => Publisher::Amqp(AmqpPublisher::connect(destination).await?),
        #[cfg(feature = "nats")]
        Destination::Nats { .. } => Publisher::Nats(NatsPublisher::connect(destination).await?),
        #[cfg(feature = "webhook")]
        Destination::Http { .. } => Publisher::Http(HttpPublisher::with_tls(
            destination,
            options.webhook_tls.as_deref(),
        )?),
        #[cfg(feature = "kafka")]
        Destination::Kafka { .. } => Publisher::Kafka(KafkaPublisher::connect(destination).await?),
        #[cfg(feature = "sqs")]
        Destination::Sqs { .. } => Publisher::Sqs(SqsPublisher::connect(destination).await?),
        #[cfg(not(all(
            feature = "amqp",
            feature = "nats",
            feature = "webhook",
            feature = "kafka",
            feature = "sqs"
        )))]
        other => return Err(left_out(other)),
    })
}

/// The error for a destination whose transport this build was made without.
#[cfg(not(all(
    feature = "amqp",
    feature = "nats",
    feature = "webhook",
    feature = "kafka",
    feature = "sqs"
)))]
fn left_out(destination: &Destination) -> PublishError {
    let feature = match destination {
        Destination::Amqp { .. } => "amqp",
        Destination::Nats { .. } => "nats",
        Destination::Http { .. } => "webhook",
        Destination::Kafka { .. } => "kafka",
        Destination::Sqs { .. } => "sqs",
    };
    PublishError::new(
        PublishErrorKind::Config,
        destination.redacted(),
        format!(
            "this build of idem-broker has no {} publisher; enable its crate feature {feature}",
            destination.kind()
        ),
    )
}
