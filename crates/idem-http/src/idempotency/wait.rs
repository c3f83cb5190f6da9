//! A concurrent duplicate waiting for its original ([`Concurrent::Wait`]):
//! the waiters of one process, per key, and how they are woken.
//!
//! # How a waiter learns the answer
//!
//! Waiters on one key share a slot: a `watch` channel that ends in the
//! original's stored answer, or in "ended without one". The waiters read no
//! database themselves:
//!
//! - the process whose request holds the claim wakes its own waiters when it
//!   stores the answer, releases the key or ends with an unknown outcome, and
//!   hands them the answer;
//! - for waiters whose original runs in another process, one task per slot
//!   (a key's *watcher*) reads the record once when the first waiter comes,
//!   then again each time the store says something changed: on PostgreSQL a
//!   notification (`LISTEN`/`NOTIFY`, one listening connection per layer),
//!   elsewhere a re-read with a backoff from 50 ms doubling to 1 s.
//!
//! The slot goes when its last waiter leaves (answered, timed out, or its
//! client gone). Waiters are capped per key and in all
//! ([`WaiterCaps`](super::WaiterCaps)); a duplicate past a cap gets its 409
//! at once.

// Without PostgreSQL there are no notifications to hear or send.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::response::Response;
use idem_core::{Error, Fingerprint, IdempotencyKey, Outcome, RecordState, Scope, Timestamp};
use tokio::sync::{Notify, OnceCell, watch};
use tokio::task::AbortHandle;

use super::config::WaiterCaps;
use super::notices::{self, FIRST_REREAD, KeyId, LONGEST_REREAD, Notices, Settled, WaitableStore};
use super::problem::Refusal;
use super::{Concurrent, Shared};
use crate::StoredResponse;
use crate::key_header::mark_expiry;

/// Concurrent duplicates that waited, by `result`: `replayed` (answered with
/// the original's stored answer), `timed_out` (409 when the wait ran out),
/// `ended_unknown` (409: the original ended without a stored answer),
/// `over_cap` (409 at once: too many waiters on the key or in all).
pub const CONCURRENT_WAITS_TOTAL: &str = "http_concurrent_waits_total";

/// The hash of `(scope, key)`.
pub(crate) fn key_id(scope: &Scope, key: &IdempotencyKey) -> KeyId {
    let mut hasher = blake3::Hasher::new_derive_key("idem-http 2026 a key waited on");
    hasher.update(scope.as_str().as_bytes());
    hasher.update(&[0]);
    hasher.update(key.as_str().as_bytes());
    *hasher.finalize().as_bytes()
}

/// Where a key's waiting stands.
#[derive(Debug, Clone)]
pub(crate) enum Wake {
    /// The original is still running.
    Waiting,
    /// Its answer is stored, with the fingerprint of its request.
    Stored(Arc<Outcome>, Fingerprint, Timestamp),
    /// It ended without a stored answer (released, unknown outcome, or the
    /// record is gone).
    Ended,
}

/// One key's waiters in this process.
struct Slot {
    waiting: usize,
    wake: Arc<watch::Sender<Wake>>,
    reread: Arc<Notify>,
    watcher: Option<AbortHandle>,
}

#[derive(Default)]
struct Keys {
    slots: HashMap<KeyId, Slot>,
    total: usize,
}

/// The waiters of one layer.
pub(crate) struct Waiters {
    caps: WaiterCaps,
    keys: Mutex<Keys>,
    /// Whether notifications from other processes are being heard now; when
    /// not, watchers re-read with backoff.
    hearing: AtomicBool,
    listener: OnceCell<Option<AbortOnDrop>>,
}

/// Aborts its task when dropped (with the layer).
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A place among a key's waiters, given back when dropped.
struct Ticket {
    waiters: Arc<Waiters>,
    id: KeyId,
    wake: watch::Receiver<Wake>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut keys = self.waiters.lock();
        keys.total = keys.total.saturating_sub(1);
        if let Some(slot) = keys.slots.get_mut(&self.id) {
            slot.waiting = slot.waiting.saturating_sub(1);
            if slot.waiting == 0 {
                let slot = keys
                    .slots
                    .remove(&self.id)
                    .expect("the slot was just found");
                if let Some(watcher) = slot.watcher {
                    watcher.abort();
                }
            }
        }
    }
}

/// Why a duplicate could not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OverCap {
    PerKey,
    Total,
}

impl Waiters {
    pub(crate) fn new(caps: WaiterCaps) -> Self {
        Self {
            caps,
            keys: Mutex::new(Keys::default()),
            hearing: AtomicBool::new(false),
            listener: OnceCell::new(),
        }
    }

    /// How many wait now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the waiters of `id`; `start` makes the key's watcher when this
    /// is the first one.
    fn join(
        self: &Arc<Self>,
        id: KeyId,
        start: impl FnOnce(Arc<watch::Sender<Wake>>, Arc<Notify>) -> AbortHandle,
    ) -> Result<Ticket, OverCap> {
        let mut keys = self.lock();
        if keys.total >= self.caps.total {
            return Err(OverCap::Total);
        }
        let receiver = match keys.slots.get_mut(&id) {
            Some(slot) => {
                if slot.waiting >= self.caps.per_key {
                    return Err(OverCap::PerKey);
                }
                slot.waiting += 1;
                slot.wake.subscribe()
            }
            None => {
                let wake = Arc::new(watch::Sender::new(Wake::Waiting));
                let reread = Arc::new(Notify::new());
                let receiver = wake.subscribe();
                let watcher = start(Arc::clone(&wake), Arc::clone(&reread));
                keys.slots.insert(
                    id,
                    Slot {
                        waiting: 1,
                        wake,
                        reread,
                        watcher: Some(watcher),
                    },
                );
                receiver
            }
        };
        keys.total += 1;
        Ok(Ticket {
            waiters: Arc::clone(self),
            id,
            wake: receiver,
        })
    }

    /// Hands `wake` to the waiters of `id` in this process, if any (the
    /// first final word stands).
    pub(crate) fn settle(&self, id: &KeyId, wake: Wake) {
        let keys = self.lock();
        if let Some(slot) = keys.slots.get(id) {
            finish(&slot.wake, wake);
        }
    }

    /// Asks the watcher of `id` to read the record again.
    fn reread(&self, id: &KeyId) {
        if let Some(slot) = self.lock().slots.get(id) {
            slot.reread.notify_one();
        }
    }

    /// Asks every watcher to read again: notifications may have been missed.
    fn reread_all(&self) {
        for slot in self.lock().slots.values() {
            slot.reread.notify_one();
        }
    }

    /// Starts listening for other processes' settlements, once per layer,
    /// when the store can tell them.
    async fn listen(self: &Arc<Self>, notices: &Notices) {
        self.listener
            .get_or_init(|| async {
                match notices {
                    Notices::Reread => None,
                    #[cfg(feature = "postgres")]
                    Notices::Postgres(pool) => {
                        let (ready, listening) = tokio::sync::oneshot::channel();
                        let task = tokio::spawn(listen_postgres(
                            pool.clone(),
                            Arc::downgrade(self),
                            ready,
                        ));
                        // Until the first LISTEN is answered (or fails), the
                        // first watcher's read could miss a notification.
                        listening.await.ok();
                        Some(AbortOnDrop(task.abort_handle()))
                    }
                }
            })
            .await;
    }
}

/// Sets the slot's final word unless it has one.
fn finish(sender: &watch::Sender<Wake>, wake: Wake) {
    sender.send_if_modified(|current| {
        if matches!(current, Wake::Waiting) && !matches!(wake, Wake::Waiting) {
            *current = wake;
            true
        } else {
            false
        }
    });
}

/// Hears `NOTIFY idem_settled` from every process on the database and hands
/// each to the waiters of its key. While the connection is down, watchers
/// re-read with backoff; when it is back, each reads once, for what was
/// missed.
#[cfg(feature = "postgres")]
async fn listen_postgres(
    pool: idem_postgres::sqlx::PgPool,
    waiters: std::sync::Weak<Waiters>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    use idem_postgres::sqlx::postgres::PgListener;
    let mut ready = Some(ready);
    let mut pause = FIRST_REREAD;
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(notices::CHANNEL).await?;
            Ok::<_, idem_postgres::sqlx::Error>(listener)
        }
        .await;
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for settled keys; waiting duplicates re-read the record until the connection is back");
                ready.take().map(|ready| ready.send(()));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_REREAD);
                continue;
            }
        };
        pause = FIRST_REREAD;
        let Some(alive) = waiters.upgrade() else {
            return;
        };
        alive.hearing.store(true, Ordering::SeqCst);
        alive.reread_all();
        drop(alive);
        ready.take().map(|ready| ready.send(()));
        loop {
            let heard = listener.try_recv().await;
            let Some(alive) = waiters.upgrade() else {
                return;
            };
            match heard {
                Ok(Some(notification)) => match notices::parse_payload(notification.payload()) {
                    Some((id, Settled::Stored)) => alive.reread(&id),
                    Some((id, Settled::Ended)) => alive.settle(&id, Wake::Ended),
                    None => {}
                },
                // The connection was lost and made again: what was said
                // meanwhile is lost, so every watcher reads once.
                Ok(None) => alive.reread_all(),
                Err(error) => {
                    tracing::warn!(%error, "lost the connection that hears settled keys; waiting duplicates re-read the record until it is back");
                    alive.hearing.store(false, Ordering::SeqCst);
                    alive.reread_all();
                    break;
                }
            }
        }
    }
}

/// Reads the record of a key waited on until it is settled or released,
/// and says so to the slot: at once, then on every nudge (a
/// notification), or with backoff while the store says nothing.
async fn watch_key<St: WaitableStore + 'static>(
    shared: Arc<Shared<St>>,
    scope: Scope,
    key: IdempotencyKey,
    wake: Arc<watch::Sender<Wake>>,
    reread: Arc<Notify>,
) {
    let waiters = &shared.waiters;
    waiters.listen(&shared.store.notices()).await;
    let mut delay = FIRST_REREAD;
    loop {
        match shared.store.get(&scope, &key).await {
            Ok(Some(record)) if record.state.is_settled() => {
                let outcome = record.outcome.map_or(Wake::Ended, |outcome| {
                    Wake::Stored(Arc::new(outcome), record.fingerprint, record.expires_at)
                });
                return finish(&wake, outcome);
            }
            Ok(Some(record))
                if record.state == RecordState::InFlight && record.lease_until.is_some() => {}
            // Released: no lease.
            Ok(Some(_)) => return finish(&wake, Wake::Ended),
            // Not visible yet (a claim answered before its commit is read),
            // or swept: the wait's bound decides.
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(scope = scope.as_str(), %error, "could not read a key waited on; reading again");
            }
        }
        if waiters.hearing.load(Ordering::SeqCst) {
            reread.notified().await;
        } else {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = reread.notified() => {}
            }
            delay = (delay * 2).min(LONGEST_REREAD);
        }
    }
}

/// A concurrent duplicate of a running original, when the layer waits: the
/// original's stored answer (a replay) as soon as it is stored, or 409
/// (`in_flight`, with its `Retry-After`) when the wait runs out, the original
/// ends without one, or too many wait already.
pub(super) async fn for_original<St: WaitableStore + 'static>(
    shared: &Arc<Shared<St>>,
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: Fingerprint,
    in_flight: Error,
) -> Response {
    let mode = shared.config.mode;
    let Concurrent::Wait(up_to) = shared.config.concurrent else {
        return Refusal::from_store(in_flight, true).to_response(mode);
    };
    let refuse = |result: &'static str| {
        metrics::counter!(CONCURRENT_WAITS_TOTAL, "result" => result).increment(1);
        Refusal::from_store(in_flight, true).to_response(mode)
    };
    let joined = shared.waiters.join(key_id(scope, key), |wake, reread| {
        tokio::spawn(watch_key(
            Arc::clone(shared),
            scope.clone(),
            key.clone(),
            wake,
            reread,
        ))
        .abort_handle()
    });
    let mut ticket = match joined {
        Ok(ticket) => ticket,
        Err(over) => {
            tracing::info!(
                scope = scope.as_str(),
                cap = ?over,
                "a concurrent duplicate is answered 409 at once: too many are waiting"
            );
            return refuse("over_cap");
        }
    };
    let answered = tokio::time::timeout(up_to, async {
        ticket
            .wake
            .wait_for(|wake| !matches!(wake, Wake::Waiting))
            .await
            .map(|wake| wake.clone())
            .ok()
    })
    .await;
    let Ok(wake) = answered else {
        tracing::info!(scope = scope.as_str(), waited = ?up_to, "the original did not answer within the wait; 409");
        return refuse("timed_out");
    };
    drop(ticket);
    match wake {
        Some(Wake::Stored(outcome, stored_for, expires_at)) if stored_for == fingerprint => {
            match StoredResponse::from_outcome(Outcome::clone(&outcome)) {
                Ok(stored) => {
                    metrics::counter!(CONCURRENT_WAITS_TOTAL, "result" => "replayed").increment(1);
                    let mut response = stored.into_replay();
                    mark_expiry(response.headers_mut(), expires_at);
                    response
                }
                Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(mode),
            }
        }
        _ => refuse("ended_unknown"),
    }
}

/// Tells the waiters of a claimed key what became of its original: its own
/// process's at once, other processes' through the store's notifications.
/// Dropped without a word, it says the original ended without an answer.
pub(super) struct Announce<St: WaitableStore + 'static> {
    shared: Option<Arc<Shared<St>>>,
    id: KeyId,
    fingerprint: Fingerprint,
}

impl<St: WaitableStore + 'static> Announce<St> {
    /// For the claim of `(scope, key)`; says nothing unless the layer waits.
    pub(super) fn new(
        shared: &Arc<Shared<St>>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Self {
        let waits = matches!(shared.config.concurrent, Concurrent::Wait(_));
        Self {
            shared: waits.then(|| Arc::clone(shared)),
            id: key_id(scope, key),
            fingerprint,
        }
    }

    /// The fingerprint of the request whose answer this announces.
    pub(super) fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The answer is stored, and its key remembered until `expires_at`.
    pub(super) fn stored(mut self, outcome: &Outcome, expires_at: Timestamp) {
        if let Some(shared) = self.shared.take() {
            shared.waiters.settle(
                &self.id,
                Wake::Stored(Arc::new(outcome.clone()), self.fingerprint, expires_at),
            );
            announce_elsewhere(&shared, self.id, Settled::Stored);
        }
    }
}

impl<St: WaitableStore + 'static> Drop for Announce<St> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.waiters.settle(&self.id, Wake::Ended);
            announce_elsewhere(&shared, self.id, Settled::Ended);
        }
    }
}

/// Sends the notification in a task of its own, so the original's answer
/// does not wait for it.
fn announce_elsewhere<St: WaitableStore + 'static>(
    shared: &Arc<Shared<St>>,
    id: KeyId,
    settled: Settled,
) {
    let notices = shared.store.notices();
    if matches!(notices, Notices::Reread) {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { notices::announce(&notices, id, settled).await });
    }
}
