//! What the transform sees ([`Input`]) and gives back ([`Output`]).

use std::collections::BTreeMap;

use bytes::Bytes;
use rdkafka::message::{BorrowedMessage, Headers, Message as _};

/// One input record, as the transform sees it: an owned copy, so the
/// transform may keep parts of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The topic it was read from.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// The record key, if any.
    pub key: Option<Bytes>,
    /// The payload; `None` for a tombstone.
    pub payload: Option<Bytes>,
    /// The headers in order; a name may repeat, a value may be null.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// The record's timestamp in milliseconds since the Unix epoch, if any.
    pub timestamp: Option<i64>,
}

impl Input {
    /// The value of the first header named `name` (ASCII case-insensitive),
    /// if it is there and not null.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_deref())
    }

    /// `topic/partition/offset`, for logs and errors.
    pub fn coordinates(&self) -> String {
        format!("{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// One record the transform asks to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The topic; one of [`PipeConfig::output_topics`](super::PipeConfig::output_topics).
    pub topic: String,
    /// The record key (the partition is chosen from it), if any.
    pub key: Option<Bytes>,
    /// The payload; `None` writes a tombstone.
    pub payload: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<(String, Bytes)>,
}

impl Output {
    /// A record with `payload` for `topic`, without key or headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            key: None,
            payload: Some(payload.into()),
            headers: Vec::new(),
        }
    }

    /// A tombstone for `key` in `topic` (a compacted topic then drops the key).
    pub fn tombstone(topic: impl Into<String>, key: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            key: Some(key.into()),
            payload: None,
            headers: Vec::new(),
        }
    }

    /// With this record key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// With one more header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// For each partition in `batch`, the offset after its last record.
pub(super) fn next_offsets(batch: &[Input]) -> BTreeMap<(&str, i32), i64> {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for record in batch {
        let entry = next
            .entry((record.topic.as_str(), record.partition))
            .or_insert(record.offset + 1);
        *entry = (*entry).max(record.offset + 1);
    }
    next
}

pub(super) fn input(record: &BorrowedMessage<'_>) -> Input {
    let headers = record
        .headers()
        .map(|list| {
            list.iter()
                .map(|h| (h.key.to_owned(), h.value.map(Bytes::copy_from_slice)))
                .collect()
        })
        .unwrap_or_default();
    Input {
        topic: record.topic().to_owned(),
        partition: record.partition(),
        offset: record.offset(),
        key: record.key().map(Bytes::copy_from_slice),
        payload: record.payload().map(Bytes::copy_from_slice),
        headers,
        timestamp: record.timestamp().to_millis(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_point_past_the_last_record_of_each_partition() {
        let record = |partition, offset| Input {
            topic: "orders".into(),
            partition,
            offset,
            key: None,
            payload: None,
            headers: Vec::new(),
            timestamp: None,
        };
        let batch = [record(0, 4), record(1, 9), record(0, 5), record(0, 6)];
        let next = next_offsets(&batch);
        assert_eq!(next.get(&("orders", 0)), Some(&7));
        assert_eq!(next.get(&("orders", 1)), Some(&10));
    }
}
