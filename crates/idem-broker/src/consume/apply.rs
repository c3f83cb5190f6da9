//! What a consumer does with a keyed message: apply its effect once.
//!
//! In atomic mode the user's effect receives the store's open transaction,
//! exactly as with the library: `&rusqlite::Transaction` on SQLite,
//! `&mut PgConnection` on PostgreSQL. The runtime goes through the store's own
//! `apply` (or `apply_batch`), so the effect's writes and the dedupe record
//! commit together, and only then does the runtime ack. [`SqliteApply`] and
//! [`PgApply`] put a store and an effect together; the sidecar's HTTP
//! forwarder ([`crate::forward`]) is another implementation of [`Apply`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use idem::sqlite::rusqlite::Transaction;
use idem::{PgStore, SqliteStore};
use idem_core::{Applied, ApplyError, Error, Operation, Outcome};
use sqlx::PgConnection;

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

/// The effect on SQLite: runs on the store's writer thread, in its
/// `BEGIN IMMEDIATE` transaction.
pub struct SqliteApply<F> {
    store: SqliteStore,
    effect: Arc<F>,
}

impl<F> fmt::Debug for SqliteApply<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteApply")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl<F, E> SqliteApply<F>
where
    F: Fn(&Transaction<'_>, &KeyedMessage) -> Result<Outcome, E> + Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    /// The effect `effect` applied through `store`.
    ///
    /// ```
    /// # async fn demo(store: idem::SqliteStore) {
    /// use idem::Outcome;
    /// use idem_broker::consume::SqliteApply;
    /// let debit = SqliteApply::new(store, |tx, message| {
    ///     let amount: i64 = std::str::from_utf8(message.payload()).unwrap_or("0").parse().unwrap_or(0);
    ///     tx.execute("UPDATE accounts SET balance = balance - ?1 WHERE id = 1", [amount])?;
    ///     Ok::<_, idem::sqlite::rusqlite::Error>(Outcome::success("debited"))
    /// });
    /// # }
    /// ```
    pub fn new(store: SqliteStore, effect: F) -> Self {
        Self {
            store,
            effect: Arc::new(effect),
        }
    }
}

impl<F, E> Apply for SqliteApply<F>
where
    F: Fn(&Transaction<'_>, &KeyedMessage) -> Result<Outcome, E> + Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    type Error = E;
    type Store = SqliteStore;

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    fn dedupe_window(&self) -> Option<Duration> {
        Some(self.store.settings().retention)
    }

    async fn apply(&self, message: Arc<KeyedMessage>) -> Result<Applied, ApplyError<E>> {
        let effect = Arc::clone(&self.effect);
        let (scope, key, fingerprint) = (
            message.scope.clone(),
            message.key.clone(),
            message.fingerprint,
        );
        self.store
            .apply(&scope, &key, fingerprint, move |tx| effect(tx, &message))
            .await
    }
}

impl<F, E> ApplyBatch for SqliteApply<F>
where
    F: Fn(&Transaction<'_>, &KeyedMessage) -> Result<Outcome, E> + Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    async fn apply_batch(&self, messages: Vec<Arc<KeyedMessage>>) -> BatchAnswer<E> {
        let ops: Vec<Operation> = messages.iter().map(|m| m.operation()).collect();
        let effect = Arc::clone(&self.effect);
        self.store
            .apply_batch(&ops, move |tx, i| effect(tx, &messages[i]))
            .await
    }
}

/// The effect on PostgreSQL: runs on the connection of the store's
/// transaction, so its SQL commits with the record.
pub struct PgApply<F> {
    store: PgStore,
    effect: Arc<F>,
}

impl<F> fmt::Debug for PgApply<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgApply")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl<F, E> PgApply<F>
where
    F: for<'c> Fn(&'c mut PgConnection, &'c KeyedMessage) -> BoxFuture<'c, Result<Outcome, E>>
        + Send
        + Sync
        + 'static,
    E: fmt::Display + Send + 'static,
{
    /// The effect `effect` applied through `store`.
    ///
    /// ```
    /// # async fn demo(store: idem::PgStore) {
    /// use futures::FutureExt;
    /// use idem::Outcome;
    /// use idem_broker::consume::PgApply;
    /// let debit = PgApply::new(store, |conn, message| {
    ///     async move {
    ///         sqlx::query("INSERT INTO ledger (key) VALUES ($1)")
    ///             .bind(message.key.as_str())
    ///             .execute(&mut *conn)
    ///             .await?;
    ///         Ok::<_, sqlx::Error>(Outcome::success("recorded"))
    ///     }
    ///     .boxed()
    /// });
    /// # }
    /// ```
    pub fn new(store: PgStore, effect: F) -> Self {
        Self {
            store,
            effect: Arc::new(effect),
        }
    }
}

impl<F, E> Apply for PgApply<F>
where
    F: for<'c> Fn(&'c mut PgConnection, &'c KeyedMessage) -> BoxFuture<'c, Result<Outcome, E>>
        + Send
        + Sync
        + 'static,
    E: fmt::Display + Send + 'static,
{
    type Error = E;
    type Store = PgStore;

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn dedupe_window(&self) -> Option<Duration> {
        Some(self.store.settings().retention)
    }

    /// A first delivery (the broker counts one) is most likely new, so its
    /// key is claimed first ([`PgStore::apply_claim_first`]); a redelivery
    /// looks for a stored outcome first ([`PgStore::apply`]). Both answer a
    /// duplicate the same way.
    async fn apply(&self, message: Arc<KeyedMessage>) -> Result<Applied, ApplyError<E>> {
        let effect = Arc::clone(&self.effect);
        let keyed = Arc::clone(&message);
        let effect = on_connection(move |conn| async move { effect(conn, &keyed).await }.boxed());
        let (scope, key, fingerprint) = (&message.scope, &message.key, message.fingerprint);
        if message.message.delivery_count == Some(1) {
            self.store
                .apply_claim_first(scope, key, fingerprint, effect)
                .await
        } else {
            self.store.apply(scope, key, fingerprint, effect).await
        }
    }
}

impl<F, E> ApplyBatch for PgApply<F>
where
    F: for<'c> Fn(&'c mut PgConnection, &'c KeyedMessage) -> BoxFuture<'c, Result<Outcome, E>>
        + Send
        + Sync
        + 'static,
    E: fmt::Display + Send + 'static,
{
    async fn apply_batch(&self, messages: Vec<Arc<KeyedMessage>>) -> BatchAnswer<E> {
        let ops: Vec<Operation> = messages.iter().map(|m| m.operation()).collect();
        let effect = &self.effect;
        self.store
            .apply_batch(&ops, move |conn, i| {
                let effect = Arc::clone(effect);
                let keyed = Arc::clone(&messages[i]);
                async move { effect(conn, &keyed).await }.boxed()
            })
            .await
    }
}

/// `effect` as the stores' atomic apply takes it: the closure's signature
/// spelled out, which inference does not find on its own.
fn on_connection<F, E>(effect: F) -> F
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Outcome, E>>,
{
    effect
}
