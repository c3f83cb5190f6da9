//! The `idem_dead_letters` table on PostgreSQL: every statement on it, and
//! [`DeadLetterStore`] for [`PgStore`]. Its migration is
//! `migrations/0005_idem_dead_letters.sql`.
//!
//! Times are the store's clock, passed as parameters; the destination is the
//! URL text the broker gave, the headers JSON text.

use std::time::Duration;

use idem_core::{
    DeadLetter, DeadLetterStats, DeadLetterStore, Error, IdempotencyKey, NewDeadLetter, Timestamp,
    no_such_dead_letter,
};
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};

use crate::error::BadRow;
use crate::headers;
use crate::store::PgStore;

/// One letter, for the operators' changes that read it first.
pub(crate) const GET_FOR_UPDATE: &str = "SELECT id, origin, destination, key, payload, headers,
    attempts, last_error, first_seen_at, dead_at, redriven_at, archived_at
    FROM idem_dead_letters WHERE id = $1 FOR UPDATE";
const INSERT: &str = "INSERT INTO idem_dead_letters
    (origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";
const LIST: &str = "SELECT id, origin, destination, key, payload, headers, attempts, last_error,
    first_seen_at, dead_at, redriven_at, archived_at
    FROM idem_dead_letters WHERE ($2 OR (redriven_at IS NULL AND archived_at IS NULL))
    ORDER BY id LIMIT $1";
const GET: &str = "SELECT id, origin, destination, key, payload, headers, attempts, last_error,
    first_seen_at, dead_at, redriven_at, archived_at
    FROM idem_dead_letters WHERE id = $1";
const MARK_REDRIVEN: &str = "UPDATE idem_dead_letters SET redriven_at = $2 WHERE id = $1";
const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE redriven_at IS NULL AND archived_at IS NULL),
    COUNT(*) FILTER (WHERE redriven_at IS NOT NULL AND archived_at IS NULL),
    MIN(dead_at) FILTER (WHERE redriven_at IS NULL AND archived_at IS NULL),
    COUNT(*) FILTER (WHERE archived_at IS NOT NULL)
    FROM idem_dead_letters";
const SWEEP: &str = "DELETE FROM idem_dead_letters WHERE id IN
    (SELECT id FROM idem_dead_letters WHERE dead_at < $1 ORDER BY dead_at LIMIT $2)";

/// A row read back and checked.
pub(crate) fn letter(row: &PgRow) -> sqlx::Result<DeadLetter> {
    let id: i64 = row.try_get(0)?;
    let bad = |why: String| BadRow::into_sqlx(format!("dead letter {id} {why}"));
    let attempts: i32 = row.try_get(6)?;
    Ok(DeadLetter {
        id,
        origin: row.try_get(1)?,
        destination: row.try_get(2)?,
        key: IdempotencyKey::new(row.try_get::<String, _>(3)?)
            .map_err(|e| bad(format!("has an invalid key: {e}")))?,
        payload: row.try_get(4)?,
        headers: headers::from_json(row.try_get::<&str, _>(5)?)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| bad(format!("has attempts out of range: {attempts}")))?,
        last_error: row.try_get(7)?,
        first_seen_at: Timestamp(row.try_get(8)?),
        dead_at: Timestamp(row.try_get(9)?),
        redriven_at: row.try_get::<Option<i64>, _>(10)?.map(Timestamp),
        archived_at: row.try_get::<Option<i64>, _>(11)?.map(Timestamp),
    })
}

/// Inserts a dead letter on an open connection, inside whatever transaction
/// it is in (the relay's burial moves an outbox row here in one transaction).
pub(crate) async fn insert(
    conn: &mut PgConnection,
    letter: &NewDeadLetter,
    now: Timestamp,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(INSERT)
        .bind(&letter.origin)
        .bind(&letter.destination)
        .bind(letter.key.as_str())
        .bind(&letter.payload)
        .bind(headers::to_json(&letter.headers))
        .bind(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
        .bind(&letter.last_error)
        .bind(letter.first_seen_at.0)
        .bind(now.0)
        .fetch_one(conn)
        .await
}

fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl DeadLetterStore for PgStore {
    async fn record_dead_letter(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        crate::pooler::one_shot!(self, |conn| insert(conn, letter, self.clock().now())
            .await
            .map_err(|e| self.fail(e)))
    }

    async fn list_dead_letters(
        &self,
        limit_to: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(LIST)
            .bind(limit(limit_to))
            .bind(include_redriven)
            .fetch_all(conn)
            .await
            .and_then(|rows| rows.iter().map(letter).collect())
            .map_err(|e| self.fail(e)))
    }

    async fn get_dead_letter(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(GET)
            .bind(id)
            .fetch_optional(conn)
            .await
            .and_then(|row| row.as_ref().map(letter).transpose())
            .map_err(|e| self.fail(e)))
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        let changed = crate::pooler::one_shot!(self, |conn| sqlx::query(MARK_REDRIVEN)
            .bind(id)
            .bind(self.clock().now().0)
            .execute(conn)
            .await
            .map_err(|e| self.fail(e)))?
        .rows_affected();
        if changed == 0 {
            return Err(no_such_dead_letter(id));
        }
        Ok(())
    }

    async fn dead_letter_stats(&self) -> Result<DeadLetterStats, Error> {
        let (waiting, redriven, oldest, archived): (i64, i64, Option<i64>, i64) =
            crate::pooler::one_shot!(self, |conn| sqlx::query_as(STATS)
                .fetch_one(conn)
                .await
                .map_err(|e| self.fail(e)))?;
        Ok(DeadLetterStats {
            waiting: waiting.unsigned_abs(),
            redriven: redriven.unsigned_abs(),
            oldest_waiting: oldest.map(Timestamp),
            archived: archived.unsigned_abs(),
        })
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit_to: usize) -> Result<u64, Error> {
        let before = self.clock().now().minus(retention).0;
        crate::pooler::one_shot!(self, |conn| sqlx::query(SWEEP)
            .bind(before)
            .bind(limit(limit_to))
            .execute(conn)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| self.fail(e)))
    }
}
