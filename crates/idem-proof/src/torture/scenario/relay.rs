//! The relay scenarios: an application enqueues a message per request in its
//! record's transaction, `idem relay` publishes it (to the downstream
//! directly, or through RabbitMQ or JetStream and `idem forward`) and is
//! killed, crashed after a publish, or cut off its broker mid-load; or a
//! node of the three-node JetStream or RabbitMQ cluster it publishes to is
//! killed.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use idem::SqliteStore;
use idem_check::history::Event;
use idem_testkit::faultproxy::{FaultProxy, Mode};
use idem_testkit::nats_cluster::{NODES, NatsCluster};
use idem_testkit::rabbitmq_cluster::{NODES as RABBIT_NODES, RabbitCluster};
use rand::Rng;

use super::{CLIENTS, Carrier, Fault, Setting, TrialResult};
use crate::torture::broker::{self, Queue, Stream};
use crate::torture::child::{Exit, Process};
use crate::torture::client::Load;
use crate::torture::now_ms;
use crate::torture::relay_services;
use crate::torture::verdict::{Explanations, judge};

/// How long a relay trial waits, once its clients are done and its broker
/// healed, for every acknowledged key to reach the downstream: longer than
/// a consumer's connect timeout (30 s), since an attempt that began just as
/// the cut ended may hang until that timeout gives up on it and connects
/// again. A trial whose keys all arrived stops waiting at once.
pub(super) const DRAIN_WAIT: Duration = Duration::from_secs(45);

/// Where the relay publishes and what `idem forward` consumes, for one
/// trial, with what to delete at its end.
pub(super) struct Route {
    pub(super) to: String,
    pub(super) forward: Option<Process>,
    pub(super) queue: Option<Queue>,
    stream: Option<Stream>,
}

impl Route {
    pub(super) async fn open(
        setting: &Setting<'_>,
        carrier: Carrier,
        proxy: Option<&FaultProxy>,
        cluster: Option<&NatsCluster>,
        rabbit: Option<&RabbitCluster>,
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
            Carrier::NatsCluster => {
                let cluster = cluster.context("a cluster scenario without its cluster")?;
                let stream = Stream::create_with(cluster.client().await, name, NODES).await?;
                // Every node in both URLs, as production would write them.
                let servers = cluster.url();
                route.to = format!("{servers}/{}", stream.subject);
                route.forward = Some(forward(&format!("{servers}/{}/forward", stream.name)));
                route.stream = Some(stream);
            }
            Carrier::RabbitmqCluster => {
                let rabbit = rabbit.context("a cluster scenario without its cluster")?;
                // Declared through the first node, which leads it at first.
                let queue =
                    Queue::declare_with(&rabbit.url_in(&[0]), name, Some(RABBIT_NODES)).await?;
                // Every node in both URLs, as production would write them.
                let nodes = rabbit.url();
                route.to = format!("{nodes}?queue={}", queue.name);
                route.forward = Some(forward(&format!("{nodes}/{}", queue.name)));
                route.queue = Some(queue);
            }
        }
        if let Some(forward) = &mut route.forward {
            forward.start(None)?;
        }
        Ok(route)
    }

    pub(super) async fn close(mut self) {
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
pub(super) async fn trial(setting: &Setting<'_>, carrier: Carrier) -> anyhow::Result<TrialResult> {
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
    let down = relay_services::downstream(&down_store, Arc::clone(&deliveries)).await?;
    let app = relay_services::application(&app_store).await?;
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
    let mut cluster = match carrier {
        Carrier::NatsCluster => Some(NatsCluster::start().await.context(
            "a three-node NATS cluster could not start (nats-server on the PATH or IDEM_NATS_SERVER)",
        )?),
        _ => None,
    };
    // The campaign's RabbitMQ cluster, started by its first trial; a node an
    // earlier trial left killed is running again.
    let mut rabbit = match carrier {
        Carrier::RabbitmqCluster => Some(RabbitCluster::shared().await.context(
            "a three-node RabbitMQ cluster could not start (rabbitmq-server in /usr/lib/rabbitmq/bin or IDEM_RABBITMQ_SERVER)",
        )?),
        _ => None,
    };
    let mut route = Route::open(
        setting,
        carrier,
        proxy.as_ref(),
        cluster.as_ref(),
        rabbit.as_deref(),
        &deliver,
        &forward_store,
    )
    .await?;
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
    // A killed cluster node: which, why it was chosen, when it comes back,
    // and when it died.
    let mut node_down: Option<(usize, &str, Instant, i64)> = None;
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
                None if let Some(cluster) = &mut cluster => {
                    let leader = match &route.stream {
                        Some(stream) => cluster.stream_leader(&stream.name).await,
                        None => None,
                    };
                    let (node, role) = match leader {
                        Some(leader) if index % 2 == 0 => (leader, "the stream's leader"),
                        Some(leader) => (
                            (leader + rand::rng().random_range(1..NODES)) % NODES,
                            "a follower",
                        ),
                        None => (rand::rng().random_range(0..NODES), "a node"),
                    };
                    let lasts = Duration::from_millis(rand::rng().random_range(1000..3000));
                    cluster.kill(node);
                    node_down = Some((node, role, Instant::now() + lasts, now_ms()));
                }
                None if let Some(rabbit) = &mut rabbit => {
                    let leader = match &route.queue {
                        Some(queue) => rabbit.queue_leader(&queue.name).await,
                        None => None,
                    };
                    let (node, role) = match leader {
                        Some(leader) if index % 2 == 0 => (leader, "the queue's leader"),
                        Some(leader) => (
                            (leader + rand::rng().random_range(1..RABBIT_NODES)) % RABBIT_NODES,
                            "a follower",
                        ),
                        None => (rand::rng().random_range(0..RABBIT_NODES), "a node"),
                    };
                    let lasts = Duration::from_millis(rand::rng().random_range(1000..3000));
                    rabbit.kill(node);
                    node_down = Some((node, role, Instant::now() + lasts, now_ms()));
                }
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
        if let (Some(cluster), Some((node, role, until, at_ms))) = (&mut cluster, node_down)
            && Instant::now() >= until
        {
            // Back when it has caught up with the others.
            cluster.restart(node).await;
            faults.push(Fault {
                what: format!("sigkill {role}"),
                at_ms,
                until_ms: now_ms(),
            });
            node_down = None;
        }
        if let (Some(rabbit), Some((node, role, until, at_ms))) = (&mut rabbit, node_down)
            && Instant::now() >= until
        {
            // Back when the cluster lists it running again.
            rabbit.restart(node).await;
            faults.push(Fault {
                what: format!("sigkill {role}"),
                at_ms,
                until_ms: now_ms(),
            });
            node_down = None;
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
        if partition.is_none()
            && node_down.is_none()
            && clients.iter().all(|client| client.is_finished())
        {
            let deadline = *drained_by.get_or_insert_with(|| Instant::now() + DRAIN_WAIT);
            if Instant::now() > deadline {
                break;
            }
            if relay_services::pending(&app_store).await? == 0 {
                let acked = acked_keys(&history_path)?;
                let applied =
                    idem_check::effects::query::sqlite(&down_path, relay_services::EFFECTS_QUERY)?;
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
    let unpublished = relay_services::pending(&app_store).await?;
    let queued = match &route.queue {
        Some(queue) => queue.depth().await.ok(),
        None => None,
    };
    route.close().await;
    drop(proxy);
    drop(cluster);
    drop(rabbit);

    let events =
        idem_check::history::read(std::io::BufReader::new(std::fs::File::open(&history_path)?))?;
    let effects = idem_check::effects::query::sqlite(&down_path, relay_services::EFFECTS_QUERY)?;
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

/// The keys of the operations answered `ok` in a history file.
pub(super) fn acked_keys(history: &Path) -> anyhow::Result<HashSet<String>> {
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
