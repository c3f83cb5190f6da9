//! The seam between the runtime and a broker: receive deliveries, settle them.
//!
//! Why so small: the guarantee lives in the *order* of three steps (apply,
//! commit, ack), and that order is the runtime's. A transport only has to hand
//! over deliveries and settle them when told: ack, or give back for
//! redelivery. It never decides when; it never acks on its own (no auto-ack
//! mode exists in either adapter).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::message::Message;
use crate::publish::Destination;

/// A transport failure (connection lost, channel closed, protocol error, or
/// something a new connection would not fix: see [`TransportErrorKind`]).
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub struct TransportError {
    context: String,
    kind: TransportErrorKind,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// What a transport failure means for the process: whether connecting again
/// can fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// The connection was lost or could not be made (a cut, a broker restart,
    /// a timeout): connecting again fixes it.
    Connection,
    /// The broker refused the credentials or the permission (RabbitMQ
    /// `ACCESS_REFUSED`, a NATS authorization violation).
    Refused,
    /// What the consumer reads from does not exist (a deleted queue, stream
    /// or topic).
    Missing,
    /// The settings are wrong (a malformed URL, a consumer that does not ack
    /// explicitly, a feature left out of the build).
    Config,
}

impl TransportErrorKind {
    /// Whether connecting again cannot fix it: only a changed setting, a
    /// created queue or granted credentials can.
    pub fn is_fatal(self) -> bool {
        self != Self::Connection
    }
}

impl TransportError {
    /// A lost or failed connection while doing `context`: connecting again
    /// may fix it.
    pub fn new(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::of(TransportErrorKind::Connection, context, source)
    }

    /// A failure of the given kind while doing `context`.
    pub fn of(
        kind: TransportErrorKind,
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            context: context.into(),
            kind,
            source: source.into(),
        }
    }

    /// What it means for the process.
    pub fn kind(&self) -> TransportErrorKind {
        self.kind
    }

    /// Whether connecting again cannot fix it.
    pub fn is_fatal(&self) -> bool {
        self.kind.is_fatal()
    }
}

/// Settles one delivery. Each delivery carries its own handle, so many
/// deliveries can be worked on at once while the transport keeps receiving.
pub trait Settle: Send + Sync + 'static {
    /// Tells the broker the message is done with. Called only after the
    /// effect's transaction committed (or the message was dead-lettered and
    /// that record committed).
    fn ack(&self) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Gives the message back for redelivery, ideally not before `delay`
    /// (NATS honours the delay itself; on RabbitMQ the handle waits before it
    /// requeues, holding one prefetch slot meanwhile).
    fn requeue(&self, delay: Duration) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Acks a batch of deliveries, all received on one transport and none
    /// settled yet, after their transaction committed. The runtime calls it
    /// only when every delivery received before these is already settled, so
    /// an adapter may settle them with one cumulative ack (RabbitMQ's
    /// `multiple`). The default acks them one by one.
    fn ack_all(settles: Vec<Self>) -> impl Future<Output = Result<(), TransportError>> + Send
    where
        Self: Sized,
    {
        async move {
            for settle in &settles {
                settle.ack().await?;
            }
            Ok(())
        }
    }
}

/// A received message and the handle that settles it.
#[derive(Debug)]
pub struct Delivery<S> {
    /// The message.
    pub message: Message,
    /// Its settle handle.
    pub settle: S,
}

/// Where a transport's messages come from and where a redrive sends them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// A printable name of the source, its URL through [`idem_core::redact_url`]
    /// (`amqp://guest:***@127.0.0.1:5672/%2f/orders`, `nats://127.0.0.1:4222/ORDERS/billing`).
    pub origin: String,
    back: Back,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Back {
    /// The default exchange, routing key = the queue: straight back to the queue.
    Queue { url: String, queue: String },
    /// The subject the message was published to.
    Subject { url: String },
    /// The Kafka topic the record was read from.
    Topic {
        brokers: String,
        settings: crate::transport::kafka::Settings,
    },
    /// Always this destination.
    Fixed(Destination),
}

impl Route {
    /// Messages from a RabbitMQ queue: a redrive publishes to the default
    /// exchange with the queue's name as routing key, i.e. straight back to it.
    pub fn queue(
        origin: impl Into<String>,
        url: impl Into<String>,
        queue: impl Into<String>,
    ) -> Self {
        Self {
            origin: origin.into(),
            back: Back::Queue {
                url: url.into(),
                queue: queue.into(),
            },
        }
    }

    /// Messages from a NATS JetStream consumer: a redrive publishes to the
    /// subject each message was published to.
    pub fn subject(origin: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            origin: origin.into(),
            back: Back::Subject { url: url.into() },
        }
    }

    /// Records from Kafka: a redrive produces to the topic each record was
    /// read from, with its original key.
    pub fn topic(
        origin: impl Into<String>,
        brokers: impl Into<String>,
        settings: crate::transport::kafka::Settings,
    ) -> Self {
        Self {
            origin: origin.into(),
            back: Back::Topic {
                brokers: brokers.into(),
                settings,
            },
        }
    }

    /// Every message is redriven to `destination`.
    pub fn fixed(origin: impl Into<String>, destination: Destination) -> Self {
        Self {
            origin: origin.into(),
            back: Back::Fixed(destination),
        }
    }

    /// Whether the messages are Kafka records (positions are
    /// `TOPIC/PARTITION/OFFSET`).
    pub(crate) fn is_kafka(&self) -> bool {
        matches!(self.back, Back::Topic { .. })
    }

    /// Where a redrive of `message` publishes it.
    pub fn destination(&self, message: &Message) -> Destination {
        match &self.back {
            Back::Queue { url, queue } => Destination::Amqp {
                url: url.clone(),
                exchange: String::new(),
                routing_key: queue.clone(),
            },
            Back::Subject { url } => Destination::Nats {
                url: url.clone(),
                subject: message.subject.clone(),
            },
            Back::Topic { brokers, settings } => Destination::Kafka {
                brokers: brokers.clone(),
                topic: message.subject.clone(),
                record_key: crate::publish::RecordKey::None,
                settings: settings.clone(),
            },
            Back::Fixed(destination) => destination.clone(),
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)
    }
}

/// A broker the runtime consumes from.
///
/// `receive` must be cancel-safe: the runtime races it against a timer (to
/// close a batch) and against shutdown, and a delivery must not be lost when
/// the race is lost.
///
/// ```
/// use std::collections::VecDeque;
/// use std::time::Duration;
/// use idem_broker::consume::{Delivery, Message, Route, Settle, Transport, TransportError};
///
/// /// An in-memory transport, for illustration.
/// struct Memory(VecDeque<Message>);
/// struct Noop;
/// impl Settle for Noop {
///     async fn ack(&self) -> Result<(), TransportError> { Ok(()) }
///     async fn requeue(&self, _delay: Duration) -> Result<(), TransportError> { Ok(()) }
/// }
/// impl Transport for Memory {
///     type Settle = Noop;
///     async fn receive(&mut self) -> Result<Option<Delivery<Noop>>, TransportError> {
///         Ok(self.0.pop_front().map(|message| Delivery { message, settle: Noop }))
///     }
///     fn route(&self) -> Route {
///         Route::queue("memory://", "amqp://127.0.0.1", "orders")
///     }
/// }
/// ```
pub trait Transport: Send + 'static {
    /// The per-delivery settle handle.
    type Settle: Settle;

    /// The next delivery; `None` when the subscription ended (consumer
    /// cancelled, stream deleted). Cancel-safe.
    fn receive(
        &mut self,
    ) -> impl Future<Output = Result<Option<Delivery<Self::Settle>>, TransportError>> + Send;

    /// Where messages come from and where a redrive sends them back.
    fn route(&self) -> Route;

    /// How long the broker keeps messages a consumer may be handed again by
    /// a replay (a Kafka topic's `retention.ms`, a JetStream stream's max
    /// age), with the source's name; `None` where the broker has no such
    /// horizon or does not say. The runtime refuses to start when it exceeds
    /// the dedupe window (see [`WindowTerms`](super::WindowTerms)).
    fn replay_horizon(&self) -> Option<super::BrokerHorizon> {
        None
    }

    /// How many deliveries the broker allows a message before moving it to a
    /// dead-letter queue of its own (an SQS redrive policy's
    /// `maxReceiveCount`), with its source; `None` where it has no such
    /// limit. The runtime warns at start-up when it is below the consumer's
    /// attempts: the broker would move a failing message aside before Idem
    /// dead-letters it with its key and reason.
    fn delivery_limit(&self) -> Option<super::DeliveryLimit> {
        None
    }

    /// The runtime closed a batch: every delivery received since the last
    /// call belongs to it. A transport that keeps an order (a Kafka
    /// partition) hands out nothing more of a sequence that has deliveries in
    /// this batch until they are all settled, so batches applied at once
    /// never hold two parts of one sequence. The default does nothing.
    fn end_batch(&mut self) {}

    /// Drops the connection and makes a new one at the next receive, leaving
    /// every delivery not settled yet to the broker, which delivers it again.
    /// The runtime's watchdog calls it when the consumer made no progress for
    /// too long. Returns whether the transport can; the default cannot, and
    /// the consumer then stops instead ([`Reconnecting`](super::Reconnecting)
    /// can).
    fn restart(&mut self, why: &str) -> bool {
        let _ = why;
        false
    }

    /// Closes the subscription; unsettled deliveries go back to the broker.
    fn close(self) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        async {}
    }
}
