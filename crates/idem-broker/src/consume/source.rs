//! A broker source written as one URL, for programs (`idem forward`) that
//! consume from any broker: `amqp://HOST/QUEUE`, `nats://HOST/STREAM/CONSUMER`,
//! `kafka://HOST:PORT/TOPIC?group=GROUP` or `sqs://HOST/QUEUE`, and the
//! transport chosen from it at run time.
//!
//! This module chooses among the transports, so it depends on them (each
//! behind its feature), and they never on it. Both forms parse whatever the
//! features; connecting to a broker whose transport was left out fails with
//! the feature to enable.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use idem_core::redact_url;

use super::reconnect::{Reconnect, Reconnecting};
use super::transport::{Delivery, Route, Settle, Transport, TransportError};
#[cfg(feature = "kafka")]
use crate::transport::kafka::consume::{KafkaOptions, KafkaSettle, KafkaTransport};
use crate::transport::kafka::{KafkaUrl, Settings};
use crate::transport::{amqp, nats, sqs};
#[cfg(feature = "amqp")]
use amqp::consume::{AmqpSettle, AmqpTransport};
#[cfg(feature = "nats")]
use nats::consume::{NatsOptions, NatsSettle, NatsTransport};
#[cfg(feature = "sqs")]
use sqs::consume::{SqsOptions, SqsSettle, SqsTransport};

/// Where messages are consumed from.
#[derive(Clone, PartialEq, Eq)]
pub enum Source {
    /// A RabbitMQ queue.
    Amqp {
        /// The broker, with its vhost (`amqp://guest:guest@127.0.0.1:5672/%2f`).
        url: String,
        /// The queue.
        queue: String,
    },
    /// A NATS JetStream durable pull consumer.
    Nats {
        /// The server (`nats://127.0.0.1:4222`) or a cluster's servers
        /// (`nats://n1:4222,n2:4222,n3:4222`), with the credentials and TLS
        /// options (`tls://USER:PASSWORD@HOST:PORT?tls_ca=FILE`; see the
        /// connecting-securely chapter).
        url: String,
        /// The stream.
        stream: String,
        /// The durable consumer.
        consumer: String,
    },
    /// A Kafka topic, read as a member of a consumer group.
    Kafka {
        /// The bootstrap brokers: `host:port[,host:port]`.
        brokers: String,
        /// The topic.
        topic: String,
        /// The consumer group.
        group: String,
        /// librdkafka settings from the URL's query (checked when connecting).
        settings: Settings,
    },
    /// An Amazon SQS queue.
    Sqs {
        /// The queue:
        /// `sqs://[KEY:SECRET@][HOST[:PORT]]/[ACCOUNT/]QUEUE[?region=REGION]`
        /// (`sqs+http://` for an emulator over plain HTTP), with the
        /// consumer's options in the query (`visibility=30s`, `wait=20s`,
        /// `extend=false`, `max_messages=10`).
        url: String,
    },
}

/// A source URL that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "source {url:?} not understood ({why}): write amqp[s]://[USER:PASSWORD@]HOST[:PORT][,HOST:PORT]/[VHOST/]QUEUE[?cacertfile=FILE], nats://HOST[:PORT][,HOST:PORT]/STREAM/CONSUMER (tls:// for TLS), kafka://HOST:PORT[,HOST:PORT]/TOPIC?group=GROUP or sqs://[HOST]/[ACCOUNT/]QUEUE[?region=REGION]"
)]
pub struct InvalidSource {
    url: String,
    why: String,
}

impl FromStr for Source {
    type Err = InvalidSource;

    /// ```
    /// use idem_broker::consume::Source;
    /// let rabbit: Source = "amqp://guest:guest@127.0.0.1:5672/orders".parse().unwrap();
    /// assert_eq!(rabbit, Source::Amqp { url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(), queue: "orders".into() });
    /// let nats: Source = "nats://127.0.0.1:4222/ORDERS/billing".parse().unwrap();
    /// assert_eq!(nats.to_string(), "nats://127.0.0.1:4222/ORDERS/billing");
    /// ```
    fn from_str(text: &str) -> Result<Self, InvalidSource> {
        let invalid = |why: &str| InvalidSource {
            url: redact_url(text),
            why: why.to_owned(),
        };
        if text.starts_with("kafka://") {
            return kafka(text).map_err(|why| invalid(&why));
        }
        if text.starts_with("sqs://") || text.starts_with("sqs+http://") {
            check_sqs(text).map_err(|why| invalid(&why))?;
            return Ok(Self::Sqs {
                url: text.to_owned(),
            });
        }
        if nats::NatsUrl::has_nats_scheme(text) {
            return nats_source(text).map_err(|why| invalid(&why));
        }
        // Several RabbitMQ nodes (`r1:5672,r2:5672`) are no URL authority:
        // the first is parsed, and the list put back in the broker's URL.
        let nodes = amqp::AmqpNodes::parse(text).map_err(|why| invalid(&why))?;
        let text = nodes.urls[0].as_str();
        let parsed = url::Url::parse(text).map_err(|e| invalid(&e.to_string()))?;
        if !parsed.has_host() {
            return Err(invalid("no host"));
        }
        let segments: Vec<&str> = parsed
            .path_segments()
            .map(|s| s.filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        let mut base = parsed.clone();
        base.set_path("");
        base.set_query(None);
        let base = nodes.restore(base.as_str().trim_end_matches('/'));
        match (parsed.scheme(), segments.as_slice()) {
            ("amqp" | "amqps", [queue]) => amqp_source(text, &base, "%2f", queue),
            ("amqp" | "amqps", [vhost, queue]) => amqp_source(text, &base, vhost, queue),
            ("amqp" | "amqps", _) => Err(invalid("an AMQP source names one queue")),
            (other, _) => Err(invalid(&format!("unknown scheme {other:?}"))),
        }
    }
}

/// A JetStream source: the servers (one or a list) with the options, then
/// the stream and the durable consumer as the path.
fn nats_source(text: &str) -> Result<Source, String> {
    let url = nats::NatsUrl::parse(text)?;
    if url.hosts.is_empty() {
        return Err("no host".into());
    }
    nats::NatsServer::parse(&url)?;
    let segments: Vec<&str> = url
        .url
        .path_segments()
        .map(|s| s.filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let [stream, consumer] = segments.as_slice() else {
        return Err("a NATS source names a stream and a consumer".into());
    };
    Ok(Source::Nats {
        url: url.server_url(),
        stream: decode(stream),
        consumer: decode(consumer),
    })
}

/// An AMQP source: the broker's URL keeps the query (TLS files and the
/// client's parameters), the path names the vhost and the queue.
fn amqp_source(text: &str, base: &str, vhost: &str, queue: &str) -> Result<Source, InvalidSource> {
    let parsed = url::Url::parse(text).map_err(|e| InvalidSource {
        url: redact_url(text),
        why: e.to_string(),
    })?;
    let url = match parsed.query().filter(|q| !q.is_empty()) {
        Some(query) => format!("{base}/{vhost}?{query}"),
        None => format!("{base}/{vhost}"),
    };
    amqp::AmqpServer::parse(&url).map_err(|why| InvalidSource {
        url: redact_url(text),
        why,
    })?;
    Ok(Source::Amqp {
        url,
        queue: decode(queue),
    })
}

fn kafka(text: &str) -> Result<Source, String> {
    let url = KafkaUrl::parse(text)?;
    let [topic] = url.path.as_slice() else {
        return Err("a Kafka source names one topic".into());
    };
    let mut group = None;
    let mut settings = Settings::new();
    for (name, value) in url.query {
        match name.as_str() {
            "group" | "group.id" => group = Some(value),
            _ => settings = settings.set(name, value),
        }
    }
    let group = group
        .filter(|g| !g.is_empty())
        .ok_or("a Kafka source names its consumer group: add ?group=GROUP")?;
    Ok(Source::Kafka {
        brokers: url.brokers,
        topic: topic.clone(),
        group,
        settings,
    })
}

#[cfg(feature = "sqs")]
fn check_sqs(text: &str) -> Result<(), String> {
    sqs::consume::check_source(text)
}

#[cfg(not(feature = "sqs"))]
fn check_sqs(text: &str) -> Result<(), String> {
    sqs::SqsUrl::parse(text).map(|_| ())
}

/// A percent-decoded path segment (`%2F` → `/`); invalid escapes are kept.
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| segment.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| segment.to_owned())
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Amqp { url, queue } => write!(f, "{}/{queue}", redact_url(url)),
            Self::Nats {
                url,
                stream,
                consumer,
            } => write!(f, "{}/{stream}/{consumer}", redact_url(url)),
            Self::Kafka {
                brokers,
                topic,
                group,
                ..
            } => write!(f, "kafka://{brokers}/{topic}?group={group}"),
            Self::Sqs { url } => f.write_str(&redact_url(url)),
        }
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Source({self})")
    }
}

/// How a source is consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceOptions {
    /// Deliveries held unacked at once (RabbitMQ prefetch, NATS pull batch);
    /// for Kafka, records fetched ahead per partition, at least
    /// [`KafkaOptions::buffer`]'s default.
    pub prefetch: u16,
    /// NATS ack-wait for a consumer that is created; SQS's visibility
    /// timeout, unless the URL sets `visibility=`.
    pub ack_wait: Duration,
    /// Kafka: unsettled records per partition at once (1 keeps each
    /// partition in order; the batch size in batch mode).
    pub per_partition: usize,
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            prefetch: 64,
            ack_wait: Duration::from_secs(30),
            per_partition: 1,
        }
    }
}

impl Source {
    /// Connects to the source.
    pub async fn connect(&self, options: SourceOptions) -> Result<AnyTransport, TransportError> {
        match self {
            #[cfg(feature = "amqp")]
            Self::Amqp { url, queue } => AmqpTransport::connect(url, queue, options.prefetch)
                .await
                .map(AnyTransport::Amqp),
            #[cfg(not(feature = "amqp"))]
            Self::Amqp { .. } => Err(left_out("RabbitMQ", "amqp")),
            #[cfg(feature = "nats")]
            Self::Nats {
                url,
                stream,
                consumer,
            } => NatsTransport::connect(
                url,
                stream,
                consumer,
                NatsOptions {
                    ack_wait: options.ack_wait,
                    prefetch: options.prefetch.into(),
                },
            )
            .await
            .map(AnyTransport::Nats),
            #[cfg(not(feature = "nats"))]
            Self::Nats { .. } => Err(left_out("NATS JetStream", "nats")),
            #[cfg(feature = "kafka")]
            Self::Kafka {
                brokers,
                topic,
                group,
                settings,
            } => KafkaTransport::connect(
                brokers,
                topic,
                group,
                KafkaOptions {
                    per_partition: options.per_partition,
                    buffer: usize::from(options.prefetch).max(KafkaOptions::default().buffer),
                    settings: settings.clone(),
                    ..KafkaOptions::default()
                },
            )
            .await
            .map(AnyTransport::Kafka),
            #[cfg(not(feature = "kafka"))]
            Self::Kafka { .. } => Err(left_out("Kafka", "kafka")),
            #[cfg(feature = "sqs")]
            Self::Sqs { url } => SqsTransport::connect(
                url,
                SqsOptions {
                    visibility: options.ack_wait,
                    max_messages: u8::try_from(options.prefetch.clamp(1, 10)).unwrap_or(10),
                    ..SqsOptions::default()
                },
            )
            .await
            .map(AnyTransport::Sqs),
            #[cfg(not(feature = "sqs"))]
            Self::Sqs { .. } => Err(left_out("Amazon SQS", "sqs")),
        }
    }
}

impl Source {
    /// Connects to the source through a [`Reconnecting`] transport: a lost
    /// connection is made again with `reconnect`'s backoff, declaring again
    /// what [`connect`](Self::connect) declares (the prefetch and the
    /// consumer on RabbitMQ, the durable consumer on JetStream, the group
    /// membership on Kafka). A broker that does not answer at start is
    /// waited for the same way; a fatal failure (refused credentials, a
    /// missing queue, stream or topic) is returned at once.
    pub async fn connect_reconnecting(
        &self,
        options: SourceOptions,
        reconnect: Reconnect,
    ) -> Result<Reconnecting<AnyTransport>, TransportError> {
        let source = self.clone();
        Reconnecting::connect(self.to_string(), reconnect, move || {
            let source = source.clone();
            async move { source.connect(options).await }
        })
        .await
    }
}

/// The error for a source whose transport this build was made without.
#[cfg(not(all(feature = "amqp", feature = "nats", feature = "kafka", feature = "sqs")))]
fn left_out(broker: &str, feature: &str) -> TransportError {
    TransportError::of(
        super::transport::TransportErrorKind::Config,
        format!("connect to {broker}"),
        format!(
            "this build of idem-broker has no {broker} transport; enable its crate feature {feature}"
        ),
    )
}

/// Either broker's transport.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyTransport {
    /// RabbitMQ.
    #[cfg(feature = "amqp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
    Amqp(AmqpTransport),
    /// NATS JetStream.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    Nats(NatsTransport),
    /// Kafka.
    #[cfg(feature = "kafka")]
    #[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
    Kafka(KafkaTransport),
    /// Amazon SQS.
    #[cfg(feature = "sqs")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
    Sqs(SqsTransport),
}

/// Either broker's settle handle.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnySettle {
    /// RabbitMQ.
    #[cfg(feature = "amqp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
    Amqp(AmqpSettle),
    /// NATS JetStream.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    Nats(NatsSettle),
    /// Kafka.
    #[cfg(feature = "kafka")]
    #[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
    Kafka(KafkaSettle),
    /// Amazon SQS.
    #[cfg(feature = "sqs")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
    Sqs(SqsSettle),
}

impl Settle for AnySettle {
    async fn ack(&self) -> Result<(), TransportError> {
        match self {
            #[cfg(feature = "amqp")]
            Self::Amqp(s) => s.ack().await,
            #[cfg(feature = "nats")]
            Self::Nats(s) => s.ack().await,
            #[cfg(feature = "kafka")]
            Self::Kafka(s) => s.ack().await,
            #[cfg(feature = "sqs")]
            Self::Sqs(s) => s.ack().await,
        }
    }

    async fn requeue(&self, delay: Duration) -> Result<(), TransportError> {
        match self {
            #[cfg(feature = "amqp")]
            Self::Amqp(s) => s.requeue(delay).await,
            #[cfg(feature = "nats")]
            Self::Nats(s) => s.requeue(delay).await,
            #[cfg(feature = "kafka")]
            Self::Kafka(s) => s.requeue(delay).await,
            #[cfg(feature = "sqs")]
            Self::Sqs(s) => s.requeue(delay).await,
        }
    }

    /// RabbitMQ's deliveries with one cumulative ack, SQS's with batched
    /// deletes, the others one by one.
    async fn ack_all(settles: Vec<AnySettle>) -> Result<(), TransportError> {
        #[cfg(feature = "amqp")]
        let mut amqp = Vec::with_capacity(settles.len());
        #[cfg(feature = "sqs")]
        let mut sqs = Vec::with_capacity(settles.len());
        for settle in settles {
            match settle {
                #[cfg(feature = "amqp")]
                AnySettle::Amqp(s) => amqp.push(s),
                #[cfg(feature = "nats")]
                AnySettle::Nats(s) => s.ack().await?,
                #[cfg(feature = "kafka")]
                AnySettle::Kafka(s) => s.ack().await?,
                #[cfg(feature = "sqs")]
                AnySettle::Sqs(s) => sqs.push(s),
            }
        }
        #[cfg(feature = "amqp")]
        AmqpSettle::ack_all(amqp).await?;
        #[cfg(feature = "sqs")]
        SqsSettle::ack_all(sqs).await?;
        Ok(())
    }
}

fn wrap<S>(
    received: Result<Option<Delivery<S>>, TransportError>,
    into: fn(S) -> AnySettle,
) -> Result<Option<Delivery<AnySettle>>, TransportError> {
    received.map(|d| {
        d.map(|d| Delivery {
            message: d.message,
            settle: into(d.settle),
        })
    })
}

impl Transport for AnyTransport {
    type Settle = AnySettle;

    async fn receive(&mut self) -> Result<Option<Delivery<AnySettle>>, TransportError> {
        match self {
            #[cfg(feature = "amqp")]
            Self::Amqp(t) => wrap(t.receive().await, AnySettle::Amqp),
            #[cfg(feature = "nats")]
            Self::Nats(t) => wrap(t.receive().await, AnySettle::Nats),
            #[cfg(feature = "kafka")]
            Self::Kafka(t) => wrap(t.receive().await, AnySettle::Kafka),
            #[cfg(feature = "sqs")]
            Self::Sqs(t) => wrap(t.receive().await, AnySettle::Sqs),
        }
    }

    fn route(&self) -> Route {
        match self {
            #[cfg(feature = "amqp")]
            Self::Amqp(t) => t.route(),
            #[cfg(feature = "nats")]
            Self::Nats(t) => t.route(),
            #[cfg(feature = "kafka")]
            Self::Kafka(t) => t.route(),
            #[cfg(feature = "sqs")]
            Self::Sqs(t) => t.route(),
        }
    }

    fn replay_horizon(&self) -> Option<super::BrokerHorizon> {
        match self {
            #[cfg(feature = "kafka")]
            Self::Kafka(t) => t.replay_horizon(),
            #[cfg(feature = "nats")]
            Self::Nats(t) => t.replay_horizon(),
            #[cfg(feature = "sqs")]
            Self::Sqs(t) => t.replay_horizon(),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn delivery_limit(&self) -> Option<super::DeliveryLimit> {
        match self {
            #[cfg(feature = "sqs")]
            Self::Sqs(t) => t.delivery_limit(),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn end_batch(&mut self) {
        match self {
            #[cfg(feature = "kafka")]
            Self::Kafka(t) => t.end_batch(),
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }

    async fn close(self) {
        match self {
            #[cfg(feature = "amqp")]
            Self::Amqp(t) => t.close().await,
            #[cfg(feature = "nats")]
            Self::Nats(t) => t.close().await,
            #[cfg(feature = "kafka")]
            Self::Kafka(t) => t.close().await,
            #[cfg(feature = "sqs")]
            Self::Sqs(t) => t.close().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_brokers_and_explains_the_rest() {
        let with_vhost: Source = "amqp://u:secret@rabbit:5673/prod/orders".parse().unwrap();
        assert_eq!(
            with_vhost,
            Source::Amqp {
                url: "amqp://u:secret@rabbit:5673/prod".into(),
                queue: "orders".into()
            }
        );
        assert_eq!(
            with_vhost.to_string(),
            "amqp://u:***@rabbit:5673/prod/orders"
        );
        let tls: Source = "amqps://u:secret@rabbit:5671/prod/orders?cacertfile=/ca.pem&heartbeat=5"
            .parse()
            .unwrap();
        assert_eq!(
            tls,
            Source::Amqp {
                url: "amqps://u:secret@rabbit:5671/prod?cacertfile=/ca.pem&heartbeat=5".into(),
                queue: "orders".into()
            }
        );
        assert_eq!(tls.to_string(), "amqps://u:***@rabbit:5671/prod/orders");
        let cluster: Source = "amqp://u:secret@r1:5672,r2,[::1]:5673/prod/orders?heartbeat=5"
            .parse()
            .unwrap();
        assert_eq!(
            cluster,
            Source::Amqp {
                url: "amqp://u:secret@r1:5672,r2,[::1]:5673/prod?heartbeat=5".into(),
                queue: "orders".into()
            }
        );
        assert_eq!(
            cluster.to_string(),
            "amqp://u:***@r1:5672,r2,[::1]:5673/prod/orders"
        );
        let default_vhost: Source = "amqp://r1,r2/orders".parse().unwrap();
        assert!(
            matches!(&default_vhost, Source::Amqp { url, .. } if url == "amqp://r1,r2/%2f"),
            "{default_vhost:?}"
        );
        let err = "amqp://u:secret@r1,,r3/orders"
            .parse::<Source>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("an empty node"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        let err = "amqp://u:secret@rabbit/q?cacertfile=/ca.pem"
            .parse::<Source>()
            .unwrap_err();
        assert!(err.to_string().contains("amqps://"), "{err}");
        let err = "amqp://u:secret@rabbit/".parse::<Source>().unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!("nats://h/only-stream".parse::<Source>().is_err());
        let tls: Source =
            "tls://app:s3cret@h:4222/S/C?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem"
                .parse()
                .unwrap();
        assert!(
            matches!(&tls, Source::Nats { url, stream, consumer }
                if url == "tls://app:s3cret@h:4222?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem"
                    && stream == "S" && consumer == "C"),
            "{tls:?}"
        );
        assert_eq!(tls.to_string(), "tls://app:***@h:4222/S/C");
        let cluster: Source = "nats://app:s3cret@n1:4222,n2:4222,n3:4222/ORDERS/billing?tls=true"
            .parse()
            .unwrap();
        assert!(
            matches!(&cluster, Source::Nats { url, stream, consumer }
                if url == "nats://app:s3cret@n1:4222,n2:4222,n3:4222?tls=true"
                    && stream == "ORDERS" && consumer == "billing"),
            "{cluster:?}"
        );
        assert_eq!(
            cluster.to_string(),
            "nats://app:***@n1:4222,n2:4222,n3:4222/ORDERS/billing"
        );
        let err = "nats://n1:4222,n2:x/S/C".parse::<Source>().unwrap_err();
        assert!(err.to_string().contains("\"n2:x\""), "{err}");
        let token: Source = "nats://h:4222/S/C?tls=true&token=s3cret".parse().unwrap();
        assert_eq!(format!("{token:?}"), "Source(nats://h:4222/S/C)");
        let err = "nats://u:s3cret@h/S/C?tls_ky=/k.pem"
            .parse::<Source>()
            .unwrap_err();
        assert!(err.to_string().contains("unknown option"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let err = "kafka://h:9092/t".parse::<Source>().unwrap_err();
        assert!(err.to_string().contains("?group="), "{err}");
        let kafka: Source = "kafka://k1:9092,k2:9092/orders?group=billing&client.id=c"
            .parse()
            .unwrap();
        assert!(
            matches!(&kafka, Source::Kafka { brokers, topic, group, settings }
                if brokers == "k1:9092,k2:9092" && topic == "orders" && group == "billing" && !settings.is_empty()),
            "{kafka:?}"
        );
        assert_eq!(
            kafka.to_string(),
            "kafka://k1:9092,k2:9092/orders?group=billing"
        );
        let sqs: Source =
            "sqs+http://key:s3cret@127.0.0.1:5000/orders.fifo?region=us-east-1&visibility=10s"
                .parse()
                .unwrap();
        assert_eq!(
            sqs.to_string(),
            "sqs+http://key:***@127.0.0.1:5000/orders.fifo"
        );
        let err = "sqs://h/q?visbility=10s".parse::<Source>().unwrap_err();
        assert!(err.to_string().contains("unknown option"), "{err}");
        assert!("sqs://h/".parse::<Source>().is_err());
    }
}
