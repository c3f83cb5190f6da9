//! The effect log: what the system actually did, one [`Effect`] per line
//! (JSON Lines), in the order the effects were committed. It comes from the
//! user's own database — `idem check --effects` runs a query there, or reads
//! a file of these lines.
//!
//! ```json
//! {"key":"order-42","scope":"payments"}
//! {"key":"order-43","resource":"account-7","fence":12}
//! ```

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
