//! The store's transitions on one key, as the SQLite and PostgreSQL stores
//! carry them out: a claim asks [`idem_core::decide`] what to do and writes
//! what [`idem_core::Plan`] says; complete, renew and release change the
//! record only while it is in flight under the caller's token; a sweep
//! deletes a record past retention. Only the decision is borrowed: the model
//! calls the real functions, so the check covers the real decision table.

use idem_core::{
    Decision, Error, FencingToken, Fingerprint, IdempotencyKey, Operation, Outcome, Plan, Record,
    RecordState, Scope, Settings, Timestamp, decide,
};

use crate::config::Bug;

/// The record as the model keeps it: the fields the protocol reads, small
/// enough to hash in every state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stored {
    /// In flight, completed or failed.
    pub state: RecordState,
    /// The current fencing token.
    pub token: FencingToken,
    /// When the lease ends; `None` once released or settled.
    pub lease_until: Option<Timestamp>,
    /// The first claim of this window.
    pub created_at: Timestamp,
    /// When the window ends.
    pub expires_at: Timestamp,
}

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The caller holds the key under the new record's token.
    Fresh {
        /// The record written.
        record: Stored,
        /// Whether an expired lease was taken over.
        took_over: bool,
    },
    /// The key is settled: the stored outcome is replayed.
    Replayed,
    /// Another claim's lease is running.
    InFlight,
}

/// The modelled store: one scope, one key, one payload.
#[derive(Debug, Clone)]
pub struct Store {
    op: Operation,
    settings: Settings,
    bug: Option<Bug>,
}

impl Store {
    /// A store with these settings, and a bug if one is planted.
    pub fn new(settings: Settings, bug: Option<Bug>) -> Self {
        let op = Operation::new(
            Scope::new("model").expect("a valid scope"),
            IdempotencyKey::new("k").expect("a valid key"),
            Fingerprint::of_bytes(b"the payload"),
        );
        Self { op, settings, bug }
    }

    /// A claim at `now` on what the store holds.
    pub fn claim(&self, found: Option<&Stored>, now: Timestamp) -> Claimed {
        let found = found.map(|stored| self.record(stored));
        let decision = match decide(
            found.as_ref(),
            &self.op.scope,
            &self.op.key,
            &self.op.fingerprint,
            now,
            &self.settings,
        ) {
            Ok(Decision::Replay(_)) => return Claimed::Replayed,
            Ok(decision) => decision,
            Err(Error::InFlight { .. }) => return Claimed::InFlight,
            Err(other) => panic!("one payload and a stored outcome: {other}"),
        };
        let plan = Plan::of(&decision, found.as_ref(), now, &self.settings)
            .expect("a claim or a takeover has a plan");
        let mut record = Self::stored(&plan.in_flight(&self.op, now, &self.settings));
        if let (Some(Bug::TakeoverReusesToken), true, Some(found)) =
            (self.bug, plan.took_over, &found)
        {
            record.token = found.token;
        }
        Claimed::Fresh {
            record,
            took_over: plan.took_over,
        }
    }

    /// Settles the record under `token`; `None` when fenced.
    pub fn complete(&self, found: Option<&Stored>, token: FencingToken) -> Option<Stored> {
        let any_token = self.bug == Some(Bug::CompleteIgnoresToken);
        let held = self.held(found, token, any_token)?;
        Some(Stored {
            state: RecordState::Completed,
            lease_until: None,
            ..held
        })
    }

    /// Moves the lease end (a renewal) or clears it (a release) under
    /// `token`; `None` when fenced.
    pub fn lease(
        &self,
        found: Option<&Stored>,
        token: FencingToken,
        until: Option<Timestamp>,
    ) -> Option<Stored> {
        let held = self.held(found, token, false)?;
        Some(Stored {
            lease_until: until,
            ..held
        })
    }

    /// Whether a sweep at `now` deletes the record.
    pub fn sweeps(&self, found: Option<&Stored>, now: Timestamp) -> bool {
        found.is_some_and(|stored| stored.expires_at <= now)
    }

    /// The end of a lease renewed at `now`.
    pub fn renewed(&self, now: Timestamp) -> Timestamp {
        now.plus(self.settings.lease)
    }

    /// The record changed by `token`'s holder: in flight, and under that
    /// token unless `any_token` (the planted bug). `WHERE token = ? AND state
    /// = 'in_flight'` in both stores.
    fn held(&self, found: Option<&Stored>, token: FencingToken, any_token: bool) -> Option<Stored> {
        let stored = *found?;
        let token_matches = any_token || stored.token == token;
        (stored.state == RecordState::InFlight && token_matches).then_some(stored)
    }

    fn record(&self, stored: &Stored) -> Record {
        Record {
            scope: self.op.scope.clone(),
            key: self.op.key.clone(),
            fingerprint: self.op.fingerprint,
            state: stored.state,
            token: stored.token,
            lease_until: stored.lease_until,
            outcome: stored.state.is_settled().then(|| Outcome::success("done")),
            created_at: stored.created_at,
            updated_at: stored.created_at,
            expires_at: stored.expires_at,
        }
    }

    fn stored(record: &Record) -> Stored {
        Stored {
            state: record.state,
            token: record.token,
            lease_until: record.lease_until,
            created_at: record.created_at,
            expires_at: record.expires_at,
        }
    }
}
