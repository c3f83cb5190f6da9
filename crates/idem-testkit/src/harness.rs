//! The seam between the generic conformance suite and one store: a few
//! operations whose effect is a real row update in the store's own database.

use std::future::Future;
use std::sync::{Arc, Mutex};

use idem_core::{
    Applied, ApplyError, Claim, Error, FenceStore, GuardOrdering, LeaseStore, ManualClock,
    Operation, Outcome, RecordStore,
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
    /// Stops the process for good at a crash point (see [`crate::crash`]).
    Crash(crate::crash::CrashPoint),
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

/// One store under test, with a manual clock and a counters table.
pub trait Harness: Sized + Send + Sync + 'static {
    /// The store.
    type Store: LeaseStore + RecordStore + FenceStore + Clone + 'static;

    /// A store on a fresh, empty database with a [`ManualClock`], or `None`
    /// (after printing why) when the database server is not reachable and
    /// services are not required.
    fn fresh() -> impl Future<Output = Option<Self>> + Send;

    /// Another handle on the same database (another process would use
    /// [`Harness::location`]) sharing the clock.
    fn reopen(&self) -> impl Future<Output = Self> + Send;

    /// Opens the database at `location` (as given by [`Harness::location`]).
    fn open(location: &str, clock: ManualClock) -> impl Future<Output = Self> + Send;

    /// Where the database is, for a child process.
    fn location(&self) -> String;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// The clock the store reads.
    fn clock(&self) -> &ManualClock;

    /// Atomic apply whose effect adds `amount` to counter `counter` in the same
    /// transaction, behaving as `effect` says.
    fn apply_add(
        &self,
        op: &Operation,
        counter: &str,
        amount: i64,
        effect: Effect,
    ) -> impl Future<Output = Result<Applied, ApplyError<String>>> + Send;

    /// Batch apply; operation `i` adds `adds[i].1` to counter `adds[i].0`.
    /// An amount of `i64::MIN` makes that operation's effect fail.
    #[allow(clippy::type_complexity)]
    fn apply_batch_add(
        &self,
        ops: &[Operation],
        adds: &[(String, i64)],
    ) -> impl Future<Output = Result<Vec<Result<Applied, Error>>, ApplyError<(usize, String)>>> + Send;

    /// Leased completion whose effect adds `amount` to `counter` in the same
    /// transaction as the fenced completion.
    fn complete_add(
        &self,
        claim: &Claim,
        counter: &str,
        amount: i64,
    ) -> impl Future<Output = Result<Outcome, ApplyError<String>>> + Send;

    /// The counter's value (0 if never written).
    fn counter(&self, counter: &str) -> impl Future<Output = i64> + Send;

    /// In one transaction: advance the guard of register `register` (its
    /// `version` column for [`GuardOrdering::Version`], its `fence` column for
    /// [`GuardOrdering::Fence`]) to `carried` with the store's guarded-write
    /// helper, then set its value and add 1 to counter `writes:<register>`.
    /// A stale write changes nothing and returns the helper's `Stale` error.
    fn guarded_set(
        &self,
        register: &str,
        value: i64,
        carried: i64,
        ordering: GuardOrdering,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Atomic apply of a versioned `set(register, value)` message: the effect is
    /// [`Harness::guarded_set`] with a version guard; a stale version is stored as
    /// the terminal outcome [`stale_outcome`], so its duplicates replay it.
    fn apply_versioned_set(
        &self,
        op: &Operation,
        register: &str,
        value: i64,
        version: i64,
    ) -> impl Future<Output = Result<Applied, ApplyError<String>>> + Send;

    /// The register's `(value, version, fence)`.
    fn register(&self, register: &str) -> impl Future<Output = (i64, i64, i64)> + Send;
}

/// The outcome stored for a versioned message that arrived after a newer one.
pub fn stale_outcome() -> Outcome {
    Outcome::terminal_failure("stale version").with_meta("reason", "stale")
}

/// The outcome of an applied versioned message.
pub fn set_outcome(value: i64) -> Outcome {
    Outcome::success(value.to_string()).with_meta("effect", "set")
}
