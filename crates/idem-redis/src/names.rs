//! The Redis key of a record.
//!
//! One record is one hash. Its name is `PREFIX` + the scope's length + `:` +
//! `{SCOPE:KEY}`: the length makes the name unambiguous whatever characters
//! the scope holds, and the braces are a Redis Cluster hash tag, so a record
//! lives in the slot of its scope and key. The scope and key are also stored
//! in the hash, which is where they are read back from.

use idem_core::{IdempotencyKey, Scope};

/// The key prefix when none is set.
pub const DEFAULT_PREFIX: &str = "idem:";

/// The Redis key of `(scope, key)` under `prefix`.
pub(crate) fn record(prefix: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    let scope = scope.as_str();
    format!("{prefix}{}:{{{scope}:{key}}}", scope.len())
}

/// The `SCAN MATCH` pattern of every record under `prefix`: the prefix with
/// its glob characters escaped, then anything.
pub(crate) fn pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
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
        assert_eq!(a, "idem:3:{a:b:c}");
        assert_eq!(pattern("t[1]*:"), "t\\[1\\]\\*:*");
        assert!(check_prefix("x{").is_err());
        assert!(check_prefix(DEFAULT_PREFIX).is_ok());
    }
}
