//! The whole chain on PostgreSQL: clients with retries → `idem dup-proxy` →
//! `idem serve` → an application that writes an outbox row in its own
//! PostgreSQL transaction → `idem relay` → RabbitMQ → `idem forward` → a
//! downstream that applies each message once per key.
//!
//! Every trial puts a fault on every hop, one after another at spaced points
//! of the load, in an order of its own: the gateway killed (or crashed at a
//! crash point), the chain's PostgreSQL connections cut or slowed, the relay
//! killed (or crashed after a publish), the broker connections cut, and
//! `idem forward` killed. The dup-proxy sends half the requests twice
//! throughout.
//!
//! Each hop dedupes: the gateway by its records, the application by its own
//! record committed with the outbox row, the downstream by its record
//! committed with the effect. So no extra effect is explained by an unknown
//! outcome, as it is behind a gateway alone: every key the clients were
//! answered for is applied exactly once downstream, and any other key at most
//! once.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use idem::PgStore;
use rand::Rng;
use rand::seq::SliceRandom;

use idem_testkit::faultproxy::{FaultProxy, Mode};

use super::relay::{DRAIN_WAIT, Route, acked_keys};
use super::{CLIENTS, Carrier, Fault, Setting, TrialResult};
use crate::torture::broker;
use crate::torture::child::{Exit, Process};
use crate::torture::client::Load;
use crate::torture::dup_proxy_process::{DupProxy, Timing};
use crate::torture::gateway_process::Gateway;
use crate::torture::verdict::{Explanations, judge};
use crate::torture::{Database, now_ms, relay_services};

/// A hop of the chain, and the fault it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// `idem serve`: SIGKILL, or a crash point armed from the start.
    Gateway,
    /// Every PostgreSQL connection of the chain but the downstream's: drop,
    /// blackhole or delay.
    Database,
    /// `idem relay`: SIGKILL, or a crash after a publish armed from the start.
    Relay,
    /// The relay's and `idem forward`'s RabbitMQ connections: drop or blackhole.
    Broker,
    /// `idem forward`: SIGKILL.
    Forward,
}

impl Hop {
    const ALL: [Self; 5] = [
        Self::Gateway,
        Self::Database,
        Self::Relay,
        Self::Broker,
        Self::Forward,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Gateway => "gateway",
            Self::Database => "database",
            Self::Relay => "relay",
            Self::Broker => "broker",
            Self::Forward => "forward",
        }
    }
}

/// The trial's databases on the shared server: the gateway's store, the
/// application's (records and outbox), `idem forward`'s and the
/// downstream's. Created for the trial, dropped at its end.
struct Databases {
    gateway: Database,
    application: Database,
    forward: Database,
    downstream: Database,
}

impl Databases {
    async fn create(setting: &Setting<'_>) -> anyhow::Result<(Self, std::net::SocketAddr)> {
        let Some((base, server)) = setting.postgres else {
            anyhow::bail!("chain-postgres needs PostgreSQL");
        };
        let name = |part: &str| format!("{base}_t{}_{part}", setting.index);
        let databases = Self {
            gateway: Database::create(server, &name("gw")).await?,
            application: Database::create(server, &name("app")).await?,
            forward: Database::create(server, &name("fwd")).await?,
            downstream: Database::create(server, &name("down")).await?,
        };
        Ok((databases, server))
    }

    async fn drop(self) {
        for database in [
            self.gateway,
            self.application,
            self.forward,
            self.downstream,
        ] {
            database.drop().await;
        }
    }
}

/// Runs one trial of the chain, dropping its databases however it ends.
pub(super) async fn trial(setting: &Setting<'_>) -> anyhow::Result<TrialResult> {
    let (databases, server) = Databases::create(setting).await?;
    let result = run(setting, &databases, server).await;
    databases.drop().await;
    result
}

/// A partition in progress on a fault proxy: its hop, mode, end and start.
struct Partition {
    hop: Hop,
    mode: Mode,
    until: Instant,
    at_ms: i64,
}

async fn run(
    setting: &Setting<'_>,
    databases: &Databases,
    server: std::net::SocketAddr,
) -> anyhow::Result<TrialResult> {
    let Setting {
        index,
        ops,
        dir,
        run_id,
        amqp,
        ..
    } = *setting;
    std::fs::create_dir_all(dir)?;
    let db_proxy = FaultProxy::start(server).await?;
    let broker_proxy = FaultProxy::start(broker::address(amqp)?).await?;
    let through_proxy =
        |db: &Database| format!("postgres://postgres@{}/{}", db_proxy.addr(), db.name);
    let direct = |db: &Database| format!("postgres://postgres@{server}/{}", db.name);

    let deliveries = Arc::new(AtomicUsize::new(0));
    let down_store = PgStore::connect(&direct(&databases.downstream)).await?;
    let down = relay_services::downstream_postgres(&down_store, Arc::clone(&deliveries)).await?;
    let app_store = PgStore::connect(&through_proxy(&databases.application)).await?;
    let app = relay_services::application(&app_store).await?;
    // The outbox read while the proxy is cut: past it.
    let outbox = PgStore::builder(direct(&databases.application))
        .migrate(false)
        .connect()
        .await?;

    // Odd trials arm crash points in the gateway and the relay from the
    // start instead of killing them on their turn.
    let armed = index % 2 == 1;
    let gateway_crash = armed.then(|| {
        let point = [
            idem::crash::AFTER_CLAIM,
            idem::crash::INSIDE_EFFECT,
            idem::crash::BEFORE_ANSWER,
        ][(index / 2) % 3];
        let nth = rand::rng().random_range(2..=(ops / 3).max(2));
        (point, format!("{point}:#{nth}"))
    });
    let relay_crash = armed.then(|| format!("{}:#1", idem::crash::AFTER_PUBLISH));

    let gateway_log = dir.join("gateway.log");
    let mut gateway = Gateway::start(
        through_proxy(&databases.gateway),
        format!("http://{}", app.addr),
        &gateway_log,
        gateway_crash.as_ref().map(|c| c.1.as_str()),
        None,
    )
    .await?;
    let gateway_addr = *gateway.addr().lock().unwrap_or_else(|p| p.into_inner());
    let dup_proxy = DupProxy::start(
        gateway_addr,
        Timing::of_trial(index),
        &dir.join("dup-proxy.log"),
        &dir.join("dup-proxy.jsonl"),
    )
    .await?;

    let deliver = format!("http://{}/deliver", down.addr);
    let mut route = Route::open(
        setting,
        Carrier::Rabbitmq,
        Some(&broker_proxy),
        None,
        None,
        &deliver,
        &through_proxy(&databases.forward),
    )
    .await?;
    let mut relay = Process::relay(
        &through_proxy(&databases.application),
        &route.to,
        &dir.join("relay.log"),
    );
    relay.start(relay_crash.as_deref())?;

    let history_path = dir.join("history.jsonl");
    let history = std::fs::File::create(&history_path)?;
    let budget = Duration::from_secs(60) + Duration::from_millis(100 * ops);
    let started = Instant::now();
    let load = Load::new(
        format!("{run_id}-chain-postgres-t{index}"),
        ops,
        Arc::new(std::sync::Mutex::new(dup_proxy.addr())),
        history,
        started + budget,
    );
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|n| tokio::spawn(Arc::clone(&load).client(format!("client-{n}"))))
        .collect();

    // One fault per hop, in a random order, at 10 %, 25 %, … 70 % of the load.
    let mut plan = Hop::ALL;
    plan.shuffle(&mut rand::rng());
    let due = |turn: usize| ((0.1 + 0.15 * turn as f64) * ops as f64) as usize;
    let mut turn = 0;
    let mut faults = Vec::new();
    let mut exits = Vec::new();
    let mut partition: Option<Partition> = None;
    let mut gateway_down: Option<(String, i64)> = None;
    let mut drained_by: Option<Instant> = None;
    let pause = || Duration::from_millis(rand::rng().random_range(50..300));
    while started.elapsed() < budget + Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Processes that ended are restarted unarmed, as a supervisor would.
        if let Some(exit) = gateway.exited() {
            let what = match (exit, &gateway_crash) {
                (Exit::Crashed, Some((point, _))) => format!("gateway crash {point}"),
                _ => {
                    exits.push("serve");
                    "gateway exit".to_owned()
                }
            };
            gateway_down = Some((what, now_ms()));
            tokio::time::sleep(pause()).await;
        }
        // A gateway cannot start while its database is cut off (behind a
        // blackhole its start waits for the database): it is started once
        // the partition has run its course.
        let database_cut = partition
            .as_ref()
            .is_some_and(|cut| matches!(cut.hop, Hop::Database));
        if !database_cut && let Some((what, at_ms)) = gateway_down.take() {
            match gateway.restart(None).await {
                Ok(()) => faults.push(Fault {
                    what,
                    at_ms,
                    until_ms: now_ms(),
                }),
                Err(error) if partition.is_some() => {
                    tracing::debug!(%error, "the gateway did not start during a partition");
                    gateway_down = Some((what, at_ms));
                }
                Err(error) => return Err(error.context("restarting the gateway")),
            }
        }
        if let Some(exit) = relay.exited() {
            let at_ms = now_ms();
            match (exit, &relay_crash) {
                (Exit::Crashed, Some(_)) => {
                    tokio::time::sleep(pause()).await;
                    relay.start(None)?;
                    faults.push(Fault {
                        what: format!("relay crash {}", idem::crash::AFTER_PUBLISH),
                        at_ms,
                        until_ms: now_ms(),
                    });
                }
                _ => {
                    exits.push(relay.name());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    relay.start(None)?;
                }
            }
        }
        if let Some(forward) = &mut route.forward
            && forward.exited().is_some()
        {
            exits.push(forward.name());
            tokio::time::sleep(Duration::from_millis(500)).await;
            forward.start(None)?;
        }
        if let Some(cut) = &partition {
            if Instant::now() < cut.until {
                continue;
            }
            match cut.hop {
                Hop::Database => db_proxy.set(Mode::Pass),
                _ => broker_proxy.set(Mode::Pass),
            }
            faults.push(Fault {
                what: format!("{} {}", cut.hop.name(), cut.mode.name()),
                at_ms: cut.at_ms,
                until_ms: now_ms(),
            });
            partition = None;
        }
        if turn < plan.len() && load.done.load(Ordering::SeqCst) >= due(turn) {
            let hop = plan[turn];
            turn += 1;
            let at_ms = now_ms();
            let lasts = Duration::from_millis(rand::rng().random_range(500..2500));
            match hop {
                // An armed crash point fires by itself.
                Hop::Gateway | Hop::Relay if armed => {}
                Hop::Gateway => {
                    gateway.kill().await;
                    tokio::time::sleep(pause()).await;
                    gateway_down = Some(("gateway sigkill".into(), at_ms));
                }
                Hop::Relay => {
                    relay.kill().await;
                    tokio::time::sleep(pause()).await;
                    relay.start(None)?;
                    faults.push(Fault {
                        what: "relay sigkill".into(),
                        at_ms,
                        until_ms: now_ms(),
                    });
                }
                Hop::Forward => {
                    if let Some(forward) = &mut route.forward {
                        forward.kill().await;
                        tokio::time::sleep(pause()).await;
                        forward.start(None)?;
                    }
                    faults.push(Fault {
                        what: "forward sigkill".into(),
                        at_ms,
                        until_ms: now_ms(),
                    });
                }
                Hop::Database => {
                    let mode = match index % 3 {
                        0 => Mode::Drop,
                        1 => Mode::Blackhole,
                        _ => Mode::Delay(Duration::from_millis(40)),
                    };
                    db_proxy.set(mode);
                    partition = Some(Partition {
                        hop,
                        mode,
                        until: Instant::now() + lasts,
                        at_ms,
                    });
                }
                Hop::Broker => {
                    let mode = if index % 2 == 0 {
                        Mode::Drop
                    } else {
                        Mode::Blackhole
                    };
                    broker_proxy.set(mode);
                    partition = Some(Partition {
                        hop,
                        mode,
                        until: Instant::now() + lasts,
                        at_ms,
                    });
                }
            }
            continue;
        }
        // Once the clients are done and every fault has run its course,
        // wait for the outbox to drain and every acknowledged key to reach
        // the downstream.
        if turn == plan.len()
            && gateway_down.is_none()
            && clients.iter().all(|client| client.is_finished())
        {
            let deadline = *drained_by.get_or_insert_with(|| Instant::now() + DRAIN_WAIT);
            if Instant::now() > deadline {
                break;
            }
            if relay_services::pending(&outbox).await? == 0 {
                let acked = acked_keys(&history_path)?;
                let applied = downstream_effects(&direct(&databases.downstream)).await?;
                let applied: HashSet<String> = applied.into_iter().map(|e| e.key).collect();
                if acked.is_subset(&applied) {
                    break;
                }
            }
        }
    }
    if let Some(cut) = partition {
        db_proxy.set(Mode::Pass);
        broker_proxy.set(Mode::Pass);
        faults.push(Fault {
            what: format!("{} {}", cut.hop.name(), cut.mode.name()),
            at_ms: cut.at_ms,
            until_ms: now_ms(),
        });
    }
    for client in &clients {
        client.abort();
    }
    let proxy_copies = dup_proxy.duplicated().await?;
    drop(dup_proxy);
    gateway.kill().await;
    relay.kill().await;
    let unpublished = relay_services::pending(&outbox).await?;
    let queued = match &route.queue {
        Some(queue) => queue.depth().await.ok(),
        None => None,
    };
    route.close().await;
    drop(app);
    app_store.pool().close().await;
    outbox.pool().close().await;

    let events =
        idem_check::history::read(std::io::BufReader::new(std::fs::File::open(&history_path)?))?;
    let effects = downstream_effects(&direct(&databases.downstream)).await?;
    drop(down);
    down_store.pool().close().await;
    let report = idem_check::check(&events, &effects);
    let explain = Explanations {
        exact: true,
        ..Explanations::default()
    };
    let mut result = judge(index, faults, report, &events, &effects, &explain);
    result.samples = load.samples();
    result.history = history_path;
    result.proxy_copies = Some(proxy_copies);
    result.suppressed_downstream = deliveries
        .load(Ordering::SeqCst)
        .saturating_sub(effects.len());
    result.exits = exits;
    if turn < plan.len() {
        result.notes.push(format!(
            "only {turn} of the {} faults were injected before the trial's time ran out",
            plan.len()
        ));
    }
    if result.lost_acked > 0 {
        result.notes.push(format!(
            "{unpublished} outbox rows were still unpublished when the trial ended"
        ));
        if let Some((messages, consumers)) = queued {
            result.notes.push(format!(
                "{messages} messages were waiting in the queue, which had {consumers} consumers"
            ));
        }
    }
    Ok(result)
}

/// The downstream's effect log, read on a connection of its own.
async fn downstream_effects(url: &str) -> anyhow::Result<Vec<idem_check::Effect>> {
    let effects =
        idem_check::effects::query::postgres(url, "the downstream", relay_services::EFFECTS_QUERY)
            .await
            .context("cannot read the downstream's effects")?;
    Ok(effects)
}
