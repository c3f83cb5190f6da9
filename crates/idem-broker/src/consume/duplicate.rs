//! The log line of a duplicate: at info, never higher, with where the copy
//! came from and how old the record that answered it is, so a burst of
//! redeliveries can be told from a producer that publishes twice.

use idem_core::{AttemptStore, Timestamp};

use super::apply::Apply;
use super::message::{KeyedMessage, Message};
use super::runtime::Shared;

impl<A: Apply> Shared<A> {
    /// Logs a duplicate at info, never higher: it is the consumer doing its
    /// job. It names where the copy came from (source, subject, position in
    /// the log, Kafka's partition and offset, delivery count), how old the
    /// record that answered it is (`age_ms`, from the key's first claim, one
    /// read of the record) and how long ago the broker first had the message
    /// (`since_published_ms`), so a burst of redeliveries can be told from a
    /// producer that publishes twice; the key is in the span, not here.
    pub(crate) async fn replayed(&self, keyed: &KeyedMessage) {
        if !tracing::enabled!(tracing::Level::INFO) {
            return;
        }
        let recorded_at = self.apply.recorded_at(keyed).await;
        let message = &keyed.message;
        let fields = DuplicateFields::of(
            message,
            self.route.is_kafka(),
            recorded_at,
            self.apply.store().now(),
        );
        tracing::info!(
            scope = self.config.scope.as_str(),
            origin = self.route.origin.as_str(),
            subject = message.subject.as_str(),
            position = message.coordinates.as_deref(),
            partition = fields.partition,
            offset = fields.offset,
            delivery = message.delivery_count,
            age_ms = fields.age_ms,
            since_published_ms = fields.since_published_ms,
            "duplicate delivery: answered from the store and acked; the effect did not run again"
        );
    }
}

/// The fields of a duplicate's log line that are worked out, not copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DuplicateFields {
    /// Milliseconds since the record that answered the copy was made.
    pub(crate) age_ms: Option<u64>,
    /// Milliseconds since the broker first had the message.
    pub(crate) since_published_ms: Option<u64>,
    /// The Kafka partition the copy was read from.
    pub(crate) partition: Option<i32>,
    /// Its offset in that partition.
    pub(crate) offset: Option<i64>,
}

impl DuplicateFields {
    /// The fields for `message` at `now` (the store's clock), answered by a
    /// record made at `recorded_at`; partition and offset are read from a
    /// Kafka record's `TOPIC/PARTITION/OFFSET`.
    pub(crate) fn of(
        message: &Message,
        kafka: bool,
        recorded_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Self {
        let ms = |at: Timestamp| u64::try_from(at.until(now).as_millis()).unwrap_or(u64::MAX);
        let (partition, offset) = kafka.then(|| kafka_position(message)).flatten().unzip();
        Self {
            age_ms: recorded_at.map(ms),
            since_published_ms: message.published_at.map(ms),
            partition,
            offset,
        }
    }
}

/// Partition and offset of a Kafka record whose coordinates are
/// `TOPIC/PARTITION/OFFSET` (a topic name has no `/`).
fn kafka_position(message: &Message) -> Option<(i32, i64)> {
    let (partition, offset) = message
        .coordinates
        .as_deref()?
        .strip_prefix(message.subject.as_str())?
        .strip_prefix('/')?
        .split_once('/')?;
    Some((partition.parse().ok()?, offset.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_s_fields_carry_the_record_s_age_and_the_kafka_position() {
        let mut record = Message::new("x");
        record.subject = "payments".into();
        record.coordinates = Some("payments/3/1187".into());
        record.published_at = Some(Timestamp(1_000));
        let now = Timestamp(61_500);
        let fields = DuplicateFields::of(&record, true, Some(Timestamp(1_250)), now);
        assert_eq!(
            fields,
            DuplicateFields {
                age_ms: Some(60_250),
                since_published_ms: Some(60_500),
                partition: Some(3),
                offset: Some(1187),
            }
        );

        // A record made after `now` by a clock that moved back: age 0.
        let ahead = DuplicateFields::of(&record, true, Some(Timestamp(70_000)), now);
        assert_eq!(ahead.age_ms, Some(0));

        // Not Kafka (a JetStream position has two parts), or nothing known.
        let mut jet = Message::new("x");
        jet.subject = "orders.created".into();
        jet.coordinates = Some("ORDERS/42".into());
        let none = DuplicateFields::of(&jet, false, None, now);
        assert_eq!(
            none,
            DuplicateFields {
                age_ms: None,
                since_published_ms: None,
                partition: None,
                offset: None,
            }
        );
        assert_eq!(kafka_position(&jet), None);
    }
}
