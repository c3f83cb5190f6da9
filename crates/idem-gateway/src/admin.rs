//! The admin listener of a long-running process: `/metrics` in the
//! Prometheus text format and `/healthz`, on an address of its own so neither
//! is reachable through the traffic it serves. `idem serve`, `idem relay` and
//! `idem forward` run it with `--admin-listen`; an application starts it with
//! one call, [`start_admin`]:
//!
//! ```no_run
//! # async fn demo(store: idem::AnyStore) -> Result<(), Box<dyn std::error::Error>> {
//! let admin = idem_gateway::admin::start_admin("127.0.0.1:9090".parse()?, store).await?;
//! println!("metrics on http://{}/metrics", admin.local_addr());
//! // ... run consumers, the relay, handlers: their metrics show up there ...
//! admin.stop().await;
//! # Ok(()) }
//! ```
//!
//! # Who may read it
//!
//! On a loopback address (`127.0.0.1`, `::1`) it is open, as only the host
//! can reach it. On any other address a bearer token is required
//! ([`AdminToken`], read from a file): [`start_admin`] refuses to start
//! without one. `/healthz` stays open to every caller (a load balancer's
//! check carries no credentials); `/metrics` and everything else answer
//! `401` with `WWW-Authenticate: Bearer` unless the request carries
//! `Authorization: Bearer <token>`. The token is compared in constant time
//! and never logged.
//!
//! A loopback listener without a token answers only to loopback `Host`
//! names (`localhost`, `127.0.0.1`, `[::1]`, with any port) and those
//! [`AllowedHosts`] adds (`--allow-host`), so a web page cannot reach it by
//! pointing a name of its own at `127.0.0.1` (DNS rebinding): any other
//! `Host` is answered `421` before the request reaches a route (`/healthz`
//! excepted, as it is from the token). A listener with a token checks
//! `Host` too when names were added.
//!
//! Metrics go through the `metrics` facade; [`metrics_recorder`] installs the
//! Prometheus recorder once per process and hands out its handle. The record
//! gauges (`dedupe_records`, `dedupe_oldest_record_age_seconds`) are read from
//! [`RecordStore::glance`] — the planner's estimate and one index lookup — at
//! most once every [`GLANCE_EVERY`] however often Prometheus scrapes; the
//! [`Sweeper`](idem::Sweeper) refreshes them after each pass too.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::BoxFuture;
use idem::{IdempotencyKey, RecordStore, Scope, sweeper};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

mod hosts;

pub use hosts::{AllowedHosts, BadHostName, check_host};

/// How stale the record gauges may get between two scrapes.
pub const GLANCE_EVERY: Duration = Duration::from_secs(5);

/// The Prometheus recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot install the Prometheus metrics recorder (is another metrics recorder installed in this process?): {0}"
)]
pub struct RecorderError(String);

/// The admin listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// See [`RecorderError`].
    #[error(transparent)]
    Recorder(#[from] RecorderError),
    /// A non-loopback address without a token.
    #[error(
        "the admin listener on {addr} would serve /metrics to anyone who can reach that address: give a bearer token file (--admin-token-file FILE), or listen on a loopback address such as 127.0.0.1:{port}",
        port = addr.port()
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The token file cannot be used.
    #[error("cannot use the admin token file {path}: {reason}")]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr} for /metrics and /healthz: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder as the process's global `metrics`
/// recorder the first time it is called, and returns its handle (the same one
/// on every call). Call it before the work starts, so no count is lost.
pub fn metrics_recorder() -> Result<PrometheusHandle, RecorderError> {
    let mut handle = HANDLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(handle) = handle.as_ref() {
        return Ok(handle.clone());
    }
    let installed = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| RecorderError(e.to_string()))?;
    *handle = Some(installed.clone());
    Ok(installed)
}

/// A running admin listener, from [`start_admin`].
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl AdminServer {
    /// Where it listens (the port, when `:0` was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and waits for the scrapes in progress.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the admin listener failed"),
            Err(error) => tracing::warn!(%error, "the admin listener panicked"),
        }
    }
}

/// The bearer token the admin listener requires on a non-loopback address.
/// Its `Debug` does not show it.
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// The token in the file at `path` (surrounding whitespace, such as the
    /// final newline, trimmed). An empty file is refused.
    pub fn read(path: &std::path::Path) -> Result<Self, AdminError> {
        let text = std::fs::read_to_string(path).map_err(|e| AdminError::TokenFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Self::new(text.trim()).ok_or_else(|| AdminError::TokenFile {
            path: path.to_owned(),
            reason: "it is empty, or holds characters a header cannot carry; write one token of visible ASCII characters".to_owned(),
        })
    }

    /// A token from its text; `None` when empty or not visible ASCII.
    pub fn new(token: &str) -> Option<Self> {
        (!token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Self(token.into()))
    }

    /// Whether `header` (an `Authorization` value) is `Bearer <this token>`,
    /// compared in constant time.
    pub fn admits(&self, header: Option<&http::HeaderValue>) -> bool {
        header
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                let (scheme, token) = value.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .is_some_and(|given| self.is(given))
    }

    /// Whether `given` is this token, compared in constant time.
    pub fn is(&self, given: &str) -> bool {
        // blake3's Hash compares in constant time, and hashing first hides
        // the length too.
        blake3::hash(given.as_bytes()) == blake3::hash(self.0.as_bytes())
    }
}

/// The one call: installs the Prometheus recorder, binds `addr` and serves
/// `/metrics` and `/healthz` (a point lookup in `store`) in a task of its own.
/// Only on a loopback address: elsewhere use [`start_admin_with_token`].
pub async fn start_admin<St>(addr: SocketAddr, store: St) -> Result<AdminServer, AdminError>
where
    St: RecordStore + 'static,
{
    start_admin_with_token(addr, store, None).await
}

/// [`start_admin`], with a bearer token that `/metrics` (and everything but
/// `/healthz`) requires. Without one, a non-loopback `addr` is refused
/// ([`AdminError::TokenRequired`]).
pub async fn start_admin_with_token<St>(
    addr: SocketAddr,
    store: St,
    token: Option<AdminToken>,
) -> Result<AdminServer, AdminError>
where
    St: RecordStore + 'static,
{
    start_admin_with_routes(addr, store, token, Router::new()).await
}

/// [`start_admin_with_token`], serving `routes` beside `/metrics` and
/// `/healthz` (the operator console of `idem serve`). The token guards the
/// admin's own paths; `routes` check their callers themselves, and are told
/// each caller's address (`ConnectInfo<SocketAddr>`). Answers to loopback
/// `Host` names only when there is no token.
pub async fn start_admin_with_routes<St>(
    addr: SocketAddr,
    store: St,
    token: Option<AdminToken>,
    routes: Router,
) -> Result<AdminServer, AdminError>
where
    St: RecordStore + 'static,
{
    start_admin_with_hosts(addr, store, token, routes, AllowedHosts::loopback()).await
}

/// [`start_admin_with_routes`], answering to the `Host` names of `hosts`
/// too: every request is checked against them, before the token and the
/// routes, when there is no token or when `hosts` adds names.
pub async fn start_admin_with_hosts<St>(
    addr: SocketAddr,
    store: St,
    token: Option<AdminToken>,
    routes: Router,
    hosts: AllowedHosts,
) -> Result<AdminServer, AdminError>
where
    St: RecordStore + 'static,
{
    check_access(addr, token.as_ref())?;
    let metrics = metrics_recorder()?;
    spawn(addr, move |listener, shutdown| {
        serve_admin_with_routes(listener, store, metrics, token, routes, hosts, shutdown)
    })
    .await
}

/// A listener open to other hosts needs a token.
fn check_access(addr: SocketAddr, token: Option<&AdminToken>) -> Result<(), AdminError> {
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(AdminError::TokenRequired { addr });
    }
    Ok(())
}

/// Refuses every request whose `Host` is not one of `hosts`, before
/// anything else runs, when the listener has no token (`tokenless`) or
/// `hosts` adds names to the loopback ones. `/healthz` is answered under
/// any name, as it is without a token: a health check may name the
/// listener as it likes, and the answer says only whether the process is
/// ready.
fn host_checked(app: Router, hosts: AllowedHosts, tokenless: bool) -> Router {
    if !tokenless && !hosts.is_extended() {
        return app;
    }
    app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let hosts = hosts.clone();
            async move {
                if request.uri().path() == "/healthz" {
                    next.run(request).await
                } else {
                    check_host(hosts, request, next).await
                }
            }
        },
    ))
}

/// Requires `Authorization: Bearer <token>` on everything but `/healthz`.
fn guarded(app: Router, token: Option<AdminToken>) -> Router {
    let Some(token) = token else {
        return app;
    };
    app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let token = token.clone();
            async move {
                if request.uri().path() == "/healthz"
                    || token.admits(request.headers().get(header::AUTHORIZATION))
                {
                    next.run(request).await
                } else {
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer realm=\"idem admin\"")],
                        "this admin listener needs Authorization: Bearer <token>\n",
                    )
                        .into_response()
                }
            }
        },
    ))
}

/// The admin listener of a process without a store (`idem dup-proxy`):
/// installs the Prometheus recorder, binds `addr` and serves `/metrics`, a
/// `/healthz` that answers `200 ok` while the process runs, and `routes`
/// (a report, say) in a task of its own. With a bearer token, everything
/// but `/healthz` requires it; without one, only a loopback `addr` is
/// accepted ([`AdminError::TokenRequired`]). Requests are checked against
/// the `Host` names of `hosts` as on every admin listener.
pub async fn start_admin_without_store(
    addr: SocketAddr,
    routes: Router,
    token: Option<AdminToken>,
    hosts: AllowedHosts,
) -> Result<AdminServer, AdminError> {
    check_access(addr, token.as_ref())?;
    let metrics = metrics_recorder()?;
    let app = routes
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { prometheus_text(&metrics) }
            }),
        )
        .route(
            "/healthz",
            get(|| async {
                match reconnecting() {
                    Some(text) => (StatusCode::SERVICE_UNAVAILABLE, text),
                    None => (StatusCode::OK, "ok\n".to_owned()),
                }
            }),
        );
    let tokenless = token.is_none();
    let app = host_checked(guarded(app, token), hosts, tokenless);
    spawn(addr, move |listener, shutdown| async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    })
    .await
}

/// Binds `addr` and runs `serve` on it in a task of its own, until
/// [`AdminServer::stop`].
async fn spawn<S, Fut>(addr: SocketAddr, serve: S) -> Result<AdminServer, AdminError>
where
    S: FnOnce(TcpListener, BoxFuture<'static, ()>) -> Fut,
    Fut: Future<Output = std::io::Result<()>> + Send + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| AdminError::Bind { addr, source })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(
        listener,
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    Ok(AdminServer { addr, stop, task })
}

struct Admin<St> {
    store: St,
    metrics: PrometheusHandle,
    last_glance: Mutex<Option<Instant>>,
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown` completes.
///
/// `/healthz` answers `200 ok` while the store answers a point lookup and
/// every connection registered in [`idem::health`] is up; `503` otherwise,
/// naming the connections being made again and their last errors, or the
/// store's error.
pub async fn serve_admin<St>(
    listener: TcpListener,
    store: St,
    metrics: PrometheusHandle,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    St: RecordStore + 'static,
{
    serve_admin_with_token(listener, store, metrics, None, shutdown).await
}

/// [`serve_admin`], requiring `Authorization: Bearer <token>` on everything
/// but `/healthz` when `token` is given.
pub async fn serve_admin_with_token<St>(
    listener: TcpListener,
    store: St,
    metrics: PrometheusHandle,
    token: Option<AdminToken>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    St: RecordStore + 'static,
{
    serve_admin_with_routes(
        listener,
        store,
        metrics,
        token,
        Router::new(),
        AllowedHosts::loopback(),
        shutdown,
    )
    .await
}

async fn serve_admin_with_routes<St>(
    listener: TcpListener,
    store: St,
    metrics: PrometheusHandle,
    token: Option<AdminToken>,
    routes: Router,
    hosts: AllowedHosts,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    St: RecordStore + 'static,
{
    // A listener open to other hosts (only a caller of `serve_admin` can
    // make one without a token) is reached by names this process cannot
    // know: its `Host` is checked only when names were added.
    let tokenless = token.is_none() && listener.local_addr()?.ip().is_loopback();
    let admin = Arc::new(Admin {
        store,
        metrics,
        last_glance: Mutex::new(None),
    });
    let app = Router::new()
        .route("/metrics", get(scrape::<St>))
        .route("/healthz", get(health::<St>))
        .with_state(admin);
    let app = host_checked(guarded(app, token).merge(routes), hosts, tokenless);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

async fn scrape<St: RecordStore>(State(admin): State<Arc<Admin<St>>>) -> impl IntoResponse {
    if admin.glance_due() {
        match admin.store.glance().await {
            Ok(glance) => sweeper::publish(glance),
            Err(error) => {
                tracing::warn!(%error, "could not read the record gauges for /metrics");
            }
        }
    }
    prometheus_text(&admin.metrics)
}

/// The metrics in the Prometheus text format.
fn prometheus_text(metrics: &PrometheusHandle) -> impl IntoResponse + use<> {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(),
    )
}

impl<St> Admin<St> {
    fn glance_due(&self) -> bool {
        let mut last = self
            .last_glance
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= GLANCE_EVERY);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

async fn health<St: RecordStore>(State(admin): State<Arc<Admin<St>>>) -> impl IntoResponse {
    if let Some(reconnecting) = reconnecting() {
        return (StatusCode::SERVICE_UNAVAILABLE, reconnecting);
    }
    let scope = Scope::new("healthz").expect("a valid scope");
    let key = IdempotencyKey::new("healthz").expect("a valid key");
    match admin.store.get(&scope, &key).await {
        Ok(_) => (StatusCode::OK, "ok\n".to_owned()),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the idempotency store does not answer: {error}\n"),
        ),
    }
}

/// The not-ready answer while a broker or database connection of the process
/// is being made again ([`idem::health`]); `None` while every one is up.
fn reconnecting() -> Option<String> {
    let down = idem::health::unready();
    if down.is_empty() {
        return None;
    }
    let mut text = String::from("not ready: a connection is down and being made again\n");
    for connection in down {
        text.push_str(&format!("{connection}\n"));
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{AdminToken, AllowedHosts, start_admin_with_hosts};

    /// Sends `GET path` with `Host: host` on a connection of its own; the
    /// status and the body.
    async fn get(addr: SocketAddr, path: &str, host: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    async fn store() -> (tempfile::TempDir, idem::AnyStore) {
        let dir = tempfile::tempdir().unwrap();
        let location = idem::StoreLocation::Sqlite(dir.path().join("idem.db"));
        let store = idem::AnyStore::open(&location).await.unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn a_loopback_admin_listener_answers_to_its_own_names_only() {
        let (_dir, store) = store().await;
        let hosts = AllowedHosts::parse(["metrics.internal"]).unwrap();
        let admin = start_admin_with_hosts(
            "127.0.0.1:0".parse().unwrap(),
            store,
            None,
            axum::Router::new(),
            hosts,
        )
        .await
        .unwrap();
        let addr = admin.local_addr();
        let port = addr.port();
        for path in ["/metrics", "/nowhere", "/healthz/more"] {
            let (status, body) = get(addr, path, &format!("evil.example:{port}")).await;
            assert_eq!(status, 421, "{path}: {body}");
            let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(problem["host"], format!("evil.example:{port}"));
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.contains("--allow-host evil.example") && detail.contains("IDEM_ALLOW_HOSTS"),
                "{detail}"
            );
        }
        for host in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            "metrics.internal".to_owned(),
        ] {
            let (status, body) = get(addr, "/metrics", &host).await;
            assert_eq!(status, 200, "{host}: {body}");
        }
        // A health check may name the listener as it likes.
        let (status, body) = get(addr, "/healthz", "admin").await;
        assert_eq!(status, 200, "{body}");
        admin.stop().await;
    }

    #[tokio::test]
    async fn a_listener_with_a_token_checks_host_only_when_names_were_added() {
        let (_dir, store) = store().await;
        let token = AdminToken::new("s3cret").unwrap();
        let open = start_admin_with_hosts(
            "127.0.0.1:0".parse().unwrap(),
            store.clone(),
            Some(token.clone()),
            axum::Router::new(),
            AllowedHosts::loopback(),
        )
        .await
        .unwrap();
        let (status, _) = get(open.local_addr(), "/metrics", "admin.example").await;
        assert_eq!(status, 401, "the token is asked for");
        open.stop().await;

        let named = start_admin_with_hosts(
            "127.0.0.1:0".parse().unwrap(),
            store,
            Some(token),
            axum::Router::new(),
            AllowedHosts::parse(["admin.example"]).unwrap(),
        )
        .await
        .unwrap();
        let (status, _) = get(named.local_addr(), "/metrics", "admin.example").await;
        assert_eq!(status, 401, "the token is asked for");
        let (status, _) = get(named.local_addr(), "/metrics", "evil.example").await;
        assert_eq!(status, 421);
        let (status, _) = get(named.local_addr(), "/healthz", "evil.example").await;
        assert_eq!(status, 200);
        named.stop().await;
    }
}
