//! `idem torture`: a fault campaign over the real local stack. Each trial
//! starts an upstream that applies every request it receives, `idem serve`
//! in front of it as a child process, and clients that retry under one key
//! per operation while writing the history; mid-load it kills the gateway,
//! fires a crash point or cuts the gateway off its database through a fault
//! proxy, or fails over a primary of its Redis Cluster; then it reads the
//! upstream's effects and runs the checker.
//!
//! The upstream never dedupes, so every extra effect is one the gateway let
//! through. The leased gateway lets one through in exactly one case — it
//! forwarded a request and no answer was stored for it (the upstream timed
//! out, the gateway died, or the claim was taken over before the store took
//! the answer) — and its client then saw an unknown outcome. Extra effects
//! that each follow such an attempt are that known cost and are counted
//! apart; any other is a violation. In the probing scenarios the gateway asks
//! the upstream (`--probe`) before such a retry, and the cost must be zero.
//!
//! The relay scenarios check the outbox path the same way: an application
//! enqueues a message per request in its record's transaction, `idem relay`
//! (killed, or crashed after a publish) publishes it to a service that
//! dedupes — directly, or through RabbitMQ and `idem forward` — and every
//! acknowledged request must be applied there exactly once.
//!
//! # Layout
//!
//! - `scenario`: the catalogue of scenarios and one driver per family
//!   (gateway, relay, the whole chain);
//! - `findings`: what a trial found (its faults, counts and violations);
//! - `verdict`: a trial's history and effects judged: the known cost apart,
//!   violations counted;
//! - `client`: the clients that retry under one key and write the history;
//! - `upstream`: the service behind the gateway; `relay_services`: the
//!   application that fills the outbox and the downstream the relay
//!   delivers to;
//! - `gateway_process`, `dup_proxy_process`, `child`: `idem serve`, `idem
//!   dup-proxy`, and `idem relay` and `idem forward`, as child processes of
//!   the current binary;
//! - `redis_failover`: a trial's own Redis Cluster and the failover of one
//!   of its primaries;
//! - `pgserver`: a PostgreSQL server of the campaign's own; `broker`: the
//!   RabbitMQ queue and the JetStream stream of a trial;
//! - `report`, `plot`: the table, the JSON, the HTML report and its plots;
//! - [`run`] (here): the campaign: its databases, its trials, its report.

mod broker;
mod child;
mod client;
mod dup_proxy_process;
mod findings;
mod gateway_process;
mod pgserver;
mod plot;
mod redis_failover;
mod relay_services;
mod report;
mod scenario;
mod upstream;
mod verdict;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use idem::sqlx::{self, AssertSqlSafe, Connection};
use rand::Rng;

use report::Summary;
pub use scenario::Scenario;
use scenario::Setting;

/// `idem torture`
#[derive(Debug, Args)]
pub struct TortureArgs {
    /// Run only this scenario; repeat it for several [default: all of them].
    #[arg(long, value_enum)]
    pub scenario: Vec<Scenario>,
    /// Trials per scenario.
    #[arg(long, default_value_t = 100)]
    pub trials: usize,
    /// Operations per trial.
    #[arg(long, default_value_t = 100)]
    pub ops: u64,
    /// The PostgreSQL server, on loopback, for the PostgreSQL scenarios;
    /// user `postgres` without a password. Each campaign creates a database
    /// of its own and drops it at the end.
    #[arg(long, default_value = "127.0.0.1:5432", value_name = "ADDR")]
    pub postgres: SocketAddr,
    /// The RabbitMQ broker, on loopback, for the RabbitMQ scenario: each
    /// trial declares a queue of its own and deletes it at the end.
    #[arg(
        long,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        value_name = "URL"
    )]
    pub amqp: String,
    /// The NATS server with JetStream, on loopback, for the NATS scenarios:
    /// each trial creates a stream of its own and deletes it at the end.
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_name = "URL")]
    pub nats: String,
    /// Write an HTML report with plots, and each trial's history, here.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Milliseconds since the Unix epoch, the history's clock.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// Runs `idem torture`: every trial of the scenarios asked for, the table
/// (or JSON) on stdout, the HTML report when asked; an error when a trial
/// found a violation.
pub async fn run(args: &TortureArgs) -> anyhow::Result<()> {
    if !args.postgres.ip().is_loopback() {
        bail!(
            "--postgres must be a loopback address, not {}",
            args.postgres
        );
    }
    for (flag, url) in [("--amqp", &args.amqp), ("--nats", &args.nats)] {
        if !on_loopback(url) {
            bail!(
                "{flag} must name a loopback host (127.0.0.1, localhost or [::1]), not {}",
                idem::redact_url(url)
            );
        }
    }
    if args.trials == 0 || args.ops == 0 {
        bail!("--trials and --ops must be at least 1");
    }
    let scenarios = if args.scenario.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenario.clone()
    };
    let work = tempfile::tempdir().context("cannot create a working directory")?;
    let run_id = format!("{:08x}", rand::rng().random::<u32>());
    let database = format!("idem_torture_{run_id}");
    // Stopped and removed when dropped, on every way out of this function.
    let private = if scenarios.iter().any(|s| s.needs_private_postgres()) {
        let server = pgserver::PrivatePostgres::start()
            .context("cannot start a PostgreSQL server for the restart scenario")?;
        let db = Database::create(server.addr(), &database).await?;
        Some((server, db))
    } else {
        None
    };

    let postgres = if scenarios.iter().any(|s| s.needs_postgres()) {
        Some(Database::create(args.postgres, &database).await?)
    } else {
        None
    };
    let mut summaries = Vec::new();
    let campaign = async {
        for &scenario in &scenarios {
            let mut summary = Summary::new(scenario.name());
            for index in 1..=args.trials {
                let dir = work
                    .path()
                    .join(scenario.name())
                    .join(format!("trial-{index}"));
                let setting = Setting {
                    scenario,
                    index,
                    ops: args.ops,
                    dir: &dir,
                    postgres: postgres
                        .as_ref()
                        .map(|db| (db.name.as_str(), args.postgres)),
                    private: private
                        .as_ref()
                        .map(|(server, db)| (db.name.as_str(), server)),
                    run_id: &run_id,
                    amqp: &args.amqp,
                    nats: &args.nats,
                };
                let result = scenario::trial(&setting)
                    .await
                    .with_context(|| format!("{} trial {index}", scenario.name()))?;
                for violation in &result.violations {
                    eprintln!("{} trial {index}: {violation}", scenario.name());
                }
                for note in &result.notes {
                    eprintln!("{} trial {index}: note: {note}", scenario.name());
                }
                if let Some(report) = &args.report {
                    let to = report.join(scenario.name());
                    std::fs::create_dir_all(&to)?;
                    std::fs::copy(&result.history, to.join(format!("trial-{index}.jsonl")))?;
                    if !result.violations.is_empty() {
                        keep_logs(&dir, &to.join(format!("trial-{index}")))?;
                    }
                }
                summary.add(result);
                // Trial directories are not needed once checked.
                let _ = std::fs::remove_dir_all(&dir);
            }
            summaries.push(summary);
        }
        anyhow::Ok(())
    };
    // On Ctrl-C or SIGTERM the trial in progress is dropped (its children
    // are killed with it) and the database and server below removed.
    let outcome = tokio::select! {
        outcome = campaign => outcome,
        () = interrupted() => Err(anyhow::anyhow!("interrupted")),
    };
    drop(private);
    if let Some(db) = postgres {
        db.drop().await;
    }
    outcome?;

    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::json(&summaries))?
        );
    } else {
        println!("{}", report::table(&summaries));
    }
    if let Some(dir) = &args.report {
        let page = report::html(&summaries, args.ops);
        for (name, svg) in &page.plots {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, svg)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        let path = dir.join("index.html");
        std::fs::write(&path, &page.html)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    let violations: usize = summaries.iter().map(|s| s.violations).sum();
    if violations > 0 {
        bail!("{violations} violations found");
    }
    Ok(())
}

/// Copies a trial's logs (`*.log`) and the dup-proxy's history to `to`,
/// for a trial that found a violation.
fn keep_logs(trial: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(trial)?.flatten() {
        let name = entry.file_name();
        let path = entry.path();
        let kept = path.extension().is_some_and(|ext| ext == "log") || name == "dup-proxy.jsonl";
        if kept {
            std::fs::copy(&path, to.join(&name))?;
        }
    }
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
async fn interrupted() {
    let Ok(mut terminate) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

/// Whether a URL's host is the loopback interface.
fn on_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The campaign's own PostgreSQL database.
struct Database {
    server: SocketAddr,
    name: String,
}

impl Database {
    async fn create(server: SocketAddr, name: &str) -> anyhow::Result<Self> {
        let mut admin =
            sqlx::PgConnection::connect(&format!("postgres://postgres@{server}/postgres"))
                .await
                .with_context(|| format!("cannot reach PostgreSQL at {server} (--postgres)"))?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        Ok(Self {
            server,
            name: name.to_owned(),
        })
    }

    async fn drop(self) {
        let dropped = async {
            let url = format!("postgres://postgres@{}/postgres", self.server);
            let mut admin = sqlx::PgConnection::connect(&url).await?;
            // Gateways killed mid-trial may leave sessions behind for a moment.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut admin)
                .await?;
            anyhow::Ok(())
        };
        if let Err(error) = dropped.await {
            eprintln!("warning: cannot drop the database {}: {error:#}", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_brokers() {
        assert!(super::on_loopback("amqp://guest:guest@127.0.0.1:5672/%2f"));
        assert!(super::on_loopback("amqp://localhost/%2f"));
        assert!(super::on_loopback("amqp://[::1]:5672/%2f"));
        assert!(!super::on_loopback(
            "amqp://guest:guest@rabbit.example:5672/%2f"
        ));
        assert!(!super::on_loopback("amqp://10.0.0.1/%2f"));
    }
}
