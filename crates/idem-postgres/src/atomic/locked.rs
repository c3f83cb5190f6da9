//! The two round trips that atomic apply adds around the effect: lock and read
//! before it, write and commit after it. Each is one simple query holding
//! several statements, which the extended protocol (one statement per round
//! trip in sqlx) cannot send together.
//!
//! Both run inside the sqlx [`Transaction`](sqlx::Transaction) of the apply,
//! so the effect gets a connection that sqlx knows is in a transaction (a
//! nested `begin()` is a savepoint), and sqlx rolls back whatever is left open
//! when the transaction is dropped, cancelled or not.

use idem_core::{IdempotencyKey, Record, Scope};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgRow, Postgres};
use sqlx::{AssertSqlSafe, Connection, Row, SqlSafeStr, Transaction};

use crate::{lock, records};

/// What [`lock_and_fetch`] found.
#[derive(Debug)]
pub(crate) struct Opened {
    /// Whether this transaction got the key's lock.
    pub(crate) granted: bool,
    /// The record, read after the lock was tried.
    pub(crate) found: Option<Record>,
}

/// Why [`write_and_commit`] committed nothing. The transaction is aborted or
/// over; the caller rolls back.
#[derive(Debug)]
pub(crate) enum NotCommitted {
    /// The record changed since it was read under the lock: the write's guard
    /// failed the statement.
    Changed,
    /// The database or the connection failed.
    Failed(sqlx::Error),
}

/// In the transaction `conn` has just begun (with [`lock::BEGIN`]): tries the
/// key's lock and reads its record, in one round trip.
///
/// The lock and the read are separate statements, and each statement of a
/// simple query takes its own snapshot when it starts, so the read sees
/// whatever the previous holder of the lock committed (see `lock`). The rows of
/// a simple query come back as text, and sqlx reads `bytea` text only in hex,
/// hence `bytea_output` for this transaction.
///
/// The read is a statement prepared once per session (see `records::session`);
/// if this session does not have it yet, the failed attempt is rolled back, the
/// transaction begun again, the statements prepared, and the read repeated.
pub(crate) async fn lock_and_fetch(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<Opened> {
    let sql = format!(
        "SET LOCAL bytea_output = hex; {}; {}",
        lock::try_lock_inline(lock::lock_key(scope, key)),
        records::execute_fetch(scope, key),
    );
    match fetch(conn, &sql).await {
        Err(error) if has_code(&error, records::STATEMENT_MISSING) => {
            // sqlx still counts its transaction as open; keep the server's
            // side the same.
            sqlx::raw_sql(AssertSqlSafe(format!("ROLLBACK; {}", lock::BEGIN)))
                .execute(&mut *conn)
                .await?;
            records::prepare_session(conn).await?;
            fetch(conn, &sql).await
        }
        done => done,
    }
}

async fn fetch(conn: &mut PgConnection, sql: &str) -> sqlx::Result<Opened> {
    let rows = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(conn).await?;
    opened(&rows)
}

/// Reads the rows of [`lock_and_fetch`]'s query: the lock's answer, then the
/// record if there is one.
fn opened(rows: &[PgRow]) -> sqlx::Result<Opened> {
    let (lock, found) = match rows {
        [lock] => (lock, None),
        [lock, record] => (lock, Some(records::from_row(record)?)),
        _ => {
            return Err(sqlx::Error::Protocol(format!(
                "locking and reading a record returned {} rows, expected 1 or 2",
                rows.len()
            )));
        }
    };
    Ok(Opened {
        granted: lock.try_get("granted")?,
        found,
    })
}

/// The query that begins a claim-first apply's transaction and claims the key
/// in the same round trip, for `begin_with`: it fails unless this
/// transaction got the key's lock and the key has no record (see
/// [`refused_claim`]).
///
/// The values are literals escaped by `literal`.
pub(crate) fn begin_and_claim(scope: &Scope, key: &IdempotencyKey) -> AssertSqlSafe<String> {
    AssertSqlSafe(format!(
        "{}; {}",
        lock::BEGIN,
        records::execute_claim(scope, key, lock::lock_key(scope, key))
    ))
}

/// A pooled connection whose `BEGIN` query (with the claim, in
/// [`begin_and_claim`]) is on its way.
///
/// If the apply is given up before that query is answered (its future
/// dropped), the connection is closed instead of going back to the pool: sqlx
/// counts no transaction on it yet, while the server may be inside one —
/// holding the key's lock, after a claim — and would run the next user's
/// statements in it. Closing the session ends that transaction.
pub(crate) struct Beginning {
    /// The connection; taken only by [`Beginning::answered`], which consumes
    /// the guard.
    conn: Option<PoolConnection<Postgres>>,
    /// Whether the connection is known to be in the state sqlx counts.
    settled: bool,
}

const HOLDS_ITS_CONNECTION: &str = "the guard holds its connection until `answered` consumes it";

impl Beginning {
    /// `conn`, about to send a `BEGIN` query.
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Self {
        Self {
            conn: Some(conn),
            settled: false,
        }
    }

    /// Sends `sql` with sqlx's `begin_with`. A transaction settles the guard;
    /// a failure leaves it standing until [`Beginning::answered`], so the
    /// caller can roll back under it.
    pub(crate) async fn begin(
        &mut self,
        sql: impl SqlSafeStr,
    ) -> sqlx::Result<Transaction<'_, Postgres>> {
        let conn = self.conn.as_mut().expect(HOLDS_ITS_CONNECTION);
        let began = conn.begin_with(sql).await;
        self.settled = began.is_ok();
        began
    }

    /// The connection, for what follows a failed `BEGIN`.
    pub(crate) fn connection(&mut self) -> &mut PoolConnection<Postgres> {
        self.conn.as_mut().expect(HOLDS_ITS_CONNECTION)
    }

    /// The connection, in a state sqlx counts again.
    pub(crate) fn answered(mut self) -> PoolConnection<Postgres> {
        self.settled = true;
        self.conn.take().expect(HOLDS_ITS_CONNECTION)
    }
}

impl Drop for Beginning {
    fn drop(&mut self) {
        if let (false, Some(conn)) = (self.settled, self.conn.as_mut()) {
            conn.close_on_drop();
        }
    }
}

/// After the query of [`begin_and_claim`] failed with `error`: rolls back the
/// transaction the failure left aborted, which sqlx does not count as begun.
///
/// `Ok` when the replay-first path should take over: the key is held or has
/// a record, or this session lacked the claim statement (now prepared, for
/// the next time). Any other failure is the caller's.
pub(crate) async fn refused_claim(conn: &mut PgConnection, error: sqlx::Error) -> sqlx::Result<()> {
    let rolled_back = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
    if has_code(&error, records::CLAIM_HELD) || has_code(&error, records::CLAIM_RECORDED) {
        rolled_back.map(drop)
    } else if has_code(&error, records::STATEMENT_MISSING) {
        rolled_back?;
        records::prepare_session(conn).await
    } else {
        Err(error)
    }
}

/// Writes `record` and commits the transaction, in one round trip: inserts it
/// if the key had no record when [`lock_and_fetch`] read it (`replaces` false),
/// otherwise replaces that record, guarded by its token.
///
/// The query ends with `BEGIN`: the commit is sent by hand, but sqlx counts its
/// transaction as open until it is committed or rolled back through it. The
/// caller drops it, sqlx queues a `ROLLBACK`, and the connection sends it with
/// its next message (the pool's check when it takes the connection back), so
/// the empty transaction is closed without a round trip of its own and the
/// server's state always matches sqlx's.
///
/// If the write fails, the server skips the rest of the query, `COMMIT`
/// included, and nothing is committed.
pub(crate) async fn write_and_commit(
    conn: &mut PgConnection,
    record: &Record,
    replaces: bool,
) -> Result<(), NotCommitted> {
    let (write, stale) = if replaces {
        (records::execute_replace(record), records::REPLACE_FAILED)
    } else {
        (records::execute_insert(record), records::INSERT_FAILED)
    };
    let done = sqlx::raw_sql(AssertSqlSafe(format!("{write}; COMMIT; BEGIN")))
        .execute(&mut *conn)
        .await;
    match done {
        Ok(_) => Ok(()),
        Err(error) if has_code(&error, stale) => Err(NotCommitted::Changed),
        Err(error) => Err(NotCommitted::Failed(error)),
    }
}

/// Whether `error` says the connection itself is gone (closed by the server
/// or the network, the server shutting down), so nothing sent on it took
/// effect beyond what the server rolls back.
pub(crate) fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}

/// Whether `error` is a database error with this SQLSTATE.
fn has_code(error: &sqlx::Error, code: &str) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some(code))
}
