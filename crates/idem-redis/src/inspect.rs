//! Inspection and retention for operators and the `idem` command:
//! [`RecordStore`] by scanning the store's key prefix on every primary.
//!
//! Redis expires each record by itself at the end of its window (the claim
//! sets `PEXPIRE`), so the sweeps find little to do: they delete records
//! that are past retention by the application's clock but not yet by the
//! server's, one atomic check-and-delete each. Listing reads every record
//! under the prefix; counting, sweeping and the gauges read only each
//! record's window (two fields), but still visit every record: they are for
//! operators and the sweeper, not for the request path.

use std::collections::HashMap;

use futures::future::join_all;
use idem_core::{
    Error, IdempotencyKey, Record, RecordCount, RecordFilter, RecordGlance, RecordStore, Scope,
    Settings, Timestamp,
};

use crate::error::map_error;
use crate::store::RedisStore;
use crate::{names, record, scripts};

/// How many records are read at once while listing.
const READ_AHEAD: usize = 64;

impl RecordStore for RedisStore {
    fn now(&self) -> Timestamp {
        self.clock().now()
    }

    fn settings(&self) -> &Settings {
        RedisStore::settings(self)
    }

    /// Redis has no schema: this only checks that the server answers.
    async fn migrate(&self) -> Result<(), Error> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.connection())
            .await
            .map_err(|e| map_error("checking the Redis server", false, e))?;
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        let name = names::record(self.prefix(), scope, key);
        self.read(&name).await
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        let mut records: Vec<Record> = self
            .all()
            .await?
            .into_iter()
            .filter(|r| filter.admits(r))
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
        let now = self.clock().now();
        let windows = self.windows().await?;
        Ok(RecordCount {
            total: windows.len() as u64,
            expired: windows.iter().filter(|w| w.expires_at <= now).count() as u64,
        })
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        // With tombstones kept, a record stays past its window for the
        // grace period (it is its own tombstone).
        let now = Timestamp(self.clock().now().0.saturating_sub(
            self.settings().tombstones.map_or(0, |grace| {
                i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)
            }),
        ));
        let mut expired: Vec<Window> = self
            .windows()
            .await?
            .into_iter()
            .filter(|w| w.expires_at <= now)
            .collect();
        expired.sort_by_key(|w| w.expires_at);
        let mut deleted = 0;
        for Window { name, .. } in expired.into_iter().take(limit) {
            let gone: u64 = scripts::sweep_invocation(&name, now)
                .invoke_async(&mut self.connection())
                .await
                .map_err(|e| map_error(&format!("sweeping {name}"), true, e))?;
            deleted += gone;
        }
        Ok(deleted)
    }

    async fn glance(&self) -> Result<RecordGlance, Error> {
        let now = self.clock().now();
        let windows = self.windows().await?;
        Ok(RecordGlance {
            records: windows.len() as u64,
            oldest_age: windows
                .iter()
                .min_by_key(|w| w.expires_at)
                .map(|w| w.created_at.until(now)),
        })
    }
}

/// A record's window, as counting and sweeping need it.
struct Window {
    name: String,
    created_at: Timestamp,
    expires_at: Timestamp,
}

impl RedisStore {
    /// The record in the hash `name`, if there is one.
    async fn read(&self, name: &str) -> Result<Option<Record>, Error> {
        let fields: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
            .arg(name)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&format!("reading {name}"), false, e))?;
        record::from_hash(name, &fields)
    }

    /// The names of every record under the store's prefix.
    async fn names(&self) -> Result<Vec<String>, Error> {
        self.connection()
            .scan_hashes(&names::records_pattern(self.prefix()))
            .await
            .map_err(|e| map_error("listing the records", false, e))
    }

    /// The window of every record under the store's prefix (a record gone
    /// since the scan is left out).
    async fn windows(&self) -> Result<Vec<Window>, Error> {
        let names = self.names().await?;
        let mut windows = Vec::with_capacity(names.len());
        for chunk in names.chunks(READ_AHEAD) {
            let reads = chunk.iter().map(|name| async move {
                let fields: (Option<i64>, Option<i64>) = redis::cmd("HMGET")
                    .arg(name)
                    .arg("created")
                    .arg("expires")
                    .query_async(&mut self.connection())
                    .await
                    .map_err(|e| map_error(&format!("reading {name}"), false, e))?;
                Ok::<_, Error>(match fields {
                    (Some(created), Some(expires)) => Some(Window {
                        name: name.clone(),
                        created_at: Timestamp(created),
                        expires_at: Timestamp(expires),
                    }),
                    _ => None,
                })
            });
            for window in join_all(reads).await {
                windows.extend(window?);
            }
        }
        Ok(windows)
    }

    /// Every record under the store's prefix.
    async fn all(&self) -> Result<Vec<Record>, Error> {
        let names = self.names().await?;
        let mut records = Vec::with_capacity(names.len());
        for chunk in names.chunks(READ_AHEAD) {
            for found in join_all(chunk.iter().map(|name| self.read(name))).await {
                records.extend(found?);
            }
        }
        Ok(records)
    }
}
