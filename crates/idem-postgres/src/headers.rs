//! Message headers as the JSON text the outbox and dead-letter tables keep
//! them in: one encoding for both tables, read back with the same checks.

use std::collections::BTreeMap;

use crate::error::BadRow;

/// Headers as JSON text.
pub(crate) fn to_json(headers: &BTreeMap<String, String>) -> String {
    serde_json::to_string(headers).expect("a string map always serializes")
}

/// Headers read back from their JSON text; a bad text is a bad row.
pub(crate) fn from_json(text: &str) -> sqlx::Result<BTreeMap<String, String>> {
    serde_json::from_str(text).map_err(|e| {
        BadRow::into_sqlx(format!(
            "stored headers are not a JSON object of strings: {e}"
        ))
    })
}
