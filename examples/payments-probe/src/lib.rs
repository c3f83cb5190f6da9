//! A payments service that answers the gateway's probe.
//!
//! `POST /payments` records a payment and its `Idempotency-Key` in one SQLite
//! transaction (the key is unique, so a repeat returns the payment already
//! made). `GET /payments/by-key/{key}` is the probe for
//! `idem serve --probe 'GET /payments/by-key/{key}'`: 200 with the payment
//! and `Idempotency-Original-Status: 201` when the key was applied, 404 when
//! it was not, 500 when the table cannot be read (the gateway then answers
//! 503 and asks again later).

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

/// The header in which the probe gives the status of the original answer.
pub const ORIGINAL_STATUS: &str = "idempotency-original-status";

/// A payment, as answered to the request that made it and to the probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// Its number.
    pub id: i64,
    /// Its amount, in cents.
    pub amount: i64,
}

/// What a client asks for.
#[derive(Debug, Deserialize)]
pub struct NewPayment {
    /// The amount, in cents.
    pub amount: i64,
}

type Db = Arc<Mutex<Connection>>;

/// Opens (or creates) the payments table in `path`.
pub fn open(path: &Path) -> rusqlite::Result<Db> {
    let db = Connection::open(path)?;
    db.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE IF NOT EXISTS payments (
             id INTEGER PRIMARY KEY,
             idempotency_key TEXT NOT NULL UNIQUE,
             amount INTEGER NOT NULL
         );",
    )?;
    Ok(Arc::new(Mutex::new(db)))
}

/// The routes.
pub fn app(db: Db) -> Router {
    Router::new()
        .route("/payments", post(pay))
        .route("/payments/by-key/{key}", get(by_key))
        .with_state(db)
}

/// The key as the gateway forwards it: an RFC 8941 String (`"key"`), or bare.
fn key_of(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("idempotency-key")?.to_str().ok()?.trim();
    let key = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => value.to_owned(),
    };
    (!key.is_empty()).then_some(key)
}

fn find(db: &Connection, key: &str) -> rusqlite::Result<Option<Payment>> {
    db.query_row(
        "SELECT id, amount FROM payments WHERE idempotency_key = ?1",
        [key],
        |row| {
            Ok(Payment {
                id: row.get(0)?,
                amount: row.get(1)?,
            })
        },
    )
    .optional()
}

async fn pay(State(db): State<Db>, headers: HeaderMap, Json(new): Json<NewPayment>) -> Response {
    let Some(key) = key_of(&headers) else {
        return (StatusCode::BAD_REQUEST, "send an Idempotency-Key").into_response();
    };
    let made = tokio::task::spawn_blocking(move || -> rusqlite::Result<Payment> {
        let mut db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let tx = db.transaction()?;
        if let Some(payment) = find(&tx, &key)? {
            return Ok(payment);
        }
        tx.execute(
            "INSERT INTO payments (idempotency_key, amount) VALUES (?1, ?2)",
            params![key, new.amount],
        )?;
        let payment = Payment {
            id: tx.last_insert_rowid(),
            amount: new.amount,
        };
        tx.commit()?;
        Ok(payment)
    })
    .await;
    match made {
        Ok(Ok(payment)) => (StatusCode::CREATED, Json(payment)).into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "the payment failed").into_response(),
    }
}

async fn by_key(State(db): State<Db>, UrlPath(key): UrlPath<String>) -> Response {
    let found = tokio::task::spawn_blocking(move || {
        let db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        find(&db, &key)
    })
    .await;
    match found {
        Ok(Ok(Some(payment))) => {
            (StatusCode::OK, [(ORIGINAL_STATUS, "201")], Json(payment)).into_response()
        }
        Ok(Ok(None)) => StatusCode::NOT_FOUND.into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot read the payments",
        )
            .into_response(),
    }
}
