//! Batch apply: N operations in one transaction on the writer (one commit
//! instead of N).
//!
//! The in-process hold of each distinct key is tried first; a key another
//! caller holds is answered `InFlight` without holding up the rest. On the
//! writer, one statement reads the records of the keys held, the effects of
//! the new operations run in order in the transaction, and every new record
//! is written before the one commit. Which operations share a key is
//! [`decide_batch`]'s answer: a key's later occurrences are decided against
//! what the batch itself did, so they replay the first's outcome (same
//! fingerprint) or are refused as `KeyReuse`. Any effect error rolls back the
//! whole batch.
//!
//! The set form (`apply_set`) decides every operation first, runs one effect
//! for all the new ones, and then answers the repeated keys from the records
//! that effect's outcomes settled.

use idem_core::{
    Applied, ApplyError, AtomicEffect, BatchApplied, BatchPlan, Error, Operation, Outcome, Record,
    SetApplied, decide_batch, outcome_count_mismatch,
};
use rusqlite::Connection;

use crate::decision::{Protocol, Step};
use crate::holds::Hold;
use crate::records;
use crate::store::{SqliteStore, run_effect};
use crate::write_tx::WriteTx;

impl SqliteStore {
    /// Tries the in-process hold of each distinct key of a batch, one per
    /// slot of `batch`: `None` where another caller holds the key. The holds
    /// are released when dropped.
    fn hold_all(&self, ops: &[Operation], batch: &BatchPlan) -> Vec<Option<Hold>> {
        batch
            .keys(ops)
            .map(|(scope, key)| self.holds().try_hold(scope.as_str(), key.as_str()))
            .collect()
    }

    /// Applies a batch of operations in one transaction; one result per
    /// operation, in order (see `AtomicStore::apply_batch`).
    pub(crate) async fn apply_all<G, F, E>(
        &self,
        ops: &[Operation],
        mut effect_for: G,
    ) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        let ops = ops.to_vec();
        let batch = decide_batch(&ops);
        let holds = self.hold_all(&ops, &batch);
        let held: Vec<bool> = holds.iter().map(Option::is_some).collect();
        if !held.contains(&true) {
            return Ok(ops.iter().map(|op| Err(self.busy(op))).collect());
        }
        let store = self.clone();
        self.connections()
            .write(move |conn| {
                let protocol = store.protocol();
                let mut tx = WriteTx::begin(conn)?;
                let mut found = read_held(&tx, &protocol, &ops, &batch, &held)?;
                let mut answers = Vec::with_capacity(ops.len());
                let mut written = Vec::new();
                for (index, op) in ops.iter().enumerate() {
                    let slot = batch.slot_of(index);
                    if !held[slot] {
                        answers.push(Err(store.busy(op)));
                        continue;
                    }
                    match protocol.step(found[slot].as_ref(), op) {
                        Step::Answer(answer) => {
                            answers.push(answer.map(|replay| Applied::Replayed(replay.outcome)))
                        }
                        Step::Run(decision) => {
                            let plan = protocol.plan(found[slot].as_ref(), &decision, &op.scope);
                            let outcome = run_effect(effect_for(index), &mut tx)
                                .map_err(|e| ApplyError::Effect((index, e)))?;
                            let record = plan.settled(op, outcome.clone(), protocol.now);
                            found[slot] = Some(record.clone());
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

    /// Applies a batch with one effect for all its new operations (see
    /// `AtomicStore::apply_set`).
    pub(crate) async fn apply_set_all<G, F, E>(
        &self,
        ops: &[Operation],
        effect_for: G,
    ) -> SetApplied<E>
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<Connection, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        let ops = ops.to_vec();
        let batch = decide_batch(&ops);
        let holds = self.hold_all(&ops, &batch);
        let held: Vec<bool> = holds.iter().map(Option::is_some).collect();
        if !held.contains(&true) {
            return Ok(ops.iter().map(|op| Err(self.busy(op))).collect());
        }
        let store = self.clone();
        type Answered<E> =
            Result<Result<Vec<Result<Applied, Error>>, (usize, usize)>, ApplyError<E>>;
        let applied = self
            .connections()
            .write(move |conn| -> Answered<E> {
                let protocol = store.protocol();
                let mut tx = WriteTx::begin(conn)?;
                let mut found = read_held(&tx, &protocol, &ops, &batch, &held)?;
                // First occurrences are decided against the records found; a
                // key's later occurrences wait for the record the effect settles.
                let mut answers: Vec<Option<Result<Applied, Error>>> =
                    Vec::with_capacity(ops.len());
                let mut plans = vec![None; batch.slots()];
                let (mut new, mut later) = (Vec::new(), Vec::new());
                for (index, op) in ops.iter().enumerate() {
                    let slot = batch.slot_of(index);
                    if !held[slot] {
                        answers.push(Some(Err(store.busy(op))));
                        continue;
                    }
                    if plans[slot].is_some() {
                        later.push(index);
                        answers.push(None);
                        continue;
                    }
                    match protocol.step(found[slot].as_ref(), op) {
                        Step::Answer(answer) => {
                            answers
                                .push(Some(answer.map(|replay| Applied::Replayed(replay.outcome))));
                        }
                        Step::Run(decision) => {
                            let plan = protocol.plan(found[slot].as_ref(), &decision, &op.scope);
                            plans[slot] = Some(plan);
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
                    let slot = batch.slot_of(index);
                    let plan = plans[slot].expect("a new operation has a plan");
                    let record = plan.settled(&ops[index], outcome.clone(), protocol.now);
                    records::write(&tx, &record)?;
                    found[slot] = Some(record);
                    answers[index] = Some(Ok(Applied::Fresh(outcome)));
                }
                for index in later {
                    let slot = batch.slot_of(index);
                    answers[index] = Some(match protocol.step(found[slot].as_ref(), &ops[index]) {
                        Step::Answer(answer) => {
                            answer.map(|replay| Applied::Replayed(replay.outcome))
                        }
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
}

/// Reads, in one statement, the records of the batch's keys this caller
/// holds: one per slot of `batch`, `None` for a key without a record or not
/// held. With tombstones kept, a held key without a record gets its
/// tombstone, if it has one inside the grace period, in the record's place.
fn read_held(
    conn: &Connection,
    protocol: &Protocol<'_>,
    ops: &[Operation],
    batch: &BatchPlan,
    held: &[bool],
) -> Result<Vec<Option<Record>>, Error> {
    let pairs: Vec<(&str, &str)> = batch
        .keys(ops)
        .zip(held)
        .filter(|(_, held)| **held)
        .map(|((scope, key), _)| (scope.as_str(), key.as_str()))
        .collect();
    let mut found = vec![None; batch.slots()];
    for record in records::select_many(conn, &pairs)? {
        if let Some(slot) = batch.slot_of_key(&record.scope, &record.key) {
            found[slot] = Some(record);
        }
    }
    if let Some(grace) = protocol.settings.tombstones {
        for (index, op) in ops.iter().enumerate() {
            let slot = batch.slot_of(index);
            if held[slot] && found[slot].is_none() {
                found[slot] = records::select_tombstone(conn, op, protocol.now, grace)?;
            }
        }
    }
    Ok(found)
}
