//! The `idem_consumer_attempts` table on SQLite: every statement on it, and
//! [`AttemptStore`] for [`SqliteStore`]. Its migration is in `schema`.

use idem_core::{AttemptStore, Error, Failures, IdempotencyKey, Scope, Timestamp};
use rusqlite::params;

use crate::error::map_error;
use crate::store::SqliteStore;

const RECORD: &str =
    "INSERT INTO idem_consumer_attempts (scope, key, attempts, first_at, updated_at, last_error)
    VALUES (?1, ?2, 1, ?3, ?3, ?4)
    ON CONFLICT (scope, key) DO UPDATE
    SET attempts = idem_consumer_attempts.attempts + 1, updated_at = ?3, last_error = ?4
    RETURNING attempts, first_at";
const FORGET: &str = "DELETE FROM idem_consumer_attempts WHERE scope = ?1 AND key = ?2";
const SWEEP: &str = "DELETE FROM idem_consumer_attempts WHERE rowid IN
    (SELECT rowid FROM idem_consumer_attempts WHERE updated_at < ?1 LIMIT ?2)";

impl AttemptStore for SqliteStore {
    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        let (scope, key, error) = (scope.to_string(), key.to_string(), error.to_owned());
        let now = self.clock().now();
        self.with_connection(move |conn| {
            conn.query_row(RECORD, params![scope, key, now.0, error], |row| {
                Ok(Failures {
                    count: u32::try_from(row.get::<_, i64>(0)?).unwrap_or(u32::MAX),
                    first_at: Timestamp(row.get(1)?),
                })
            })
            .map_err(|e| map_error("record a consumer's failed attempt", e))
        })
        .await?
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        let (scope, key) = (scope.to_string(), key.to_string());
        self.with_connection(move |conn| {
            conn.execute(FORGET, params![scope, key])
                .map(drop)
                .map_err(|e| map_error("forget a consumer's failed attempts", e))
        })
        .await?
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_connection(move |conn| {
            conn.execute(SWEEP, params![before.0, limit])
                .map(|n| n as u64)
                .map_err(|e| map_error("sweep consumers' failed attempts", e))
        })
        .await?
    }

    fn now(&self) -> Timestamp {
        self.clock().now()
    }
}
