//! `idem serve`: the gateway. Resolves the settings, opens the store, binds
//! the listeners, announces them on stdout, and serves until SIGTERM or
//! Ctrl-C, then shuts down gracefully.

use std::io::Write;

use anyhow::Context;
use idem_http::gateway::{self, Gateway};
use idem_http::{IdempotencyLayer, Spool};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::signals::terminated;
use super::upkeep::Upkeep;
use crate::cli::ServeArgs;
use idem_http::gateway::{GatewaySettings, GivenSettings, SettingsFile};
use idem_trace::KeyInSpans;

pub(super) async fn run(
    store: Option<&str>,
    args: &ServeArgs,
    key_in_spans: KeyInSpans,
) -> anyhow::Result<()> {
    let settings = resolve(store, args)?;
    // Before the store opens, so no count is lost.
    if settings.admin_listen.is_some() {
        idem_http::admin::metrics_recorder()?;
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
    let upkeep = Upkeep::start(layer.store(), settings.admin_listen, settings.sweep_every).await?;

    let terminate = terminated();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "idem serve: listening on http://{}, forwarding to {}",
        listener.local_addr()?,
        settings.upstream
    )?;
    if let Some(addr) = upkeep.admin_addr() {
        writeln!(
            out,
            "idem serve: admin on http://{addr} (/metrics, /healthz)"
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
            || "no probe before a takeover".to_owned(),
            |probe| format!("the upstream is asked '{probe}' before a takeover")
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
    let gateway = Gateway::new(layer, settings.gateway());
    let served = gateway::run(listener, gateway, stopped(stopping)).await;
    upkeep.stop().await;
    served?;
    eprintln!("idem serve: stopped");
    Ok(())
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
        admin_listen: args.admin_listen.clone(),
        upstream_timeout: args.upstream_timeout.clone(),
        probe: args.probe.clone(),
        spool: args.spool.clone(),
        principal_header: args.principal_header.clone(),
        methods: args.methods.clone(),
        sweep_every: args.sweep_every.clone(),
        max_in_flight: args.max_in_flight.clone(),
        routes: args.routes.clone(),
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
