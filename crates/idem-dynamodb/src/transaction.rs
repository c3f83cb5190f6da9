//! [`Transaction`]: what an atomic effect writes with. The effect adds its
//! own `Put`, `Update`, `Delete` and `ConditionCheck` items; the store adds
//! the record's and sends them all as one `TransactWriteItems`, so the
//! effect's writes and the record commit together or not at all.
//!
//! DynamoDB takes at most 100 items and 4 MB in one transaction, and 400 KB
//! in one item. A transaction over those limits is refused before anything
//! is sent, saying which limit and by how much: nothing is cut, and nothing
//! is written.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConditionCheck, Delete, Put, TransactWriteItem, Update};
use idem_core::{Error, ErrorKind, StoreError};

use crate::error::{
    MAX_ITEM_BYTES, MAX_TRANSACTION_BYTES, MAX_TRANSACTION_ITEMS, item_too_large, map_error,
};
use crate::item::{Item, item_size, value_size};
use crate::store::DynamoStore;

/// The writes of an atomic effect, sent with the record in one
/// `TransactWriteItems` when the effect returns `Ok`, and dropped unsent
/// when it returns `Err`.
///
/// ```no_run
/// # async fn demo(store: idem_dynamodb::DynamoStore) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope};
/// use idem_dynamodb::aws_sdk_dynamodb::types::{AttributeValue, Update};
/// let (scope, key) = (Scope::new("payments")?, IdempotencyKey::new("order-42")?);
/// store
///     .apply(&scope, &key, Fingerprint::of_bytes(b"debit 10"), async |tx| {
///         let debit = Update::builder()
///             .table_name("accounts")
///             .key("id", AttributeValue::S("alice".into()))
///             .update_expression("ADD balance :minus")
///             .expression_attribute_values(":minus", AttributeValue::N("-10".into()))
///             .build()
///             .map_err(|e| e.to_string())?;
///         tx.update(debit);
///         Ok::<_, String>(Outcome::success("debited"))
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub struct Transaction {
    client: Client,
    table: String,
    items: Vec<TransactWriteItem>,
    bytes: usize,
    too_large: Option<(String, usize)>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("table", &self.table)
            .field("items", &self.items.len())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Transaction {
    pub(crate) fn new(store: &DynamoStore) -> Self {
        Self {
            client: store.client().clone(),
            table: store.table().to_owned(),
            items: Vec::new(),
            bytes: 0,
            too_large: None,
        }
    }

    /// Adds a `Put`: an item written whole (on its condition, if it has one).
    pub fn put(&mut self, put: Put) -> &mut Self {
        let bytes = item_size(put.item());
        let values = values_size(put.expression_attribute_values());
        self.note_item("a Put", put.table_name(), bytes);
        self.push(
            TransactWriteItem::builder().put(put).build(),
            bytes + values,
        )
    }

    /// Adds an `Update` of one item's attributes.
    pub fn update(&mut self, update: Update) -> &mut Self {
        let bytes = item_size(update.key())
            + update.update_expression().len()
            + values_size(update.expression_attribute_values());
        self.push(TransactWriteItem::builder().update(update).build(), bytes)
    }

    /// Adds a `Delete` of one item.
    pub fn delete(&mut self, delete: Delete) -> &mut Self {
        let bytes = item_size(delete.key()) + values_size(delete.expression_attribute_values());
        self.push(TransactWriteItem::builder().delete(delete).build(), bytes)
    }

    /// Adds a `ConditionCheck`: the transaction commits only if the item
    /// meets the condition.
    pub fn condition_check(&mut self, check: ConditionCheck) -> &mut Self {
        let bytes = item_size(check.key()) + values_size(check.expression_attribute_values());
        self.push(
            TransactWriteItem::builder().condition_check(check).build(),
            bytes,
        )
    }

    /// How many items the effect added.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the effect added none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The store's table, for effects that keep their items beside the
    /// records (under partition keys of their own: the records' start with
    /// `r#`, and every key Idem writes has a lowercase letter and `#` first).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The store's SDK client, for the effect's reads (a read is not part
    /// of the transaction; a `ConditionCheck` makes what it found a condition
    /// of the commit).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn push(&mut self, item: TransactWriteItem, bytes: usize) -> &mut Self {
        self.items.push(item);
        self.bytes += bytes;
        self
    }

    fn note_item(&mut self, what: &str, table: &str, bytes: usize) {
        if bytes > MAX_ITEM_BYTES && self.too_large.is_none() {
            self.too_large = Some((
                format!(
                    "the effect's write #{} ({what} to table {table:?})",
                    self.items.len() + 1
                ),
                bytes,
            ));
        }
    }

    /// The effect's items, with the store's own after them, checked against
    /// DynamoDB's limits: what one `TransactWriteItems` sends.
    pub(crate) fn finish(
        self,
        own: Vec<(TransactWriteItem, usize)>,
    ) -> Result<Vec<TransactWriteItem>, Error> {
        if let Some((what, bytes)) = self.too_large {
            return Err(item_too_large(&what, bytes, false));
        }
        let effect_items = self.items.len();
        let total = effect_items + own.len();
        if total > MAX_TRANSACTION_ITEMS {
            return Err(StoreError::new(
                ErrorKind::Other,
                format!(
                    "the effect added {effect_items} writes; with the {} record(s) they commit with, that is {total} items in one transaction, over DynamoDB's limit of {MAX_TRANSACTION_ITEMS} per TransactWriteItems: nothing was written; split the work into operations of fewer writes (or batches of fewer operations)",
                    own.len()
                ),
            )
            .into());
        }
        let bytes = self.bytes + own.iter().map(|(_, b)| b).sum::<usize>();
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(StoreError::new(
                ErrorKind::Other,
                format!(
                    "the effect's writes and the record(s) come to about {bytes} bytes in one transaction, over DynamoDB's limit of {MAX_TRANSACTION_BYTES} bytes (4 MB) per TransactWriteItems: nothing was written; write less per operation"
                ),
            )
            .into());
        }
        let mut items = self.items;
        items.extend(own.into_iter().map(|(item, _)| item));
        Ok(items)
    }
}

fn values_size(values: Option<&Item>) -> usize {
    values.map_or(0, |values| {
        values
            .iter()
            .map(|(name, value)| name.len() + value_size(value))
            .sum()
    })
}

/// What a `TransactWriteItems` came to.
#[derive(Debug)]
pub(crate) enum Commit {
    /// Every item was written.
    Done,
    /// Nothing was written; DynamoDB's reason for each item, in order
    /// (`None`, `ConditionalCheckFailed`, `TransactionConflict`, ...).
    Cancelled(Vec<String>),
}

impl Commit {
    /// Whether item `index` was refused on its condition.
    pub(crate) fn condition_failed(reasons: &[String], index: usize) -> bool {
        reasons
            .get(index)
            .is_some_and(|r| r == "ConditionalCheckFailed")
    }
}

impl DynamoStore {
    /// Sends `items` as one `TransactWriteItems`.
    pub(crate) async fn commit(
        &self,
        items: Vec<TransactWriteItem>,
        what: &str,
    ) -> Result<Commit, Error> {
        if items.is_empty() {
            return Ok(Commit::Done);
        }
        let sent = self
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Commit::Done),
            Err(error) => match error.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
                    Ok(Commit::Cancelled(
                        cancelled
                            .cancellation_reasons()
                            .iter()
                            .map(|r| r.code().unwrap_or("None").to_owned())
                            .collect(),
                    ))
                }
                _ => Err(map_error(what, true, error)),
            },
        }
    }
}

/// The error for a transaction cancelled for a reason other than the
/// record's own condition: an effect item's condition, or a conflict with
/// another transaction.
pub(crate) fn cancelled(reasons: &[String], effect_items: usize, what: &str) -> Error {
    if let Some(index) = reasons
        .iter()
        .take(effect_items)
        .position(|r| r == "ConditionalCheckFailed")
    {
        return StoreError::new(
            ErrorKind::Other,
            format!(
                "{what}: the effect's write #{} failed its condition, so the transaction was cancelled and nothing was written (neither the effect nor the record); the key is free for a retry",
                index + 1
            ),
        )
        .into();
    }
    let conflict = reasons.iter().any(|r| r == "TransactionConflict");
    StoreError::new(
        if conflict {
            ErrorKind::SerializationFailure
        } else {
            ErrorKind::Other
        },
        format!(
            "{what}: DynamoDB cancelled the transaction ({}), so nothing was written; {}",
            reasons.join(", "),
            if conflict {
                "another transaction wrote one of the same items at the same time; retry"
            } else {
                "see the reasons for the cause"
            }
        ),
    )
    .into()
}
