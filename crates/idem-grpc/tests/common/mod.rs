//! A payments service over tonic for the tests: charges land in a SQLite
//! ledger, under the idempotency key they were sent with, so every test
//! counts effects on real data and the service can look a charge up by its
//! key; a script makes the service fail (before or after its effect), hang
//! or wait on cue.
//!
//! - here: the ledger, the script, the service behind the layer, and a
//!   running server ([`Running`]) of either service;
//! - `atomic`: the same service with its charge as an atomic handler, the
//!   charge committed with the key's record in the store's own database;
//! - `process`: a server in a process of its own, for the tests that kill it
//!   in the middle of a call;
//! - `reconcile`: the service with its `Lookup` method asked before a call
//!   whose outcome is unknown runs again, and a run of such calls.

#![allow(dead_code)]

pub(crate) mod atomic;
pub(crate) mod process;
pub(crate) mod reconcile;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body::Frame;
use idem::LeaseStore;
use idem::rusqlite::{self, Connection};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tower::{Layer, Service};

// Generated code: its items are `pub` by construction.
#[allow(unreachable_pub)]
pub(crate) mod payments {
    tonic::include_proto!("payments.v1");
}

use payments::payments_client::PaymentsClient;
use payments::payments_server::{Payments, PaymentsServer};
use payments::{ChargeReply, ChargeRequest, ListChargesRequest};

pub(crate) const CHARGE: &str = "/payments.v1.Payments/Charge";
pub(crate) const LIST_CHARGES: &str = "/payments.v1.Payments/ListCharges";
pub(crate) const LOOKUP: &str = "/payments.v1.Payments/Lookup";

/// The ledger: one row per charge (the effect), one per call the service
/// received (protected or not).
#[derive(Clone, Debug)]
pub(crate) struct Ledger {
    path: PathBuf,
}

impl Ledger {
    pub(crate) fn open(path: impl AsRef<Path>) -> Self {
        let path = path.as_ref().to_owned();
        let db = Connection::open(&path).expect("open the ledger");
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount_cents INTEGER NOT NULL, idempotency_key TEXT);
             CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, method TEXT NOT NULL);",
        )
        .expect("ledger schema");
        Self { path }
    }

    fn connect(&self) -> Connection {
        let db = Connection::open(&self.path).expect("open the ledger");
        db.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        db
    }

    pub(crate) fn call(&self, method: &str) {
        self.connect()
            .execute("INSERT INTO calls (method) VALUES (?1)", [method])
            .expect("record the call");
    }

    fn charge(&self, account: &str, amount_cents: i64, key: Option<&str>) -> i64 {
        let db = self.connect();
        db.execute(
            "INSERT INTO charges (account, amount_cents, idempotency_key) VALUES (?1, ?2, ?3)",
            rusqlite::params![account, amount_cents, key],
        )
        .expect("charge");
        db.last_insert_rowid()
    }

    /// The charge made under `key`: its id, account and amount.
    fn charge_by_key(&self, key: &str) -> Option<(i64, String, i64)> {
        self.connect()
            .query_row(
                "SELECT id, account, amount_cents FROM charges WHERE idempotency_key = ?1 ORDER BY id LIMIT 1",
                [key],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .map_err(|e| assert!(matches!(e, rusqlite::Error::QueryReturnedNoRows), "{e}"))
            .ok()
    }

    /// Charges applied to `account`.
    pub(crate) fn charges(&self, account: &str) -> i64 {
        self.connect()
            .query_row(
                "SELECT count(*) FROM charges WHERE account = ?1",
                [account],
                |row| row.get(0),
            )
            .expect("count charges")
    }

    /// Calls of `method` the service received.
    pub(crate) fn calls(&self, method: &str) -> i64 {
        self.connect()
            .query_row(
                "SELECT count(*) FROM calls WHERE method = ?1",
                [method],
                |row| row.get(0),
            )
            .expect("count calls")
    }
}

/// What the service does on cue.
#[derive(Default, Debug)]
pub(crate) struct Script {
    /// Codes the next calls fail with, one per call, before any effect.
    pub(crate) failures: Mutex<VecDeque<Status>>,
    /// Codes the next charges answer with after their effect, one per
    /// charge: the charge is made, and the client is told it failed (an
    /// atomic charge is then rolled back or kept, as the code says).
    pub(crate) after_effect: Mutex<VecDeque<Status>>,
    /// Codes the next lookups answer with instead of looking, one per
    /// lookup.
    pub(crate) lookup_failures: Mutex<VecDeque<Status>>,
    /// When set, a charge waits for a permit before its effect.
    pub(crate) gate: Option<Arc<Semaphore>>,
    /// When set, a charge never finishes: it waits before its effect, or,
    /// as an atomic handler, after its write inside the transaction.
    pub(crate) hang: bool,
}

#[derive(Debug)]
pub(crate) struct PaymentsService {
    ledger: Ledger,
    script: Arc<Script>,
}

#[tonic::async_trait]
impl Payments for PaymentsService {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.ledger.call(CHARGE);
        let key = request
            .metadata()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let failure = self.script.failures.lock().unwrap().pop_front();
        if let Some(status) = failure {
            return Err(status);
        }
        if self.script.hang {
            std::future::pending::<()>().await;
        }
        if let Some(gate) = &self.script.gate {
            gate.acquire().await.expect("gate open").forget();
        }
        let ChargeRequest {
            account,
            amount_cents,
        } = request.into_inner();
        if amount_cents <= 0 {
            let mut status = Status::invalid_argument("the amount must be positive");
            status
                .metadata_mut()
                .insert("x-field", "amount_cents".parse().unwrap());
            return Err(status);
        }
        let charge_id = self.ledger.charge(&account, amount_cents, key.as_deref());
        let failure = self.script.after_effect.lock().unwrap().pop_front();
        if let Some(status) = failure {
            return Err(status);
        }
        let mut reply = Response::new(ChargeReply {
            charge_id,
            account,
            amount_cents,
        });
        reply
            .metadata_mut()
            .insert("x-ledger", "sqlite".parse().unwrap());
        Ok(reply)
    }

    async fn lookup(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.ledger.call(LOOKUP);
        let failure = self.script.lookup_failures.lock().unwrap().pop_front();
        if let Some(status) = failure {
            return Err(status);
        }
        let key = request
            .metadata()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Status::invalid_argument("a lookup needs the idempotency-key"))?;
        match self.ledger.charge_by_key(key) {
            Some((charge_id, account, amount_cents)) => {
                let mut reply = Response::new(ChargeReply {
                    charge_id,
                    account,
                    amount_cents,
                });
                reply
                    .metadata_mut()
                    .insert("x-ledger", "sqlite".parse().unwrap());
                Ok(reply)
            }
            None => Err(Status::not_found("no charge under this key")),
        }
    }

    type ListChargesStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<ChargeReply, Status>> + Send>>;

    async fn list_charges(
        &self,
        request: Request<ListChargesRequest>,
    ) -> Result<Response<Self::ListChargesStream>, Status> {
        self.ledger.call(LIST_CHARGES);
        let account = request.into_inner().account;
        let count = self.ledger.charges(&account);
        let replies = (0..count).map(move |n| {
            Ok(ChargeReply {
                charge_id: n + 1,
                account: account.clone(),
                amount_cents: 0,
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }
}

/// Adds an `x-receipt` trailer to every answer that has trailers: custom
/// trailing metadata, as servers in other languages send it.
#[derive(Clone, Debug)]
pub(crate) struct ReceiptLayer;

impl<S> Layer<S> for ReceiptLayer {
    type Service = Receipt<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Receipt(inner)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Receipt<S>(S);

impl<S, B> Service<http::Request<B>> for Receipt<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let called = self.0.call(request);
        Box::pin(async move {
            let response = called.await?;
            Ok(response.map(|body| tonic::body::Body::new(ReceiptBody(body))))
        })
    }
}

struct ReceiptBody(tonic::body::Body);

impl http_body::Body for ReceiptBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match Pin::new(&mut self.0).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_trailers() {
                Ok(mut trailers) => {
                    trailers.insert("x-receipt", HeaderValue::from_static("r-1"));
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            }))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// A running server.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) ledger: Ledger,
    pub(crate) script: Arc<Script>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Runs `serving`, a server on `addr`, until dropped.
    pub(crate) fn spawn(
        addr: SocketAddr,
        ledger: Ledger,
        script: Arc<Script>,
        serving: impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    ) -> Self {
        let task = tokio::spawn(async move { serving.await.expect("serve") });
        Self {
            addr,
            ledger,
            script,
            task,
        }
    }

    pub(crate) async fn client(&self) -> PaymentsClient<Channel> {
        client(self.addr).await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn client(addr: SocketAddr) -> PaymentsClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_lazy();
    PaymentsClient::new(channel)
}

/// The config the tests protect the service with.
pub(crate) fn config() -> GrpcIdempotencyConfig {
    GrpcIdempotencyConfig::default().unary(CHARGE)
}

/// Serves the payments service behind the layer on `listener`.
pub(crate) async fn serve_on<St: LeaseStore + 'static>(
    listener: TcpListener,
    store: St,
    config: GrpcIdempotencyConfig,
    ledger: Ledger,
    script: Script,
) -> Running {
    serve_layer_on(
        listener,
        GrpcIdempotencyLayer::new(store, config),
        ledger,
        script,
    )
    .await
}

/// Serves the payments service behind `layer` on `listener`.
pub(crate) async fn serve_layer_on<St: LeaseStore + 'static>(
    listener: TcpListener,
    layer: GrpcIdempotencyLayer<St>,
    ledger: Ledger,
    script: Script,
) -> Running {
    let addr = listener.local_addr().expect("address");
    let script = Arc::new(script);
    let service = PaymentsService {
        ledger: ledger.clone(),
        script: Arc::clone(&script),
    };
    let serving = Server::builder()
        .layer(layer)
        .layer(ReceiptLayer)
        .add_service(PaymentsServer::new(service))
        .serve_with_incoming(TcpListenerStream::new(listener));
    Running::spawn(addr, ledger, script, serving)
}

/// Serves the payments service behind the layer on a loopback port.
pub(crate) async fn serve<St: LeaseStore + 'static>(
    store: St,
    config: GrpcIdempotencyConfig,
    ledger: Ledger,
    script: Script,
) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    serve_on(listener, store, config, ledger, script).await
}

/// A charge request carrying `key`.
pub(crate) fn charge(key: &str, account: &str, amount_cents: i64) -> Request<ChargeRequest> {
    let mut request = Request::new(ChargeRequest {
        account: account.to_owned(),
        amount_cents,
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

pub(crate) fn is_replay<T>(response: &Response<T>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

pub(crate) fn code_of(status: &Status) -> Code {
    status.code()
}
