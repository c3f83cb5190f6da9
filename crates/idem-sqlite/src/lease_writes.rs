//! The writer's side of leased mode: a claim and a change to a held claim as
//! they are decided and written inside the writer's transaction, and the lease
//! jobs that carry them to the writer.
//!
//! # Why claims and completions are jobs of their own
//!
//! A new key is one claim and one completion, each a small write. As generic
//! grouped jobs each would be a boxed closure run in a savepoint of its own,
//! and the savepoint's statements cost more than the write. A lease job is
//! plain data (the operation, or the claim and its outcome, and where to send
//! the answer): the writer takes every job queued at that moment, decides and
//! writes them one after another in one transaction, commits once, and only
//! then sends each job its answer, straight to the task waiting for it.
//!
//! No savepoint is needed because a lease job writes with at most one
//! statement, and a statement that fails is undone by SQLite alone, not the
//! transaction around it: a refused or failing job leaves the others of its
//! batch as they were. An error that ends the whole transaction (a full disk,
//! an I/O error) is seen by the writer, which then answers every job of that
//! transaction with an error: no claim is answered `Fresh` before its row is
//! committed.

use idem_core::{
    Claim, Claimed, Error, ErrorKind, FencingToken, Operation, Outcome, Settings, SharedClock,
    StoreError, Timestamp, observe,
};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::decision::{Protocol, decide_in};
use crate::records::{self, HeldChange};

/// What the writer needs to decide claims itself: the store's settings and
/// clock.
#[derive(Debug)]
pub(crate) struct LeaseContext {
    pub(crate) settings: Settings,
    pub(crate) clock: SharedClock,
}

impl LeaseContext {
    fn protocol(&self) -> Protocol<'_> {
        Protocol {
            settings: &self.settings,
            now: self.clock.now(),
        }
    }
}

/// A leased claim or completion on its way to the writer.
#[derive(Debug)]
pub(crate) enum LeaseJob {
    /// Claim `op`'s key.
    Claim {
        op: Operation,
        reply: oneshot::Sender<Result<Claimed, Error>>,
    },
    /// Settle `claim` with `outcome`, fenced by its token.
    Complete {
        claim: Claim,
        outcome: Outcome,
        reply: oneshot::Sender<Result<(), Error>>,
    },
}

/// A lease job's result, held until its transaction's commit is known.
pub(crate) enum LeaseAnswer {
    Claim(
        oneshot::Sender<Result<Claimed, Error>>,
        Result<Claimed, Error>,
    ),
    Complete(oneshot::Sender<Result<(), Error>>, Result<(), Error>),
}

impl LeaseJob {
    /// A claim of `op`'s key, and where its answer arrives.
    pub(crate) fn claim(op: Operation) -> (Self, oneshot::Receiver<Result<Claimed, Error>>) {
        let (reply, answer) = oneshot::channel();
        (Self::Claim { op, reply }, answer)
    }

    /// A completion of `claim`, and where its answer arrives.
    pub(crate) fn complete(
        claim: Claim,
        outcome: Outcome,
    ) -> (Self, oneshot::Receiver<Result<(), Error>>) {
        let (reply, answer) = oneshot::channel();
        (
            Self::Complete {
                claim,
                outcome,
                reply,
            },
            answer,
        )
    }

    /// Decides and writes the job in the writer's open transaction; the
    /// answer is sent once the commit is known.
    pub(crate) fn run(self, conn: &Connection, context: &LeaseContext) -> LeaseAnswer {
        let protocol = context.protocol();
        match self {
            Self::Claim { op, reply } => LeaseAnswer::Claim(reply, claim_in(conn, &protocol, op)),
            Self::Complete {
                claim,
                outcome,
                reply,
            } => LeaseAnswer::Complete(
                reply,
                change_held_in(conn, &claim, HeldChange::Settle(&outcome), protocol.now),
            ),
        }
    }

    /// Answers the job with `error` without running it (no transaction could
    /// be started).
    pub(crate) fn refuse(self, error: &Error) {
        match self {
            Self::Claim { reply, .. } => {
                let _ = reply.send(Err(error.copy_for_group()));
            }
            Self::Complete { reply, .. } => {
                let _ = reply.send(Err(error.copy_for_group()));
            }
        }
    }
}

impl LeaseAnswer {
    /// Sends the job's answer: its own result when its transaction committed
    /// (`None`); otherwise its own error, or else the transaction's.
    pub(crate) fn send(self, commit_error: Option<&Error>) {
        fn settled<T>(result: Result<T, Error>, commit_error: Option<&Error>) -> Result<T, Error> {
            match (commit_error, result) {
                (None, result) | (Some(_), result @ Err(_)) => result,
                (Some(error), Ok(_)) => Err(error.copy_for_group()),
            }
        }
        match self {
            Self::Claim(reply, result) => {
                let _ = reply.send(settled(result, commit_error));
            }
            Self::Complete(reply, result) => {
                let _ = reply.send(settled(result, commit_error));
            }
        }
    }
}

/// Claims `op`'s key inside the open transaction: reads the record, decides,
/// and for a claim or takeover writes the in-flight record (one statement).
pub(crate) fn claim_in(
    conn: &Connection,
    protocol: &Protocol<'_>,
    op: Operation,
) -> Result<Claimed, Error> {
    let (found, decision) = match decide_in(conn, protocol, &op)? {
        Ok(claim) => claim,
        Err(replay) => return Ok(Claimed::Replayed(replay)),
    };
    let plan = protocol.plan(found.as_ref(), &decision, &op.scope);
    let record = plan.in_flight(&op, protocol.now, protocol.settings);
    records::write(conn, &record)?;
    Ok(Claimed::Fresh(Claim {
        token: record.token,
        lease_until: record.lease_until.expect("claims carry a lease"),
        took_over: plan.took_over,
        expires_at: record.expires_at,
        scope: op.scope,
        key: op.key,
    }))
}

/// Applies `change` to a held claim (one statement), or answers `Fenced`
/// with the current token.
pub(crate) fn change_held_in(
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

/// The refusal for a claim whose token is no longer current, reported.
pub(crate) fn fenced(claim: &Claim, current: Option<FencingToken>) -> Error {
    let error = Error::Fenced {
        scope: claim.scope.clone(),
        key: claim.key.clone(),
        held: claim.token,
        current,
    };
    observe::refused(&error);
    error
}

/// The answer of every write of a transaction that ended before its commit.
pub(crate) fn ended_early() -> Error {
    StoreError::new(
        ErrorKind::CommitUnknown,
        "the SQLite transaction this write shared with others ended before its commit (an \
         error that rolls back the whole transaction, such as a full disk, or an effect that \
         ended it itself); the write may not be committed — run it again under its key",
    )
    .into()
}
