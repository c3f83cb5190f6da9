//! The transactional outbox: a message is written to a table of the store in
//! the same transaction as the business change that caused it, and a relay
//! publishes it afterwards, at least once, with the message's own key.
//!
//! Why the contract lives here: the outbox table is the store's (created by
//! its migrations), the enqueue must run on the store's own transaction
//! ([`AtomicStore::Tx`]), and the relay's statements differ per database.
//! So each store implements two traits:
//!
//! - [`AtomicOutbox::enqueue`], on the connection of a transaction the store
//!   opened (the effect of [`AtomicStore::apply`], or
//!   [`AtomicStore::transaction`]): the message commits or rolls back with
//!   the business change;
//! - [`OutboxStore`], what a relay needs: claim due rows under a lease, mark
//!   them sent, give them back for later, move them to the dead letters,
//!   sweep, count.
//!
//! Rows are claimed by *state* (pending, due, not leased), never by an id
//! high-water mark: ids are taken when a transaction inserts and committed in
//! another order, and a row that commits late with a smaller id is found by
//! the next claim all the same.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::atomic::AtomicStore;
use crate::clock::{SharedClock, Timestamp};
use crate::dead_letter::NewDeadLetter;
use crate::error::Error;
use crate::key::IdempotencyKey;

/// A message to enqueue: where it goes, its own key, its body and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Where the relay publishes it, as a destination URL; `None` for the
    /// relay's default destination.
    pub destination: Option<String>,
    /// The message's own idempotency key, which every hop after the relay
    /// dedupes on.
    pub key: IdempotencyKey,
    /// The body.
    pub payload: Vec<u8>,
    /// Headers for the transport.
    pub headers: BTreeMap<String, String>,
}

/// A row claimed by a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The row's id (its order of insertion; commits may come in another order).
    pub id: i64,
    /// The message as enqueued.
    pub message: OutboxMessage,
    /// Attempts so far, this one included (the claim counts it, so a relay
    /// that dies while publishing still uses up an attempt).
    pub attempts: u32,
    /// When it was enqueued.
    pub created_at: Timestamp,
}

/// How far behind the outbox is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Rows waiting to be published.
    pub pending: u64,
    /// Rows published and kept until the retention ends.
    pub sent: u64,
    /// When the oldest waiting row was enqueued.
    pub oldest_pending: Option<Timestamp>,
}

/// A message the relay published, as the outbox keeps it until the sweep
/// removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    /// The row's id.
    pub id: i64,
    /// Where it was published; `None` for the relay's default destination.
    pub destination: Option<String>,
    /// The message's own key.
    pub key: IdempotencyKey,
    /// Attempts it took, the one that succeeded included.
    pub attempts: u32,
    /// When it was enqueued.
    pub created_at: Timestamp,
    /// When it was marked sent.
    pub sent_at: Timestamp,
}

/// "Something was enqueued" signals, from a database that sends them
/// (PostgreSQL's LISTEN/NOTIFY). A hint, not a queue: the relay polls too.
pub trait WakeUps: Send {
    /// Waits for the next signal. A broken source reports a signal (after a
    /// short pause) rather than an error, so the relay polls once and the
    /// source reconnects on the next call.
    fn next(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// What a relay needs from the store that holds the outbox.
pub trait OutboxStore: Send + Sync {
    /// The store's clock, which leases and due times are read from.
    fn outbox_clock(&self) -> SharedClock;

    /// Enqueues `message` in a transaction of its own, outside any business
    /// transaction: for messages that are not the consequence of a database
    /// change. Returns the row id.
    fn enqueue_now(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<i64, Error>> + Send;

    /// Claims up to `limit` due rows for `owner` until `now + lease`, counting
    /// one attempt on each; rows routed to the relay's default only if
    /// `with_default`. Rows held by another relay's live lease are skipped, not
    /// waited for. In id order.
    fn claim_outbox(
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

    /// The `limit` messages sent last (and not swept yet), the newest first.
    fn recent_sends(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SentMessage>, Error>> + Send;

    /// A source of "something was enqueued" signals, where the database has
    /// one; `None` means poll.
    fn wake_ups(&self) -> impl Future<Output = Result<Option<Box<dyn WakeUps>>, Error>> + Send;
}

/// The enqueue inside the caller's business transaction: on the connection
/// the store hands an atomic effect, so the message commits or rolls back
/// with the change that caused it.
///
/// An associated function, not a method: inside an effect there is no store
/// at hand, only its connection. Name the store type to call it
/// (`<SqliteStore as AtomicOutbox>::enqueue(tx, &message)`), or use a wrapper
/// that knows it.
pub trait AtomicOutbox: AtomicStore + OutboxStore {
    /// Writes `message` on `tx`, inside its transaction. Returns the row id.
    fn enqueue(
        tx: &mut Self::Tx,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<i64, Error>> + Send;
}
