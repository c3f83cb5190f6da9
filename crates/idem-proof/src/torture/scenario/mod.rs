//! The scenarios and one trial of each: the upstream, the gateway on its
//! store, the clients, the fault injected mid-load, and the check at the end.
//!
//! - `catalogue`: the scenarios ([`Scenario`]) and what each needs;
//! - `gateway`: the driver of the gateway scenarios;
//! - `relay`: the driver of the relay scenarios (webhook, RabbitMQ, NATS);
//! - `chain`: the driver of the whole chain on PostgreSQL;
//! - [`trial`] (here): which driver runs a scenario, and what a trial is
//!   given ([`Setting`]) and finds ([`TrialResult`]).
//!
//! The verdict on a trial's history and effects is
//! [`crate::torture::verdict`]'s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use idem_check::Report;

use super::client::Sample;
use super::pgserver::PrivatePostgres;

mod catalogue;
mod chain;
mod gateway;
mod relay;

pub(crate) use catalogue::Carrier;
pub use catalogue::Scenario;

/// Concurrent clients per trial.
const CLIENTS: usize = 4;

/// A fault, as injected.
#[derive(Debug, Clone)]
pub(super) struct Fault {
    /// What: `sigkill`, `crash apply.after-claim`, `drop`, …
    pub what: String,
    /// When it started, ms since the Unix epoch.
    pub at_ms: i64,
    /// When it ended (the process was back, the proxy passed again).
    pub until_ms: i64,
}

/// Where a trial runs.
pub(super) struct Setting<'a> {
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
pub(super) struct TrialResult {
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
pub(super) async fn trial(setting: &Setting<'_>) -> anyhow::Result<TrialResult> {
    match setting.scenario.carrier() {
        _ if setting.scenario == Scenario::ChainPostgres => chain::trial(setting).await,
        Some(carrier) => relay::trial(setting, carrier).await,
        None => gateway::trial(setting).await,
    }
}
