//! This crate's tables live in the store's own database (so an outbox row
//! commits with the business transaction), but the store crates do not know
//! them. Each table's owner (`outbox`, `dead_letter`) declares its migrations as
//! a [`Component`]; this module runs them, once per store and process, on first
//! use, and records each component's version in `idem_broker_schema`.
//!
//! Migrations are idempotent and safe from several processes at once: on
//! SQLite they run in one `BEGIN IMMEDIATE` transaction on the store's writer;
//! on PostgreSQL in one transaction behind a transaction-scoped advisory lock.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use idem::sqlite::rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use idem::{PgStore, SqliteStore};
use idem_core::{Error, ErrorKind, StoreError};
use sqlx::PgConnection;

use crate::db;

/// A set of tables with its own migrations. Migration `i` brings the
/// component to version `i + 1`; both lists have the same length.
#[derive(Debug)]
pub(crate) struct Component {
    /// The name recorded in `idem_broker_schema`.
    pub name: &'static str,
    /// The SQLite migrations, in order.
    pub sqlite: &'static [&'static str],
    /// The PostgreSQL migrations, in order.
    pub postgres: &'static [&'static str],
}

const SQLITE_VERSIONS: &str = "CREATE TABLE IF NOT EXISTS idem_broker_schema (
    component TEXT    NOT NULL PRIMARY KEY,
    version   INTEGER NOT NULL
)";
const POSTGRES_VERSIONS: &str = "CREATE TABLE IF NOT EXISTS idem_broker_schema (
    component TEXT   NOT NULL PRIMARY KEY,
    version   BIGINT NOT NULL
)";
const SELECT_VERSION: &str = "SELECT version FROM idem_broker_schema WHERE component = $1";
const UPSERT_VERSION: &str = "INSERT INTO idem_broker_schema (component, version) VALUES ($1, $2)
    ON CONFLICT (component) DO UPDATE SET version = excluded.version";
/// The advisory lock that serialises migrations of this crate's tables.
const POSTGRES_LOCK: i64 = 0x1de3_b40c_5c4e_3a01;

/// (store, component) pairs already migrated by this process.
static MIGRATED: Mutex<BTreeSet<(String, &'static str)>> = Mutex::new(BTreeSet::new());

fn done(store: &str, component: &'static Component) -> bool {
    MIGRATED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&(store.to_owned(), component.name))
}

fn remember(store: String, component: &'static Component) {
    MIGRATED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert((store, component.name));
}

fn too_new(component: &Component, found: i64, known: usize) -> Error {
    StoreError::new(
        ErrorKind::Corrupt,
        format!(
            "the {} tables have schema version {found}, newer than this build's {known}; upgrade idem",
            component.name
        ),
    )
    .into()
}

/// Brings `component` up to date on an embedded store, once per process.
pub(crate) async fn ensure_sqlite(
    store: &SqliteStore,
    component: &'static Component,
) -> Result<(), Error> {
    let id = format!("sqlite:{}", store.path().display());
    if done(&id, component) {
        return Ok(());
    }
    let opened_as = store
        .with_connection(move |conn| {
            let opened_as = conn.path().unwrap_or_default().to_owned();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| db::sqlite("start a migration", e))?;
            apply_sqlite(&tx, component)?;
            tx.commit()
                .map_err(|e| db::sqlite("commit a migration", e))
                .map(|()| opened_as)
        })
        .await??;
    // Known by the path given to the store and by the one SQLite reports,
    // which is what an enqueue sees on its transaction.
    remember(id, component);
    remember(format!("sqlite:{opened_as}"), component);
    Ok(())
}

/// Brings `component` up to date inside the caller's SQLite transaction (it
/// commits or rolls back with it). For enqueues, which run in the business
/// transaction on the store's writer and so cannot wait for another job there.
pub(crate) fn apply_sqlite(conn: &Connection, component: &'static Component) -> Result<(), Error> {
    conn.execute(SQLITE_VERSIONS, [])
        .map_err(|e| db::sqlite("create idem_broker_schema", e))?;
    let found: i64 = conn
        .query_row(SELECT_VERSION, [component.name], |row| row.get(0))
        .optional()
        .map_err(|e| db::sqlite("read a schema version", e))?
        .unwrap_or(0);
    let known = component.sqlite.len();
    let from = usize::try_from(found).unwrap_or(usize::MAX);
    if from > known {
        return Err(too_new(component, found, known));
    }
    for step in &component.sqlite[from..] {
        conn.execute_batch(step)
            .map_err(|e| db::sqlite("apply a migration", e))?;
    }
    if from < known {
        conn.execute(UPSERT_VERSION, params![component.name, known as i64])
            .map_err(|e| db::sqlite("record a schema version", e))?;
    }
    Ok(())
}

/// Whether this process has already migrated `component` on the SQLite file at `path`.
pub(crate) fn sqlite_done(path: &str, component: &'static Component) -> bool {
    done(&format!("sqlite:{path}"), component)
}

fn fail(doing: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| db::postgres(doing, e)
}

/// Brings `component` up to date on PostgreSQL, once per process.
pub(crate) async fn ensure_postgres(
    store: &PgStore,
    component: &'static Component,
) -> Result<(), Error> {
    let options = store.pool().connect_options();
    let id = format!(
        "postgres:{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    );
    if done(&id, component) {
        return Ok(());
    }
    let mut tx = store
        .pool()
        .begin()
        .await
        .map_err(fail("start a migration"))?;
    apply_postgres(&mut tx, component).await?;
    tx.commit().await.map_err(fail("commit a migration"))?;
    remember(id, component);
    Ok(())
}

/// Brings `component` up to date inside the caller's PostgreSQL transaction,
/// behind a transaction-scoped advisory lock (held until the caller commits).
pub(crate) async fn apply_postgres(
    conn: &mut PgConnection,
    component: &'static Component,
) -> Result<(), Error> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(POSTGRES_LOCK)
        .execute(&mut *conn)
        .await
        .map_err(fail("lock the migrations"))?;
    sqlx::raw_sql(POSTGRES_VERSIONS)
        .execute(&mut *conn)
        .await
        .map_err(fail("create idem_broker_schema"))?;
    let found: i64 = sqlx::query_scalar(SELECT_VERSION)
        .bind(component.name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(fail("read a schema version"))?
        .unwrap_or(0);
    let known = component.postgres.len();
    let from = usize::try_from(found).unwrap_or(usize::MAX);
    if from > known {
        return Err(too_new(component, found, known));
    }
    for step in &component.postgres[from..] {
        sqlx::raw_sql(*step)
            .execute(&mut *conn)
            .await
            .map_err(fail("apply a migration"))?;
    }
    if from < known {
        sqlx::query(UPSERT_VERSION)
            .bind(component.name)
            .bind(known as i64)
            .execute(&mut *conn)
            .await
            .map_err(fail("record a schema version"))?;
    }
    Ok(())
}
