//! The scenarios and one trial of each: the upstream, the gateway on its
//! store, the clients, the fault injected mid-load, and the check at the end.
//!
//! - `catalogue`: the scenarios ([`Scenario`]) and what each needs;
//! - `gateway`: the driver of the gateway scenarios;
//! - `relay`: the driver of the relay scenarios (webhook, RabbitMQ, NATS);
//! - `chain`: the driver of the whole chain on PostgreSQL;
//! - [`trial`] (here): which driver runs a scenario, and what a trial is
//!   given ([`Setting`]).
//!
//! What a trial finds is [`crate::torture::findings`]; the verdict on its
//! history and effects is [`crate::torture::verdict`]'s.

use std::net::SocketAddr;
use std::path::Path;

pub(super) use super::findings::{Fault, TrialResult};
use super::pgserver::PrivatePostgres;

mod catalogue;
mod chain;
mod gateway;
mod relay;

pub(crate) use catalogue::Carrier;
pub use catalogue::Scenario;

/// Concurrent clients per trial.
const CLIENTS: usize = 4;

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

/// Runs one trial.
pub(super) async fn trial(setting: &Setting<'_>) -> anyhow::Result<TrialResult> {
    match setting.scenario.carrier() {
        _ if setting.scenario == Scenario::ChainPostgres => chain::trial(setting).await,
        Some(carrier) => relay::trial(setting, carrier).await,
        None => gateway::trial(setting).await,
    }
}
