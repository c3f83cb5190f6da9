//! Dead letters on DynamoDB: [`DeadLetterStore`]. Each letter is an item
//! (partition key `d#ID`), its id taken from a counter item
//! (`n#dead_letters`) by one atomic increment. Dead letters are few (a
//! message given up on) and are listed by a scan of their prefix.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use idem_core::{
    DeadLetter, DeadLetterStats, DeadLetterStore, Error, ErrorKind, IdempotencyKey, NewDeadLetter,
    StoreError, Timestamp, no_such_dead_letter,
};

use crate::error::{is_condition_failure, map_error};
use crate::item::{self, DEAD_LETTER_PREFIX, Item, PARTITION_KEY, Reader};
use crate::store::DynamoStore;

pub(crate) const ID: &str = "id";
const ORIGIN: &str = "origin";
const DESTINATION: &str = "destination";
const KEY: &str = "key";
const PAYLOAD: &str = "payload";
const HEADERS: &str = "headers";
const ATTEMPTS: &str = "attempts";
const LAST_ERROR: &str = "last_error";
const FIRST_SEEN_AT: &str = "first_seen_at";
const DEAD_AT: &str = "dead_at";
pub(crate) const REDRIVEN_AT: &str = "redriven_at";
pub(crate) const ARCHIVED_AT: &str = "archived_at";

/// The counter items' attribute.
const NEXT: &str = "next";

impl DynamoStore {
    /// The next id of the counter item `counter`, by one atomic increment.
    pub(crate) async fn next_id(&self, counter: &str, what: &str) -> Result<i64, Error> {
        let updated = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(counter)))
            .update_expression("ADD #next :one")
            .expression_attribute_names("#next", NEXT)
            .expression_attribute_values(":one", item::number(1))
            .return_values(ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(|e| map_error(what, true, e))?;
        let attributes = updated.attributes.unwrap_or_default();
        Reader::new(&attributes)
            .number(NEXT)
            .map_err(|why| corrupt(counter, &why))
    }

    /// Every dead letter, by id.
    async fn all_dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = Vec::new();
        for found in self.scan_prefix(DEAD_LETTER_PREFIX).await? {
            letters.push(letter(&found)?);
        }
        letters.sort_by_key(|l| l.id);
        Ok(letters)
    }
}

impl DeadLetterStore for DynamoStore {
    async fn record_dead_letter(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        let what = format!("recording a dead letter for key {}", letter.key);
        let id = self.next_id(item::DEAD_LETTER_COUNTER, &what).await?;
        let now = DynamoStore::now(self);
        let headers = serde_json::to_string(&letter.headers).expect("a string map serializes");
        let mut stored = item::key_of(item::dead_letter_pk(id));
        stored.extend([
            (ID.to_owned(), item::number(id)),
            (ORIGIN.to_owned(), item::text(&letter.origin)),
            (DESTINATION.to_owned(), item::text(&letter.destination)),
            (KEY.to_owned(), item::text(letter.key.as_str())),
            (HEADERS.to_owned(), item::text(headers)),
            (
                ATTEMPTS.to_owned(),
                item::number(i64::from(letter.attempts)),
            ),
            (LAST_ERROR.to_owned(), item::text(&letter.last_error)),
            (
                FIRST_SEEN_AT.to_owned(),
                item::number(letter.first_seen_at.0),
            ),
            (DEAD_AT.to_owned(), item::number(now.0)),
        ]);
        if !letter.payload.is_empty() {
            stored.insert(PAYLOAD.to_owned(), item::bytes(letter.payload.clone()));
        }
        let bytes = item::item_size(&stored);
        if bytes > crate::error::MAX_ITEM_BYTES {
            return Err(crate::error::item_too_large(
                &format!("the dead letter for key {}", letter.key),
                bytes,
                false,
            ));
        }
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(stored))
            .send()
            .await
            .map_err(|e| map_error(&what, true, e))?;
        Ok(id)
    }

    async fn list_dead_letters(
        &self,
        limit: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        Ok(self
            .all_dead_letters()
            .await?
            .into_iter()
            .filter(|l| include_redriven || l.is_waiting())
            .take(limit)
            .collect())
    }

    async fn get_dead_letter(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        let found = self
            .client()
            .get_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(item::dead_letter_pk(id))))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_error(&format!("reading dead letter {id}"), false, e))?;
        found.item.map(|found| letter(&found)).transpose()
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        let marked = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(item::dead_letter_pk(id))))
            .update_expression("SET #redriven = :now")
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#redriven", REDRIVEN_AT)
            .expression_attribute_names("#pk", PARTITION_KEY)
            .expression_attribute_values(":now", item::number(DynamoStore::now(self).0))
            .send()
            .await;
        match marked {
            Ok(_) => Ok(()),
            Err(error) if is_condition_failure(&error) => Err(no_such_dead_letter(id)),
            Err(error) => Err(map_error(
                &format!("marking dead letter {id} redriven"),
                true,
                error,
            )),
        }
    }

    async fn dead_letter_stats(&self) -> Result<DeadLetterStats, Error> {
        let mut stats = DeadLetterStats::default();
        for letter in self.all_dead_letters().await? {
            if letter.archived_at.is_some() {
                stats.archived += 1;
            } else if letter.redriven_at.is_some() {
                stats.redriven += 1;
            } else {
                stats.waiting += 1;
                stats.oldest_waiting = Some(
                    stats
                        .oldest_waiting
                        .map_or(letter.dead_at, |t| t.min(letter.dead_at)),
                );
            }
        }
        Ok(stats)
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit: usize) -> Result<u64, Error> {
        let before = DynamoStore::now(self).minus(retention);
        let mut deleted = 0;
        for letter in self.all_dead_letters().await? {
            if deleted >= limit as u64 {
                break;
            }
            if letter.dead_at >= before {
                continue;
            }
            self.client()
                .delete_item()
                .table_name(self.table())
                .set_key(Some(item::key_of(item::dead_letter_pk(letter.id))))
                .send()
                .await
                .map_err(|e| map_error(&format!("sweeping dead letter {}", letter.id), true, e))?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

/// The dead letter in `found`.
pub(crate) fn letter(found: &Item) -> Result<DeadLetter, Error> {
    let pk = match found.get(PARTITION_KEY) {
        Some(AttributeValue::S(pk)) => pk.as_str(),
        _ => "(no partition key)",
    };
    let read = Reader::new(found);
    read_letter(&read).map_err(|why| corrupt(pk, &why))
}

fn read_letter(read: &Reader<'_>) -> Result<DeadLetter, String> {
    Ok(DeadLetter {
        id: read.number(ID)?,
        origin: read.text(ORIGIN)?.to_owned(),
        destination: read.text(DESTINATION)?.to_owned(),
        key: IdempotencyKey::new(read.text(KEY)?).map_err(|e| e.to_string())?,
        payload: read.bytes(PAYLOAD)?.to_vec(),
        headers: serde_json::from_str(read.text(HEADERS)?)
            .map_err(|e| format!("headers are not a JSON string map: {e}"))?,
        attempts: u32::try_from(read.number(ATTEMPTS)?).unwrap_or(u32::MAX),
        last_error: read.text(LAST_ERROR)?.to_owned(),
        first_seen_at: Timestamp(read.number(FIRST_SEEN_AT)?),
        dead_at: Timestamp(read.number(DEAD_AT)?),
        redriven_at: read.number_or_none(REDRIVEN_AT)?.map(Timestamp),
        archived_at: read.number_or_none(ARCHIVED_AT)?.map(Timestamp),
    })
}

fn corrupt(pk: &str, what: &str) -> Error {
    StoreError::new(
        ErrorKind::Corrupt,
        format!(
            "the DynamoDB item {pk:?} is not one Idem wrote ({what}); delete it, or give Idem a table no other program writes to"
        ),
    )
    .into()
}
