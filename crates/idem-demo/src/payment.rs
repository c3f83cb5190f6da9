//! A payment and the totals read back from the ledger: the values the
//! workload ([`crate::workload`]) and its SQL ([`crate::ledger`]) both speak.

use idem::{Fingerprint, IdempotencyKey, Operation, Scope};
use serde_json::json;

/// One payment: debit `amount` from `account`, once, under key `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The payment's idempotency key.
    pub id: IdempotencyKey,
    /// The account debited.
    pub account: i64,
    /// How much.
    pub amount: i64,
}

impl Payment {
    /// What the payment asks for, as a fingerprint: the same key with another
    /// account or amount is a reused key.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_json(&json!({"account": self.account, "amount": self.amount}))
            .expect("a JSON object always canonicalizes")
    }

    /// The payment as an operation in [`scope`].
    pub fn operation(&self) -> Operation {
        Operation::new(scope(), self.id.clone(), self.fingerprint())
    }
}

/// The scope payments are applied in.
pub fn scope() -> Scope {
    Scope::new("payments").expect("valid scope")
}

/// Money totals read back from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Debits written (effects applied).
    pub entries: i64,
    /// Distinct payments among them.
    pub distinct: i64,
    /// Sum of all debits.
    pub debited: i64,
}
