//! `idem serve` as a library: `idem-http`'s [`IdempotencyLayer`] in front of a
//! reverse proxy, so a service written in any language gets `Idempotency-Key`
//! semantics without changing a line.
//!
//! # Why a gateway, and where its guarantee ends
//!
//! The upstream is opaque, so the gateway uses the layer's *leased* protocol:
//! claim the key, forward the request, store the answer (or release the key
//! when the answer says "try again"). Duplicates that arrive after the answer
//! was stored are replayed without reaching the upstream; concurrent ones get
//! 409 at once. What the gateway cannot know is what happened upstream when no
//! answer came back — a timeout, or a connection that broke after the request
//! was sent. It then says so (504/502 with a problem body: *outcome unknown*),
//! keeps the claim until its lease ends, and forwards the next retry after that.
//! Because the `Idempotency-Key` is forwarded unchanged, an upstream that
//! dedupes on it closes that last gap; so does one that answers the gateway's
//! [`Probe`], asked before such a retry is forwarded. One that does neither
//! may apply such a request twice. That boundary is the honest one for any
//! proxy.
//!
//! # Layout
//!
//! - [`run`] (here): the accept loop, a `gateway` span per request (continuing
//!   the request's `traceparent`), and graceful shutdown;
//! - `config`: [`GatewayConfig`] and [`Upstream`];
//! - `proxy`: the reverse proxy on hyper-util's client (hop-by-hop headers,
//!   forwarding headers, timeout, and the outcome-unknown marker);
//! - [`hop`]: the hop-by-hop headers;
//! - `accept`: the accept loop (plain or TLS) and its graceful shutdown;
//! - `cores`: serving on one single-threaded runtime per core, each with
//!   its own listening socket ([`Runtime::PerCore`]);
//! - `loops`: the upstream that is the gateway itself, refused at start-up,
//!   and the `Via` entry that answers a request coming back 508;
//! - `deadline`: the time a keyed request's body has to arrive (408 past it);
//! - `tls`: [`UpstreamTls`] for `https://` upstreams, and [`ListenerTls`]
//!   for the HTTPS listener, its certificate reloaded by a [`CertReloader`]
//!   and its optional client certificates;
//! - `routes`: the route templates that name a request's `route` label;
//! - `observe`: requests by outcome and route;
//! - `probe`: [`Probe`], the question put to the upstream about an unknown
//!   outcome (`--probe`), and its contract;
//! - `grpc`: the gRPC guard, `idem-grpc`'s layer over the forwarding
//!   ([`Gateway::with_grpc`]);
//! - [`settings`]: [`GatewaySettings`], resolved from flags, the environment,
//!   a TOML file and the defaults, with errors that name where a bad value
//!   came from;
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, the key
//!   eviction endpoint), its bearer token and its `Host` allow-list.
//!
//! The pieces another proxy process builds on are public: the accept loop
//! ([`serve_connections`]), the pooled client ([`upstream_client`]), the
//! request as the upstream gets it ([`rewrite_for`], with the client's
//! [`ClientAddr`]) and the [`hop`]-by-hop headers; `idem-proof`'s
//! duplicate-injection proxy (`idem dup-proxy`) and `idem-console`'s
//! listener are built on them.
//!
//! # HTTP/2 and gRPC
//!
//! The listener speaks HTTP/1.1 and HTTP/2 on one port (prior-knowledge h2c
//! in plain text; h2 offered by ALPN over TLS), and an `h2c://` upstream is
//! forwarded to in HTTP/2. A gRPC call (`content-type: application/grpc`)
//! never goes through the HTTP layer, whose stored answers have no trailers:
//! it goes to `idem-grpc`'s layer given with [`Gateway::with_grpc`] (which
//! stores and replays headers, message and trailers and refuses in gRPC
//! status codes), or straight to the upstream when there is none.
//!
//! With a limit of requests in flight ([`GatewayConfig::max_in_flight`]),
//! the requests past it are answered 503 + `Retry-After` at once, before
//! anything else is done with them.
//!
//! # Answers the store could not take
//!
//! When the upstream answered and the store refuses the completion, the
//! layer keeps the answer and retries until stored; with a
//! [`Spool`](idem_http::Spool) on the layer the answer is synced to a local file
//! first. [`run`] stores what an earlier run left in the spool before it
//! serves.
//!
//! Its `/metrics` and `/healthz` are [`admin`]'s.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_gateway::{self as gateway, Gateway, GatewayConfig};
//! use idem_http::{IdempotencyConfig, IdempotencyLayer};
//!
//! let layer = IdempotencyLayer::open(&"sqlite://idem.db".parse()?, IdempotencyConfig::default()).await?;
//! let gateway = Gateway::new(layer, GatewayConfig::new("http://127.0.0.1:9000".parse()?));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! // Hand `stop` to whatever decides to shut down (a SIGTERM handler, say).
//! # drop(stop);
//! gateway::run(listener, gateway, async { stopped.await.ok(); }).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod accept;
pub mod admin;
mod config;
mod cores;
mod deadline;
mod grpc;
pub mod hop;
mod loops;
mod observe;
mod probe;
mod proxy;
mod routes;
pub mod settings;
mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderName, HeaderValue, Request};
use hyper::body::Incoming;
use idem_http::WaitableStore;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tracing::Instrument;

pub use config::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT, GatewayConfig, Runtime, RuntimeError, Upstream,
    UpstreamError,
};
pub use cores::bind_per_core;
pub use observe::REQUESTS_TOTAL;
pub use probe::{IDEMPOTENCY_ORIGINAL_STATUS, Probe, ProbeError};
pub use settings::{
    DEFAULT_LISTEN, DEFAULT_MAX_IN_FLIGHT, DEFAULT_RUNTIME, DEFAULT_STORE, GatewaySettings,
    GivenSettings, MAX_CONCURRENT_WAIT, MAX_IN_FLIGHT, MIN_LEASE, SettingsError, SettingsFile,
    parse_concurrent, parse_duration, parse_grpc_methods, parse_lease, parse_limit, parse_methods,
    parse_routes, parse_size, parse_waiters,
};

pub use accept::{Peer, serve_connections, serve_connections_over};
use deadline::Deadline;
use idem_http::InFlightLimit;
use idem_http::observe::RouteLabel;
use idem_http::{IdempotencyConfig, IdempotencyLayer, IdempotencyService};
use loops::Instance;
use probe::UpstreamProbe;
use proxy::Proxy;
pub use proxy::{
    ClientAddr, UpstreamConnector, is_grpc, rewrite_for, upstream_client, upstream_client_for,
    upstream_client_with_tls,
};
use routes::RouteTemplates;
pub use tls::{
    CertReloader, ListenerTls, TLS_SUBJECT, TLS_SUBJECT_HEADER, TlsError, UpstreamTls, load_certs,
    load_key,
};

/// The forwarding service the gRPC guard wraps: a request to the upstream
/// and its answer, never an error (failures are answers).
type Forward = tower::util::BoxCloneSyncService<Request<Body>, Response, Infallible>;

/// What protects the gateway's gRPC calls: it wraps the [`Forward`] service
/// in `idem-grpc`'s idempotency layer.
type GrpcGuard = Arc<dyn Fn(Forward) -> Forward + Send + Sync>;

/// The idempotency layer over the reverse proxy, ready to [`run`].
pub struct Gateway<St> {
    layer: IdempotencyLayer<St>,
    config: GatewayConfig,
    tls: Option<Arc<rustls::ServerConfig>>,
    grpc: Option<GrpcGuard>,
}

impl<St> std::fmt::Debug for Gateway<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("layer", &self.layer)
            .field("config", &self.config)
            .field("tls", &self.tls.is_some())
            .field("grpc", &self.grpc.is_some())
            .finish()
    }
}

impl<St> Gateway<St> {
    /// A gateway that applies `layer` (its store and [`IdempotencyConfig`]) in
    /// front of the upstream of `config`.
    pub fn new(layer: IdempotencyLayer<St>, config: GatewayConfig) -> Self {
        Self {
            layer,
            config,
            tls: None,
            grpc: None,
        }
    }

    /// Protects gRPC calls with `layer` (`idem-grpc`'s, usually on the same
    /// store): the keyed calls to its unary methods are claimed, forwarded,
    /// and their answers stored with the trailers; refusals are gRPC status
    /// codes. When the upstream's outcome is unknown (a timeout, a broken
    /// connection after the call was sent) the key stays reserved until its
    /// lease ends. Without a layer, gRPC calls are forwarded untouched, key
    /// or not.
    pub fn with_grpc<G: idem::LeaseStore + 'static>(
        mut self,
        layer: idem_grpc::GrpcIdempotencyLayer<G>,
    ) -> Self {
        self.grpc = Some(grpc::guard(layer));
        self
    }

    /// [`with_grpc`](Self::with_grpc), with `probe`'s lookup methods of the
    /// upstream asked (through the gateway's forwarding, with the retry's
    /// metadata and message) before a call whose outcome is unknown runs
    /// again, each lookup awaited at most `timeout`. An unknown outcome then
    /// ends its claim's lease at once instead of holding the key for the
    /// lease.
    pub fn with_grpc_probing<G: idem::LeaseStore + 'static>(
        mut self,
        layer: idem_grpc::GrpcIdempotencyLayer<G>,
        probe: idem_grpc::GrpcProbe,
        timeout: std::time::Duration,
    ) -> Self {
        self.grpc = Some(grpc::guard_probing(layer, probe, timeout));
        self
    }

    /// Serves HTTPS with `tls` (from [`ListenerTls::load`], whose
    /// [`CertReloader`] replaces the certificate for new connections)
    /// instead of plain HTTP.
    pub fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The layer: its store and its configuration.
    pub fn layer(&self) -> &IdempotencyLayer<St> {
        &self.layer
    }

    /// The gateway's own configuration.
    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }
}

/// First stores the answers an earlier run left in the layer's spool, if it
/// has one (waiting while the store is away). Then serves `gateway` on
/// `listener` until `shutdown` completes, then shuts down
/// gracefully: stops accepting, lets the requests in flight finish (each
/// keyed one stores or releases its claim as its upstream answer says, or
/// keeps it until its lease ends when the upstream did not answer), closes
/// idle connections, and returns. Requests still running after the grace
/// period ([`GatewayConfig::shutdown_grace`]) are abandoned; their claims stay
/// until their leases end, as after a crash.
///
/// With [`Runtime::PerCore`] the connections are served on
/// runtimes of their own, one thread each (see [`bind_per_core`] for the
/// listener that spreads them best); the shutdown stops every one, each
/// drains its own requests, and `run` returns once all are done. Dropping
/// the future instead stops them at once.
///
/// Errors if the upstream is the listener itself (every request would be
/// forwarded back to the gateway), if the spool cannot be read or written,
/// if a serving thread cannot start, or if accepting fails for good.
pub async fn run<St>(
    listener: TcpListener,
    gateway: Gateway<St>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    St: WaitableStore + 'static,
{
    let listening = listener.local_addr()?;
    if gateway.config.upstream.points_at(listening).await {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the upstream {} is the gateway's own listener ({listening}): every request would be forwarded back to the gateway without end; give the address of the service behind the gateway",
                gateway.config.upstream
            ),
        ));
    }
    let idempotency = gateway.layer.config().clone();
    let instance = Instance::new();
    match gateway.layer.flush_spool().await {
        Ok(0) => {}
        Ok(stored) => tracing::info!(
            stored,
            "stored the answers an earlier run kept in the spool"
        ),
        Err(error) => return Err(std::io::Error::other(error)),
    }
    let layer = match &gateway.config.probe {
        Some(probe) => {
            gateway
                .layer
                .clone()
                .with_reconcile(probe::Asked(Arc::new(UpstreamProbe {
                    probe: probe.clone(),
                    client: upstream_client_with_tls(
                        gateway.config.connect_timeout(),
                        gateway.config.upstream_tls.as_deref().cloned(),
                    ),
                    upstream: gateway.config.upstream.clone(),
                    timeout: gateway.config.upstream_timeout,
                    principal_header: idempotency.principal().cloned(),
                    instance: instance.clone(),
                })))
        }
        None => gateway.layer.clone(),
    };
    let serving = Serving {
        layer,
        limit: gateway
            .config
            .max_in_flight
            .map(|limit| InFlightLimit::new(limit, gateway.layer.config().vocabulary())),
        routes: RouteTemplates::new(&gateway.config.routes),
        answered: Arc::default(),
        grpc: gateway.grpc,
        tls: gateway.tls.map(tokio_rustls::TlsAcceptor::from),
        idempotency,
        instance,
        config: gateway.config,
    };
    let grace = serving.config.shutdown_grace_period();
    let drained = match serving.config.runtime {
        Runtime::Shared => serving.serve(listener, shutdown).await,
        Runtime::PerCore => {
            let workers = serving.config.worker_count();
            cores::serve(listener, serving, workers, shutdown).await?
        }
    };
    if !drained {
        tracing::warn!(
            ?grace,
            "requests still running after the grace period were abandoned; their keys stay reserved until their leases end"
        );
    }
    Ok(())
}

/// Everything a runtime needs to serve the gateway's listener. What is
/// shared between runtimes (the layer and its store, the limit of requests
/// in flight, the counters) is shared by every clone; each runtime makes
/// its own [`Proxy`], so its upstream connections are its own.
struct Serving<St> {
    layer: IdempotencyLayer<St>,
    config: GatewayConfig,
    idempotency: IdempotencyConfig,
    instance: Instance,
    limit: Option<InFlightLimit>,
    routes: RouteTemplates,
    answered: Arc<observe::Answered>,
    grpc: Option<GrpcGuard>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl<St> Clone for Serving<St> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            config: self.config.clone(),
            idempotency: self.idempotency.clone(),
            instance: self.instance.clone(),
            limit: self.limit.clone(),
            routes: self.routes.clone(),
            answered: Arc::clone(&self.answered),
            grpc: self.grpc.clone(),
            tls: self.tls.clone(),
        }
    }
}

impl<St: WaitableStore + 'static> Serving<St> {
    /// Serves `listener` on the current runtime until `shutdown`, then
    /// drains; `false` when requests were abandoned after the grace period.
    async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> bool {
        let proxy = Proxy::new(
            &self.config,
            self.idempotency.clone(),
            self.instance.clone(),
        );
        let forward = Forward::new(proxy.clone());
        let grpc = match &self.grpc {
            Some(guard) => guard(forward),
            None => forward,
        };
        let service = tower::Layer::layer(&self.layer, proxy);
        let admission = Arc::new(Admission {
            idempotency: self.idempotency.clone(),
            limit: self.limit.clone(),
            routes: self.routes.clone(),
            tls_subject: self
                .config
                .tls_subject_principal
                .then(|| HeaderName::from_static(TLS_SUBJECT_HEADER)),
            grpc,
            answered: Arc::clone(&self.answered),
            instance: self.instance.clone(),
            body_timeout: self.config.body_timeout,
        });
        let per_request = move |request: Request<Incoming>, peer: Arc<Peer>| {
            answer(service.clone(), Arc::clone(&admission), peer, request)
        };
        accept::serve_within(
            listener,
            self.tls.clone(),
            shutdown,
            self.config.shutdown_grace_period(),
            self.config.body_timeout,
            per_request,
        )
        .await
    }
}

/// What every request is admitted by: the layer's config, the limit of
/// requests in flight, and the route templates of the metrics.
struct Admission {
    idempotency: IdempotencyConfig,
    limit: Option<InFlightLimit>,
    routes: RouteTemplates,
    /// The header the client certificate's subject goes in, when it scopes
    /// keys.
    tls_subject: Option<HeaderName>,
    /// Where gRPC calls go: the gRPC guard over the proxy, or the proxy.
    grpc: Forward,
    /// Requests counted by outcome and route.
    answered: Arc<observe::Answered>,
    /// This gateway's name in `Via`, to see a request come back.
    instance: Instance,
    /// How long a keyed request's body may take to arrive.
    body_timeout: std::time::Duration,
}

/// One request through the limit, the layer and the proxy, counted by
/// outcome and route.
async fn answer<St>(
    service: IdempotencyService<Proxy, St>,
    admission: Arc<Admission>,
    peer: Arc<Peer>,
    mut request: Request<Incoming>,
) -> Result<Response, Infallible>
where
    St: WaitableStore + 'static,
{
    let idempotency = &admission.idempotency;
    let keyed = observe::is_keyed(idempotency, &request);
    let route: Arc<str> = admission
        .routes
        .label(request.method(), request.uri().path())
        .into();
    let version = request.version();
    if admission.instance.came_back(request.headers()) {
        // Forwarded by this gateway and back again: forwarding it once more
        // would only make the loop go round.
        let refused = if is_grpc(request.headers()) {
            proxy::grpc_status(
                proxy::GRPC_INTERNAL,
                "the gateway's upstream leads back to the gateway (its own Via entry came back)",
            )
        } else {
            admission
                .instance
                .refusal(idempotency.vocabulary(), version)
        };
        admission
            .answered
            .count(observe::outcome(keyed, &refused), &route);
        return Ok(refused);
    }
    // Shed before anything is read or claimed: the retry starts afresh.
    let _in_flight = match &admission.limit {
        None => None,
        Some(limit) => match limit.admit() {
            Some(permit) => Some(permit),
            None => {
                let shed = limit.shed();
                admission
                    .answered
                    .count(observe::outcome(keyed, &shed), &route);
                if is_grpc(request.headers()) {
                    // The same refusal in gRPC's terms, with its retry hint.
                    let mut refused = proxy::grpc_status(
                        proxy::GRPC_UNAVAILABLE,
                        "the gateway is at its limit of requests in flight; retry after the pushback",
                    );
                    refused
                        .headers_mut()
                        .insert("grpc-retry-pushback-ms", HeaderValue::from_static("1000"));
                    return Ok(refused);
                }
                return Ok(shed);
            }
        },
    };
    if let Some(header) = &admission.tls_subject {
        // Only the TLS session names the subject; never the client.
        request.headers_mut().remove(header);
        if let Some(subject) = &peer.subject
            && let Ok(value) = HeaderValue::from_str(subject)
        {
            request.headers_mut().insert(header.clone(), value);
        }
    }
    if peer.tls {
        request.extensions_mut().insert(proxy::OverTls);
    }
    request.extensions_mut().insert(ClientAddr(peer.addr));
    request
        .extensions_mut()
        .insert(RouteLabel(Arc::clone(&route)));
    let span = tracing::info_span!(
        "gateway",
        method = %request.method(),
        path = request.uri().path(),
    );
    idem_trace::continue_trace(&span, &idem_trace::HttpHeaders(request.headers()));
    // A keyed body (read whole before its key is claimed) has a deadline;
    // other bodies stream to the upstream under its timeout.
    let (request, expired) = {
        let (parts, body) = request.into_parts();
        let (body, expired) = Deadline::new(body, keyed.then_some(admission.body_timeout));
        (Request::from_parts(parts, body), expired)
    };
    let response: Response<Body> = if is_grpc(request.headers()) {
        admission
            .grpc
            .clone()
            .oneshot(request.map(Body::new))
            .instrument(span)
            .await?
    } else {
        service.oneshot(request).instrument(span).await?
    };
    let response = if expired.get() {
        deadline::too_slow(idempotency.vocabulary(), admission.body_timeout, version)
    } else {
        response
    };
    admission
        .answered
        .count(observe::outcome(keyed, &response), &route);
    Ok(response)
}
