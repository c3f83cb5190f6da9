//! The API, written once for every store whose connection speaks
//! [`Accounts`]: `POST /payments` (an atomic route) and `GET /balance`.

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post_service};
use idem::{AtomicEffect, AtomicStore};
use idem_http::atomic::{self, AtomicRequest, Failure, HandlerResult};
use idem_http::{IdempotencyConfig, StoredResponse};

use crate::accounts::Accounts;
use crate::payment::{self, BalanceQuery};

/// A store the API runs on: its effects get a connection that speaks
/// [`Accounts`].
pub(crate) trait PaymentStore: AtomicStore<Tx: Accounts> + Clone + 'static {}

impl<S: AtomicStore<Tx: Accounts> + Clone + 'static> PaymentStore for S {}

/// Creates the tables and opens the demo account if they are missing.
pub(crate) async fn prepare<S: PaymentStore>(store: &S) -> anyhow::Result<()> {
    let (account, balance) = crate::DEMO_ACCOUNT;
    store
        .transaction(async move |tx: &mut S::Tx| tx.prepare(account, balance).await)
        .await?;
    Ok(())
}

/// The routes on `store`.
pub(crate) fn router<S: PaymentStore>(store: S, config: IdempotencyConfig) -> Router {
    Router::new()
        .route(
            "/payments",
            post_service(atomic::route(store.clone(), config, debit)),
        )
        .route("/balance", get(balance::<S>))
        .with_state(store)
}

/// Debits the account once: the effect runs inside the idempotency record's
/// transaction, and its answer is stored with its writes.
fn debit<Tx>(request: AtomicRequest) -> impl AtomicEffect<Tx, StoredResponse, Failure>
where
    Tx: Accounts + ?Sized + 'static,
{
    async move |tx: &mut Tx| -> HandlerResult {
        let payment = match payment::parse(request.body()) {
            Ok(payment) => payment,
            Err(problem) => return Ok(payment::invalid(problem)),
        };
        let Some(balance) = tx.lock_balance(&payment.account).await? else {
            return Ok(payment::unknown_account(&payment));
        };
        if balance < payment.amount {
            return Ok(payment::declined(&payment, balance));
        }
        let id = tx.pay(&payment.account, payment.amount).await?;
        Ok(payment::taken(id, &payment, balance - payment.amount))
    }
}

async fn balance<S: PaymentStore>(
    State(store): State<S>,
    Query(query): Query<BalanceQuery>,
) -> Response {
    let account = query.account().to_owned();
    let read = {
        let account = account.clone();
        store
            .transaction(async move |tx: &mut S::Tx| tx.balance(&account).await)
            .await
    };
    match read {
        Ok(found) => payment::balance(&account, found).into_response(),
        Err(error) => {
            tracing::error!(%error, "reading the balance failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
