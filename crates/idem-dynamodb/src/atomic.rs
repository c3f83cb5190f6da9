//! Atomic mode on DynamoDB: [`AtomicStore`] for effects that are DynamoDB
//! writes. The effect gets a [`Transaction`], adds its own items, and the
//! store sends them with the record's completion as one
//! `TransactWriteItems`: both commit, or neither does.
//!
//! An apply claims the key first (the conditional write of leased mode), so
//! a concurrent duplicate is answered `InFlight` at once and a worker that
//! died holding the key is taken over once its lease ends. The effect runs
//! with the claim held; its items are only queued, so an effect error
//! writes nothing, and the claim is released for the next retry. The
//! commit completes the record on the condition that the claim is still
//! held: a worker whose claim was taken over meanwhile commits nothing
//! (`Fenced`), its effect's writes included.
//!
//! Unlike a SQL transaction, the claim is written before the effect's
//! commit, by a write of its own: a process that dies between the two
//! leaves the key claimed, and the next apply runs the effect once the
//! lease ends, as in leased mode. The effect's writes are never committed
//! twice, since each commit requires the claim of the worker that ran it.
//!
//! Batches claim each new key, run the effects into one [`Transaction`] and
//! commit once; DynamoDB's 100 items per transaction bound a batch's effect
//! writes and records together. One item may appear only once in a
//! transaction (DynamoDB refuses the transaction otherwise): an effect must
//! not write the records' own items, and the effects of one batch must not
//! write the same item twice.

use aws_sdk_dynamodb::types::{TransactWriteItem, Update};
use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, BatchApplied, BatchPlan, Claim, Claimed, Error,
    ErrorKind, Fingerprint, IdempotencyKey, Operation, Outcome, Scope, SetApplied, StoreError,
    TxCall, crash, decide, decide_batch, outcome_count_mismatch,
};

use crate::item;
use crate::leased::{HeldChange, check_answer_size, held_update};
use crate::store::DynamoStore;
use crate::transaction::{Commit, Transaction, cancelled};

/// How a commit of held claims ended, when it did not.
enum Refused {
    /// A claim was taken over: nothing was written.
    Fenced(Error),
    /// Refused before sending, or cancelled for another reason.
    Other(Error),
}

impl DynamoStore {
    /// The update that completes `claim` with `outcome`, as a transaction
    /// item, and its size.
    fn settle_item(
        &self,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(TransactWriteItem, usize), Error> {
        check_answer_size(self, claim, outcome)?;
        let expression = held_update(claim, HeldChange::Settle(outcome), self.now());
        let bytes = 256 + outcome.body.len() + outcome.meta_json().len();
        let update = Update::builder()
            .table_name(self.table())
            .set_key(Some(item::key_of(item::record_pk(
                &claim.scope,
                &claim.key,
            ))))
            .update_expression(expression.update)
            .condition_expression(expression.condition)
            .set_expression_attribute_names(Some(expression.names))
            .set_expression_attribute_values(Some(expression.values))
            .build()
            .map_err(|e| {
                Error::from(StoreError::new(
                    ErrorKind::Other,
                    format!("the completion of {}/{}: {e}", claim.scope, claim.key),
                ))
            })?;
        Ok((TransactWriteItem::builder().update(update).build(), bytes))
    }

    /// Commits the effect's items in `tx` with the completion of each claim
    /// by its outcome.
    async fn commit_settled(
        &self,
        tx: Transaction,
        settled: &[(Claim, Outcome)],
    ) -> Result<(), Refused> {
        let mut own = Vec::with_capacity(settled.len());
        for (claim, outcome) in settled {
            own.push(self.settle_item(claim, outcome).map_err(Refused::Other)?);
        }
        let effect_items = tx.len();
        let items = tx.finish(own).map_err(Refused::Other)?;
        let what = match settled {
            [(claim, _)] => format!("the commit of {}/{}", claim.scope, claim.key),
            _ => format!("the commit of a batch of {}", settled.len()),
        };
        match self.commit(items, &what).await.map_err(Refused::Other)? {
            Commit::Done => Ok(()),
            Commit::Cancelled(reasons) => {
                for (i, (claim, _)) in settled.iter().enumerate() {
                    if Commit::condition_failed(&reasons, effect_items + i) {
                        return Err(Refused::Fenced(self.fenced(claim).await));
                    }
                }
                Err(Refused::Other(cancelled(&reasons, effect_items, &what)))
            }
        }
    }

    /// Gives back claims whose work was not committed, so the next retry
    /// runs at once. A claim taken over meanwhile is no longer ours to give
    /// back, and a failure to release only delays the retry until the lease
    /// ends: neither changes the caller's answer.
    async fn release_all(&self, claims: &[Claim]) {
        for claim in claims {
            if let Err(error) = self
                .change_held(claim, HeldChange::Lease(None), "release")
                .await
                && !matches!(error, Error::Fenced { .. })
            {
                tracing::warn!(%error, "releasing a claim after a failed apply; it frees itself when its lease ends");
            }
        }
    }

    /// Runs `effect` for the held `claim` and commits its writes with the
    /// completion; `release` gives the key back when nothing was committed.
    async fn run_held<F, E>(
        &self,
        claim: &Claim,
        effect: F,
        release: bool,
    ) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<Transaction, Outcome, E>,
        E: Send + 'static,
    {
        let mut tx = Transaction::new(self);
        let outcome = match TxCall::call(effect, &mut tx).await {
            Ok(outcome) => outcome,
            Err(error) => {
                if release {
                    self.release_all(std::slice::from_ref(claim)).await;
                }
                return Err(ApplyError::Effect(error));
            }
        };
        crash::point(crash::INSIDE_EFFECT);
        match self
            .commit_settled(tx, &[(claim.clone(), outcome.clone())])
            .await
        {
            Ok(()) => Ok(outcome),
            Err(Refused::Fenced(error)) => Err(error.into()),
            Err(Refused::Other(error)) => {
                if release {
                    self.release_all(std::slice::from_ref(claim)).await;
                }
                Err(error.into())
            }
        }
    }

    /// The record a batch's commit settled for `op` under `claim`, as the
    /// later occurrences of its key are answered from it: the protocol's
    /// settled record of the claim's window (which opened one retention
    /// before its end).
    fn settled(&self, op: &Operation, claim: &Claim, outcome: Outcome) -> idem_core::Record {
        let plan = idem_core::Plan {
            token: claim.token,
            took_over: claim.took_over,
            created_at: claim.expires_at.minus(self.settings().retention),
            expires_at: claim.expires_at,
        };
        plan.settled(op, outcome, self.now())
    }

    /// Answers the later occurrences of keys in a batch: from the record
    /// this batch settled for the key, or, when the first occurrence did
    /// not run, from the record as it is now.
    async fn answer_later(
        &self,
        op: &Operation,
        settled: Option<&idem_core::Record>,
    ) -> Result<Applied, Error> {
        match settled {
            Some(record) => {
                let decision = decide(
                    Some(record),
                    &op.scope,
                    &op.key,
                    &op.fingerprint,
                    self.now(),
                    self.settings(),
                )?;
                match decision {
                    idem_core::Decision::Replay(replay) => {
                        idem_core::observe::replayed(&op.scope);
                        Ok(Applied::Replayed(replay.outcome))
                    }
                    _ => Err(idem_core::protocol::busy(
                        &op.scope,
                        &op.key,
                        self.settings(),
                    )),
                }
            }
            None => match self.claim_op(op).await? {
                Claimed::Replayed(replay) => Ok(Applied::Replayed(replay.outcome)),
                Claimed::Fresh(claim) => {
                    // The first occurrence was refused but the key is free
                    // now: it is not this batch's to run, so give it back.
                    self.release_all(std::slice::from_ref(&claim)).await;
                    Err(idem_core::protocol::busy(
                        &op.scope,
                        &op.key,
                        self.settings(),
                    ))
                }
            },
        }
    }
}

/// What claiming the first occurrence of each key in a batch came to:
/// per operation, its answer when it has one already (a replay or a
/// refusal), and the claims taken, with their operations' indexes.
type FirstClaims = (Vec<Option<Result<Applied, Error>>>, Vec<(usize, Claim)>);

impl DynamoStore {
    /// Claims the first occurrence of each key in `ops`. A store error
    /// gives back the claims taken so far and ends the batch.
    async fn claim_firsts(
        &self,
        ops: &[Operation],
        batch: &BatchPlan,
    ) -> Result<FirstClaims, Error> {
        let mut results: Vec<Option<Result<Applied, Error>>> = Vec::with_capacity(ops.len());
        let mut claims: Vec<(usize, Claim)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if !batch.is_first(i) {
                results.push(None);
                continue;
            }
            match self.claim_op(op).await {
                Ok(Claimed::Fresh(claim)) => {
                    claims.push((i, claim));
                    results.push(None);
                }
                Ok(Claimed::Replayed(replay)) => {
                    results.push(Some(Ok(Applied::Replayed(replay.outcome))))
                }
                Err(Error::Store(error)) => {
                    self.release_all(&held(&claims)).await;
                    return Err(Error::Store(error));
                }
                Err(refusal) => results.push(Some(Err(refusal))),
            }
        }
        Ok((results, claims))
    }

    /// The answers of a batch: each operation's own, or for a later
    /// occurrence of a key, one from the record its slot settled.
    async fn answer_all(
        &self,
        ops: &[Operation],
        batch: &BatchPlan,
        results: Vec<Option<Result<Applied, Error>>>,
        records: &[Option<idem_core::Record>],
    ) -> Vec<Result<Applied, Error>> {
        let mut answers = Vec::with_capacity(ops.len());
        for (i, answer) in results.into_iter().enumerate() {
            answers.push(match answer {
                Some(answer) => answer,
                None => {
                    self.answer_later(&ops[i], records[batch.slot_of(i)].as_ref())
                        .await
                }
            });
        }
        answers
    }
}

/// The claims of a batch, without their operations' indexes.
fn held(claims: &[(usize, Claim)]) -> Vec<Claim> {
    claims.iter().map(|(_, claim)| claim.clone()).collect()
}

impl AtomicStore for DynamoStore {
    type Tx = Transaction;

    async fn apply<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<Transaction, Outcome, E>,
        E: Send + 'static,
    {
        let op = Operation::new(scope.clone(), key.clone(), fingerprint);
        let claim = match self.claim_op(&op).await? {
            Claimed::Replayed(replay) => return Ok(Applied::Replayed(replay.outcome)),
            Claimed::Fresh(claim) => claim,
        };
        crash::point(crash::AFTER_CLAIM);
        let outcome = self.run_held(&claim, effect, true).await?;
        crash::point(crash::AFTER_COMMIT);
        Ok(Applied::Fresh(outcome))
    }

    async fn apply_batch<G, F, E>(&self, ops: &[Operation], mut effect_for: G) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<Transaction, Outcome, E>,
        E: Send + 'static,
    {
        let batch = decide_batch(ops);
        let (mut results, claims) = self.claim_firsts(ops, &batch).await?;
        let mut tx = Transaction::new(self);
        let mut settled = Vec::with_capacity(claims.len());
        for (i, claim) in &claims {
            match TxCall::call(effect_for(*i), &mut tx).await {
                Ok(outcome) => settled.push((claim.clone(), outcome)),
                Err(error) => {
                    self.release_all(&held(&claims)).await;
                    return Err(ApplyError::Effect((*i, error)));
                }
            }
        }
        if let Err(Refused::Fenced(error) | Refused::Other(error)) =
            self.commit_settled(tx, &settled).await
        {
            self.release_all(&held(&claims)).await;
            return Err(error.into());
        }
        let mut records = vec![None; batch.slots()];
        for ((i, claim), (_, outcome)) in claims.iter().zip(&settled) {
            records[batch.slot_of(*i)] = Some(self.settled(&ops[*i], claim, outcome.clone()));
            results[*i] = Some(Ok(Applied::Fresh(outcome.clone())));
        }
        Ok(self.answer_all(ops, &batch, results, &records).await)
    }

    async fn apply_set<G, F, E>(&self, ops: &[Operation], effect_for: G) -> SetApplied<E>
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<Transaction, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        let batch = decide_batch(ops);
        let (mut results, claims) = self.claim_firsts(ops, &batch).await?;
        let mut records = vec![None; batch.slots()];
        if !claims.is_empty() {
            let new: Vec<usize> = claims.iter().map(|(i, _)| *i).collect();
            let mut tx = Transaction::new(self);
            let outcomes = match TxCall::call(effect_for(new.clone()), &mut tx).await {
                Ok(outcomes) => outcomes,
                Err(error) => {
                    self.release_all(&held(&claims)).await;
                    return Err(ApplyError::Effect(error));
                }
            };
            if outcomes.len() != new.len() {
                self.release_all(&held(&claims)).await;
                panic!("{}", outcome_count_mismatch(new.len(), outcomes.len()));
            }
            let settled: Vec<(Claim, Outcome)> = claims
                .iter()
                .map(|(_, c)| c.clone())
                .zip(outcomes)
                .collect();
            if let Err(Refused::Fenced(error) | Refused::Other(error)) =
                self.commit_settled(tx, &settled).await
            {
                self.release_all(&held(&claims)).await;
                return Err(error.into());
            }
            for ((i, claim), (_, outcome)) in claims.iter().zip(settled) {
                records[batch.slot_of(*i)] = Some(self.settled(&ops[*i], claim, outcome.clone()));
                results[*i] = Some(Ok(Applied::Fresh(outcome)));
            }
        }
        Ok(self.answer_all(ops, &batch, results, &records).await)
    }

    async fn complete_with<F, E>(&self, claim: &Claim, effect: F) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<Transaction, Outcome, E>,
        E: Send + 'static,
    {
        // A claim taken over already is refused before its effect runs; one
        // taken over while it runs is refused by the commit's condition.
        let current = self.read_stored(&claim.scope, &claim.key).await?;
        let held = current.as_ref().is_some_and(|s| {
            s.record.token == claim.token && s.record.state == idem_core::RecordState::InFlight
        });
        if !held {
            return Err(self.fenced(claim).await.into());
        }
        self.run_held(claim, effect, false).await
    }

    async fn transaction<F, T, E>(&self, effect: F) -> Result<T, ApplyError<E>>
    where
        F: AtomicEffect<Transaction, T, E>,
        T: Send + 'static,
        E: Send + 'static,
    {
        let mut tx = Transaction::new(self);
        let done = TxCall::call(effect, &mut tx)
            .await
            .map_err(ApplyError::Effect)?;
        let effect_items = tx.len();
        let items = tx.finish(Vec::new())?;
        match self.commit(items, "a transaction without a key").await? {
            Commit::Done => Ok(done),
            Commit::Cancelled(reasons) => {
                Err(cancelled(&reasons, effect_items, "a transaction without a key").into())
            }
        }
    }
}
