//! The gRPC payments example: `Pay` debits an account once per idempotency
//! key, `Balance` shows what is left, `ListPayments` streams the payments.
//!
//! `Pay` is an [atomic handler](idem_grpc::atomic): its `UPDATE` and `INSERT`
//! and its reply commit in the same SQLite transaction as the key's record. A
//! retry of a payment that committed gets the stored reply (with
//! `idempotent-replayed: true`); one that did not commit runs again.
//! `Balance` and `ListPayments` only read, and need no key.

#![forbid(unsafe_code)]

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use idem::SqliteStore;
use idem::rusqlite::{Connection, OptionalExtension, params};
use idem_grpc::{GrpcIdempotencyConfig, atomic};
use tonic::{Request, Response, Status};

/// The protobuf messages and the generated server and client.
pub mod proto {
    tonic::include_proto!("payments.v1");
}

use proto::payments_server::{Payments, PaymentsServer};
use proto::{BalanceReply, BalanceRequest, PayReply, PayRequest};

/// The `Pay` method's path: the scope of its keys.
pub const PAY: &str = "/payments.v1.Payments/Pay";

/// The account every fresh database starts with, and its balance in cents.
pub const DEMO_ACCOUNT: (&str, i64) = ("acc-1", 10_000);

/// The service, on the SQLite store at `path` (tables and the demo account
/// created if missing).
pub async fn service(path: impl AsRef<Path>) -> anyhow::Result<PaymentsServer<PaymentsService>> {
    let store = SqliteStore::open(path).await?;
    store
        .with_connection(|conn| {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
                 CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL);",
            )?;
            conn.execute(
                "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?1, ?2)",
                params![DEMO_ACCOUNT.0, DEMO_ACCOUNT.1],
            )
        })
        .await??;
    // A debit without a key could not be retried safely: require one.
    let config = GrpcIdempotencyConfig::default().require_key(true);
    Ok(PaymentsServer::new(PaymentsService { store, config }))
}

/// Serves `service` on `listener` until `shutdown` resolves.
pub async fn run(
    listener: tokio::net::TcpListener,
    service: PaymentsServer<PaymentsService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}

/// The payments service.
#[derive(Debug)]
pub struct PaymentsService {
    store: SqliteStore,
    config: GrpcIdempotencyConfig,
}

fn database(error: idem::rusqlite::Error) -> Status {
    Status::internal(format!("database: {error}"))
}

/// The debit, inside the transaction that holds the key's claim. A missing
/// account and a short balance are final answers for the key (stored and
/// replayed); a database error rolls everything back.
fn debit(tx: &mut Connection, payment: PayRequest) -> Result<PayReply, Status> {
    if payment.amount <= 0 {
        return Err(Status::invalid_argument("the amount must be positive"));
    }
    let balance: Option<i64> = tx
        .query_row(
            "SELECT balance FROM accounts WHERE id = ?1",
            [&payment.account],
            |row| row.get(0),
        )
        .optional()
        .map_err(database)?;
    let Some(balance) = balance else {
        return Err(Status::not_found(format!("no account {}", payment.account)));
    };
    if balance < payment.amount {
        return Err(Status::failed_precondition(format!(
            "insufficient funds: the balance is {balance}"
        )));
    }
    tx.execute(
        "UPDATE accounts SET balance = balance - ?2 WHERE id = ?1",
        params![payment.account, payment.amount],
    )
    .map_err(database)?;
    tx.execute(
        "INSERT INTO payments (account, amount) VALUES (?1, ?2)",
        params![payment.account, payment.amount],
    )
    .map_err(database)?;
    Ok(PayReply {
        payment: tx.last_insert_rowid(),
        balance: balance - payment.amount,
        account: payment.account,
        amount: payment.amount,
    })
}

#[tonic::async_trait]
impl Payments for PaymentsService {
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<PayReply>, Status> {
        atomic::apply(
            &self.store,
            &self.config,
            PAY,
            request,
            |payment: PayRequest| async move |tx: &mut Connection| debit(tx, payment),
        )
        .await
    }

    async fn balance(
        &self,
        request: Request<BalanceRequest>,
    ) -> Result<Response<BalanceReply>, Status> {
        let account = request.into_inner().account;
        let lookup = account.clone();
        let balance = self
            .store
            .with_connection(move |conn| {
                conn.query_row(
                    "SELECT balance FROM accounts WHERE id = ?1",
                    [&lookup],
                    |row| row.get::<_, i64>(0),
                )
                .optional()
            })
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .map_err(database)?
            .ok_or_else(|| Status::not_found(format!("no account {account}")))?;
        Ok(Response::new(BalanceReply { account, balance }))
    }

    type ListPaymentsStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<PayReply, Status>> + Send>>;

    async fn list_payments(
        &self,
        request: Request<BalanceRequest>,
    ) -> Result<Response<Self::ListPaymentsStream>, Status> {
        let account = request.into_inner().account;
        let payments = self
            .store
            .with_connection(move |conn| {
                let mut statement = conn.prepare(
                    "SELECT id, account, amount FROM payments WHERE account = ?1 ORDER BY id",
                )?;
                let rows = statement.query_map([&account], |row| {
                    Ok(PayReply {
                        payment: row.get(0)?,
                        account: row.get(1)?,
                        amount: row.get(2)?,
                        balance: 0,
                    })
                })?;
                rows.collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .map_err(database)?;
        Ok(Response::new(Box::pin(tokio_stream::iter(
            payments.into_iter().map(Ok),
        ))))
    }
}
