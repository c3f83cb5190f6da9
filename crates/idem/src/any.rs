//! [`AnyStore`]: a store chosen at run time from a [`StoreLocation`], for
//! programs (like the `idem` command) that serve either backend.
//!
//! Atomic effects on an `AnyStore` get `&mut dyn AnyTx`, and write with
//! whichever connection [`AnyTx::connection`] turns out to be:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{AnyConnection, AnyStore, AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope, StoreLocation};
//! let dir = tempfile::tempdir()?;
//! let location: StoreLocation = format!("sqlite://{}", dir.path().join("idem.db").display()).parse()?;
//! let store = AnyStore::open(&location).await?;
//! let (scope, key) = (Scope::new("payments")?, IdempotencyKey::new("pay-1")?);
//! let applied = store
//!     .apply(&scope, &key, Fingerprint::of_bytes(b"10 EUR"), async |tx| -> Result<Outcome, Box<dyn std::error::Error + Send + Sync>> {
//!         match tx.connection() {
//!             AnyConnection::Sqlite(conn) => {
//!                 conn.execute_batch("CREATE TABLE IF NOT EXISTS paid (n INTEGER); INSERT INTO paid VALUES (10);")?;
//!             }
//!             #[cfg(feature = "postgres")]
//!             AnyConnection::Postgres(conn) => {
//!                 idem::sqlx::raw_sql("INSERT INTO paid VALUES (10)").execute(conn).await?;
//!             }
//!         }
//!         Ok(Outcome::success("paid"))
//!     })
//!     .await?;
//! assert!(!applied.is_replay());
//! # Ok(()) }
//! ```

// Without SQLite and PostgreSQL the SQL stores' calls refuse at once (on
// Redis and DynamoDB) or have no store to call at all: their arguments go
// unused.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(unused_variables, unused_mut, dead_code)
)]

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, BatchApplied, Claim, Claimed, Error, ErrorKind,
    FenceStore, Fingerprint, IdempotencyKey, Lease, LeaseStore, Operation, Outcome, Record,
    RecordCount, RecordFilter, RecordGlance, RecordStore, Resource, Scope, SetApplied, Settings,
    SharedClock, SystemClock, TxCall,
};

use crate::StoreLocation;

/// Any store, behind the shared traits.
///
/// Every store offers leased mode ([`LeaseStore`]), inspection
/// ([`RecordStore`]), failed attempts, dead letters and operators' changes
/// with their audit log ([`AdminStore`](idem_core::AdminStore)). Atomic mode
/// ([`AtomicStore`]), the outbox and fencing leases ([`FenceStore`]) write
/// in the effect's own database, so only SQLite and PostgreSQL offer them all:
/// on a Redis store those calls fail with an [`ErrorKind::Config`] error
/// saying so (check with [`AnyStore::require_atomic_mode`] before starting).
/// A DynamoDB store refuses them the same way: its own atomic mode, for
/// effects that are DynamoDB writes, gives the effect a DynamoDB
/// transaction rather than an SQL connection, so it is reached through the
/// store itself (`AnyStore::DynamoDb(store)`, then `store.apply`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// The embedded SQLite store.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(idem_sqlite::SqliteStore),
    /// The PostgreSQL store.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(idem_postgres::PgStore),
    /// The Redis store (one node or a cluster): leased mode only.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(idem_redis::RedisStore),
    /// The DynamoDB store: leased mode, and atomic mode for effects that are
    /// DynamoDB writes.
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    DynamoDb(idem_dynamodb::DynamoStore),
    /// No store at all: a build with none of the store features has no value
    /// of this type ([`AnyStore::open`] refuses every location).
    #[cfg(not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "dynamodb"
    )))]
    #[doc(hidden)]
    NoStore(std::convert::Infallible),
}

impl AnyStore {
    /// Opens the store at `location` with default settings and the system clock,
    /// creating or upgrading its schema.
    pub async fn open(location: &StoreLocation) -> Result<Self, Error> {
        Self::open_with(location, Settings::default(), Arc::new(SystemClock)).await
    }

    /// Opens the store at `location` with the given settings and clock.
    pub async fn open_with(
        location: &StoreLocation,
        settings: Settings,
        clock: SharedClock,
    ) -> Result<Self, Error> {
        match location {
            #[cfg(feature = "sqlite")]
            StoreLocation::Sqlite(path) => Ok(Self::Sqlite(
                idem_sqlite::SqliteStore::builder(path)
                    .settings(settings)
                    .clock(clock)
                    .open()
                    .await?,
            )),
            #[cfg(feature = "postgres")]
            StoreLocation::Postgres(url) => Ok(Self::Postgres(
                idem_postgres::PgStore::builder(url.clone())
                    .settings(settings)
                    .clock(clock)
                    .connect()
                    .await?,
            )),
            #[cfg(feature = "redis")]
            StoreLocation::Redis(url) => Ok(Self::Redis(
                idem_redis::RedisStore::builder(url.clone())
                    .settings(settings)
                    .clock(clock)
                    .connect()
                    .await?,
            )),
            #[cfg(feature = "dynamodb")]
            StoreLocation::DynamoDb(url) => Ok(Self::DynamoDb(
                idem_dynamodb::DynamoStore::builder(url.clone())
                    .settings(settings)
                    .clock(clock)
                    .open()
                    .await?,
            )),
            #[allow(unreachable_patterns)]
            other => {
                let _ = (settings, clock);
                Err(idem_core::StoreError::new(
                    idem_core::ErrorKind::Config,
                    format!("this build of idem has no support for {other}; enable the crate feature for that store"),
                )
                .into())
            }
        }
    }

    /// Whether this store offers atomic mode for SQL effects, the outbox
    /// and fencing leases: SQLite and PostgreSQL do, Redis does not, and
    /// DynamoDB offers atomic mode only for effects that are DynamoDB
    /// writes, without the outbox or fencing leases.
    pub fn offers_atomic_mode(&self) -> bool {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(_) => false,
            #[cfg(feature = "dynamodb")]
            Self::DynamoDb(_) => false,
            #[allow(unreachable_patterns)]
            _ => true,
        }
    }

    /// `Ok` when this store offers atomic mode; otherwise an
    /// [`ErrorKind::Config`] error saying that `what` (for example "idem
    /// relay") needs SQLite or PostgreSQL, and why.
    pub fn require_atomic_mode(&self, what: &str) -> Result<(), Error> {
        #[cfg(feature = "dynamodb")]
        #[allow(irrefutable_let_patterns)]
        if let Self::DynamoDb(_) = self {
            return Err(not_in_dynamodb(what));
        }
        if self.offers_atomic_mode() {
            Ok(())
        } else {
            Err(not_in_redis(what))
        }
    }
}

/// The refusal of a call that needs the effect's own database.
fn not_in_redis(what: &str) -> Error {
    idem_core::StoreError::new(
        ErrorKind::Config,
        format!(
            "{what} needs atomic mode, where the effect and its record commit in one transaction of the store's database; a Redis store holds the records only, not the effect, so use a sqlite:// or postgres:// store for it (Redis serves leased mode: idem serve, idem forward, LeaseStore)"
        ),
    )
    .into()
}

/// The refusal, on DynamoDB, of a call that needs an SQL store.
#[cfg(feature = "dynamodb")]
fn not_in_dynamodb(what: &str) -> Error {
    idem_core::StoreError::new(
        ErrorKind::Config,
        format!(
            "{what} needs an SQL store (sqlite:// or postgres://) here: a DynamoDB store keeps records, attempts, dead letters and the audit log, but no outbox and no fencing leases, and its atomic mode (for effects that are DynamoDB writes) is the DynamoDB store's own apply, whose effects get a DynamoDB transaction rather than an SQL connection"
        ),
    )
    .into()
}

macro_rules! each_store {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
            #[cfg(feature = "redis")]
            AnyStore::Redis($store) => $body,
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($store) => $body,
            #[cfg(not(any(
                feature = "sqlite",
                feature = "postgres",
                feature = "redis",
                feature = "dynamodb"
            )))]
            AnyStore::NoStore(never) => match *never {},
        }
    };
}

/// Like `each_store!` for the record scans, which SQLite, PostgreSQL and
/// DynamoDB offer: on Redis, `Err` with the refusal for `$what`, turned into
/// the call's error type.
macro_rules! scan_store {
    ($self:ident, $what:expr, $store:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
            #[cfg(feature = "redis")]
            AnyStore::Redis(_) => Err(not_in_redis($what).into()),
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($store) => $body,
            #[cfg(not(any(
                feature = "sqlite",
                feature = "postgres",
                feature = "redis",
                feature = "dynamodb"
            )))]
            AnyStore::NoStore(never) => match *never {},
        }
    };
}

/// Like `each_store!` for the calls only SQLite and PostgreSQL offer: on
/// Redis and DynamoDB, `Err` with the refusal for `$what`, turned into the
/// call's error type; or, in the second form, `$other` on both.
macro_rules! sql_store {
    ($self:ident, $what:expr, $store:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
            #[cfg(feature = "redis")]
            AnyStore::Redis(_) => Err(not_in_redis($what).into()),
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb(_) => Err(not_in_dynamodb($what).into()),
            #[cfg(not(any(
                feature = "sqlite",
                feature = "postgres",
                feature = "redis",
                feature = "dynamodb"
            )))]
            AnyStore::NoStore(never) => match *never {},
        }
    };
    ($self:ident, $store:ident => $body:expr, on Redis $redis:ident => $other:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
            #[cfg(feature = "redis")]
            AnyStore::Redis($redis) => $other,
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($redis) => $other,
            #[cfg(not(any(
                feature = "sqlite",
                feature = "postgres",
                feature = "redis",
                feature = "dynamodb"
            )))]
            AnyStore::NoStore(never) => match *never {},
        }
    };
}

impl LeaseStore for AnyStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        each_store!(self, s => s.claim(scope, key, fingerprint).await)
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        each_store!(self, s => LeaseStore::renew(s, claim).await)
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        each_store!(self, s => s.complete(claim, outcome).await)
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        each_store!(self, s => LeaseStore::release(s, claim).await)
    }

    async fn end_lease(&self, claim: &Claim) -> Result<(), Error> {
        each_store!(self, s => s.end_lease(claim).await)
    }
}

impl RecordStore for AnyStore {
    fn now(&self) -> idem_core::Timestamp {
        each_store!(self, s => s.now())
    }

    fn settings(&self) -> &Settings {
        each_store!(self, s => RecordStore::settings(s))
    }

    async fn migrate(&self) -> Result<(), Error> {
        each_store!(self, s => s.migrate().await)
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        each_store!(self, s => s.get(scope, key).await)
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        each_store!(self, s => s.list(filter).await)
    }

    async fn count(&self) -> Result<RecordCount, Error> {
        each_store!(self, s => s.count().await)
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_batch(limit).await)
    }

    async fn sweep_batch_alone(&self, limit: usize) -> Result<Option<u64>, Error> {
        each_store!(self, s => s.sweep_batch_alone(limit).await)
    }

    async fn glance(&self) -> Result<RecordGlance, Error> {
        each_store!(self, s => s.glance().await)
    }
}

/// The connection an [`AnyStore`] effect gets: the store's own, inside its
/// transaction. Implemented by each store's connection type.
pub trait AnyTx: Send {
    /// Which connection this is.
    fn connection(&mut self) -> AnyConnection<'_>;
}

/// The connection behind a [`AnyTx`], to write the effect's SQL for its
/// database.
///
/// Its variants follow the crate's store features, so a `match` naming both
/// compiles where both stores are built in.
#[derive(Debug)]
pub enum AnyConnection<'c> {
    /// The embedded store's writer connection, inside `BEGIN IMMEDIATE`.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(&'c mut idem_sqlite::rusqlite::Connection),
    /// The PostgreSQL store's connection, inside its transaction.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(&'c mut idem_postgres::sqlx::PgConnection),
    /// No connection: a build without SQLite and PostgreSQL has no value of
    /// this type.
    #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
    #[doc(hidden)]
    NoConnection(
        std::convert::Infallible,
        std::marker::PhantomData<&'c mut ()>,
    ),
}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl AnyTx for idem_sqlite::rusqlite::Connection {
    fn connection(&mut self) -> AnyConnection<'_> {
        AnyConnection::Sqlite(self)
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl AnyTx for idem_postgres::sqlx::PgConnection {
    fn connection(&mut self) -> AnyConnection<'_> {
        AnyConnection::Postgres(self)
    }
}

/// An effect written for `dyn AnyTx`, as a store whose connection is `C`
/// takes it.
fn on<C, F, T, E>(effect: F) -> impl AtomicEffect<C, T, E>
where
    C: AnyTx + 'static,
    F: AtomicEffect<dyn AnyTx, T, E>,
{
    async move |conn: &mut C| TxCall::call(effect, conn as &mut dyn AnyTx).await
}

impl AtomicStore for AnyStore {
    type Tx = dyn AnyTx;

    async fn apply<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<dyn AnyTx, Outcome, E>,
        E: Send + 'static,
    {
        sql_store!(self, "atomic mode (the effect and its record in one transaction)", s => s.apply(scope, key, fingerprint, on(effect)).await)
    }

    async fn apply_replay_first<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<dyn AnyTx, Outcome, E>,
        E: Send + 'static,
    {
        sql_store!(self, "atomic mode (the effect and its record in one transaction)", s => s.apply_replay_first(scope, key, fingerprint, on(effect)).await)
    }

    async fn apply_batch<G, F, E>(&self, ops: &[Operation], mut effect_for: G) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<dyn AnyTx, Outcome, E>,
        E: Send + 'static,
    {
        sql_store!(self, "atomic mode (the effect and its record in one transaction)", s => s.apply_batch(ops, move |i| on(effect_for(i))).await)
    }

    async fn apply_set<G, F, E>(&self, ops: &[Operation], effect_for: G) -> SetApplied<E>
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<dyn AnyTx, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        sql_store!(self, "atomic mode (the effect and its record in one transaction)", s => s.apply_set(ops, move |new| on(effect_for(new))).await)
    }

    async fn complete_with<F, E>(&self, claim: &Claim, effect: F) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<dyn AnyTx, Outcome, E>,
        E: Send + 'static,
    {
        sql_store!(self, "atomic mode (the effect and its record in one transaction)", s => s.complete_with(claim, on(effect)).await)
    }

    async fn transaction<F, T, E>(&self, effect: F) -> Result<T, ApplyError<E>>
    where
        F: AtomicEffect<dyn AnyTx, T, E>,
        T: Send + 'static,
        E: Send + 'static,
    {
        sql_store!(self, "atomic mode (the effect and its record in one transaction)", s => s.transaction(on(effect)).await)
    }

    fn effect_error_kind(&self, error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
        sql_store!(self, s => s.effect_error_kind(error), on Redis _r => None)
    }
}

impl FenceStore for AnyStore {
    async fn acquire(&self, resource: &Resource, ttl: Duration) -> Result<Lease, Error> {
        sql_store!(self, "a fencing lease on a resource", s => s.acquire(resource, ttl).await)
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, Error> {
        sql_store!(self, "a fencing lease on a resource", s => FenceStore::renew(s, lease, ttl).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        sql_store!(self, "a fencing lease on a resource", s => FenceStore::release(s, lease).await)
    }
}

// The outbox, dead letters and failed attempts of whichever store it is.

impl idem_core::OutboxStore for AnyStore {
    fn outbox_clock(&self) -> SharedClock {
        sql_store!(self, s => s.outbox_clock(), on Redis r => r.clock().clone())
    }

    async fn enqueue_now(&self, message: &idem_core::OutboxMessage) -> Result<i64, Error> {
        sql_store!(self, "the transactional outbox", s => s.enqueue_now(message).await)
    }

    async fn claim_outbox(
        &self,
        owner: &str,
        now: idem_core::Timestamp,
        lease: Duration,
        limit: usize,
        with_default: bool,
    ) -> Result<Vec<idem_core::Pending>, Error> {
        sql_store!(self, "the transactional outbox", s => s.claim_outbox(owner, now, lease, limit, with_default).await)
    }

    async fn mark_sent(&self, ids: &[i64], now: idem_core::Timestamp) -> Result<u64, Error> {
        sql_store!(self, "the transactional outbox", s => s.mark_sent(ids, now).await)
    }

    async fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: idem_core::Timestamp,
        error: &str,
    ) -> Result<bool, Error> {
        sql_store!(self, "the transactional outbox", s => s.retry_later(id, owner, attempts, due, error).await)
    }

    async fn bury(
        &self,
        id: i64,
        owner: &str,
        letter: &idem_core::NewDeadLetter,
        now: idem_core::Timestamp,
    ) -> Result<Option<i64>, Error> {
        sql_store!(self, "the transactional outbox", s => s.bury(id, owner, letter, now).await)
    }

    async fn sweep_sent(&self, before: idem_core::Timestamp, limit: usize) -> Result<u64, Error> {
        sql_store!(self, "the transactional outbox", s => s.sweep_sent(before, limit).await)
    }

    async fn outbox_stats(&self) -> Result<idem_core::OutboxStats, Error> {
        sql_store!(self, "the transactional outbox", s => s.outbox_stats().await)
    }

    async fn recent_sends(&self, limit: usize) -> Result<Vec<idem_core::SentMessage>, Error> {
        sql_store!(self, "the transactional outbox", s => s.recent_sends(limit).await)
    }

    async fn wake_ups(&self) -> Result<Option<Box<dyn idem_core::WakeUps>>, Error> {
        sql_store!(self, "the transactional outbox", s => s.wake_ups().await)
    }
}

impl idem_core::DeadLetterStore for AnyStore {
    async fn record_dead_letter(&self, letter: &idem_core::NewDeadLetter) -> Result<i64, Error> {
        each_store!(self, s => s.record_dead_letter(letter).await)
    }

    async fn list_dead_letters(
        &self,
        limit: usize,
        include_redriven: bool,
    ) -> Result<Vec<idem_core::DeadLetter>, Error> {
        each_store!(self, s => s.list_dead_letters(limit, include_redriven).await)
    }

    async fn get_dead_letter(&self, id: i64) -> Result<Option<idem_core::DeadLetter>, Error> {
        each_store!(self, s => s.get_dead_letter(id).await)
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        each_store!(self, s => s.mark_redriven(id).await)
    }

    async fn dead_letter_stats(&self) -> Result<idem_core::DeadLetterStats, Error> {
        each_store!(self, s => s.dead_letter_stats().await)
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit: usize) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_dead_letters(retention, limit).await)
    }
}

impl idem_core::RecordScan for AnyStore {
    async fn records_of(&self, keys: &[(Scope, IdempotencyKey)]) -> Result<Vec<Record>, Error> {
        scan_store!(self, "the effect auditor", s => s.records_of(keys).await)
    }

    async fn records_by_expiry(
        &self,
        scopes: &[Scope],
        after: Option<&idem_core::ExpiryPosition>,
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        scan_store!(self, "the effect auditor", s => s.records_by_expiry(scopes, after, limit).await)
    }
}

impl idem_core::AdminStore for AnyStore {
    async fn evict(&self, seen: &Record, actor: &str) -> Result<idem_core::RecordAction, Error> {
        each_store!(self, s => s.evict(seen, actor).await)
    }

    async fn release_claim(
        &self,
        seen: &Record,
        actor: &str,
    ) -> Result<idem_core::RecordAction, Error> {
        each_store!(self, s => s.release_claim(seen, actor).await)
    }

    async fn discard_dead_letter(
        &self,
        id: i64,
        actor: &str,
    ) -> Result<idem_core::LetterAction, Error> {
        each_store!(self, s => s.discard_dead_letter(id, actor).await)
    }

    async fn archive_dead_letter(
        &self,
        id: i64,
        actor: &str,
    ) -> Result<idem_core::LetterAction, Error> {
        each_store!(self, s => s.archive_dead_letter(id, actor).await)
    }

    async fn audit_log(&self, limit: usize) -> Result<Vec<idem_core::AuditEntry>, Error> {
        each_store!(self, s => s.audit_log(limit).await)
    }
}

impl idem_core::AttemptStore for AnyStore {
    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<idem_core::Failures, Error> {
        each_store!(self, s => s.record_failure(scope, key, error).await)
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        each_store!(self, s => s.forget_failures(scope, key).await)
    }

    async fn sweep_failures(
        &self,
        before: idem_core::Timestamp,
        limit: usize,
    ) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_failures(before, limit).await)
    }

    fn now(&self) -> idem_core::Timestamp {
        each_store!(self, s => idem_core::AttemptStore::now(s))
    }
}

impl idem_core::AtomicOutbox for AnyStore {
    /// On whichever store's connection `tx` is.
    async fn enqueue(
        tx: &mut (dyn AnyTx + 'static),
        message: &idem_core::OutboxMessage,
    ) -> Result<i64, Error> {
        match tx.connection() {
            #[cfg(feature = "sqlite")]
            AnyConnection::Sqlite(conn) => {
                <idem_sqlite::SqliteStore as idem_core::AtomicOutbox>::enqueue(conn, message).await
            }
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(conn) => {
                <idem_postgres::PgStore as idem_core::AtomicOutbox>::enqueue(conn, message).await
            }
            #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
            AnyConnection::NoConnection(never, _) => {
                let _ = message;
                match never {}
            }
        }
    }
}
