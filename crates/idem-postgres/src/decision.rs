//! Reading a record and deciding what to do with it: the step every claim path
//! (`apply`, `apply_batch`, `claim`) shares.
//!
//! Two ways in. [`PgStore::peek`] is the fast path: one plain `SELECT` outside any
//! transaction that answers most duplicates (a replay, a reused key, a live
//! claim) in one round trip. It can do so because those answers only depend on
//! facts that do not change under a caller's feet: a settled record keeps its
//! outcome and fingerprint until it expires, and a stale "in flight" only makes
//! a caller retry a little early. Anything that would *write* (no record, an
//! expired one, an ended lease) goes the locked way: the key's advisory lock is
//! tried, the record read again in the next statement, and
//! [`PgStore::decide_read`] decides on what that read found.
//!
//! [`Next`] then turns a decision into a replay or the [`Plan`] of the record to write.

use idem_core::{
    Decision, Error, Fingerprint, IdempotencyKey, Plan, Record, Replay, Scope, Settings, Timestamp,
    decide, observe, protocol,
};
use sqlx::postgres::PgExecutor;

use crate::records;
use crate::store::PgStore;

/// Reports a decision's protocol events: replays, refusals and takeovers.
pub(crate) fn observed(
    decision: Result<Decision, Error>,
    scope: &Scope,
) -> Result<Decision, Error> {
    match &decision {
        Ok(Decision::Replay(_)) => observe::replayed(scope),
        Ok(Decision::TakeOver { token }) => observe::took_over(scope, *token),
        Ok(Decision::Claim { .. }) => {}
        Err(error) => observe::refused(error),
    }
    decision
}

impl PgStore {
    /// The fast path: `Ok(Some(outcome))` for a replay, `Err` for a refusal,
    /// `Ok(None)` when the caller must take the locked path.
    ///
    /// `db` is the pool, or the connection the caller goes on to lock with (one
    /// pool checkout for both).
    pub(crate) async fn peek<'e>(
        &self,
        db: impl PgExecutor<'e>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Option<Replay>, Error> {
        let found = records::fetch(db, scope, key)
            .await
            .map_err(|e| self.fail(e))?;
        self.decide_peeked(found, scope, key, fingerprint)
    }

    /// [`peek`](Self::peek) through a pooler, outside any transaction: the
    /// read is one simple query (see `pooler`).
    pub(crate) async fn peek_alone<'e>(
        &self,
        db: impl PgExecutor<'e>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Option<Replay>, Error> {
        let found = records::fetch_alone(db, scope, key)
            .await
            .map_err(|e| self.fail(e))?;
        self.decide_peeked(found, scope, key, fingerprint)
    }

    /// What a peek that found `found` answers.
    fn decide_peeked(
        &self,
        found: Option<idem_core::Record>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Option<Replay>, Error> {
        let Some(found) = found else {
            return Ok(None);
        };
        let now = self.clock().now();
        match decide(Some(&found), scope, key, fingerprint, now, self.settings()) {
            Ok(Decision::Replay(replay)) => {
                observe::replayed(scope);
                Ok(Some(replay))
            }
            Ok(Decision::Claim { .. } | Decision::TakeOver { .. }) => Ok(None),
            Err(error) => {
                observe::refused(&error);
                Err(error)
            }
        }
    }

    /// The refusal of a caller that found the key's lock taken, reported.
    pub(crate) fn busy(&self, scope: &Scope, key: &IdempotencyKey) -> Error {
        let error = protocol::busy(scope, key, self.settings());
        observe::refused(&error);
        error
    }

    /// Decides on a record read right after trying the key's lock, and
    /// reports the decision.
    ///
    /// With the lock (`granted`), this is [`decide_held`](Self::decide_held).
    /// Without it, only the answers that do not need it are given, as on the
    /// fast path: a replay, a reused key, a live lease. Anything that would
    /// claim the key is `InFlight`: another caller holds it right now.
    pub(crate) fn decide_read(
        &self,
        granted: bool,
        found: Option<&Record>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Result<Decision, Error> {
        if granted {
            return self.decide_held(found, scope, key, fingerprint, now);
        }
        match decide(found, scope, key, fingerprint, now, self.settings()) {
            Ok(Decision::Replay(replay)) => {
                observe::replayed(scope);
                Ok(Decision::Replay(replay))
            }
            Ok(Decision::Claim { .. } | Decision::TakeOver { .. }) => Err(self.busy(scope, key)),
            Err(error) => {
                observe::refused(&error);
                Err(error)
            }
        }
    }

    /// Decides on a record read under the key's lock, and reports the decision.
    pub(crate) fn decide_held(
        &self,
        found: Option<&Record>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Result<Decision, Error> {
        observed(
            decide(found, scope, key, fingerprint, now, self.settings()),
            scope,
        )
    }
}

/// What a caller does once the protocol has decided.
#[derive(Debug)]
pub(crate) enum Next {
    /// Return the stored outcome; run nothing.
    Replay(Replay),
    /// Run the effect (or hand out the claim) under this plan.
    Run(Plan),
}

impl Next {
    /// What to do after `decision`: replay, or run with this plan (see
    /// [`Plan::of`] for the window the record keeps).
    pub(crate) fn after(
        decision: Decision,
        found: Option<&Record>,
        now: Timestamp,
        settings: &Settings,
    ) -> Self {
        match decision {
            Decision::Replay(replay) => Next::Replay(replay),
            decision => Next::Run(
                Plan::of(&decision, found, now, settings)
                    .expect("claims and takeovers have a plan"),
            ),
        }
    }
}
