//! Group commit for leased claims and completions: the claims (and the
//! completions) of concurrent callers share one transaction and one commit.
//!
//! A gateway answering many requests at once claims a key per request and
//! settles it when the upstream has answered. Alone, each claim and each
//! completion is a transaction of its own with its own round trips and its
//! own flush to disk. Grouped:
//!
//! 1. each caller first looks its key up on the pool, as a single claim does,
//!    which answers replays and refusals (a reused key, a live lease) at once
//!    and in parallel;
//! 2. the claims that would write are queued; a runner task takes what is
//!    queued (up to [`MAX_GROUP`]) and, in one transaction, tries all their
//!    locks in one statement, reads their records again in the next, writes
//!    every new in-flight record in one statement and commits once.
//!
//! Completions are queued the same way: one transaction waits for the keys'
//! locks in one order (two groups cannot deadlock), makes one fenced `UPDATE`
//! for all of them and commits once. A completion whose claim was taken over
//! is refused as `Fenced` without holding up the others. A few runners of each
//! kind take turns at their queue, so one group's round trips overlap with the
//! next one's.
//!
//! Each caller hears its own answer after the commit; a failed commit answers
//! every caller of the group with a copy of the error. Neither the answers nor
//! the guarantees change: the locks, look-ups and fenced updates are those of
//! the single-call path, done for many keys per statement. A claim whose caller
//! gave up while it was queued is released at once, so its key does not stay
//! held until the lease ends.
//!
//! Grouping is not always the faster way: see `choice`, which sends each call
//! the way that has lately been quicker. Metrics show what happens:
//! [`GROUPED_CALLS_TOTAL`] by kind and way, and the histograms
//! [`GROUP_SIZE`] and [`GROUP_QUEUE_WAIT_SECONDS`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Instant;

use idem_core::{
    Claim, Claimed, Error, ErrorKind, Operation, Outcome, Record, StoreError, Timestamp,
    decide_batch,
};
use tokio::sync::{mpsc, oneshot};

use self::choice::Way;
use self::queues::{ClaimJob, Queues, SettleJob};

use crate::batch::Held;
use crate::decision::Next;
use crate::lock;
use crate::records::{self, Fence};
use crate::store::{Inner, PgStore};

mod choice;
pub(crate) mod queues;

/// Leased claims and completions by `kind` (`claim`, `complete`) and by the
/// `way` they went (`grouped`, `alone`) while group commit is on.
pub const GROUPED_CALLS_TOTAL: &str = "store_group_calls_total";

/// The calls in each group committed (or tried), by `kind` (a histogram:
/// its count is the groups, its sum the grouped calls).
pub const GROUP_SIZE: &str = "store_group_size";

/// How long each grouped call waited in its queue for a runner, by `kind`
/// (a histogram, in seconds).
pub const GROUP_QUEUE_WAIT_SECONDS: &str = "store_group_queue_wait_seconds";

/// The most claims (or completions) one transaction carries.
pub const MAX_GROUP: usize = 64;

/// How many groups of each kind may be committing at once: while one waits
/// for its round trips and its flush, the next is gathered and sent.
const RUNNERS: usize = 4;

impl Queues {
    /// Starts the runners of `store`, and gives the queues they take from.
    fn start(store: Weak<Inner>) -> Self {
        let (claims, claim_queue) = mpsc::unbounded_channel();
        let (settles, settle_queue) = mpsc::unbounded_channel();
        let claim_queue = Arc::new(tokio::sync::Mutex::new(claim_queue));
        let settle_queue = Arc::new(tokio::sync::Mutex::new(settle_queue));
        for _ in 0..RUNNERS {
            tokio::spawn(run(
                store.clone(),
                claim_queue.clone(),
                PgStore::claim_group,
            ));
            tokio::spawn(run(
                store.clone(),
                settle_queue.clone(),
                PgStore::settle_group,
            ));
        }
        Self { claims, settles }
    }
}

/// One runner: waits its turn at the queue, takes what is queued (up to a
/// group) and commits it while the next runner gathers the next group; until
/// the store is dropped.
async fn run<J, F>(
    store: Weak<Inner>,
    queue: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<J>>>,
    commit: impl Fn(PgStore, Vec<J>) -> F,
) where
    F: Future<Output = ()>,
{
    let mut group = Vec::with_capacity(MAX_GROUP);
    loop {
        if queue.lock().await.recv_many(&mut group, MAX_GROUP).await == 0 {
            return;
        }
        let Some(store) = PgStore::upgrade(&store) else {
            return;
        };
        commit(store, std::mem::take(&mut group)).await;
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

/// Counts a group of `kind` taken from its queue, and the time its calls
/// waited there.
fn counted_group(kind: &'static str, queued: impl ExactSizeIterator<Item = Instant>) {
    let now = Instant::now();
    metrics::histogram!(GROUP_SIZE, "kind" => kind).record(queued.len() as f64);
    let waits = metrics::histogram!(GROUP_QUEUE_WAIT_SECONDS, "kind" => kind);
    for at in queued {
        waits.record(now.saturating_duration_since(at));
    }
}

impl PgStore {
    /// Claims `op` the way that has lately been faster: in the next group,
    /// or alone.
    pub(crate) async fn claim_either_way(&self, op: Operation) -> Result<Claimed, Error> {
        let choice = &self.groups().claims;
        let way = choice.next();
        metrics::counter!(GROUPED_CALLS_TOTAL, "kind" => "claim", "way" => way.as_str())
            .increment(1);
        let started = Instant::now();
        let claimed = match way {
            Way::Grouped => self.claim_grouped(op).await,
            Way::Alone => self.claim_alone(&op.scope, &op.key, op.fingerprint).await,
        };
        choice.took(way, started.elapsed());
        claimed
    }

    /// Settles `claim` the way that has lately been faster, as
    /// [`claim_either_way`](Self::claim_either_way).
    pub(crate) async fn settle_either_way(
        &self,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        let choice = &self.groups().completions;
        let way = choice.next();
        metrics::counter!(GROUPED_CALLS_TOTAL, "kind" => "complete", "way" => way.as_str())
            .increment(1);
        let started = Instant::now();
        let settled = match way {
            Way::Grouped => self.settle_grouped(claim, outcome).await,
            Way::Alone => self.settle_alone(claim, outcome).await,
        };
        choice.took(way, started.elapsed());
        settled
    }

    /// Claims `op` in the next group, after a look-up of its own that
    /// answers replays and refusals without queueing.
    async fn claim_grouped(&self, op: Operation) -> Result<Claimed, Error> {
        let peeked = if self.pooling().sessions() {
            self.peek(self.pool(), &op.scope, &op.key, &op.fingerprint)
                .await?
        } else {
            self.peek_alone(self.pool(), &op.scope, &op.key, &op.fingerprint)
                .await?
        };
        if let Some(replay) = peeked {
            return Ok(Claimed::Replayed(replay));
        }
        let (reply, answer) = oneshot::channel();
        let queues = self.groups().queues(|| Queues::start(self.downgrade()));
        let job = ClaimJob {
            op,
            reply,
            queued_at: Instant::now(),
        };
        if let Err(refused) = queues.claims.send(job) {
            // The runner stopped between the check and the send.
            let op = refused.0.op;
            return self.claim_alone(&op.scope, &op.key, op.fingerprint).await;
        }
        answer.await.unwrap_or_else(|_| Err(runner_stopped()))
    }

    /// Settles `claim` with `outcome` in the next group.
    async fn settle_grouped(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        let queues = self.groups().queues(|| Queues::start(self.downgrade()));
        let job = SettleJob {
            claim: claim.clone(),
            outcome: outcome.clone(),
            reply,
            queued_at: Instant::now(),
        };
        if queues.settles.send(job).is_err() {
            return self.settle_alone(claim, outcome).await;
        }
        answer.await.unwrap_or_else(|_| Err(runner_stopped()))
    }

    /// Decides a group of claims and answers each caller.
    async fn claim_group(self, jobs: Vec<ClaimJob>) {
        counted_group("claim", jobs.iter().map(|job| job.queued_at));
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

    /// Claims `ops` together under their locks, in one transaction. One
    /// answer per operation, in order. (The callers have looked their keys
    /// up already; a key settled since is replayed from the locked read.)
    async fn claim_all(&self, ops: &[Operation]) -> Result<Vec<Result<Claimed, Error>>, Error> {
        let now = self.clock().now();
        let batch = decide_batch(ops);
        let mut tx = self.begin().await?;
        let Held {
            granted: held,
            mut current,
        } = self.hold(&mut tx, ops, &batch).await?;
        let mut answers: Vec<Result<Claimed, Error>> = Vec::with_capacity(ops.len());
        let mut written: Vec<Option<Record>> = vec![None; batch.slots()];
        for (i, op) in ops.iter().enumerate() {
            let slot = batch.slot_of(i);
            let decided = self.decide_read(
                held[slot],
                current[slot].as_ref(),
                &op.scope,
                &op.key,
                &op.fingerprint,
                now,
            );
            answers.push(
                match decided.map(|d| Next::after(d, current[slot].as_ref(), now, self.settings()))
                {
                    Ok(Next::Replay(replay)) => Ok(Claimed::Replayed(replay)),
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
                            expires_at: plan.expires_at,
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
        Ok(answers)
    }

    /// Settles a group of completions and answers each caller. A key that
    /// occurs twice goes in a later round, so each fenced update sees one
    /// claim per record.
    async fn settle_group(self, jobs: Vec<SettleJob>) {
        counted_group("complete", jobs.iter().map(|job| job.queued_at));
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
