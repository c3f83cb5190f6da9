//! Batch apply: N operations in one transaction, the main lever for consumer
//! throughput (one commit instead of N).
//!
//! One statement tries the locks of all distinct keys, one statement reads all
//! their records, the effects of the new operations run in order in the
//! transaction, one statement writes all new records, one commit. A key whose
//! lock is taken is answered `InFlight` without holding up the rest. A key that
//! occurs twice in the batch is decided against what the batch itself did: the
//! second occurrence replays the first's outcome (same fingerprint) or is
//! refused as `KeyReuse`. Any effect error rolls back the whole batch.
//!
//! The set form (`apply_set`) decides every operation first, runs one effect
//! for all the new ones, and then answers the repeated keys from the records
//! that effect's outcomes settled.

use idem_core::{
    Applied, ApplyError, AtomicEffect, BatchApplied, BatchPlan, Error, IdempotencyKey, Operation,
    Outcome, Plan, Record, Scope, SetApplied, Timestamp, decide, decide_batch, observe,
    outcome_count_mismatch, protocol,
};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::decision::{Next, observed};
use crate::store::PgStore;
use crate::{lock, records};

/// Each key's lock, and its record as the batch found it and then changed it.
pub(crate) struct Held {
    pub(crate) granted: Vec<bool>,
    pub(crate) current: Vec<Option<Record>>,
}

/// What to do with one operation.
enum Step {
    Answer(Result<Applied, Error>),
    Run(Plan),
}

impl PgStore {
    /// Tries the locks of all keys of `batch` in one statement and reads the
    /// records of those granted in another; one of each per slot.
    pub(crate) async fn hold(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        ops: &[Operation],
        batch: &BatchPlan,
    ) -> Result<Held, Error> {
        let lock_keys: Vec<i64> = batch.keys(ops).map(|(s, k)| lock::lock_key(s, k)).collect();
        let granted = lock::try_lock_all(tx, &lock_keys)
            .await
            .map_err(|e| self.fail(e))?;
        let locked: Vec<(&Scope, &IdempotencyKey)> = batch
            .keys(ops)
            .zip(&granted)
            .filter(|(_, granted)| **granted)
            .map(|(key, _)| key)
            .collect();
        // A separate statement from the locks, so it sees every commit made
        // before they were granted (see `lock`).
        let found = if locked.is_empty() {
            Vec::new()
        } else {
            records::fetch_all(tx, &locked)
                .await
                .map_err(|e| self.fail(e))?
        };
        let mut current: Vec<Option<Record>> = vec![None; batch.slots()];
        for record in found {
            if let Some(slot) = batch.slot_of_key(&record.scope, &record.key) {
                current[slot] = Some(record);
            }
        }
        if let Some(grace) = self.settings().tombstones {
            // A held key without a record may have been swept inside its
            // grace period: its tombstone takes the record's place, so the
            // decision refuses it as late. Never written back.
            let unknown: Vec<(&Scope, &IdempotencyKey)> = batch
                .keys(ops)
                .enumerate()
                .filter(|(slot, _)| granted[*slot] && current[*slot].is_none())
                .map(|(_, key)| key)
                .collect();
            if !unknown.is_empty() {
                let now = self.clock().now();
                let tombstones = records::fetch_tombstones(tx, &unknown, now, grace)
                    .await
                    .map_err(|e| self.fail(e))?;
                for tombstone in tombstones {
                    if let Some(slot) = batch.slot_of_key(&tombstone.scope, &tombstone.key) {
                        current[slot] = Some(tombstone);
                    }
                }
            }
        }
        Ok(Held { granted, current })
    }

    /// Decides one operation against its key's lock and record.
    fn step(
        &self,
        op: &Operation,
        granted: bool,
        current: Option<&Record>,
        now: Timestamp,
    ) -> Step {
        if !granted {
            let error = protocol::busy(&op.scope, &op.key, self.settings());
            observe::refused(&error);
            return Step::Answer(Err(error));
        }
        let decided = observed(
            decide(
                current,
                &op.scope,
                &op.key,
                &op.fingerprint,
                now,
                self.settings(),
            ),
            &op.scope,
        );
        match decided {
            Err(error) => Step::Answer(Err(error)),
            Ok(decision) => match Next::after(decision, current, now, self.settings()) {
                Next::Replay(replay) => Step::Answer(Ok(Applied::Replayed(replay.outcome))),
                Next::Run(plan) => Step::Run(plan),
            },
        }
    }

    /// Applies a batch of operations in one transaction; returns one result per
    /// operation, in order.
    ///
    /// `effect_for(i)` is the effect of `ops[i]`, run in the batch's transaction
    /// only for operations that are new. A refusal (`InFlight`, `KeyReuse`) is the
    /// result of that operation alone; an effect error rolls back the whole batch
    /// and comes back as `ApplyError::Effect((i, error))`.
    pub(crate) async fn apply_all<G, F, E>(
        &self,
        ops: &[Operation],
        mut effect_for: G,
    ) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock().now();
        let batch = decide_batch(ops);
        let mut tx = self.begin().await?;
        let Held {
            granted,
            mut current,
        } = self.hold(&mut tx, ops, &batch).await?;
        let mut written: Vec<Option<Record>> = vec![None; batch.slots()];
        let mut results = Vec::with_capacity(ops.len());

        for (i, op) in ops.iter().enumerate() {
            let slot = batch.slot_of(i);
            let plan = match self.step(op, granted[slot], current[slot].as_ref(), now) {
                Step::Answer(answer) => {
                    results.push(answer);
                    continue;
                }
                Step::Run(plan) => plan,
            };
            let outcome;
            (tx, outcome) = self
                .run_or_roll_back(tx, effect_for(i))
                .await
                .map_err(|error| ApplyError::Effect((i, error)))?;
            let record = plan.settled(op, outcome.clone(), self.clock().now());
            current[slot] = Some(record.clone());
            written[slot] = Some(record);
            results.push(Ok(Applied::Fresh(outcome)));
        }

        let written: Vec<Record> = written.into_iter().flatten().collect();
        if !written.is_empty() {
            self.write(&mut tx, &written).await?;
        }
        self.commit(tx).await?;
        Ok(results)
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
        F: AtomicEffect<PgConnection, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock().now();
        let batch = decide_batch(ops);
        let mut tx = self.begin().await?;
        let Held {
            granted,
            mut current,
        } = self.hold(&mut tx, ops, &batch).await?;

        // First occurrences are decided against the records found; a key's
        // later occurrences wait for the record this batch settles for it.
        let mut results: Vec<Option<Result<Applied, Error>>> = Vec::with_capacity(ops.len());
        let mut plans: Vec<Option<Plan>> = vec![None; batch.slots()];
        let (mut new, mut later) = (Vec::new(), Vec::new());
        for (i, op) in ops.iter().enumerate() {
            let slot = batch.slot_of(i);
            if granted[slot] && plans[slot].is_some() {
                later.push(i);
                results.push(None);
                continue;
            }
            match self.step(op, granted[slot], current[slot].as_ref(), now) {
                Step::Answer(answer) => results.push(Some(answer)),
                Step::Run(plan) => {
                    plans[slot] = Some(plan);
                    new.push(i);
                    results.push(None);
                }
            }
        }
        if new.is_empty() {
            self.roll_back(tx).await;
            return Ok(results.into_iter().flatten().collect());
        }

        let (mut tx, outcomes) = self
            .run_or_roll_back(tx, effect_for(new.clone()))
            .await
            .map_err(ApplyError::Effect)?;
        if outcomes.len() != new.len() {
            self.roll_back(tx).await;
            panic!("{}", outcome_count_mismatch(new.len(), outcomes.len()));
        }
        let settled_at = self.clock().now();
        let mut written = Vec::with_capacity(new.len());
        for (&i, outcome) in new.iter().zip(outcomes) {
            let slot = batch.slot_of(i);
            let plan = plans[slot].take().expect("a new operation has a plan");
            let record = plan.settled(&ops[i], outcome.clone(), settled_at);
            current[slot] = Some(record.clone());
            written.push(record);
            results[i] = Some(Ok(Applied::Fresh(outcome)));
        }
        for i in later {
            let slot = batch.slot_of(i);
            results[i] = Some(
                match self.step(&ops[i], true, current[slot].as_ref(), now) {
                    Step::Answer(answer) => answer,
                    Step::Run(_) => {
                        unreachable!("a key settled in this batch is answered from its record")
                    }
                },
            );
        }
        self.write(&mut tx, &written).await?;
        self.commit(tx).await?;
        Ok(results
            .into_iter()
            .map(|answer| answer.expect("every operation is answered"))
            .collect())
    }
}
