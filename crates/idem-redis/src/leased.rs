//! Leased mode on Redis: [`LeaseStore`] on the claim and change scripts.
//!
//! `claim` runs the claim script, which decides and writes in one step;
//! `renew`, `complete` and `release` run the change script, which changes
//! the record only while it is in flight with the claim's token and answers
//! `Fenced` with the current token otherwise. With a durability setting,
//! each write is followed by `WAIT` before the caller is answered.

use idem_core::{
    Claim, Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Replay, Scope, observe,
};

use crate::error::map_error;
use crate::names;
use crate::scripts::{self, ClaimAnswer, ClaimArgs, HeldChange};
use crate::store::RedisStore;

impl LeaseStore for RedisStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        let record = names::record(self.prefix(), scope, key);
        let now = self.clock().now();
        let args = ClaimArgs {
            scope,
            key,
            fingerprint,
            now,
            settings: self.settings(),
        };
        let reply: Vec<Vec<u8>> = scripts::claim_invocation(&record, &args)
            .invoke_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&format!("claiming {scope}/{key}"), true, e))?;
        let (answer, other_rule) = scripts::claim_answer(&record, reply)?;
        if let Some(stored) = other_rule {
            observe::fingerprint_rule_changed(scope, &stored, &fingerprint);
        }
        let refusal = match answer {
            ClaimAnswer::Claimed {
                token,
                lease_until,
                took_over,
                expires_at,
            } => {
                if took_over {
                    observe::took_over(scope, token);
                }
                self.wait_for_replicas(&record, || format!("claim of {scope}/{key}"))
                    .await?;
                return Ok(Claimed::Fresh(Claim {
                    scope: scope.clone(),
                    key: key.clone(),
                    token,
                    lease_until,
                    took_over,
                    expires_at,
                }));
            }
            ClaimAnswer::Replay(outcome, expires_at) => {
                observe::replayed(scope);
                return Ok(Claimed::Replayed(Replay::new(outcome, expires_at)));
            }
            ClaimAnswer::Expired(expired_at) => Error::Expired {
                scope: scope.clone(),
                key: key.clone(),
                expired_at,
            },
            ClaimAnswer::KeyReuse => Error::KeyReuse {
                scope: scope.clone(),
                key: key.clone(),
            },
            ClaimAnswer::InFlight { retry_after } => Error::InFlight {
                scope: scope.clone(),
                key: key.clone(),
                retry_after,
            },
        };
        observe::refused(&refusal);
        Err(refusal)
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        let now = self.clock().now();
        let lease_until = now.plus(self.settings().lease);
        self.change_held(claim, HeldChange::Lease(Some(lease_until)), "renewal")
            .await?;
        Ok(Claim {
            lease_until,
            ..claim.clone()
        })
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.change_held(claim, HeldChange::Settle(outcome), "completion")
            .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.change_held(claim, HeldChange::Lease(None), "release")
            .await
    }

    async fn end_lease(&self, claim: &Claim) -> Result<(), Error> {
        let now = self.clock().now();
        self.change_held(claim, HeldChange::Lease(Some(now)), "end of the lease")
            .await
    }
}

impl RedisStore {
    /// Changes a held claim; `Fenced` when its token is no longer current.
    async fn change_held(
        &self,
        claim: &Claim,
        change: HeldChange<'_>,
        what: &str,
    ) -> Result<(), Error> {
        let (scope, key) = (&claim.scope, &claim.key);
        let record = names::record(self.prefix(), scope, key);
        let now = self.clock().now();
        let reply: Vec<Vec<u8>> = scripts::change_invocation(&record, claim.token, now, &change)
            .invoke_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&format!("the {what} of {scope}/{key}"), true, e))?;
        if let Some(current) = scripts::change_answer(&record, reply)? {
            let error = Error::Fenced {
                scope: scope.clone(),
                key: key.clone(),
                held: claim.token,
                current,
            };
            observe::refused(&error);
            return Err(error);
        }
        self.wait_for_replicas(&record, || format!("{what} of {scope}/{key}"))
            .await
    }
}
