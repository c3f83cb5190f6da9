//! The table's one key shape and what lives under it: the partition key of
//! each kind of item (records, failed attempts, dead letters, audit entries,
//! counters), the names of their attributes, and the size DynamoDB counts
//! for an item against its limits.
//!
//! Every item is keyed by one string attribute, `pk`, whose prefix says what
//! the item is: `r#` a record, `a#` a message's failed attempts, `d#` a dead
//! letter, `l#` an audit entry, `n#` a counter. A scope and a key are both
//! visible ASCII and may hold `#`, so the scope's length is written before
//! it: no two `(scope, key)` pairs share a partition key.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{IdempotencyKey, Scope, Timestamp};

/// The partition key attribute, the table's only key.
pub const PARTITION_KEY: &str = "pk";

/// The attribute DynamoDB's time to live reads: seconds since the epoch
/// after which DynamoDB deletes the item (days later, at its own pace).
pub const TTL_ATTRIBUTE: &str = "ttl";

/// An item, as the SDK reads and writes it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Prefixes of the partition keys, one per kind of item.
pub(crate) const RECORD_PREFIX: &str = "r#";
pub(crate) const ATTEMPTS_PREFIX: &str = "a#";
pub(crate) const DEAD_LETTER_PREFIX: &str = "d#";
pub(crate) const AUDIT_PREFIX: &str = "l#";

/// The counters dead letter and audit entry ids are taken from.
pub(crate) const DEAD_LETTER_COUNTER: &str = "n#dead_letters";
pub(crate) const AUDIT_COUNTER: &str = "n#audit";

fn scoped(prefix: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    format!(
        "{prefix}{}#{}#{}",
        scope.as_str().len(),
        scope.as_str(),
        key.as_str()
    )
}

/// The partition key of `(scope, key)`'s record.
pub(crate) fn record_pk(scope: &Scope, key: &IdempotencyKey) -> String {
    scoped(RECORD_PREFIX, scope, key)
}

/// The partition key of `(scope, key)`'s failed attempts.
pub(crate) fn attempts_pk(scope: &Scope, key: &IdempotencyKey) -> String {
    scoped(ATTEMPTS_PREFIX, scope, key)
}

/// The partition key of dead letter `id`.
pub(crate) fn dead_letter_pk(id: i64) -> String {
    format!("{DEAD_LETTER_PREFIX}{id}")
}

/// The partition key of audit entry `id`.
pub(crate) fn audit_pk(id: i64) -> String {
    format!("{AUDIT_PREFIX}{id}")
}

/// The key of the item whose partition key is `pk`, as requests name it.
pub(crate) fn key_of(pk: impl Into<String>) -> Item {
    HashMap::from([(PARTITION_KEY.to_owned(), AttributeValue::S(pk.into()))])
}

/// The time to live of an item DynamoDB may delete from `at` on: whole
/// seconds, rounded up so it is never deleted early.
pub(crate) fn ttl_at(at: Timestamp) -> AttributeValue {
    number((at.0.max(0) + 999) / 1000)
}

/// A number attribute.
pub(crate) fn number(value: i64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// A string attribute.
pub(crate) fn text(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// A binary attribute.
pub(crate) fn bytes(value: impl Into<Vec<u8>>) -> AttributeValue {
    AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(value))
}

/// Reads the attributes of one item; the error says which attribute is
/// missing or of another type, for the caller to name the item.
pub(crate) struct Reader<'a> {
    item: &'a Item,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(item: &'a Item) -> Self {
        Self { item }
    }

    /// The text of a string attribute.
    pub(crate) fn text(&self, name: &str) -> Result<&'a str, String> {
        match self.item.get(name) {
            Some(AttributeValue::S(text)) => Ok(text),
            Some(_) => Err(format!("attribute {name:?} is not a string")),
            None => Err(format!("no attribute {name:?}")),
        }
    }

    /// A string attribute that may be missing.
    pub(crate) fn text_or_none(&self, name: &str) -> Result<Option<&'a str>, String> {
        match self.item.get(name) {
            None => Ok(None),
            Some(_) => self.text(name).map(Some),
        }
    }

    /// A number attribute.
    pub(crate) fn number(&self, name: &str) -> Result<i64, String> {
        match self.item.get(name) {
            Some(AttributeValue::N(n)) => n
                .parse()
                .map_err(|_| format!("attribute {name:?} is not a whole number")),
            Some(_) => Err(format!("attribute {name:?} is not a number")),
            None => Err(format!("no attribute {name:?}")),
        }
    }

    /// A number attribute that may be missing.
    pub(crate) fn number_or_none(&self, name: &str) -> Result<Option<i64>, String> {
        match self.item.get(name) {
            None => Ok(None),
            Some(_) => self.number(name).map(Some),
        }
    }

    /// A binary attribute; missing reads as empty (DynamoDB items leave
    /// empty values out).
    pub(crate) fn bytes(&self, name: &str) -> Result<&'a [u8], String> {
        match self.item.get(name) {
            Some(AttributeValue::B(blob)) => Ok(blob.as_ref()),
            Some(_) => Err(format!("attribute {name:?} is not binary")),
            None => Ok(&[]),
        }
    }
}

/// The size DynamoDB counts for `item`: each attribute's name and value, by
/// the rules DynamoDB publishes for its item limit (numbers counted at
/// their largest for their digits).
pub(crate) fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

/// The size of one attribute value.
pub(crate) fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(values) => values.iter().map(String::len).sum(),
        AttributeValue::Ns(values) => values.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(values) => values.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(values) => 3 + values.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(name, v)| 1 + name.len() + value_size(v))
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// A number's size: one byte per two significant digits, plus one.
fn number_size(n: &str) -> usize {
    let digits = n.bytes().filter(u8::is_ascii_digit).count();
    (digits.div_ceil(2) + 1).min(21)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_keys_holding_the_separator_do_not_collide() {
        let pk =
            |s: &str, k: &str| record_pk(&Scope::new(s).unwrap(), &IdempotencyKey::new(k).unwrap());
        assert_ne!(pk("a#1", "b"), pk("a", "1#b"));
        assert_eq!(pk("orders", "o-1"), "r#6#orders#o-1");
        assert!(
            attempts_pk(
                &Scope::new("s").unwrap(),
                &IdempotencyKey::new("k").unwrap()
            )
            .starts_with(ATTEMPTS_PREFIX)
        );
    }

    #[test]
    fn sizes_count_names_and_values() {
        let item: Item = HashMap::from([
            ("pk".to_owned(), text("abc")),
            ("n".to_owned(), number(12345)),
            ("b".to_owned(), bytes(vec![0u8; 10])),
        ]);
        assert_eq!(item_size(&item), 2 + 3 + 1 + 4 + 1 + 10);
        assert_eq!(ttl_at(Timestamp(1_001)), AttributeValue::N("2".into()));
        assert_eq!(ttl_at(Timestamp(2_000)), AttributeValue::N("2".into()));
    }
}
