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
    Timestamp,
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

    /// When the record that answered a duplicate of `message` was made (its
    /// key's first claim, by the store's clock), for the duplicate's log
    /// line. `None` where the dedupe happens elsewhere (the sidecar's
    /// endpoint) or the record cannot be read; the default knows none.
    fn recorded_at(
        &self,
        message: &KeyedMessage,
    ) -> impl Future<Output = Option<Timestamp>> + Send {
        let _ = message;
        std::future::ready(None)
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

    async fn recorded_at(&self, message: &KeyedMessage) -> Option<Timestamp> {
        created_at(&self.store, message).await
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

/// A batch's effect in the store's transaction as **one** call for all its
/// new messages, for any [`AtomicStore`]: the set-based form of
/// [`AtomicApply`], through [`AtomicStore::apply_set`].
///
/// The effect is given as a function of the new messages (each key's first
/// occurrence, in order) that returns the `async` closure to run in the
/// transaction; the closure answers one [`Outcome`] per message, in the same
/// order. Written as one statement over the whole set (PostgreSQL's `UNNEST`
/// of arrays bound as parameters), a batch costs the same round trips
/// whatever its size, which is what makes batches pay off once the database
/// is a network hop away. A single message (outside a batch) is a set of one.
///
/// A failing effect rolls back the whole batch, which the runtime then
/// applies message by message; its error is reported against the batch's
/// first message.
pub struct AtomicSetApply<S, H, E> {
    store: S,
    effect: Arc<H>,
    error: PhantomData<fn() -> E>,
}

impl<S: fmt::Debug, H, E> fmt::Debug for AtomicSetApply<S, H, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtomicSetApply")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl<S, H, F, E> AtomicSetApply<S, H, E>
where
    S: AtomicStore,
    H: Fn(Vec<Arc<KeyedMessage>>) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, Vec<Outcome>, E>,
    E: fmt::Display + Send + 'static,
{
    /// The set effect `effect` applied through `store`.
    ///
    /// ```
    /// # async fn demo(store: idem::PgStore) {
    /// use idem::Outcome;
    /// use idem_broker::consume::AtomicSetApply;
    /// let record = AtomicSetApply::new(store, |messages| async move |tx| -> idem::sqlx::Result<Vec<Outcome>> {
    ///     let ids: Vec<String> = messages.iter().map(|m| m.key.as_str().to_owned()).collect();
    ///     let bodies: Vec<Vec<u8>> = messages.iter().map(|m| m.payload().to_vec()).collect();
    ///     // One statement, one round trip, for the whole batch.
    ///     idem::sqlx::query("INSERT INTO events (id, body) SELECT * FROM UNNEST($1::text[], $2::bytea[])")
    ///         .bind(&ids)
    ///         .bind(&bodies)
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     Ok(messages.iter().map(|_| Outcome::success("recorded")).collect())
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

impl<S, H, F, E> Apply for AtomicSetApply<S, H, E>
where
    S: AtomicStore + RecordStore + ConsumerStore,
    H: Fn(Vec<Arc<KeyedMessage>>) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, Vec<Outcome>, E>,
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

    async fn recorded_at(&self, message: &KeyedMessage) -> Option<Timestamp> {
        created_at(&self.store, message).await
    }

    async fn apply(&self, message: Arc<KeyedMessage>) -> Result<Applied, ApplyError<E>> {
        let ops = [message.operation()];
        let effect = Arc::clone(&self.effect);
        let mut answers = self
            .store
            .apply_set(&ops, move |_| effect(vec![message]))
            .await?;
        answers
            .pop()
            .expect("one answer per operation")
            .map_err(ApplyError::Protocol)
    }
}

impl<S, H, F, E> ApplyBatch for AtomicSetApply<S, H, E>
where
    S: AtomicStore + RecordStore + ConsumerStore,
    H: Fn(Vec<Arc<KeyedMessage>>) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, Vec<Outcome>, E>,
    E: fmt::Display + Send + 'static,
{
    async fn apply_batch(&self, messages: Vec<Arc<KeyedMessage>>) -> BatchAnswer<E> {
        let ops: Vec<Operation> = messages.iter().map(|m| m.operation()).collect();
        let effect = Arc::clone(&self.effect);
        self.store
            .apply_set(&ops, move |new| {
                effect(new.iter().map(|&i| Arc::clone(&messages[i])).collect())
            })
            .await
            .map_err(|error| match error {
                ApplyError::Effect(error) => ApplyError::Effect((0, error)),
                ApplyError::Protocol(error) => ApplyError::Protocol(error),
            })
    }
}

/// When the record of `message`'s key was made, read from `store`.
async fn created_at<S: RecordStore>(store: &S, message: &KeyedMessage) -> Option<Timestamp> {
    match store.get(&message.scope, &message.key).await {
        Ok(record) => record.map(|r| r.created_at),
        Err(error) => {
            tracing::debug!(%error, "could not read the record that answered a duplicate");
            None
        }
    }
}
