//! Inspection and retention for operators and the `idem` command:
//! [`RecordStore`] and [`RecordScan`] by scanning the table's records.
//!
//! DynamoDB deletes each record by itself some time after its `ttl` (the end
//! of its window plus the tombstone grace period), often days later. Until
//! then the item is still there, and every read that answers for the
//! protocol treats it as absent: [`get`](RecordStore::get) and listings
//! leave it out, and a claim opens a new window over it. Counting and the
//! sweeps see it, so an operator can tell how much DynamoDB has yet to
//! delete; a sweep deletes it at once (on the condition that it is still
//! past its window, so a key claimed anew meanwhile is kept).
//!
//! Listing, counting and sweeping scan the table: they are for operators
//! and the sweeper, not for the request path.

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{
    Error, ExpiryPosition, IdempotencyKey, Record, RecordCount, RecordFilter, RecordGlance,
    RecordScan, RecordStore, Scope, Settings, Timestamp,
};

use crate::error::{is_condition_failure, map_error};
use crate::item::{self, Item, PARTITION_KEY, RECORD_PREFIX};
use crate::record::{self, gone_at};
use crate::store::DynamoStore;

impl RecordStore for DynamoStore {
    fn now(&self) -> Timestamp {
        DynamoStore::now(self)
    }

    fn settings(&self) -> &Settings {
        DynamoStore::settings(self)
    }

    /// Creates the table when it is missing (unless the store was opened
    /// without creating tables) and checks its shape: what opening the
    /// store did already, done again.
    async fn migrate(&self) -> Result<(), Error> {
        crate::table::open(
            self.client(),
            self.table(),
            self.shown(),
            self.creates_table(),
        )
        .await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        let now = DynamoStore::now(self);
        Ok(self
            .read_stored(scope, key)
            .await?
            .map(|stored| stored.record)
            .filter(|record| !self.is_gone(record, now)))
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        let now = DynamoStore::now(self);
        let mut records: Vec<Record> = self
            .records()
            .await?
            .into_iter()
            .filter(|r| !self.is_gone(r, now) && filter.admits(r))
            .collect();
        records.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.scope.as_str().cmp(b.scope.as_str()))
                .then_with(|| a.key.as_str().cmp(b.key.as_str()))
        });
        if let Some(limit) = filter.limit {
            records.truncate(limit);
        }
        Ok(records)
    }

    async fn count(&self) -> Result<RecordCount, Error> {
        let now = DynamoStore::now(self);
        let records = self.records().await?;
        Ok(RecordCount {
            total: records.len() as u64,
            expired: records.iter().filter(|r| r.expires_at <= now).count() as u64,
        })
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        // With tombstones kept, a record stays past its window for the
        // grace period (it is its own tombstone).
        let cutoff = self.sweep_cutoff();
        let mut expired: Vec<Record> = self
            .records()
            .await?
            .into_iter()
            .filter(|r| r.expires_at <= cutoff)
            .collect();
        expired.sort_by_key(|r| r.expires_at);
        let mut deleted = 0;
        for record in expired.into_iter().take(limit) {
            let pk = item::record_pk(&record.scope, &record.key);
            let gone = self
                .client()
                .delete_item()
                .table_name(self.table())
                .set_key(Some(item::key_of(pk)))
                .condition_expression("#expires <= :cutoff")
                .expression_attribute_names("#expires", record::EXPIRES)
                .expression_attribute_values(":cutoff", item::number(cutoff.0))
                .send()
                .await;
            match gone {
                Ok(_) => deleted += 1,
                Err(error) if is_condition_failure(&error) => {}
                Err(error) => {
                    return Err(map_error(
                        &format!("sweeping the record of {}/{}", record.scope, record.key),
                        true,
                        error,
                    ));
                }
            }
        }
        Ok(deleted)
    }

    async fn glance(&self) -> Result<RecordGlance, Error> {
        let now = DynamoStore::now(self);
        let records = self.records().await?;
        Ok(RecordGlance {
            records: records.len() as u64,
            oldest_age: records
                .iter()
                .min_by_key(|r| r.expires_at)
                .map(|r| r.created_at.until(now)),
        })
    }
}

impl RecordScan for DynamoStore {
    async fn records_of(&self, keys: &[(Scope, IdempotencyKey)]) -> Result<Vec<Record>, Error> {
        let mut found = Vec::new();
        for (scope, key) in keys {
            found.extend(RecordStore::get(self, scope, key).await?);
        }
        Ok(found)
    }

    async fn records_by_expiry(
        &self,
        scopes: &[Scope],
        after: Option<&ExpiryPosition>,
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let now = DynamoStore::now(self);
        let order = |r: &Record| (r.expires_at, r.scope.clone(), r.key.clone());
        let mut records: Vec<Record> = self
            .records()
            .await?
            .into_iter()
            .filter(|r| !self.is_gone(r, now) && scopes.contains(&r.scope))
            .filter(|r| {
                after.is_none_or(|p| order(r) > (p.expires_at, p.scope.clone(), p.key.clone()))
            })
            .collect();
        records.sort_by_key(order);
        records.truncate(limit);
        Ok(records)
    }
}

impl DynamoStore {
    /// Whether `record` is past its window and its tombstone grace period
    /// by the store's clock: DynamoDB may delete it any time now, and until
    /// it does, reads treat it as absent.
    pub(crate) fn is_gone(&self, record: &Record, now: Timestamp) -> bool {
        gone_at(record.expires_at, self.settings().tombstones) <= now
    }

    /// The window end at or before which a sweep deletes a record.
    fn sweep_cutoff(&self) -> Timestamp {
        let now = DynamoStore::now(self);
        self.settings()
            .tombstones
            .map_or(now, |grace| now.minus(grace))
    }

    /// Every record in the table, by a scan of the records' prefix.
    pub(crate) async fn records(&self) -> Result<Vec<Record>, Error> {
        let mut records = Vec::new();
        for item in self.scan_prefix(RECORD_PREFIX).await? {
            let pk = match item.get(PARTITION_KEY) {
                Some(AttributeValue::S(pk)) => pk.clone(),
                _ => continue,
            };
            records.push(record::from_item(&pk, &item)?.record);
        }
        Ok(records)
    }

    /// Every item whose partition key starts with `prefix`, read strongly
    /// consistent, page after page.
    pub(crate) async fn scan_prefix(&self, prefix: &str) -> Result<Vec<Item>, Error> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client()
                .scan()
                .table_name(self.table())
                .consistent_read(true)
                .filter_expression("begins_with(#pk, :prefix)")
                .expression_attribute_names("#pk", PARTITION_KEY)
                .expression_attribute_values(":prefix", item::text(prefix))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| map_error("scanning the table", false, e))?;
            items.extend(page.items.unwrap_or_default());
            match page.last_evaluated_key {
                Some(last) if !last.is_empty() => start = Some(last),
                _ => return Ok(items),
            }
        }
    }
}
