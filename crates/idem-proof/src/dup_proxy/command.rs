//! `idem dup-proxy`: a reverse proxy for staging that sends a share of the
//! requests twice and reports the routes that answer the copy as a new
//! request. Binds the listeners, announces them on stdout, serves until
//! the termination signal it is given, then prints the report.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem_gateway::admin::AdminToken;
use idem_gateway::{Upstream, parse_duration, parse_size};
use tokio::net::TcpListener;

use super::{CopyTiming, DupProxy, DupProxyConfig, EffectsUrl, Report, RouteVerdict, Share};

/// `idem dup-proxy`
#[derive(Debug, Args)]
pub struct DupProxyArgs {
    /// Where the proxy listens.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The service to forward to: http://HOST:PORT, optionally with a base path.
    #[arg(long, value_name = "URL")]
    pub upstream: Upstream,
    /// The share of requests sent twice: a number from 0 to 1, or a
    /// percentage such as 5%.
    #[arg(long, value_name = "SHARE", default_value = "0.05")]
    pub share: Share,
    /// Seed the choice of the requests sent twice, so a replay of the same
    /// traffic picks the same ones [default: random].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Send the copy this long after the original's answer (such as 200ms),
    /// instead of at the same time.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "reorder")]
    pub delay: Option<Duration>,
    /// Send the copy first, and the original once the copy's answer is in.
    #[arg(long)]
    pub reorder: bool,
    /// Write every exchange to FILE in the history format (JSON Lines).
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// A GET on the upstream answering its effect count (a JSON number or
    /// {"count": N}), read around each pair to count the copies' effects.
    #[arg(long, value_name = "URL")]
    pub effects_url: Option<EffectsUrl>,
    /// Serve /report (JSON), /metrics (Prometheus) and /healthz on this address.
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// Another Host name the admin listener answers to besides the loopback
    /// ones; a request naming any other is refused (421). Repeat the flag or
    /// separate names with commas [default: loopback names only].
    #[arg(
        long = "allow-host",
        env = "IDEM_ALLOW_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// A file holding the bearer token the admin listener requires
    /// (Authorization: Bearer TOKEN) on everything but /healthz; needed when
    /// --admin-listen is not a loopback address [default: none].
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Largest request body held to be sent twice; larger ones are streamed
    /// to the upstream once.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1MiB")]
    pub max_body: usize,
    /// How long to wait for each answer; past it the client gets 504.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub upstream_timeout: Duration,
}

impl DupProxyArgs {
    fn config(&self) -> DupProxyConfig {
        let timing = match (self.delay, self.reorder) {
            (Some(delay), _) => CopyTiming::AfterAnswer(delay),
            (None, true) => CopyTiming::Ahead,
            (None, false) => CopyTiming::Concurrent,
        };
        let mut config = DupProxyConfig::new(self.upstream.clone())
            .share(self.share)
            .timing(timing)
            .max_body(self.max_body)
            .upstream_timeout(self.upstream_timeout);
        if let Some(seed) = self.seed {
            config = config.seed(seed);
        }
        if let Some(url) = &self.effects_url {
            config = config.effects_url(url.clone());
        }
        if let Some(path) = &self.history {
            config = config.history(path);
        }
        config
    }
}

/// Runs `idem dup-proxy`: binds the listeners, announces them on stdout,
/// serves until `terminate` completes (SIGTERM or Ctrl-C for the command;
/// create it before calling, so a signal sent as soon as the announcement is
/// read stops the proxy gracefully), then prints the report.
pub async fn run(
    args: &DupProxyArgs,
    terminate: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Before the first request, so no count is lost.
    if args.admin_listen.is_some() {
        idem_gateway::admin::metrics_recorder()?;
    }
    let config = args.config();
    let proxy = DupProxy::new(config.clone()).context("--history")?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", args.listen))?;
    let token = args
        .admin_token_file
        .as_deref()
        .map(AdminToken::read)
        .transpose()
        .context("--admin-token-file")?;
    let admin = match args.admin_listen {
        Some(addr) => Some(
            idem_gateway::admin::start_admin_without_store(
                addr,
                proxy.report_routes(),
                token,
                idem_gateway::admin::AllowedHosts::parse(
                    args.allow_hosts.iter().map(String::as_str),
                )
                .context("--allow-host")?,
            )
            .await
            .context("--admin-listen")?,
        ),
        None => None,
    };

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "idem dup-proxy: listening on http://{}, forwarding to {}; sending {} of the requests twice, the copy {}",
        listener.local_addr()?,
        config.upstream(),
        config.duplicated_share(),
        config.copy_timing(),
    )?;
    if let Some(admin) = &admin {
        writeln!(
            out,
            "idem dup-proxy: admin on http://{} (/report, /metrics, /healthz)",
            admin.local_addr()
        )?;
    }
    if let Some(path) = &args.history {
        writeln!(out, "idem dup-proxy: history in {}", path.display())?;
    }
    out.flush()?;
    drop(out);

    let (stop, stopping) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        terminate.await;
        eprintln!(
            "idem dup-proxy: shutting down; letting the requests and copies in flight finish"
        );
        stop.send(()).ok();
    });
    let served = super::run(listener, proxy.clone(), async {
        stopping.await.ok();
    })
    .await;
    let report = proxy.report().await;
    if let Some(admin) = admin {
        admin.stop().await;
    }
    served?;
    print!("{}", render(&report));
    Ok(())
}

/// The report as a table, with a line on the effect count and on what a
/// verdict means.
fn render(report: &Report) -> String {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "route",
        "verdict",
        "requests",
        "duplicated",
        "same",
        "replayed",
        "refused",
        "different",
        "no answer",
        "too large",
        "extra effects",
        "example key",
    ]);
    for route in &report.routes {
        let verdict = match route.verdict {
            RouteVerdict::NotIdempotent => "NOT IDEMPOTENT",
            RouteVerdict::Idempotent => "idempotent",
            RouteVerdict::Untested => "untested",
        };
        table.add_row([
            route.route.clone(),
            verdict.to_owned(),
            route.requests.to_string(),
            route.duplicated.to_string(),
            route.same.to_string(),
            route.replayed.to_string(),
            route.refused.to_string(),
            route.different.to_string(),
            route.no_answer.to_string(),
            route.too_large.to_string(),
            route
                .extra_effects
                .map_or_else(|| "-".to_owned(), |extra| extra.to_string()),
            route.example_key.clone().unwrap_or_default(),
        ]);
    }
    let mut text = format!("idem dup-proxy: report\n{table}\n");
    if let Some(effects) = &report.effects {
        let count = |n: Option<u64>| n.map_or_else(|| "unread".to_owned(), |n| n.to_string());
        text.push_str(&format!(
            "effect count: {} at the start, {} now{}\n",
            count(effects.at_start),
            count(effects.now),
            if effects.per_pair {
                ""
            } else {
                " (copies sent concurrently: their effects are not told apart per pair)"
            }
        ));
    }
    if report
        .routes
        .iter()
        .any(|r| r.verdict == RouteVerdict::NotIdempotent)
    {
        text.push_str(
            "NOT IDEMPOTENT: a copy was answered as a new request (or caused extra effects); look the example key up in the upstream's logs\n",
        );
    }
    text
}
