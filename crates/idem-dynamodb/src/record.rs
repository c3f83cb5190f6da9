//! A record as one DynamoDB item, both ways: the attributes a claim, a
//! completion or an operator writes, and an item read back into a
//! [`Record`].
//!
//! Attributes: `pk` (see [`item`](crate::item)), `scope`, `key`, `fp` (the
//! 32 fingerprint bytes), `state`, `token`, `lease` (absent once released or
//! settled), `okind`, `body`, `meta` (the outcome: kind, bytes, metadata as
//! JSON; `body` absent when empty), `created`, `updated`, `expires` (times in
//! milliseconds by the application's clock), `ttl` (seconds, for DynamoDB's
//! time to live: the end of the window plus the tombstone grace period) and
//! `ver`, which grows with every write so that a write can require the item
//! to be exactly the one it read.

use std::time::Duration;

use idem_core::{
    Error, ErrorKind, FencingToken, Fingerprint, IdempotencyKey, Outcome, Record, RecordState,
    Scope, StoreError, Timestamp,
};

use crate::item::{self, Item, Reader};

pub(crate) const SCOPE: &str = "scope";
pub(crate) const KEY: &str = "key";
pub(crate) const FINGERPRINT: &str = "fp";
pub(crate) const STATE: &str = "state";
pub(crate) const TOKEN: &str = "token";
pub(crate) const LEASE: &str = "lease";
pub(crate) const OUTCOME_KIND: &str = "okind";
pub(crate) const BODY: &str = "body";
pub(crate) const META: &str = "meta";
pub(crate) const CREATED: &str = "created";
pub(crate) const UPDATED: &str = "updated";
pub(crate) const EXPIRES: &str = "expires";
pub(crate) const VERSION: &str = "ver";

/// A record as read, with the version a conditional write requires.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) record: Record,
    pub(crate) version: i64,
}

/// When DynamoDB may delete a record whose window ends at `expires`: with
/// tombstones kept, the item outlives its window by the grace period (it is
/// its own tombstone).
pub(crate) fn gone_at(expires: Timestamp, tombstones: Option<Duration>) -> Timestamp {
    tombstones.map_or(expires, |grace| expires.plus(grace))
}

/// The whole item of `record`, at `version`.
pub(crate) fn to_item(record: &Record, version: i64, tombstones: Option<Duration>) -> Item {
    let mut item = item::key_of(item::record_pk(&record.scope, &record.key));
    let mut set = |name: &str, value| {
        item.insert(name.to_owned(), value);
    };
    set(SCOPE, item::text(record.scope.as_str()));
    set(KEY, item::text(record.key.as_str()));
    set(
        FINGERPRINT,
        item::bytes(record.fingerprint.as_bytes().to_vec()),
    );
    set(STATE, item::text(record.state.as_str()));
    set(TOKEN, item::number(record.token.get()));
    if let Some(lease) = record.lease_until {
        set(LEASE, item::number(lease.0));
    }
    if let Some(outcome) = &record.outcome {
        set(OUTCOME_KIND, item::text(outcome.kind.as_str()));
        if !outcome.body.is_empty() {
            set(BODY, item::bytes(outcome.body.clone()));
        }
        set(META, item::text(outcome.meta_json()));
    }
    set(CREATED, item::number(record.created_at.0));
    set(UPDATED, item::number(record.updated_at.0));
    set(EXPIRES, item::number(record.expires_at.0));
    set(
        item::TTL_ATTRIBUTE,
        item::ttl_at(gone_at(record.expires_at, tombstones)),
    );
    set(VERSION, item::number(version));
    item
}

/// The record in `item` (the item at `pk`).
pub(crate) fn from_item(pk: &str, item: &Item) -> Result<Stored, Error> {
    let read = Reader::new(item);
    read_record(&read).map_err(|why| corrupt(pk, &why))
}

fn read_record(read: &Reader<'_>) -> Result<Stored, String> {
    let outcome = match read.text_or_none(OUTCOME_KIND)? {
        Some(kind) => Some(Outcome {
            kind: kind.parse().map_err(|e| format!("{e}"))?,
            body: read.bytes(BODY)?.to_vec(),
            meta: Outcome::parse_meta(read.text(META)?)
                .map_err(|e| format!("outcome metadata is not a JSON string map: {e}"))?,
        }),
        None => None,
    };
    let record = Record {
        scope: Scope::new(read.text(SCOPE)?).map_err(|e| e.to_string())?,
        key: IdempotencyKey::new(read.text(KEY)?).map_err(|e| e.to_string())?,
        fingerprint: Fingerprint::from_slice(read.bytes(FINGERPRINT)?)
            .ok_or("the fingerprint is not 32 bytes")?,
        state: read
            .text(STATE)?
            .parse::<RecordState>()
            .map_err(|e| e.to_string())?,
        token: FencingToken::new(read.number(TOKEN)?).ok_or("the token is not positive")?,
        lease_until: read.number_or_none(LEASE)?.map(Timestamp),
        outcome,
        created_at: Timestamp(read.number(CREATED)?),
        updated_at: Timestamp(read.number(UPDATED)?),
        expires_at: Timestamp(read.number(EXPIRES)?),
    };
    if record.state.is_settled() && record.outcome.is_none() {
        return Err("a settled record without an outcome".into());
    }
    Ok(Stored {
        record,
        version: read.number(VERSION)?,
    })
}

/// The error for an item under the records' prefix that is not one.
pub(crate) fn corrupt(pk: &str, what: &str) -> Error {
    StoreError::new(
        ErrorKind::Corrupt,
        format!(
            "the DynamoDB item {pk:?} is not a record Idem wrote ({what}); delete it (a new claim then starts the key over), or give Idem a table no other program writes to"
        ),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_its_item() {
        let settled = Record {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::new("k#1").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"x"),
            state: RecordState::Failed,
            token: FencingToken::new(7).unwrap(),
            lease_until: None,
            outcome: Some(Outcome::terminal_failure("no").with_meta("a", "b")),
            created_at: Timestamp(1),
            updated_at: Timestamp(2),
            expires_at: Timestamp(3_000),
        };
        let item = to_item(&settled, 4, Some(Duration::from_secs(1)));
        assert_eq!(item.get("ttl"), Some(&item::number(4)));
        let back = from_item("r#1#s#k#1", &item).unwrap();
        assert_eq!((back.record, back.version), (settled.clone(), 4));

        let running = Record {
            state: RecordState::InFlight,
            lease_until: Some(Timestamp(9)),
            outcome: None,
            ..settled
        };
        let back = from_item("pk", &to_item(&running, 1, None)).unwrap();
        assert_eq!(back.record, running);
        let mut broken = to_item(&running, 1, None);
        broken.insert(STATE.into(), item::text("completed"));
        let error = from_item("pk", &broken).unwrap_err().to_string();
        assert!(error.contains("without an outcome"), "{error}");
    }
}
