//! What every long-running command runs beside its work: the admin listener
//! (`--admin-listen`: `/metrics` and `/healthz`) and the retention sweeper
//! (`--sweep-every`), so a dedupe table never grows past its window because
//! nobody set up a cron job.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use idem::{AnyStore, AttemptStore, DeadLetterStore, Sweeper, SweeperTask};
use idem_console::{Access, Console};
use idem_gateway::admin::{self, AdminServer, AdminToken, AllowedHosts};

/// The admin listener's flags, shared by `idem relay`, `idem forward` and
/// `idem audit` (`idem serve` has the same among its settings).
#[derive(Debug, Clone, Args)]
pub(crate) struct AdminArgs {
    /// Serve /metrics (Prometheus) and /healthz on this address [default: off].
    #[arg(long, env = "IDEM_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// A file holding the bearer token the admin listener requires
    /// (Authorization: Bearer TOKEN) on /metrics; needed when --admin-listen
    /// is not a loopback address [default: none].
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN_FILE",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// Another Host name the admin listener answers to besides the loopback
    /// ones (localhost, *.localhost, 127.0.0.0/8, [::1]); a request naming
    /// any other is refused (421). Repeat the flag or separate names with
    /// commas; *.example.com allows the names under example.com [default:
    /// loopback names only].
    #[arg(
        long = "allow-host",
        env = "IDEM_ALLOW_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
}

impl AdminArgs {
    /// The token file read and the `Host` names checked: what starting the
    /// listener needs besides its address.
    pub(crate) fn access(&self) -> anyhow::Result<(Option<AdminToken>, AllowedHosts)> {
        let token = self
            .admin_token_file
            .as_deref()
            .map(AdminToken::read)
            .transpose()
            .context("--admin-token-file")?;
        let hosts = AllowedHosts::parse(self.allow_hosts.iter().map(String::as_str))
            .context("--allow-host")?;
        Ok((token, hosts))
    }
}

/// The flags `idem relay` and `idem forward` share: the admin listener and
/// the sweeper.
#[derive(Debug, Clone, Args)]
pub(crate) struct UpkeepArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// How often expired idempotency records are swept, ±50 % jitter, such as
    /// 60s or 10m; `off` when a cron job runs `idem gc` instead.
    #[arg(
        long,
        env = "IDEM_SWEEP_EVERY",
        value_name = "DURATION",
        default_value = "60s"
    )]
    pub sweep_every: SweepEvery,
}

/// `--sweep-every`: a duration, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SweepEvery(pub Option<Duration>);

impl FromStr for SweepEvery {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        match humantime::parse_duration(text.trim()) {
            Ok(every) if !every.is_zero() => Ok(Self(Some(every))),
            _ => Err(format!(
                "{text:?} is not a sweep interval; write a duration such as 60s or 10m, or off"
            )),
        }
    }
}

/// How often a consumer process refreshes the dead-letter gauges.
const DEAD_LETTER_GAUGES_EVERY: Duration = Duration::from_secs(30);

/// The admin listener, the sweeper and the gauge refresher of one process,
/// stopped together.
pub(super) struct Upkeep {
    admin: Option<AdminServer>,
    charts: Option<tokio::task::JoinHandle<()>>,
    sweeper: Option<SweeperTask>,
    gauges: Option<tokio::task::JoinHandle<()>>,
}

impl Upkeep {
    /// Starts what `args` ask for.
    pub(super) async fn start(store: &AnyStore, args: &UpkeepArgs) -> anyhow::Result<Self> {
        let (token, hosts) = args.admin.access()?;
        Self::start_with_token(
            store,
            args.admin.admin_listen,
            token,
            hosts,
            args.sweep_every.0,
        )
        .await
    }

    /// Starts what is asked for.
    pub(super) async fn start_with_token(
        store: &AnyStore,
        admin_listen: Option<SocketAddr>,
        token: Option<AdminToken>,
        hosts: AllowedHosts,
        sweep_every: Option<Duration>,
    ) -> anyhow::Result<Self> {
        Self::start_admin(store, admin_listen, token, hosts, sweep_every, false).await
    }

    /// [`start_with_token`](Self::start_with_token), with the operator
    /// console on the admin listener beside `/metrics`: its pages and API
    /// take the admin token as the operator token (none on loopback).
    pub(super) async fn start_with_console(
        store: &AnyStore,
        admin_listen: Option<SocketAddr>,
        token: Option<AdminToken>,
        hosts: AllowedHosts,
        sweep_every: Option<Duration>,
    ) -> anyhow::Result<Self> {
        Self::start_admin(store, admin_listen, token, hosts, sweep_every, true).await
    }

    async fn start_admin(
        store: &AnyStore,
        admin_listen: Option<SocketAddr>,
        token: Option<AdminToken>,
        hosts: AllowedHosts,
        sweep_every: Option<Duration>,
        with_console: bool,
    ) -> anyhow::Result<Self> {
        let (admin, charts) = match admin_listen {
            Some(addr) if with_console => {
                let console = Console::new(store.clone(), Access::with_tokens(token.clone(), None))
                    .allow_hosts(hosts.clone());
                let charts = console
                    .start_charts(Some(admin::metrics_recorder()?), idem_console::SAMPLE_EVERY);
                let server = admin::start_admin_with_hosts(
                    addr,
                    store.clone(),
                    token,
                    console.router(),
                    hosts,
                )
                .await
                .context("--admin-listen")?;
                (Some(server), Some(charts))
            }
            Some(addr) => {
                let server = admin::start_admin_with_hosts(
                    addr,
                    store.clone(),
                    token,
                    Default::default(),
                    hosts,
                )
                .await
                .context("--admin-listen")?;
                (Some(server), None)
            }
            None => (None, None),
        };
        idem::sweeper::publish_retention(idem::RecordStore::settings(store).retention);
        let sweeper = sweep_every.map(|every| Sweeper::new(store.clone()).interval(every).spawn());
        Ok(Self {
            admin,
            charts,
            sweeper,
            gauges: None,
        })
    }

    /// Also refreshes `dead_letters` and `dead_letter_oldest_age_seconds`
    /// every 30 s, for a process that writes dead letters but runs no relay
    /// (whose upkeep publishes them otherwise). Only with an admin listener:
    /// without one nothing would read them.
    pub(super) fn with_dead_letter_gauges(mut self, store: &AnyStore) -> Self {
        if self.admin.is_some() {
            let store = store.clone();
            self.gauges = Some(tokio::spawn(async move {
                loop {
                    match store.dead_letter_stats().await {
                        Ok(stats) => idem_broker::dead_letter::observe_stats(&stats, store.now()),
                        Err(error) => {
                            tracing::warn!(%error, "could not read the dead-letter gauges");
                        }
                    }
                    tokio::time::sleep(DEAD_LETTER_GAUGES_EVERY).await;
                }
            }));
        }
        self
    }

    /// The admin listener's address, if there is one.
    pub(super) fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::local_addr)
    }

    /// Says where the admin listener is, on stderr.
    pub(super) fn announce(&self, command: &str) {
        if let Some(addr) = self.admin_addr() {
            eprintln!("{command}: admin on http://{addr} (/metrics, /healthz)");
        }
    }

    /// Stops the sweeper between two batches and the admin listener.
    pub(super) async fn stop(self) {
        if let Some(charts) = self.charts {
            charts.abort();
        }
        if let Some(gauges) = self.gauges {
            gauges.abort();
        }
        if let Some(sweeper) = self.sweeper {
            sweeper.stop().await;
        }
        if let Some(admin) = self.admin {
            admin.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_every_takes_a_duration_or_off() {
        assert_eq!(
            "90s".parse::<SweepEvery>().unwrap(),
            SweepEvery(Some(Duration::from_secs(90)))
        );
        assert_eq!("OFF".parse::<SweepEvery>().unwrap(), SweepEvery(None));
        for bad in ["0s", "soon", ""] {
            let error = bad.parse::<SweepEvery>().unwrap_err();
            assert!(error.contains("60s or 10m, or off"), "{bad}: {error}");
        }
    }
}
