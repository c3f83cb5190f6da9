//! Keeping an answer until the store has it: the completion retried with
//! backoff while the claim is renewed, and the [`Spool`] that carries the
//! answer across a restart.
//!
//! # Why the answer goes out before it is stored
//!
//! Once the service has answered, its effect has happened; holding the
//! client until the database is back would only turn a stored-late answer
//! into a timeout and a retry. So the client gets the answer at once, and the
//! completion goes on in the background. A copy arriving meanwhile finds the
//! claim still in flight (409 with `Retry-After`), and the replay once the
//! completion lands. With a spool the answer is synced to the local file
//! before it is sent, so a process that dies meanwhile stores it at its next
//! start; without one, the retry lives in memory only.
//!
//! The completion is given up only when the claim was taken over (fenced):
//! the lease ran out and a retry holds the key now. That is the one case
//! logged as "could not store the response".

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Claim, Error, Fingerprint, LeaseStore, Outcome};
use idem_retry::Backoff;
use tracing::Instrument;

use super::Shared;
use super::notices::WaitableStore;
use super::spool::{Spool, SpoolError};
use super::wait::Announce;

/// The first delay between completion attempts, and the longest one.
const FIRST_DELAY: Duration = Duration::from_millis(50);
const LONGEST_DELAY: Duration = Duration::from_secs(2);

/// What a completion attempt told.
enum Completion {
    /// The record holds the answer.
    Stored,
    /// Another claim holds the key: this answer can no longer be stored.
    TakenOver(Error),
    /// The store did not take it this time.
    Failed(Error),
}

fn judge(claim: &Claim, result: Result<(), Error>) -> Completion {
    match result {
        Ok(()) => Completion::Stored,
        // The key is no longer in flight under this token: an earlier
        // attempt whose answer was lost did commit.
        Err(Error::Fenced { current, .. }) if current == Some(claim.token) => Completion::Stored,
        Err(error @ Error::Fenced { .. }) => Completion::TakenOver(error),
        Err(error) => Completion::Failed(error),
    }
}

/// Stores `outcome` for `claim`. If the store refuses it now, the answer is
/// kept (in the spool, synced, when there is one) and the completion retried
/// in the background until stored; this returns once the answer may be sent.
/// Waiting duplicates get the answer once it is stored (`announce`).
pub(super) async fn store_answer<St: WaitableStore + 'static>(
    shared: &Arc<Shared<St>>,
    claim: Claim,
    outcome: Outcome,
    announce: Announce<St>,
) {
    let scope = claim.scope.as_str();
    let error = match judge(&claim, shared.store.complete(&claim, &outcome).await) {
        Completion::Stored => {
            remember(shared, &claim, &outcome, announce.fingerprint());
            return announce.stored(&outcome, claim.expires_at);
        }
        Completion::TakenOver(error) => return given_up(&claim, &error),
        Completion::Failed(error) => error,
    };
    let spooled = match &shared.answers.spool {
        Some(spool) => match spool.keep(&claim, &outcome).await {
            Ok(id) => Some((spool.clone(), id)),
            Err(spool_error) => {
                tracing::error!(scope, %spool_error, "the answer could not be written to the spool; it is kept in memory only, and lost if this process stops before the store takes it");
                None
            }
        },
        None => None,
    };
    tracing::warn!(
        scope,
        %error,
        spooled = spooled.is_some(),
        "the store did not take the response yet; the client gets it, and its completion is retried until stored"
    );
    let shared = Arc::clone(shared);
    tokio::spawn(
        async move {
            let kept = complete_until_stored(&*shared.store, claim.clone(), &outcome, shared.config.lease).await;
            match kept {
                Ok(()) => {
                    tracing::info!(scope = claim.scope.as_str(), "the response kept while the store was away is stored");
                    remember(&shared, &claim, &outcome, announce.fingerprint());
                    announce.stored(&outcome, claim.expires_at);
                }
                Err(error) => given_up(&claim, &error),
            }
            if let Some((spool, id)) = spooled
                && let Err(error) = spool.stored(id).await
            {
                tracing::warn!(%error, "could not mark a spooled answer stored; it is completed again (harmlessly) at the next start");
            }
        }
        .in_current_span(),
    );
}

/// Keeps a stored answer in the layer's cache, for the replays to come.
fn remember<St>(shared: &Shared<St>, claim: &Claim, outcome: &Outcome, fingerprint: Fingerprint) {
    shared.cache.put(
        &claim.scope,
        &claim.key,
        fingerprint,
        Arc::new(outcome.clone()),
        claim.expires_at,
    );
}

/// Completes `claim` with `outcome`, retrying with full-jitter backoff and
/// renewing the claim every third of `lease`, until the store has the answer
/// (`Ok`) or the claim was taken over (the fencing error).
async fn complete_until_stored<St: LeaseStore>(
    store: &St,
    mut claim: Claim,
    outcome: &Outcome,
    lease: Duration,
) -> Result<(), Error> {
    let mut delays = Backoff::new(FIRST_DELAY, LONGEST_DELAY, u32::MAX).delays();
    let renew_every = (lease / 3).max(Duration::from_millis(10));
    let mut renewed = tokio::time::Instant::now();
    let mut failures: u64 = 0;
    loop {
        tokio::time::sleep(delays.next().unwrap_or(LONGEST_DELAY)).await;
        if renewed.elapsed() >= renew_every {
            // While the store is away this fails too; the completion tells
            // what matters.
            if let Ok(longer) = store.renew(&claim).await {
                claim = longer;
            }
            renewed = tokio::time::Instant::now();
        }
        match judge(&claim, store.complete(&claim, outcome).await) {
            Completion::Stored => return Ok(()),
            Completion::TakenOver(error) => return Err(error),
            Completion::Failed(error) => {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(scope = claim.scope.as_str(), %error, failures, "the store still does not take a kept response; retrying");
                }
            }
        }
    }
}

/// Logs an answer that can no longer be stored: the one case in which a
/// retry after the lease may run the request again.
fn given_up(claim: &Claim, error: &Error) {
    tracing::warn!(
        scope = claim.scope.as_str(),
        %error,
        "could not store the response: its claim was taken over after its lease ran out, so a retry may run again"
    );
}

impl Spool {
    /// Stores every answer an earlier run left here in `store`, each fenced
    /// by its claim's token (one taken over meanwhile is dropped and
    /// logged), and marks them done; waits, retrying and renewing every
    /// third of `lease`, while the store cannot be reached. Returns how many
    /// were stored. Call it before serving.
    pub async fn flush<St: LeaseStore>(
        &self,
        store: &St,
        lease: Duration,
    ) -> Result<usize, SpoolError> {
        flush(store, self, lease).await
    }
}

/// Stores every answer the spool kept from an earlier run, each with its
/// claim's fencing token; waits (retrying) while the store is away. Returns
/// how many were stored; entries whose claim was taken over are dropped.
pub(super) async fn flush<St: LeaseStore>(
    store: &St,
    spool: &Spool,
    lease: Duration,
) -> Result<usize, SpoolError> {
    let mut stored = 0;
    for entry in spool.unsettled() {
        let first = judge(
            &entry.claim,
            store.complete(&entry.claim, &entry.outcome).await,
        );
        let kept = match first {
            Completion::Stored => Ok(()),
            Completion::TakenOver(error) => Err(error),
            Completion::Failed(error) => {
                tracing::warn!(scope = entry.claim.scope.as_str(), %error, "the store does not take a spooled response yet; retrying before serving");
                complete_until_stored(store, entry.claim.clone(), &entry.outcome, lease).await
            }
        };
        match kept {
            Ok(()) => stored += 1,
            Err(error) => given_up(&entry.claim, &error),
        }
        spool.stored(entry.id).await?;
    }
    Ok(stored)
}
