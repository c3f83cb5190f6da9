//! RabbitMQ through lapin: one channel, manual acks, a prefetch limit
//! (`basic.qos`).
//!
//! The consumer is started with `no_ack = false`: RabbitMQ keeps every
//! delivery until it is acked, and gives unacked ones back to the queue when
//! the channel or connection closes (a crash included). Batches are acked with
//! one cumulative `basic.ack` (`multiple = true`) on the highest delivery tag.
//!
//! RabbitMQ has no delayed requeue: a failed message's settle handle waits out
//! the redelivery delay, then `basic.nack`s it with `requeue = true`, holding
//! one prefetch slot meanwhile.
//!
//! Delivery counts: quorum queues carry `x-delivery-count` (the number of
//! earlier deliveries) on redeliveries; a delivery whose `redelivered` flag is
//! clear is a first delivery. A classic queue's redelivery carries no count,
//! and the runtime counts failures in the store instead.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use idem_core::redact_url;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Acker, Channel, Connection, ConnectionProperties};

use super::connect::{ConnectFailure, connect};
use crate::consume::{
    Delivery, Message, Route, Settle, Transport, TransportError, TransportErrorKind,
};

/// How often a waiting consumer looks at its connection's state.
const CONNECTION_CHECK: Duration = Duration::from_secs(1);

/// A RabbitMQ queue consumed with manual acks.
#[derive(Debug)]
pub struct AmqpTransport {
    connection: Connection,
    channel: Channel,
    consumer: lapin::Consumer,
    queue: String,
    route: Route,
    /// When to look at the connection's state while waiting for a delivery.
    check: tokio::time::Interval,
}

/// Settles one RabbitMQ delivery.
#[derive(Debug, Clone)]
pub struct AmqpSettle {
    tag: u64,
    acker: Acker,
}

fn fail(context: &'static str) -> impl FnOnce(lapin::Error) -> TransportError {
    move |error| classified(context, error)
}

/// A lapin failure, sorted: refused credentials, a missing queue or vhost and
/// a refused setting are fatal; everything else is a lost connection.
fn classified(context: impl Into<String>, error: lapin::Error) -> TransportError {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
    let (kind, advice) = match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => (
                TransportErrorKind::Refused,
                "RabbitMQ refused the user or its permissions on the vhost: fix the user and password in the URL, or grant it read access (rabbitmqctl set_permissions)",
            ),
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => (
                TransportErrorKind::Missing,
                "the queue does not exist: declare it, or name an existing one in the URL",
            ),
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED | AMQPHardError::INVALIDPATH) => (
                TransportErrorKind::Config,
                "the vhost does not exist or the user may not use it: fix the vhost in the URL (%2f for /)",
            ),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => (
                TransportErrorKind::Config,
                "RabbitMQ refused a setting of the consumer",
            ),
            _ => (TransportErrorKind::Connection, ""),
        },
        lapin::ErrorKind::AuthProviderError(_) => (
            TransportErrorKind::Refused,
            "the credentials could not be used: fix the user and password in the URL",
        ),
        lapin::ErrorKind::InvalidProtocolVersion(_) => (
            TransportErrorKind::Config,
            "the server at that address does not speak AMQP 0-9-1: check the host and port",
        ),
        _ => (TransportErrorKind::Connection, ""),
    };
    if advice.is_empty() {
        TransportError::of(kind, context, error)
    } else {
        TransportError::of(kind, context, format!("{error}; {advice}"))
    }
}

impl AmqpTransport {
    /// Connects to `url` (`amqp://USER:PASSWORD@HOST:PORT/VHOST`, the vhost
    /// percent-encoded: `%2f` for `/`; `amqps://` for TLS, with
    /// `?cacertfile=FILE`, `certfile=FILE&keyfile=FILE`; several nodes of a
    /// cluster as `HOST1:PORT,HOST2:PORT`, tried in that order), sets the
    /// prefetch limit, and starts a manual-ack consumer on `queue`, which
    /// must exist.
    pub async fn connect(url: &str, queue: &str, prefetch: u16) -> Result<Self, TransportError> {
        // Named after its queue, so an operator finds it in RabbitMQ's
        // connection list.
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("idem consumer of {queue}").into());
        let connection = connect(url, properties)
            .await
            .map_err(|failure| match failure {
                ConnectFailure::Client(e, None) => classified("connect to RabbitMQ", e),
                ConnectFailure::Client(e, Some(advice)) => {
                    TransportError::new("connect to RabbitMQ", format!("{e}; {advice}"))
                }
                silent @ ConnectFailure::Silent(_) => {
                    TransportError::new("connect to RabbitMQ", silent.to_string())
                }
                ConnectFailure::Config(why) | ConnectFailure::Tls(why) => {
                    TransportError::of(TransportErrorKind::Config, "connect to RabbitMQ", why)
                }
            })?;
        let channel = connection
            .create_channel()
            .await
            .map_err(fail("open a RabbitMQ channel"))?;
        channel
            .basic_qos(prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(fail("set the prefetch limit (basic.qos)"))?;
        let options = BasicConsumeOptions {
            no_ack: false,
            ..BasicConsumeOptions::default()
        };
        let consumer = channel
            .basic_consume(queue.into(), "".into(), options, FieldTable::default())
            .await
            .map_err(|e| classified(format!("consume from queue {queue:?}"), e))?;
        let public = redact_url(url);
        let origin = format!("{}/{queue}", public.trim_end_matches('/'));
        Ok(Self {
            connection,
            channel,
            consumer,
            queue: queue.to_owned(),
            route: Route::queue(origin, url, queue),
            check: connection_check(),
        })
    }
}

impl AmqpTransport {
    /// Why the consumer's stream ended: RabbitMQ cancels a consumer whose
    /// queue was deleted (fatal: asked again, a passive declare answers
    /// `NOT_FOUND`); otherwise the channel or connection went away, which
    /// connecting again fixes.
    async fn ended(&self) -> TransportError {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let asked = self
            .channel
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await;
        match asked {
            Err(error) => classified(format!("consume from {}", self.route.origin), error),
            Ok(_) => TransportError::new(
                "receive from RabbitMQ",
                "the consumer was cancelled; the messages not acknowledged will be redelivered",
            ),
        }
    }
}

/// Ticks every [`CONNECTION_CHECK`], the first time one period from now; a
/// tick missed while deliveries kept coming is not made up for.
fn connection_check() -> tokio::time::Interval {
    let mut check = tokio::time::interval_at(
        tokio::time::Instant::now() + CONNECTION_CHECK,
        CONNECTION_CHECK,
    );
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check
}

impl Settle for AmqpSettle {
    async fn ack(&self) -> Result<(), TransportError> {
        let done = self
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(fail("ack (basic.ack)"))?;
        used(done, "ack")
    }

    async fn requeue(&self, delay: Duration) -> Result<(), TransportError> {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let options = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        let done = self
            .acker
            .nack(options)
            .await
            .map_err(fail("requeue (basic.nack)"))?;
        used(done, "requeue")
    }

    /// One cumulative ack on the highest tag: RabbitMQ settles every
    /// outstanding delivery of the channel up to it, which are these.
    async fn ack_all(settles: Vec<AmqpSettle>) -> Result<(), TransportError> {
        let Some(last) = settles.iter().max_by_key(|s| s.tag) else {
            return Ok(());
        };
        let done = last
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .map_err(fail("ack a batch (basic.ack multiple)"))?;
        used(done, "batch ack")
    }
}

/// lapin answers `false` when the channel closed under the handle: the
/// delivery is back in the queue and will be redelivered.
fn used(done: bool, what: &str) -> Result<(), TransportError> {
    if done {
        Ok(())
    } else {
        Err(TransportError::new(
            format!("{what} not sent"),
            "the channel closed first; RabbitMQ will redeliver the message",
        ))
    }
}

impl Transport for AmqpTransport {
    type Settle = AmqpSettle;

    /// The next delivery. The connection's state is looked at every second
    /// while waiting: a consumer stream can stay open after its connection
    /// failed, and a consumer waiting on it would neither work nor stop.
    async fn receive(&mut self) -> Result<Option<Delivery<AmqpSettle>>, TransportError> {
        loop {
            tokio::select! {
                next = self.consumer.next() => {
                    return match next {
                        None => Err(self.ended().await),
                        Some(Err(error)) => Err(classified("receive from RabbitMQ", error)),
                        Some(Ok(delivery)) => Ok(Some(convert(delivery))),
                    };
                }
                _ = self.check.tick() => {
                    let status = self.connection.status();
                    let broken = if status.errored() {
                        Some("failed")
                    } else if status.closed() {
                        Some("closed")
                    } else {
                        None
                    };
                    if let Some(state) = broken {
                        return Err(TransportError::new(
                            "receive from RabbitMQ",
                            format!("the connection {state}; the messages not acknowledged will be redelivered"),
                        ));
                    }
                }
            }
        }
    }

    fn route(&self) -> Route {
        self.route.clone()
    }

    async fn close(self) {
        if let Err(error) = self.channel.close(200, "consumer stopped".into()).await {
            tracing::debug!(%error, "closing the RabbitMQ channel failed");
        }
        if let Err(error) = self.connection.close(200, "consumer stopped".into()).await {
            tracing::debug!(%error, "closing the RabbitMQ connection failed");
        }
    }
}

fn convert(delivery: lapin::message::Delivery) -> Delivery<AmqpSettle> {
    let properties = &delivery.properties;
    let mut headers = BTreeMap::new();
    let mut earlier: Option<u32> = None;
    if let Some(table) = properties.headers() {
        for (name, value) in table {
            if name.as_str() == "x-delivery-count" {
                earlier = number(value).and_then(|n| u32::try_from(n).ok());
            }
            if let Some(text) = text(value) {
                headers.insert(name.to_string(), text);
            }
        }
    }
    let delivery_count = match (earlier, delivery.redelivered) {
        (Some(n), _) => Some(n.saturating_add(1)),
        (None, false) => Some(1),
        (None, true) => None,
    };
    let message = Message {
        payload: delivery.data.into(),
        headers,
        message_id: properties.message_id().as_ref().map(|id| id.to_string()),
        content_type: properties.content_type().as_ref().map(|t| t.to_string()),
        record_key: None,
        subject: delivery.routing_key.to_string(),
        coordinates: None,
        delivery_count,
        published_at: properties
            .timestamp()
            .and_then(|seconds| i64::try_from(seconds).ok())
            .map(|seconds| idem_core::Timestamp(seconds.saturating_mul(1000))),
    };
    Delivery {
        message,
        settle: AmqpSettle {
            tag: delivery.delivery_tag,
            acker: delivery.acker,
        },
    }
}

fn number(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::ShortShortInt(n) => Some((*n).into()),
        AMQPValue::ShortShortUInt(n) => Some((*n).into()),
        AMQPValue::ShortInt(n) => Some((*n).into()),
        AMQPValue::ShortUInt(n) => Some((*n).into()),
        AMQPValue::LongInt(n) => Some((*n).into()),
        AMQPValue::LongUInt(n) => Some((*n).into()),
        AMQPValue::LongLongInt(n) => Some(*n),
        _ => None,
    }
}

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::ShortString(s) => Some(s.to_string()),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned),
        AMQPValue::Boolean(b) => Some(b.to_string()),
        AMQPValue::Float(f) => Some(f.to_string()),
        AMQPValue::Double(f) => Some(f.to_string()),
        AMQPValue::Timestamp(t) => Some(t.to_string()),
        other => number(other).map(|n| n.to_string()),
    }
}
