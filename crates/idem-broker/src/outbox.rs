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
//! [`Outbox::enqueue`]`(tx, destination, message)` takes the connection a
//! store hands an atomic effect ([`AtomicStore::Tx`](idem_core::AtomicStore::Tx):
//! a `rusqlite::Connection` inside the store's `BEGIN IMMEDIATE` on SQLite, a
//! `sqlx::PgConnection` on PostgreSQL) and is written once for every store,
//! over [`AtomicOutbox`]. [`enqueue_now`] enqueues in a transaction of its
//! own, for messages that are not the consequence of a database change.
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
//! The enqueue also stores the trace context of the span it runs in
//! (`traceparent`, `tracestate`) among the message's headers, unless the
//! message has one already; the relay publishes it as a message header, and
//! the consumer's span continues it, so the operation that enqueued, the
//! publish and every delivery of the message are one trace.
//!
//! The table is the store's: created by the store's own migrations (when a
//! `SqliteStore` opens, when a `PgStore` connects with `migrate(true)`, or by
//! [`migrate`]), and its statements are in the store crates.

use std::fmt;
use std::marker::PhantomData;

use idem_core::{
    Error, IdempotencyKey, KeyError, MAX_KEY_LEN, OutboxMessage, RecordStore, Timestamp,
};

pub use idem_core::{AtomicOutbox, OutboxStats, OutboxStore, Pending};

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
    fn stored(self) -> Option<String> {
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

/// The message as the outbox stores it, with the current span's trace
/// context (`traceparent`, `tracestate`) among its headers unless the caller
/// put one there: the relay's publish and the consumer continue that trace.
fn as_stored(route: Route<'_>, message: &Message) -> OutboxMessage {
    let mut headers = message.headers.clone();
    idem_trace::inject_current_if_absent(&mut headers);
    OutboxMessage {
        destination: route.stored(),
        key: message.key.clone(),
        payload: message.payload.clone(),
        headers,
    }
}

/// The outbox of a store of type `S`: enqueues on the connection of a
/// transaction `S` opened. A zero-sized handle, `Copy` and `'static`, so an
/// effect closure can take it along.
///
/// Written once for every store: the same call on SQLite (the connection is
/// a `rusqlite::Connection` inside the store's `BEGIN IMMEDIATE`), on
/// PostgreSQL (a `sqlx::PgConnection` inside the store's transaction, or one
/// of the application's own), and on an `AnyStore`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope, SqliteStore};
/// use idem_broker::outbox::{Outbox, OutboxStore, derive_key};
/// use idem_broker::publish::{Destination, Message};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let outbox = Outbox::of(&store);
/// let to: Destination = "nats://127.0.0.1:4222/orders.created".parse()?;
/// let request = IdempotencyKey::new("checkout-7")?;
/// let message = Message::new(derive_key(&request, "order-created")?, b"{\"order\":7}".to_vec());
/// for _retry in 0..2 {
///     let (to, message) = (to.clone(), message.clone());
///     store
///         .apply(&Scope::new("checkout")?, &request, Fingerprint::of_bytes(b"cart"), async move |tx| -> Result<Outcome, Box<dyn std::error::Error + Send + Sync>> {
///             tx.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER); INSERT INTO orders VALUES (7);")?;
///             outbox.enqueue(tx, &to, &message).await?; // commits with the order
///             Ok(Outcome::success("ordered"))
///         })
///         .await?;
/// }
/// // The retry was a replay: one order, one message.
/// assert_eq!(store.outbox_stats().await?.pending, 1);
/// # Ok(()) }
/// ```
pub struct Outbox<S> {
    store: PhantomData<fn() -> S>,
}

impl<S> Clone for Outbox<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Outbox<S> {}

impl<S> fmt::Debug for Outbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Outbox<{}>", std::any::type_name::<S>())
    }
}

impl<S: AtomicOutbox> Default for Outbox<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: AtomicOutbox> Outbox<S> {
    /// The outbox of stores of type `S`.
    pub fn new() -> Self {
        Self { store: PhantomData }
    }

    /// The outbox of `store`'s type (the type named by a value at hand).
    pub fn of(store: &S) -> Self {
        let _ = store;
        Self::new()
    }

    /// Enqueues `message` on `tx`, inside the caller's business transaction:
    /// it commits or rolls back with the business change. Returns the row id.
    pub async fn enqueue(
        self,
        tx: &mut S::Tx,
        route: impl Into<Route<'_>>,
        message: &Message,
    ) -> Result<i64, Error> {
        S::enqueue(tx, &as_stored(route.into(), message)).await
    }
}

/// Enqueues outside any business transaction, in a transaction of its own:
/// for messages that are not the consequence of a database change (and for
/// tests). Returns the row id.
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
/// // What a relay does with it: claim it under a lease, publish, mark it sent.
/// let now = store.outbox_clock().now();
/// let lease = Duration::from_secs(30);
/// let claimed = store.claim_outbox("relay-a", now, lease, 10, true).await?;
/// assert_eq!((claimed.len(), claimed[0].attempts), (1, 1));
/// // Leased: another relay finds nothing to claim.
/// assert!(store.claim_outbox("relay-b", now, lease, 10, true).await?.is_empty());
/// store.mark_sent(&[claimed[0].id], now).await?;
/// assert_eq!(store.outbox_stats().await?.sent, 1);
/// # Ok(()) }
/// ```
pub async fn enqueue_now<S: OutboxStore>(
    store: &S,
    route: Route<'_>,
    message: &Message,
) -> Result<i64, Error> {
    store.enqueue_now(&as_stored(route, message)).await
}

/// Creates or upgrades `store`'s schema, the outbox and dead-letter tables
/// with the rest: the store's own migrations
/// ([`RecordStore::migrate`]). Safe to run again, and from several processes
/// at once.
pub async fn migrate<S: RecordStore>(store: &S) -> Result<(), Error> {
    store.migrate().await
}

/// Reports the outbox lag as gauges (`outbox_pending`, `outbox_lag_seconds`).
pub fn observe_stats(stats: &OutboxStats, now: Timestamp) {
    metrics::gauge!("outbox_pending").set(stats.pending as f64);
    let lag = stats
        .oldest_pending
        .map_or(0.0, |oldest| oldest.until(now).as_secs_f64());
    metrics::gauge!("outbox_lag_seconds").set(lag);
}
