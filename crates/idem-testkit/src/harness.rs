//! The seam between the generic conformance suite and one store: a few
//! operations whose effect is a real row update in the store's own database.
//!
//! The operations are written once, here, against the store contracts
//! ([`AtomicStore`], [`LeaseStore`]); a store's test file supplies only what
//! differs per database: how to open it, and the SQL of the test tables
//! (`counters` and `registers`).

use std::future::Future;
use std::sync::{Arc, Mutex};

use idem_core::{
    Applied, ApplyError, AtomicStore, BatchApplied, Claim, Error, FenceStore, Fingerprint, Guard,
    GuardOrdering, IdempotencyKey, LeaseStore, ManualClock, Operation, Outcome, RecordStore, Scope,
    SetApplied,
};
use tokio::sync::oneshot;

/// What the test effect does besides adding to its counter.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Adds and succeeds; the outcome body is the counter's new value.
    Succeed,
    /// Adds, then fails with a retryable error (the addition must roll back).
    FailRetryable,
    /// Does not add; returns a terminal failure outcome (stored and replayed).
    FailTerminal,
    /// Signals that it started, then waits to be let through before adding.
    Gate(Arc<Gate>),
}

/// A one-shot rendezvous with an effect that is running.
#[derive(Debug)]
pub struct Gate {
    entered: Mutex<Option<oneshot::Sender<()>>>,
    proceed: Mutex<Option<oneshot::Receiver<()>>>,
}

/// The test's side of a [`Gate`].
#[derive(Debug)]
pub struct GateControl {
    /// Resolves when the effect has started.
    pub entered: oneshot::Receiver<()>,
    /// Send to let the effect finish.
    pub proceed: oneshot::Sender<()>,
}

impl Gate {
    /// A gate and its control.
    pub fn new() -> (Arc<Gate>, GateControl) {
        let (entered_tx, entered) = oneshot::channel();
        let (proceed, proceed_rx) = oneshot::channel();
        (
            Arc::new(Gate {
                entered: Mutex::new(Some(entered_tx)),
                proceed: Mutex::new(Some(proceed_rx)),
            }),
            GateControl { entered, proceed },
        )
    }

    /// Called by the effect: reports entry and returns the receiver to wait on.
    pub fn enter(&self) -> oneshot::Receiver<()> {
        if let Some(entered) = self.entered.lock().expect("gate poisoned").take() {
            let _ = entered.send(());
        }
        self.proceed
            .lock()
            .expect("gate poisoned")
            .take()
            .expect("a gate is passed once")
    }
}

/// The body of the test effect's outcome: the counter's value after the addition.
pub fn counter_outcome(value: i64) -> Outcome {
    Outcome::success(value.to_string()).with_meta("effect", "add")
}

/// The outcome [`Effect::FailTerminal`] returns.
pub fn terminal_outcome() -> Outcome {
    Outcome::terminal_failure("declined").with_meta("reason", "card_declined")
}

/// The error [`Effect::FailRetryable`] returns.
pub const RETRYABLE_FAILURE: &str = "upstream unavailable";

/// An operation in scope `scope` with key `key` and a payload hashed as given.
pub fn op(scope: &str, key: &str, payload: &str) -> Operation {
    Operation::new(
        Scope::new(scope).expect("test scope"),
        IdempotencyKey::new(key).expect("test key"),
        Fingerprint::of_bytes(payload.as_bytes()),
    )
}

/// The connection a harness's store hands its atomic effects.
pub type TxOf<H> = <<H as Harness>::Store as AtomicStore>::Tx;

/// The guard of register rows for `ordering`: their `version` column for
/// [`GuardOrdering::Version`], their `fence` column for [`GuardOrdering::Fence`].
pub fn register_guard(ordering: GuardOrdering) -> Guard {
    let column = match ordering {
        GuardOrdering::Version => "version",
        GuardOrdering::Fence => "fence",
    };
    Guard::new("registers", "name", column, ordering).expect("a valid guard")
}

/// One store under test, with a manual clock and the test tables.
///
/// A store's test file implements the required items (opening the store, and
/// the test tables' SQL in [`Harness::add`], [`Harness::guarded_set_in`],
/// [`Harness::read_counter`] and [`Harness::read_register`]); the operations
/// the suite runs are provided, written once against the contracts.
pub trait Harness: Sized + Send + Sync + 'static {
    /// The store.
    type Store: AtomicStore + LeaseStore + RecordStore + FenceStore + Clone + 'static;

    /// Whether atomic applies go through [`AtomicStore::apply_replay_first`]
    /// rather than [`AtomicStore::apply`]. Same answers; the suite runs both.
    const REPLAY_FIRST: bool = false;

    /// A store on a fresh, empty database with a [`ManualClock`] and the test
    /// tables, or `None` (after printing why) when the database server is not
    /// reachable and services are not required.
    fn fresh() -> impl Future<Output = Option<Self>> + Send;

    /// Another handle on the same database (another process would use
    /// [`Harness::location`]) sharing the clock.
    fn reopen(&self) -> impl Future<Output = Self> + Send;

    /// Opens the database at `location` (as given by [`Harness::location`]).
    fn open(location: &str, clock: ManualClock) -> impl Future<Output = Self> + Send;

    /// Another handle on the same database, sharing the clock, whose store
    /// keeps tombstones for `grace` (`Settings::with_tombstones`).
    fn with_tombstones(&self, grace: std::time::Duration) -> impl Future<Output = Self> + Send;

    /// Where the database is, for a child process.
    fn location(&self) -> String;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// The clock the store reads.
    fn clock(&self) -> &ManualClock;

    /// In the caller's transaction: adds `amount` to counter `counter`
    /// (creating it at 0) and returns its new value.
    fn add(
        tx: &mut TxOf<Self>,
        counter: &str,
        amount: i64,
    ) -> impl Future<Output = Result<i64, String>> + Send;

    /// In the caller's transaction: advances `guard` of register `register`
    /// (creating the row at 0) to `carried` with the store's guarded-write
    /// helper, then sets its value and adds 1 to counter `writes:<register>`.
    /// A stale write changes nothing and returns the helper's `Stale` error.
    fn guarded_set_in(
        store: &Self::Store,
        tx: &mut TxOf<Self>,
        guard: &Guard,
        register: &str,
        value: i64,
        carried: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The counter's value (0 if never written).
    fn read_counter(
        tx: &mut TxOf<Self>,
        counter: &str,
    ) -> impl Future<Output = Result<i64, String>> + Send;

    /// The register's `(value, version, fence)`.
    fn read_register(
        tx: &mut TxOf<Self>,
        register: &str,
    ) -> impl Future<Output = Result<(i64, i64, i64), String>> + Send;

    /// Atomic apply (replay first or not, per [`Harness::REPLAY_FIRST`]).
    fn apply<F, E>(
        &self,
        op: &Operation,
        effect: F,
    ) -> impl Future<Output = Result<Applied, ApplyError<E>>> + Send
    where
        F: idem_core::AtomicEffect<TxOf<Self>, Outcome, E>,
        E: Send + 'static,
    {
        async move {
            let store = self.store();
            if Self::REPLAY_FIRST {
                store
                    .apply_replay_first(&op.scope, &op.key, op.fingerprint, effect)
                    .await
            } else {
                store
                    .apply(&op.scope, &op.key, op.fingerprint, effect)
                    .await
            }
        }
    }

    /// Atomic apply whose effect adds `amount` to counter `counter` in the same
    /// transaction, behaving as `effect` says.
    fn apply_add(
        &self,
        op: &Operation,
        counter: &str,
        amount: i64,
        effect: Effect,
    ) -> impl Future<Output = Result<Applied, ApplyError<String>>> + Send {
        let counter = counter.to_owned();
        self.apply(op, async move |tx: &mut TxOf<Self>| {
            run_effect::<Self>(tx, &counter, amount, effect).await
        })
    }

    /// Batch apply; operation `i` adds `adds[i].1` to counter `adds[i].0`.
    /// An amount of `i64::MIN` makes that operation's effect fail.
    fn apply_batch_add(
        &self,
        ops: &[Operation],
        adds: &[(String, i64)],
    ) -> impl Future<Output = BatchApplied<String>> + Send {
        let adds = adds.to_vec();
        self.store().apply_batch(ops, move |i| {
            let (counter, amount) = adds[i].clone();
            async move |tx: &mut TxOf<Self>| {
                if amount == i64::MIN {
                    return Err("refused by the test".to_owned());
                }
                run_effect::<Self>(tx, &counter, amount, Effect::Succeed).await
            }
        })
    }

    /// Set apply: one effect for the batch's new operations, adding
    /// `adds[i].1` to counter `adds[i].0` for each new `i`, in order, and
    /// answering each new value. It records the indexes it was given in
    /// `given`. An amount of `i64::MIN` makes the effect fail; `i64::MAX`
    /// makes it leave that operation's outcome out.
    fn apply_set_add(
        &self,
        ops: &[Operation],
        adds: &[(String, i64)],
        given: Arc<Mutex<Vec<usize>>>,
    ) -> impl Future<Output = SetApplied<String>> + Send {
        let adds = adds.to_vec();
        self.store().apply_set(ops, move |new: Vec<usize>| {
            given.lock().expect("given").clone_from(&new);
            async move |tx: &mut TxOf<Self>| {
                let mut outcomes = Vec::with_capacity(new.len());
                for i in new {
                    let (counter, amount) = adds[i].clone();
                    match amount {
                        i64::MIN => return Err("refused by the test".to_owned()),
                        i64::MAX => continue,
                        _ => {}
                    }
                    outcomes.push(run_effect::<Self>(tx, &counter, amount, Effect::Succeed).await?);
                }
                Ok(outcomes)
            }
        })
    }

    /// An effect outside the protocol: adds `amount` to `counter` in a
    /// transaction of its own, as a call to another system would.
    fn add_outside(&self, counter: &str, amount: i64) -> impl Future<Output = i64> + Send {
        let counter = counter.to_owned();
        async move {
            self.store()
                .transaction(async move |tx: &mut TxOf<Self>| Self::add(tx, &counter, amount).await)
                .await
                .expect("the outside effect")
        }
    }

    /// Leased completion whose effect adds `amount` to `counter` in the same
    /// transaction as the fenced completion.
    fn complete_add(
        &self,
        claim: &Claim,
        counter: &str,
        amount: i64,
    ) -> impl Future<Output = Result<Outcome, ApplyError<String>>> + Send {
        let counter = counter.to_owned();
        self.store()
            .complete_with(claim, async move |tx: &mut TxOf<Self>| {
                run_effect::<Self>(tx, &counter, amount, Effect::Succeed).await
            })
    }

    /// The counter's value (0 if never written).
    fn counter(&self, counter: &str) -> impl Future<Output = i64> + Send {
        let counter = counter.to_owned();
        async move {
            self.store()
                .transaction(async move |tx: &mut TxOf<Self>| {
                    Self::read_counter(tx, &counter).await
                })
                .await
                .expect("read a counter")
        }
    }

    /// In one transaction: [`Harness::guarded_set_in`] with the register's
    /// guard for `ordering`.
    fn guarded_set(
        &self,
        register: &str,
        value: i64,
        carried: i64,
        ordering: GuardOrdering,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let register = register.to_owned();
        let store = self.store().clone();
        async move {
            let done = self
                .store()
                .transaction(async move |tx: &mut TxOf<Self>| {
                    let guard = register_guard(ordering);
                    Self::guarded_set_in(&store, tx, &guard, &register, value, carried).await
                })
                .await;
            done.map_err(|e| match e {
                ApplyError::Protocol(error) | ApplyError::Effect(error) => error,
            })
        }
    }

    /// Atomic apply of a versioned `set(register, value)` message: the effect is
    /// [`Harness::guarded_set_in`] with a version guard; a stale version is
    /// stored as the terminal outcome [`stale_outcome`], so its duplicates
    /// replay it.
    fn apply_versioned_set(
        &self,
        op: &Operation,
        register: &str,
        value: i64,
        version: i64,
    ) -> impl Future<Output = Result<Applied, ApplyError<String>>> + Send {
        let register = register.to_owned();
        let store = self.store().clone();
        self.apply(op, async move |tx: &mut TxOf<Self>| {
            let guard = register_guard(GuardOrdering::Version);
            match Self::guarded_set_in(&store, tx, &guard, &register, value, version).await {
                Ok(()) => Ok(set_outcome(value)),
                Err(Error::Stale { .. }) => Ok(stale_outcome()),
                Err(other) => Err(other.to_string()),
            }
        })
    }

    /// The register's `(value, version, fence)`.
    fn register(&self, register: &str) -> impl Future<Output = (i64, i64, i64)> + Send {
        let register = register.to_owned();
        async move {
            self.store()
                .transaction(async move |tx: &mut TxOf<Self>| {
                    Self::read_register(tx, &register).await
                })
                .await
                .expect("read a register")
        }
    }
}

/// The test effect: adds to the counter in the store's transaction,
/// behaving as `effect` says.
async fn run_effect<H: Harness>(
    tx: &mut TxOf<H>,
    counter: &str,
    amount: i64,
    effect: Effect,
) -> Result<Outcome, String> {
    match &effect {
        Effect::FailTerminal => return Ok(terminal_outcome()),
        Effect::Gate(gate) => {
            let _ = gate.enter().await;
        }
        _ => {}
    }
    let value = H::add(tx, counter, amount).await?;
    match effect {
        Effect::FailRetryable => Err(RETRYABLE_FAILURE.to_owned()),
        _ => Ok(counter_outcome(value)),
    }
}

/// The outcome stored for a versioned message that arrived after a newer one.
pub fn stale_outcome() -> Outcome {
    Outcome::terminal_failure("stale version").with_meta("reason", "stale")
}

/// The outcome of an applied versioned message.
pub fn set_outcome(value: i64) -> Outcome {
    Outcome::success(value.to_string()).with_meta("effect", "set")
}
