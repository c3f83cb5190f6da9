//! The Redis key of a record.
//!
//! One record is one hash. Its name is `PREFIX` + `rec:` + the scope's
//! length + `:` + `{SCOPE:KEY}`: the length makes the name unambiguous
//! whatever characters the scope holds, and the braces are a Redis Cluster
//! hash tag, so a record lives in the slot of its scope and key. The scope
//! and key are also stored in the hash, which is where they are read back
//! from. A message's failed attempts sit beside it under `att:`; the dead
//! letters share the hash tag `{dlq}`, so the scripts that write a letter
//! and its index touch one slot, and the audit log of operators' changes
//! (a counter and a stream) shares `{audit}`.

use idem_core::{IdempotencyKey, Scope};

/// The key prefix when none is set.
pub const DEFAULT_PREFIX: &str = "idem:";

/// The Redis key of `(scope, key)` under `prefix`.
pub(crate) fn record(prefix: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    keyed(prefix, "rec:", scope, key)
}

/// The Redis key of the failed attempts of `(scope, key)` under `prefix`.
pub(crate) fn attempts(prefix: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    keyed(prefix, "att:", scope, key)
}

fn keyed(prefix: &str, kind: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    let scope = scope.as_str();
    format!("{prefix}{kind}{}:{{{scope}:{key}}}", scope.len())
}

/// The Redis keys of the dead letters under `prefix`: the id counter, the
/// index of ids, and the letter with id `id`.
pub(crate) fn dead_letter_counter(prefix: &str) -> String {
    format!("{prefix}{{dlq}}:next")
}

pub(crate) fn dead_letter_index(prefix: &str) -> String {
    format!("{prefix}{{dlq}}:ids")
}

pub(crate) fn dead_letter(prefix: &str, id: i64) -> String {
    format!("{}{id}", dead_letter_prefix(prefix))
}

/// What every dead letter's key starts with, its id following.
pub(crate) fn dead_letter_prefix(prefix: &str) -> String {
    format!("{prefix}{{dlq}}:")
}

/// The Redis keys of the audit log under `prefix`: the id counter and the
/// stream of entries. Both share the hash tag `{audit}`.
pub(crate) fn audit_counter(prefix: &str) -> String {
    format!("{prefix}{{audit}}:next")
}

pub(crate) fn audit_log(prefix: &str) -> String {
    format!("{prefix}{{audit}}:log")
}

/// The `SCAN MATCH` pattern of every record under `prefix`.
pub(crate) fn records_pattern(prefix: &str) -> String {
    pattern(prefix, "rec:")
}

/// The `SCAN MATCH` pattern of every failed-attempts hash under `prefix`.
pub(crate) fn attempts_pattern(prefix: &str) -> String {
    pattern(prefix, "att:")
}

/// `prefix` + `kind` with glob characters escaped, then anything.
fn pattern(prefix: &str, kind: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + kind.len() + 1);
    for c in prefix.chars().chain(kind.chars()) {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

/// Why a prefix cannot be used, if it cannot: a brace would end up in the
/// hash tag's place.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "key prefix {prefix:?} holds a brace; Redis Cluster would read it as the hash tag, so records of one key could land apart: choose a prefix without {{ or }}, such as \"idem:\""
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unambiguous_and_tagged() {
        let a = record(
            "idem:",
            &Scope::new("a:b").unwrap(),
            &IdempotencyKey::new("c").unwrap(),
        );
        let b = record(
            "idem:",
            &Scope::new("a").unwrap(),
            &IdempotencyKey::new("b:c").unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a, "idem:rec:3:{a:b:c}");
        assert_eq!(records_pattern("t[1]*:"), "t\\[1\\]\\*:rec:*");
        assert_eq!(dead_letter("idem:", 7), "idem:{dlq}:7");
        assert!(check_prefix("x{").is_err());
        assert!(check_prefix(DEFAULT_PREFIX).is_ok());
    }
}
