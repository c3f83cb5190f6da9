//! Leased mode on DynamoDB: [`LeaseStore`] on conditional writes.
//!
//! A claim reads the record (a strongly consistent read), lets
//! [`idem_core::decide`] answer, and writes what [`idem_core::Plan`] says a
//! claim writes, on the condition that the item is still the one it read
//! (no item, or the same `ver`). Of two callers racing for a key, one write
//! meets its condition; the other is refused, reads again, and finds the
//! winner's claim: `InFlight`. `renew`, `complete`, `release` and
//! `end_lease` are updates on the condition that the record is in flight
//! with the claim's token; refused, they answer `Fenced` with the token the
//! record holds now.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::ReturnValue;
use idem_core::{
    Claim, Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore, Operation, Outcome, Plan,
    Record, RecordState, Replay, Scope, Timestamp, decide, observe, protocol,
};

use crate::error::{self, MAX_ITEM_BYTES, is_condition_failure, map_error};
use crate::item::{self, Item, PARTITION_KEY};
use crate::record::{self, Stored};
use crate::store::DynamoStore;

/// How many times a claim reads and writes again after losing a race,
/// before it answers `InFlight`.
const CLAIM_ATTEMPTS: usize = 4;

/// A change to a held claim.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeldChange<'a> {
    /// A new lease end (`None`: released).
    Lease(Option<Timestamp>),
    /// The outcome that settles the record.
    Settle(&'a Outcome),
}

/// An update expression with its names and values, for an `UpdateItem`
/// or a transaction's `Update`.
pub(crate) struct Expression {
    pub(crate) update: String,
    pub(crate) condition: String,
    pub(crate) names: HashMap<String, String>,
    pub(crate) values: Item,
}

/// The update that makes `change` to the record `claim` holds, on the
/// condition that it is still held: in flight with the claim's token.
pub(crate) fn held_update(claim: &Claim, change: HeldChange<'_>, now: Timestamp) -> Expression {
    let mut names = HashMap::from([
        ("#state".to_owned(), record::STATE.to_owned()),
        ("#token".to_owned(), record::TOKEN.to_owned()),
        ("#lease".to_owned(), record::LEASE.to_owned()),
        ("#updated".to_owned(), record::UPDATED.to_owned()),
        ("#ver".to_owned(), record::VERSION.to_owned()),
    ]);
    let mut values: Item = HashMap::from([
        (
            ":in_flight".to_owned(),
            item::text(RecordState::InFlight.as_str()),
        ),
        (":token".to_owned(), item::number(claim.token.get())),
        (":now".to_owned(), item::number(now.0)),
        (":one".to_owned(), item::number(1)),
    ]);
    let mut set = vec!["#updated = :now", "#ver = #ver + :one"];
    let mut remove = Vec::new();
    match change {
        HeldChange::Lease(Some(until)) => {
            set.push("#lease = :lease");
            values.insert(":lease".into(), item::number(until.0));
        }
        HeldChange::Lease(None) => remove.push("#lease"),
        HeldChange::Settle(outcome) => {
            remove.push("#lease");
            names.insert("#okind".into(), record::OUTCOME_KIND.into());
            names.insert("#meta".into(), record::META.into());
            set.extend(["#state = :state", "#okind = :okind", "#meta = :meta"]);
            values.insert(
                ":state".into(),
                item::text(RecordState::settled_by(outcome.kind).as_str()),
            );
            values.insert(":okind".into(), item::text(outcome.kind.as_str()));
            values.insert(":meta".into(), item::text(outcome.meta_json()));
            names.insert("#body".into(), record::BODY.into());
            if outcome.body.is_empty() {
                remove.push("#body");
            } else {
                set.push("#body = :body");
                values.insert(":body".into(), item::bytes(outcome.body.clone()));
            }
        }
    }
    let mut update = format!("SET {}", set.join(", "));
    if !remove.is_empty() {
        update.push_str(&format!(" REMOVE {}", remove.join(", ")));
    }
    Expression {
        update,
        condition: "#state = :in_flight AND #token = :token".to_owned(),
        names,
        values,
    }
}

/// Refuses an outcome whose settled record would not fit in one item.
pub(crate) fn check_answer_size(
    store: &DynamoStore,
    claim: &Claim,
    outcome: &Outcome,
) -> Result<(), Error> {
    let settled = Record {
        scope: claim.scope.clone(),
        key: claim.key.clone(),
        fingerprint: Fingerprint::from_bytes([0; 32]),
        state: RecordState::settled_by(outcome.kind),
        token: claim.token,
        lease_until: None,
        outcome: Some(outcome.clone()),
        created_at: claim.expires_at,
        updated_at: claim.lease_until,
        expires_at: claim.expires_at,
    };
    let bytes = item::item_size(&record::to_item(
        &settled,
        i64::MAX,
        store.settings().tombstones,
    ));
    if bytes > MAX_ITEM_BYTES {
        return Err(error::item_too_large(
            &format!(
                "the answer to keep for {}/{} ({} bytes of body)",
                claim.scope,
                claim.key,
                outcome.body.len()
            ),
            bytes,
            true,
        ));
    }
    Ok(())
}

impl DynamoStore {
    /// The record of `(scope, key)` as stored, whatever its window.
    pub(crate) async fn read_stored(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Stored>, Error> {
        let pk = item::record_pk(scope, key);
        let found = self
            .client()
            .get_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(pk.clone())))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_error(&format!("reading the record of {scope}/{key}"), false, e))?;
        found
            .item
            .map(|item| record::from_item(&pk, &item))
            .transpose()
    }

    /// Claims `op`'s key, or answers why not, by a read and a conditional
    /// write; a lost race reads again.
    pub(crate) async fn claim_op(&self, op: &Operation) -> Result<Claimed, Error> {
        let (scope, key) = (&op.scope, &op.key);
        for _ in 0..CLAIM_ATTEMPTS {
            let now = self.now();
            let found = self.read_stored(scope, key).await?;
            let record = found.as_ref().map(|s| &s.record);
            let decision = match decide(record, scope, key, &op.fingerprint, now, self.settings()) {
                Ok(decision) => decision,
                Err(refusal) => {
                    observe::refused(&refusal);
                    return Err(refusal);
                }
            };
            let Some(plan) = Plan::of(&decision, record, now, self.settings()) else {
                let idem_core::Decision::Replay(replay) = decision else {
                    unreachable!("only a replay has no plan");
                };
                observe::replayed(scope);
                return Ok(Claimed::Replayed(Replay::new(
                    replay.outcome,
                    replay.expires_at,
                )));
            };
            let claimed = plan.in_flight(op, now, self.settings());
            if self
                .put_if_unchanged(&claimed, found.as_ref().map(|s| s.version))
                .await?
            {
                if plan.took_over {
                    observe::took_over(scope, plan.token);
                }
                return Ok(Claimed::Fresh(Claim {
                    scope: scope.clone(),
                    key: key.clone(),
                    token: plan.token,
                    lease_until: claimed.lease_until.unwrap_or(now),
                    took_over: plan.took_over,
                    expires_at: plan.expires_at,
                }));
            }
        }
        let refusal = protocol::busy(scope, key, self.settings());
        observe::refused(&refusal);
        Err(refusal)
    }

    /// Writes `record` whole if its item is still at version `seen` (`None`:
    /// if there is no item); `false` when it is not.
    async fn put_if_unchanged(&self, record: &Record, seen: Option<i64>) -> Result<bool, Error> {
        let version = seen.map_or(1, |v| v + 1);
        let item = record::to_item(record, version, self.settings().tombstones);
        let mut put = self
            .client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item));
        put = match seen {
            None => put
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PARTITION_KEY),
            Some(seen) => put
                .condition_expression("#ver = :seen")
                .expression_attribute_names("#ver", record::VERSION)
                .expression_attribute_values(":seen", item::number(seen)),
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(error) if is_condition_failure(&error) => Ok(false),
            Err(error) => Err(map_error(
                &format!("claiming {}/{}", record.scope, record.key),
                true,
                error,
            )),
        }
    }

    /// Changes a held claim; `Fenced` when its token is no longer current.
    pub(crate) async fn change_held(
        &self,
        claim: &Claim,
        change: HeldChange<'_>,
        what: &str,
    ) -> Result<(), Error> {
        if let HeldChange::Settle(outcome) = change {
            check_answer_size(self, claim, outcome)?;
        }
        let (scope, key) = (&claim.scope, &claim.key);
        let expression = held_update(claim, change, self.now());
        let updated = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(item::record_pk(scope, key))))
            .update_expression(expression.update)
            .condition_expression(expression.condition)
            .set_expression_attribute_names(Some(expression.names))
            .set_expression_attribute_values(Some(expression.values))
            .return_values(ReturnValue::None)
            .send()
            .await;
        match updated {
            Ok(_) => Ok(()),
            Err(error) if is_condition_failure(&error) => Err(self.fenced(claim).await),
            Err(error) => Err(map_error(
                &format!("the {what} of {scope}/{key}"),
                true,
                error,
            )),
        }
    }

    /// The refusal of a claim that is no longer held, with the token the
    /// record holds now.
    pub(crate) async fn fenced(&self, claim: &Claim) -> Error {
        let current = match self.read_stored(&claim.scope, &claim.key).await {
            Ok(found) => found.map(|s| s.record.token),
            Err(error) => return error,
        };
        let error = Error::Fenced {
            scope: claim.scope.clone(),
            key: claim.key.clone(),
            held: claim.token,
            current,
        };
        observe::refused(&error);
        error
    }
}

impl LeaseStore for DynamoStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        self.claim_op(&Operation::new(scope.clone(), key.clone(), fingerprint))
            .await
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        let lease_until = self.now().plus(self.settings().lease);
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
        let now = self.now();
        self.change_held(claim, HeldChange::Lease(Some(now)), "end of the lease")
            .await
    }
}
