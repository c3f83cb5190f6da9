//! Where a message's idempotency key comes from.
//!
//! The key must be made where the intent is formed (the producer) and travel
//! unchanged with every copy of the message: the publisher's message id (AMQP
//! `message_id`, `Nats-Msg-Id`), a named header, or a field of a JSON body
//! (an event id, an order id plus the operation). A message without one cannot
//! be deduplicated, so by default it goes to the dead letters with a reason
//! that says what was looked for.
//!
//! The last resort, only when configured: the message's coordinates in the
//! broker's log (`STREAM/SEQUENCE` on NATS JetStream, `TOPIC/PARTITION/OFFSET`
//! on Kafka, `QUEUE/MESSAGE-ID` on SQS). They are stable across
//! redeliveries of one publish, so a crash between commit and ack is still
//! covered, but two publishes of the same intent get two positions and are
//! both applied, and the positions change when the stream is recreated or
//! migrated. RabbitMQ queues have no such positions at all.

use std::fmt;
use std::str::FromStr;

use idem_core::IdempotencyKey;

use super::message::Message;

/// Where the key is read from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeySource {
    /// AMQP `message_id`, the `Nats-Msg-Id` header, Kafka's
    /// `idempotency-key` header, or SQS's `idempotency-key` attribute (else
    /// a FIFO message's `MessageDeduplicationId`) (the default).
    #[default]
    MessageId,
    /// The Kafka record key, as UTF-8 text.
    RecordKey,
    /// A named header (case-insensitive).
    Header(String),
    /// A field of a JSON payload: a JSON Pointer (`/order/id`) or a dotted
    /// path (`order.id`). Strings are taken as they are, numbers in their
    /// decimal form.
    JsonField(String),
}

/// What happens to a message whose key cannot be found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// Record it in the dead letters with the reason (the default).
    #[default]
    DeadLetter,
    /// Key it by its broker coordinates (NATS `STREAM/SEQUENCE`, Kafka
    /// `TOPIC/PARTITION/OFFSET`, SQS `QUEUE/MESSAGE-ID`); where the
    /// broker has none (RabbitMQ), dead-letter it. The last resort: see the
    /// module documentation.
    Coordinates,
}

/// How keys are taken from messages: a source, and the fallback.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRule {
    /// Where the key is read.
    pub source: KeySource,
    /// What to do without one.
    pub missing: MissingKey,
}

/// Why no key could be taken from a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no idempotency key: {0}")]
pub struct NoKey(pub String);

impl KeyRule {
    /// A rule reading `source`, dead-lettering messages without a key.
    pub fn new(source: KeySource) -> Self {
        Self {
            source,
            missing: MissingKey::DeadLetter,
        }
    }

    /// The same rule with another fallback.
    pub fn or_else(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// The key of `message`.
    ///
    /// ```
    /// use idem_broker::consume::{KeyRule, KeySource, Message, MissingKey};
    /// let mut message = Message::new(r#"{"order":{"id":42}}"#);
    /// let rule = KeyRule::new(KeySource::JsonField("order.id".into()));
    /// assert_eq!(rule.extract(&message).unwrap().as_str(), "42");
    ///
    /// let by_id = KeyRule::default();
    /// assert!(by_id.extract(&message).unwrap_err().to_string().contains("message id"));
    /// message.coordinates = Some("ORDERS/17".into());
    /// let last_resort = by_id.or_else(MissingKey::Coordinates);
    /// assert_eq!(last_resort.extract(&message).unwrap().as_str(), "ORDERS/17");
    /// ```
    pub fn extract(&self, message: &Message) -> Result<IdempotencyKey, NoKey> {
        match (self.read(message), self.missing) {
            (Ok(key), _) => Ok(key),
            (Err(why), MissingKey::DeadLetter) => Err(why),
            (Err(why), MissingKey::Coordinates) => match &message.coordinates {
                Some(position) => IdempotencyKey::new(position.clone()).map_err(|e| {
                    NoKey(format!(
                        "{}; the coordinates {position:?} are not a valid key either: {e}",
                        why.0
                    ))
                }),
                None => Err(NoKey(format!(
                    "{}; the broker gives no stable coordinates to fall back on (RabbitMQ queues have none): publish with a message id",
                    why.0
                ))),
            },
        }
    }

    fn read(&self, message: &Message) -> Result<IdempotencyKey, NoKey> {
        let (text, what) = match &self.source {
            KeySource::MessageId => (
                message.message_id.clone(),
                "the message has no message id (AMQP message_id / Nats-Msg-Id / Kafka idempotency-key header / SQS idempotency-key attribute)".to_owned(),
            ),
            KeySource::RecordKey => (
                message
                    .record_key
                    .as_ref()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .map(str::to_owned),
                "the record has no record key, or one that is not UTF-8 text".to_owned(),
            ),
            KeySource::Header(name) => (
                message.header(name).map(str::to_owned),
                format!("the message has no header {name:?}"),
            ),
            KeySource::JsonField(path) => json_field(&message.payload, path)?,
        };
        let text = text.ok_or(NoKey(what))?;
        IdempotencyKey::new(text).map_err(|e| NoKey(format!("the key found is not valid: {e}")))
    }
}

fn json_field(payload: &[u8], path: &str) -> Result<(Option<String>, String), NoKey> {
    let value: serde_json::Value = serde_json::from_slice(payload).map_err(|e| {
        NoKey(format!(
            "the key is the JSON field {path:?}, but the payload is not JSON: {e}"
        ))
    })?;
    let pointer = if path.starts_with('/') {
        path.to_owned()
    } else {
        path.split('.')
            .map(|part| format!("/{}", part.replace('~', "~0").replace('/', "~1")))
            .collect()
    };
    let text = match value.pointer(&pointer) {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    Ok((
        text,
        format!("the JSON payload has no string or number at {path:?}"),
    ))
}

/// The text form used on the command line: `message-id`, `header:NAME`,
/// `json:PATH`.
impl FromStr for KeySource {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            _ if text == "message-id" => Ok(Self::MessageId),
            _ if text == "record-key" => Ok(Self::RecordKey),
            Some(("header", name)) if !name.is_empty() => Ok(Self::Header(name.to_owned())),
            Some(("json", path)) if !path.is_empty() => Ok(Self::JsonField(path.to_owned())),
            _ => Err(format!(
                "key source {text:?} not understood: use message-id, record-key (Kafka), header:NAME or json:PATH (a JSON Pointer such as /order/id, or order.id)"
            )),
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MessageId => f.write_str("message-id"),
            Self::RecordKey => f.write_str("record-key"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::JsonField(path) => write!(f, "json:{path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &str) -> Message {
        Message::new(payload.to_owned())
    }

    #[test]
    fn reads_each_source() {
        let mut m = message(r#"{"event":{"id":"evt-1"},"n":7}"#);
        m.message_id = Some("mid-1".into());
        m.headers.insert("X-Key".into(), "hdr-1".into());
        let key = |source| KeyRule::new(source).extract(&m).map(|k| k.to_string());
        assert_eq!(key(KeySource::MessageId), Ok("mid-1".into()));
        assert_eq!(key(KeySource::Header("x-key".into())), Ok("hdr-1".into()));
        assert_eq!(
            key(KeySource::JsonField("/event/id".into())),
            Ok("evt-1".into())
        );
        assert_eq!(
            key(KeySource::JsonField("event.id".into())),
            Ok("evt-1".into())
        );
        assert_eq!(key(KeySource::JsonField("n".into())), Ok("7".into()));
    }

    #[test]
    fn says_what_was_missing() {
        let m = message("not json");
        let err = KeyRule::new(KeySource::JsonField("id".into()))
            .extract(&m)
            .unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
        let err = KeyRule::new(KeySource::Header("x-key".into()))
            .extract(&m)
            .unwrap_err();
        assert!(err.to_string().contains("\"x-key\""), "{err}");
        let mut spaced = message("");
        spaced.message_id = Some("has space".into());
        let err = KeyRule::default().extract(&spaced).unwrap_err();
        assert!(err.to_string().contains("not valid"), "{err}");
        let err = KeyRule::default()
            .or_else(MissingKey::Coordinates)
            .extract(&m)
            .unwrap_err();
        assert!(err.to_string().contains("RabbitMQ"), "{err}");
    }

    #[test]
    fn parses_the_command_line_form() {
        for text in ["message-id", "record-key", "header:x-key", "json:/a/b"] {
            let source: KeySource = text.parse().unwrap();
            assert_eq!(source.to_string(), text);
        }
        assert!("json:".parse::<KeySource>().is_err());
        assert!("uuid".parse::<KeySource>().is_err());
    }
}
