//! Atomic tonic handlers over loopback: the charge is a row in the store's own
//! database, committed with the key's record.

mod common;

use std::collections::VecDeque;
use std::pin::Pin;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::payments::payments_server::{Payments, PaymentsServer};
use common::payments::{ChargeReply, ChargeRequest, ListChargesRequest};
use common::{CHARGE, Ledger, charge, is_replay};
use idem::rusqlite::{self, Connection};
use idem::{IdempotencyKey, Settings, SqliteStore};
use idem_grpc::{GrpcIdempotencyConfig, GrpcRetry, atomic};
use idem_retry::{Backoff, RetryBudget, RetryConfig};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};

/// A payments service whose charge is an atomic handler on SQLite.
struct AtomicPayments {
    store: SqliteStore,
    config: GrpcIdempotencyConfig,
    ledger: Ledger,
    /// Statuses the next charges end with after their write.
    failures: Arc<Mutex<VecDeque<Status>>>,
    /// A charge hangs after its write, inside the transaction.
    hang: bool,
}

#[tonic::async_trait]
impl Payments for AtomicPayments {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.ledger.call(CHARGE);
        let failure = self.failures.lock().unwrap().pop_front();
        let hang = self.hang;
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

async fn open_store(dir: &std::path::Path, lease: Duration) -> SqliteStore {
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

/// Charges committed to `account` in the store's database.
fn charges(dir: &std::path::Path, account: &str) -> i64 {
    let db = Connection::open(dir.join("idem.db")).expect("open");
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.query_row(
        "SELECT count(*) FROM charges WHERE account = ?1",
        [account],
        |row| row.get(0),
    )
    .expect("count")
}

struct Running {
    addr: std::net::SocketAddr,
    failures: Arc<Mutex<VecDeque<Status>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_on(
    listener: TcpListener,
    dir: &std::path::Path,
    lease: Duration,
    hang: bool,
) -> Running {
    let addr = listener.local_addr().unwrap();
    let failures = Arc::new(Mutex::new(VecDeque::new()));
    let service = AtomicPayments {
        store: open_store(dir, lease).await,
        config: GrpcIdempotencyConfig::default(),
        ledger: Ledger::open(dir.join("ledger.db")),
        failures: Arc::clone(&failures),
        hang,
    };
    let task = tokio::spawn(async move {
        Server::builder()
            .add_service(PaymentsServer::new(service))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("serve");
    });
    Running {
        addr,
        failures,
        task,
    }
}

async fn serve(dir: &std::path::Path) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, dir, Duration::from_secs(30), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_charge_commits_once_and_duplicates_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path()).await;
    let mut client = common::client(server.addr).await;

    let first = client.charge(charge("a-1", "olga", 500)).await.unwrap();
    assert!(!is_replay(&first));
    let second = client.charge(charge("a-1", "olga", 500)).await.unwrap();
    assert!(is_replay(&second));
    assert_eq!(second.get_ref(), first.get_ref());
    assert_eq!(charges(dir.path(), "olga"), 1);

    let reused = client.charge(charge("a-1", "olga", 501)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);

    let refused = client.charge(charge("a-2", "olga", 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let again = client.charge(charge("a-2", "olga", 0)).await.unwrap_err();
    assert_eq!(again.code(), Code::InvalidArgument);
    assert_eq!(again.message(), "the amount must be positive");
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(charges(dir.path(), "olga"), 1);
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    assert_eq!(ledger.calls(CHARGE), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_releasing_status_rolls_the_write_back_and_the_retry_commits() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path()).await;
    server.failures.lock().unwrap().extend([
        Status::unavailable("the ledger is busy"),
        Status::internal("bug"),
    ]);
    let mut client = common::client(server.addr).await;

    for expected in [Code::Unavailable, Code::Internal] {
        let failed = client.charge(charge("a-3", "petr", 70)).await.unwrap_err();
        assert_eq!(failed.code(), expected);
        assert_eq!(charges(dir.path(), "petr"), 0);
    }
    let done = client.charge(charge("a-3", "petr", 70)).await.unwrap();
    assert!(!is_replay(&done));
    assert_eq!(charges(dir.path(), "petr"), 1);
}

const CHILD_DIR: &str = "IDEM_GRPC_ATOMIC_CHILD_DIR";
const CHILD_PORT: &str = "IDEM_GRPC_ATOMIC_CHILD_PORT";
const CHILD_HANG: &str = "IDEM_GRPC_ATOMIC_CHILD_HANG";

/// The server process of `a_server_killed_inside_the_transaction_commits_once`.
#[test]
#[ignore = "the server process of a_server_killed_inside_the_transaction_commits_once"]
fn atomic_child_server() {
    let (Ok(dir), Ok(port)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_PORT)) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap()))
            .await
            .expect("bind");
        let hang = std::env::var(CHILD_HANG).is_ok();
        let _server = serve_on(
            listener,
            std::path::Path::new(&dir),
            Duration::from_secs(1),
            hang,
        )
        .await;
        std::future::pending::<()>().await;
    });
}

fn start_child(dir: &std::path::Path, port: u16, hang: bool) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", "atomic_child_server", "--nocapture"])
        .env(CHILD_DIR, dir)
        .env(CHILD_PORT, port.to_string());
    if hang {
        command.env(CHILD_HANG, "1");
    } else {
        command.env_remove(CHILD_HANG);
    }
    command.spawn().expect("start the server process")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_inside_the_transaction_commits_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut first = start_child(dir.path(), port, true);

    let client = common::client(([127, 0, 0, 1], port).into()).await;
    let retry = GrpcRetry::new(
        RetryConfig::default()
            .with_backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(200),
                200,
            ))
            .with_deadline(Duration::from_secs(30)),
        Arc::new(RetryBudget::unlimited()),
    );
    let call = tokio::spawn(async move {
        retry
            .call(
                IdempotencyKey::new("a-kill").unwrap(),
                ChargeRequest {
                    account: "rita".into(),
                    amount_cents: 4100,
                },
                |request| {
                    let mut client = client.clone();
                    async move { client.charge(request).await }
                },
            )
            .await
    });

    // The charge is written and the transaction still open when the process dies.
    let waited = Instant::now();
    while ledger.calls(CHARGE) == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(charges(dir.path(), "rita"), 0);
    let mut second = start_child(dir.path(), port, false);

    let reply = call.await.unwrap();
    second.kill().ok();
    second.wait().ok();
    let reply = reply.expect("the retries reach the restarted server");
    assert_eq!(reply.get_ref().amount_cents, 4100);
    assert_eq!(charges(dir.path(), "rita"), 1);
    assert_eq!(ledger.calls(CHARGE), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_charges_on_postgresql_commit_once_and_roll_back_released_codes() {
    use idem::sqlx::{self, PgConnection};

    let Some(database) = idem_testkit::postgres::TestDatabase::create("idem_grpc_a").await else {
        return;
    };
    let store = idem::PgStore::connect(database.url()).await.expect("store");
    sqlx::query("CREATE TABLE charges (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount_cents BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let config = GrpcIdempotencyConfig::default();
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM charges")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    let pay = async |key: &str, amount_cents: i64, fail: Option<Status>| {
        atomic::apply(
            &store,
            &config,
            CHARGE,
            charge(key, "uma", amount_cents),
            |request: ChargeRequest| {
                async move |tx: &mut PgConnection| -> Result<ChargeReply, Status> {
                    let id: i64 = sqlx::query_scalar(
                        "INSERT INTO charges (account, amount_cents) VALUES ($1, $2) RETURNING id",
                    )
                    .bind(&request.account)
                    .bind(request.amount_cents)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
                    if let Some(status) = fail {
                        return Err(status);
                    }
                    Ok(ChargeReply {
                        charge_id: id,
                        account: request.account,
                        amount_cents: request.amount_cents,
                    })
                }
            },
        )
        .await
    };

    let first = pay("pg-a", 900, None).await.unwrap();
    let again = pay("pg-a", 900, None).await.unwrap();
    assert!(is_replay(&again));
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(count().await, 1);

    let failed = pay("pg-b", 10, Some(Status::unavailable("busy")))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert_eq!(count().await, 1);
    let done = pay("pg-b", 10, None).await.unwrap();
    assert!(!is_replay(&done));
    assert_eq!(count().await, 2);

    let reused = pay("pg-b", 11, None).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(count().await, 2);
}
