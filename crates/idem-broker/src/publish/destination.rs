//! Where a message goes, written as one URL: the form an operator types after
//! `--to`, and the form the outbox and dead-letter tables store.
//!
//! | form | meaning |
//! | --- | --- |
//! | `amqp://user:pass@host:5672/%2f?exchange=orders&routing_key=created` | RabbitMQ: publish to `exchange` with `routing_key` |
//! | `amqp://user:pass@host:5672/%2f?queue=orders` | RabbitMQ: the default exchange (`""`), routing key = the queue name |
//! | `nats://host:4222/orders.created` | NATS JetStream: the path is the subject; several servers of a cluster as `nats://h1:4222,h2:4222,h3:4222/orders.created` |
//! | `tls://user:pass@host:4222/orders.created?tls_ca=/ca.pem` | NATS over TLS; the query may also hold `tls=true`, `tls_cert`, `tls_key`, `token`, `nkey`, `creds` |
//! | `http://host/hooks/orders`, `https://...` | an HTTP webhook: `POST` to the URL |
//! | `kafka://host:9092[,host2:9092]/orders?record_key=header:order-id` | Kafka: the idempotent producer to the topic; optional record key; other query pairs are librdkafka settings |
//! | `sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo?group=header:order-id` | Amazon SQS: `SendMessage` to the queue; on a FIFO queue the `MessageGroupId` (`group=NAME`, `group=key` or `group=header:NAME`; default `idem`) |
//!
//! `amqps://` connects with TLS; its `cacertfile=FILE` (or `tls_ca=`),
//! `certfile=FILE` and `keyfile=FILE` (or `tls_cert=`, `tls_key=`) name the
//! CA and the client certificate. Other query parameters of the AMQP URL
//! (`heartbeat`, `channel_max`, ...) are kept and handed to the client. [`Display`](fmt::Display)
//! writes the canonical form, which parses back to the same destination; it
//! keeps the password because the tables need it to publish. Logs and errors
//! use [`Destination::redacted`], which goes through [`idem_core::redact_url`].

use std::fmt;
use std::str::FromStr;

use idem_core::redact_url;
use url::Url;
use url::form_urlencoded;

use crate::transport::kafka::{KafkaUrl, Settings};
use crate::transport::{amqp, nats, sqs};

/// A publish destination.
///
/// ```
/// use idem_broker::publish::Destination;
///
/// let to: Destination = "amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders".parse().unwrap();
/// assert_eq!(
///     to,
///     Destination::Amqp {
///         url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
///         exchange: String::new(),
///         routing_key: "orders".into(),
///     }
/// );
/// assert_eq!(to.to_string(), "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=&routing_key=orders");
/// assert_eq!(to.redacted(), "amqp://guest:***@127.0.0.1:5672/%2f?exchange=&routing_key=orders");
/// assert_eq!(to.to_string().parse::<Destination>().unwrap(), to);
///
/// let to: Destination = "nats://127.0.0.1:4222/orders.created".parse().unwrap();
/// assert!(matches!(to, Destination::Nats { ref subject, .. } if subject == "orders.created"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    /// RabbitMQ (AMQP 0-9-1), with publisher confirms.
    Amqp {
        /// The broker: `amqp://user:pass@host:port/vhost` (vhost `%2f` is `/`),
        /// plus any connection parameters as a query.
        url: String,
        /// The exchange; `""` is the default exchange, which routes by queue name.
        exchange: String,
        /// The routing key (the queue name on the default exchange).
        routing_key: String,
    },
    /// NATS JetStream: the subject must be bound to a stream.
    Nats {
        /// The server: `nats://host:port` or `tls://host:port`, or several
        /// servers of a cluster (`nats://n1:4222,n2:4222,n3:4222`),
        /// credentials in the user-info part if any, TLS and other
        /// credentials as a query (`?tls_ca=FILE&token=...`).
        url: String,
        /// The subject published to.
        subject: String,
    },
    /// An HTTP webhook, called with `POST`.
    Http {
        /// The full URL.
        url: String,
    },
    /// A Kafka topic, written by the idempotent producer.
    Kafka {
        /// The bootstrap brokers: `host:port[,host:port]`.
        brokers: String,
        /// The topic.
        topic: String,
        /// What the record key is.
        record_key: RecordKey,
        /// librdkafka settings (checked when connecting: unsafe producer
        /// settings are refused).
        settings: Settings,
    },
    /// An Amazon SQS queue.
    Sqs {
        /// The queue:
        /// `sqs://[KEY:SECRET@][HOST[:PORT]]/[ACCOUNT/]QUEUE[?region=REGION]`
        /// (`sqs+http://` for an emulator over plain HTTP; no host: the AWS
        /// chain's endpoint).
        url: String,
        /// The `MessageGroupId` of messages sent to a FIFO queue.
        group: SqsGroup,
    },
}

/// The `MessageGroupId` of a message sent to an SQS FIFO queue: messages of
/// one group are delivered in order, one at a time; groups in parallel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SqsGroup {
    /// Every message in this group (`?group=NAME`; the default is `idem`):
    /// one order for the whole queue.
    Fixed(String),
    /// The message's idempotency key (`?group=key`): no order between
    /// messages, the most parallel consumption.
    MessageKey,
    /// One of the message's headers, e.g. an aggregate id
    /// (`?group=header:NAME`); the key when the header is absent.
    Header(String),
}

impl Default for SqsGroup {
    fn default() -> Self {
        Self::Fixed("idem".into())
    }
}

impl SqsGroup {
    fn query(&self) -> Option<String> {
        match self {
            Self::Fixed(name) if name == "idem" => None,
            Self::Fixed(name) => Some(name.clone()),
            Self::MessageKey => Some("key".into()),
            Self::Header(name) => Some(format!("header:{name}")),
        }
    }

    fn parse(value: &str) -> Result<Self, String> {
        match value.split_once(':') {
            _ if value == "key" => Ok(Self::MessageKey),
            Some(("header", name)) if !name.is_empty() => Ok(Self::Header(name.to_owned())),
            None if !value.is_empty() && value.len() <= 128 => Ok(Self::Fixed(value.to_owned())),
            _ => Err(format!(
                "group={value:?} not understood: write group=NAME (one group, up to 128 characters), group=key (the message key) or group=header:NAME"
            )),
        }
    }
}

/// The record key of a Kafka record, which chooses its partition: records
/// with one key stay in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKey {
    /// No record key: records are spread over the partitions (the default).
    #[default]
    None,
    /// The message's idempotency key (`?record_key=key`).
    MessageKey,
    /// One of the message's headers, e.g. an aggregate id
    /// (`?record_key=header:NAME`); no record key when the header is absent.
    Header(String),
}

/// A destination that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DestinationError {
    /// Not a URL at all.
    #[error(
        "destination {text:?} is not a URL ({reason}); write amqp://USER:PASS@HOST:PORT/VHOST?queue=QUEUE, nats://HOST:PORT[,HOST:PORT]/SUBJECT, kafka://HOST:PORT/TOPIC, sqs://HOST/QUEUE or http(s)://HOST/PATH"
    )]
    NotAUrl {
        /// The text, through [`redact_url`].
        text: String,
        /// What the URL parser said.
        reason: String,
    },
    /// A scheme no publisher exists for.
    #[error(
        "destination scheme {scheme:?} is not supported: use amqp:// or amqps:// (RabbitMQ), nats:// (NATS JetStream), kafka:// (Kafka), sqs:// (Amazon SQS), http:// or https:// (webhook)"
    )]
    UnknownScheme {
        /// The scheme found.
        scheme: String,
    },
    /// A required part is missing or malformed.
    #[error("destination {text}: {problem}")]
    Invalid {
        /// The destination, through [`redact_url`].
        text: String,
        /// What is wrong and how to write it.
        problem: String,
    },
}

impl Destination {
    /// The destination safe to print, for logs, errors and tables shown to
    /// people: the URL through [`redact_url`] (password as `***`, query cut
    /// off), followed for AMQP by the exchange and routing key, which name
    /// the target and hold no secret.
    pub fn redacted(&self) -> String {
        match self {
            Self::Amqp {
                url,
                exchange,
                routing_key,
            } => format!(
                "{}?{}",
                redact_url(url),
                target_query(exchange, routing_key)
            ),
            Self::Nats { .. } | Self::Http { .. } => redact_url(&self.to_string()),
            Self::Kafka {
                brokers,
                topic,
                record_key,
                ..
            } => {
                let base = format!("kafka://{brokers}/{}", encode(topic));
                match record_key_query(record_key) {
                    Some(query) => format!("{base}?record_key={query}"),
                    None => base,
                }
            }
            Self::Sqs { url, group } => {
                let base = redact_url(url);
                match group.query() {
                    Some(group) => format!(
                        "{base}?{}",
                        form_urlencoded::Serializer::new(String::new())
                            .append_pair("group", &group)
                            .finish()
                    ),
                    None => base,
                }
            }
        }
    }

    /// The scheme family: `"amqp"`, `"nats"`, `"http"`, `"kafka"` or `"sqs"`, for metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Amqp { .. } => "amqp",
            Self::Nats { .. } => "nats",
            Self::Http { .. } => "http",
            Self::Kafka { .. } => "kafka",
            Self::Sqs { .. } => "sqs",
        }
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Destination({})", self.redacted())
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Amqp {
                url,
                exchange,
                routing_key,
            } => {
                let joiner = if url.contains('?') { '&' } else { '?' };
                write!(f, "{url}{joiner}{}", target_query(exchange, routing_key))
            }
            Self::Nats { url, subject } => match url.split_once('?') {
                Some((server, options)) => {
                    write!(f, "{}/{subject}?{options}", server.trim_end_matches('/'))
                }
                None => write!(f, "{}/{subject}", url.trim_end_matches('/')),
            },
            Self::Http { url } => f.write_str(url),
            Self::Kafka {
                brokers,
                topic,
                record_key,
                settings,
            } => {
                write!(f, "kafka://{brokers}/{}", encode(topic))?;
                let mut query = form_urlencoded::Serializer::new(String::new());
                if let Some(key) = record_key_query(record_key) {
                    query.append_pair("record_key", &key);
                }
                for (name, value) in settings.iter() {
                    query.append_pair(name, value);
                }
                let query = query.finish();
                if !query.is_empty() {
                    write!(f, "?{query}")?;
                }
                Ok(())
            }
            Self::Sqs { url, group } => match group.query() {
                Some(group) => {
                    let joiner = if url.contains('?') { '&' } else { '?' };
                    let pair = form_urlencoded::Serializer::new(String::new())
                        .append_pair("group", &group)
                        .finish();
                    write!(f, "{url}{joiner}{pair}")
                }
                None => f.write_str(url),
            },
        }
    }
}

/// An SQS destination: the queue's URL without `group`, which names the
/// FIFO group.
fn sqs(parsed: &Url) -> Result<Destination, String> {
    let mut group = SqsGroup::default();
    let mut rest = form_urlencoded::Serializer::new(String::new());
    let mut kept = 0;
    for (name, value) in parsed.query_pairs() {
        if name == "group" {
            group = SqsGroup::parse(&value)?;
        } else {
            rest.append_pair(&name, &value);
            kept += 1;
        }
    }
    let mut url = parsed.clone();
    url.set_fragment(None);
    if kept == 0 {
        url.set_query(None);
    } else {
        url.set_query(Some(&rest.finish()));
    }
    let checked = sqs::SqsUrl::parse(url.as_str())?;
    if let Some((name, _)) = checked.query.first() {
        return Err(format!(
            "unknown option {name:?}: an SQS destination takes region= and group="
        ));
    }
    Ok(Destination::Sqs {
        url: url.to_string(),
        group,
    })
}

/// A path segment percent-encoded (a topic may hold `.`, `_`, `-`, which stay).
fn encode(segment: &str) -> String {
    url::form_urlencoded::byte_serialize(segment.as_bytes()).collect()
}

fn record_key_query(record_key: &RecordKey) -> Option<String> {
    match record_key {
        RecordKey::None => None,
        RecordKey::MessageKey => Some("key".into()),
        RecordKey::Header(name) => Some(format!("header:{name}")),
    }
}

fn kafka(text: &str) -> Result<Destination, String> {
    let url = KafkaUrl::parse(text)?;
    let topic = match url.path.as_slice() {
        [topic] => topic.clone(),
        [] => return Err("has no topic; write kafka://HOST:PORT/TOPIC".into()),
        _ => return Err("names more than one path segment; write kafka://HOST:PORT/TOPIC".into()),
    };
    let mut record_key = RecordKey::None;
    let mut settings = Settings::new();
    for (name, value) in url.query {
        if name == "record_key" {
            record_key = match value.split_once(':') {
                _ if value == "key" => RecordKey::MessageKey,
                Some(("header", header)) if !header.is_empty() => {
                    RecordKey::Header(header.to_owned())
                }
                _ => {
                    return Err(format!(
                        "record_key={value:?} not understood: write record_key=key (the message key) or record_key=header:NAME"
                    ));
                }
            };
        } else {
            settings = settings.set(name, value);
        }
    }
    Ok(Destination::Kafka {
        brokers: url.brokers,
        topic,
        record_key,
        settings,
    })
}

/// `exchange=...&routing_key=...`, the query that names an AMQP target.
fn target_query(exchange: &str, routing_key: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("exchange", exchange)
        .append_pair("routing_key", routing_key)
        .finish()
}

impl FromStr for Destination {
    type Err = DestinationError;

    fn from_str(text: &str) -> Result<Self, DestinationError> {
        let text = text.trim();
        if text.starts_with("kafka://") {
            // Several brokers (`k1:9092,k2:9092`) are no URL authority.
            return kafka(text).map_err(|problem| DestinationError::Invalid {
                text: redact_url(text),
                problem,
            });
        }
        if nats::NatsUrl::has_nats_scheme(text) {
            // Several servers (`n1:4222,n2:4222`) are no URL authority either.
            return nats_destination(text);
        }
        // Several RabbitMQ nodes (`r1:5672,r2:5672`) are no URL authority
        // either: the first is parsed, the text (with the list) is kept.
        let nodes = amqp::AmqpNodes::parse(text).map_err(|reason| DestinationError::NotAUrl {
            text: redact_url(text),
            reason,
        })?;
        let parsed = Url::parse(&nodes.urls[0]).map_err(|e| DestinationError::NotAUrl {
            text: redact_url(text),
            reason: e.to_string(),
        })?;
        let invalid = |problem: &str| DestinationError::Invalid {
            text: redact_url(text),
            problem: problem.to_owned(),
        };
        match parsed.scheme() {
            "amqp" | "amqps" => amqp(text, &parsed).map_err(|p| invalid(&p)),
            "sqs" | "sqs+http" => sqs(&parsed).map_err(|p| invalid(&p)),
            "http" | "https" => {
                if parsed.host_str().is_none_or(str::is_empty) {
                    return Err(invalid("has no host"));
                }
                Ok(Self::Http {
                    url: text.to_owned(),
                })
            }
            other => Err(DestinationError::UnknownScheme {
                scheme: other.to_owned(),
            }),
        }
    }
}

/// A JetStream destination: the servers (one or a list) with the options,
/// then the subject as the path.
fn nats_destination(text: &str) -> Result<Destination, DestinationError> {
    let invalid = |problem: &str| DestinationError::Invalid {
        text: redact_url(text),
        problem: problem.to_owned(),
    };
    let url = nats::NatsUrl::parse(text).map_err(|reason| DestinationError::NotAUrl {
        text: redact_url(text),
        reason,
    })?;
    let parsed = &url.url;
    if url.hosts.is_empty() {
        return Err(invalid(
            "has no host; write nats://HOST:PORT/SUBJECT, e.g. nats://127.0.0.1:4222/orders.created",
        ));
    }
    let subject = parsed.path().trim_start_matches('/');
    if subject.is_empty() {
        return Err(invalid(
            "has no subject; write it as the path: nats://HOST:PORT/SUBJECT, e.g. nats://127.0.0.1:4222/orders.created",
        ));
    }
    if subject.contains(['/', ' ', '*', '>']) {
        return Err(invalid(
            "the subject must be one concrete NATS subject (tokens separated by dots, no '/', spaces or wildcards)",
        ));
    }
    if parsed.fragment().is_some() {
        return Err(invalid("a NATS destination takes no fragment"));
    }
    nats::NatsServer::parse(&url).map_err(|p| invalid(&p))?;
    // The server part is the URL without its path, as parsed: the parser
    // escapes what the text left raw, so the parsed path need not be a
    // suffix of the text. Its query holds the connection's options (TLS,
    // credentials).
    Ok(Destination::Nats {
        url: url.server_url(),
        subject: subject.to_owned(),
    })
}

fn amqp(text: &str, parsed: &Url) -> Result<Destination, String> {
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("has no host; write amqp://USER:PASS@HOST:PORT/VHOST?queue=QUEUE".into());
    }
    let mut exchange = None;
    let mut routing_key = None;
    let mut queue = None;
    let mut rest = form_urlencoded::Serializer::new(String::new());
    let mut kept = 0;
    for (name, value) in parsed.query_pairs() {
        let slot = match &*name {
            "exchange" => &mut exchange,
            "routing_key" => &mut routing_key,
            "queue" => &mut queue,
            _ => {
                rest.append_pair(&name, &value);
                kept += 1;
                continue;
            }
        };
        if slot.replace(value.into_owned()).is_some() {
            return Err(format!("gives {name} twice"));
        }
    }
    let (exchange, routing_key) = match (exchange, routing_key, queue) {
        (_, Some(_), Some(_)) => {
            return Err(
                "gives both queue and routing_key: use ?queue=Q for the default exchange, or ?exchange=X&routing_key=K"
                    .into(),
            );
        }
        (Some(x), None, Some(_)) if !x.is_empty() => {
            return Err(
                "queue= only works with the default exchange; with an exchange, give routing_key="
                    .into(),
            );
        }
        (_, None, Some(q)) => (String::new(), q),
        (x, Some(k), None) => (x.unwrap_or_default(), k),
        (_, None, None) => {
            return Err(
                "says nowhere to publish: add ?queue=QUEUE (default exchange) or ?exchange=EXCHANGE&routing_key=KEY"
                    .into(),
            );
        }
    };
    let base = text.split(['?', '#']).next().unwrap_or(text);
    let url = if kept == 0 {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.finish())
    };
    amqp::AmqpServer::parse(&url)?;
    Ok(Destination::Amqp {
        url,
        exchange,
        routing_key,
    })
}

/// A destination as the outbox and dead-letter tables store it, safe to show
/// to people: as [`Destination::redacted`] writes it when it parses, else
/// through [`redact_url`].
///
/// ```
/// use idem_broker::publish::redact;
/// assert_eq!(redact("amqp://u:secret@h:5672/%2f?queue=q"), "amqp://u:***@h:5672/%2f?exchange=&routing_key=q");
/// assert_eq!(redact("kafka://h:9092/t?sasl.password=secret"), "kafka://h:9092/t");
/// ```
pub fn redact(text: &str) -> String {
    text.parse::<Destination>()
        .map_or_else(|_| redact_url(text), |destination| destination.redacted())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Destination {
        text.parse()
            .unwrap_or_else(|e| panic!("{text} should parse: {e}"))
    }

    #[test]
    fn every_form_round_trips_through_display() {
        for text in [
            "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=&routing_key=orders",
            "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=events&routing_key=order.created",
            "amqps://u:p@rabbit:5671/prod?heartbeat=10&exchange=x&routing_key=k%20k",
            "amqps://u:p@rabbit:5671/prod?cacertfile=%2Fca.pem&certfile=%2Fc.pem&keyfile=%2Fk.pem&queue=q",
            "nats://127.0.0.1:4222/orders.created",
            "nats://user:pw@127.0.0.1:4222/a.b",
            "tls://user:pw@127.0.0.1:4222/a.b?tls_ca=%2Ftmp%2Fca.pem",
            "nats://127.0.0.1:4222/a.b?tls=true&token=t0k",
            "nats://n1:4222,n2:4222,n3:4222/orders.created",
            "tls://u:p@n1:4222,n2:4222/a.b?tls_ca=%2Fca.pem",
            "http://127.0.0.1:8080/hooks/orders?tenant=7",
            "https://example.invalid/hook",
            "kafka://127.0.0.1:9092/orders",
            "kafka://k1:9092,k2:9092/orders.created?record_key=header%3Aorder-id&client.id=relay",
            "sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders",
            "sqs+http://test:test@127.0.0.1:5000/orders.fifo?region=us-east-1&group=header%3Aorder-id",
            "sqs:///orders.fifo?group=key",
            "sqs://h/q?region=a%20b&group=x%26y",
            "sqs://u:p%40ss@h:443/123/q.fifo?group=header%3Ak%20k",
        ] {
            let destination = parse(text);
            let again = parse(&destination.to_string());
            assert_eq!(destination, again, "{text}");
        }
    }

    #[test]
    fn a_kafka_topic_keeps_its_ampersand() {
        // Found by the destination_url fuzz target: the topic was cut at a
        // literal `&`, and `kafka://h:9092/&x` parsed with an empty topic
        // whose canonical form did not parse back.
        for (text, topic) in [("kafka://h:9092/a&b", "a&b"), ("kafka://h:9092/&x", "&x")] {
            let destination = parse(text);
            assert!(
                matches!(&destination, Destination::Kafka { topic: found, .. } if found == topic),
                "{destination:?}"
            );
            assert_eq!(parse(&destination.to_string()), destination, "{text}");
        }
    }

    #[test]
    fn a_nats_subject_the_parser_escapes_is_no_crash() {
        // Found by the destination_url fuzz target: a control character in
        // the subject made the parsed path longer than the text's, and the
        // server URL was cut at a negative length.
        let destination = parse("nats://127.0.0.1:4222/a\u{1}b");
        assert!(
            matches!(&destination, Destination::Nats { url, subject } if url == "nats://127.0.0.1:4222" && subject == "a%01b"),
            "{destination:?}"
        );
        assert_eq!(parse(&destination.to_string()), destination);
    }

    #[test]
    fn the_queue_shorthand_uses_the_default_exchange() {
        assert_eq!(
            parse("amqp://guest:guest@localhost:5672/%2f?queue=orders"),
            Destination::Amqp {
                url: "amqp://guest:guest@localhost:5672/%2f".into(),
                exchange: String::new(),
                routing_key: "orders".into(),
            }
        );
        let kept = parse("amqp://h/v?heartbeat=5&queue=q");
        assert!(
            matches!(kept, Destination::Amqp { ref url, .. } if url == "amqp://h/v?heartbeat=5"),
            "{kept:?}"
        );
    }

    #[test]
    fn a_rabbitmq_cluster_is_a_list_of_nodes() {
        let cluster =
            parse("amqp://app:s3cret@r1:5672,r2:5673,[::1]/prod?queue=orders&heartbeat=5");
        assert_eq!(
            cluster,
            Destination::Amqp {
                url: "amqp://app:s3cret@r1:5672,r2:5673,[::1]/prod?heartbeat=5".into(),
                exchange: String::new(),
                routing_key: "orders".into(),
            }
        );
        assert_eq!(parse(&cluster.to_string()), cluster);
        assert_eq!(
            cluster.redacted(),
            "amqp://app:***@r1:5672,r2:5673,[::1]/prod?exchange=&routing_key=orders"
        );
        let error = "amqp://app:s3cret@r1,r2:x/prod?queue=q"
            .parse::<Destination>()
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"r2:x\""), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn a_nats_cluster_is_a_list_of_servers() {
        assert_eq!(
            parse("nats://app:pw@n1:4222,n2:4222,n3:4222/orders.created?tls=true"),
            Destination::Nats {
                url: "nats://app:pw@n1:4222,n2:4222,n3:4222?tls=true".into(),
                subject: "orders.created".into(),
            }
        );
        assert_eq!(
            parse("nats://app:pw@n1:4222,n2:4222/orders.created").redacted(),
            "nats://app:***@n1:4222,n2:4222/orders.created"
        );
        let error = "nats://n1:4222,,n3:4222/orders"
            .parse::<Destination>()
            .unwrap_err();
        assert!(error.to_string().contains("an empty server"), "{error}");
    }

    #[test]
    fn nats_subject_is_the_path() {
        assert_eq!(
            parse("nats://127.0.0.1:4222/orders.created"),
            Destination::Nats {
                url: "nats://127.0.0.1:4222".into(),
                subject: "orders.created".into(),
            }
        );
    }

    #[test]
    fn mistakes_are_explained() {
        let cases = [
            ("kafka://broker:9092", "has no topic"),
            ("kafka://broker:9092/t?record_key=uuid", "record_key"),
            ("redis://broker:6379/stream", "not supported"),
            ("amqp://guest:secret@h:5672/%2f", "?queue=QUEUE"),
            (
                "amqp://h/%2f?queue=a&routing_key=b",
                "both queue and routing_key",
            ),
            ("nats://127.0.0.1:4222", "has no subject"),
            (
                "nats://127.0.0.1:4222/orders.*",
                "one concrete NATS subject",
            ),
            ("orders", "is not a URL"),
            ("amqp://h/%2f?queue=q&cacertfile=/ca.pem", "amqps://"),
            ("nats://h:4222/s?tls_cert=/c.pem", "tls_key"),
            ("nats://h:4222/s?password=secret", "unknown option"),
            ("sqs://h/q?visibility=30s", "unknown option"),
            ("sqs://u:secret@h/q?group=", "group="),
            ("sqs://h/", "names no queue"),
        ];
        for (text, expected) in cases {
            let error = text.parse::<Destination>().unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("secret"), "{error}");
        }
    }

    #[test]
    fn passwords_show_only_in_display() {
        let destination = parse("amqp://app:hunter2@rabbit:5672/%2f?queue=q");
        assert!(destination.to_string().contains("hunter2"));
        assert!(!destination.redacted().contains("hunter2"));
        assert!(!format!("{destination:?}").contains("hunter2"));
        assert_eq!(
            parse("amqps://u:pw@h:5671/v?heartbeat=10&exchange=x&routing_key=k").redacted(),
            "amqps://u:***@h:5671/v?exchange=x&routing_key=k"
        );
        assert_eq!(
            parse("nats://n:pw@h:4222/s").redacted(),
            "nats://n:***@h:4222/s"
        );
        assert_eq!(
            parse("tls://n:pw@h:4222/s?tls_ca=/ca.pem").redacted(),
            "tls://n:***@h:4222/s"
        );
        let token = parse("nats://h:4222/s?tls=true&token=s3cret");
        assert!(token.to_string().contains("s3cret"));
        assert_eq!(token.redacted(), "nats://h:4222/s");
        assert_eq!(
            parse("sqs+http://key:s3cret@h:5000/q.fifo?region=r&group=g").redacted(),
            "sqs+http://key:***@h:5000/q.fifo?group=g"
        );
        assert!(!format!("{token:?}").contains("s3cret"));
        assert_eq!(
            parse("https://h/hook?token=s3cret#x").redacted(),
            "https://h/hook"
        );
    }
}
