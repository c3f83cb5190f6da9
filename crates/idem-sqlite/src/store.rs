//! The store handle and how it is made: [`SqliteStore`], [`SqliteStoreBuilder`],
//! and the small helpers every protocol path shares (the writer's effect
//! runner, the in-process holds).
//!
//! Every decision is taken by [`idem_core::decide`] inside a `BEGIN IMMEDIATE`
//! transaction on the writer thread, so the record read and the record written
//! cannot be separated by another writer. Before that, two cheap steps answer
//! most duplicates without touching the writer: a read on a reader connection
//! (a settled record is replayed, a reused key refused), and the in-process
//! [hold](crate::holds) that answers a concurrent duplicate `InFlight` at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_core::{
    AtomicEffect, Error, Operation, Settings, SharedClock, SystemClock, TxCall, observe, protocol,
};
use rusqlite::Connection;

use crate::connection::{ConnectionOptions, Connections, Synchronous};
use crate::holds::{Hold, Holds};
use crate::lease_writes::LeaseContext;
use crate::schema;

/// The embedded store. Cheap to clone; clones share the writer thread.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope};
/// use idem_sqlite::SqliteStore;
///
/// let dir = std::env::temp_dir().join(format!("idem-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("idem.db")).await?;
/// let scope = Scope::new("payments")?;
/// let key = IdempotencyKey::new("payment-1")?;
/// let fp = Fingerprint::of_bytes(b"debit 10 from acc-1");
/// for _delivery in 0..3 {
///     store.apply(&scope, &key, fp, async |tx| -> rusqlite::Result<Outcome> {
///         tx.execute("CREATE TABLE IF NOT EXISTS debits (amount INTEGER)", [])?;
///         tx.execute("INSERT INTO debits VALUES (10)", [])?;
///         Ok(Outcome::success("ok"))
///     }).await?;
/// }
/// let debits: i64 = store.with_connection(|c| c.query_row("SELECT count(*) FROM debits", [], |r| r.get(0))).await??;
/// assert_eq!(debits, 1);
/// # std::fs::remove_dir_all(&dir)?; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connections: Connections,
    holds: Holds,
    settings: Settings,
    clock: SharedClock,
    lease_batches: bool,
}

/// Options for opening a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    settings: Settings,
    clock: SharedClock,
    connection: ConnectionOptions,
    lease_batches: bool,
}

impl SqliteStoreBuilder {
    /// Lease and retention.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The clock (a [`idem_core::ManualClock`] in tests).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Commit durability; `Full` by default.
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.connection.synchronous = synchronous;
        self
    }

    /// How long to wait for another process's write lock; 5 s by default.
    pub fn busy_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.connection.busy_timeout = timeout;
        self
    }

    /// Whether the writer decides and writes leased claims and completions
    /// itself, many in one transaction (the default), or runs each as a
    /// grouped job in a savepoint of its own, as every other write. The
    /// second way is kept to be compared against in benchmarks.
    #[doc(hidden)]
    pub fn lease_batches(mut self, on: bool) -> Self {
        self.lease_batches = on;
        self
    }

    /// Opens (creating if needed) the file and brings its schema up to date.
    pub async fn open(self) -> Result<SqliteStore, Error> {
        let context = LeaseContext {
            settings: self.settings.clone(),
            clock: Arc::clone(&self.clock),
        };
        let connections =
            Connections::open(self.path, self.connection, context, schema::migrate).await?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                connections,
                holds: Holds::default(),
                settings: self.settings,
                clock: self.clock,
                lease_batches: self.lease_batches,
            }),
        })
    }
}

impl SqliteStore {
    /// Opens `path` with the defaults (lease 60 s, retention 7 days, system
    /// clock, `synchronous=FULL`).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::builder(path).open().await
    }

    /// Starts configuring a store on `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            settings: Settings::default(),
            clock: Arc::new(SystemClock),
            connection: ConnectionOptions::default(),
            lease_batches: true,
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.inner.connections.path()
    }

    /// Lease and retention.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The store's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// Runs `job` on the write connection, outside the protocol: for the
    /// application's own schema and reads that must see the latest writes.
    pub async fn with_connection<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, Error> {
        self.inner.connections.write(job).await
    }

    /// The reader and writer connections.
    pub(crate) fn connections(&self) -> &Connections {
        &self.inner.connections
    }

    /// Whether claims and completions go to the writer as lease jobs.
    pub(crate) fn lease_batches(&self) -> bool {
        self.inner.lease_batches
    }

    /// The in-process holds on keys.
    pub(crate) fn holds(&self) -> &Holds {
        &self.inner.holds
    }

    pub(crate) fn hold(&self, op: &Operation) -> Result<Hold, Error> {
        self.inner
            .holds
            .try_hold(op.scope.as_str(), op.key.as_str())
            .ok_or_else(|| self.busy(op))
    }

    /// The refusal of a caller whose key another caller holds, reported.
    pub(crate) fn busy(&self, op: &Operation) -> Error {
        let refusal = protocol::busy(&op.scope, &op.key, &self.inner.settings);
        observe::refused(&refusal);
        refusal
    }
}

/// Runs an effect on the writer thread. SQLite calls are synchronous, so the
/// effect's future is driven to completion right here, inside the
/// transaction; awaiting anything else in it would hold up every writer.
pub(crate) fn run_effect<F, T, E>(effect: F, conn: &mut Connection) -> Result<T, E>
where
    F: AtomicEffect<Connection, T, E>,
{
    futures::executor::block_on(TxCall::call(effect, conn))
}
