//! Failed attempts per message, counted in the store: how a poison message is
//! recognised where the broker keeps no delivery count (RabbitMQ classic
//! queues), and where the first failure's time is kept for the dead letter.
//!
//! Why a table of its own: an effect's failure rolls its transaction back, so
//! nothing about it can be written there; the count is written after, in its
//! own short transaction. Only failures write, so the fast path of a healthy
//! consumer never touches this table. A row is deleted when its message is
//! dead-lettered, so a redriven message starts again from zero, and rows older
//! than the dedupe window are swept like records.
//!
//! Where the broker counts deliveries (NATS JetStream, RabbitMQ quorum
//! queues), the runtime takes the larger of the two counts: the broker's also
//! sees deliveries whose consumer died before it could count anything.

use std::future::Future;

use idem::sqlite::rusqlite;
use idem::{AnyStore, PgStore, SqliteStore};
use idem_core::{Error, ErrorKind, IdempotencyKey, Scope, StoreError, Timestamp};

use crate::dead_letter::DeadLetters;

/// The count after a failure was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    /// Failed attempts so far, this one included.
    pub count: u32,
    /// When the first of them was recorded.
    pub first_at: Timestamp,
}

/// Counts failed attempts per `(scope, key)`.
pub trait Attempts: Send + Sync {
    /// Creates the table if it is missing. Safe to run from many consumers.
    fn prepare_attempts(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Records one more failure of `(scope, key)` with its error text.
    fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> impl Future<Output = Result<Failures, Error>> + Send;

    /// Forgets the failures of `(scope, key)` (after it was dead-lettered).
    fn forget_failures(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes at most `limit` rows last written before `before`; returns how many.
    fn sweep_failures(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Now, by the store's clock.
    fn now(&self) -> Timestamp;
}

/// What the consumer runtime needs of a store besides the effect's own
/// transaction: dead letters and failure counts.
pub trait ConsumerStore: DeadLetters + Attempts + Clone + Send + Sync + 'static {}

impl<S> ConsumerStore for S where S: DeadLetters + Attempts + Clone + Send + Sync + 'static {}

const CREATE_SQLITE: &str = "CREATE TABLE IF NOT EXISTS idem_consumer_attempts (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    first_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    PRIMARY KEY (scope, key)
)";
const CREATE_PG: &str = "CREATE TABLE IF NOT EXISTS idem_consumer_attempts (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    first_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_error TEXT NOT NULL,
    PRIMARY KEY (scope, key)
)";
/// The advisory lock taken while creating the table ("idem_att" in ASCII).
const CREATE_LOCK: i64 = 0x6964_656d_5f61_7474;
/// `$1` scope, `$2` key, `$3` now, `$4` error (both dialects accept `$n`).
const RECORD: &str =
    "INSERT INTO idem_consumer_attempts (scope, key, attempts, first_at, updated_at, last_error)
    VALUES ($1, $2, 1, $3, $3, $4)
    ON CONFLICT (scope, key) DO UPDATE
    SET attempts = idem_consumer_attempts.attempts + 1, updated_at = $3, last_error = $4
    RETURNING attempts, first_at";
const FORGET: &str = "DELETE FROM idem_consumer_attempts WHERE scope = $1 AND key = $2";
const SWEEP_SQLITE: &str = "DELETE FROM idem_consumer_attempts WHERE rowid IN
    (SELECT rowid FROM idem_consumer_attempts WHERE updated_at < $1 LIMIT $2)";
const SWEEP_PG: &str = "DELETE FROM idem_consumer_attempts WHERE ctid IN
    (SELECT ctid FROM idem_consumer_attempts WHERE updated_at < $1 LIMIT $2)";

/// The one mapping of this module's driver errors.
fn sqlite_error(what: &str, error: rusqlite::Error) -> Error {
    let kind = match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            ErrorKind::Busy
        }
        _ => ErrorKind::Other,
    };
    Error::Store(StoreError::with_source(
        kind,
        format!("consumer attempts: {what}"),
        error,
    ))
}

fn pg_error(what: &str, error: sqlx::Error) -> Error {
    let kind = match &error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            ErrorKind::Unavailable
        }
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")) => {
            ErrorKind::SerializationFailure
        }
        _ => ErrorKind::Other,
    };
    Error::Store(StoreError::with_source(
        kind,
        format!("consumer attempts: {what}"),
        error,
    ))
}

fn count(attempts: i64) -> u32 {
    u32::try_from(attempts).unwrap_or(u32::MAX)
}

impl Attempts for SqliteStore {
    async fn prepare_attempts(&self) -> Result<(), Error> {
        self.with_connection(|c| c.execute_batch(CREATE_SQLITE))
            .await?
            .map_err(|e| sqlite_error("create the table", e))
    }

    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        let (scope, key, error) = (scope.to_string(), key.to_string(), error.to_owned());
        let now = self.clock().now();
        self.with_connection(move |c| {
            c.query_row(RECORD, rusqlite::params![scope, key, now.0, error], |row| {
                Ok(Failures {
                    count: count(row.get(0)?),
                    first_at: Timestamp(row.get(1)?),
                })
            })
        })
        .await?
        .map_err(|e| sqlite_error("record a failure", e))
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        let (scope, key) = (scope.to_string(), key.to_string());
        self.with_connection(move |c| c.execute(FORGET, rusqlite::params![scope, key]))
            .await?
            .map(drop)
            .map_err(|e| sqlite_error("forget failures", e))
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_connection(move |c| c.execute(SWEEP_SQLITE, rusqlite::params![before.0, limit]))
            .await?
            .map(|n| n as u64)
            .map_err(|e| sqlite_error("sweep", e))
    }

    fn now(&self) -> Timestamp {
        self.clock().now()
    }
}

impl Attempts for PgStore {
    async fn prepare_attempts(&self) -> Result<(), Error> {
        // Concurrent `CREATE TABLE IF NOT EXISTS` can still collide in the
        // catalog; a transaction-scoped advisory lock serialises consumers.
        let fail = |e| pg_error("create the table", e);
        let mut tx = self.begin_transaction().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(CREATE_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::raw_sql(CREATE_PG)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        tx.commit().await.map_err(fail)
    }

    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        let (attempts, first_at): (i32, i64) = sqlx::query_as(RECORD)
            .bind(scope.as_str())
            .bind(key.as_str())
            .bind(self.clock().now().0)
            .bind(error)
            .fetch_one(self.pool())
            .await
            .map_err(|e| pg_error("record a failure", e))?;
        Ok(Failures {
            count: count(attempts.into()),
            first_at: Timestamp(first_at),
        })
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        sqlx::query(FORGET)
            .bind(scope.as_str())
            .bind(key.as_str())
            .execute(self.pool())
            .await
            .map(drop)
            .map_err(|e| pg_error("forget failures", e))
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        sqlx::query(SWEEP_PG)
            .bind(before.0)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(self.pool())
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| pg_error("sweep", e))
    }

    fn now(&self) -> Timestamp {
        self.clock().now()
    }
}

fn unsupported() -> Error {
    Error::Store(StoreError::new(
        ErrorKind::Config,
        "this store kind has no consumer attempts table",
    ))
}

impl Attempts for AnyStore {
    async fn prepare_attempts(&self) -> Result<(), Error> {
        match self {
            AnyStore::Sqlite(s) => s.prepare_attempts().await,
            AnyStore::Postgres(s) => s.prepare_attempts().await,
            #[allow(unreachable_patterns)]
            _ => Err(unsupported()),
        }
    }

    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        match self {
            AnyStore::Sqlite(s) => s.record_failure(scope, key, error).await,
            AnyStore::Postgres(s) => s.record_failure(scope, key, error).await,
            #[allow(unreachable_patterns)]
            _ => Err(unsupported()),
        }
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        match self {
            AnyStore::Sqlite(s) => s.forget_failures(scope, key).await,
            AnyStore::Postgres(s) => s.forget_failures(scope, key).await,
            #[allow(unreachable_patterns)]
            _ => Err(unsupported()),
        }
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        match self {
            AnyStore::Sqlite(s) => s.sweep_failures(before, limit).await,
            AnyStore::Postgres(s) => s.sweep_failures(before, limit).await,
            #[allow(unreachable_patterns)]
            _ => Err(unsupported()),
        }
    }

    fn now(&self) -> Timestamp {
        match self {
            AnyStore::Sqlite(s) => s.clock().now(),
            AnyStore::Postgres(s) => s.clock().now(),
            #[allow(unreachable_patterns)]
            _ => idem_core::Clock::now(&idem_core::SystemClock),
        }
    }
}
