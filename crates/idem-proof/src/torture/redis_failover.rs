//! A Redis Cluster of a trial's own for the gateway's store (three
//! primaries with a replica each, `idem_testkit::redis::RedisCluster`), and
//! its failover: a primary killed with SIGKILL, its replica promoted by the
//! cluster (or told to take over with `CLUSTER FAILOVER TAKEOVER` when the
//! cluster is slow to), the killed node restarted to come back as the new
//! primary's replica.
//!
//! The testkit's cluster is driven with blocking calls (its processes, a
//! few RESP commands over TCP); here they run on tokio's blocking threads,
//! so the clients' load goes on while a failover is under way.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_testkit::redis::{RedisCluster, command};

/// How long the cluster is given to promote a dead primary's replica by
/// itself (its node timeout is 1 s) before the replica is told to take over.
const AUTO_FAILOVER: Duration = Duration::from_secs(5);

/// How long a failover, a restart or a rejoin may take before the trial
/// gives up with an error.
const LIMIT: Duration = Duration::from_secs(30);

/// How the killed primary's replica became primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Promotion {
    /// The cluster promoted it within [`AUTO_FAILOVER`].
    Automatic,
    /// It was told to with `CLUSTER FAILOVER TAKEOVER`.
    Takeover,
}

/// A failover, once the killed node is back as a replica.
#[derive(Debug)]
pub(super) struct Failover {
    /// How the replica was promoted.
    pub promotion: Promotion,
    /// From the kill to the replica reporting itself primary.
    pub promoted_after: Duration,
}

/// A private cluster; its servers are killed when it is dropped.
#[derive(Debug, Clone)]
pub(super) struct FailoverCluster {
    cluster: Arc<Mutex<RedisCluster>>,
    url: String,
}

impl FailoverCluster {
    /// Starts six `redis-server`s (`--cluster-enabled yes`, append-only
    /// file on, node timeout 1 s) and joins them as three primaries with a
    /// replica each, every replica in sync.
    pub(super) async fn start() -> anyhow::Result<Self> {
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(1))
            .await
            .context("the Redis Cluster could not be started")?
            .context("redis-server and redis-cli are needed (Debian's redis-server package)")?;
        let url = cluster.url();
        Ok(Self {
            cluster: Arc::new(Mutex::new(cluster)),
            url,
        })
    }

    /// `redis+cluster://` naming every node.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// Kills the `nth` primary (by port, modulo three), waits for its
    /// replica to be promoted (telling it to take over after
    /// [`AUTO_FAILOVER`]), waits `hold`, restarts the killed node and waits
    /// until it is the new primary's replica, in sync, and the cluster ok.
    pub(super) async fn fail_over(&self, nth: usize, hold: Duration) -> anyhow::Result<Failover> {
        let cluster = Arc::clone(&self.cluster);
        tokio::task::spawn_blocking(move || {
            let mut cluster = cluster.lock().unwrap_or_else(|p| p.into_inner());
            fail_over(&mut cluster, nth, hold)
        })
        .await
        .context("the failover's thread panicked")?
    }
}

fn fail_over(cluster: &mut RedisCluster, nth: usize, hold: Duration) -> anyhow::Result<Failover> {
    let ports = cluster.ports();
    let mut primaries: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|&port| cluster.role_of(port).as_deref() == Some("master"))
        .collect();
    primaries.sort_unstable();
    if primaries.len() != 3 {
        bail!("the cluster has {} primaries, not 3", primaries.len());
    }
    let victim_port = primaries[nth % 3];
    let replica = replica_of(victim_port)?;
    let victim = ports
        .iter()
        .position(|&port| port == victim_port)
        .context("the primary is one of the nodes")?;

    cluster.nodes()[victim].kill();
    let killed = Instant::now();
    let mut promotion = Promotion::Automatic;
    while cluster.role_of(replica).as_deref() != Some("master") {
        if promotion == Promotion::Automatic && killed.elapsed() >= AUTO_FAILOVER {
            promotion = Promotion::Takeover;
            let reply = command("127.0.0.1", replica, &["CLUSTER", "FAILOVER", "TAKEOVER"])
                .map_err(anyhow::Error::msg)?;
            if !reply.starts_with("+OK") {
                bail!("CLUSTER FAILOVER TAKEOVER on 127.0.0.1:{replica} answered {reply:?}");
            }
        }
        if killed.elapsed() >= LIMIT {
            bail!("the replica on 127.0.0.1:{replica} was not promoted within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let promoted_after = killed.elapsed();

    std::thread::sleep(hold);
    cluster.nodes()[victim].restart();
    let restarted = Instant::now();
    // Back as the new primary's replica, with its data.
    loop {
        let rejoined = cluster.role_of(victim_port).as_deref() == Some("slave")
            && replica_of(replica).is_ok_and(|port| port == victim_port)
            && every_node_ok(cluster);
        if rejoined {
            break;
        }
        if restarted.elapsed() >= LIMIT {
            bail!(
                "the killed primary (127.0.0.1:{victim_port}) did not come back as a replica in sync within {LIMIT:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Failover {
        promotion,
        promoted_after,
    })
}

/// The port of the replica a primary reports online (`INFO replication`:
/// `slave0:ip=…,port=…,state=online,…`).
fn replica_of(primary: u16) -> anyhow::Result<u16> {
    let info =
        command("127.0.0.1", primary, &["INFO", "replication"]).map_err(anyhow::Error::msg)?;
    info.lines()
        .filter(|line| line.starts_with("slave") && line.contains("state=online"))
        .find_map(|line| {
            line.split(',')
                .find_map(|field| field.strip_prefix("port="))
                .and_then(|port| port.trim().parse().ok())
        })
        .with_context(|| format!("the primary on 127.0.0.1:{primary} has no replica online"))
}

/// Whether every node that answers reports `cluster_state:ok`.
fn every_node_ok(cluster: &RedisCluster) -> bool {
    cluster.ports().iter().all(|&port| {
        command("127.0.0.1", port, &["CLUSTER", "INFO"])
            .is_ok_and(|info| info.contains("cluster_state:ok"))
    })
}
