//! What a consumer sees of a delivery, whatever the broker: the payload, the
//! headers, the broker's own identifiers and its delivery count.
//!
//! Adapters fill a [`Message`] from their native delivery (lapin's `Delivery`,
//! async-nats' `jetstream::Message`), so key extraction, attempt counting and
//! dead-lettering are written once, against this type.

use std::collections::BTreeMap;

use bytes::Bytes;
use idem_core::{Fingerprint, FingerprintRule, IdempotencyKey, Scope, Timestamp};

/// One received message, broker-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The body, as published.
    pub payload: Bytes,
    /// Application headers, as text (non-text values are written in their
    /// natural text form; binary values are dropped).
    pub headers: BTreeMap<String, String>,
    /// The publisher's message id: AMQP `message_id`, NATS `Nats-Msg-Id`,
    /// Kafka's `idempotency-key` header, or SQS's `idempotency-key` attribute
    /// (else a FIFO message's `MessageDeduplicationId`).
    pub message_id: Option<String>,
    /// The payload's content type, where the broker carries one
    /// (AMQP `content_type`, a NATS `Content-Type` header).
    pub content_type: Option<String>,
    /// The Kafka record key, where there is one.
    pub record_key: Option<Bytes>,
    /// The AMQP routing key, the NATS subject or the Kafka topic it was published to.
    pub subject: String,
    /// The message's position in a log, stable across redeliveries of this one
    /// publish: `STREAM/SEQUENCE` on NATS JetStream, `TOPIC/PARTITION/OFFSET`
    /// on Kafka. `None` on RabbitMQ, whose
    /// queues have no stable positions.
    pub coordinates: Option<String>,
    /// How many times the broker has delivered this message, this delivery
    /// included, where the broker counts (NATS `delivered`; RabbitMQ quorum
    /// queues' `x-delivery-count` + 1, or 1 for a first delivery).
    pub delivery_count: Option<u32>,
    /// When the broker received it from its publisher, if it says so.
    pub published_at: Option<Timestamp>,
}

impl Message {
    /// A message with this payload and nothing else (for tests and adapters).
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            headers: BTreeMap::new(),
            message_id: None,
            content_type: None,
            record_key: None,
            subject: String::new(),
            coordinates: None,
            delivery_count: None,
            published_at: None,
        }
    }

    /// A header, looked up without regard to case (AMQP header names are
    /// case-sensitive, NATS and HTTP ones are not; publishers disagree).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .or_else(|| {
                self.headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v)
            })
            .map(String::as_str)
    }

    /// The fingerprint of this message under `rule`: what it covers of the
    /// payload and of the headers (each header's one value, or none).
    pub fn fingerprint(&self, rule: &FingerprintRule) -> Fingerprint {
        rule.fingerprint(&self.payload, |name| {
            self.header(name)
                .map(|value| vec![value.as_bytes().to_vec()])
                .unwrap_or_default()
        })
    }
}

/// A message with the identity it is applied under: scope, key and payload
/// fingerprint. This is what an effect receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedMessage {
    /// The consumer's scope (the handler's name).
    pub scope: Scope,
    /// The idempotency key taken from the message.
    pub key: IdempotencyKey,
    /// The hash of the payload (canonical JSON when the payload is JSON), or
    /// of what the consumer's [`FingerprintRule`] covers.
    pub fingerprint: Fingerprint,
    /// The message.
    pub message: Message,
}

impl KeyedMessage {
    /// The message's payload.
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// The operation the store dedupes on.
    pub fn operation(&self) -> idem_core::Operation {
        idem_core::Operation::new(self.scope.clone(), self.key.clone(), self.fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_covers_the_chosen_headers_without_regard_to_case() {
        let rule = FingerprintRule::default()
            .select("json:/amount")
            .unwrap()
            .header("X-Tenant")
            .unwrap();
        let with = |payload: &'static [u8], tenant: Option<&str>| {
            let mut message = Message::new(payload);
            if let Some(tenant) = tenant {
                message.headers.insert("x-TENANT".into(), tenant.into());
            }
            message.fingerprint(&rule)
        };
        let a = with(br#"{"amount":1,"at":1}"#, Some("t1"));
        assert_eq!(a, with(br#"{"at":2,"amount":1}"#, Some("t1")));
        assert_ne!(a, with(br#"{"amount":1}"#, Some("t2")));
        assert_ne!(a, with(br#"{"amount":1}"#, None));
        assert_ne!(a, with(br#"{"amount":2}"#, Some("t1")));
        assert_eq!(a.rule_id(), rule.id());
        // The default rule: the payload's canonical JSON, as before rules.
        let plain = Message::new(&br#"{"b":1,"a":2}"#[..]);
        assert_eq!(
            plain.fingerprint(&FingerprintRule::default()),
            Fingerprint::of_json_or_bytes(&plain.payload)
        );
    }
}
