//! `idem dup-proxy` as a library: a reverse proxy for a staging system that
//! sends a share of the requests twice and reports, per route, which paths
//! answer the copy as a new request — the paths that are not idempotent.
//!
//! # Why send requests twice on purpose
//!
//! Every client, load balancer and broker in front of a service retries, so
//! every path that changes something will, one day, see the same request
//! twice. Whether it then applies it twice is a property of the path, and
//! the quickest way to know is to try: send a copy — same method, target,
//! headers (the `Idempotency-Key` included) and body — and compare the two
//! answers. A path that applied the copy answers it like a new request
//! (`201` with another id); an idempotent one answers the same, replays the
//! first answer (`Idempotent-Replayed: true`), or is refused by an
//! idempotency layer (409 while the original runs, 422 for a reused key).
//! The client always gets the original's answer.
//!
//! The copy goes at the same time as the original (a client that retries at
//! once, two workers racing), after the original's answer (a client that
//! retries later), or ahead of it (a reordering): [`CopyTiming`].
//!
//! # Layout
//!
//! - `config`: [`DupProxyConfig`], [`Share`], [`CopyTiming`], [`EffectsUrl`];
//! - `send`: one send to the upstream on the gateway's client, and how it ended;
//! - `verdict`: comparing the two answers of a pair ([`Verdict`]);
//! - `effects`: reading the upstream's effect count around a pair;
//! - `history`: the exchanges in the history format of `idem-check`;
//! - `report`: the counts per route ([`Report`]);
//! - `route`: a request's route, identifiers written `{id}`;
//! - `observe`: the proxy's metrics;
//! - [`run`] (here): the accept loop, the choice of the requests sent twice,
//!   and the three timings;
//! - [`command`]: the `idem dup-proxy` command: its flags ([`DupProxyArgs`]),
//!   its listeners and its printed report.
//!
//! It is built on the gateway's pieces ([`idem_gateway`]): the pooled
//! client, the hop-by-hop rules, the forwarding headers and the accept loop.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_proof::dup_proxy::{self, DupProxy, DupProxyConfig, Share};
//!
//! let config = DupProxyConfig::new("http://127.0.0.1:9000".parse()?).share(Share::new(0.05)?);
//! let proxy = DupProxy::new(config)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! # drop(stop);
//! dup_proxy::run(listener, proxy.clone(), async { stopped.await.ok(); }).await?;
//! for route in proxy.report().await.routes {
//!     println!("{}: {:?}", route.route, route.verdict);
//! }
//! # Ok(()) }
//! ```

pub mod command;
mod config;
mod effects;
mod history;
mod observe;
mod report;
mod route;
mod send;
mod verdict;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::get;
use http::{HeaderMap, Request};
use hyper::body::Incoming;
use idem::error_chain;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use command::DupProxyArgs;
pub use config::{
    CopyTiming, DEFAULT_SHARE, DupProxyConfig, EffectsUrl, EffectsUrlError, Share, ShareError,
};
pub use observe::{
    DIVERGENT_ANSWERS_TOTAL, DUPLICATES_SENT_TOTAL, EXTRA_EFFECTS_TOTAL, PAIRS_TOTAL,
    REQUESTS_TOTAL,
};
pub use report::{EffectCount, Report, RouteReport, RouteVerdict};
pub use verdict::Verdict;

use history::{Asked, History};
use idem_gateway::{ClientAddr, serve_connections};
use idem_http::{IDEMPOTENCY_KEY, Mode, Refusal, parse_key};
use report::Tally;
use send::{Held, Reply, RequestBody, Sender};

/// The proxy could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DupProxyError {
    /// The history file could not be created.
    #[error("cannot create the history file {}: {source}", path.display())]
    History {
        /// The path asked for.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The duplicate-injection proxy, ready to [`run`]; clones share the counts,
/// so one clone can serve the report while another runs.
#[derive(Debug, Clone)]
pub struct DupProxy {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    sender: Sender,
    share: Share,
    timing: CopyTiming,
    max_body: usize,
    grace: Duration,
    effects: Option<EffectsUrl>,
    effects_at_start: Mutex<Option<u64>>,
    /// Taken whole by a pair for its effect window, so two windows never
    /// overlap; shared by every other send while effects are measured, so
    /// none runs inside a window.
    window: tokio::sync::RwLock<()>,
    picker: Mutex<StdRng>,
    tally: Tally,
    history: Option<History>,
    next_op: AtomicU64,
    /// Copies still to be sent or answered in the background.
    pending: watch::Sender<usize>,
}

impl DupProxy {
    /// A proxy with `config`; creates the history file, if one is asked for.
    pub fn new(config: DupProxyConfig) -> Result<Self, DupProxyError> {
        let history = config
            .history
            .as_ref()
            .map(|path| {
                History::create(path).map_err(|source| DupProxyError::History {
                    path: path.clone(),
                    source,
                })
            })
            .transpose()?;
        let picker = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let delay = match config.timing {
            CopyTiming::AfterAnswer(delay) => delay,
            CopyTiming::Concurrent | CopyTiming::Ahead => Duration::ZERO,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                sender: Sender::new(
                    config.upstream.clone(),
                    config.connect_timeout(),
                    config.upstream_timeout,
                ),
                share: config.share,
                timing: config.timing,
                max_body: config.max_body,
                grace: config.upstream_timeout + delay + Duration::from_secs(5),
                effects: config.effects,
                effects_at_start: Mutex::new(None),
                window: tokio::sync::RwLock::new(()),
                picker: Mutex::new(picker),
                tally: Tally::default(),
                history,
                next_op: AtomicU64::new(1),
                pending: watch::channel(0).0,
            }),
        })
    }

    /// The report as it stands: the counts per route, and the upstream's
    /// effect count (read now) when an effects URL was given.
    pub async fn report(&self) -> Report {
        let shared = &self.shared;
        let effects = match &shared.effects {
            Some(url) => Some(EffectCount {
                at_start: shared.effects_at_start(),
                now: shared.effect_count(url).await,
                per_pair: shared.timing != CopyTiming::Concurrent,
            }),
            None => None,
        };
        Report {
            routes: shared.tally.routes(),
            effects,
        }
    }

    /// `GET /report`: the [`Report`] as JSON, for the admin listener.
    pub fn report_routes(&self) -> Router {
        let proxy = self.clone();
        Router::new().route(
            "/report",
            get(move || {
                let proxy = proxy.clone();
                async move { axum::Json(proxy.report().await) }
            }),
        )
    }
}

/// Serves `proxy` on `listener` until `shutdown` completes, then stops
/// accepting, lets the requests in flight and the copies still due finish
/// (for at most the upstream timeout, plus the delay, plus 5 s), and returns.
pub async fn run(
    listener: TcpListener,
    proxy: DupProxy,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let shared = proxy.shared;
    if let Some(url) = &shared.effects {
        let count = shared.effect_count(url).await;
        *lock(&shared.effects_at_start) = count;
    }
    let grace = shared.grace;
    let serving = Arc::clone(&shared);
    let per_request = move |request: Request<Incoming>, peer: SocketAddr| {
        let shared = Arc::clone(&serving);
        async move { Ok(shared.forward(request, peer).await) }
    };
    let finished = serve_connections(listener, shutdown, grace, per_request).await;
    let mut pending = shared.pending.subscribe();
    let copies_done = tokio::time::timeout(grace, pending.wait_for(|n| *n == 0))
        .await
        .is_ok();
    if !finished || !copies_done {
        tracing::warn!(
            ?grace,
            "requests or copies still running after the grace period were abandoned"
        );
    }
    Ok(())
}

impl Shared {
    /// One request: forwarded, and sent twice when picked.
    async fn forward(self: &Arc<Self>, request: Request<Incoming>, peer: SocketAddr) -> Response {
        observe::forwarded();
        let (parts, body) = request.into_parts();
        let route = route::route_of(&parts.method, parts.uri.path());
        let key = key_of(&parts.headers);
        let body = match send::hold_body(&parts.headers, body, self.max_body).await {
            Ok(RequestBody::Whole(body)) => body,
            Ok(RequestBody::Streaming(body)) => {
                self.tally.forwarded(&route, true);
                let mut request = Request::from_parts(parts, body);
                request.extensions_mut().insert(ClientAddr(peer));
                return self
                    .outside_windows(self.send_streaming(request, key.as_deref()))
                    .await;
            }
            Err(error) => {
                return Refusal::BodyUnreadable(error_chain(&error)).to_response(Mode::Ietf);
            }
        };
        self.tally.forwarded(&route, false);
        let held = Held {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            peer,
            body,
        };
        let original = self.next_op();
        if !self.pick() {
            let whole = self.history.is_some();
            let reply = self
                .outside_windows(self.send(&held, key.as_deref(), original, None, whole))
                .await;
            return reply.into_response();
        }
        self.tally.duplicated(&route);
        let copy = self.next_op();
        let pair = Pair {
            route,
            key,
            held,
            original,
            copy,
        };
        match self.timing {
            CopyTiming::Concurrent => {
                let (first, second) =
                    tokio::join!(self.send_original(&pair), self.send_copy(&pair));
                self.compare(&pair, &first, &second, None);
                first.into_response()
            }
            CopyTiming::Ahead => {
                let copy = self.outside_windows(self.send_copy(&pair)).await;
                let (original, extra) = self.measured(self.send_original(&pair)).await;
                self.compare(&pair, &copy, &original, extra);
                original.into_response()
            }
            CopyTiming::AfterAnswer(delay) => {
                let original = self.outside_windows(self.send_original(&pair)).await;
                let first = original.seen();
                let pending = Pending::start(&self.pending);
                let shared = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let (copy, extra) = shared.measured(shared.send_copy(&pair)).await;
                    shared.record(&pair, verdict::Verdict::of(&first, &copy.seen()), extra);
                    drop(pending);
                });
                original.into_response()
            }
        }
    }

    /// Whether the next request is sent twice.
    fn pick(&self) -> bool {
        lock(&self.picker).random_bool(self.share.get())
    }

    fn next_op(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    async fn send_original(&self, pair: &Pair) -> Reply {
        self.send(&pair.held, pair.key.as_deref(), pair.original, None, true)
            .await
    }

    async fn send_copy(&self, pair: &Pair) -> Reply {
        observe::copy_sent();
        self.send(
            &pair.held,
            pair.key.as_deref(),
            pair.copy,
            Some(pair.original),
            true,
        )
        .await
    }

    /// Sends `held` as operation `op`, written to the history if there is one.
    async fn send(
        &self,
        held: &Held,
        key: Option<&str>,
        op: u64,
        duplicate_of: Option<u64>,
        whole: bool,
    ) -> Reply {
        if let Some(history) = &self.history {
            let asked = Asked {
                key,
                body: Some(&held.body),
                method: held.method.as_str(),
                path: held.uri.path(),
            };
            history.invoke(op, &asked, duplicate_of);
        }
        let reply = self.sender.send(held.request(), whole).await;
        if let Some(history) = &self.history {
            history.complete(op, &reply);
        }
        reply
    }

    /// Sends a request whose body is too large to hold: once, streamed.
    async fn send_streaming(&self, request: Request<Body>, key: Option<&str>) -> Response {
        let op = self.next_op();
        if let Some(history) = &self.history {
            let asked = Asked {
                key,
                body: None,
                method: request.method().as_str(),
                path: request.uri().path(),
            };
            history.invoke(op, &asked, None);
        }
        let reply = self.sender.send(request, self.history.is_some()).await;
        if let Some(history) = &self.history {
            history.complete(op, &reply);
        }
        reply.into_response()
    }

    /// Runs `send`, a send whose effects belong to no window, outside every
    /// window when windows are measured.
    async fn outside_windows<T>(&self, send: impl Future<Output = T>) -> T {
        if self.effects.is_none() || self.timing == CopyTiming::Concurrent {
            return send.await;
        }
        let _shared = self.window.read().await;
        send.await
    }

    /// Runs `second` (the second send of a pair) inside an effect window when
    /// the pair's sends do not overlap, and returns the effects it caused.
    async fn measured(&self, second: impl Future<Output = Reply>) -> (Reply, Option<u64>) {
        let Some(url) = &self.effects else {
            return (second.await, None);
        };
        if self.timing == CopyTiming::Concurrent {
            return (second.await, None);
        }
        let _window = self.window.write().await;
        let before = self.effect_count(url).await;
        let reply = second.await;
        let after = self.effect_count(url).await;
        let extra = before.zip(after).and_then(|(b, a)| a.checked_sub(b));
        (reply, extra)
    }

    fn effects_at_start(&self) -> Option<u64> {
        *lock(&self.effects_at_start)
    }

    async fn effect_count(&self, url: &EffectsUrl) -> Option<u64> {
        match effects::read(&self.sender, url).await {
            Ok(count) => Some(count),
            Err(error) => {
                tracing::warn!(%error, "could not read the effect count");
                None
            }
        }
    }

    fn compare(&self, pair: &Pair, first: &Reply, second: &Reply, extra: Option<u64>) {
        self.record(
            pair,
            verdict::Verdict::of(&first.seen(), &second.seen()),
            extra,
        );
    }

    fn record(&self, pair: &Pair, verdict: Verdict, extra: Option<u64>) {
        if verdict == Verdict::Different || extra.is_some_and(|e| e > 0) {
            tracing::info!(
                route = %pair.route,
                key = pair.key.as_deref().unwrap_or("(none)"),
                verdict = verdict.as_str(),
                extra_effects = extra,
                "a copy was applied as a new request"
            );
        }
        observe::compared(&pair.route, verdict, extra);
        self.tally
            .compared(&pair.route, pair.key.as_deref(), verdict, extra);
    }
}

/// A request sent twice: its route, key, the request, and the operation
/// numbers of the original and the copy.
#[derive(Debug)]
struct Pair {
    route: String,
    key: Option<String>,
    held: Held,
    original: u64,
    copy: u64,
}

/// One copy still due in the background, counted until dropped.
#[derive(Debug)]
struct Pending(watch::Sender<usize>);

impl Pending {
    fn start(pending: &watch::Sender<usize>) -> Self {
        pending.send_modify(|n| *n += 1);
        Self(pending.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// The request's key as the upstream reads it: an RFC 8941 String unquoted,
/// a bare key as is; a malformed one as written.
fn key_of(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(IDEMPOTENCY_KEY)?;
    Some(match parse_key(value.as_bytes()) {
        Ok(key) => key.as_str().to_owned(),
        Err(_) => String::from_utf8_lossy(value.as_bytes()).trim().to_owned(),
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
