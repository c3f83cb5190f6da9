//! The gateway scenarios: `idem serve` in front of an upstream that applies
//! every request, killed or crashed at a crash point, cut off its database
//! through the fault proxy, its PostgreSQL server restarted mid-load, a
//! primary of its Redis Cluster killed and failed over, or its upstream
//! answering 5xx after applying; with `--probe`, or behind `idem
//! dup-proxy`, in some of them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::StatusCode;
use idem_testkit::faultproxy::{FaultProxy, Mode};
use rand::Rng;

use super::{CLIENTS, Fault, Scenario, Setting, TrialResult};
use crate::torture::child::Exit;
use crate::torture::client::Load;
use crate::torture::dup_proxy_process::{DupProxy, Timing};
use crate::torture::gateway_process::{Gateway, unstored_answers};
use crate::torture::now_ms;
use crate::torture::pgserver::Shutdown;
use crate::torture::redis_failover::{FailoverCluster, Promotion};
use crate::torture::upstream::{EFFECTS_QUERY, PROBE, Upstream};
use crate::torture::verdict::{Explanations, copies_unknown, judge};

/// How long a write to the Redis Cluster waits for its replica (`WAIT 1
/// 500`) before the store reports it failed.
const WAIT_TIMEOUT_MS: u64 = 500;

/// A trial of a gateway scenario.
pub(super) async fn trial(setting: &Setting<'_>) -> anyhow::Result<TrialResult> {
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
    // Its servers are killed when the trial ends, on every way out.
    let cluster = match scenario.redis_cluster_waits() {
        Some(_) => Some(FailoverCluster::start().await?),
        None => None,
    };
    let store = match (scenario, postgres, private) {
        (
            Scenario::SqliteKill
            | Scenario::SqliteKillProbe
            | Scenario::DupProxyKill
            | Scenario::FailAfterApply,
            _,
            _,
        ) => {
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
        _ if let Some(cluster) = &cluster => match scenario.redis_cluster_waits() {
            Some(true) => format!("{}?wait=1&wait_timeout_ms={WAIT_TIMEOUT_MS}", cluster.url()),
            _ => cluster.url().to_owned(),
        },
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
    let mut exits = Vec::new();
    let fault_at = (ops as f64 * rand::rng().random_range(0.2..0.5)) as usize;
    let mut injected = false;
    let mut down_since: Option<(String, i64)> = None;
    let mut partition: Option<(Mode, Instant, i64)> = None;
    // The upstream answering first effects with this 5xx, until then.
    let mut misanswering: Option<(StatusCode, Instant, i64)> = None;
    let finished = || clients.iter().all(|client| client.is_finished());
    while !finished() && started.elapsed() < budget + Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A gateway that ended (a crash point, a kill) is restarted unarmed;
        // in a scenario that neither kills it nor arms a crash point it ended
        // by itself, which is a finding, and it is restarted as a supervisor
        // would.
        if let Some(exit) = gateway.exited() {
            if !scenario.kills() {
                exits.push("serve");
                gateway
                    .restart(None)
                    .await
                    .context("restarting the gateway")?;
                continue;
            }
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
        if let Some((status, until, at_ms)) = misanswering {
            if Instant::now() >= until {
                upstream.fail_after_apply(None);
                faults.push(Fault {
                    what: after_apply(status),
                    at_ms,
                    until_ms: now_ms(),
                });
                misanswering = None;
            }
            continue;
        }
        if injected || load.done.load(Ordering::SeqCst) < fault_at {
            continue;
        }
        injected = true;
        if scenario == Scenario::FailAfterApply {
            let status = [
                StatusCode::BAD_GATEWAY,
                StatusCode::GATEWAY_TIMEOUT,
                StatusCode::INTERNAL_SERVER_ERROR,
            ][index % 3];
            let lasts = Duration::from_millis(rand::rng().random_range(500..3500));
            upstream.fail_after_apply(Some(status));
            misanswering = Some((status, Instant::now() + lasts, now_ms()));
            continue;
        }
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
            (None, None, _) if let Some(cluster) = &cluster => {
                let hold = Duration::from_millis(rand::rng().random_range(1000..3000));
                let at_ms = now_ms();
                let failover = cluster
                    .fail_over(index, hold)
                    .await
                    .context("failing over a primary of the Redis Cluster")?;
                let what = match failover.promotion {
                    Promotion::Automatic => "sigkill a primary, replica promoted",
                    Promotion::Takeover => "sigkill a primary, replica took over",
                };
                faults.push(Fault {
                    what: what.to_owned(),
                    at_ms,
                    until_ms: now_ms(),
                });
                tracing::debug!(promoted_after = ?failover.promoted_after, "failover");
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
    if let Some((status, _, at_ms)) = misanswering {
        upstream.fail_after_apply(None);
        faults.push(Fault {
            what: after_apply(status),
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
    drop(cluster);

    let events =
        idem_check::history::read(std::io::BufReader::new(std::fs::File::open(&history_path)?))?;
    let effects = idem_check::effects::query::sqlite(upstream.path(), EFFECTS_QUERY)?;
    let report = idem_check::check(&events, &effects);
    let mut explain = Explanations {
        unstored: unstored_answers(&log)?,
        lossy: scenario.redis_cluster_waits() == Some(false),
        ..Explanations::default()
    };
    if scenario == Scenario::DupProxyKill {
        let copies = std::fs::File::open(&copies_path)
            .with_context(|| format!("cannot read {}", copies_path.display()))?;
        let copies = idem_check::history::read(std::io::BufReader::new(copies))?;
        explain.copies_unknown = copies_unknown(&copies);
    }
    let mut result = judge(index, faults, report, &events, &effects, &explain);
    if scenario == Scenario::FailAfterApply && upstream.failed_after_apply() == 0 {
        result.notes.push(
            "the load ended before the upstream answered a first effect with a 5xx".to_owned(),
        );
    }
    if scenario.probes() && result.expected_repeats > 0 {
        // The upstream said what it had applied: a repeat is not a cost here.
        result.violations.push(format!(
            "{} effects repeated after an unknown outcome although the gateway asked the upstream first",
            result.expected_repeats
        ));
    }
    result.exits = exits;
    result.samples = load.samples();
    result.history = history_path;
    result.proxy_copies = proxy_copies;
    Ok(result)
}

/// The fault's name: `502 after apply`.
fn after_apply(status: StatusCode) -> String {
    format!("{} after apply", status.as_u16())
}
