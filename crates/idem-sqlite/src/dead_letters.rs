//! The `idem_dead_letters` table on SQLite: every statement on it, and
//! [`DeadLetterStore`] for [`SqliteStore`]. Its migration is in `schema`.
//!
//! Times are the store's clock, passed as parameters; the destination is the
//! URL text the broker gave, the headers JSON text.

use std::time::Duration;

use idem_core::{
    DeadLetter, DeadLetterStats, DeadLetterStore, Error, IdempotencyKey, NewDeadLetter, Timestamp,
    no_such_dead_letter,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::{corrupt, map_error};
use crate::headers;
use crate::store::SqliteStore;

const INSERT: &str = "INSERT INTO idem_dead_letters
    (origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id";
const LIST: &str = "SELECT id, origin, destination, key, payload, headers, attempts, last_error,
    first_seen_at, dead_at, redriven_at, archived_at
    FROM idem_dead_letters WHERE (?2 OR (redriven_at IS NULL AND archived_at IS NULL))
    ORDER BY id LIMIT ?1";
const GET: &str = "SELECT id, origin, destination, key, payload, headers, attempts, last_error,
    first_seen_at, dead_at, redriven_at, archived_at
    FROM idem_dead_letters WHERE id = ?1";
const MARK_REDRIVEN: &str = "UPDATE idem_dead_letters SET redriven_at = ?2 WHERE id = ?1";
const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE redriven_at IS NULL AND archived_at IS NULL),
    COUNT(*) FILTER (WHERE redriven_at IS NOT NULL AND archived_at IS NULL),
    MIN(dead_at) FILTER (WHERE redriven_at IS NULL AND archived_at IS NULL),
    COUNT(*) FILTER (WHERE archived_at IS NOT NULL)
    FROM idem_dead_letters";
const SWEEP: &str = "DELETE FROM idem_dead_letters WHERE id IN
    (SELECT id FROM idem_dead_letters WHERE dead_at < ?1 ORDER BY dead_at LIMIT ?2)";

/// A row as read, before its values are checked.
struct Raw {
    id: i64,
    origin: String,
    destination: String,
    key: String,
    payload: Vec<u8>,
    headers: String,
    attempts: i64,
    last_error: String,
    first_seen_at: i64,
    dead_at: i64,
    redriven_at: Option<i64>,
    archived_at: Option<i64>,
}

impl Raw {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            origin: row.get(1)?,
            destination: row.get(2)?,
            key: row.get(3)?,
            payload: row.get(4)?,
            headers: row.get(5)?,
            attempts: row.get(6)?,
            last_error: row.get(7)?,
            first_seen_at: row.get(8)?,
            dead_at: row.get(9)?,
            redriven_at: row.get(10)?,
            archived_at: row.get(11)?,
        })
    }

    fn check(self) -> Result<DeadLetter, Error> {
        let id = self.id;
        let bad = |why: String| corrupt(format!("dead letter {id} {why}"));
        Ok(DeadLetter {
            id,
            origin: self.origin,
            destination: self.destination,
            key: IdempotencyKey::new(self.key)
                .map_err(|e| bad(format!("has an invalid key: {e}")))?,
            payload: self.payload,
            headers: headers::from_json(&self.headers)?,
            attempts: u32::try_from(self.attempts)
                .map_err(|_| bad(format!("has attempts out of range: {}", self.attempts)))?,
            last_error: self.last_error,
            first_seen_at: Timestamp(self.first_seen_at),
            dead_at: Timestamp(self.dead_at),
            redriven_at: self.redriven_at.map(Timestamp),
            archived_at: self.archived_at.map(Timestamp),
        })
    }
}

/// Inserts a dead letter on an open connection, inside whatever transaction
/// it is in (the relay's burial moves an outbox row here in one transaction).
pub(crate) fn insert(
    conn: &Connection,
    letter: &NewDeadLetter,
    now: Timestamp,
) -> Result<i64, Error> {
    conn.prepare_cached(INSERT)
        .and_then(|mut statement| {
            statement.query_row(
                params![
                    letter.origin,
                    letter.destination,
                    letter.key.as_str(),
                    letter.payload,
                    headers::to_json(&letter.headers),
                    i64::from(letter.attempts),
                    letter.last_error,
                    letter.first_seen_at.0,
                    now.0,
                ],
                |row| row.get(0),
            )
        })
        .map_err(|e| map_error("record a dead letter", e))
}

/// Dead letter `id` on an open connection, inside whatever transaction it
/// is in.
pub(crate) fn select(conn: &Connection, id: i64) -> Result<Option<DeadLetter>, Error> {
    conn.prepare_cached(GET)
        .and_then(|mut statement| statement.query_row([id], Raw::read).optional())
        .map_err(|e| map_error("read a dead letter", e))?
        .map(Raw::check)
        .transpose()
}

fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl DeadLetterStore for SqliteStore {
    async fn record_dead_letter(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        let letter = letter.clone();
        let now = self.clock().now();
        self.with_connection(move |conn| insert(conn, &letter, now))
            .await?
    }

    async fn list_dead_letters(
        &self,
        limit_to: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        self.with_connection(move |conn| {
            let mut statement = conn
                .prepare_cached(LIST)
                .map_err(|e| map_error("list dead letters", e))?;
            let rows = statement
                .query_map(params![limit(limit_to), include_redriven], Raw::read)
                .map_err(|e| map_error("list dead letters", e))?;
            rows.map(|row| row.map_err(|e| map_error("read a dead letter", e))?.check())
                .collect()
        })
        .await?
    }

    async fn get_dead_letter(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        self.with_connection(move |conn| select(conn, id)).await?
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        let now = self.clock().now();
        let changed = self
            .with_connection(move |conn| {
                conn.execute(MARK_REDRIVEN, params![id, now.0])
                    .map_err(|e| map_error("mark a dead letter redriven", e))
            })
            .await??;
        if changed == 0 {
            return Err(no_such_dead_letter(id));
        }
        Ok(())
    }

    async fn dead_letter_stats(&self) -> Result<DeadLetterStats, Error> {
        self.with_connection(|conn| {
            conn.query_row(STATS, [], |row| {
                Ok(DeadLetterStats {
                    waiting: row.get::<_, i64>(0)?.unsigned_abs(),
                    redriven: row.get::<_, i64>(1)?.unsigned_abs(),
                    oldest_waiting: row.get::<_, Option<i64>>(2)?.map(Timestamp),
                    archived: row.get::<_, i64>(3)?.unsigned_abs(),
                })
            })
            .map_err(|e| map_error("count dead letters", e))
        })
        .await?
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit_to: usize) -> Result<u64, Error> {
        let before = self.clock().now().minus(retention).0;
        self.with_connection(move |conn| {
            conn.execute(SWEEP, params![before, limit(limit_to)])
                .map(|n| n as u64)
                .map_err(|e| map_error("sweep dead letters", e))
        })
        .await?
    }
}
