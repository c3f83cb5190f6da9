//! The scenarios and one trial of each: the upstream, the gateway on its
//! store, the clients, the fault injected mid-load, and the check at the end.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::ValueEnum;
use idem::SqliteStore;
use idem_check::history::Event;
use idem_check::{Report, ViolationKind};
use rand::Rng;

use super::broker::{self, Queue, Stream};
use super::child::{Exit, Process};
use super::client::{Load, Sample};
use super::dupproxy::{DupProxy, Timing};
use super::gateway::Gateway;
use super::now_ms;
use super::pgserver::{PrivatePostgres, Shutdown};
use super::relay;
use super::upstream::{EFFECTS_QUERY, PROBE, Upstream};
use idem_testkit::faultproxy::{FaultProxy, Mode};

mod chain;

/// Concurrent clients per trial.
const CLIENTS: usize = 4;

/// How long a relay trial waits, once its clients are done and its broker
/// healed, for every acknowledged key to reach the downstream.
const DRAIN_WAIT: Duration = Duration::from_secs(20);

/// A fault campaign's scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The gateway on the embedded store, killed (SIGKILL) or crashed at a
    /// crash point mid-load, restarted on the same file.
    #[value(name = "gateway-sqlite-kill")]
    SqliteKill,
    /// The same, the gateway's store on PostgreSQL.
    #[value(name = "gateway-postgres-kill")]
    PostgresKill,
    /// The embedded-store kill scenario with `idem serve --probe`: before a
    /// retry takes over after an unknown outcome, the gateway asks the
    /// upstream, which answers from its effects table. No repeat is expected.
    #[value(name = "gateway-sqlite-kill-probe")]
    SqliteKillProbe,
    /// The same, the gateway's store on PostgreSQL.
    #[value(name = "gateway-postgres-kill-probe")]
    PostgresKillProbe,
    /// The gateway's PostgreSQL connection through the fault proxy: dropped,
    /// blackholed or delayed mid-load, then healed.
    #[value(name = "gateway-postgres-partition")]
    PostgresPartition,
    /// The gateway's store on a PostgreSQL server of the campaign's own,
    /// restarted mid-load (`pg_ctl restart -m fast` or `-m immediate`).
    #[value(name = "gateway-postgres-restart")]
    PostgresRestart,
    /// The embedded-store kill scenario with `idem dup-proxy` between the
    /// clients and the gateway, sending half the requests twice.
    #[value(name = "gateway-dup-proxy-kill")]
    DupProxyKill,
    /// `idem relay`, publishing an outbox to a webhook that dedupes, killed
    /// (SIGKILL) or crashed after a publish mid-load, restarted.
    #[value(name = "relay-kill")]
    RelayKill,
    /// The same, the relay publishing to a RabbitMQ queue that `idem forward`
    /// delivers to the webhook.
    #[value(name = "relay-rabbitmq-kill")]
    RelayRabbitmqKill,
    /// The RabbitMQ stack with the relay's and `idem forward`'s broker
    /// connections through the fault proxy, dropped or blackholed mid-load.
    #[value(name = "relay-rabbitmq-partition")]
    RelayRabbitmqPartition,
    /// The relay killed or crashed, publishing to a JetStream stream that
    /// `idem forward` delivers to the webhook.
    #[value(name = "relay-nats-kill")]
    RelayNatsKill,
    /// The JetStream stack with the broker connections through the fault
    /// proxy, dropped or blackholed mid-load.
    #[value(name = "relay-nats-partition")]
    RelayNatsPartition,
    /// The whole chain on PostgreSQL: clients → `idem dup-proxy` → `idem
    /// serve` → an application writing an outbox row in its own PostgreSQL
    /// transaction → `idem relay` → RabbitMQ → `idem forward` → a downstream
    /// that dedupes, with a fault at every hop in each trial.
    #[value(name = "chain-postgres")]
    ChainPostgres,
}

/// What carries the relay's messages to the downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    /// The relay posts to the downstream itself.
    Webhook,
    /// A RabbitMQ queue, and `idem forward`.
    Rabbitmq,
    /// A JetStream stream, and `idem forward`.
    Nats,
}

impl Scenario {
    /// Every scenario, in the order a campaign runs them.
    pub const ALL: [Self; 13] = [
        Self::SqliteKill,
        Self::PostgresKill,
        Self::SqliteKillProbe,
        Self::PostgresKillProbe,
        Self::PostgresPartition,
        Self::PostgresRestart,
        Self::DupProxyKill,
        Self::RelayKill,
        Self::RelayRabbitmqKill,
        Self::RelayRabbitmqPartition,
        Self::RelayNatsKill,
        Self::RelayNatsPartition,
        Self::ChainPostgres,
    ];

    /// The scenario's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::SqliteKill => "gateway-sqlite-kill",
            Self::PostgresKill => "gateway-postgres-kill",
            Self::SqliteKillProbe => "gateway-sqlite-kill-probe",
            Self::PostgresKillProbe => "gateway-postgres-kill-probe",
            Self::PostgresPartition => "gateway-postgres-partition",
            Self::PostgresRestart => "gateway-postgres-restart",
            Self::DupProxyKill => "gateway-dup-proxy-kill",
            Self::RelayKill => "relay-kill",
            Self::RelayRabbitmqKill => "relay-rabbitmq-kill",
            Self::RelayRabbitmqPartition => "relay-rabbitmq-partition",
            Self::RelayNatsKill => "relay-nats-kill",
            Self::RelayNatsPartition => "relay-nats-partition",
            Self::ChainPostgres => "chain-postgres",
        }
    }

    /// Whether the scenario needs the shared PostgreSQL server.
    pub fn needs_postgres(self) -> bool {
        matches!(
            self,
            Self::PostgresKill
                | Self::PostgresKillProbe
                | Self::PostgresPartition
                | Self::ChainPostgres
        )
    }

    /// Whether the gateway asks the upstream (`--probe`) before a takeover.
    fn probes(self) -> bool {
        matches!(self, Self::SqliteKillProbe | Self::PostgresKillProbe)
    }

    /// Whether the scenario starts a PostgreSQL server of its own.
    pub fn needs_private_postgres(self) -> bool {
        self == Self::PostgresRestart
    }

    /// Whether the scenario kills the process under test (or fires a crash
    /// point in it); the others cut or restart what it depends on.
    fn kills(self) -> bool {
        matches!(
            self,
            Self::SqliteKill
                | Self::PostgresKill
                | Self::SqliteKillProbe
                | Self::PostgresKillProbe
                | Self::DupProxyKill
                | Self::RelayKill
                | Self::RelayRabbitmqKill
                | Self::RelayNatsKill
        )
    }

    fn carrier(self) -> Option<Carrier> {
        match self {
            Self::RelayKill => Some(Carrier::Webhook),
            Self::RelayRabbitmqKill | Self::RelayRabbitmqPartition => Some(Carrier::Rabbitmq),
            Self::RelayNatsKill | Self::RelayNatsPartition => Some(Carrier::Nats),
            _ => None,
        }
    }
}

/// A fault, as injected.
#[derive(Debug, Clone)]
pub struct Fault {
    /// What: `sigkill`, `crash apply.after-claim`, `drop`, …
    pub what: String,
    /// When it started, ms since the Unix epoch.
    pub at_ms: i64,
    /// When it ended (the process was back, the proxy passed again).
    pub until_ms: i64,
}

/// Where a trial runs.
pub struct Setting<'a> {
    /// The scenario.
    pub scenario: Scenario,
    /// The trial's number, from 1.
    pub index: usize,
    /// Operations per trial.
    pub ops: u64,
    /// A directory of its own.
    pub dir: &'a Path,
    /// The PostgreSQL database for the gateway's store, with its server's
    /// address, for the PostgreSQL scenarios on the shared server.
    pub postgres: Option<(&'a str, SocketAddr)>,
    /// The database on the campaign's own server, and that server, for the
    /// restart scenario.
    pub private: Option<(&'a str, &'a PrivatePostgres)>,
    /// A prefix for the keys, unique to the campaign.
    pub run_id: &'a str,
    /// The RabbitMQ broker, with its vhost, for the RabbitMQ scenarios.
    pub amqp: &'a str,
    /// The NATS server, for the JetStream scenarios.
    pub nats: &'a str,
}

/// What one trial found.
#[derive(Debug)]
pub struct TrialResult {
    /// The trial's number.
    pub index: usize,
    /// The faults injected (a crash point counts once it fired).
    pub faults: Vec<Fault>,
    /// The checker's report on the history and the upstream's effects.
    pub report: Report,
    /// Keys applied more than once where each extra effect follows an
    /// attempt of the key whose outcome was unknown: the leased gateway's
    /// at-least-once cost, counted in effects beyond the first.
    pub expected_repeats: usize,
    /// Keys applied again after the gateway answered but could not store
    /// the answer (its store failed at that moment), each counted against
    /// one such failure the gateway logged: the same at-least-once cost,
    /// although the client was told `ok`.
    pub unstored_repeats: usize,
    /// Extra effects not explained either way: violations.
    pub double_effects: usize,
    /// Copies the downstream received and answered from its records (the
    /// relay scenario's redeliveries).
    pub suppressed_downstream: usize,
    /// Acknowledged operations with no effect.
    pub lost_acked: usize,
    /// Violations: the checker's, less the explained repeats.
    pub violations: Vec<String>,
    /// Processes that ended by themselves, not killed and not at a crash
    /// point (each restarted), by name: how a process took a fault in what
    /// it depends on.
    pub exits: Vec<&'static str>,
    /// What the trial saw besides its violations, printed with them: how
    /// far the outbox got, for a relay trial that lost acknowledged keys.
    pub notes: Vec<String>,
    /// Requests `idem dup-proxy` sent twice, in the scenario that has it.
    pub proxy_copies: Option<u64>,
    /// Every attempt, for the plots.
    pub samples: Vec<Sample>,
    /// The history file.
    pub history: PathBuf,
}

/// Runs one trial.
pub async fn trial(setting: &Setting<'_>) -> anyhow::Result<TrialResult> {
    match setting.scenario.carrier() {
        _ if setting.scenario == Scenario::ChainPostgres => chain::trial(setting).await,
        Some(carrier) => relay_trial(setting, carrier).await,
        None => gateway_trial(setting).await,
    }
}

/// Where the relay publishes and what `idem forward` consumes, for one
/// trial, with what to delete at its end.
struct Route {
    to: String,
    forward: Option<Process>,
    queue: Option<Queue>,
    stream: Option<Stream>,
}

impl Route {
    async fn open(
        setting: &Setting<'_>,
        carrier: Carrier,
        proxy: Option<&FaultProxy>,
        deliver: &str,
        forward_store: &str,
    ) -> anyhow::Result<Self> {
        let Setting {
            index,
            dir,
            run_id,
            amqp,
            nats,
            ..
        } = *setting;
        let name = format!("idem_torture_{run_id}_t{index}");
        let reach =
            |url: &str| proxy.map_or_else(|| url.to_owned(), |p| broker::through(url, p.addr()));
        let forward =
            |from: &str| Process::forward(from, deliver, forward_store, &dir.join("forward.log"));
        let mut route = Self {
            to: deliver.to_owned(),
            forward: None,
            queue: None,
            stream: None,
        };
        match carrier {
            Carrier::Webhook => {}
            Carrier::Rabbitmq => {
                let queue = Queue::declare(amqp, name).await?;
                let via = reach(amqp);
                let from = format!("{}/{}", via.trim_end_matches("/%2f"), queue.name);
                route.to = format!("{via}?queue={}", queue.name);
                route.forward = Some(forward(&from));
                route.queue = Some(queue);
            }
            Carrier::Nats => {
                let stream = Stream::create(nats, name).await?;
                let via = reach(nats);
                let via = via.trim_end_matches('/');
                route.to = format!("{via}/{}", stream.subject);
                route.forward = Some(forward(&format!("{via}/{}/forward", stream.name)));
                route.stream = Some(stream);
            }
        }
        if let Some(forward) = &mut route.forward {
            forward.start(None)?;
        }
        Ok(route)
    }

    async fn close(mut self) {
        if let Some(forward) = &mut self.forward {
            forward.kill().await;
        }
        if let Some(queue) = self.queue {
            queue.delete().await;
        }
        if let Some(stream) = self.stream {
            stream.delete().await;
        }
    }
}

/// A trial of a relay scenario.
async fn relay_trial(setting: &Setting<'_>, carrier: Carrier) -> anyhow::Result<TrialResult> {
    let Setting {
        scenario,
        index,
        ops,
        dir,
        run_id,
        amqp,
        nats,
        ..
    } = *setting;
    std::fs::create_dir_all(dir)?;
    let app_path = dir.join("app.db");
    let app_store = SqliteStore::open(&app_path).await?;
    let down_path = dir.join("downstream.db");
    let down_store = SqliteStore::open(&down_path).await?;
    let deliveries = Arc::new(AtomicUsize::new(0));
    let down = relay::downstream(&down_store, Arc::clone(&deliveries)).await?;
    let app = relay::application(&app_store).await?;
    let proxy = match (scenario.kills(), carrier) {
        (false, Carrier::Rabbitmq) => Some(FaultProxy::start(broker::address(amqp)?).await?),
        (false, Carrier::Nats) => Some(FaultProxy::start(broker::address(nats)?).await?),
        _ => None,
    };
    // Odd kill trials arm the crash point after a publish instead of a
    // SIGKILL. It is reached once per pass that published, and a short load
    // may be published in one pass: it fires on the first.
    let crash =
        (scenario.kills() && index % 2 == 1).then(|| format!("{}:#1", idem::crash::AFTER_PUBLISH));
    let deliver = format!("http://{}/deliver", down.addr);
    let forward_store = format!("sqlite://{}", dir.join("forward.db").display());
    let mut route = Route::open(setting, carrier, proxy.as_ref(), &deliver, &forward_store).await?;
    let app_store_url = format!("sqlite://{}", app_path.display());
    let mut relay = Process::relay(&app_store_url, &route.to, &dir.join("relay.log"));
    relay.start(crash.as_deref())?;

    let history_path = dir.join("history.jsonl");
    let history = std::fs::File::create(&history_path)?;
    let budget = Duration::from_secs(60) + Duration::from_millis(100 * ops);
    let started = Instant::now();
    let addr = Arc::new(std::sync::Mutex::new(app.addr));
    let load = Load::new(
        format!("{run_id}-{}-t{index}", scenario.name()),
        ops,
        addr,
        history,
        started + budget,
    );
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|n| tokio::spawn(Arc::clone(&load).client(format!("client-{n}"))))
        .collect();
    let fault_at = (ops as f64 * rand::rng().random_range(0.2..0.5)) as usize;
    let mut injected = false;
    let mut faults = Vec::new();
    let mut exits = Vec::new();
    let mut partition: Option<(Mode, Instant, i64)> = None;
    let mut drained_by: Option<Instant> = None;
    while started.elapsed() < budget + Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A forward that ended by itself is a finding; it is restarted as a
        // supervisor would, after a pause.
        if let Some(forward) = &mut route.forward
            && forward.exited().is_some()
        {
            exits.push(forward.name());
            tokio::time::sleep(Duration::from_millis(500)).await;
            forward.start(None)?;
        }
        let mut down_since = None;
        if let Some(exit) = relay.exited() {
            match (exit, &crash) {
                (Exit::Crashed, Some(_)) => {
                    down_since = Some((format!("crash {}", idem::crash::AFTER_PUBLISH), now_ms()));
                }
                _ => {
                    exits.push(relay.name());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    relay.start(None)?;
                    continue;
                }
            }
        } else if !injected && load.done.load(Ordering::SeqCst) >= fault_at {
            injected = true;
            match &proxy {
                Some(proxy) => {
                    let mode = if index % 2 == 0 {
                        Mode::Drop
                    } else {
                        Mode::Blackhole
                    };
                    let lasts = Duration::from_millis(rand::rng().random_range(500..3500));
                    proxy.set(mode);
                    partition = Some((mode, Instant::now() + lasts, now_ms()));
                }
                None if crash.is_none() => {
                    relay.kill().await;
                    down_since = Some(("sigkill".to_owned(), now_ms()));
                }
                // The crash point fires by itself.
                None => {}
            }
        }
        if let Some((what, at_ms)) = down_since {
            tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..300))).await;
            relay.start(None)?;
            faults.push(Fault {
                what,
                at_ms,
                until_ms: now_ms(),
            });
            continue;
        }
        if let (Some(proxy), Some((mode, until, at_ms))) = (&proxy, partition)
            && Instant::now() >= until
        {
            proxy.set(Mode::Pass);
            faults.push(Fault {
                what: mode.name().to_owned(),
                at_ms,
                until_ms: now_ms(),
            });
            partition = None;
        }
        // Once the clients are done and the broker heals, wait for the
        // outbox to drain and every acknowledged key to reach the downstream.
        if partition.is_none() && clients.iter().all(|client| client.is_finished()) {
            let deadline = *drained_by.get_or_insert_with(|| Instant::now() + DRAIN_WAIT);
            if Instant::now() > deadline {
                break;
            }
            if relay::pending(&app_store).await? == 0 {
                let acked = acked_keys(&history_path)?;
                let applied = idem_check::effects::query::sqlite(&down_path, relay::EFFECTS_QUERY)?;
                let applied: HashSet<String> = applied.into_iter().map(|e| e.key).collect();
                if acked.is_subset(&applied) {
                    break;
                }
            }
        }
    }
    if let (Some(proxy), Some((mode, _, at_ms))) = (&proxy, partition) {
        proxy.set(Mode::Pass);
        faults.push(Fault {
            what: mode.name().to_owned(),
            at_ms,
            until_ms: now_ms(),
        });
    }
    for client in &clients {
        client.abort();
    }
    relay.kill().await;
    let unpublished = relay::pending(&app_store).await?;
    let queued = match &route.queue {
        Some(queue) => queue.depth().await.ok(),
        None => None,
    };
    route.close().await;
    drop(proxy);

    let events =
        idem_check::history::read(std::io::BufReader::new(std::fs::File::open(&history_path)?))?;
    let effects = idem_check::effects::query::sqlite(&down_path, relay::EFFECTS_QUERY)?;
    let report = idem_check::check(&events, &effects);
    let mut result = judge(
        index,
        faults,
        report,
        &events,
        &effects,
        &Explanations::default(),
    );
    result.samples = load.samples();
    result.history = history_path;
    result.suppressed_downstream = deliveries
        .load(Ordering::SeqCst)
        .saturating_sub(effects.len());
    result.exits = exits;
    if result.lost_acked > 0 {
        let waited = drained_by.map_or(Duration::ZERO, |deadline| {
            Instant::now().saturating_duration_since(deadline - DRAIN_WAIT)
        });
        result.notes.push(format!(
            "{unpublished} outbox rows were still unpublished when the trial ended, {} ms after the clients were done and the broker healed (a row not yet published is late, not lost: its relay retries it with backoff)",
            waited.as_millis()
        ));
        if let Some((messages, consumers)) = queued {
            result.notes.push(format!(
                "{messages} messages were waiting in the queue, which had {consumers} consumers"
            ));
        }
    }
    Ok(result)
}

/// A trial of a gateway scenario.
async fn gateway_trial(setting: &Setting<'_>) -> anyhow::Result<TrialResult> {
    let Setting {
        scenario,
        index,
        ops,
        dir,
        postgres,
        private,
        run_id,
        ..
    } = *setting;
    std::fs::create_dir_all(dir)?;
    let upstream = Upstream::start(&dir.join("upstream.db")).await?;
    let proxy = match (scenario, postgres) {
        (Scenario::PostgresPartition, Some((_, server))) => Some(FaultProxy::start(server).await?),
        _ => None,
    };
    let store = match (scenario, postgres, private) {
        (Scenario::SqliteKill | Scenario::SqliteKillProbe | Scenario::DupProxyKill, _, _) => {
            format!("sqlite://{}", dir.join("gateway.db").display())
        }
        (Scenario::PostgresRestart, _, Some((database, server))) => {
            format!("postgres://postgres@{}/{database}", server.addr())
        }
        (
            Scenario::PostgresKill | Scenario::PostgresKillProbe | Scenario::PostgresPartition,
            Some((database, server)),
            _,
        ) => {
            let addr = proxy.as_ref().map_or(server, FaultProxy::addr);
            format!("postgres://postgres@{addr}/{database}")
        }
        _ => anyhow::bail!("{} needs PostgreSQL", scenario.name()),
    };
    // Three kill trials in four arm a crash point instead of a SIGKILL.
    let crash = match (scenario.kills(), index % 4) {
        (false, _) | (_, 0) => None,
        (true, variant) => {
            let point = [
                idem::crash::AFTER_CLAIM,
                idem::crash::INSIDE_EFFECT,
                idem::crash::BEFORE_ANSWER,
            ][variant - 1];
            let nth = rand::rng().random_range(2..=(ops / 3).max(2));
            Some((point, format!("{point}:#{nth}")))
        }
    };
    let log = dir.join("gateway.log");
    let mut gateway = Gateway::start(
        store,
        upstream.url(),
        &log,
        crash.as_ref().map(|c| c.1.as_str()),
        scenario.probes().then_some(PROBE),
    )
    .await?;
    // The dup-proxy's own history: which of its copies ended unknown.
    let copies_path = dir.join("dup-proxy.jsonl");
    let dup_proxy = if scenario == Scenario::DupProxyKill {
        let gateway_addr = *gateway.addr().lock().unwrap_or_else(|p| p.into_inner());
        let timing = Timing::of_trial(index);
        let log = dir.join("dup-proxy.log");
        Some(DupProxy::start(gateway_addr, timing, &log, &copies_path).await?)
    } else {
        None
    };
    let clients_reach = match &dup_proxy {
        Some(dup_proxy) => Arc::new(std::sync::Mutex::new(dup_proxy.addr())),
        None => gateway.addr(),
    };

    let history_path = dir.join("history.jsonl");
    let history = std::fs::File::create(&history_path)?;
    let budget = Duration::from_secs(60) + Duration::from_millis(100 * ops);
    let started = Instant::now();
    let load = Load::new(
        format!("{run_id}-{}-t{index}", scenario.name()),
        ops,
        clients_reach,
        history,
        started + budget,
    );
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|n| tokio::spawn(Arc::clone(&load).client(format!("client-{n}"))))
        .collect();

    // The fault: at a random point of the load.
    let mut faults = Vec::new();
    let fault_at = (ops as f64 * rand::rng().random_range(0.2..0.5)) as usize;
    let mut injected = false;
    let mut down_since: Option<(String, i64)> = None;
    let mut partition: Option<(Mode, Instant, i64)> = None;
    let finished = || clients.iter().all(|client| client.is_finished());
    while !finished() && started.elapsed() < budget + Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A gateway that ended (a crash point, a kill) is restarted unarmed.
        if let Some(exit) = gateway.exited() {
            let what = match (exit, &crash) {
                (Exit::Crashed, Some((point, _))) => format!("crash {point}"),
                _ => "exit".to_owned(),
            };
            down_since.get_or_insert((what, now_ms()));
        }
        if let Some((what, at_ms)) = down_since.take() {
            tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..300))).await;
            gateway
                .restart(None)
                .await
                .context("restarting the gateway")?;
            faults.push(Fault {
                what,
                at_ms,
                until_ms: now_ms(),
            });
            continue;
        }
        if let Some((mode, until, at_ms)) = partition {
            if Instant::now() >= until {
                if let Some(proxy) = &proxy {
                    proxy.set(Mode::Pass);
                }
                faults.push(Fault {
                    what: mode.name().to_owned(),
                    at_ms,
                    until_ms: now_ms(),
                });
                partition = None;
            }
            continue;
        }
        if injected || load.done.load(Ordering::SeqCst) < fault_at {
            continue;
        }
        injected = true;
        match (&proxy, &crash, private) {
            (Some(proxy), _, _) => {
                let mode = match index % 3 {
                    0 => Mode::Drop,
                    1 => Mode::Blackhole,
                    _ => Mode::Delay(Duration::from_millis(40)),
                };
                let lasts = Duration::from_millis(rand::rng().random_range(500..3500));
                proxy.set(mode);
                partition = Some((mode, Instant::now() + lasts, now_ms()));
            }
            (None, None, Some((_, server))) if scenario == Scenario::PostgresRestart => {
                let mode = if index % 2 == 0 {
                    Shutdown::Fast
                } else {
                    Shutdown::Immediate
                };
                let at_ms = now_ms();
                server
                    .restart(mode)
                    .await
                    .context("restarting the private PostgreSQL")?;
                faults.push(Fault {
                    what: format!("restart -m {}", mode.name()),
                    at_ms,
                    until_ms: now_ms(),
                });
            }
            (None, None, _) => {
                gateway.kill().await;
                down_since = Some(("sigkill".to_owned(), now_ms()));
            }
            // The crash point fires by itself.
            (None, Some(_), _) => {}
        }
    }
    if let (Some(proxy), Some((mode, _, at_ms))) = (&proxy, partition) {
        proxy.set(Mode::Pass);
        faults.push(Fault {
            what: mode.name().to_owned(),
            at_ms,
            until_ms: now_ms(),
        });
    }
    for client in &clients {
        client.abort();
    }
    let proxy_copies = match &dup_proxy {
        Some(dup_proxy) => Some(dup_proxy.duplicated().await?),
        None => None,
    };
    drop(dup_proxy);
    gateway.kill().await;
    drop(proxy);

    let events =
        idem_check::history::read(std::io::BufReader::new(std::fs::File::open(&history_path)?))?;
    let effects = idem_check::effects::query::sqlite(upstream.path(), EFFECTS_QUERY)?;
    let report = idem_check::check(&events, &effects);
    let mut explain = Explanations {
        unstored: super::gateway::unstored_answers(&log)?,
        ..Explanations::default()
    };
    if scenario == Scenario::DupProxyKill {
        let copies = std::fs::File::open(&copies_path)
            .with_context(|| format!("cannot read {}", copies_path.display()))?;
        let copies = idem_check::history::read(std::io::BufReader::new(copies))?;
        explain.copies_unknown = copies_unknown(&copies);
    }
    let mut result = judge(index, faults, report, &events, &effects, &explain);
    if scenario.probes() && result.expected_repeats > 0 {
        // The upstream said what it had applied: a repeat is not a cost here.
        result.violations.push(format!(
            "{} effects repeated after an unknown outcome although the gateway asked the upstream first",
            result.expected_repeats
        ));
    }
    result.samples = load.samples();
    result.history = history_path;
    result.proxy_copies = proxy_copies;
    Ok(result)
}

/// The keys of the operations answered `ok` in a history file.
fn acked_keys(history: &Path) -> anyhow::Result<HashSet<String>> {
    let events = idem_check::history::read(std::io::BufReader::new(std::fs::File::open(history)?))?;
    let mut key_of = HashMap::new();
    let mut acked = HashSet::new();
    for event in events {
        match event {
            Event::Invoke {
                op, key: Some(key), ..
            } => {
                key_of.insert(op, key);
            }
            Event::Ok { op, .. } => {
                if let Some(key) = key_of.get(&op) {
                    acked.insert(key.clone());
                }
            }
            _ => {}
        }
    }
    Ok(acked)
}

/// What, besides the clients' unknown outcomes, may explain an extra effect.
#[derive(Debug, Default)]
struct Explanations {
    /// Answers the gateway logged it could not store: each explains one.
    unstored: usize,
    /// Per key, the copies `idem dup-proxy` sent whose outcome was unknown:
    /// attempts the clients' history does not show (a client whose request
    /// met its copy in flight was answered 409 while the copy reached the
    /// upstream and the gateway died).
    copies_unknown: HashMap<String, usize>,
    /// Nothing explains an extra effect: every hop dedupes, so even an
    /// unknown outcome must not apply a key twice.
    exact: bool,
}

/// Per key, the copies in a dup-proxy history whose outcome was unknown.
fn copies_unknown(events: &[Event]) -> HashMap<String, usize> {
    let copies: HashSet<u64> = events
        .iter()
        .filter_map(|event| match event {
            Event::Invoke {
                op,
                duplicate_of: Some(_),
                ..
            } => Some(*op),
            _ => None,
        })
        .collect();
    let of_copies: Vec<Event> = events
        .iter()
        .filter(|event| copies.contains(&event.op()))
        .cloned()
        .collect();
    unknown_attempts(&of_copies)
        .into_iter()
        .map(|(key, n)| (key.to_owned(), n))
        .collect()
}

/// Splits the checker's double effects into the leased gateway's known cost
/// and violations, and counts the rest.
fn judge(
    index: usize,
    faults: Vec<Fault>,
    report: Report,
    events: &[Event],
    effects: &[idem_check::Effect],
    explain: &Explanations,
) -> TrialResult {
    let mut unknown = if explain.exact {
        HashMap::new()
    } else {
        unknown_attempts(events)
    };
    for (key, n) in &explain.copies_unknown {
        *unknown.entry(key.as_str()).or_default() += n;
    }
    // Each answer the gateway could not store explains one extra effect.
    let mut unstored_left = explain.unstored;
    let mut unstored_repeats = 0;
    let mut applied: HashMap<&str, usize> = HashMap::new();
    for effect in effects {
        *applied.entry(effect.key.as_str()).or_default() += 1;
    }
    let (mut expected_repeats, mut double_effects, mut lost_acked) = (0, 0, 0);
    let mut violations = Vec::new();
    for violation in &report.violations {
        match violation.kind {
            ViolationKind::DoubleEffect => {
                let mut explained = true;
                for key in &violation.keys {
                    let extra = applied
                        .get(key.as_str())
                        .copied()
                        .unwrap_or(1)
                        .saturating_sub(1);
                    let after_unknown = unknown.get(key.as_str()).copied().unwrap_or(0);
                    if extra <= after_unknown {
                        expected_repeats += extra;
                    } else if extra - after_unknown <= unstored_left {
                        expected_repeats += after_unknown;
                        unstored_repeats += extra - after_unknown;
                        unstored_left -= extra - after_unknown;
                    } else {
                        double_effects += extra;
                        explained = false;
                    }
                }
                if explained {
                    continue;
                }
            }
            ViolationKind::AckedNotApplied => lost_acked += violation.keys.len(),
            _ => {}
        }
        violations.push(format!(
            "{}: {:?} {}",
            violation.kind.describe(),
            violation.keys,
            violation.message
        ));
    }
    TrialResult {
        index,
        faults,
        report,
        expected_repeats,
        unstored_repeats,
        double_effects,
        suppressed_downstream: 0,
        lost_acked,
        violations,
        exits: Vec::new(),
        notes: Vec::new(),
        proxy_copies: None,
        samples: Vec::new(),
        history: PathBuf::new(),
    }
}

/// Per key, the attempts whose outcome was unknown: answered `unknown`, or
/// not answered before the next attempt or the end of the history. Each may
/// have reached the upstream while the gateway could not store its answer.
fn unknown_attempts(events: &[Event]) -> HashMap<&str, usize> {
    let mut key_of: HashMap<u64, &str> = HashMap::new();
    let mut pending: HashMap<u64, bool> = HashMap::new();
    let mut unknown: HashMap<&str, usize> = HashMap::new();
    for event in events {
        match event {
            Event::Invoke {
                op, key: Some(key), ..
            } => {
                if pending.insert(*op, true) == Some(true)
                    && let Some(key) = key_of.get(op)
                {
                    *unknown.entry(key).or_default() += 1;
                }
                key_of.insert(*op, key.as_str());
            }
            Event::Unknown { op, .. } => {
                if pending.insert(*op, false) == Some(true)
                    && let Some(key) = key_of.get(op)
                {
                    *unknown.entry(key).or_default() += 1;
                }
            }
            other => {
                pending.insert(other.op(), false);
            }
        }
    }
    for (op, open) in pending {
        if open && let Some(key) = key_of.get(&op) {
            *unknown.entry(key).or_default() += 1;
        }
    }
    unknown
}

#[cfg(test)]
mod tests {
    use idem_check::Effect;
    use idem_check::history::Answer;

    use super::*;

    fn invoke(op: u64, key: &str) -> Event {
        Event::Invoke {
            op,
            process: "client-1".into(),
            at_ms: 0,
            scope: None,
            key: Some(key.into()),
            fingerprint: None,
            request: None,
            duplicate_of: None,
        }
    }

    fn ok(op: u64) -> Event {
        Event::Ok {
            op,
            process: "client-1".into(),
            at_ms: 1,
            answer: Answer {
                status: 201,
                body_hash: None,
                replayed: false,
            },
        }
    }

    fn unknown(op: u64) -> Event {
        Event::Unknown {
            op,
            process: "client-1".into(),
            at_ms: 1,
            error: "reset".into(),
        }
    }

    fn effect(key: &str) -> Effect {
        Effect {
            key: key.into(),
            scope: None,
            resource: None,
            fence: None,
        }
    }

    fn judged(events: &[Event], effects: &[Effect]) -> TrialResult {
        judged_with(events, effects, 0)
    }

    fn judged_with(events: &[Event], effects: &[Effect], unstored: usize) -> TrialResult {
        let report = idem_check::check(events, effects);
        let explain = Explanations {
            unstored,
            ..Explanations::default()
        };
        judge(1, Vec::new(), report, events, effects, &explain)
    }

    #[test]
    fn a_repeat_after_an_unknown_outcome_is_the_leases_cost() {
        let events = [invoke(1, "a"), unknown(1), invoke(1, "a"), ok(1)];
        let result = judged(&events, &[effect("a"), effect("a")]);
        assert_eq!((result.expected_repeats, result.double_effects), (1, 0));
        assert!(result.violations.is_empty(), "{:?}", result.violations);
    }

    #[test]
    fn a_repeat_no_unknown_outcome_explains_is_a_violation() {
        // One attempt never answered explains one extra effect, not two.
        let events = [invoke(1, "a"), invoke(1, "a"), ok(1), invoke(2, "b"), ok(2)];
        let result = judged(
            &events,
            &[
                effect("a"),
                effect("a"),
                effect("a"),
                effect("b"),
                effect("b"),
            ],
        );
        assert_eq!((result.expected_repeats, result.double_effects), (0, 3));
        assert_eq!(result.violations.len(), 2, "{:?}", result.violations);
    }

    #[test]
    fn an_acknowledged_key_without_effect_is_lost() {
        let result = judged(&[invoke(1, "a"), ok(1)], &[]);
        assert_eq!(result.lost_acked, 1);
        assert_eq!(result.violations.len(), 1);
    }

    #[test]
    fn every_scenario_runs_by_default_under_its_command_line_name() {
        for scenario in Scenario::value_variants() {
            assert!(Scenario::ALL.contains(scenario), "{scenario:?}");
            let value = scenario.to_possible_value().unwrap();
            assert_eq!(value.get_name(), scenario.name());
        }
    }

    #[test]
    fn a_repeat_after_an_unstored_answer_is_counted_against_it() {
        // Acknowledged, then the copy applied again: the gateway could not
        // store the first answer.
        let events = [invoke(1, "a"), ok(1), invoke(2, "a"), ok(2)];
        let effects = [effect("a"), effect("a")];
        let result = judged_with(&events, &effects, 1);
        assert_eq!((result.unstored_repeats, result.double_effects), (1, 0));
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        let result = judged_with(&events, &effects, 0);
        assert_eq!((result.unstored_repeats, result.double_effects), (0, 1));
        assert_eq!(result.violations.len(), 1);
    }

    #[test]
    fn a_copy_of_the_proxy_with_an_unknown_outcome_explains_a_repeat() {
        // The client met its copy in flight (409); the copy reached the
        // upstream and the gateway died; the retry after the lease ran again.
        let fail_409 = Event::Fail {
            op: 1,
            process: "client-1".into(),
            at_ms: 1,
            answer: Some(Answer {
                status: 409,
                body_hash: None,
                replayed: false,
            }),
            error: "answered 409".into(),
        };
        let events = [invoke(1, "a"), fail_409, invoke(1, "a"), ok(1)];
        let effects = [effect("a"), effect("a")];
        let mut copy = invoke(7, "a");
        if let Event::Invoke { duplicate_of, .. } = &mut copy {
            *duplicate_of = Some(6);
        }
        let proxy = [invoke(6, "a"), copy, unknown(7), ok(6)];
        let explain = Explanations {
            copies_unknown: copies_unknown(&proxy),
            ..Explanations::default()
        };
        assert_eq!(
            explain.copies_unknown.get("a"),
            Some(&1),
            "only the copy counts"
        );
        let report = idem_check::check(&events, &effects);
        let result = judge(1, Vec::new(), report, &events, &effects, &explain);
        assert_eq!((result.expected_repeats, result.double_effects), (1, 0));
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        assert_eq!(judged(&events, &effects).double_effects, 1);
    }
}
