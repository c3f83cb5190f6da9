//! What operators change by hand, on DynamoDB: [`AdminStore`]. The audit
//! log is one item per entry (partition key `l#ID`), its id taken from a
//! counter item (`n#audit`), read newest first.
//!
//! Each change and its audit entry are one `TransactWriteItems`: the change
//! on the condition that the record (or letter) is still as the operator
//! saw it, and the entry's `Put`. Both are written, or neither is; an id
//! taken for a change that was then refused is left unused.

use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};
use idem_core::{
    AdminStore, AuditAction, AuditEntry, AuditSubject, DeadLetterStore, Error, ErrorKind,
    LetterAction, NewAuditEntry, Record, RecordAction, StoreError, Timestamp,
};

use crate::dead_letters::{ARCHIVED_AT, REDRIVEN_AT};
use crate::item::{self, AUDIT_PREFIX, Item, PARTITION_KEY, Reader};
use crate::record;
use crate::store::DynamoStore;
use crate::transaction::Commit;

const AT: &str = "at";
const ACTOR: &str = "actor";
const ACTION: &str = "action";
const SCOPE: &str = "scope";
const KEY: &str = "key";
const DEAD_LETTER: &str = "dead_letter";
const BEFORE: &str = "before";

/// What a guarded change came to.
enum Changed {
    Done(AuditEntry),
    Refused,
}

fn build_error(what: &str, error: impl std::fmt::Display) -> Error {
    StoreError::new(ErrorKind::Other, format!("{what}: {error}")).into()
}

/// A condition that an optional number attribute is as seen.
fn seen_number(name: &str, placeholder: &str, seen: Option<i64>, values: &mut Item) -> String {
    match seen {
        Some(value) => {
            values.insert(placeholder.to_owned(), item::number(value));
            format!("{name} = {placeholder}")
        }
        None => format!("attribute_not_exists({name})"),
    }
}

/// An item's key and the condition that it is as an operator saw it:
/// the write of an operator's change, as a delete or an update.
struct Guard<'a> {
    key: Item,
    condition: String,
    /// The placeholders `condition` names, and the attributes they stand for.
    names: &'a [(&'static str, &'static str)],
}

impl Guard<'_> {
    /// Deletes the item if it is as seen.
    fn delete(
        self,
        store: &DynamoStore,
        values: Option<Item>,
        what: &str,
    ) -> Result<TransactWriteItem, Error> {
        let mut delete = Delete::builder()
            .table_name(store.table())
            .set_key(Some(self.key))
            .condition_expression(self.condition)
            .set_expression_attribute_values(values);
        for (placeholder, name) in self.names {
            delete = delete.expression_attribute_names(*placeholder, *name);
        }
        Ok(TransactWriteItem::builder()
            .delete(delete.build().map_err(|e| build_error(what, e))?)
            .build())
    }

    /// Applies `expression` to the item if it is as seen; `more_names` are
    /// the placeholders only the expression uses.
    fn update(
        self,
        store: &DynamoStore,
        expression: &str,
        more_names: &[(&str, &str)],
        values: Option<Item>,
        what: &str,
    ) -> Result<TransactWriteItem, Error> {
        let mut update = Update::builder()
            .table_name(store.table())
            .set_key(Some(self.key))
            .update_expression(expression)
            .condition_expression(self.condition)
            .set_expression_attribute_values(values);
        for (placeholder, name) in more_names.iter().chain(self.names) {
            update = update.expression_attribute_names(*placeholder, *name);
        }
        Ok(TransactWriteItem::builder()
            .update(update.build().map_err(|e| build_error(what, e))?)
            .build())
    }
}

impl DynamoStore {
    /// Writes `change` and the audit entry for it in one transaction.
    async fn change_and_log(
        &self,
        change: TransactWriteItem,
        entry: NewAuditEntry,
        what: &str,
    ) -> Result<Changed, Error> {
        let id = self.next_id(item::AUDIT_COUNTER, what).await?;
        let now = DynamoStore::now(self);
        let (scope, key, letter) = entry.subject.columns();
        let mut logged = item::key_of(item::audit_pk(id));
        logged.extend([
            ("id".to_owned(), item::number(id)),
            (AT.to_owned(), item::number(now.0)),
            (ACTOR.to_owned(), item::text(&entry.actor)),
            (ACTION.to_owned(), item::text(entry.action.as_str())),
            (KEY.to_owned(), item::text(key)),
            (BEFORE.to_owned(), item::text(&entry.before)),
        ]);
        if let Some(scope) = scope {
            logged.insert(SCOPE.to_owned(), item::text(scope));
        }
        if let Some(letter) = letter {
            logged.insert(DEAD_LETTER.to_owned(), item::number(letter));
        }
        let put = Put::builder()
            .table_name(self.table())
            .set_item(Some(logged))
            .build()
            .map_err(|e| build_error(what, e))?;
        let items = vec![change, TransactWriteItem::builder().put(put).build()];
        match self.commit(items, what).await? {
            Commit::Done => Ok(Changed::Done(entry.stored(id, now))),
            Commit::Cancelled(reasons) if Commit::condition_failed(&reasons, 0) => {
                Ok(Changed::Refused)
            }
            Commit::Cancelled(reasons) => Err(crate::transaction::cancelled(&reasons, 0, what)),
        }
    }

    async fn change_record(
        &self,
        seen: &Record,
        actor: &str,
        action: AuditAction,
    ) -> Result<RecordAction, Error> {
        let what = format!("the {action} of {}/{}", seen.scope, seen.key);
        let mut values: Item = Item::from([
            (":state".to_owned(), item::text(seen.state.as_str())),
            (":token".to_owned(), item::number(seen.token.get())),
            (":updated".to_owned(), item::number(seen.updated_at.0)),
        ]);
        let lease = seen_number(
            "#lease",
            ":lease",
            seen.lease_until.map(|t| t.0),
            &mut values,
        );
        let condition =
            format!("#state = :state AND #token = :token AND #updated = :updated AND {lease}");
        let names = [
            ("#state", record::STATE),
            ("#token", record::TOKEN),
            ("#updated", record::UPDATED),
            ("#lease", record::LEASE),
        ];
        let key = item::key_of(item::record_pk(&seen.scope, &seen.key));
        let guard = Guard {
            key,
            condition,
            names: &names,
        };
        let change = if action == AuditAction::Evict {
            guard.delete(self, Some(values), &what)?
        } else {
            values.insert(":one".into(), item::number(1));
            values.insert(":now".into(), item::number(DynamoStore::now(self).0));
            guard.update(
                self,
                "SET #token = #token + :one, #updated = :now, #ver = #ver + :one REMOVE #lease",
                &[("#ver", record::VERSION)],
                Some(values),
                &what,
            )?
        };
        let entry = NewAuditEntry::for_record(actor, action, seen);
        match self.change_and_log(change, entry, &what).await? {
            Changed::Done(logged) => Ok(RecordAction::Done(logged)),
            Changed::Refused => {
                let now = self.read_stored(&seen.scope, &seen.key).await?;
                Ok(match now.map(|s| s.record) {
                    None => RecordAction::Missing,
                    Some(now) => RecordAction::Changed(now),
                })
            }
        }
    }

    async fn change_letter(
        &self,
        id: i64,
        actor: &str,
        action: AuditAction,
    ) -> Result<LetterAction, Error> {
        // A letter redriven between the read and the change is read again.
        for _ in 0..3 {
            let Some(letter) = self.get_dead_letter(id).await? else {
                return Ok(LetterAction::Missing);
            };
            if action == AuditAction::Archive
                && let Some(at) = letter.archived_at
            {
                return Ok(LetterAction::AlreadyArchived(at));
            }
            let what = format!("the {action} of dead letter {id}");
            let mut values = Item::new();
            let redriven = seen_number(
                "#redriven",
                ":redriven",
                letter.redriven_at.map(|t| t.0),
                &mut values,
            );
            let archived = seen_number(
                "#archived",
                ":archived",
                letter.archived_at.map(|t| t.0),
                &mut values,
            );
            let condition = format!("attribute_exists(#pk) AND {redriven} AND {archived}");
            let key = item::key_of(item::dead_letter_pk(id));
            let names = [
                ("#pk", PARTITION_KEY),
                ("#redriven", REDRIVEN_AT),
                ("#archived", ARCHIVED_AT),
            ];
            let guard = Guard {
                key,
                condition,
                names: &names,
            };
            let change = if action == AuditAction::Discard {
                guard.delete(self, (!values.is_empty()).then_some(values), &what)?
            } else {
                values.insert(":now".into(), item::number(DynamoStore::now(self).0));
                guard.update(self, "SET #archived = :now", &[], Some(values), &what)?
            };
            let entry = NewAuditEntry::for_dead_letter(actor, action, &letter);
            if let Changed::Done(logged) = self.change_and_log(change, entry, &what).await? {
                return Ok(LetterAction::Done(logged));
            }
        }
        Err(StoreError::new(
            ErrorKind::SerializationFailure,
            format!(
                "dead letter {id} kept changing while it was being changed; run the command again"
            ),
        )
        .into())
    }
}

/// The audit entry in `found`.
fn entry(found: &Item) -> Result<AuditEntry, Error> {
    let pk = match found.get(PARTITION_KEY) {
        Some(aws_sdk_dynamodb::types::AttributeValue::S(pk)) => pk.as_str(),
        _ => "(no partition key)",
    };
    let read = Reader::new(found);
    let parsed = (|| -> Result<AuditEntry, String> {
        Ok(AuditEntry {
            id: read.number("id")?,
            at: Timestamp(read.number(AT)?),
            actor: read.text(ACTOR)?.to_owned(),
            action: read.text(ACTION)?.parse().map_err(|e| format!("{e}"))?,
            subject: AuditSubject::from_columns(
                read.text_or_none(SCOPE)?.map(str::to_owned),
                read.text(KEY)?.to_owned(),
                read.number_or_none(DEAD_LETTER)?,
            )?,
            before: read.text(BEFORE)?.to_owned(),
        })
    })();
    parsed.map_err(|why| {
        StoreError::new(
            ErrorKind::Corrupt,
            format!("the DynamoDB item {pk:?} is not an audit entry Idem wrote ({why})"),
        )
        .into()
    })
}

impl AdminStore for DynamoStore {
    async fn evict(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        self.change_record(seen, actor, AuditAction::Evict).await
    }

    async fn release_claim(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        if !idem_core::is_held(seen) {
            return Ok(RecordAction::NotHeld(seen.clone()));
        }
        self.change_record(seen, actor, AuditAction::Release).await
    }

    async fn discard_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        self.change_letter(id, actor, AuditAction::Discard).await
    }

    async fn archive_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        self.change_letter(id, actor, AuditAction::Archive).await
    }

    async fn audit_log(&self, limit: usize) -> Result<Vec<AuditEntry>, Error> {
        let mut entries = self
            .scan_prefix(AUDIT_PREFIX)
            .await?
            .iter()
            .map(entry)
            .collect::<Result<Vec<_>, _>>()?;
        entries.sort_by_key(|e| std::cmp::Reverse(e.id));
        entries.truncate(limit);
        Ok(entries)
    }
}
