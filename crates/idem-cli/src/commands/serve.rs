//! `idem serve`: the gateway. Resolves the settings, opens the store, binds
//! the listeners, announces them on stdout, and serves until SIGTERM or
//! Ctrl-C, then shuts down gracefully.

mod settings;

use std::io::Write;

use anyhow::Context;
use idem_http::IdempotencyLayer;
use idem_http::gateway::{self, Gateway};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::ServeArgs;
use idem_trace::KeyInSpans;
use settings::ServeSettings;

pub async fn run(
    store: Option<&str>,
    args: &ServeArgs,
    key_in_spans: KeyInSpans,
) -> anyhow::Result<()> {
    let settings = ServeSettings::resolve(store, args)?;
    // Before the store opens, so no count is lost.
    let metrics = match settings.admin_listen {
        Some(_) => Some(gateway::metrics_recorder()?),
        None => None,
    };
    let idempotency = settings.idempotency().key_in_spans(key_in_spans);
    let layer = IdempotencyLayer::open(&settings.store, idempotency)
        .await
        .with_context(|| format!("cannot open the store at {} (--store)", settings.store))?;
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", settings.listen))?;
    let admin = match settings.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--admin-listen)"))?,
        ),
        None => None,
    };

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "idem serve: listening on http://{}, forwarding to {}",
        listener.local_addr()?,
        settings.upstream
    )?;
    if let Some(admin) = &admin {
        let addr = admin.local_addr()?;
        writeln!(
            out,
            "idem serve: admin on http://{addr} (/metrics, /healthz)"
        )?;
    }
    writeln!(out, "idem serve: {settings}")?;
    out.flush()?;
    drop(out);

    let (stop, stopping) = watch::channel(false);
    tokio::spawn(async move {
        terminated().await;
        eprintln!("idem serve: shutting down; letting the requests in flight finish");
        stop.send(true).ok();
    });
    let admin = match (admin, metrics) {
        (Some(listener), Some(metrics)) => Some(tokio::spawn(gateway::serve_admin(
            listener,
            layer.clone(),
            metrics,
            stopped(stopping.clone()),
        ))),
        _ => None,
    };
    let gateway = Gateway::new(layer, settings.gateway());
    gateway::run(listener, gateway, stopped(stopping)).await?;
    if let Some(admin) = admin {
        admin.await.context("the admin listener failed")??;
    }
    eprintln!("idem serve: stopped");
    Ok(())
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the gateway gracefully");
            tokio::signal::ctrl_c().await.ok();
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Completes once `stopping` says so.
async fn stopped(mut stopping: watch::Receiver<bool>) {
    // An error means the sender is gone, which only happens on the way out.
    let _ = stopping.wait_for(|stop| *stop).await;
}
