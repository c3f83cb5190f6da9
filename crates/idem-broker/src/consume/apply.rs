//! What a consumer does with a keyed message: apply its effect once.
//!
//! In atomic mode the user's effect runs in the store's transaction, exactly
//! as with the library ([`AtomicStore`]): it gets `&mut rusqlite::Connection`
//! on SQLite, `&mut PgConnection` on PostgreSQL. The runtime goes through the
//! store's own `apply` (or `apply_batch`), so the effect's writes and the
//! dedupe record commit together, and only then does the runtime ack.
//! [`AtomicApply`] puts a store and an effect together, for any store; the
//! sidecar's HTTP forwarder ([`crate::forward`]) is another implementation of
//! [`Apply`].

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, Error, Operation, Outcome, RecordStore,
};

use super::{ConsumerStore, KeyedMessage};

/// Applies one message's effect once, through a store.
pub trait Apply: Send + Sync + 'static {
    /// What the effect fails with. A failure is retryable: its transaction was
    /// rolled back and the message will be redelivered, until the attempts run
    /// out and it is dead-lettered.
    type Error: fmt::Display + Send + 'static;
    /// Where dead letters and failure counts are kept.
    type Store: ConsumerStore;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Applies the message once: its effect and its record commit together,
    /// or a duplicate gets the stored outcome.
    fn apply(
        &self,
        message: Arc<KeyedMessage>,
    ) -> impl Future<Output = Result<Applied, ApplyError<Self::Error>>> + Send;

    /// How long a message's key is remembered after it was applied: a copy
    /// arriving later is applied again. The store's retention for the
    /// stores' own effects; `None` where the dedupe happens elsewhere (the
    /// sidecar's endpoint), which the start-up check then cannot see.
    fn dedupe_window(&self) -> Option<Duration> {
        None
    }

    /// The earliest a retry of a failure is worth it, if the failure says
    /// (an HTTP `Retry-After`). The default knows of none.
    fn retry_hint(&self, error: &Self::Error) -> Option<Duration> {
        let _ = error;
        None
    }

    /// How long to wait before trying again a message whose key is held
    /// elsewhere right now, given the refusal's hint and the runtime's own
    /// growing step. The default takes the shorter: a store's concurrent
    /// duplicate usually commits within milliseconds.
    fn busy_wait(&self, retry_after: Duration, step: Duration) -> Duration {
        step.min(retry_after)
    }
}

/// What a batch apply answers: one result per message, or the failure that
/// rolled the whole batch back (an effect's names its message's index).
pub type BatchAnswer<E> = Result<Vec<Result<Applied, Error>>, ApplyError<(usize, E)>>;

/// Applies many messages in one transaction: one dedupe statement for all
/// keys, the effects of the new ones, one commit.
pub trait ApplyBatch: Apply {
    /// One answer per message, in order. An effect failure rolls the whole
    /// batch back and names the message.
    fn apply_batch(
        &self,
        messages: Vec<Arc<KeyedMessage>>,
    ) -> impl Future<Output = BatchAnswer<Self::Error>> + Send;
}

/// A message's effect in the store's transaction, for any [`AtomicStore`].
///
/// The effect is given as a function of the message that returns the `async`
/// closure to run in the transaction: it owns the message (an `Arc`, cheap to
/// clone) and receives the store's connection.
pub struct AtomicApply<S, H, E> {
    store: S,
    effect: Arc<H>,
    error: PhantomData<fn() -> E>,
}

impl<S: fmt::Debug, H, E> fmt::Debug for AtomicApply<S, H, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtomicApply")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl<S, H, F, E> AtomicApply<S, H, E>
where
    S: AtomicStore,
    H: Fn(Arc<KeyedMessage>) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, Outcome, E>,
    E: fmt::Display + Send + 'static,
{
    /// The effect `effect` applied through `store`.
    ///
    /// ```
    /// # async fn demo(store: idem::SqliteStore) {
    /// use idem::Outcome;
    /// use idem_broker::consume::AtomicApply;
    /// let debit = AtomicApply::new(store, |message| async move |tx| -> idem::rusqlite::Result<Outcome> {
    ///     let amount: i64 = std::str::from_utf8(message.payload()).unwrap_or("0").parse().unwrap_or(0);
    ///     tx.execute("UPDATE accounts SET balance = balance - ?1 WHERE id = 1", [amount])?;
    ///     Ok(Outcome::success("debited"))
    /// });
    /// # }
    /// ```
    pub fn new(store: S, effect: H) -> Self {
        Self {
            store,
            effect: Arc::new(effect),
            error: PhantomData,
        }
    }
}

impl<S, H, F, E> Apply for AtomicApply<S, H, E>
where
    S: AtomicStore + RecordStore + ConsumerStore,
    H: Fn(Arc<KeyedMessage>) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, Outcome, E>,
    E: fmt::Display + Send + 'static,
{
    type Error = E;
    type Store = S;

    fn store(&self) -> &S {
        &self.store
    }

    fn dedupe_window(&self) -> Option<Duration> {
        Some(self.store.settings().retention)
    }

    /// A first delivery (the broker counts one) is most likely new, so its
    /// key is claimed first ([`AtomicStore::apply`]); a redelivery looks for
    /// a stored outcome first ([`AtomicStore::apply_replay_first`]). Both
    /// answer a duplicate the same way.
    async fn apply(&self, message: Arc<KeyedMessage>) -> Result<Applied, ApplyError<E>> {
        let effect = (self.effect)(Arc::clone(&message));
        let (scope, key, fingerprint) = (&message.scope, &message.key, message.fingerprint);
        if message.message.delivery_count == Some(1) {
            self.store.apply(scope, key, fingerprint, effect).await
        } else {
            self.store
                .apply_replay_first(scope, key, fingerprint, effect)
                .await
        }
    }
}

impl<S, H, F, E> ApplyBatch for AtomicApply<S, H, E>
where
    S: AtomicStore + RecordStore + ConsumerStore,
    H: Fn(Arc<KeyedMessage>) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, Outcome, E>,
    E: fmt::Display + Send + 'static,
{
    async fn apply_batch(&self, messages: Vec<Arc<KeyedMessage>>) -> BatchAnswer<E> {
        let ops: Vec<Operation> = messages.iter().map(|m| m.operation()).collect();
        let effect = Arc::clone(&self.effect);
        self.store
            .apply_batch(&ops, move |i| effect(Arc::clone(&messages[i])))
            .await
    }
}
