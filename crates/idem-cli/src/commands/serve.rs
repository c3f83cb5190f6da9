//! `idem serve`: the gateway. Resolves the settings, opens the store, binds
//! the listeners, announces them on stdout, and serves until SIGTERM or
//! Ctrl-C, then shuts down gracefully.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use idem::AnyStore;
use idem_gateway::admin::AdminToken;
use idem_gateway::{self as gateway, CertReloader, Gateway};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, GrpcProbe, GrpcStatusPolicy};
use idem_http::{IdempotencyLayer, Spool};
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use super::signals::terminated;
use super::upkeep::Upkeep;
use idem_gateway::{GatewaySettings, GivenSettings, SettingsFile};
use idem_trace::KeyInSpans;

/// `idem serve`. Each setting comes from its flag, else its `IDEM_*`
/// variable, else the `--config` file, else the default. The store is the
/// global `--store` (or `IDEM_STORE`, or `store` in the file) [default: sqlite://idem.db].
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The service to forward to: http://HOST:PORT or https://HOST:PORT
    /// (HTTP/1.1), or h2c://HOST:PORT (HTTP/2 without TLS, for gRPC),
    /// optionally with a base path.
    #[arg(
        long,
        env = "IDEM_UPSTREAM",
        value_name = "URL",
        hide_env_values = true
    )]
    pub upstream: Option<String>,
    /// For an https:// upstream: a PEM file of the CA certificates its
    /// certificate is checked against [default: the bundled webpki roots].
    #[arg(
        long,
        env = "IDEM_UPSTREAM_CA",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub upstream_ca: Option<String>,
    /// For an https:// upstream: a PEM client certificate to present (with
    /// --upstream-key) [default: none].
    #[arg(
        long,
        env = "IDEM_UPSTREAM_CERT",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub upstream_cert: Option<String>,
    /// The PEM private key of --upstream-cert.
    #[arg(
        long,
        env = "IDEM_UPSTREAM_KEY",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub upstream_key: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); reloaded
    /// on SIGHUP and when the file changes, without dropping connections
    /// [default: plain HTTP].
    #[arg(
        long,
        env = "IDEM_TLS_CERT",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub tls_cert: Option<String>,
    /// The PEM private key of --tls-cert.
    #[arg(
        long,
        env = "IDEM_TLS_KEY",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub tls_key: Option<String>,
    /// Require client certificates signed by a CA in this PEM file (mTLS);
    /// with --principal-header tls-subject their CN scopes the keys
    /// [default: none].
    #[arg(
        long,
        env = "IDEM_TLS_CLIENT_CA",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub tls_client_ca: Option<String>,
    /// A file holding the bearer token the admin listener requires
    /// (Authorization: Bearer TOKEN) on /metrics; needed when --admin-listen
    /// is not a loopback address [default: none].
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN_FILE",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub admin_token_file: Option<String>,
    /// Another Host name the admin listener and its console answer to
    /// besides the loopback ones (localhost, *.localhost, 127.0.0.0/8,
    /// [::1]); a request naming any other is refused (421), so a web page
    /// cannot reach them through DNS rebinding. Repeat the flag or separate
    /// names with commas; *.example.com allows the names under example.com
    /// [default: loopback names only].
    #[arg(
        long = "allow-host",
        env = "IDEM_ALLOW_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// Where the gateway listens [default: 127.0.0.1:8080].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// How refusals are written: ietf (problem+json, 422 for a reused key) or
    /// stripe (idempotency_error, 400) [default: ietf].
    #[arg(long, env = "IDEM_MODE", value_name = "MODE")]
    pub mode: Option<String>,
    /// Refuse requests that carry no Idempotency-Key (400) when their method
    /// is one of --methods [default: false].
    #[arg(
        long,
        env = "IDEM_REQUIRE_KEY",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub require_key: Option<bool>,
    /// Largest keyed request body read, such as 1MiB, 64KiB or 65536; larger
    /// ones get 413 [default: 1MiB].
    #[arg(long, env = "IDEM_MAX_BODY", value_name = "SIZE")]
    pub max_body: Option<String>,
    /// How long an in-flight claim is protected, such as 60s or 2m; at least
    /// 1s [default: 60s].
    #[arg(
        long,
        env = "IDEM_LEASE",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub lease: Option<String>,
    /// How long answers are kept for replay: the dedupe window, such as 24h or
    /// 7d [default: 7d].
    #[arg(
        long,
        env = "IDEM_RETENTION",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub retention: Option<String>,
    /// Keep a tombstone of each swept key this much longer, such as 30d, so a
    /// late retry is refused with 410 Gone instead of running again
    /// [default: off].
    #[arg(
        long,
        env = "IDEM_TOMBSTONES",
        value_name = "DURATION|off",
        allow_hyphen_values = true
    )]
    pub tombstones: Option<String>,
    /// Settled answers kept in memory so replays skip the store, such as
    /// 64MiB, or `off`; an answer is served from memory until its record
    /// expires, and for at most 5 s after it was cached [default: 64MiB].
    #[arg(long, env = "IDEM_REPLAY_CACHE", value_name = "SIZE|off")]
    pub replay_cache: Option<String>,
    /// Serve /metrics (Prometheus) and /healthz on this address [default: off].
    #[arg(long, env = "IDEM_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// How long to wait for the upstream's answer; past it the outcome is
    /// unknown and the client gets 504 [default: 30s].
    #[arg(
        long,
        env = "IDEM_UPSTREAM_TIMEOUT",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub upstream_timeout: Option<String>,
    /// How long a client may take to send a keyed request's whole body;
    /// past it the request gets 408 and its key stays free. Also how long an
    /// HTTP/1.1 client may take to send a request's head, or leave its
    /// connection idle [default: 30s].
    #[arg(
        long,
        env = "IDEM_BODY_TIMEOUT",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub body_timeout: Option<String>,
    /// Ask the upstream before forwarding a retry whose earlier attempt ended
    /// unknown, such as 'GET /payments/by-key/{key}': 2xx = applied (its
    /// answer is stored and replayed), 404 = not applied (forwarded), anything
    /// else = 503 [default: off].
    #[arg(long, env = "IDEM_PROBE", value_name = "TEMPLATE")]
    pub probe: Option<String>,
    /// What an upstream answer means for its key, per status or class:
    /// store (kept and replayed), release (nothing happened: the retry is
    /// forwarded) or unknown (the key is kept; with --probe the retry asks
    /// it, else the key stays reserved for the lease), as in
    /// '500=store,502=unknown,5xx=release' [default: 2xx and 4xx store;
    /// 408, 409, 425, 429, 503 release; 502, 504 unknown; 500 unknown with a
    /// probe, else release].
    #[arg(long, env = "IDEM_ON_STATUS", value_name = "STATUS=VERDICT,...")]
    pub on_status: Option<String>,
    /// The local file where answers the store could not take yet are kept
    /// (synced) until stored, also across a restart; `off` for none
    /// [default: next to an SQLite store, STORE.spool; else idem.spool].
    #[arg(long, env = "IDEM_SPOOL", value_name = "PATH")]
    pub spool: Option<String>,
    /// The header that names the caller; keys are scoped by its hash, `none`
    /// to share one key space, `tls-subject` for the client certificate's CN
    /// (with --tls-client-ca) [default: authorization].
    #[arg(long, env = "IDEM_PRINCIPAL_HEADER", value_name = "HEADER")]
    pub principal_header: Option<String>,
    /// The methods on which --require-key refuses a request without an
    /// Idempotency-Key, comma-separated. A request that carries a key is
    /// deduplicated whatever its method (POST, PUT, PATCH, DELETE, ...);
    /// GET, HEAD, OPTIONS and TRACE pass through [default: POST,PATCH].
    #[arg(long, env = "IDEM_METHODS", value_name = "LIST")]
    pub methods: Option<String>,
    /// How often expired records are swept, ±50 % jitter, such as 60s or
    /// 10m; `off` when a cron job runs `idem gc` instead [default: 60s].
    #[arg(
        long,
        env = "IDEM_SWEEP_EVERY",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub sweep_every: Option<String>,
    /// The most requests answered at once; past it a request is answered 503
    /// with Retry-After at once instead of waiting in a queue, such as 256,
    /// or `off` [default: 1024].
    #[arg(long, env = "IDEM_MAX_IN_FLIGHT", value_name = "N")]
    pub max_in_flight: Option<String>,
    /// What a duplicate gets while its original is still running: `reject`
    /// (409 with Retry-After at once) or `wait:DURATION`, such as wait:5s
    /// (the original's answer as a replay as soon as it is stored, or 409
    /// when the wait runs out or the original ends without one)
    /// [default: reject].
    #[arg(long, env = "IDEM_CONCURRENT", value_name = "reject|wait:DURATION")]
    pub concurrent: Option<String>,
    /// With --concurrent wait: the most duplicates waiting at once in this
    /// process; past it a duplicate gets 409 at once [default: 1024].
    #[arg(long, env = "IDEM_MAX_WAITERS", value_name = "N")]
    pub max_waiters: Option<String>,
    /// With --concurrent wait: the most duplicates waiting on one key in
    /// this process; past it a duplicate gets 409 at once [default: 64].
    #[arg(long, env = "IDEM_MAX_WAITERS_PER_KEY", value_name = "N")]
    pub max_waiters_per_key: Option<String>,
    /// Route templates that name the `route` label of the metrics,
    /// comma-separated, such as '/payments/{id},/orders'; a path that
    /// matches none is labelled with its first segment [default: none].
    #[arg(long, env = "IDEM_ROUTES", value_name = "LIST")]
    pub routes: Option<String>,
    /// The unary gRPC methods whose calls with an idempotency-key metadata
    /// entry are deduplicated (answers stored with their trailers, refusals
    /// as gRPC status codes), comma-separated, such as
    /// '/payments.v1.Payments/Charge'; every other gRPC call, streaming ones
    /// among them, is forwarded untouched [default: none].
    #[arg(long, env = "IDEM_GRPC_UNARY", value_name = "LIST")]
    pub grpc_unary: Option<String>,
    /// Ask the upstream's lookup method before running a --grpc-unary call
    /// again whose earlier attempt ended unknown, such as
    /// '/payments.v1.Payments/Lookup' (sent the retry's metadata and
    /// message): OK = applied (its reply is stored and replayed), NOT_FOUND
    /// = not applied (forwarded), anything else = UNAVAILABLE; or
    /// METHOD=LOOKUP pairs, comma-separated [default: off].
    #[arg(long, env = "IDEM_GRPC_PROBE", value_name = "METHOD")]
    pub grpc_probe: Option<String>,
    /// What a --grpc-unary call's status code means for its key, by name or
    /// number: store, release or unknown, as in 'internal=store,14=unknown'
    /// [default: OK and the client errors store; UNAVAILABLE,
    /// RESOURCE_EXHAUSTED, ABORTED release; DEADLINE_EXCEEDED, UNKNOWN,
    /// DATA_LOSS, CANCELLED unknown; INTERNAL unknown with --grpc-probe,
    /// else release].
    #[arg(long, env = "IDEM_ON_GRPC_STATUS", value_name = "CODE=VERDICT,...")]
    pub on_grpc_status: Option<String>,
    /// Fingerprint only these fields of a keyed JSON body (with the method,
    /// route and target), as JSON Pointers (RFC 6901) after json:, such as
    /// 'json:/amount,/currency,/account': a retry that differs elsewhere is
    /// replayed, one that differs in them is refused as key reuse. A missing
    /// field counts as absent (not null); a body that is not JSON is
    /// fingerprinted whole [default: the whole body].
    #[arg(long, env = "IDEM_FINGERPRINT", value_name = "json:FIELDS")]
    pub fingerprint: Option<String>,
    /// Fingerprint the keyed body less these JSON fields, such as
    /// 'json:/sent_at,/trace_id' (instead of --fingerprint) [default: none].
    #[arg(long, env = "IDEM_FINGERPRINT_IGNORE", value_name = "json:FIELDS")]
    pub fingerprint_ignore: Option<String>,
    /// Fingerprint this request header's values too, such as content-type;
    /// repeat the flag or separate names with commas (a missing header
    /// differs from an empty one) [default: none].
    #[arg(
        long,
        env = "IDEM_FINGERPRINT_HEADER",
        value_name = "HEADER",
        value_delimiter = ','
    )]
    pub fingerprint_header: Vec<String>,
    /// A TOML file with the same settings: upstream, listen, store, mode,
    /// require_key, max_body, lease, retention, tombstones, replay_cache,
    /// admin_listen,
    /// upstream_timeout, body_timeout, probe, on_status, spool, principal_header, methods, sweep_every,
    /// max_in_flight, concurrent, max_waiters, max_waiters_per_key, routes,
    /// grpc_unary, grpc_probe, on_grpc_status, fingerprint, fingerprint_ignore, fingerprint_header,
    /// upstream_ca, upstream_cert, upstream_key, tls_cert, tls_key,
    /// tls_client_ca, admin_token_file, allow_hosts.
    #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

pub(crate) async fn run(
    store: Option<&str>,
    args: &ServeArgs,
    key_in_spans: KeyInSpans,
) -> anyhow::Result<()> {
    let settings = resolve(store, args)?;
    if settings.upstream.points_at(settings.listen).await {
        anyhow::bail!(
            "--upstream {} is the gateway's own listener ({}, --listen): every request would be forwarded back to the gateway without end; give --upstream the address of the service behind the gateway",
            settings.upstream,
            settings.listen
        );
    }
    // Every file is read before anything starts, so a bad one stops here.
    let gateway_config = settings
        .gateway()
        .context("cannot set up TLS towards the upstream")?;
    let tls = settings
        .tls
        .as_ref()
        .map(|tls| {
            tls.load()
                .context("cannot set up the TLS listener (--tls-cert, --tls-key)")
        })
        .transpose()?;
    let admin_token = settings
        .admin_token_file
        .as_deref()
        .map(AdminToken::read)
        .transpose()
        .context("--admin-token-file")?;
    // Before the store opens, so no count is lost.
    if settings.admin_listen.is_some() {
        idem_gateway::admin::metrics_recorder()?;
    }
    let idempotency = settings.idempotency().key_in_spans(key_in_spans);
    let mut layer = IdempotencyLayer::open(&settings.store, idempotency)
        .await
        .with_context(|| format!("cannot open the store at {} (--store)", settings.store))?;
    if let Some(path) = &settings.spool {
        let spool = Spool::open(path).context("cannot open the answer spool (--spool)")?;
        if spool.pending() > 0 {
            eprintln!(
                "idem serve: storing {} answers kept in the spool {} before serving",
                spool.pending(),
                path.display()
            );
        }
        layer = layer.with_spool(spool);
    }
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", settings.listen))?;
    let upkeep = Upkeep::start_with_console(
        layer.store(),
        settings.admin_listen,
        admin_token,
        settings.allow_hosts.clone(),
        settings.sweep_every,
    )
    .await?;

    let terminate = terminated();
    // Caught from here on, like SIGTERM: a SIGHUP sent as soon as the
    // listener is announced reloads the certificate instead of killing the
    // process.
    let hangup = if tls.is_some() {
        match signal(SignalKind::hangup()) {
            Ok(hangup) => Some(hangup),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP; the certificate is reloaded only when its files change");
                None
            }
        }
    } else {
        None
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "idem serve: listening on {}://{}, forwarding to {} (HTTP/1.1 and HTTP/2 in)",
        if tls.is_some() { "https" } else { "http" },
        listener.local_addr()?,
        settings.upstream
    )?;
    if !settings.grpc_unary.is_empty() {
        writeln!(
            out,
            "idem serve: keyed gRPC calls deduplicated on {}; {}; codes {}",
            settings.grpc_unary.join(", "),
            settings.grpc_probe.as_ref().map_or_else(
                || "no lookup: a call whose outcome is unknown is held for the lease".to_owned(),
                |probe| format!(
                    "the upstream's {probe} is asked at the first retry after an unknown outcome"
                )
            ),
            settings.on_grpc_status.as_deref().unwrap_or("standard"),
        )?;
    }
    if let Some(addr) = upkeep.admin_addr() {
        writeln!(
            out,
            "idem serve: admin on http://{addr} (/metrics, /healthz, the operator console at /)"
        )?;
    }
    writeln!(out, "idem serve: {settings}")?;
    writeln!(
        out,
        "idem serve: answers the store cannot take yet are kept {}; {}",
        settings.spool.as_ref().map_or_else(
            || "in memory only (--spool off)".to_owned(),
            |path| format!("in {}", path.display())
        ),
        settings.probe.as_ref().map_or_else(
            || "no probe: a key whose outcome is unknown is held for the lease".to_owned(),
            |probe| format!(
                "the upstream is asked '{probe}' at the first retry after an unknown outcome"
            )
        ),
    )?;
    out.flush()?;
    drop(out);

    let (stop, stopping) = watch::channel(false);
    tokio::spawn(async move {
        terminate.await;
        eprintln!("idem serve: shutting down; letting the requests in flight finish");
        stop.send(true).ok();
    });
    let gateway = Gateway::new(layer, gateway_config);
    let mut gateway = with_grpc(gateway, &settings)?;
    let mut reloading = Vec::new();
    if let Some((config, reloader)) = tls {
        gateway = gateway.with_tls(config);
        reloading.push(reloader.watch(CERT_CHECK_EVERY));
        if let Some(hangup) = hangup {
            reloading.push(tokio::spawn(reload_on_hangup(hangup, reloader)));
        }
    }
    let served = gateway::run(listener, gateway, stopped(stopping)).await;
    for task in reloading {
        task.abort();
    }
    upkeep.stop().await;
    served?;
    eprintln!("idem serve: stopped");
    Ok(())
}

/// `gateway` with the gRPC layer for the `--grpc-unary` methods, over the
/// gateway's store, with the HTTP side's lease, body limit, principal and
/// spool, and the `--grpc-probe` lookup asked within `--upstream-timeout`;
/// unchanged without methods.
fn with_grpc(
    gateway: Gateway<AnyStore>,
    settings: &GatewaySettings,
) -> anyhow::Result<Gateway<AnyStore>> {
    if settings.grpc_unary.is_empty() {
        return Ok(gateway);
    }
    let store = gateway.layer().store().clone();
    let spool = gateway.layer().spool().cloned();
    let config = GrpcIdempotencyConfig::default()
        .unary_methods(settings.grpc_unary.iter().cloned())
        .lease(settings.lease)
        .message_limit(settings.max_body);
    let config = match &settings.on_grpc_status {
        Some(policy) => config.on_codes(
            policy
                .parse::<GrpcStatusPolicy>()
                .context("invalid --on-grpc-status (or IDEM_ON_GRPC_STATUS, on_grpc_status)")?,
        ),
        None => config,
    };
    let config = if settings.principal_tls_subject {
        config.principal_metadata(gateway::TLS_SUBJECT_HEADER)
    } else {
        match &settings.principal_header {
            Some(header) => config.principal_metadata(header.as_str()),
            None => config.without_principal(),
        }
    };
    let mut layer = GrpcIdempotencyLayer::new(store, config);
    // One spool for both sides: the gateway stores what it keeps before
    // serving, whichever side kept it.
    if let Some(spool) = spool {
        layer = layer.with_spool(spool);
    }
    Ok(match &settings.grpc_probe {
        Some(probe) => gateway.with_grpc_probing(
            layer,
            probe.parse::<GrpcProbe>().context("--grpc-probe")?,
            settings.upstream_timeout,
        ),
        None => gateway.with_grpc(layer),
    })
}

/// How often the listener's certificate and key files are checked for a
/// change.
const CERT_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Reloads the listener's certificate on every SIGHUP.
async fn reload_on_hangup(mut hangup: Signal, reloader: CertReloader) {
    while hangup.recv().await.is_some() {
        reloader.reload_logged("SIGHUP");
    }
}

/// Completes once `stopping` says so.
async fn stopped(mut stopping: watch::Receiver<bool>) {
    // An error means the sender is gone, which only happens on the way out.
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// The gateway's settings from the flags (and their variables), the
/// `--config` file and the defaults.
fn resolve(store: Option<&str>, args: &ServeArgs) -> anyhow::Result<GatewaySettings> {
    let given = GivenSettings {
        upstream: args.upstream.clone(),
        listen: args.listen.clone(),
        store: store.map(str::to_owned),
        mode: args.mode.clone(),
        require_key: args.require_key,
        max_body: args.max_body.clone(),
        lease: args.lease.clone(),
        retention: args.retention.clone(),
        tombstones: args.tombstones.clone(),
        replay_cache: args.replay_cache.clone(),
        admin_listen: args.admin_listen.clone(),
        upstream_timeout: args.upstream_timeout.clone(),
        body_timeout: args.body_timeout.clone(),
        probe: args.probe.clone(),
        on_status: args.on_status.clone(),
        spool: args.spool.clone(),
        principal_header: args.principal_header.clone(),
        methods: args.methods.clone(),
        sweep_every: args.sweep_every.clone(),
        max_in_flight: args.max_in_flight.clone(),
        concurrent: args.concurrent.clone(),
        max_waiters: args.max_waiters.clone(),
        max_waiters_per_key: args.max_waiters_per_key.clone(),
        routes: args.routes.clone(),
        upstream_ca: args.upstream_ca.clone(),
        upstream_cert: args.upstream_cert.clone(),
        upstream_key: args.upstream_key.clone(),
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        tls_client_ca: args.tls_client_ca.clone(),
        admin_token_file: args.admin_token_file.clone(),
        allow_hosts: (!args.allow_hosts.is_empty()).then(|| args.allow_hosts.join(",")),
        grpc_unary: args.grpc_unary.clone(),
        grpc_probe: args.grpc_probe.clone(),
        on_grpc_status: args.on_grpc_status.clone(),
        fingerprint: args.fingerprint.clone(),
        fingerprint_ignore: args.fingerprint_ignore.clone(),
        fingerprint_header: (!args.fingerprint_header.is_empty())
            .then(|| args.fingerprint_header.join(",")),
    };
    let text = args
        .config
        .as_ref()
        .map(|path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the config file {}", path.display()))
        })
        .transpose()?;
    let file = args
        .config
        .as_deref()
        .zip(text.as_deref())
        .map(|(path, text)| SettingsFile::new(path, text));
    Ok(GatewaySettings::resolve(&given, file)?)
}
