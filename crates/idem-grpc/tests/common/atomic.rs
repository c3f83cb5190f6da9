//! The payments service with its charge as an atomic handler on SQLite: the
//! charge is a row in the store's own database, committed in the transaction
//! that stores the key's record, so a released code rolls it back and a
//! process killed inside the transaction leaves nothing behind.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem::rusqlite::{self, Connection};
use idem::{Settings, SqliteStore};
use idem_grpc::{GrpcIdempotencyConfig, atomic};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use super::payments::payments_server::{Payments, PaymentsServer};
use super::payments::{ChargeReply, ChargeRequest, ListChargesRequest};
use super::{CHARGE, Ledger, Running, Script};

/// A payments service whose charge is an atomic handler on SQLite; the
/// ledger counts the calls it received. Of the script it follows
/// `after_effect` (a status the charge ends with after its write) and `hang`
/// (the charge waits after its write, inside the transaction).
#[derive(Debug)]
struct AtomicPayments {
    store: SqliteStore,
    config: GrpcIdempotencyConfig,
    ledger: Ledger,
    script: Arc<Script>,
}

#[tonic::async_trait]
impl Payments for AtomicPayments {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.ledger.call(CHARGE);
        let failure = self.script.after_effect.lock().unwrap().pop_front();
        let hang = self.script.hang;
        atomic::apply(
            &self.store,
            &self.config,
            CHARGE,
            request,
            |request: ChargeRequest| {
                async move |tx: &mut Connection| -> Result<ChargeReply, Status> {
                    if request.amount_cents <= 0 {
                        return Err(Status::invalid_argument("the amount must be positive"));
                    }
                    tx.execute(
                        "INSERT INTO charges (account, amount_cents) VALUES (?1, ?2)",
                        rusqlite::params![request.account, request.amount_cents],
                    )
                    .map_err(|e| Status::internal(e.to_string()))?;
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    if let Some(status) = failure {
                        return Err(status);
                    }
                    Ok(ChargeReply {
                        charge_id: tx.last_insert_rowid(),
                        account: request.account,
                        amount_cents: request.amount_cents,
                    })
                }
            },
        )
        .await
    }

    async fn lookup(
        &self,
        _request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        Err(Status::unimplemented("an atomic charge needs no lookup"))
    }

    type ListChargesStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<ChargeReply, Status>> + Send>>;

    async fn list_charges(
        &self,
        _: Request<ListChargesRequest>,
    ) -> Result<Response<Self::ListChargesStream>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

/// The SQLite store in `dir`, with the `charges` table in its database.
async fn open_store(dir: &Path, lease: Duration) -> SqliteStore {
    let store = SqliteStore::builder(dir.join("idem.db"))
        .settings(Settings::default().with_lease(lease))
        .open()
        .await
        .expect("store");
    store
        .with_connection(|conn| {
            conn.execute(
                "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount_cents INTEGER NOT NULL)",
                [],
            )
        })
        .await
        .expect("writer")
        .expect("schema");
    store
}

/// Charges committed to `account` in the store's database in `dir`.
pub(crate) fn charges(dir: &Path, account: &str) -> i64 {
    let db = Connection::open(dir.join("idem.db")).expect("open");
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.query_row(
        "SELECT count(*) FROM charges WHERE account = ?1",
        [account],
        |row| row.get(0),
    )
    .expect("count")
}

/// Serves the atomic payments service on `listener`: its store and its
/// ledger (`ledger.db`) in `dir`, keys leased for `lease`.
pub(crate) async fn serve_on(
    listener: TcpListener,
    dir: &Path,
    lease: Duration,
    script: Script,
) -> Running {
    let addr = listener.local_addr().expect("address");
    let ledger = Ledger::open(dir.join("ledger.db"));
    let script = Arc::new(script);
    let service = AtomicPayments {
        store: open_store(dir, lease).await,
        config: GrpcIdempotencyConfig::default(),
        ledger: ledger.clone(),
        script: Arc::clone(&script),
    };
    let serving = Server::builder()
        .add_service(PaymentsServer::new(service))
        .serve_with_incoming(TcpListenerStream::new(listener));
    Running::spawn(addr, ledger, script, serving)
}

/// Serves the atomic payments service on a loopback port, with a 30-second
/// lease.
pub(crate) async fn serve(dir: &Path) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    serve_on(listener, dir, Duration::from_secs(30), Script::default()).await
}
