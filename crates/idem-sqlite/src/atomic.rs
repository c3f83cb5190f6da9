//! Atomic mode: the effect is a write to this database, so it and the record
//! commit in one transaction. A crash at any point leaves both or neither.
//!
//! `apply` answers from a reader when the record settles the matter, takes the
//! in-process hold, then on the writer reads the record, decides, and — for a
//! claim or takeover — runs the effect and writes the record. All of it runs
//! in a savepoint of a transaction shared with the other writes queued at the
//! same moment (group commit); a failing effect undoes only its own savepoint.
//! The batch forms are in `batch`, the leased completion with a database
//! effect (`complete_with`) in `leased`.

use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, BatchApplied, Claim, ErrorKind, Fingerprint,
    IdempotencyKey, Operation, Outcome, Plan, Replay, Scope, SetApplied, crash,
};
use rusqlite::Connection;

use crate::decision::{Protocol, decide_in};
use crate::records;
use crate::store::{SqliteStore, run_effect};
use crate::write_tx::WriteTx;

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
            .decide_then(
                op,
                |replay| Applied::Replayed(replay.outcome),
                move |tx, protocol, op, plan| {
                    crash::point(crash::AFTER_CLAIM);
                    let outcome = run_effect(effect, tx).map_err(ApplyError::Effect)?;
                    crash::point(crash::INSIDE_EFFECT);
                    records::write(tx, &plan.settled(op, outcome.clone(), protocol.now))?;
                    Ok(Applied::Fresh(outcome))
                },
            )
            .await;
        if let Ok(Applied::Fresh(_)) = &applied {
            crash::point(crash::AFTER_COMMIT);
        }
        applied
    }

    async fn apply_batch<G, F, E>(&self, ops: &[Operation], effect_for: G) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        self.apply_all(ops, effect_for).await
    }

    async fn apply_set<G, F, E>(&self, ops: &[Operation], effect_for: G) -> SetApplied<E>
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<Connection, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        self.apply_set_all(ops, effect_for).await
    }

    async fn complete_with<F, E>(&self, claim: &Claim, effect: F) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        self.complete_in_transaction(claim, effect).await
    }

    async fn transaction<F, T, E>(&self, effect: F) -> Result<T, ApplyError<E>>
    where
        F: AtomicEffect<Connection, T, E>,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.connections()
            .write(move |conn| {
                let mut tx = WriteTx::begin(conn)?;
                let done = run_effect(effect, &mut tx).map_err(ApplyError::Effect)?;
                tx.commit()?;
                Ok(done)
            })
            .await?
    }

    fn effect_error_kind(&self, error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
        crate::error::kind_of_cause(error)
    }
}

impl SqliteStore {
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
        replayed: fn(Replay) -> R,
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
            Err(replay) => return Ok(replayed(replay)),
        };
        let store = self.clone();
        self.connections()
            .write_grouped(move |conn| {
                let protocol = store.protocol();
                let (found, decision) = match decide_in(conn, &protocol, &op)? {
                    Ok(claim) => claim,
                    Err(replay) => return Ok(replayed(replay)),
                };
                let plan = protocol.plan(found.as_ref(), &decision, &op.scope);
                carry_out(conn, &protocol, &op, plan)
            })
            .await
    }
}
