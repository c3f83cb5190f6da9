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
    #[command(flatten)]
    pub settings: GivenSettings,
    /// A TOML file with the same settings: upstream, listen, store, mode,
    /// require_key, max_body, lease, retention, tombstones, replay_cache,
    /// admin_listen,
    /// upstream_timeout, body_timeout, probe, on_status, spool, principal_header, methods, sweep_every,
    /// max_in_flight, runtime, workers, concurrent, max_waiters, max_waiters_per_key, routes,
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
    let listener = match settings.runtime {
        // Each serving runtime binds a socket of its own beside this one.
        gateway::Runtime::PerCore => gateway::bind_per_core(settings.listen).await,
        _ => TcpListener::bind(settings.listen).await,
    }
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
        store: store.map(str::to_owned),
        ..args.settings.clone()
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
