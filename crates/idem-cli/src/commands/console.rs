//! `idem console`: the operator console over the store, until SIGTERM or
//! Ctrl-C. Refuses to start on an address other hosts can reach without a
//! token file; answers only to loopback `Host` names and those of
//! `--allow-host`. Serves HTTPS with `--tls-cert` and `--tls-key`. With
//! `--audit-effects-query` it runs the live auditor too, shown on its
//! Auditor page.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use idem::{AnyStore, StoreLocation};
use idem_check::audit::PassLimits;
use idem_console::auditor::AuditorOptions;
use idem_console::{Access, Console};
use idem_gateway::ListenerTls;
use idem_gateway::admin::{AdminToken, AllowedHosts};
use tokio::net::TcpListener;

use super::signals::terminated;

/// `idem console`
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    /// Where to serve the console. Any address but a loopback one needs
    /// --token-file.
    #[arg(long, default_value = "127.0.0.1:9300", value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// A file holding the operator token (read and act); callers send it as
    /// `Authorization: Bearer <token>`, browsers sign in with it once.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// A file holding a read-only token: its pages show no actions, and
    /// its actions are refused.
    #[arg(long, value_name = "FILE")]
    pub read_only_token_file: Option<std::path::PathBuf>,
    /// Another Host name the console answers to besides the loopback ones
    /// (localhost, *.localhost, 127.0.0.0/8, [::1]); a request naming any
    /// other is refused (421), so a web page cannot reach the console
    /// through DNS rebinding. Checked without a token always, with one when
    /// names are given. Repeat the flag or separate names with commas;
    /// *.example.com allows the names under example.com [default: loopback
    /// names only].
    #[arg(
        long = "allow-host",
        env = "IDEM_ALLOW_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); the
    /// sign-in cookies are then marked Secure [default: plain HTTP].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// How often the last hour's charts take a sample.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub sample_every: std::time::Duration,
    #[command(flatten)]
    pub auditor: ConsoleAuditorArgs,
}

/// The live auditor the console runs, shown on its Auditor page: the options
/// of `idem audit`, prefixed `--audit-`.
#[derive(Debug, Args)]
#[command(next_help_heading = "Auditor (the Auditor page)")]
pub(crate) struct ConsoleAuditorArgs {
    /// Run the auditor in the console over this effect log: a SQL query on
    /// the store's database, as `idem audit --effects-query` takes [default:
    /// no auditor].
    #[arg(long, value_name = "SQL", requires = "audit_scopes")]
    pub audit_effects_query: Option<String>,
    /// The integer column of the query that grows with every row.
    #[arg(long, value_name = "COLUMN", default_value = "id")]
    pub audit_cursor_column: String,
    /// A scope whose records are compared with the effects (repeat for several).
    #[arg(long = "audit-scope", value_name = "SCOPE")]
    pub audit_scopes: Vec<String>,
    /// Start after this cursor value instead of at the beginning of the log.
    #[arg(long, value_name = "CURSOR", allow_hyphen_values = true)]
    pub audit_after: Option<i64>,
    /// Rows per query (effects or records).
    #[arg(long, default_value_t = 1000)]
    pub audit_batch: usize,
    /// The wait between two queries of a pass.
    #[arg(long, value_name = "DURATION", default_value = "100ms")]
    pub audit_pause: humantime::Duration,
    /// The wait between two passes.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub audit_interval: humantime::Duration,
    /// How long after a record completed its effect may still be missing.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub audit_grace: humantime::Duration,
    /// The dedupe window: two effects of one key less than this apart are a
    /// double effect.
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub audit_window: humantime::Duration,
}

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

pub(crate) async fn run(
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
