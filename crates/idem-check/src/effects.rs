//! The effect log: what the system actually did, one [`Effect`] per line
//! (JSON Lines), in the order the effects were committed. It comes from the
//! user's own database — `idem check --effects` runs a query there, or reads
//! a file of these lines.
//!
//! ```json
//! {"key":"order-42","scope":"payments"}
//! {"key":"order-43","resource":"account-7","fence":12}
//! ```
//!
//! With the `sqlite` or `postgres` feature, [`query`] reads the same
//! effects as the rows of a query: a column `key`, and optionally `scope`,
//! `resource` and `fence`, in commit order.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod query;

use serde::{Deserialize, Serialize};

/// One effect the system applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    /// The idempotency key of the operation that caused it.
    pub key: String,
    /// The key's scope, when the system scopes keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The resource a guarded write changed (an account, a register).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The fencing token or version the write carried; per resource, these
    /// must only increase in the log's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
}

/// One row of the effect log as the auditor reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoggedEffect {
    /// The row's cursor value.
    pub cursor: i64,
    /// When the effect was written, in milliseconds since the Unix epoch,
    /// if the query returns `at_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
    /// The effect.
    #[serde(flatten)]
    pub effect: Effect,
}

/// A line of an effect log that is not an [`Effect`].
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("cannot read the effect log: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not an effect.
    #[error(
        "line {line} of the effect log is not an effect ({error}); each line is one JSON object with a \"key\" and optionally \"scope\", \"resource\" and an integer \"fence\""
    )]
    Line {
        /// 1-based.
        line: usize,
        /// What the parser said.
        error: serde_json::Error,
    },
}

/// Reads every effect of a JSON Lines effect log; blank lines are skipped.
pub fn read(input: impl std::io::BufRead) -> Result<Vec<Effect>, ReadError> {
    let mut effects = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let effect = serde_json::from_str(&line).map_err(|error| ReadError::Line {
            line: index + 1,
            error,
        })?;
        effects.push(effect);
    }
    Ok(effects)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_read_and_a_bad_line_is_named() {
        let text = "{\"key\":\"a\"}\n\n{\"key\":\"b\",\"resource\":\"r\",\"fence\":3}\n";
        let effects = read(text.as_bytes()).unwrap();
        assert_eq!(effects.len(), 2);
        assert_eq!(effects[1].fence, Some(3));
        let error = read("{\"key\":\"a\"}\n{\"scope\":\"s\"}\n".as_bytes())
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("line 2 of the effect log"), "{error}");
    }
}
