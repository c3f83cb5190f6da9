//! Reading a record and deciding what to do with it: the step every claim path
//! (`apply`, `apply_batch`, `claim`) shares.
//!
//! Two ways in. The admission of `apply` (`admit.rs`) reads on a reader
//! connection, which answers most duplicates (a replay, a reused key, a live
//! claim) without touching the writer. Anything that would *write* goes to the
//! writer, where `decide_in` reads the record again inside the transaction and
//! decides on what that read found.

use idem_core::{
    Decision, Error, Operation, Plan, Record, Replay, Scope, Settings, Timestamp, decide, observe,
};
use rusqlite::Connection;

use crate::records;

/// What the writer decided for one key.
pub(crate) enum Step {
    Answer(Result<Replay, Error>),
    Run(Decision),
}

/// On the writer, inside its transaction: reads the record and decides. `Err`
/// carries the stored outcome to replay; refusals are errors.
///
/// With tombstones kept, a key without a record is looked up among them: a
/// key swept inside its grace period is refused as late, as its record was.
pub(crate) fn decide_in(
    conn: &Connection,
    protocol: &Protocol<'_>,
    op: &Operation,
) -> Result<Result<(Option<Record>, Decision), Replay>, Error> {
    let found = records::select(conn, op.scope.as_str(), op.key.as_str())?;
    let tombstone = match (&found, protocol.settings.tombstones) {
        (None, Some(grace)) => records::select_tombstone(conn, op, protocol.now, grace)?,
        _ => None,
    };
    match protocol.step(found.as_ref().or(tombstone.as_ref()), op) {
        Step::Answer(answer) => answer.map(Err),
        Step::Run(decision) => Ok(Ok((found, decision))),
    }
}

/// Reports a protocol answer through metrics and logs, and passes it on.
fn observed(scope: &Scope, answer: Result<Decision, Error>) -> Step {
    match answer {
        Ok(Decision::Replay(replay)) => {
            observe::replayed(scope);
            Step::Answer(Ok(replay))
        }
        Ok(decision) => Step::Run(decision),
        Err(refusal) => {
            observe::refused(&refusal);
            Step::Answer(Err(refusal))
        }
    }
}

/// The protocol at one moment: the store's settings and the clock's time.
pub(crate) struct Protocol<'a> {
    pub(crate) settings: &'a Settings,
    pub(crate) now: Timestamp,
}

impl Protocol<'_> {
    pub(crate) fn step(&self, found: Option<&Record>, op: &Operation) -> Step {
        observed(
            &op.scope,
            decide(
                found,
                &op.scope,
                &op.key,
                &op.fingerprint,
                self.now,
                self.settings,
            ),
        )
    }

    /// What carrying out `decision` on `found` writes; a takeover is reported.
    pub(crate) fn plan(&self, found: Option<&Record>, decision: &Decision, scope: &Scope) -> Plan {
        let plan = Plan::of(decision, found, self.now, self.settings)
            .expect("only claims and takeovers are carried out");
        if plan.took_over {
            observe::took_over(scope, plan.token);
        }
        plan
    }
}
