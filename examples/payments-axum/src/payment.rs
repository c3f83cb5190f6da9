//! What `POST /payments` takes and answers, and `GET /balance`'s query.

use axum::http::StatusCode;
use idem_http::StoredResponse;
use serde::Deserialize;
use serde_json::json;

/// A debit: `{"account": "acc-1", "amount": 250}` (cents).
#[derive(Debug, Deserialize)]
pub(crate) struct Payment {
    pub account: String,
    pub amount: i64,
}

/// Parses and checks a payment; the error says what is wrong with it.
pub(crate) fn parse(body: &[u8]) -> Result<Payment, String> {
    let payment: Payment = serde_json::from_slice(body)
        .map_err(|e| format!("the body must be {{\"account\": \"...\", \"amount\": N}}: {e}"))?;
    if payment.amount <= 0 {
        return Err("amount must be a positive number of cents".to_owned());
    }
    Ok(payment)
}

/// 400: the payment makes no sense. Stored: the same body is as wrong next time.
pub(crate) fn invalid(problem: String) -> StoredResponse {
    rejected(StatusCode::BAD_REQUEST, problem)
}

/// 201: the payment was taken; `balance` is what is left.
pub(crate) fn taken(id: i64, payment: &Payment, balance: i64) -> StoredResponse {
    StoredResponse::json(
        StatusCode::CREATED,
        &json!({ "payment": id, "account": payment.account, "amount": payment.amount, "balance": balance }),
    )
    .with_header(axum::http::header::LOCATION, format!("/payments/{id}"))
}

/// 402: not enough money. Stored like a success: a retry gets the same answer.
pub(crate) fn declined(payment: &Payment, balance: i64) -> StoredResponse {
    rejected(
        StatusCode::PAYMENT_REQUIRED,
        format!(
            "insufficient funds: {} has {balance}, the payment is {}",
            payment.account, payment.amount
        ),
    )
}

/// 404: no such account.
pub(crate) fn unknown_account(payment: &Payment) -> StoredResponse {
    rejected(
        StatusCode::NOT_FOUND,
        format!("no account {}", payment.account),
    )
}

fn rejected(status: StatusCode, message: impl Into<String>) -> StoredResponse {
    StoredResponse::json(status, &json!({ "error": message.into() }))
}

/// `GET /balance?account=...` (default: the demo account).
#[derive(Debug, Deserialize)]
pub(crate) struct BalanceQuery {
    pub account: Option<String>,
}

impl BalanceQuery {
    pub(crate) fn account(&self) -> &str {
        self.account.as_deref().unwrap_or(crate::DEMO_ACCOUNT.0)
    }
}

/// The `GET /balance` answer.
pub(crate) fn balance(
    account: &str,
    balance: Option<i64>,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    match balance {
        Some(balance) => (
            StatusCode::OK,
            axum::Json(json!({ "account": account, "balance": balance })),
        ),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": format!("no account {account}") })),
        ),
    }
}
