//! Message headers as the JSON text the outbox and dead-letter tables keep
//! them in: one encoding for both tables, read back with the same checks.

use std::collections::BTreeMap;

use idem_core::Error;

use crate::error::corrupt;

/// Headers as JSON text.
pub(crate) fn to_json(headers: &BTreeMap<String, String>) -> String {
    serde_json::to_string(headers).expect("a string map always serializes")
}

/// Headers read back from their JSON text.
pub(crate) fn from_json(text: &str) -> Result<BTreeMap<String, String>, Error> {
    serde_json::from_str(text).map_err(|e| {
        corrupt(format!(
            "stored headers are not a JSON object of strings: {e}"
        ))
    })
}
