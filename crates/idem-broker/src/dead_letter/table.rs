//! The `idem_dead_letters` table: its migrations and every statement on it, on
//! SQLite and PostgreSQL, and the [`DeadLetters`] implementations of the stores.
//!
//! Times are the store's [`Clock`](idem_core::Clock), passed as parameters; the
//! destination is stored in its [`Display`](std::fmt::Display) form, the headers
//! as JSON text.

use std::time::Duration;

use idem::sqlite::rusqlite::{self, OptionalExtension, params};
use idem::{AnyStore, PgStore, SqliteStore};
use idem_core::{Error, ErrorKind, IdempotencyKey, StoreError, Timestamp};
use sqlx::{PgConnection, Row};

use super::{DeadLetter, DeadLetterStats, DeadLetterUpkeep, DeadLetters, NewDeadLetter};
use crate::db;
use crate::schema::{self, Component};

pub(crate) static COMPONENT: Component = Component {
    name: "dead_letters",
    sqlite: &[r#"
CREATE TABLE IF NOT EXISTS idem_dead_letters (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    origin        TEXT    NOT NULL,
    destination   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    payload       BLOB    NOT NULL,
    headers       TEXT    NOT NULL,
    attempts      INTEGER NOT NULL CHECK (attempts >= 0),
    last_error    TEXT    NOT NULL,
    first_seen_at INTEGER NOT NULL,
    dead_at       INTEGER NOT NULL,
    redriven_at   INTEGER
);
CREATE INDEX IF NOT EXISTS idem_dead_letters_dead_at ON idem_dead_letters (dead_at);
"#],
    postgres: &[r#"
CREATE TABLE IF NOT EXISTS idem_dead_letters (
    id            BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    origin        TEXT    NOT NULL,
    destination   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    payload       BYTEA   NOT NULL,
    headers       TEXT    NOT NULL,
    attempts      INTEGER NOT NULL CHECK (attempts >= 0),
    last_error    TEXT    NOT NULL,
    first_seen_at BIGINT  NOT NULL,
    dead_at       BIGINT  NOT NULL,
    redriven_at   BIGINT  NULL
);
CREATE INDEX IF NOT EXISTS idem_dead_letters_dead_at ON idem_dead_letters (dead_at);
"#],
};

const COLUMNS: &str = "id, origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at, redriven_at";

const INSERT_SQLITE: &str = "INSERT INTO idem_dead_letters
    (origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id";
const INSERT_POSTGRES: &str = "INSERT INTO idem_dead_letters
    (origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";

fn list_sql(placeholder_limit: &str, placeholder_all: &str) -> String {
    format!(
        "SELECT {COLUMNS} FROM idem_dead_letters WHERE ({placeholder_all} OR redriven_at IS NULL) ORDER BY id LIMIT {placeholder_limit}"
    )
}
fn get_sql(placeholder: &str) -> String {
    format!("SELECT {COLUMNS} FROM idem_dead_letters WHERE id = {placeholder}")
}
const MARK_SQLITE: &str = "UPDATE idem_dead_letters SET redriven_at = ?2 WHERE id = ?1";
const MARK_POSTGRES: &str = "UPDATE idem_dead_letters SET redriven_at = $2 WHERE id = $1";
const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE redriven_at IS NULL),
    COUNT(*) FILTER (WHERE redriven_at IS NOT NULL),
    MIN(dead_at) FILTER (WHERE redriven_at IS NULL)
    FROM idem_dead_letters";
const SWEEP_SQLITE: &str = "DELETE FROM idem_dead_letters WHERE id IN
    (SELECT id FROM idem_dead_letters WHERE dead_at < ?1 ORDER BY dead_at LIMIT ?2)";
const SWEEP_POSTGRES: &str = "DELETE FROM idem_dead_letters WHERE id IN
    (SELECT id FROM idem_dead_letters WHERE dead_at < $1 ORDER BY dead_at LIMIT $2)";

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
}

impl Raw {
    fn from_sqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
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
        })
    }

    fn from_postgres(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get(0)?,
            origin: row.try_get(1)?,
            destination: row.try_get(2)?,
            key: row.try_get(3)?,
            payload: row.try_get(4)?,
            headers: row.try_get(5)?,
            attempts: i64::from(row.try_get::<i32, _>(6)?),
            last_error: row.try_get(7)?,
            first_seen_at: row.try_get(8)?,
            dead_at: row.try_get(9)?,
            redriven_at: row.try_get(10)?,
        })
    }

    fn check(self) -> Result<DeadLetter, Error> {
        let id = self.id;
        let bad = |what: &str, why: String| db::corrupt(format!("dead letter {id}: {what} {why}"));
        Ok(DeadLetter {
            id,
            origin: self.origin,
            destination: self
                .destination
                .parse()
                .map_err(|e| bad("has a destination that does not parse:", format!("{e}")))?,
            key: IdempotencyKey::new(self.key)
                .map_err(|e| bad("has an invalid key:", e.to_string()))?,
            payload: self.payload,
            headers: db::parse_headers(&self.headers)?,
            attempts: u32::try_from(self.attempts)
                .map_err(|_| bad("has attempts out of range:", self.attempts.to_string()))?,
            last_error: self.last_error,
            first_seen_at: Timestamp(self.first_seen_at),
            dead_at: Timestamp(self.dead_at),
            redriven_at: self.redriven_at.map(Timestamp),
        })
    }
}

fn not_found(id: i64) -> Error {
    StoreError::new(
        ErrorKind::Other,
        format!("no dead letter with id {id}; `idem dlq ls` lists them"),
    )
    .into()
}

fn cutoff(now: Timestamp, retention: Duration) -> i64 {
    now.0
        .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX))
}

fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

// ---- statements usable inside another transaction (the relay's) ----

/// Inserts a dead letter on an open SQLite connection or transaction.
pub(crate) fn insert_sqlite(
    conn: &rusqlite::Connection,
    letter: &NewDeadLetter,
    now: Timestamp,
) -> Result<i64, Error> {
    conn.query_row(
        INSERT_SQLITE,
        params![
            letter.origin,
            letter.destination.to_string(),
            letter.key.as_str(),
            letter.payload,
            db::headers_json(&letter.headers),
            i64::from(letter.attempts),
            letter.last_error,
            letter.first_seen_at.0,
            now.0,
        ],
        |row| row.get(0),
    )
    .map_err(|e| db::sqlite("record a dead letter", e))
}

/// Inserts a dead letter on an open PostgreSQL connection or transaction.
pub(crate) async fn insert_postgres(
    conn: &mut PgConnection,
    letter: &NewDeadLetter,
    now: Timestamp,
) -> Result<i64, Error> {
    sqlx::query_scalar(INSERT_POSTGRES)
        .bind(&letter.origin)
        .bind(letter.destination.to_string())
        .bind(letter.key.as_str())
        .bind(&letter.payload)
        .bind(db::headers_json(&letter.headers))
        .bind(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
        .bind(&letter.last_error)
        .bind(letter.first_seen_at.0)
        .bind(now.0)
        .fetch_one(conn)
        .await
        .map_err(|e| db::postgres("record a dead letter", e))
}

// ---- SQLite ----

impl DeadLetters for SqliteStore {
    async fn record(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        let letter = letter.clone();
        let now = self.clock().now();
        self.with_connection(move |conn| insert_sqlite(conn, &letter, now))
            .await?
    }

    async fn list(
        &self,
        limit_to: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        self.with_connection(move |conn| {
            let mut statement = conn
                .prepare_cached(&list_sql("?1", "?2"))
                .map_err(|e| db::sqlite("list dead letters", e))?;
            let rows = statement
                .query_map(params![limit(limit_to), include_redriven], Raw::from_sqlite)
                .map_err(|e| db::sqlite("list dead letters", e))?;
            rows.map(|row| {
                row.map_err(|e| db::sqlite("read a dead letter", e))?
                    .check()
            })
            .collect()
        })
        .await?
    }

    async fn get(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        self.with_connection(move |conn| {
            conn.query_row(&get_sql("?1"), [id], Raw::from_sqlite)
                .optional()
                .map_err(|e| db::sqlite("read a dead letter", e))?
                .map(Raw::check)
                .transpose()
        })
        .await?
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        let now = self.clock().now();
        let changed = self
            .with_connection(move |conn| {
                conn.execute(MARK_SQLITE, params![id, now.0])
                    .map_err(|e| db::sqlite("mark a dead letter redriven", e))
            })
            .await??;
        if changed == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }
}

impl DeadLetterUpkeep for SqliteStore {
    async fn stats(&self) -> Result<DeadLetterStats, Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        self.with_connection(|conn| {
            conn.query_row(STATS, [], |row| {
                Ok(DeadLetterStats {
                    waiting: row.get::<_, i64>(0)?.unsigned_abs(),
                    redriven: row.get::<_, i64>(1)?.unsigned_abs(),
                    oldest_waiting: row.get::<_, Option<i64>>(2)?.map(Timestamp),
                })
            })
            .map_err(|e| db::sqlite("count dead letters", e))
        })
        .await?
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit_to: usize) -> Result<u64, Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        let before = cutoff(self.clock().now(), retention);
        self.with_connection(move |conn| {
            conn.execute(SWEEP_SQLITE, params![before, limit(limit_to)])
                .map(|n| n as u64)
                .map_err(|e| db::sqlite("sweep dead letters", e))
        })
        .await?
    }
}

// ---- PostgreSQL ----

impl DeadLetters for PgStore {
    async fn record(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        schema::ensure_postgres(self, &COMPONENT).await?;
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(|e| db::postgres("connect", e))?;
        insert_postgres(&mut conn, letter, self.clock().now()).await
    }

    async fn list(
        &self,
        limit_to: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        schema::ensure_postgres(self, &COMPONENT).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(list_sql("$1", "$2")))
            .bind(limit(limit_to))
            .bind(include_redriven)
            .fetch_all(self.pool())
            .await
            .map_err(|e| db::postgres("list dead letters", e))?;
        rows.iter()
            .map(|row| {
                Raw::from_postgres(row)
                    .map_err(|e| db::postgres("read a dead letter", e))?
                    .check()
            })
            .collect()
    }

    async fn get(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        schema::ensure_postgres(self, &COMPONENT).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(get_sql("$1")))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| db::postgres("read a dead letter", e))?;
        row.map(|row| {
            Raw::from_postgres(&row)
                .map_err(|e| db::postgres("read a dead letter", e))?
                .check()
        })
        .transpose()
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        schema::ensure_postgres(self, &COMPONENT).await?;
        let changed = sqlx::query(MARK_POSTGRES)
            .bind(id)
            .bind(self.clock().now().0)
            .execute(self.pool())
            .await
            .map_err(|e| db::postgres("mark a dead letter redriven", e))?
            .rows_affected();
        if changed == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }
}

impl DeadLetterUpkeep for PgStore {
    async fn stats(&self) -> Result<DeadLetterStats, Error> {
        schema::ensure_postgres(self, &COMPONENT).await?;
        let (waiting, redriven, oldest): (i64, i64, Option<i64>) = sqlx::query_as(STATS)
            .fetch_one(self.pool())
            .await
            .map_err(|e| db::postgres("count dead letters", e))?;
        Ok(DeadLetterStats {
            waiting: waiting.unsigned_abs(),
            redriven: redriven.unsigned_abs(),
            oldest_waiting: oldest.map(Timestamp),
        })
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit_to: usize) -> Result<u64, Error> {
        schema::ensure_postgres(self, &COMPONENT).await?;
        sqlx::query(SWEEP_POSTGRES)
            .bind(cutoff(self.clock().now(), retention))
            .bind(limit(limit_to))
            .execute(self.pool())
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| db::postgres("sweep dead letters", e))
    }
}

// ---- either ----

impl DeadLetters for AnyStore {
    async fn record(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        each_store!(self, s => s.record(letter).await)
    }

    async fn list(
        &self,
        limit_to: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        each_store!(self, s => DeadLetters::list(s, limit_to, include_redriven).await)
    }

    async fn get(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        each_store!(self, s => DeadLetters::get(s, id).await)
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        each_store!(self, s => s.mark_redriven(id).await)
    }
}

impl DeadLetterUpkeep for AnyStore {
    async fn stats(&self) -> Result<DeadLetterStats, Error> {
        each_store!(self, s => s.stats().await)
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit_to: usize) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_dead_letters(retention, limit_to).await)
    }
}
