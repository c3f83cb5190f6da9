//! Batch mode: up to N deliveries in one transaction, then one ack for all.
//!
//! Why: a consumer's cost is dominated by commits, one per message in single
//! mode. A batch looks all its keys up with one statement, runs the effects
//! of the new messages in one transaction, commits once, and acks once
//! (RabbitMQ's cumulative `multiple` ack). Duplicates inside the batch, or of
//! earlier batches, are answered from the store as in single mode.
//!
//! A batch is closed when it is full or when no delivery arrives for the
//! linger time. Several batches are applied at once, but their acks go out in
//! the order the batches were received: a batch acks only after every earlier
//! batch is settled, so a cumulative ack never covers a delivery whose
//! transaction has not committed. If an earlier batch failed, later ones ack
//! one delivery at a time instead.
//!
//! Anything a batch cannot settle as a whole goes through the single path,
//! one message at a time, before the batch's ack: messages without a key,
//! keys another consumer holds right now, a reused key, and, when an effect
//! fails (which rolls the whole batch back), every message of the batch, so
//! the failing one is counted and the others are applied.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use idem_core::{Applied, ApplyError, Error};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::apply::ApplyBatch;
use super::config::Checkpoint;
use super::error::ConsumeError;
use super::error::Failure;
use super::message::KeyedMessage;
use super::process::classify;
use super::runtime::{Consumer, Shared, joined};
use super::settle::settle_lost;
use super::start::{check_delivery_limit, prepare};
use super::stats::{Settled, StatsSnapshot};
use super::transport::{Delivery, Settle, Transport};
use super::watchdog::Watchdog;

/// Deliveries of a batch that are ready for the batch's ack, with what each
/// became.
struct Ready<S> {
    acks: Vec<S>,
    outcomes: Vec<Settled>,
}

impl<S> Ready<S> {
    fn nothing() -> Self {
        Self {
            acks: Vec::new(),
            outcomes: Vec::new(),
        }
    }
}

impl<T: Transport, A: ApplyBatch> Consumer<T, A> {
    /// Consumes in batches until `shutdown` completes or the subscription
    /// ends. The broker's prefetch should be at least the batch size times
    /// the batches applied at once.
    pub async fn run_batched(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<StatsSnapshot, ConsumeError> {
        let replay = self.transport.replay_horizon();
        if let Err(error) = prepare(&self.shared.apply, &self.shared.config, replay).await {
            self.transport.close().await;
            return Err(error);
        }
        check_delivery_limit(self.transport.delivery_limit(), &self.shared.config);
        let mut shutdown = pin!(shutdown);
        let config = &self.shared.config;
        let (size, linger, at_once) = (config.batch, config.batch_linger, config.batches_at_once);
        let mut working = JoinSet::new();
        let mut previous: Option<oneshot::Receiver<bool>> = None;
        let mut watchdog = Watchdog::new(config.watchdog);
        let stopped = loop {
            let first = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                Some(done) = working.join_next(), if !working.is_empty() => {
                    watchdog.progress();
                    match joined(done) {
                        Ok(()) => continue,
                        Err(error) => break Err(error),
                    }
                }
                () = watchdog.stalled(), if watchdog.on() && !working.is_empty() => {
                    // The batches after a dropped one must not wait for its turn.
                    previous = None;
                    match watchdog.restart(&mut self.transport, &mut working).await {
                        Ok(()) => continue,
                        Err(error) => break Err(error),
                    }
                }
                received = self.transport.receive(), if working.len() < at_once => received,
            };
            watchdog.progress();
            let first = match first {
                Ok(Some(delivery)) => delivery,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error.into()),
            };
            let mut batch = vec![first];
            let mut ended = false;
            let mut failed = None;
            while batch.len() < size {
                match tokio::time::timeout(linger, self.transport.receive()).await {
                    Ok(Ok(Some(delivery))) => batch.push(delivery),
                    Ok(Ok(None)) => {
                        ended = true;
                        break;
                    }
                    Ok(Err(error)) => {
                        failed = Some(error);
                        break;
                    }
                    Err(_quiet) => break,
                }
            }
            self.transport.end_batch();
            self.shared.stats.received(batch.len() as u64);
            let (turn, next) = oneshot::channel();
            let earlier = previous.replace(next);
            working.spawn(batch_in_turn(
                Arc::clone(&self.shared),
                batch,
                earlier,
                turn,
            ));
            if let Some(error) = failed {
                break Err(error.into());
            }
            if ended {
                break Ok(());
            }
        };
        let mut finished = stopped;
        while let Some(done) = working.join_next().await {
            if let (Ok(()), Err(error)) = (&finished, joined(done)) {
                finished = Err(error);
            }
        }
        self.transport.close().await;
        finished.map(|()| self.shared.stats.snapshot())
    }
}

/// Applies one batch, waits for the earlier batches to be settled, acks, and
/// tells the next batch whether everything up to here was settled cleanly.
async fn batch_in_turn<A: ApplyBatch, S: Settle>(
    shared: Arc<Shared<A>>,
    batch: Vec<Delivery<S>>,
    earlier: Option<oneshot::Receiver<bool>>,
    turn: oneshot::Sender<bool>,
) -> Result<(), ConsumeError> {
    // On an error `turn` is dropped, which the next batch reads as "not clean".
    let ready = apply_batch(&shared, batch).await?;
    let clean = match earlier {
        None => true,
        Some(earlier) => earlier.await.unwrap_or(false),
    };
    idem_core::crash::point(idem_core::crash::BEFORE_ACK);
    if clean {
        if let Err(error) = S::ack_all(ready.acks).await {
            settle_lost("acked with its batch", &error);
        }
    } else {
        for settle in &ready.acks {
            shared.ack(settle).await;
        }
    }
    let replayed = ready
        .outcomes
        .iter()
        .filter(|o| **o == Settled::Replayed)
        .count();
    if replayed > 0 {
        tracing::info!(
            scope = shared.config.scope.as_str(),
            origin = shared.route.origin.as_str(),
            replayed,
            "duplicate deliveries in the batch answered from the store and acked; their effects did not run again"
        );
    }
    for outcome in ready.outcomes {
        shared.settled(outcome);
    }
    let _ = turn.send(clean);
    Ok(())
}

/// One batch: keys, one apply, the deliveries it could not settle as a whole
/// settled one by one; returns the rest, to be acked together.
async fn apply_batch<A: ApplyBatch, S: Settle>(
    shared: &Arc<Shared<A>>,
    batch: Vec<Delivery<S>>,
) -> Result<Ready<S>, ConsumeError> {
    let mut keyed = Vec::with_capacity(batch.len());
    let mut settles = Vec::with_capacity(batch.len());
    for Delivery { message, settle } in batch {
        match shared.keyed(message) {
            Ok(message) => {
                keyed.push(Arc::new(message));
                settles.push(settle);
            }
            Err(keyless) => {
                let (message, why) = *keyless;
                shared.dead_letter_keyless(message, why, &settle).await?;
            }
        }
    }
    if keyed.is_empty() {
        return Ok(Ready::nothing());
    }
    match shared.apply.apply_batch(keyed.clone()).await {
        Ok(answers) => {
            shared.reached(Checkpoint::AfterCommit);
            sort_answers(shared, keyed, settles, answers).await
        }
        Err(ApplyError::Effect((index, error))) => {
            tracing::info!(
                failed = shared.config.key_in_spans.show(&keyed[index].key),
                %error,
                "an effect failed and the batch was rolled back; applying its messages one by one"
            );
            one_by_one(shared, keyed, settles).await
        }
        Err(ApplyError::Protocol(error)) => {
            tracing::warn!(%error, "the batch could not be applied; applying its messages one by one");
            one_by_one(shared, keyed, settles).await
        }
    }
}

/// Settles the refused deliveries of a committed batch one by one; returns
/// the others for the batch's ack.
async fn sort_answers<A: ApplyBatch, S: Settle>(
    shared: &Arc<Shared<A>>,
    keyed: Vec<Arc<KeyedMessage>>,
    settles: Vec<S>,
    answers: Vec<Result<Applied, Error>>,
) -> Result<Ready<S>, ConsumeError> {
    let mut ready = Ready {
        acks: Vec::with_capacity(settles.len()),
        outcomes: Vec::with_capacity(settles.len()),
    };
    for ((message, settle), answer) in keyed.into_iter().zip(settles).zip(answers) {
        let terminal_letter = matches!(&answer, Ok(a) if a.outcome().is_failure() && !a.is_replay())
            && shared.config.dead_letter_terminal_failures;
        match answer {
            Ok(applied) if !terminal_letter => {
                ready.outcomes.push(if applied.is_replay() {
                    Settled::Replayed
                } else {
                    Settled::Applied
                });
                ready.acks.push(settle);
            }
            // Refused for this message alone: settled on its own. A key busy
            // elsewhere, or a store hiccup, goes through the single path
            // (which waits it out).
            answer => match answer.map_err(classify) {
                Err(Failure::Busy { .. } | Failure::Unavailable { .. }) => {
                    shared.process_keyed(message, &settle).await?;
                }
                answer => shared.settle(message, answer, &settle).await?,
            },
        }
    }
    Ok(ready)
}

/// Every message of a failed batch through the single path, in order.
async fn one_by_one<A: ApplyBatch, S: Settle>(
    shared: &Arc<Shared<A>>,
    keyed: Vec<Arc<KeyedMessage>>,
    settles: Vec<S>,
) -> Result<Ready<S>, ConsumeError> {
    for (message, settle) in keyed.into_iter().zip(settles) {
        shared.process_keyed(message, &settle).await?;
    }
    Ok(Ready::nothing())
}
