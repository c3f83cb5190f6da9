//! The atomic contract: the effect is a write to the store's own database, so
//! it and the record commit in one transaction.
//!
//! Every SQL store implements [`AtomicStore`], and everything above the stores
//! (HTTP routes, broker consumers, the outbox, the test kit, the command line)
//! is written once against it. Only the effect itself — the user's SQL — is
//! written per database, because it receives the store's own connection:
//! [`AtomicStore::Tx`] is `rusqlite::Connection` on SQLite and
//! `sqlx::PgConnection` on PostgreSQL, inside the transaction the store opened.
//!
//! # Effects are async closures
//!
//! An effect is an `async` closure taking `&mut Tx`:
//!
//! ```
//! # async fn demo<S: idem_core::AtomicStore<Tx = u64>>(store: &S) -> Result<(), idem_core::ApplyError<std::io::Error>> {
//! use idem_core::{Fingerprint, IdempotencyKey, Outcome, Scope};
//! # let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
//! let applied = store
//!     .apply(&scope, &key, Fingerprint::of_bytes(b"+1"), async |counter| {
//!         *counter += 1; // the effect's writes, in the store's transaction
//!         Ok::<_, std::io::Error>(Outcome::success("added"))
//!     })
//!     .await?;
//! # let _ = applied; Ok(()) }
//! ```
//!
//! The closure owns what it captures (`'static`): on SQLite it runs on the
//! store's writer thread. The future it returns may borrow the connection and
//! must be `Send`, so the whole apply can be spawned. [`AtomicEffect`] names
//! this shape once; it is implemented for every closure that has it.
//!
//! Why `&mut Connection` on SQLite rather than `&rusqlite::Transaction`: the
//! effect's future must be `Send`, and a `Transaction` borrows its connection
//! shared (`Connection` is not `Sync`). The connection is inside the store's
//! `BEGIN IMMEDIATE`; `savepoint()` on it nests, and the store commits.

use std::future::Future;

use crate::error::{ApplyError, Error, ErrorKind};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::outcome::Outcome;
use crate::store::{Applied, Claim, Operation};

/// One call of an effect on a connection borrowed for `'c`: the closure
/// shape behind [`AtomicEffect`], spelled so that the future's `Send` can be
/// named. Implemented for every `FnOnce(&'c mut Tx) -> impl Future + Send`.
pub trait TxCall<'c, Tx: ?Sized + 'c, R>: Send {
    /// The future the call returns.
    type Future: Future<Output = R> + Send + 'c;

    /// Runs the effect on `tx`.
    fn call(self, tx: &'c mut Tx) -> Self::Future;
}

impl<'c, Tx, R, F, Fut> TxCall<'c, Tx, R> for F
where
    Tx: ?Sized + 'c,
    F: FnOnce(&'c mut Tx) -> Fut + Send,
    Fut: Future<Output = R> + Send + 'c,
{
    type Future = Fut;

    fn call(self, tx: &'c mut Tx) -> Fut {
        self(tx)
    }
}

/// An effect run inside a store's transaction: an `async` closure that takes
/// the store's connection and returns `Result<T, E>` (an [`Outcome`] for
/// [`AtomicStore::apply`]). Implemented for every such closure; there is
/// nothing to implement by hand.
pub trait AtomicEffect<Tx: ?Sized, T, E>:
    AsyncFnOnce(&mut Tx) -> Result<T, E> + for<'c> TxCall<'c, Tx, Result<T, E>> + Send + 'static
{
}

impl<Tx, T, E, F> AtomicEffect<Tx, T, E> for F
where
    Tx: ?Sized,
    F: AsyncFnOnce(&mut Tx) -> Result<T, E> + for<'c> TxCall<'c, Tx, Result<T, E>> + Send + 'static,
{
}

/// What a batch apply answers: one result per operation, in order, or the
/// effect failure that rolled the whole batch back, with its operation's index.
pub type BatchApplied<E> = Result<Vec<Result<Applied, Error>>, ApplyError<(usize, E)>>;

/// What a set apply answers: one result per operation, in order, or the
/// failure of the one effect that rolled the whole batch back.
pub type SetApplied<E> = Result<Vec<Result<Applied, Error>>, ApplyError<E>>;

/// The effect of a set apply gave back a number of outcomes other than the
/// number of new operations it was handed: the batch is rolled back and the
/// call panics with this message. For the stores' implementations.
#[doc(hidden)]
pub fn outcome_count_mismatch(new: usize, outcomes: usize) -> String {
    format!(
        "apply_set: the effect was given {new} new operations and returned {outcomes} outcomes; \
         it must return one outcome per operation, in the order it was given them"
    )
}

/// A store whose records live in a database the effect can write to: the
/// effect's writes and the record commit in one transaction, so a crash
/// leaves both or neither.
///
/// Every call follows the [protocol table](crate::protocol): a new key runs the
/// effect and stores its outcome; a duplicate gets the stored outcome and the
/// effect does not run; a key reused with another payload is refused with
/// `KeyReuse`; a key held by a running call is refused with `InFlight` at
/// once. An effect error rolls back the effect's writes and the claim, so the
/// next retry runs it again; return [`Outcome::terminal_failure`] instead to
/// store a failure for replay.
///
/// ```
/// # async fn demo(store: impl idem_core::AtomicStore) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::{Fingerprint, IdempotencyKey, Outcome, Scope};
/// let scope = Scope::new("payments")?;
/// let key = IdempotencyKey::new("order-42")?;
/// for _delivery in 0..3 {
///     let applied = store
///         .apply(&scope, &key, Fingerprint::of_bytes(b"debit 10"), async |_tx| {
///             // the debit, written with `_tx`
///             Ok::<_, std::io::Error>(Outcome::success("debited"))
///         })
///         .await?;
///     assert_eq!(applied.outcome().body, b"debited");
/// }
/// # Ok(()) }
/// ```
pub trait AtomicStore: Send + Sync {
    /// The connection the effect writes with, inside the store's transaction.
    type Tx: ?Sized + Send + 'static;

    /// Applies `effect` once for `(scope, key)`, or replays the stored outcome.
    /// Made for the common case, a key seen for the first time: the key is
    /// claimed (and its record read) before anything else. A duplicate is an
    /// answer, never an error, here or in the database's log.
    fn apply<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> impl Future<Output = Result<Applied, ApplyError<E>>> + Send
    where
        F: AtomicEffect<Self::Tx, Outcome, E>,
        E: Send + 'static;

    /// [`apply`](Self::apply) for work where duplicates are common (a
    /// redelivery, a client known to retry): a stored outcome is looked for
    /// before the key is claimed. Same answers and guarantees; a replay costs
    /// less, a new key more. Stores where the two cost the same answer as
    /// `apply`.
    fn apply_replay_first<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> impl Future<Output = Result<Applied, ApplyError<E>>> + Send
    where
        F: AtomicEffect<Self::Tx, Outcome, E>,
        E: Send + 'static,
    {
        self.apply(scope, key, fingerprint, effect)
    }

    /// Applies a batch in one transaction: all keys are looked up together,
    /// `effect_for(i)` is called for each operation that is new and its effect
    /// runs in the batch's transaction, and one commit settles them all.
    ///
    /// A refusal (`InFlight`, `KeyReuse`) is the answer of that operation
    /// alone; a key repeated inside the batch is answered like a later
    /// duplicate. An effect error rolls back the whole batch and names the
    /// operation's index.
    fn apply_batch<G, F, E>(
        &self,
        ops: &[Operation],
        effect_for: G,
    ) -> impl Future<Output = BatchApplied<E>> + Send
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<Self::Tx, Outcome, E>,
        E: Send + 'static;

    /// Applies a batch in one transaction with **one** effect for all of its
    /// new operations: the set-based form of
    /// [`apply_batch`](Self::apply_batch), for an effect written as one
    /// statement over the whole set (on PostgreSQL, `UNNEST` of arrays bound
    /// as parameters). Per-operation statements cost a round trip each; one
    /// statement costs one, however large the batch.
    ///
    /// `effect_for(new)` is called once, with the indexes into `ops` of the
    /// operations that are new (the first occurrence of each new key, in
    /// order), and its effect must return one outcome per index, in that
    /// order. Their records commit with the effect's writes. Every other
    /// operation is answered as `apply_batch` answers it: a known key
    /// replays, a key repeated in the batch replays its first occurrence (or
    /// is refused as `KeyReuse`), a busy key is `InFlight`. When nothing is
    /// new the effect is not called. An effect error rolls the batch back.
    ///
    /// # Panics
    ///
    /// When the effect returns a number of outcomes other than the number of
    /// indexes it was given (after rolling the batch back).
    fn apply_set<G, F, E>(
        &self,
        ops: &[Operation],
        effect_for: G,
    ) -> impl Future<Output = SetApplied<E>> + Send
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<Self::Tx, Vec<Outcome>, E>,
        E: Send + 'static;

    /// Completes a leased claim whose effect is a write in this database: the
    /// effect and the fenced completion commit together. If the claim was
    /// taken over, the effect does not run and nothing is written: `Fenced`.
    fn complete_with<F, E>(
        &self,
        claim: &Claim,
        effect: F,
    ) -> impl Future<Output = Result<Outcome, ApplyError<E>>> + Send
    where
        F: AtomicEffect<Self::Tx, Outcome, E>,
        E: Send + 'static;

    /// Runs `effect` in a plain transaction of the store's database, with no
    /// key and no record: committed when it returns `Ok`, rolled back when it
    /// returns `Err`. For work that has no key (a keyless request on a route
    /// that does not require one, the application's own schema).
    fn transaction<F, T, E>(
        &self,
        effect: F,
    ) -> impl Future<Output = Result<T, ApplyError<E>>> + Send
    where
        F: AtomicEffect<Self::Tx, T, E>,
        T: Send + 'static,
        E: Send + 'static;

    /// The kind of store failure behind an effect's error, when that error
    /// (or one of its causes) is this store's driver error: how code above
    /// the store tells an effect whose SQL failed because the database went
    /// away ([`ErrorKind::Unavailable`]) from one that failed on its own
    /// terms. `None` when no cause is a driver error, or for stores that do
    /// not say.
    fn effect_error_kind(&self, error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
        let _ = error;
        None
    }
}
