//! Kafka publisher: the idempotent producer, `Ok` when every in-sync replica
//! has the record.
//!
//! The message's key travels as the `idempotency-key` header; the record key
//! is the message key or one of its headers when the destination asks for it
//! (`?record_key=key` or `?record_key=header:NAME`), so records of one
//! aggregate land in one partition, in order. The producer is idempotent
//! (`enable.idempotence=true`, `acks=all`, at most 5 requests in flight,
//! retries bounded by `message.timeout.ms`): the broker drops a batch it
//! already has, so librdkafka's own retries neither duplicate nor reorder.
//! A send that times out is retried by the caller (the relay) with the same
//! key, and the consumer's store suppresses the copy if the first one landed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use super::KEY_HEADER;
use super::refusal::{Reasons, report_failures};
use crate::publish::destination::{Destination, RecordKey};
use crate::publish::error::{PublishError, PublishErrorKind};
use crate::publish::message::{Message, Publish};

/// What the producer's librdkafka calls back into: the reasons of its
/// errors, kept to explain a refused handshake or authentication.
#[derive(Default, Clone)]
struct Context {
    reasons: Arc<Reasons>,
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.reasons.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.reasons.record(reason);
        tracing::error!(%error, %reason, "librdkafka reported an error");
    }
}

/// Publishes to one Kafka topic with the idempotent producer.
pub struct KafkaPublisher {
    destination: Destination,
    topic: String,
    record_key: RecordKey,
    producer: FutureProducer<Context>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Creates the producer and checks that the brokers answer and know the
    /// topic. Unsafe producer settings in the destination are refused.
    pub async fn connect(destination: &Destination) -> Result<Self, PublishError> {
        let Destination::Kafka {
            brokers,
            topic,
            record_key,
            settings,
        } = destination
        else {
            return Err(PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                "not a kafka:// destination",
            ));
        };
        let mut config = settings.producer(brokers).map_err(|e| {
            PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                e.to_string(),
            )
        })?;
        report_failures(&mut config);
        let context = Context::default();
        let reasons = Arc::clone(&context.reasons);
        let producer: FutureProducer<Context> =
            config.create_with_context(context).map_err(|e| {
                PublishError::new(
                    PublishErrorKind::Config,
                    destination.redacted(),
                    format!("could not create the Kafka producer: {e}"),
                )
            })?;
        let checked = {
            let (producer, topic, reasons) =
                (producer.clone(), topic.clone(), Arc::clone(&reasons));
            // Up to 10 s; the producer's own thread serves librdkafka's error
            // events, and a refused handshake or authentication ends the wait.
            tokio::task::spawn_blocking(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let attempt = producer
                        .client()
                        .fetch_metadata(Some(&topic), Duration::from_secs(1))
                        .map(|m| {
                            m.topics().iter().any(|t| {
                                t.name() == topic
                                    && t.error().is_none()
                                    && !t.partitions().is_empty()
                            })
                        });
                    let refused = reasons.refusal().is_some_and(|r| r.kind.is_final());
                    if attempt.is_ok() || refused || Instant::now() >= deadline {
                        return attempt;
                    }
                }
            })
            .await
            .map_err(|e| {
                PublishError::new(
                    PublishErrorKind::Unavailable,
                    destination.redacted(),
                    e.to_string(),
                )
            })?
        };
        match checked {
            Ok(true) => {}
            Ok(false) => {
                return Err(PublishError::new(
                    PublishErrorKind::NotTaken,
                    destination.redacted(),
                    format!("the brokers have no topic {topic:?}; create it"),
                ));
            }
            Err(e) => {
                if let Some(refusal) = reasons.refusal() {
                    return Err(PublishError::new(
                        PublishErrorKind::Config,
                        destination.redacted(),
                        format!(
                            "could not reach the Kafka brokers at {brokers}: {}",
                            refusal.message
                        ),
                    ));
                }
                return Err(PublishError::new(
                    PublishErrorKind::Unavailable,
                    destination.redacted(),
                    format!("could not reach the Kafka brokers at {brokers}: {e}; is a broker listening there?"),
                )
                .with_source(e));
            }
        }
        Ok(Self {
            destination: destination.clone(),
            topic: topic.clone(),
            record_key: record_key.clone(),
            producer,
        })
    }

    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    fn failed(&self, error: KafkaError) -> PublishError {
        let code = error.rdkafka_error_code();
        let kind = match code {
            Some(
                RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord,
            ) => PublishErrorKind::Rejected,
            Some(
                RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed,
            ) => PublishErrorKind::NotTaken,
            _ => PublishErrorKind::Unavailable,
        };
        PublishError::new(
            kind,
            self.destination.redacted(),
            format!("Kafka did not confirm the record: {error}"),
        )
        .with_source(error)
    }
}

impl Publish for KafkaPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 1);
        for (name, value) in &message.headers {
            if name.eq_ignore_ascii_case(KEY_HEADER) {
                continue;
            }
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        headers = headers.insert(Header {
            key: KEY_HEADER,
            value: Some(message.key.as_str().as_bytes()),
        });
        let key = match &self.record_key {
            RecordKey::None => None,
            RecordKey::MessageKey => Some(message.key.as_str()),
            RecordKey::Header(name) => message
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str()),
        };
        let mut record = FutureRecord::to(&self.topic)
            .payload(message.payload.as_slice())
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key.as_bytes());
        }
        self.producer
            .send(record, Timeout::Never)
            .await
            .map(|_| ())
            .map_err(|(error, _)| self.failed(error))
    }
}
