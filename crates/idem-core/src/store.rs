//! What every store offers, whatever the database: the leased protocol (claim,
//! renew, complete, release, and [`LeaseStore::apply_leased`] around them) and
//! inspection and retention of records. The atomic mode, where the effect
//! writes in the store's own transaction, is [`AtomicStore`](crate::AtomicStore).

use std::future::Future;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::error::{ApplyError, Error};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::outcome::Outcome;
use crate::record::{FencingToken, Record, RecordState};
use crate::settings::Settings;

/// A claim held by one worker: the right to run the effect and record its
/// outcome, as long as the token is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Scope of the record.
    pub scope: Scope,
    /// The key.
    pub key: IdempotencyKey,
    /// The token this worker holds; completion is accepted only with it.
    pub token: FencingToken,
    /// When the lease ends unless renewed.
    pub lease_until: Timestamp,
    /// Whether this claim took over an expired one (a worker died or stalled).
    pub took_over: bool,
    /// When the key's dedupe window ends: until then a duplicate is answered
    /// from the record. A key claimed again inside its window (after a
    /// release or a takeover) keeps the window of its first claim.
    pub expires_at: Timestamp,
}

/// A settled key's answer to a duplicate: the stored outcome, and when the
/// key's dedupe window ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The outcome stored when the key was settled.
    pub outcome: Outcome,
    /// When the record stops answering duplicates (the end of its window).
    pub expires_at: Timestamp,
}

impl Replay {
    /// The stored outcome of `record`'s key, with the end of its window.
    pub fn new(outcome: Outcome, expires_at: Timestamp) -> Self {
        Self {
            outcome,
            expires_at,
        }
    }
}

/// What [`LeaseStore::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The caller now holds the key and must run the effect, then complete or
    /// release.
    Fresh(Claim),
    /// The key was settled before: here is its stored outcome. Run nothing.
    Replayed(Replay),
}

impl Claimed {
    /// The stored outcome, if this was a replay.
    pub fn replayed(&self) -> Option<&Outcome> {
        match self {
            Self::Replayed(replay) => Some(&replay.outcome),
            Self::Fresh(_) => None,
        }
    }
}

/// What an apply returned: the outcome, and whether it was produced now or
/// replayed from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The effect ran in this call and its outcome was stored.
    Fresh(Outcome),
    /// A duplicate: the stored outcome of an earlier call.
    Replayed(Outcome),
}

impl Applied {
    /// The outcome, fresh or replayed.
    pub fn outcome(&self) -> &Outcome {
        match self {
            Self::Fresh(o) | Self::Replayed(o) => o,
        }
    }

    /// Takes the outcome.
    pub fn into_outcome(self) -> Outcome {
        match self {
            Self::Fresh(o) | Self::Replayed(o) => o,
        }
    }

    /// Whether this was a replay.
    pub fn is_replay(&self) -> bool {
        matches!(self, Self::Replayed(_))
    }
}

/// One operation of a batch apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// Scope.
    pub scope: Scope,
    /// Key.
    pub key: IdempotencyKey,
    /// Fingerprint of the payload.
    pub fingerprint: Fingerprint,
}

impl Operation {
    /// An operation.
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint,
        }
    }
}

/// The leased protocol: for effects outside the database (an upstream HTTP call,
/// a payment gateway, an email).
///
/// The window between the effect and the completion cannot be closed for such
/// effects; it is narrowed: a worker that dies leaves an in-flight claim whose
/// lease runs out, after which a retry takes it over with a greater token, and
/// the stale worker's completion is refused as [`Error::Fenced`].
///
/// ```
/// # async fn demo(store: impl idem_core::LeaseStore) -> Result<(), idem_core::Error> {
/// use idem_core::{Claimed, Fingerprint, IdempotencyKey, Outcome, Scope};
/// let scope = Scope::new("emails").unwrap();
/// let key = IdempotencyKey::new("welcome/user-7").unwrap();
/// match store.claim(&scope, &key, Fingerprint::of_bytes(b"welcome")).await? {
///     Claimed::Fresh(claim) => {
///         // send the email here, outside the database
///         store.complete(&claim, &Outcome::success("sent")).await?;
///     }
///     Claimed::Replayed(replay) => assert_eq!(replay.outcome.body, b"sent"),
/// }
/// # Ok(()) }
/// ```
pub trait LeaseStore: Send + Sync {
    /// Claims the key for this caller (a new record, or a takeover of an expired
    /// lease), or returns the stored outcome. Refuses with `InFlight` or
    /// `KeyReuse` per the protocol table.
    fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> impl Future<Output = Result<Claimed, Error>> + Send;

    /// Extends the lease of a held claim (a heartbeat for long effects).
    /// `Fenced` if the claim was taken over.
    fn renew(&self, claim: &Claim) -> impl Future<Output = Result<Claim, Error>> + Send;

    /// Stores the outcome (a success or a terminal failure) and settles the
    /// record. `Fenced` if the token is no longer current.
    fn complete(
        &self,
        claim: &Claim,
        outcome: &Outcome,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Gives the key back after a retryable failure, so the next retry runs at
    /// once. The record keeps its token (ended lease), so tokens never repeat.
    fn release(&self, claim: &Claim) -> impl Future<Output = Result<(), Error>> + Send;

    /// Ends the lease of a held claim now, without settling the record or
    /// freeing the key: the record stays in flight, and the next claim takes
    /// it over (with the next token, `took_over` set), as it would after the
    /// holder died. For an attempt whose outcome is unknown when the next
    /// attempt should find out what happened at once instead of after the
    /// lease (the HTTP layer asks its reconcile hook on a takeover).
    /// `Fenced` if the claim was taken over already.
    fn end_lease(&self, claim: &Claim) -> impl Future<Output = Result<(), Error>> + Send;

    /// Runs an effect outside the database under the leased protocol: claim,
    /// run, then complete (success or terminal failure) or release (retryable
    /// failure). Called like [`AtomicStore::apply`](crate::AtomicStore::apply).
    ///
    /// The record comes *after* the effect: at-least-once. A crash between
    /// the effect and the record leaves the key claimed; once the lease ends,
    /// the retry runs the effect again. Nothing is lost, a repeat is possible,
    /// which is right for effects a downstream dedupes (a payment API taking
    /// the claim's key) or that can be repeated harmlessly. For an effect
    /// where a repeat is worse than a loss, see
    /// [`apply_at_most_once`](Self::apply_at_most_once).
    ///
    /// The effect receives the claim so it can forward the token downstream
    /// as a fencing token, or renew the lease while it works.
    fn apply_leased<F, Fut, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> impl Future<Output = Result<Applied, ApplyError<E>>> + Send
    where
        Self: Sized,
        F: FnOnce(Claim) -> Fut + Send,
        Fut: Future<Output = Result<Outcome, E>> + Send,
        E: Send,
    {
        async move {
            let claim = match self.claim(scope, key, fingerprint).await? {
                Claimed::Replayed(replay) => return Ok(Applied::Replayed(replay.outcome)),
                Claimed::Fresh(claim) => claim,
            };
            crate::crash::point(crate::crash::AFTER_CLAIM);
            match effect(claim.clone()).await {
                Ok(outcome) => {
                    crate::crash::point(crate::crash::INSIDE_EFFECT);
                    self.complete(&claim, &outcome).await?;
                    crate::crash::point(crate::crash::AFTER_COMMIT);
                    Ok(Applied::Fresh(outcome))
                }
                Err(error) => {
                    self.release(&claim).await?;
                    Err(ApplyError::Effect(error))
                }
            }
        }
    }

    /// Runs an effect outside the database at most once: claims the key,
    /// records it completed with `recorded`, and only then runs the effect.
    ///
    /// A crash between the record and the effect loses the effect — a retry
    /// finds the key recorded and replays `recorded` — but nothing can run it
    /// twice. Choose it where a second copy is worse than none: an SMS, an
    /// e-mail, a door opened, a parcel shipped. The effect's failure is
    /// returned as [`ApplyError::Effect`](crate::ApplyError::Effect) and the
    /// key stays recorded: retrying with the same key does not run it again
    /// (use a new key to try again on purpose).
    ///
    /// A claim taken over from a worker that died *before* recording never
    /// ran its effect, so the takeover runs it.
    fn apply_at_most_once<F, Fut, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        recorded: Outcome,
        effect: F,
    ) -> impl Future<Output = Result<Applied, ApplyError<E>>> + Send
    where
        Self: Sized,
        F: FnOnce(Claim) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send,
        E: Send,
    {
        async move {
            let claim = match self.claim(scope, key, fingerprint).await? {
                Claimed::Replayed(replay) => return Ok(Applied::Replayed(replay.outcome)),
                Claimed::Fresh(claim) => claim,
            };
            self.complete(&claim, &recorded).await?;
            crate::crash::point(crate::crash::AFTER_CLAIM);
            effect(claim).await.map_err(ApplyError::Effect)?;
            Ok(Applied::Fresh(recorded))
        }
    }
}

/// Which records to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    /// Only this scope.
    pub scope: Option<Scope>,
    /// Only this state.
    pub state: Option<RecordState>,
    /// Only keys that start with this text.
    pub key_prefix: Option<String>,
    /// Only records listed after this one, newest first: the next page of a
    /// listing that ended with it.
    pub after: Option<RecordCursor>,
    /// At most this many (newest first); `None` for all.
    pub limit: Option<usize>,
}

/// Where a page of records ended: the last record's creation time, scope and
/// key. Listings are ordered newest first, then by scope and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordCursor {
    /// The last record's creation time.
    pub created_at: Timestamp,
    /// Its scope.
    pub scope: Scope,
    /// Its key.
    pub key: IdempotencyKey,
}

impl RecordCursor {
    /// The cursor after `record`.
    pub fn after(record: &Record) -> Self {
        Self {
            created_at: record.created_at,
            scope: record.scope.clone(),
            key: record.key.clone(),
        }
    }

    /// Whether `record` comes after this cursor in the listing order (newest
    /// first, then scope, then key).
    pub fn precedes(&self, record: &Record) -> bool {
        record.created_at < self.created_at
            || (record.created_at == self.created_at
                && (record.scope.as_str(), record.key.as_str())
                    > (self.scope.as_str(), self.key.as_str()))
    }
}

impl RecordFilter {
    /// Whether `record` passes the filter's conditions (scope, state, key
    /// prefix, cursor); the limit is the listing's.
    pub fn admits(&self, record: &Record) -> bool {
        self.scope.as_ref().is_none_or(|s| *s == record.scope)
            && self.state.is_none_or(|s| s == record.state)
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|p| record.key.as_str().starts_with(p))
            && self.after.as_ref().is_none_or(|c| c.precedes(record))
    }
}

/// Inspection, schema and retention, for operators and the `idem` command.
pub trait RecordStore: Send + Sync {
    /// Lease and retention: how long claims are protected and how long
    /// records are kept (the dedupe window).
    fn settings(&self) -> &Settings;

    /// The time by the store's clock, which decides when records expire
    /// (the system clock unless the store was given another).
    fn now(&self) -> Timestamp {
        Clock::now(&SystemClock)
    }

    /// Creates or upgrades the schema. Safe to run again and from several
    /// processes at once.
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// The record for `(scope, key)`, if any.
    fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<Record>, Error>> + Send;

    /// Records matching the filter, newest first.
    fn list(
        &self,
        filter: &RecordFilter,
    ) -> impl Future<Output = Result<Vec<Record>, Error>> + Send;

    /// How many records are stored, and how many of them are past retention.
    fn count(&self) -> impl Future<Output = Result<RecordCount, Error>> + Send;

    /// Deletes at most `limit` records past retention; returns how many.
    fn sweep_batch(&self, limit: usize) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Like [`sweep_batch`](Self::sweep_batch), but only while no other
    /// process's sweeper is deleting: `None` when one is (PostgreSQL takes a
    /// transaction-level advisory lock for each batch). A store with a
    /// single writer has nothing to coordinate and always sweeps.
    fn sweep_batch_alone(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Option<u64>, Error>> + Send {
        async move { self.sweep_batch(limit).await.map(Some) }
    }

    /// The figures for the record gauges, read cheaply: how many records
    /// there are (PostgreSQL's planner estimate, an exact count on SQLite)
    /// and how old the record that expires first is, from the expiry index.
    fn glance(&self) -> impl Future<Output = Result<RecordGlance, Error>> + Send;

    /// Deletes every record past retention, `batch` at a time, so no single
    /// transaction holds locks for long. Returns how many were deleted.
    fn sweep(&self, batch: usize) -> impl Future<Output = Result<u64, Error>> + Send {
        async move {
            let batch = batch.max(1);
            let mut total = 0;
            loop {
                let deleted = self.sweep_batch(batch).await?;
                total += deleted;
                if deleted < batch as u64 {
                    return Ok(total);
                }
            }
        }
    }
}

/// What [`RecordStore::glance`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordGlance {
    /// Records stored (an estimate where the database keeps one).
    pub records: u64,
    /// Age of the record that expires first, by the store's clock; `None`
    /// when there are no records. Past the retention (plus the sweep
    /// interval), the sweeper is not keeping up.
    pub oldest_age: Option<std::time::Duration>,
}

/// Record counts reported by [`RecordStore::count`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordCount {
    /// All stored records.
    pub total: u64,
    /// Records past retention, waiting for a sweep.
    pub expired: u64,
}
