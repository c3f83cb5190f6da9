//! The `idem_consumer_attempts` table on PostgreSQL: every statement on it,
//! and [`AttemptStore`] for [`PgStore`]. Its migration is
//! `migrations/0006_idem_consumer_attempts.sql`.

use idem_core::{AttemptStore, Error, Failures, IdempotencyKey, Scope, Timestamp};

use crate::store::PgStore;

const RECORD: &str =
    "INSERT INTO idem_consumer_attempts (scope, key, attempts, first_at, updated_at, last_error)
    VALUES ($1, $2, 1, $3, $3, $4)
    ON CONFLICT (scope, key) DO UPDATE
    SET attempts = idem_consumer_attempts.attempts + 1, updated_at = $3, last_error = $4
    RETURNING attempts, first_at";
const FORGET: &str = "DELETE FROM idem_consumer_attempts WHERE scope = $1 AND key = $2";
const SWEEP: &str = "DELETE FROM idem_consumer_attempts WHERE ctid IN
    (SELECT ctid FROM idem_consumer_attempts WHERE updated_at < $1 LIMIT $2)";

impl AttemptStore for PgStore {
    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        let (attempts, first_at): (i32, i64) =
            crate::pooler::one_shot!(self, |conn| sqlx::query_as(RECORD)
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(self.clock().now().0)
                .bind(error)
                .fetch_one(conn)
                .await
                .map_err(|e| self.fail(e)))?;
        Ok(Failures {
            count: u32::try_from(attempts).unwrap_or(u32::MAX),
            first_at: Timestamp(first_at),
        })
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(FORGET)
            .bind(scope.as_str())
            .bind(key.as_str())
            .execute(conn)
            .await
            .map(drop)
            .map_err(|e| self.fail(e)))
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(SWEEP)
            .bind(before.0)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(conn)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| self.fail(e)))
    }

    fn now(&self) -> Timestamp {
        self.clock().now()
    }
}
