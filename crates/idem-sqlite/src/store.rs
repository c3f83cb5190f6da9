//! [`SqliteStore`]: the apply protocol on an embedded SQLite file.
//!
//! Every decision is taken by [`idem_core::decide`] inside a `BEGIN IMMEDIATE`
//! transaction on the writer thread, so the record read and the record written
//! cannot be separated by another writer. Before that, two cheap steps answer
//! most duplicates without touching the writer: a read on a reader connection
//! (a settled record is replayed, a reused key refused), and the in-process
//! [hold](crate::holds) that answers a concurrent duplicate `InFlight` at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, BatchApplied, Claim, Claimed, Decision, Error,
    ErrorKind, FencingToken, Fingerprint, IdempotencyKey, LeaseStore, Operation, Outcome, Plan,
    Record, RecordCount, RecordFilter, RecordGlance, RecordState, RecordStore, Scope, SetApplied,
    Settings, SharedClock, SystemClock, Timestamp, TxCall, crash, decide, observe,
    outcome_count_mismatch, protocol,
};
use rusqlite::Connection;

use crate::connection::{ConnectionOptions, Connections, Synchronous};
use crate::holds::{Hold, Holds};
use crate::records::{self, HeldChange};
use crate::schema;
use crate::write_tx::WriteTx;

/// The embedded store. Cheap to clone; clones share the writer thread.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope};
/// use idem_sqlite::SqliteStore;
///
/// let dir = std::env::temp_dir().join(format!("idem-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("idem.db")).await?;
/// let scope = Scope::new("payments")?;
/// let key = IdempotencyKey::new("payment-1")?;
/// let fp = Fingerprint::of_bytes(b"debit 10 from acc-1");
/// for _delivery in 0..3 {
///     store.apply(&scope, &key, fp, async |tx| -> rusqlite::Result<Outcome> {
///         tx.execute("CREATE TABLE IF NOT EXISTS debits (amount INTEGER)", [])?;
///         tx.execute("INSERT INTO debits VALUES (10)", [])?;
///         Ok(Outcome::success("ok"))
///     }).await?;
/// }
/// let debits: i64 = store.with_connection(|c| c.query_row("SELECT count(*) FROM debits", [], |r| r.get(0))).await??;
/// assert_eq!(debits, 1);
/// # std::fs::remove_dir_all(&dir)?; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connections: Connections,
    holds: Holds,
    settings: Settings,
    clock: SharedClock,
}

/// Options for opening a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    settings: Settings,
    clock: SharedClock,
    connection: ConnectionOptions,
}

impl SqliteStoreBuilder {
    /// Lease and retention.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The clock (a [`idem_core::ManualClock`] in tests).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Commit durability; `Full` by default.
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.connection.synchronous = synchronous;
        self
    }

    /// How long to wait for another process's write lock; 5 s by default.
    pub fn busy_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.connection.busy_timeout = timeout;
        self
    }

    /// Opens (creating if needed) the file and brings its schema up to date.
    pub async fn open(self) -> Result<SqliteStore, Error> {
        let connections = Connections::open(self.path, self.connection, schema::migrate).await?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                connections,
                holds: Holds::default(),
                settings: self.settings,
                clock: self.clock,
            }),
        })
    }
}

/// What the writer decided for one key.
enum Step {
    Answer(Result<Outcome, Error>),
    Run(Decision),
}

/// Runs an effect on the writer thread. SQLite calls are synchronous, so the
/// effect's future is driven to completion right here, inside the
/// transaction; awaiting anything else in it would hold up every writer.
fn run_effect<F, T, E>(effect: F, conn: &mut Connection) -> Result<T, E>
where
    F: AtomicEffect<Connection, T, E>,
{
    futures::executor::block_on(TxCall::call(effect, conn))
}

/// On the writer, inside its transaction: reads the record and decides. `Err`
/// carries the stored outcome to replay; refusals are errors.
fn decide_in(
    conn: &Connection,
    protocol: &Protocol<'_>,
    op: &Operation,
) -> Result<Result<(Option<Record>, Decision), Outcome>, Error> {
    let found = records::select(conn, op.scope.as_str(), op.key.as_str())?;
    match protocol.step(found.as_ref(), op) {
        Step::Answer(answer) => answer.map(Err),
        Step::Run(decision) => Ok(Ok((found, decision))),
    }
}

/// Applies `change` to a held claim, or answers `Fenced` with the current token.
fn change_held_in(
    conn: &Connection,
    claim: &Claim,
    change: HeldChange<'_>,
    now: Timestamp,
) -> Result<(), Error> {
    let (scope, key) = (claim.scope.as_str(), claim.key.as_str());
    if records::update_held(conn, scope, key, claim.token, change, now)? {
        return Ok(());
    }
    let current = records::select(conn, scope, key)?.map(|r| r.token);
    Err(fenced(claim, current))
}

/// Reports a protocol answer through metrics and logs, and passes it on.
fn observed(scope: &Scope, answer: Result<Decision, Error>) -> Step {
    match answer {
        Ok(Decision::Replay(outcome)) => {
            observe::replayed(scope);
            Step::Answer(Ok(outcome))
        }
        Ok(decision) => Step::Run(decision),
        Err(refusal) => {
            observe::refused(&refusal);
            Step::Answer(Err(refusal))
        }
    }
}

struct Protocol<'a> {
    settings: &'a Settings,
    now: Timestamp,
}

impl Protocol<'_> {
    fn step(&self, found: Option<&Record>, op: &Operation) -> Step {
        observed(
            &op.scope,
            decide(
                found,
                &op.scope,
                &op.key,
                &op.fingerprint,
                self.now,
                self.settings,
            ),
        )
    }

    /// What carrying out `decision` on `found` writes; a takeover is reported.
    fn plan(&self, found: Option<&Record>, decision: &Decision, scope: &Scope) -> Plan {
        let plan = Plan::of(decision, found, self.now, self.settings)
            .expect("only claims and takeovers are carried out");
        if plan.took_over {
            observe::took_over(scope, plan.token);
        }
        plan
    }
}

fn fenced(claim: &Claim, current: Option<FencingToken>) -> Error {
    let error = Error::Fenced {
        scope: claim.scope.clone(),
        key: claim.key.clone(),
        held: claim.token,
        current,
    };
    observe::refused(&error);
    error
}

/// A key and its scope, as the in-process holds name them.
type KeyPair = (String, String);

impl SqliteStore {
    /// Tries the in-process hold of each distinct key of a batch: the holds
    /// taken (released when dropped) and, per key, whether it was taken.
    fn hold_all(
        &self,
        ops: &[Operation],
    ) -> (HashMap<KeyPair, Option<Hold>>, HashMap<KeyPair, bool>) {
        let mut holds = HashMap::new();
        for op in ops {
            let pair = (op.scope.to_string(), op.key.to_string());
            if let std::collections::hash_map::Entry::Vacant(slot) = holds.entry(pair) {
                let (scope, key) = slot.key();
                let hold = self.inner.holds.try_hold(scope, key);
                slot.insert(hold);
            }
        }
        let held = holds
            .iter()
            .map(|(k, v)| (k.clone(), v.is_some()))
            .collect();
        (holds, held)
    }

    /// Opens `path` with the defaults (lease 60 s, retention 7 days, system
    /// clock, `synchronous=FULL`).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::builder(path).open().await
    }

    /// Starts configuring a store on `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            settings: Settings::default(),
            clock: Arc::new(SystemClock),
            connection: ConnectionOptions::default(),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.inner.connections.path()
    }

    /// Lease and retention.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The store's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    fn protocol(&self) -> Protocol<'_> {
        Protocol {
            settings: &self.inner.settings,
            now: self.inner.clock.now(),
        }
    }

    /// Runs `job` on the write connection, outside the protocol: for the
    /// application's own schema and reads that must see the latest writes.
    pub async fn with_connection<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, Error> {
        self.inner.connections.write(job).await
    }

    /// Answers from a reader connection when the record settles the matter
    /// (replay, key reuse, a live lease); `None` when the writer must decide.
    async fn answer_early(&self, op: &Operation) -> Result<Option<Outcome>, Error> {
        let (scope, key) = (op.scope.to_string(), op.key.to_string());
        let Some(found) = self
            .inner
            .connections
            .read(move |conn| records::select(conn, &scope, &key))
            .await?
        else {
            return Ok(None);
        };
        match self.protocol().step(Some(&found), op) {
            Step::Answer(answer) => answer.map(Some),
            Step::Run(_) => Ok(None),
        }
    }

    fn hold(&self, op: &Operation) -> Result<Hold, Error> {
        self.inner
            .holds
            .try_hold(op.scope.as_str(), op.key.as_str())
            .ok_or_else(|| self.busy(op))
    }

    /// The refusal of a caller whose key another caller holds, reported.
    fn busy(&self, op: &Operation) -> Error {
        let refusal = protocol::busy(&op.scope, &op.key, &self.inner.settings);
        observe::refused(&refusal);
        refusal
    }

    /// Atomic apply's steps: answer from a reader when the record settles the
    /// matter, take the in-process hold, then on the writer read the record,
    /// decide, and — for a claim or takeover — let `carry_out` run the effect
    /// and write the record. All of it runs in a savepoint of a transaction
    /// shared with the other writes queued at the same moment, and is answered
    /// once that transaction has committed: concurrent applies share one
    /// commit and one disk flush (group commit), while a failing effect undoes
    /// only its own savepoint.
    async fn decide_then<R, E>(
        &self,
        op: Operation,
        replayed: fn(Outcome) -> R,
        carry_out: impl FnOnce(
            &mut Connection,
            &Protocol<'_>,
            &Operation,
            Plan,
        ) -> Result<R, ApplyError<E>>
        + Send
        + 'static,
    ) -> Result<R, ApplyError<E>>
    where
        R: Send + 'static,
        E: Send + 'static,
    {
        let _hold = match self.admit(&op).await? {
            Ok(hold) => hold,
            Err(outcome) => return Ok(replayed(outcome)),
        };
        let store = self.clone();
        self.inner
            .connections
            .write_grouped(move |conn| {
                let protocol = store.protocol();
                let (found, decision) = match decide_in(conn, &protocol, &op)? {
                    Ok(claim) => claim,
                    Err(outcome) => return Ok(replayed(outcome)),
                };
                let plan = protocol.plan(found.as_ref(), &decision, &op.scope);
                carry_out(conn, &protocol, &op, plan)
            })
            .await
    }

    /// Lets a caller on to the writer: the stored outcome when a reader already
    /// settles the matter, otherwise the in-process hold on the key (or
    /// `InFlight` when another caller has it).
    async fn admit(&self, op: &Operation) -> Result<Result<Hold, Outcome>, Error> {
        if let Some(outcome) = self.answer_early(op).await? {
            return Ok(Err(outcome));
        }
        self.hold(op).map(Ok)
    }

    /// Changes a held claim on the writer; `Fenced` when the token is no longer
    /// current.
    async fn change_held(
        &self,
        claim: &Claim,
        change: impl FnOnce(Timestamp, &Settings) -> HeldChange<'static> + Send + 'static,
    ) -> Result<Timestamp, Error> {
        let claim = claim.clone();
        let store = self.clone();
        self.inner
            .connections
            .write_grouped(move |conn| {
                let now = store.inner.clock.now();
                change_held_in(conn, &claim, change(now, &store.inner.settings), now)?;
                Ok(now)
            })
            .await
    }
}

/// Atomic mode on SQLite: the effect gets the writer connection inside the
/// store's `BEGIN IMMEDIATE` transaction, on the writer thread, and the record
/// is written and committed with it, in one commit. An effect error rolls the
/// whole transaction back; a panicking effect is rolled back and reported as
/// an error.
impl AtomicStore for SqliteStore {
    type Tx = Connection;

    async fn apply<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        let op = Operation::new(scope.clone(), key.clone(), fingerprint);
        let applied = self
            .decide_then(op, Applied::Replayed, move |tx, protocol, op, plan| {
                crash::point(crash::AFTER_CLAIM);
                let outcome = run_effect(effect, tx).map_err(ApplyError::Effect)?;
                crash::point(crash::INSIDE_EFFECT);
                records::write(tx, &plan.settled(op, outcome.clone(), protocol.now))?;
                Ok(Applied::Fresh(outcome))
            })
            .await;
        if let Ok(Applied::Fresh(_)) = &applied {
            crash::point(crash::AFTER_COMMIT);
        }
        applied
    }

    async fn apply_set<G, F, E>(&self, ops: &[Operation], effect_for: G) -> SetApplied<E>
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<Connection, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        let ops = ops.to_vec();
        let (holds, held) = self.hold_all(&ops);
        if !held.values().any(|held| *held) {
            return Ok(ops.iter().map(|op| Err(self.busy(op))).collect());
        }
        let store = self.clone();
        type Answered<E> =
            Result<Result<Vec<Result<Applied, Error>>, (usize, usize)>, ApplyError<E>>;
        let applied = self
            .inner
            .connections
            .write(move |conn| -> Answered<E> {
                let protocol = store.protocol();
                let mut tx = WriteTx::begin(conn)?;
                let pairs: Vec<(&str, &str)> = held
                    .iter()
                    .filter(|(_, held)| **held)
                    .map(|((s, k), _)| (s.as_str(), k.as_str()))
                    .collect();
                let mut found: HashMap<(String, String), Record> =
                    records::select_many(&tx, &pairs)?
                        .into_iter()
                        .map(|r| ((r.scope.to_string(), r.key.to_string()), r))
                        .collect();
                // First occurrences are decided against the records found; a
                // key's later occurrences wait for the record the effect settles.
                let mut answers: Vec<Option<Result<Applied, Error>>> =
                    Vec::with_capacity(ops.len());
                let mut plans = HashMap::new();
                let (mut new, mut later) = (Vec::new(), Vec::new());
                for (index, op) in ops.iter().enumerate() {
                    let pair = (op.scope.to_string(), op.key.to_string());
                    if !held[&pair] {
                        answers.push(Some(Err(store.busy(op))));
                        continue;
                    }
                    let std::collections::hash_map::Entry::Vacant(slot) = plans.entry(pair) else {
                        later.push(index);
                        answers.push(None);
                        continue;
                    };
                    match protocol.step(found.get(slot.key()), op) {
                        Step::Answer(answer) => {
                            answers.push(Some(answer.map(Applied::Replayed)));
                        }
                        Step::Run(decision) => {
                            let plan = protocol.plan(found.get(slot.key()), &decision, &op.scope);
                            slot.insert(plan);
                            new.push(index);
                            answers.push(None);
                        }
                    }
                }
                if new.is_empty() {
                    return Ok(Ok(answers.into_iter().flatten().collect()));
                }
                let outcomes =
                    run_effect(effect_for(new.clone()), &mut tx).map_err(ApplyError::Effect)?;
                if outcomes.len() != new.len() {
                    // Rolled back as the transaction is dropped; the caller panics.
                    return Ok(Err((new.len(), outcomes.len())));
                }
                for (&index, outcome) in new.iter().zip(outcomes) {
                    let op = &ops[index];
                    let pair = (op.scope.to_string(), op.key.to_string());
                    let plan = plans[&pair];
                    let record = plan.settled(op, outcome.clone(), protocol.now);
                    records::write(&tx, &record)?;
                    found.insert(pair, record);
                    answers[index] = Some(Ok(Applied::Fresh(outcome)));
                }
                for index in later {
                    let op = &ops[index];
                    let pair = (op.scope.to_string(), op.key.to_string());
                    answers[index] = Some(match protocol.step(found.get(&pair), op) {
                        Step::Answer(answer) => answer.map(Applied::Replayed),
                        Step::Run(_) => {
                            unreachable!("a key settled in this batch is answered from its record")
                        }
                    });
                }
                tx.commit()?;
                drop(holds);
                Ok(Ok(answers
                    .into_iter()
                    .map(|answer| answer.expect("every operation is answered"))
                    .collect()))
            })
            .await??;
        applied.map_err(|(new, outcomes)| -> ApplyError<E> {
            panic!("{}", outcome_count_mismatch(new, outcomes))
        })
    }

    async fn apply_batch<G, F, E>(&self, ops: &[Operation], mut effect_for: G) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        let ops = ops.to_vec();
        let (holds, held) = self.hold_all(&ops);
        if !held.values().any(|held| *held) {
            return Ok(ops.iter().map(|op| Err(self.busy(op))).collect());
        }
        let store = self.clone();
        self.inner
            .connections
            .write(move |conn| {
                let protocol = store.protocol();
                let mut tx = WriteTx::begin(conn)?;
                let pairs: Vec<(&str, &str)> = held
                    .iter()
                    .filter(|(_, held)| **held)
                    .map(|((s, k), _)| (s.as_str(), k.as_str()))
                    .collect();
                let mut found: HashMap<(String, String), Record> =
                    records::select_many(&tx, &pairs)?
                        .into_iter()
                        .map(|r| ((r.scope.to_string(), r.key.to_string()), r))
                        .collect();
                let mut answers = Vec::with_capacity(ops.len());
                let mut written = Vec::new();
                for (index, op) in ops.iter().enumerate() {
                    let pair = (op.scope.to_string(), op.key.to_string());
                    if !held[&pair] {
                        answers.push(Err(store.busy(op)));
                        continue;
                    }
                    match protocol.step(found.get(&pair), op) {
                        Step::Answer(answer) => answers.push(answer.map(Applied::Replayed)),
                        Step::Run(decision) => {
                            let plan = protocol.plan(found.get(&pair), &decision, &op.scope);
                            let outcome = run_effect(effect_for(index), &mut tx)
                                .map_err(|e| ApplyError::Effect((index, e)))?;
                            let record = plan.settled(op, outcome.clone(), protocol.now);
                            found.insert(pair, record.clone());
                            written.push(record);
                            answers.push(Ok(Applied::Fresh(outcome)));
                        }
                    }
                }
                for record in &written {
                    records::write(&tx, record)?;
                }
                tx.commit()?;
                drop(holds);
                Ok(answers)
            })
            .await?
    }

    async fn complete_with<F, E>(&self, claim: &Claim, effect: F) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        let claim = claim.clone();
        let store = self.clone();
        self.inner
            .connections
            .write(move |conn| {
                let now = store.inner.clock.now();
                let mut tx = WriteTx::begin(conn)?;
                let found = records::select(&tx, claim.scope.as_str(), claim.key.as_str())?;
                match &found {
                    Some(r) if r.token == claim.token && r.state == RecordState::InFlight => {}
                    other => return Err(fenced(&claim, other.as_ref().map(|r| r.token)).into()),
                }
                let outcome = run_effect(effect, &mut tx).map_err(ApplyError::Effect)?;
                records::update_held(
                    &tx,
                    claim.scope.as_str(),
                    claim.key.as_str(),
                    claim.token,
                    HeldChange::Settle(&outcome),
                    now,
                )?;
                tx.commit()?;
                Ok(outcome)
            })
            .await?
    }

    async fn transaction<F, T, E>(&self, effect: F) -> Result<T, ApplyError<E>>
    where
        F: AtomicEffect<Connection, T, E>,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.inner
            .connections
            .write(move |conn| {
                let mut tx = WriteTx::begin(conn)?;
                let done = run_effect(effect, &mut tx).map_err(ApplyError::Effect)?;
                tx.commit()?;
                Ok(done)
            })
            .await?
    }

    fn effect_error_kind(&self, error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
        crate::errors::kind_of_cause(error)
    }
}

impl LeaseStore for SqliteStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        let op = Operation::new(scope.clone(), key.clone(), fingerprint);
        let _hold = match self.admit(&op).await? {
            Ok(hold) => hold,
            Err(outcome) => return Ok(Claimed::Replayed(outcome)),
        };
        let store = self.clone();
        self.inner
            .connections
            .write_grouped(move |conn| {
                let protocol = store.protocol();
                let (found, decision) = match decide_in(conn, &protocol, &op)? {
                    Ok(claim) => claim,
                    Err(outcome) => return Ok(Claimed::Replayed(outcome)),
                };
                let plan = protocol.plan(found.as_ref(), &decision, &op.scope);
                let record = plan.in_flight(&op, protocol.now, protocol.settings);
                records::write(conn, &record)?;
                Ok(Claimed::Fresh(Claim {
                    scope: op.scope,
                    key: op.key,
                    token: record.token,
                    lease_until: record.lease_until.expect("claims carry a lease"),
                    took_over: plan.took_over,
                }))
            })
            .await
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        let lease = self.inner.settings.lease;
        let now = self
            .change_held(claim, move |now, _| {
                HeldChange::Lease(Some(now.plus(lease)))
            })
            .await?;
        Ok(Claim {
            lease_until: now.plus(lease),
            ..claim.clone()
        })
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let (claim, outcome, store) = (claim.clone(), outcome.clone(), self.clone());
        self.inner
            .connections
            .write_grouped(move |conn| {
                let now = store.inner.clock.now();
                change_held_in(conn, &claim, HeldChange::Settle(&outcome), now)
            })
            .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.change_held(claim, |_, _| HeldChange::Lease(None))
            .await
            .map(drop)
    }
}

impl RecordStore for SqliteStore {
    fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    async fn migrate(&self) -> Result<(), Error> {
        self.inner.connections.write(schema::migrate).await?
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        let (scope, key) = (scope.to_string(), key.to_string());
        self.inner
            .connections
            .read(move |conn| records::select(conn, &scope, &key))
            .await
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        let filter = filter.clone();
        self.inner
            .connections
            .read(move |conn| records::list(conn, &filter))
            .await
    }

    async fn count(&self) -> Result<RecordCount, Error> {
        let now = self.inner.clock.now();
        self.inner
            .connections
            .read(move |conn| {
                records::count(conn, now).map(|(total, expired)| RecordCount { total, expired })
            })
            .await
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        let now = self.inner.clock.now();
        self.inner
            .connections
            .write(move |conn| records::sweep_batch(conn, now, limit))
            .await?
    }

    async fn glance(&self) -> Result<RecordGlance, Error> {
        let now = self.inner.clock.now();
        self.inner
            .connections
            .read(move |conn| records::glance(conn, now))
            .await
    }
}
