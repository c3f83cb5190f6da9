//! Failed attempts per message on DynamoDB: [`AttemptStore`], one item per
//! `(scope, key)` beside the record (partition key prefix `a#`), counted by
//! one atomic update and given the retention as its time to live (a message
//! failing for longer than the dedupe window starts counting again, as after
//! a sweep on the other stores).

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use idem_core::{
    AttemptStore, Error, ErrorKind, Failures, IdempotencyKey, Scope, StoreError, Timestamp,
};

use crate::error::{is_condition_failure, map_error};
use crate::item::{self, ATTEMPTS_PREFIX, PARTITION_KEY, Reader};
use crate::store::DynamoStore;

const COUNT: &str = "count";
const FIRST: &str = "first";
const UPDATED: &str = "updated";
const ERROR: &str = "error";

impl AttemptStore for DynamoStore {
    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        let now = DynamoStore::now(self);
        let what = format!("recording a failed attempt of {scope}/{key}");
        let updated = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(item::attempts_pk(scope, key))))
            .update_expression(
                "ADD #count :one SET #first = if_not_exists(#first, :now), #updated = :now, #error = :error, #ttl = :ttl",
            )
            .expression_attribute_names("#count", COUNT)
            .expression_attribute_names("#first", FIRST)
            .expression_attribute_names("#updated", UPDATED)
            .expression_attribute_names("#error", ERROR)
            .expression_attribute_names("#ttl", item::TTL_ATTRIBUTE)
            .expression_attribute_values(":one", item::number(1))
            .expression_attribute_values(":now", item::number(now.0))
            .expression_attribute_values(":error", item::text(error))
            .expression_attribute_values(
                ":ttl",
                item::ttl_at(now.plus(self.settings().retention)),
            )
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(|e| map_error(&what, true, e))?;
        let attributes = updated.attributes.unwrap_or_default();
        let read = Reader::new(&attributes);
        let counted = read
            .number(COUNT)
            .and_then(|count| Ok((count, read.number(FIRST)?)));
        let (count, first) = counted.map_err(|why| {
            Error::from(StoreError::new(
                ErrorKind::Corrupt,
                format!("{what}: the attempts item is not one Idem wrote ({why})"),
            ))
        })?;
        Ok(Failures {
            count: u32::try_from(count).unwrap_or(u32::MAX),
            first_at: Timestamp(first),
        })
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        self.client()
            .delete_item()
            .table_name(self.table())
            .set_key(Some(item::key_of(item::attempts_pk(scope, key))))
            .send()
            .await
            .map_err(|e| {
                map_error(
                    &format!("forgetting the failures of {scope}/{key}"),
                    true,
                    e,
                )
            })?;
        Ok(())
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        let mut deleted = 0;
        for found in self.scan_prefix(ATTEMPTS_PREFIX).await? {
            if deleted >= limit as u64 {
                break;
            }
            let Some(AttributeValue::S(pk)) = found.get(PARTITION_KEY) else {
                continue;
            };
            let stale = Reader::new(&found)
                .number(UPDATED)
                .is_ok_and(|updated| updated < before.0);
            if !stale {
                continue;
            }
            let gone = self
                .client()
                .delete_item()
                .table_name(self.table())
                .set_key(Some(item::key_of(pk.clone())))
                .condition_expression("#updated < :before")
                .expression_attribute_names("#updated", UPDATED)
                .expression_attribute_values(":before", item::number(before.0))
                .send()
                .await;
            match gone {
                Ok(_) => deleted += 1,
                Err(error) if is_condition_failure(&error) => {}
                Err(error) => return Err(map_error(&format!("sweeping {pk}"), true, error)),
            }
        }
        Ok(deleted)
    }

    fn now(&self) -> Timestamp {
        DynamoStore::now(self)
    }
}
