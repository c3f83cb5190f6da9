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

use std::collections::HashMap;

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use idem_core::{
    Applied, ApplyError, AtomicEffect, BatchApplied, IdempotencyKey, Operation, Outcome, Record,
    Scope, TxCall, decide, observe, protocol,
};
use sqlx::PgConnection;

use crate::decision::{Next, observed};
use crate::store::PgStore;
use crate::{lock, records};

impl PgStore {
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

        // Distinct keys, in the order they first occur; `slot_of[i]` is the key of `ops[i]`.
        let mut slots: HashMap<(&Scope, &IdempotencyKey), usize> = HashMap::new();
        let mut keys: Vec<(&Scope, &IdempotencyKey)> = Vec::new();
        let slot_of: Vec<usize> = ops
            .iter()
            .map(|op| {
                *slots.entry((&op.scope, &op.key)).or_insert_with(|| {
                    keys.push((&op.scope, &op.key));
                    keys.len() - 1
                })
            })
            .collect();

        let mut tx = self.begin().await?;
        let lock_keys: Vec<i64> = keys.iter().map(|(s, k)| lock::lock_key(s, k)).collect();
        let granted = lock::try_lock_all(&mut tx, &lock_keys)
            .await
            .map_err(|e| self.fail(e))?;
        let locked: Vec<(&Scope, &IdempotencyKey)> = keys
            .iter()
            .zip(&granted)
            .filter(|(_, granted)| **granted)
            .map(|(key, _)| *key)
            .collect();
        // A separate statement from the locks, so it sees every commit made
        // before they were granted (see `lock`).
        let found = if locked.is_empty() {
            Vec::new()
        } else {
            records::fetch_all(&mut tx, &locked)
                .await
                .map_err(|e| self.fail(e))?
        };

        // What each key looks like now, including what this batch wrote.
        let mut current: Vec<Option<Record>> = vec![None; keys.len()];
        for record in found {
            if let Some(&slot) = slots.get(&(&record.scope, &record.key)) {
                current[slot] = Some(record);
            }
        }
        let mut written: Vec<Option<Record>> = vec![None; keys.len()];
        let mut results = Vec::with_capacity(ops.len());

        for (i, op) in ops.iter().enumerate() {
            let slot = slot_of[i];
            if !granted[slot] {
                let error = protocol::busy(&op.scope, &op.key, self.settings());
                observe::refused(&error);
                results.push(Err(error));
                continue;
            }
            let decided = observed(
                decide(
                    current[slot].as_ref(),
                    &op.scope,
                    &op.key,
                    &op.fingerprint,
                    now,
                    self.settings(),
                ),
                &op.scope,
            );
            let plan = match decided {
                Err(error) => {
                    results.push(Err(error));
                    continue;
                }
                Ok(decision) => {
                    match Next::after(decision, current[slot].as_ref(), now, self.settings()) {
                        Next::Replay(outcome) => {
                            results.push(Ok(Applied::Replayed(outcome)));
                            continue;
                        }
                        Next::Run(plan) => plan,
                    }
                }
            };
            // A panicking effect is rolled back before the panic goes on, so the
            // key's lock is free by the time the caller sees it.
            let ran = AssertUnwindSafe(TxCall::call(effect_for(i), &mut *tx))
                .catch_unwind()
                .await;
            let outcome = match ran {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(error)) => {
                    self.roll_back(tx).await;
                    return Err(ApplyError::Effect((i, error)));
                }
                Err(panic) => {
                    self.roll_back(tx).await;
                    std::panic::resume_unwind(panic);
                }
            };
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
}
