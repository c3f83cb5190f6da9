//! NATS JetStream through async-nats: a durable pull consumer with explicit
//! acks and an ack-wait.
//!
//! The consumer must ack each message explicitly (`AckPolicy::Explicit`); a
//! message not acked within the ack-wait is redelivered, which is how a
//! consumer that crashed between commit and ack gets its message back (after
//! at most the ack-wait). A failed message is `-NAK`ed with a delay, which the
//! server honours itself. The server counts deliveries (`delivered` in the
//! ack subject) and keeps the publish time; both reach the runtime. Messages
//! are pulled in batches of up to the prefetch size.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::AckPolicy, consumer::pull};
use futures::StreamExt;
use idem_core::redact_url;

use super::MSG_ID_HEADER;
use super::connect::{self, ConnectFailure, Failure};
use crate::consume::{
    BrokerHorizon, Delivery, Message, Route, Settle, Transport, TransportError, TransportErrorKind,
};

/// How the pull consumer is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatsOptions {
    /// How long the server waits for an ack before it redelivers (default
    /// 30 s). Used when the consumer is created; an existing consumer keeps
    /// its own.
    pub ack_wait: Duration,
    /// Messages requested per pull (default 256).
    pub prefetch: usize,
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            prefetch: 256,
        }
    }
}

/// A JetStream pull consumer with explicit acks.
pub struct NatsTransport {
    messages: pull::Stream,
    /// False once the client reported its connection dropped.
    connected: tokio::sync::watch::Receiver<bool>,
    route: Route,
    horizon: Option<BrokerHorizon>,
}

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsTransport")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

/// Settles one JetStream message.
pub struct NatsSettle(jetstream::message::Acker);

impl fmt::Debug for NatsSettle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NatsSettle")
    }
}

impl NatsTransport {
    /// Connects to `url` (`nats://HOST:PORT`, `tls://HOST:PORT`, or a
    /// cluster's servers, `nats://N1:4222,N2:4222,N3:4222`, with the
    /// credentials and TLS options of [`Source::Nats`](crate::consume::Source::Nats)) and consumes `stream` through the
    /// durable pull consumer `consumer`, creating it (explicit acks, the given
    /// ack-wait) if it does not exist. An existing consumer must ack explicitly.
    pub async fn connect(
        url: &str,
        stream: &str,
        consumer: &str,
        options: NatsOptions,
    ) -> Result<Self, TransportError> {
        // The client would reconnect by itself, unseen; the transport ends
        // instead when the client says the connection dropped, so the one
        // that reconnects (`Reconnecting`) sees it, reports it and makes a
        // fresh client.
        let (connected, watch) = tokio::sync::watch::channel(true);
        let connected = std::sync::Arc::new(connected);
        let connecting = async_nats::ConnectOptions::new().event_callback(move |event| {
            let connected = std::sync::Arc::clone(&connected);
            async move {
                match event {
                    async_nats::Event::Disconnected | async_nats::Event::Closed => {
                        connected.send_replace(false);
                    }
                    _ => {}
                }
            }
        });
        let client = connect::connect(url, connecting)
            .await
            .map_err(connect_failed)?;
        let js = jetstream::new(client);
        let mut found = js
            .get_stream(stream)
            .await
            .map_err(|e| stream_failed(stream, e))?;
        let horizon = stream_horizon(
            stream,
            &found
                .info()
                .await
                .map_err(|e| {
                    TransportError::new(format!("read JetStream stream {stream:?}'s settings"), e)
                })?
                .config,
        );
        let config = pull::Config {
            durable_name: Some(consumer.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: options.ack_wait,
            ..pull::Config::default()
        };
        let pull: jetstream::consumer::PullConsumer = found
            .get_or_create_consumer(consumer, config)
            .await
            .map_err(|e| consumer_failed(consumer, e))?;
        if pull.cached_info().config.ack_policy != AckPolicy::Explicit {
            return Err(TransportError::of(
                TransportErrorKind::Config,
                format!("consumer {consumer:?} of stream {stream:?}"),
                "it does not ack explicitly: an effectively-once consumer acks each message after its commit; create it with ack policy explicit",
            ));
        }
        let messages = pull
            .stream()
            .max_messages_per_batch(options.prefetch.max(1))
            .expires(Duration::from_secs(30))
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| TransportError::new("start pulling messages", e))?;
        let public = redact_url(url);
        let origin = format!("{}/{stream}/{consumer}", public.trim_end_matches('/'));
        Ok(Self {
            messages,
            connected: watch,
            route: Route::subject(origin, url),
            horizon,
        })
    }
}

impl Settle for NatsSettle {
    async fn ack(&self) -> Result<(), TransportError> {
        self.0
            .ack()
            .await
            .map_err(|e| TransportError::new("ack (+ACK)", e))
    }

    async fn requeue(&self, delay: Duration) -> Result<(), TransportError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.0
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(|e| TransportError::new("requeue (-NAK)", e))
    }
}

impl Transport for NatsTransport {
    type Settle = NatsSettle;

    async fn receive(&mut self) -> Result<Option<Delivery<NatsSettle>>, TransportError> {
        use jetstream::consumer::pull::MessagesErrorKind as Kind;
        loop {
            let next = tokio::select! {
                next = self.messages.next() => next,
                _ = self.connected.wait_for(|up| !*up) => {
                    return Err(TransportError::new(
                        "receive from JetStream",
                        "the connection to the NATS server dropped; the messages not acknowledged will be redelivered after the ack-wait",
                    ));
                }
            };
            match next {
                None => {
                    return Err(TransportError::new(
                        "receive from JetStream",
                        "the pull subscription ended",
                    ));
                }
                Some(Ok(message)) => return Ok(Some(convert(message))),
                Some(Err(error)) => match error.kind() {
                    // The stream re-issues its pull requests itself.
                    Kind::MissingHeartbeat | Kind::Pull | Kind::NoResponders | Kind::Other => {
                        tracing::warn!(%error, "pulling from JetStream failed; pulling again");
                    }
                    // Connecting again creates the durable consumer again.
                    Kind::ConsumerDeleted => {
                        return Err(TransportError::new("receive from JetStream", error));
                    }
                    _ => {
                        return Err(TransportError::of(
                            TransportErrorKind::Config,
                            "receive from JetStream",
                            format!(
                                "{error}; check the consumer's settings (a pull consumer, limits at least the prefetch)"
                            ),
                        ));
                    }
                },
            }
        }
    }

    fn route(&self) -> Route {
        self.route.clone()
    }

    fn replay_horizon(&self) -> Option<BrokerHorizon> {
        self.horizon.clone()
    }
}

/// A failed connection, sorted: refused credentials and a malformed address
/// are fatal, the rest (refused, timed out, DNS) a lost connection.
fn connect_failed(failure: ConnectFailure) -> TransportError {
    let kind = match failure.kind {
        Failure::Refused => TransportErrorKind::Refused,
        Failure::Config => TransportErrorKind::Config,
        Failure::Unavailable => TransportErrorKind::Connection,
    };
    TransportError::of(kind, "connect to NATS", failure.message)
}

/// A stream that does not exist is fatal; a request that failed is not.
fn stream_failed(stream: &str, error: jetstream::context::GetStreamError) -> TransportError {
    use jetstream::context::GetStreamErrorKind as Kind;
    let context = format!("find JetStream stream {stream:?}");
    match error.kind() {
        Kind::JetStream(api) if api.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND => {
            TransportError::of(
                TransportErrorKind::Missing,
                context,
                format!("{error}; create the stream (nats stream add), or name an existing one"),
            )
        }
        Kind::EmptyName | Kind::InvalidStreamName => TransportError::of(
            TransportErrorKind::Config,
            context,
            format!("{error}; fix the stream's name in the URL"),
        ),
        _ => TransportError::new(context, error),
    }
}

/// A consumer that cannot be opened: its name or type is wrong (fatal), or
/// the stream vanished (fatal), or the request failed (not).
fn consumer_failed(consumer: &str, error: jetstream::stream::ConsumerError) -> TransportError {
    use jetstream::stream::ConsumerErrorKind as Kind;
    let context = format!("open consumer {consumer:?}");
    match error.kind() {
        Kind::InvalidConsumerType | Kind::InvalidName => TransportError::of(
            TransportErrorKind::Config,
            context,
            format!("{error}; name a durable pull consumer"),
        ),
        Kind::JetStream(api) if api.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND => {
            TransportError::of(
                TransportErrorKind::Missing,
                context,
                format!("{error}; the stream was deleted: create it again"),
            )
        }
        _ => TransportError::new(context, error),
    }
}

/// How long a stream keeps messages a consumer could be handed again: its
/// max age (zero: forever) under the limits retention policy. A work-queue
/// or interest stream deletes a message once it is acked, so only unacked
/// ones come back, within the ack-wait and redelivery limits.
fn stream_horizon(name: &str, config: &jetstream::stream::Config) -> Option<BrokerHorizon> {
    if config.retention != jetstream::stream::RetentionPolicy::Limits {
        return None;
    }
    Some(BrokerHorizon {
        keeps: (!config.max_age.is_zero()).then_some(config.max_age),
        origin: format!(
            "stream {name} (duplicate window {})",
            humantime::format_duration(config.duplicate_window)
        ),
    })
}

fn convert(message: jetstream::Message) -> Delivery<NatsSettle> {
    let (delivery_count, coordinates, published_at) = match message.info() {
        Ok(info) => (
            u32::try_from(info.delivered).ok(),
            Some(format!("{}/{}", info.stream, info.stream_sequence)),
            i64::try_from(info.published.unix_timestamp_nanos() / 1_000_000)
                .ok()
                .map(idem_core::Timestamp),
        ),
        Err(error) => {
            tracing::debug!(%error, "a JetStream message without delivery info");
            (None, None, None)
        }
    };
    let (message, acker) = message.split();
    let mut headers = BTreeMap::new();
    let mut message_id = None;
    let mut content_type = None;
    if let Some(map) = &message.headers {
        for (name, values) in map.iter() {
            let Some(value) = values.last() else { continue };
            let (name, value) = (name.to_string(), value.as_str().to_owned());
            if name.eq_ignore_ascii_case(MSG_ID_HEADER) {
                message_id = Some(value.clone());
            } else if name.eq_ignore_ascii_case("Content-Type") {
                content_type = Some(value.clone());
            }
            headers.insert(name, value);
        }
    }
    Delivery {
        message: Message {
            payload: message.payload,
            headers,
            message_id,
            content_type,
            record_key: None,
            subject: message.subject.to_string(),
            coordinates,
            delivery_count,
            published_at,
        },
        settle: NatsSettle(acker),
    }
}
