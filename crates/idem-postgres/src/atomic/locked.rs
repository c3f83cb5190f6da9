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

/// A pooled connection whose `BEGIN` is on its way.
///
/// If the apply is given up before `BEGIN` is answered (its future dropped),
/// the connection is closed instead of going back to the pool: sqlx counts no
/// transaction on it yet, while the server may be inside one and would run
/// the next user's statements in it. Closing the session ends that
/// transaction.
pub(crate) struct Beginning {
    /// The connection.
    conn: PoolConnection<Postgres>,
    /// Whether the connection is known to be in the state sqlx counts.
    settled: bool,
}

impl Beginning {
    /// `conn`, about to send a `BEGIN` query.
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Self {
        Self {
            conn,
            settled: false,
        }
    }

    /// Sends `sql` with sqlx's `begin_with`. A transaction settles the guard;
    /// after a failure, dropping the guard closes the connection.
    pub(crate) async fn begin(
        &mut self,
        sql: impl SqlSafeStr,
    ) -> sqlx::Result<Transaction<'_, Postgres>> {
        let began = self.conn.begin_with(sql).await;
        self.settled = began.is_ok();
        began
    }
}

impl Beginning {
    /// The connection, for a query that begins and ends its transaction
    /// itself; [`settle`](Self::settle) once the server is known to be
    /// outside any transaction again.
    pub(crate) fn connection(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// The server is in the state sqlx counts: the connection may go back
    /// to the pool.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }
}

impl Drop for Beginning {
    fn drop(&mut self) {
        if !self.settled {
            self.conn.close_on_drop();
        }
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
pub(crate) fn has_code(error: &sqlx::Error, code: &str) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some(code))
}
