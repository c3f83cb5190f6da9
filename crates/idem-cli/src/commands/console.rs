//! `idem console`: the operator console over the store, until SIGTERM or
//! Ctrl-C. Refuses to start on an address other hosts can reach without a
//! token file; answers only to loopback `Host` names and those of
//! `--allow-host`. Serves HTTPS with `--tls-cert` and `--tls-key`. With
//! `--audit-effects-query` it runs the live auditor too, shown on its
//! Auditor page.

use std::io::Write;

use anyhow::Context;
use idem::{AnyStore, StoreLocation};
use idem_check::audit::PassLimits;
use idem_console::auditor::AuditorOptions;
use idem_console::{Access, Console};
use idem_gateway::ListenerTls;
use idem_gateway::admin::{AdminToken, AllowedHosts};
use tokio::net::TcpListener;

use super::signals::terminated;
use crate::cli::{ConsoleArgs, ConsoleAuditorArgs};

/// Starts the auditor `args` ask for, if any.
async fn start_auditor(
    console: &Console,
    location: &StoreLocation,
    args: &ConsoleAuditorArgs,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(query) = &args.audit_effects_query else {
        return Ok(None);
    };
    let settings = super::audit::settings(
        "--audit-",
        &args.audit_scopes,
        args.audit_window.into(),
        args.audit_grace.into(),
    )?;
    let log = super::audit::open_log(location, query, &args.audit_cursor_column)
        .await
        .context("cannot read the effect log (--audit-effects-query, --audit-cursor-column)")?;
    let options = AuditorOptions {
        effects_query: query.clone(),
        cursor_column: args.audit_cursor_column.clone(),
        settings,
        limits: PassLimits {
            batch: args.audit_batch.max(1),
            pause: args.audit_pause.into(),
        },
        interval: args.audit_interval.into(),
        after: args.audit_after,
    };
    Ok(Some(console.start_auditor(log, options)))
}

/// How often the certificate and key files are checked for a change.
const CERT_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) async fn run(
    store: AnyStore,
    location: &StoreLocation,
    args: &ConsoleArgs,
) -> anyhow::Result<()> {
    let token = |path: &Option<std::path::PathBuf>, flag: &str| {
        path.as_deref()
            .map(AdminToken::read)
            .transpose()
            .with_context(|| flag.to_owned())
    };
    let access = Access::with_tokens(
        token(&args.token_file, "--token-file")?,
        token(&args.read_only_token_file, "--read-only-token-file")?,
    );
    access.check_listen(args.listen)?;
    let hosts =
        AllowedHosts::parse(args.allow_hosts.iter().map(String::as_str)).context("--allow-host")?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            ListenerTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: None,
            }
            .load()
            .context("cannot set up the TLS listener (--tls-cert, --tls-key)")?,
        ),
        _ => None,
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", args.listen))?;
    let console = Console::new(store, access.clone()).allow_hosts(hosts);
    let charts = console.start_charts(None, args.sample_every);
    let auditor = start_auditor(&console, location, &args.auditor).await?;
    let terminate = terminated();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "idem console: on {}://{}/ ({}); the API is described at /api/v1/openapi.json",
        if tls.is_some() { "https" } else { "http" },
        listener.local_addr()?,
        if access.needs_token() {
            "a token is required"
        } else {
            "open to this host only, no token"
        }
    )?;
    out.flush()?;
    drop(out);
    let served = match tls {
        Some((config, reloader)) => {
            let watching = reloader.watch(CERT_CHECK_EVERY);
            let served = idem_console::serve_tls(listener, console, config, terminate).await;
            watching.abort();
            served
        }
        None => idem_console::serve(listener, console, terminate).await,
    };
    charts.abort();
    if let Some(auditor) = auditor {
        auditor.abort();
    }
    served.context("the console stopped")?;
    eprintln!("idem console: stopped");
    Ok(())
}
