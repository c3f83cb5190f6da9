//! The catalogue of scenarios: their names on the command line, and what
//! each needs and does (a kill, a cut, an upstream's ambiguous answers,
//! PostgreSQL, a Redis Cluster, a broker).

use clap::ValueEnum;

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
    /// The gateway on the embedded store with `idem serve --probe`, in front
    /// of an upstream that, for a while mid-load, applies each key's first
    /// request and then answers it 502, 504 or 500 (by trial): an answer
    /// that says nothing about the effect. The gateway asks the upstream
    /// before the retry; no repeat is expected.
    #[value(name = "gateway-5xx-after-apply")]
    FailAfterApply,
    /// The gateway's store on a Redis Cluster of the trial's own (three
    /// primaries, a replica each), every write followed by `WAIT 1`
    /// (`?wait=1`); mid-load a primary is killed (SIGKILL), its replica
    /// promoted, and the killed node restarted as the new primary's replica.
    #[value(name = "gateway-redis-cluster-failover")]
    RedisClusterFailover,
    /// The same without `WAIT`: writes a primary acknowledged and never sent
    /// to its replica are lost in the failover. Its double effects and lost
    /// acknowledgements are counted, not taken for violations.
    #[value(name = "gateway-redis-cluster-failover-nowait")]
    RedisClusterFailoverNowait,
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
    /// The JetStream stack on a three-node cluster of the trial's own: an R3
    /// stream, the relay and `idem forward` given every node, and one node
    /// killed (SIGKILL) mid-load and restarted after 1 to 3 s: the stream's
    /// leader in even trials, another node in odd ones.
    #[value(name = "relay-nats-cluster-node-kill")]
    RelayNatsClusterNodeKill,
    /// The RabbitMQ stack on a three-node cluster: a quorum queue on the
    /// three nodes, the relay and `idem forward` given every node, and one
    /// node killed (SIGKILL) mid-load and restarted after 1 to 3 s: the
    /// queue's leader in even trials, another node in odd ones.
    #[value(name = "relay-rabbitmq-cluster-node-kill")]
    RelayRabbitmqClusterNodeKill,
    /// The whole chain on PostgreSQL: clients → `idem dup-proxy` → `idem
    /// serve` → an application writing an outbox row in its own PostgreSQL
    /// transaction → `idem relay` → RabbitMQ → `idem forward` → a downstream
    /// that dedupes, with a fault at every hop in each trial.
    #[value(name = "chain-postgres")]
    ChainPostgres,
}

/// What carries the relay's messages to the downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// The relay posts to the downstream itself.
    Webhook,
    /// A RabbitMQ queue, and `idem forward`.
    Rabbitmq,
    /// A JetStream stream, and `idem forward`.
    Nats,
    /// A JetStream stream replicated on a three-node cluster of the trial's
    /// own, and `idem forward`, both given every node.
    NatsCluster,
    /// A quorum queue on a three-node RabbitMQ cluster of the campaign's
    /// own, and `idem forward`, both given every node.
    RabbitmqCluster,
}

impl Scenario {
    /// Every scenario, in the order a campaign runs them.
    pub const ALL: [Self; 18] = [
        Self::SqliteKill,
        Self::PostgresKill,
        Self::SqliteKillProbe,
        Self::PostgresKillProbe,
        Self::FailAfterApply,
        Self::RedisClusterFailover,
        Self::RedisClusterFailoverNowait,
        Self::PostgresPartition,
        Self::PostgresRestart,
        Self::DupProxyKill,
        Self::RelayKill,
        Self::RelayRabbitmqKill,
        Self::RelayRabbitmqPartition,
        Self::RelayNatsKill,
        Self::RelayNatsPartition,
        Self::RelayNatsClusterNodeKill,
        Self::RelayRabbitmqClusterNodeKill,
        Self::ChainPostgres,
    ];

    /// The scenario's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::SqliteKill => "gateway-sqlite-kill",
            Self::PostgresKill => "gateway-postgres-kill",
            Self::SqliteKillProbe => "gateway-sqlite-kill-probe",
            Self::PostgresKillProbe => "gateway-postgres-kill-probe",
            Self::FailAfterApply => "gateway-5xx-after-apply",
            Self::RedisClusterFailover => "gateway-redis-cluster-failover",
            Self::RedisClusterFailoverNowait => "gateway-redis-cluster-failover-nowait",
            Self::PostgresPartition => "gateway-postgres-partition",
            Self::PostgresRestart => "gateway-postgres-restart",
            Self::DupProxyKill => "gateway-dup-proxy-kill",
            Self::RelayKill => "relay-kill",
            Self::RelayRabbitmqKill => "relay-rabbitmq-kill",
            Self::RelayRabbitmqPartition => "relay-rabbitmq-partition",
            Self::RelayNatsKill => "relay-nats-kill",
            Self::RelayNatsPartition => "relay-nats-partition",
            Self::RelayNatsClusterNodeKill => "relay-nats-cluster-node-kill",
            Self::RelayRabbitmqClusterNodeKill => "relay-rabbitmq-cluster-node-kill",
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
    pub fn probes(self) -> bool {
        matches!(
            self,
            Self::SqliteKillProbe | Self::PostgresKillProbe | Self::FailAfterApply
        )
    }

    /// For a scenario on a Redis Cluster of the trial's own, whether each
    /// write waits for a replica (`WAIT 1`).
    pub fn redis_cluster_waits(self) -> Option<bool> {
        match self {
            Self::RedisClusterFailover => Some(true),
            Self::RedisClusterFailoverNowait => Some(false),
            _ => None,
        }
    }

    /// Whether the scenario starts a PostgreSQL server of its own.
    pub fn needs_private_postgres(self) -> bool {
        self == Self::PostgresRestart
    }

    /// Whether the scenario kills the process under test (or fires a crash
    /// point in it); the others cut or restart what it depends on.
    pub fn kills(self) -> bool {
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

    /// What carries the relay's messages, for a relay scenario.
    pub fn carrier(self) -> Option<Carrier> {
        match self {
            Self::RelayKill => Some(Carrier::Webhook),
            Self::RelayRabbitmqKill | Self::RelayRabbitmqPartition => Some(Carrier::Rabbitmq),
            Self::RelayNatsKill | Self::RelayNatsPartition => Some(Carrier::Nats),
            Self::RelayNatsClusterNodeKill => Some(Carrier::NatsCluster),
            Self::RelayRabbitmqClusterNodeKill => Some(Carrier::RabbitmqCluster),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    #[test]
    fn every_scenario_runs_by_default_under_its_command_line_name() {
        for scenario in Scenario::value_variants() {
            assert!(Scenario::ALL.contains(scenario), "{scenario:?}");
            let value = scenario.to_possible_value().unwrap();
            assert_eq!(value.get_name(), scenario.name());
        }
    }
}
