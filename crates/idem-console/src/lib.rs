//! The operator console of Idem: web pages and a JSON API over a store, for
//! the questions of an incident. Was this payment applied? Which claims are
//! stuck in flight, and when do their leases end? What is in the dead
//! letters, and can these be redriven safely? Is the outbox keeping up?
//!
//! `idem console --listen 127.0.0.1:9300` serves it over any store; `idem
//! serve --admin-listen` serves the same pages beside `/metrics`. An
//! application mounts it with [`Console::router`]:
//!
//! ```no_run
//! # async fn demo(store: idem::AnyStore) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_console::{Access, Console};
//! let console = Console::new(store, Access::open());
//! let addr: std::net::SocketAddr = "127.0.0.1:9300".parse()?;
//! Access::open().check_listen(addr)?;
//! let listener = tokio::net::TcpListener::bind(addr).await?;
//! idem_console::serve(listener, console, std::future::pending()).await?;
//! # Ok(()) }
//! ```
//!
//! Modules:
//!
//! - [`access`]: loopback or tokens, the read-only token, the `Host`
//!   allow-list, sign-in, CSRF.
//! - [`sessions`]: signed-in browsers, by random ids that expire.
//! - [`throttle`]: wrong tokens slowed down, per address and overall.
//! - [`api`]: the JSON API and its OpenAPI document.
//! - `pages`: the server-rendered pages (maud), one module per subject.
//! - [`read`] and [`actions`]: what pages and API read and do, written once.
//! - [`view`]: records, letters, groups and audit lines as shown.
//! - [`charts`]: the last hour's samples and their SVG.
//! - [`auditor`]: the live auditor run by the console, and its panel.
//! - [`problem`]: errors as `application/problem+json`.
//!
//! The stylesheet and the one small script (the lease countdown) are built
//! into the binary: the console works without a network.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
pub mod actions;
pub mod api;
pub mod auditor;
pub mod charts;
mod pages;
pub mod problem;
pub mod read;
pub mod sessions;
pub mod throttle;
pub mod view;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::header;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use idem::{AnyStore, SharedClock, SystemClock};
use idem_gateway::admin::AllowedHosts;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tower::ServiceExt;

pub use access::{Access, Role, TokenRequired};
pub use sessions::SessionLimits;

use charts::Charts;
use sessions::Sessions;
use throttle::Throttle;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: AnyStore,
    pub(crate) access: Access,
    pub(crate) charts: Arc<Charts>,
    pub(crate) auditor: Arc<auditor::Panel>,
    /// The `Host` names answered to (checked when there is no token, or
    /// when names were added).
    pub(crate) hosts: AllowedHosts,
    /// Sessions and failed sign-ins are timed by it.
    pub(crate) clock: SharedClock,
    /// Whether cookies are marked `Secure` (served over TLS).
    pub(crate) secure_cookies: bool,
    pub(crate) sessions: Sessions,
    pub(crate) throttle: Throttle,
}

impl Shared {
    /// The same settings, charts and auditor, with sessions and failures of
    /// its own.
    fn copy(&self) -> Self {
        Self {
            store: self.store.clone(),
            access: self.access.clone(),
            charts: Arc::clone(&self.charts),
            auditor: Arc::clone(&self.auditor),
            hosts: self.hosts.clone(),
            clock: Arc::clone(&self.clock),
            secure_cookies: self.secure_cookies,
            sessions: Sessions::new(self.sessions.limits()),
            throttle: Throttle::default(),
        }
    }
}

/// The console over one store.
#[derive(Debug, Clone)]
pub struct Console {
    shared: Arc<Shared>,
}

/// How often the charts take a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);

impl Console {
    /// The console over `store`, admitting callers as `access` says, to
    /// loopback `Host` names only when it has no token.
    pub fn new(store: AnyStore, access: Access) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                access,
                charts: Arc::new(Charts::default()),
                auditor: Arc::new(auditor::Panel::default()),
                hosts: AllowedHosts::loopback(),
                clock: Arc::new(SystemClock),
                secure_cookies: false,
                sessions: Sessions::new(SessionLimits::default()),
                throttle: Throttle::default(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Shared)) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => change(shared),
            None => {
                let mut shared = self.shared.copy();
                change(&mut shared);
                self.shared = Arc::new(shared);
            }
        }
        self
    }

    /// Answers to the `Host` names of `hosts` (the loopback ones and those
    /// it adds). Every request is checked, before anything else, when the
    /// console has no token or `hosts` adds names; any other `Host` is
    /// answered `421`.
    pub fn allow_hosts(self, hosts: AllowedHosts) -> Self {
        self.with(|shared| shared.hosts = hosts)
    }

    /// Marks its cookies `Secure`, so a browser sends them over HTTPS only:
    /// for a console behind a proxy that terminates TLS. [`serve_tls`] does
    /// it itself.
    pub fn secure_cookies(self) -> Self {
        self.with(|shared| shared.secure_cookies = true)
    }

    /// How long a browser's sign-in lasts [default: 2 h idle, 12 h in all].
    pub fn session_limits(self, limits: SessionLimits) -> Self {
        self.with(|shared| shared.sessions = Sessions::new(limits))
    }

    /// Times sessions and failed sign-ins by `clock` instead of the
    /// system's (a test's manual clock).
    pub fn clock(self, clock: SharedClock) -> Self {
        self.with(|shared| shared.clock = clock)
    }

    /// Starts sampling the charts every `every`: this process's counters
    /// from `metrics` (when it records them) and the store's figures. The
    /// task ends when the returned handle is aborted.
    pub fn start_charts(
        &self,
        metrics: Option<PrometheusHandle>,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        self.shared
            .charts
            .start(self.shared.store.clone(), metrics, every)
    }

    /// Starts the live auditor in this process: passes over `log` (the
    /// service's effect log) and the store's records as `options` say, their
    /// findings shown on the Auditor page and at `/api/v1/auditor`. The task
    /// ends when the returned handle is aborted.
    pub fn start_auditor<L: idem_check::audit::EffectLog + 'static>(
        &self,
        log: L,
        options: auditor::AuditorOptions,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(auditor::run(
            Arc::clone(&self.shared.auditor),
            self.shared.store.clone(),
            log,
            options,
        ))
    }

    /// The pages, the API and the assets, at the root of a router.
    pub fn router(&self) -> Router {
        use pages::{letters, login, overview, records, set_aside};
        Router::new()
            .route("/", get(overview::overview))
            .route("/records", get(records::list))
            .route("/records/show", get(records::show))
            .route(
                "/records/{verb}",
                get(records::confirm).post(records::change),
            )
            .route("/in-flight", get(records::in_flight))
            .route("/dead-letters", get(letters::list))
            .route(
                "/dead-letters/redrive",
                get(letters::confirm_set).post(letters::redrive_set),
            )
            .route(
                "/dead-letters/discard",
                get(set_aside::confirm_discard_set).post(set_aside::discard_set),
            )
            .route(
                "/dead-letters/archive",
                get(set_aside::confirm_archive_set).post(set_aside::archive_set),
            )
            .route("/dead-letters/{id}", get(letters::show))
            .route(
                "/dead-letters/{id}/redrive",
                get(letters::confirm_one).post(letters::redrive_one),
            )
            .route(
                "/dead-letters/{id}/{verb}",
                get(set_aside::confirm_one).post(set_aside::set_aside_one),
            )
            .route("/outbox", get(overview::outbox))
            .route("/audit", get(overview::audit))
            .route("/auditor", get(overview::auditor))
            .route("/login", get(login::show).post(login::sign_in))
            .route("/logout", post(login::sign_out))
            .route("/assets/console.css", get(stylesheet))
            .route("/assets/console.js", get(script))
            .merge(api::routes())
            .fallback(pages::not_found)
            .layer(middleware::from_fn_with_state(
                Arc::clone(&self.shared),
                access::check,
            ))
            .layer(middleware::from_fn_with_state(
                Arc::clone(&self.shared),
                access::check_host,
            ))
            .with_state(Arc::clone(&self.shared))
    }
}

async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../assets/console.css"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../assets/console.js"),
    )
}

/// Serves `console` on `listener` until `shutdown` completes, with each
/// caller's address known (the audit log names it).
pub async fn serve(
    listener: TcpListener,
    console: Console,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        console
            .router()
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// How long the requests in flight may take to finish once [`serve_tls`]
/// is told to stop.
const GRACE: Duration = Duration::from_secs(10);

/// [`serve`] over TLS with `tls` (such as
/// [`ListenerTls::load`](idem_gateway::ListenerTls::load) makes), HTTP/1.1
/// and HTTP/2; the console's cookies are marked `Secure`.
pub async fn serve_tls(
    listener: TcpListener,
    console: Console,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = console.secure_cookies().router();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let finished = idem_gateway::serve_connections_over(
        listener,
        Some(acceptor),
        shutdown,
        GRACE,
        move |request, peer: Arc<idem_gateway::Peer>| {
            let router = router.clone();
            async move {
                let mut request = request.map(axum::body::Body::new);
                request.extensions_mut().insert(ConnectInfo(peer.addr));
                router.oneshot(request).await
            }
        },
    )
    .await;
    if !finished {
        tracing::warn!(
            ?GRACE,
            "requests to the console were still running when it stopped"
        );
    }
    Ok(())
}
