//! The queues between a store's callers and its group commit runners, and
//! the jobs on them: what the store keeps of its runners.

use std::sync::Mutex;
use std::time::Instant;

use idem_core::{Claim, Claimed, Error, Operation, Outcome};
use tokio::sync::{mpsc, oneshot};

use super::choice::Choice;

/// A queued claim and where its answer goes.
pub(crate) struct ClaimJob {
    pub(crate) op: Operation,
    pub(crate) reply: oneshot::Sender<Result<Claimed, Error>>,
    pub(crate) queued_at: Instant,
}

/// A queued completion and where its answer goes.
pub(crate) struct SettleJob {
    pub(crate) claim: Claim,
    pub(crate) outcome: Outcome,
    pub(crate) reply: oneshot::Sender<Result<(), Error>>,
    pub(crate) queued_at: Instant,
}

/// The queues of a store's runners: one for claims, one for completions.
#[derive(Clone)]
pub(crate) struct Queues {
    pub(crate) claims: mpsc::UnboundedSender<ClaimJob>,
    pub(crate) settles: mpsc::UnboundedSender<SettleJob>,
}

/// The queues of one store's runners, started on first use and again when
/// the runners have stopped (the runtime they ran on was shut down), and
/// which way claims and completions go.
#[derive(Default)]
pub(crate) struct Groups {
    queues: Mutex<Option<Queues>>,
    pub(crate) claims: Choice,
    pub(crate) completions: Choice,
}

impl Groups {
    /// The queues, from `start` if no runner takes from them any more.
    pub(crate) fn queues(&self, start: impl FnOnce() -> Queues) -> Queues {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        match &*queues {
            Some(q) if !q.claims.is_closed() && !q.settles.is_closed() => q.clone(),
            _ => {
                let started = start();
                *queues = Some(started.clone());
                started
            }
        }
    }
}
