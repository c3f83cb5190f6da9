//! The transactional outbox: a message is written to a table in the same
//! transaction as the business change that caused it, and a
//! [relay](crate::relay) publishes it afterwards.
//!
//! Why: publishing from inside a transaction and then committing loses the
//! business change when the commit fails after the publish (the world heard of
//! an order that does not exist); committing and then publishing loses the
//! message when the process dies in between. With the outbox the message
//! commits or rolls back *with* the change, and the relay delivers it
//! at-least-once; the message's own key lets every consumer dedupe the
//! redeliveries, so processing is effectively-once.
//!
//! [`enqueue`]`(tx, destination, message)` takes either database's open
//! transaction ([`Transaction`]):
//!
//! - a `rusqlite` transaction or connection (for example the one
//!   [`SqliteStore::apply`](idem::SqliteStore::apply) hands an effect): done
//!   when it returns ([`sqlite::enqueue`]);
//! - a `&mut PgConnection` (the one [`PgStore::apply`](idem::PgStore::apply)
//!   hands an effect, or any sqlx transaction on the store's database): a
//!   future to await ([`postgres::enqueue`]).
//!
//! Each message carries its **own** key. When the message comes from an
//! operation that has a key (an HTTP request with `Idempotency-Key`, a consumed
//! message), derive it with [`derive_key`]: the same operation retried
//! produces the same message key, so one key flows HTTP → outbox → broker →
//! consumer and the whole chain dedupes.
//!
//! The destination is chosen per message at enqueue time ([`Route::To`]), or
//! left to the relay's default ([`Route::Default`], the `--to` of `idem relay`).
//!
//! The tables are created by [`migrate`] (which the relay, `idem relay` and the
//! dead-letter functions run on first use). An enqueue runs inside the caller's
//! transaction and cannot create them there; on a database that has never seen
//! a relay, call [`migrate`] once at start-up.
//!
//! Modules: the shared types and [`OutboxStore`] (what the relay needs) here;
//! every SQL statement on `idem_outbox` in `sqlite` and `postgres`.

pub mod postgres;
pub mod sqlite;

use std::future::Future;
use std::time::Duration;

use idem::AnyStore;
use idem_core::{Error, IdempotencyKey, KeyError, MAX_KEY_LEN, SharedClock, Timestamp};

use crate::dead_letter::NewDeadLetter;
use crate::publish::{Destination, Message};

/// Where an enqueued message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// To this destination, whatever relay publishes it.
    To(&'a Destination),
    /// To the relay's default destination (`idem relay --to`). A relay without
    /// one leaves such rows for a relay that has one.
    Default,
}

impl<'a> From<&'a Destination> for Route<'a> {
    fn from(destination: &'a Destination) -> Self {
        Self::To(destination)
    }
}

impl Route<'_> {
    pub(crate) fn stored(self) -> Option<String> {
        match self {
            Self::To(destination) => Some(destination.to_string()),
            Self::Default => None,
        }
    }
}

/// The key of a message caused by the operation keyed `parent`, for one
/// `purpose` (`"email"`, `"order-created"`): `parent/purpose`, or — when that
/// would be longer than 255 characters — a prefix of it and a hash of the
/// whole, so it is always a valid key and always the same for the same inputs.
///
/// ```
/// use idem_broker::outbox::derive_key;
/// use idem_core::IdempotencyKey;
///
/// let request = IdempotencyKey::new("9b2f-checkout").unwrap();
/// let email = derive_key(&request, "email").unwrap();
/// assert_eq!(email.as_str(), "9b2f-checkout/email");
/// // A retry of the same request makes the same message key.
/// assert_eq!(derive_key(&request, "email").unwrap(), email);
///
/// let long = IdempotencyKey::new("k".repeat(255)).unwrap();
/// let derived = derive_key(&long, "email").unwrap();
/// assert_eq!(derived.as_str().len(), 255);
/// assert_ne!(derived, derive_key(&long, "sms").unwrap());
/// ```
pub fn derive_key(parent: &IdempotencyKey, purpose: &str) -> Result<IdempotencyKey, KeyError> {
    let whole = format!("{parent}/{purpose}");
    if whole.len() <= MAX_KEY_LEN {
        return IdempotencyKey::new(whole);
    }
    // Validate the purpose on its own, so a bad one is reported as such.
    IdempotencyKey::new(purpose)?;
    let digest = blake3::hash(whole.as_bytes()).to_hex();
    let hash = &digest[..32];
    let keep = MAX_KEY_LEN - hash.len() - 1;
    IdempotencyKey::new(format!("{}~{hash}", &whole[..keep]))
}

/// A business transaction an outbox message can join: a `rusqlite`
/// connection or transaction (the enqueue is done when the call returns), or
/// a sqlx PostgreSQL connection (the enqueue is a future to await).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{IdempotencyKey, SqliteStore};
/// use idem_broker::outbox::{self, OutboxStore};
/// use idem_broker::publish::{Destination, Message};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let to: Destination = "http://127.0.0.1:9/hooks/orders".parse()?;
/// let message = Message::new(IdempotencyKey::new("order-1/created")?, b"{}".to_vec());
/// store
///     .with_connection(move |conn| -> Result<(), idem::Error> {
///         let tx = conn.transaction().expect("begin");
///         outbox::enqueue(&tx, &to, &message)?; // a rusqlite transaction: done at once
///         tx.commit().expect("commit");
///         Ok(())
///     })
///     .await??;
/// assert_eq!(store.outbox_stats().await?.pending, 1);
/// # Ok(()) }
/// ```
pub trait Transaction<'c> {
    /// `Result<i64, Error>` on SQLite; a future of it on PostgreSQL.
    type Enqueued;

    /// Enqueues `message` in this transaction; see [`enqueue`].
    fn enqueue_in(self, route: Route<'_>, message: &Message) -> Self::Enqueued;
}

impl<'c> Transaction<'c> for &'c idem::sqlite::rusqlite::Connection {
    type Enqueued = Result<i64, Error>;

    fn enqueue_in(self, route: Route<'_>, message: &Message) -> Self::Enqueued {
        sqlite::enqueue(self, route, message)
    }
}

impl<'c> Transaction<'c> for &'c idem::sqlite::rusqlite::Transaction<'_> {
    type Enqueued = Result<i64, Error>;

    fn enqueue_in(self, route: Route<'_>, message: &Message) -> Self::Enqueued {
        sqlite::enqueue(self, route, message)
    }
}

impl<'c> Transaction<'c> for &'c mut sqlx::PgConnection {
    type Enqueued = futures::future::BoxFuture<'c, Result<i64, Error>>;

    fn enqueue_in(self, route: Route<'_>, message: &Message) -> Self::Enqueued {
        let destination = route.stored();
        let message = message.clone();
        Box::pin(async move { postgres::insert(self, destination, &message).await })
    }
}

/// Enqueues `message` inside the caller's business transaction, on either
/// database: `outbox::enqueue(tx, &destination, &message)?` with a `rusqlite`
/// transaction, `outbox::enqueue(conn, &destination, &message).await?` with a
/// `&mut PgConnection`. The same as [`sqlite::enqueue`] and
/// [`postgres::enqueue`]. Returns the row id.
pub fn enqueue<'c, 'r, T: Transaction<'c>>(
    tx: T,
    route: impl Into<Route<'r>>,
    message: &Message,
) -> T::Enqueued {
    tx.enqueue_in(route.into(), message)
}

/// Creates or upgrades the outbox and dead-letter tables on `store`. Safe to
/// run again, and from several processes at once.
pub async fn migrate(store: &AnyStore) -> Result<(), Error> {
    each_store!(store, s => s.migrate_outbox().await)
}

/// A row claimed by a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The row's id (its order of insertion; commits may come in another order).
    pub id: i64,
    /// Where it goes, as stored: `None` for the relay's default.
    pub destination: Option<String>,
    /// The message.
    pub message: Message,
    /// Attempts so far, this one included (the claim counts it, so a relay
    /// that dies while publishing still uses up an attempt).
    pub attempts: u32,
    /// When it was enqueued.
    pub created_at: Timestamp,
}

/// How far behind the outbox is: the rows waiting and the oldest of them, which
/// [`observe_stats`] reports as the outbox lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Rows waiting to be published.
    pub pending: u64,
    /// Rows published and kept until the retention ends.
    pub sent: u64,
    /// When the oldest waiting row was enqueued.
    pub oldest_pending: Option<Timestamp>,
}

/// Reports the outbox lag as gauges (`outbox_pending`, `outbox_lag_seconds`).
pub fn observe_stats(stats: &OutboxStats, now: Timestamp) {
    metrics::gauge!("outbox_pending").set(stats.pending as f64);
    let lag = stats
        .oldest_pending
        .map_or(0.0, |oldest| oldest.until(now).as_secs_f64());
    metrics::gauge!("outbox_lag_seconds").set(lag);
}

/// What a relay needs from the store that holds the outbox. Implemented by
/// [`idem::SqliteStore`], [`idem::PgStore`] and [`AnyStore`].
///
/// Rows are claimed by *state*, never by an id high-water mark: a row that
/// committed late with a smaller id than rows already sent is found by the next
/// pass all the same.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem::{AnyStore, Clock, IdempotencyKey, StoreLocation};
/// use idem_broker::outbox::{self, OutboxStore, Route};
/// use idem_broker::publish::Message;
///
/// let dir = tempfile::tempdir()?;
/// let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db"))).await?;
/// let message = Message::new(IdempotencyKey::new("k-1")?, b"{}".to_vec());
/// outbox::enqueue_now(&store, Route::Default, &message).await?;
/// let now = store.outbox_clock().now();
/// let lease = Duration::from_secs(30);
/// let claimed = store.claim("relay-a", now, lease, 10, true).await?;
/// assert_eq!((claimed.len(), claimed[0].attempts), (1, 1));
/// // Leased: another relay finds nothing to claim.
/// assert!(store.claim("relay-b", now, lease, 10, true).await?.is_empty());
/// store.mark_sent(&[claimed[0].id], now).await?;
/// assert_eq!(store.outbox_stats().await?.sent, 1);
/// # Ok(()) }
/// ```
pub trait OutboxStore: Send + Sync {
    /// The store's clock.
    fn outbox_clock(&self) -> SharedClock;

    /// Creates or upgrades the outbox and dead-letter tables.
    fn migrate_outbox(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Claims up to `limit` due rows for `owner` until `now + lease`, counting
    /// one attempt on each; rows routed to the relay's default only if
    /// `with_default`. Rows held by another relay's live lease are skipped, not
    /// waited for.
    fn claim(
        &self,
        owner: &str,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        with_default: bool,
    ) -> impl Future<Output = Result<Vec<Pending>, Error>> + Send;

    /// Marks rows sent (whoever holds them: they were published).
    fn mark_sent(
        &self,
        ids: &[i64],
        now: Timestamp,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Gives a row held by `owner` back, due again at `due`, with `attempts`
    /// and the last error. `false` if `owner` no longer held it.
    fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: Timestamp,
        error: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Moves a row held by `owner` to the dead letters, in one transaction.
    /// `None` if `owner` no longer held it; else the dead letter's id.
    fn bury(
        &self,
        id: i64,
        owner: &str,
        letter: &NewDeadLetter,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<i64>, Error>> + Send;

    /// Deletes at most `limit` rows sent before `before`.
    fn sweep_sent(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Counts for metrics.
    fn outbox_stats(&self) -> impl Future<Output = Result<OutboxStats, Error>> + Send;

    /// A source of "something was enqueued" signals, where the database has
    /// one (PostgreSQL's LISTEN/NOTIFY); `None` means poll.
    fn wake_ups(&self) -> impl Future<Output = Result<Option<postgres::WakeUps>, Error>> + Send;
}

impl OutboxStore for AnyStore {
    fn outbox_clock(&self) -> SharedClock {
        match self {
            AnyStore::Sqlite(s) => s.outbox_clock(),
            AnyStore::Postgres(s) => s.outbox_clock(),
            #[allow(unreachable_patterns)]
            _ => std::sync::Arc::new(idem_core::SystemClock),
        }
    }

    async fn migrate_outbox(&self) -> Result<(), Error> {
        each_store!(self, s => s.migrate_outbox().await)
    }

    async fn claim(
        &self,
        owner: &str,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        with_default: bool,
    ) -> Result<Vec<Pending>, Error> {
        each_store!(self, s => s.claim(owner, now, lease, limit, with_default).await)
    }

    async fn mark_sent(&self, ids: &[i64], now: Timestamp) -> Result<u64, Error> {
        each_store!(self, s => s.mark_sent(ids, now).await)
    }

    async fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: Timestamp,
        error: &str,
    ) -> Result<bool, Error> {
        each_store!(self, s => s.retry_later(id, owner, attempts, due, error).await)
    }

    async fn bury(
        &self,
        id: i64,
        owner: &str,
        letter: &NewDeadLetter,
        now: Timestamp,
    ) -> Result<Option<i64>, Error> {
        each_store!(self, s => s.bury(id, owner, letter, now).await)
    }

    async fn sweep_sent(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_sent(before, limit).await)
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        each_store!(self, s => s.outbox_stats().await)
    }

    async fn wake_ups(&self) -> Result<Option<postgres::WakeUps>, Error> {
        each_store!(self, s => s.wake_ups().await)
    }
}

/// Enqueues outside any business transaction, in a transaction of its own:
/// for messages that are not the consequence of a database change (and for
/// tests). Returns the row id.
pub async fn enqueue_now(
    store: &AnyStore,
    route: Route<'_>,
    message: &Message,
) -> Result<i64, Error> {
    migrate(store).await?;
    match store {
        AnyStore::Sqlite(s) => sqlite::enqueue_now(s, route, message).await,
        AnyStore::Postgres(s) => {
            let mut conn = s
                .pool()
                .acquire()
                .await
                .map_err(|e| crate::db::postgres("connect", e))?;
            postgres::enqueue(&mut conn, route, message).await
        }
        #[allow(unreachable_patterns)]
        _ => Err(crate::db::unsupported_store()),
    }
}

pub(crate) fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The error of an enqueue into a database whose outbox table is missing.
pub(crate) fn not_migrated(error: Error) -> Error {
    match &error {
        Error::Store(e) if e.kind() == idem_core::ErrorKind::Corrupt => {
            idem_core::StoreError::with_source(
                idem_core::ErrorKind::Corrupt,
                "the outbox table is missing: call idem_broker::outbox::migrate(&store) once at start-up (running `idem relay` once against this store also creates it)",
                error,
            )
            .into()
        }
        _ => error,
    }
}
