//! An upstream that counts its effects, and gateways in front of it, each on
//! `127.0.0.1:0`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use idem::{AnyStore, SharedClock, StoreLocation};
use idem_gateway::{self as gateway, GatewayConfig, Runtime};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

use super::{Client, Server};

/// The upstream's state: what it applied and what it saw.
#[derive(Clone)]
pub(crate) struct Upstream {
    effects: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    by_key: Arc<Mutex<HashMap<String, Value>>>,
    gate: Arc<Semaphore>,
}

impl Default for Upstream {
    fn default() -> Self {
        Self {
            effects: Arc::default(),
            calls: Arc::default(),
            seen: Arc::default(),
            by_key: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Upstream {
    /// Effects applied.
    pub(crate) fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    /// Requests received on the effect routes.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The headers of every request received, in order.
    pub(crate) fn seen(&self) -> Vec<HeaderMap> {
        self.seen.lock().unwrap().clone()
    }

    /// Lets `n` requests waiting in `/slow` (or the first `/hang`) answer.
    pub(crate) fn open_gate(&self, n: usize) {
        self.gate.add_permits(n);
    }

    fn received(&self, headers: &HeaderMap) -> usize {
        self.seen.lock().unwrap().push(headers.clone());
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn apply(&self) -> usize {
        self.effects.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Serves the upstream:
    ///
    /// - `POST /payments`: one effect per call; answers 201 with the effect
    ///   number, the forwarded key, the body, and a hop-by-hop header of its own;
    /// - `POST /dedupe`: one effect per forwarded `Idempotency-Key`, replaying
    ///   its own answer for a key it saw (an upstream that dedupes too);
    /// - `POST /flaky`: 503 on its first call, then like `/payments`;
    /// - `POST /slow`: an effect, then waits for the gate;
    /// - `POST /hang`: an effect; the first call then waits for the gate, later
    ///   calls answer at once;
    /// - `POST|PUT /echo`: streams the request body back.
    pub(crate) async fn start(&self) -> Server {
        let app = Router::new()
            .route("/payments", post(pay))
            .route("/dedupe", post(dedupe))
            .route("/flaky", post(flaky))
            .route("/slow", post(slow))
            .route("/hang", post(hang))
            .route("/echo", post(echo).put(echo))
            .with_state(self.clone());
        Server::start(app).await
    }
}

fn forwarded_key(headers: &HeaderMap) -> Value {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map_or(Value::Null, |k| Value::String(k.to_owned()))
}

async fn pay(State(up): State<Upstream>, headers: HeaderMap, body: Bytes) -> Response {
    up.received(&headers);
    let effect = up.apply();
    let who = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("nobody")
        .to_owned();
    (
        StatusCode::CREATED,
        [
            ("location", format!("/payments/{effect}")),
            ("x-effect", effect.to_string()),
            ("connection", "x-upstream-hop".to_owned()),
            ("x-upstream-hop", "only for the gateway".to_owned()),
        ],
        Json(json!({
            "effect": effect,
            "key": forwarded_key(&headers),
            "who": who,
            "body": String::from_utf8_lossy(&body),
        })),
    )
        .into_response()
}

async fn dedupe(State(up): State<Upstream>, headers: HeaderMap) -> Response {
    up.received(&headers);
    let Value::String(key) = forwarded_key(&headers) else {
        return (StatusCode::BAD_REQUEST, "no key forwarded").into_response();
    };
    let mut by_key = up.by_key.lock().unwrap();
    if let Some(answer) = by_key.get(&key) {
        return (StatusCode::OK, Json(answer.clone())).into_response();
    }
    let answer = json!({ "effect": up.apply(), "key": key });
    by_key.insert(key, answer.clone());
    (StatusCode::CREATED, Json(answer)).into_response()
}

async fn flaky(State(up): State<Upstream>, headers: HeaderMap) -> Response {
    if up.received(&headers) == 1 {
        return (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
    }
    (StatusCode::CREATED, Json(json!({ "effect": up.apply() }))).into_response()
}

async fn slow(State(up): State<Upstream>, headers: HeaderMap) -> Response {
    up.received(&headers);
    let effect = up.apply();
    up.gate.acquire().await.expect("gate").forget();
    (StatusCode::CREATED, Json(json!({ "effect": effect }))).into_response()
}

async fn hang(State(up): State<Upstream>, headers: HeaderMap) -> Response {
    let call = up.received(&headers);
    let effect = up.apply();
    if call == 1 {
        up.gate.acquire().await.expect("gate").forget();
    }
    (
        StatusCode::CREATED,
        Json(json!({ "effect": effect, "key": forwarded_key(&headers) })),
    )
        .into_response()
}

async fn echo(body: Body) -> Response {
    Response::new(body)
}

/// An upstream that reads a request and then closes the connection without
/// answering: the request was sent, the outcome is unknown. Counts requests.
pub(crate) struct Hangup {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Hangup {
    pub(crate) async fn start() -> Hangup {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut chunk).await {
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        if buffer.windows(4).any(|w| w == b"\r\n\r\n") {
                            counted.fetch_add(1, Ordering::SeqCst);
                            return; // dropped: the connection closes unanswered
                        }
                    }
                });
            }
        });
        Hangup {
            addr,
            requests,
            task,
        }
    }
}

impl Drop for Hangup {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A store the gateway's cases run on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StoreKind {
    /// SQLite, in the case's directory.
    Embedded,
    /// The machine's Redis, under a key prefix of the case's own.
    Redis,
    /// PostgreSQL through a private PgBouncer in transaction pooling mode
    /// (`idem_testkit::pgbouncer`), a database of the case's own, the URL
    /// saying `pgbouncer=true`.
    #[cfg(feature = "postgres")]
    PgBouncer,
    /// A table of the case's own on moto's DynamoDB
    /// (`idem_testkit::dynamodb`), created when the store opens.
    DynamoDb,
}

/// What keeps a case's store alive besides its directory: its database and
/// the PgBouncer in front of it; dropped (the database too) when the case
/// ends.
#[derive(Default)]
pub(crate) struct Keep {
    #[cfg(feature = "postgres")]
    _bouncer: Option<idem_testkit::pgbouncer::PgBouncer>,
    #[cfg(feature = "postgres")]
    _db: Option<idem_testkit::http::PgDatabase>,
}

impl StoreKind {
    /// A fresh store of this kind with the config's lease and retention and
    /// `clock`, and what keeps it alive; `None` (after saying why) when its
    /// server is not reachable and services are not required.
    pub(crate) async fn open(
        self,
        dir: &Path,
        config: &IdempotencyConfig,
        clock: SharedClock,
    ) -> Option<(AnyStore, Keep)> {
        let opened = match self {
            Self::Embedded => (embedded(dir, config, clock).await, Keep::default()),
            #[cfg(feature = "postgres")]
            Self::PgBouncer => {
                let db = idem_testkit::http::PgDatabase::create().await?;
                let bouncer = idem_testkit::pgbouncer::PgBouncer::start()?;
                let url = format!("{}?pgbouncer=true", bouncer.route(&db.url));
                let location: StoreLocation = url.parse().expect("a PostgreSQL URL");
                let store = AnyStore::open_with(&location, config.store_settings(), clock)
                    .await
                    .expect("open the PostgreSQL store through PgBouncer");
                let keep = Keep {
                    _bouncer: Some(bouncer),
                    _db: Some(db),
                };
                (store, keep)
            }
            Self::Redis => {
                if !idem_testkit::redis::machine_redis_answers() {
                    return None;
                }
                let store = idem::RedisStore::builder(idem_testkit::redis::redis_url())
                    .settings(config.store_settings())
                    .clock(clock)
                    .prefix(idem_testkit::redis::test_prefix("gateway"))
                    .connect()
                    .await
                    .expect("connect the Redis store");
                (AnyStore::Redis(store), Keep::default())
            }
            Self::DynamoDb => {
                let url = idem_testkit::dynamodb::fresh_table_url("gateway")?;
                let store = AnyStore::open_with(
                    &StoreLocation::DynamoDb(url),
                    config.store_settings(),
                    clock,
                )
                .await
                .expect("open the DynamoDB store on moto");
                (store, Keep::default())
            }
        };
        Some(opened)
    }
}

/// The embedded store in `dir`, with the config's lease and retention and `clock`.
pub(crate) async fn embedded(
    dir: &Path,
    config: &IdempotencyConfig,
    clock: SharedClock,
) -> AnyStore {
    let location = StoreLocation::Sqlite(dir.join("idem.db"));
    AnyStore::open_with(&location, config.store_settings(), clock)
        .await
        .expect("open the embedded store")
}

/// A running gateway; stopped (abruptly) when dropped.
pub(crate) struct Gateway {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub layer: IdempotencyLayer<AnyStore>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    admin_task: Option<JoinHandle<std::io::Result<()>>>,
}

tokio::task_local! {
    /// The runtime the gateways a case starts serve on, when the test that
    /// runs the case names one; else the gateway's default.
    pub(crate) static SERVING: Runtime;
}

/// Runs a case with its gateways serving on each runtime, as two tests:
/// `CASE::per_core` and `CASE::shared`.
#[allow(unused_macros)]
macro_rules! on_both_runtimes {
    ($case:ident) => {
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn per_core() {
                crate::common::gateway::serving_on(idem_gateway::Runtime::PerCore, super::$case())
                    .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn shared() {
                crate::common::gateway::serving_on(idem_gateway::Runtime::Shared, super::$case())
                    .await
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_runtimes;

/// Runs `case` with the gateways it starts serving on `runtime`.
pub(crate) async fn serving_on<F: std::future::Future>(runtime: Runtime, case: F) -> F::Output {
    SERVING.scope(runtime, case).await
}

/// How to start a gateway.
pub(crate) struct Options {
    pub idempotency: IdempotencyConfig,
    pub upstream_timeout: Duration,
    pub admin: bool,
    pub max_in_flight: Option<usize>,
    pub routes: Vec<String>,
    /// How long a keyed body may take to arrive (the gateway's default when
    /// `None`).
    pub body_timeout: Option<Duration>,
    /// The upstream URL to give the gateway instead of `http://ADDR` (with
    /// a user and password, say).
    pub upstream_url: Option<String>,
    /// Where connections are served: [`SERVING`] when the test set it,
    /// else the gateway's default.
    pub runtime: Runtime,
    /// How many runtimes serve one per core (the gateway's default when
    /// `None`).
    pub workers: Option<std::num::NonZeroUsize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            idempotency: IdempotencyConfig::default(),
            upstream_timeout: Duration::from_secs(10),
            admin: false,
            max_in_flight: None,
            routes: Vec::new(),
            body_timeout: None,
            upstream_url: None,
            runtime: SERVING.try_with(|runtime| *runtime).unwrap_or_default(),
            workers: None,
        }
    }
}

impl Gateway {
    /// A gateway in front of `upstream`, keeping records in `store`.
    pub(crate) async fn start(upstream: SocketAddr, store: AnyStore, options: Options) -> Gateway {
        let layer = IdempotencyLayer::new(store, options.idempotency);
        let url = options
            .upstream_url
            .unwrap_or_else(|| format!("http://{upstream}"));
        let mut config = GatewayConfig::new(url.parse().unwrap())
            .upstream_timeout(options.upstream_timeout)
            .routes(options.routes)
            .runtime(options.runtime);
        if let Some(limit) = options.max_in_flight {
            config = config.max_in_flight(limit);
        }
        if let Some(workers) = options.workers {
            config = config.workers(workers);
        }
        if let Some(timeout) = options.body_timeout {
            config = config.body_timeout(timeout);
        }
        let local = "127.0.0.1:0".parse().unwrap();
        let listener = match options.runtime {
            Runtime::PerCore => gateway::bind_per_core(local).await.unwrap(),
            _ => tokio::net::TcpListener::bind(local).await.unwrap(),
        };
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (admin, admin_task) = if options.admin {
            let metrics = idem_gateway::admin::metrics_recorder().expect("metrics recorder");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let admin = listener.local_addr().unwrap();
            let task = tokio::spawn(idem_gateway::admin::serve_admin(
                listener,
                layer.store().clone(),
                metrics,
                std::future::pending(),
            ));
            (Some(admin), Some(task))
        } else {
            (None, None)
        };
        let gateway = gateway::Gateway::new(layer.clone(), config);
        let task = tokio::spawn(gateway::run(listener, gateway, async {
            stopped.await.ok();
        }));
        Gateway {
            addr,
            admin,
            layer,
            shutdown: Some(stop),
            task: Some(task),
            admin_task,
        }
    }

    pub(crate) fn client(&self) -> Client {
        Client::to(self.addr)
    }

    pub(crate) fn admin_client(&self) -> Client {
        Client::to(self.admin.expect("started with an admin listener"))
    }

    /// Asks for a graceful shutdown; the returned handle ends when it is done.
    pub(crate) fn shut_down(&mut self) -> JoinHandle<std::io::Result<()>> {
        self.shutdown.take().expect("running").send(()).ok();
        self.task.take().expect("running")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some(task) = &self.admin_task {
            task.abort();
        }
    }
}
