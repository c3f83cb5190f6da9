//! Group commit for leased claims and completions: the claims (and the
//! completions) of concurrent callers share one transaction and one commit.
//!
//! A gateway answering many requests at once claims a key per request and
//! settles it when the upstream has answered. Alone, each claim and each
//! completion is a transaction of its own and waits for its own flush to disk;
//! the database's commit rate then caps the gateway. Grouped, a runner task
//! takes every claim queued while its previous group was committing, up to
//! [`MAX_GROUP`], and decides them together:
//!
//! 1. one look-up of all their records, outside any transaction, answers
//!    replays and refusals (a reused key, a live lease);
//! 2. for the rest, one transaction tries all their locks in one statement,
//!    reads their records again in the next, writes every new in-flight record
//!    in one statement and commits once.
//!
//! Completions work the same way with a runner of their own: one transaction
//! waits for the keys' locks in one order (two groups cannot deadlock), makes
//! one fenced `UPDATE` for all of them and commits once. A completion whose
//! claim was taken over is refused as `Fenced` without holding up the others.
//!
//! Each caller hears its own answer after the commit; a failed commit answers
//! every caller of the group with a copy of the error. Neither the answers nor
//! the guarantees change: the locks, look-ups and fenced updates are those of
//! the single-call path, done for many keys per statement. A claim whose caller
//! gave up while it was queued is released at once, so its key does not stay
//! held until the lease ends.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};

use idem_core::{
    Claim, Claimed, Decision, Error, ErrorKind, IdempotencyKey, Operation, Outcome, Record, Scope,
    StoreError, Timestamp, decide, observe,
};
use sqlx::{Connection, PgConnection};
use tokio::sync::{mpsc, oneshot};

use crate::batch::Keys;
use crate::decision::Next;
use crate::lock;
use crate::records::{self, Fence};
use crate::store::{Inner, PgStore};

/// The most claims (or completions) one transaction carries.
pub const MAX_GROUP: usize = 64;

/// A queued claim and where its answer goes.
struct ClaimJob {
    op: Operation,
    reply: oneshot::Sender<Result<Claimed, Error>>,
}

/// A queued completion and where its answer goes.
struct SettleJob {
    claim: Claim,
    outcome: Outcome,
    reply: oneshot::Sender<Result<(), Error>>,
}

/// The queues of a store's two runners.
#[derive(Clone)]
struct Queues {
    claims: mpsc::UnboundedSender<ClaimJob>,
    settles: mpsc::UnboundedSender<SettleJob>,
}

/// The runners of one store, started on first use and again when they have
/// stopped (the runtime they ran on was shut down).
#[derive(Default)]
pub(crate) struct Groups {
    queues: Mutex<Option<Queues>>,
}

impl Groups {
    fn queues(&self, store: &PgStore) -> Queues {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        match &*queues {
            Some(q) if !q.claims.is_closed() && !q.settles.is_closed() => q.clone(),
            _ => {
                let started = Queues::start(store.downgrade());
                *queues = Some(started.clone());
                started
            }
        }
    }
}

impl Queues {
    fn start(store: Weak<Inner>) -> Self {
        let (claims, claim_queue) = mpsc::unbounded_channel();
        let (settles, settle_queue) = mpsc::unbounded_channel();
        tokio::spawn(run_claims(store.clone(), claim_queue));
        tokio::spawn(run_settles(store, settle_queue));
        Self { claims, settles }
    }
}

/// Takes what is queued, up to a group, and decides it, until the store is
/// dropped.
async fn run_claims(store: Weak<Inner>, mut queue: mpsc::UnboundedReceiver<ClaimJob>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut group, MAX_GROUP).await > 0 {
        let Some(store) = PgStore::upgrade(&store) else {
            return;
        };
        store.claim_group(std::mem::take(&mut group)).await;
    }
}

/// As [`run_claims`], for completions.
async fn run_settles(store: Weak<Inner>, mut queue: mpsc::UnboundedReceiver<SettleJob>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut group, MAX_GROUP).await > 0 {
        let Some(store) = PgStore::upgrade(&store) else {
            return;
        };
        store.settle_group(std::mem::take(&mut group)).await;
    }
}

/// The answer of a caller whose group's runner stopped before answering (its
/// runtime was shut down): whether the group committed is unknown.
fn runner_stopped() -> Error {
    StoreError::new(
        ErrorKind::CommitUnknown,
        "the task committing a group of claims stopped before it answered (its runtime was shut down); whether this call committed is unknown, so run it again under the same key",
    )
    .into()
}

impl PgStore {
    /// Claims `op` in the next group.
    pub(crate) async fn claim_grouped(&self, op: Operation) -> Result<Claimed, Error> {
        let (reply, answer) = oneshot::channel();
        let queues = self.groups().queues(self);
        if let Err(refused) = queues.claims.send(ClaimJob { op, reply }) {
            // The runner stopped between the check and the send.
            let op = refused.0.op;
            return self.claim_alone(&op.scope, &op.key, op.fingerprint).await;
        }
        answer.await.unwrap_or_else(|_| Err(runner_stopped()))
    }

    /// Settles `claim` with `outcome` in the next group.
    pub(crate) async fn settle_grouped(
        &self,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        let queues = self.groups().queues(self);
        let job = SettleJob {
            claim: claim.clone(),
            outcome: outcome.clone(),
            reply,
        };
        if queues.settles.send(job).is_err() {
            return self.settle_alone(claim, outcome).await;
        }
        answer.await.unwrap_or_else(|_| Err(runner_stopped()))
    }

    /// Decides a group of claims and answers each caller.
    async fn claim_group(&self, jobs: Vec<ClaimJob>) {
        let ops: Vec<Operation> = jobs.iter().map(|job| job.op.clone()).collect();
        let answers = match self.claim_all(&ops).await {
            Ok(answers) => answers,
            Err(error) => ops.iter().map(|_| Err(error.copy_for_group())).collect(),
        };
        for (job, answer) in jobs.into_iter().zip(answers) {
            if let Err(Ok(Claimed::Fresh(claim))) = job.reply.send(answer) {
                // Nobody waits for this claim any more: free the key now
                // rather than when the lease ends.
                let store = self.clone();
                tokio::spawn(async move {
                    if let Err(error) = store.release_alone(&claim).await {
                        tracing::warn!(%error, scope = %claim.scope, key = %claim.key,
                            "releasing a claim whose caller gave up failed; the key is free when its lease ends");
                    }
                });
            }
        }
    }

    /// Claims `ops` together: replays and refusals from one look-up, the rest
    /// under their locks in one transaction. One answer per operation, in order.
    async fn claim_all(&self, ops: &[Operation]) -> Result<Vec<Result<Claimed, Error>>, Error> {
        let now = self.clock().now();
        let keys = Keys::of(ops);
        let mut conn = self.pool().acquire().await.map_err(|e| self.fail(e))?;

        // 1. What the records say without a lock.
        let found = self.found(&mut conn, &keys, &keys.keys).await?;
        let mut answers: Vec<Option<Result<Claimed, Error>>> = Vec::with_capacity(ops.len());
        let mut to_lock: Vec<usize> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let slot = keys.slot_of[i];
            let found = found[slot].as_ref();
            let answer = match decide(
                found,
                &op.scope,
                &op.key,
                &op.fingerprint,
                now,
                self.settings(),
            ) {
                Ok(Decision::Replay(outcome)) => {
                    observe::replayed(&op.scope);
                    Some(Ok(Claimed::Replayed(outcome)))
                }
                Ok(_) => {
                    if !to_lock.contains(&slot) {
                        to_lock.push(slot);
                    }
                    None
                }
                Err(error) => {
                    observe::refused(&error);
                    Some(Err(error))
                }
            };
            answers.push(answer);
        }
        if to_lock.is_empty() {
            return Ok(answers.into_iter().flatten().collect());
        }

        // 2. The rest under their locks, in one transaction.
        let mut tx = conn
            .begin_with(lock::BEGIN)
            .await
            .map_err(|e| self.fail(e))?;
        let lock_keys: Vec<i64> = to_lock
            .iter()
            .map(|&slot| lock::lock_key(keys.keys[slot].0, keys.keys[slot].1))
            .collect();
        let granted = lock::try_lock_all(&mut tx, &lock_keys)
            .await
            .map_err(|e| self.fail(e))?;
        let locked: Vec<_> = to_lock
            .iter()
            .zip(&granted)
            .filter(|(_, granted)| **granted)
            .map(|(&slot, _)| keys.keys[slot])
            .collect();
        // A separate statement from the locks, so it sees every commit made
        // before they were granted (see `lock`).
        let mut current = self.found(&mut tx, &keys, &locked).await?;
        let mut held = vec![false; keys.keys.len()];
        for (&slot, &granted) in to_lock.iter().zip(&granted) {
            held[slot] = granted;
        }
        let mut written: Vec<Option<Record>> = vec![None; keys.keys.len()];
        for (i, op) in ops.iter().enumerate() {
            if answers[i].is_some() {
                continue;
            }
            let slot = keys.slot_of[i];
            let decided = self.decide_read(
                held[slot],
                current[slot].as_ref(),
                &op.scope,
                &op.key,
                &op.fingerprint,
                now,
            );
            answers[i] = Some(
                match decided.map(|d| Next::after(d, current[slot].as_ref(), now, self.settings()))
                {
                    Ok(Next::Replay(outcome)) => Ok(Claimed::Replayed(outcome)),
                    Ok(Next::Run(plan)) => {
                        let record = plan.in_flight(op, now, self.settings());
                        current[slot] = Some(record.clone());
                        written[slot] = Some(record);
                        Ok(Claimed::Fresh(Claim {
                            scope: op.scope.clone(),
                            key: op.key.clone(),
                            token: plan.token,
                            lease_until: now.plus(self.settings().lease),
                            took_over: plan.took_over,
                        }))
                    }
                    Err(error) => Err(error),
                },
            );
        }
        let written: Vec<Record> = written.into_iter().flatten().collect();
        if written.is_empty() {
            self.roll_back(tx).await;
        } else {
            if let Err(error) = self.write(&mut tx, &written).await {
                self.roll_back(tx).await;
                return Err(error);
            }
            tx.commit().await.map_err(|e| self.fail_commit(e))?;
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.expect("every claim is answered"))
            .collect())
    }

    /// The records of the keys in `wanted`, placed at their slots in `keys`.
    async fn found(
        &self,
        conn: &mut PgConnection,
        keys: &Keys<'_>,
        wanted: &[(&Scope, &IdempotencyKey)],
    ) -> Result<Vec<Option<Record>>, Error> {
        let mut placed: Vec<Option<Record>> = vec![None; keys.keys.len()];
        if wanted.is_empty() {
            return Ok(placed);
        }
        let found = records::fetch_all(conn, wanted)
            .await
            .map_err(|e| self.fail(e))?;
        for record in found {
            if let Some(&slot) = keys.slot.get(&(&record.scope, &record.key)) {
                placed[slot] = Some(record);
            }
        }
        Ok(placed)
    }

    /// Settles a group of completions and answers each caller. A key that
    /// occurs twice goes in a later round, so each fenced update sees one
    /// claim per record.
    async fn settle_group(&self, jobs: Vec<SettleJob>) {
        let mut rest = jobs;
        while !rest.is_empty() {
            let mut seen = HashMap::new();
            let (round, later): (Vec<_>, Vec<_>) = rest.into_iter().partition(|job| {
                seen.insert((job.claim.scope.clone(), job.claim.key.clone()), ())
                    .is_none()
            });
            rest = later;
            let settled: Vec<(&Claim, &Outcome)> =
                round.iter().map(|job| (&job.claim, &job.outcome)).collect();
            let answers = match self.settle_all(&settled).await {
                Ok(answers) => answers,
                Err(error) => round.iter().map(|_| Err(error.copy_for_group())).collect(),
            };
            for (job, answer) in round.into_iter().zip(answers) {
                let _ = job.reply.send(answer);
            }
        }
    }

    /// Settles distinct keys' claims in one transaction: their locks in one
    /// order, one fenced update, one commit.
    async fn settle_all(
        &self,
        settled: &[(&Claim, &Outcome)],
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let now: Timestamp = self.clock().now();
        let mut tx = self.begin().await?;
        let mut lock_keys: Vec<i64> = settled
            .iter()
            .map(|(claim, _)| lock::lock_key(&claim.scope, &claim.key))
            .collect();
        lock_keys.sort_unstable();
        lock_keys.dedup();
        lock::lock_all(&mut tx, &lock_keys)
            .await
            .map_err(|e| self.fail(e))?;
        let fences = records::settle_all(&mut tx, settled, now)
            .await
            .map_err(|e| self.fail(e))?;
        if fences.contains(&Fence::Held) {
            tx.commit().await.map_err(|e| self.fail_commit(e))?;
        } else {
            self.roll_back(tx).await;
        }
        Ok(settled
            .iter()
            .zip(fences)
            .map(|((claim, _), fence)| match fence {
                Fence::Held => Ok(()),
                Fence::Lost { current } => Err(self.fenced(claim, current)),
            })
            .collect())
    }
}
