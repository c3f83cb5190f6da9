//! Running behind a transaction pooler (PgBouncer's `pool_mode = transaction`),
//! where a client's connection is lent a server connection for one
//! transaction at a time, so nothing may outlive the transaction it was made
//! in.
//!
//! Why each choice, from what sqlx 0.9 actually sends:
//!
//! - sqlx prepares every query with bind parameters as a *named* statement
//!   (`sqlx_s_1`, `sqlx_s_2`, … counted per client connection). With the
//!   statement cache off (`statement_cache_capacity(0)`) the names are still
//!   used; the statements are only never reused nor closed. On a shared
//!   server connection, the next client's `sqlx_s_1` then collides with the
//!   one left behind ("prepared statement already exists"). So every
//!   transaction the store begins clears the server connection's prepared
//!   statements first (`DEALLOCATE ALL`, in the `BEGIN` query itself), and
//!   within one transaction a client's names never repeat.
//! - sqlx sends a query as two exchanges, `Parse` then `Bind`/`Execute`, each
//!   ended by `Sync`. Outside a transaction the pooler may hand the second
//!   exchange to another server connection, which does not have the
//!   statement (or has another client's unnamed one). So nothing is sent
//!   outside a transaction: single statements run in a short transaction of
//!   their own ([`OneShot`]), or as one self-contained simple query.
//! - Atomic apply's statements prepared with SQL `PREPARE` (see
//!   `records::session`) are prepared again in each transaction's `BEGIN`
//!   query, so they exist for exactly that transaction's server connection.
//! - Advisory locks are transaction-scoped everywhere; the only session lock,
//!   sqlx's migrator lock, is replaced by a transaction-scoped lock on the
//!   same key around all the migrations in one transaction ([`migrate`]).
//! - `LISTEN` through a transaction pooler registers on whichever server
//!   connection ran it and never delivers to the client: with
//!   `pgbouncer=true` nothing listens, waiters poll, and that is logged once.
//! - PgBouncer refuses start-up parameters it does not know, and sqlx sends
//!   `extra_float_digits`: with `pgbouncer=true` it is not sent.
//!
//! The URL says which: `statement_cache=0` (no prepared statement outlives
//! its transaction: the first three choices) or `pgbouncer=true` (all of
//! them).

use std::sync::LazyLock;
use std::time::Duration;

use idem_core::{Error, ErrorKind, StoreError};
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, Postgres};
use sqlx::{ConnectOptions, Connection, Transaction};

use crate::{lock, records};

/// What stands between the store and the server, as the URL says.
/// Ordered by how much is given up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Pooling {
    /// Nothing: a client's connection is a server session of its own.
    #[default]
    Direct,
    /// `statement_cache=0`: no prepared statement is kept across
    /// transactions.
    Statements,
    /// `pgbouncer=true`: a transaction pooler; as `Statements`, and no
    /// `LISTEN`, no `extra_float_digits` at start-up.
    PgBouncer,
}

impl Pooling {
    /// Takes `statement_cache` and `pgbouncer` out of `url`'s query: the URL
    /// without them, the pooling they ask for, and a statement cache size
    /// other than 0 if one was given.
    pub(crate) fn take(url: &str) -> Result<(String, Pooling, Option<usize>), Error> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), Pooling::Direct, None));
        };
        let mut pooling = Pooling::Direct;
        let mut capacity = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "statement_cache" => match value.parse::<usize>() {
                    Ok(0) => pooling = pooling.max(Pooling::Statements),
                    Ok(n) => capacity = Some(n),
                    Err(_) => return Err(not_understood(pair, "statement_cache=0")),
                },
                "pgbouncer" => match value {
                    "true" | "on" | "1" => pooling = Pooling::PgBouncer,
                    "false" | "off" | "0" => {}
                    _ => return Err(not_understood(pair, "pgbouncer=true")),
                },
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((url, pooling, capacity))
    }

    /// `options` with what this pooling needs at connection time, and the
    /// statement cache size `capacity` if the URL gave one.
    pub(crate) fn apply(
        self,
        options: PgConnectOptions,
        capacity: Option<usize>,
    ) -> PgConnectOptions {
        let options = match capacity {
            Some(capacity) => options.statement_cache_capacity(capacity),
            None => options,
        };
        match self {
            Pooling::Direct => options,
            Pooling::Statements => options.statement_cache_capacity(0),
            Pooling::PgBouncer => options.statement_cache_capacity(0).extra_float_digits(None),
        }
    }

    /// Whether a server session lasts as long as the client's connection,
    /// so that statements may be sent outside a transaction and prepared
    /// statements and session locks kept across transactions.
    pub(crate) fn sessions(self) -> bool {
        self == Pooling::Direct
    }

    /// Whether `LISTEN` reaches this client.
    pub(crate) fn can_listen(self) -> bool {
        self != Pooling::PgBouncer
    }

    /// The query that begins each of the store's transactions: READ
    /// COMMITTED (see `lock`), and without sessions, the server connection's
    /// prepared statements cleared and atomic apply's prepared again.
    pub(crate) fn begin(self) -> &'static str {
        static CLEAN_BEGIN: LazyLock<String> = LazyLock::new(|| {
            format!(
                "{}; DEALLOCATE ALL; {}",
                lock::BEGIN,
                records::prepare_statements()
            )
        });
        if self.sessions() {
            lock::BEGIN
        } else {
            CLEAN_BEGIN.as_str()
        }
    }

    /// Says once per process and waiter, at `warn`, why `what` polls
    /// instead of listening.
    pub(crate) fn explain_polling(what: &'static str) {
        static SAID: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
        let mut said = SAID
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !said.contains(&what) {
            said.push(what);
            tracing::warn!(
                waiter = what,
                "pgbouncer=true: not listening for PostgreSQL notifications, which a transaction pooler never delivers; polling instead"
            );
        }
    }
}

fn not_understood(pair: &str, instead: &str) -> Error {
    Error::Store(StoreError::new(
        ErrorKind::Config,
        format!("{pair} in the PostgreSQL URL is not understood: write {instead}"),
    ))
}

impl crate::PgStore {
    /// Whether `LISTEN` reaches this store's connections: not through a
    /// transaction pooler (the URL said `pgbouncer=true`), where a `LISTEN`
    /// registers on a server connection the client no longer holds and
    /// nothing is ever delivered. When it cannot, this says once per
    /// process, at `warn`, that `waiter` polls instead.
    pub fn can_listen(&self, waiter: &'static str) -> bool {
        let can = self.pooling().can_listen();
        if !can {
            Pooling::explain_polling(waiter);
        }
        can
    }
}

/// Opens the store's first connection, bounded by `timeout` like any other
/// acquire, and finds out whether PgBouncer is in between: PgBouncer refuses
/// the `extra_float_digits` start-up parameter that sqlx sends unless told to
/// ignore it, with SQLSTATE `08P01` "unsupported startup parameter". That
/// refusal turns on `pgbouncer=true` (said at `warn`, with how to say so in
/// the URL) and the connection is tried again without the parameter. The
/// pooling to use comes back with the connection.
///
/// A PgBouncer that ignores the parameter cannot be told from a server:
/// its answers to an ordinary client are the server's.
pub(crate) async fn connect_first(
    options: &PgConnectOptions,
    pooling: Pooling,
    timeout: Duration,
) -> sqlx::Result<(PgConnection, Pooling)> {
    let connect =
        async |options: &PgConnectOptions| match tokio::time::timeout(timeout, options.connect())
            .await
        {
            Ok(connected) => connected,
            Err(_elapsed) => Err(sqlx::Error::PoolTimedOut),
        };
    match connect(options).await {
        Err(sqlx::Error::Database(refusal))
            if pooling < Pooling::PgBouncer
                && refusal.code().as_deref() == Some("08P01")
                && refusal.message().contains("unsupported startup parameter") =>
        {
            tracing::warn!(
                refusal = refusal.message(),
                "PgBouncer refused a start-up parameter that sqlx sends: connecting as with pgbouncer=true (a transaction pooler is assumed); add pgbouncer=true to the store's URL to say so, or ignore_startup_parameters = extra_float_digits to pgbouncer.ini for a PgBouncer in session mode"
            );
            let found = Pooling::PgBouncer;
            let first = connect(&found.apply(options.clone(), None)).await?;
            Ok((first, found))
        }
        connected => connected.map(|first| (first, pooling)),
    }
}

/// A connection for statements the caller sends outside any transaction of
/// its own: the pooled connection itself, or without sessions a transaction
/// that [`done`](Self::done) commits.
pub(crate) enum OneShot {
    /// Statements go straight to the session.
    Session(PoolConnection<Postgres>),
    /// Statements go inside this transaction.
    Transaction(Transaction<'static, Postgres>),
}

impl OneShot {
    /// Takes a connection from `pool` (and begins, without sessions).
    pub(crate) async fn open(pool: &PgPool, pooling: Pooling) -> sqlx::Result<OneShot> {
        if pooling.sessions() {
            Ok(OneShot::Session(pool.acquire().await?))
        } else {
            Ok(OneShot::Transaction(
                lock::begin(pool, pooling.begin()).await?,
            ))
        }
    }

    /// The connection to send the statements on.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        match self {
            OneShot::Session(conn) => conn,
            OneShot::Transaction(tx) => tx,
        }
    }

    /// Commits the statements, if they are in a transaction.
    pub(crate) async fn done(self) -> sqlx::Result<()> {
        match self {
            OneShot::Session(_) => Ok(()),
            OneShot::Transaction(tx) => tx.commit().await,
        }
    }
}

/// `$body` (an expression of type `Result<T, idem_core::Error>` that sends
/// its statements on `$conn`, a `&mut PgConnection`) on a [`OneShot`] of the
/// store `$store`, committed when `$body` succeeds: a statement outside any
/// transaction of the caller's, safe through a pooler.
macro_rules! one_shot {
    ($store:expr, |$conn:ident| $body:expr) => {{
        match $store.one_shot().await {
            Ok(mut one_shot) => {
                let $conn = one_shot.conn();
                match $body {
                    Ok(value) => one_shot
                        .done()
                        .await
                        .map(|()| value)
                        .map_err(|e| $store.fail(e)),
                    Err(error) => Err(error),
                }
            }
            Err(error) => Err(error),
        }
    }};
}
pub(crate) use one_shot;

/// The advisory lock key of sqlx's migrator for `database`, so that a
/// migration through a pooler and one on a direct connection (which takes
/// it as a session lock) still exclude each other.
fn migrator_lock_key(database: &str) -> i64 {
    // CRC-32 (ISO-HDLC, as zlib's), times sqlx's constant.
    let mut crc = 0xFFFF_FFFFu32;
    for byte in database.bytes() {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    0x3d32_ad9e * i64::from(!crc)
}

/// Migrates on `conn` as sqlx's migrator does, but in one transaction that
/// holds the migrator's lock as a transaction-scoped lock (each migration in
/// a savepoint of it): a session lock taken through a transaction pooler
/// stays on whichever server connection took it, and the unlock may be sent
/// to another.
pub(crate) async fn migrate(conn: &mut PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    let mut migrator = Migrator::with_migrations(records::MIGRATOR.iter().cloned().collect());
    migrator.set_locking(false);
    let mut tx = conn.begin_with("BEGIN; DEALLOCATE ALL").await?;
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(migrator_lock_key(&database))
        .execute(&mut *tx)
        .await?;
    migrator.run_direct(None, &mut *tx, false).await?;
    // The migrator leaves its lock alone when told not to lock; make sure
    // nothing else is held past the commit.
    tx.commit().await?;
    Ok(())
}

/// Runs sqlx's migrator on `conn` as it is, or with [`migrate`] without
/// sessions.
pub(crate) async fn migrate_on(
    conn: &mut PgConnection,
    pooling: Pooling,
) -> Result<(), sqlx::migrate::MigrateError> {
    if pooling.sessions() {
        records::MIGRATOR.run_direct(None, conn, false).await
    } else {
        migrate(conn).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_is_read_from_the_url_and_removed_from_it() {
        let take = |url: &str| Pooling::take(url).unwrap();
        assert_eq!(
            take("postgres://u@h/db"),
            ("postgres://u@h/db".to_owned(), Pooling::Direct, None)
        );
        assert_eq!(
            take("postgres://u@h/db?statement_cache=0&sslmode=disable"),
            (
                "postgres://u@h/db?sslmode=disable".to_owned(),
                Pooling::Statements,
                None
            )
        );
        assert_eq!(
            take("postgres://u@h/db?pgbouncer=true&statement_cache=0"),
            ("postgres://u@h/db".to_owned(), Pooling::PgBouncer, None)
        );
        assert_eq!(
            take("postgres://u@h/db?statement_cache=0&pgbouncer=true"),
            ("postgres://u@h/db".to_owned(), Pooling::PgBouncer, None)
        );
        assert_eq!(
            take("postgres://u@h/db?statement_cache=50&pgbouncer=off"),
            ("postgres://u@h/db".to_owned(), Pooling::Direct, Some(50))
        );
        for bad in [
            "postgres://u@h/db?pgbouncer=maybe",
            "postgres://u@h/db?statement_cache=none",
        ] {
            let err = Pooling::take(bad).unwrap_err();
            assert!(err.to_string().contains("not understood"), "{err}");
        }
    }

    #[test]
    fn only_pgbouncer_gives_up_listening_and_the_float_digits_parameter() {
        assert!(Pooling::Direct.sessions() && Pooling::Direct.can_listen());
        assert!(!Pooling::Statements.sessions() && Pooling::Statements.can_listen());
        assert!(!Pooling::PgBouncer.sessions() && !Pooling::PgBouncer.can_listen());
        assert_eq!(Pooling::Direct.begin(), lock::BEGIN);
        assert!(Pooling::PgBouncer.begin().contains("DEALLOCATE ALL"));
    }

    /// The key sqlx 0.9's migrator locks: `0x3d32ad9e * crc32(database)`.
    #[test]
    fn the_migration_lock_key_is_sqlxs() {
        // crc32("123456789") is the check value 0xCBF43926.
        assert_eq!(migrator_lock_key("123456789"), 0x3d32_ad9e * 0xCBF4_3926);
    }
}
