//! A RabbitMQ cluster of a test binary's own: three `rabbitmq-server` nodes
//! beside the machine's broker (which is never touched), joined into one
//! cluster, to kill with SIGKILL and restart one at a time while a consumer
//! or the relay works against the cluster's node list.
//!
//! Production runs RabbitMQ this way: three nodes, quorum queues replicated
//! on all of them (a Raft group per queue, its leader ordering the queue's
//! writes), clients given every node's address. A single node in a test
//! shows none of what a client meets there: its connection lost with its
//! node, a queue without a leader for the moment an election takes, a node
//! catching up after a restart.
//!
//! Each node has its own node name (`idem-a-<pid>@localhost`), AMQP and
//! distribution ports (free ones), database, logs and configuration in a
//! temporary directory, no plugins, and the cluster's one Erlang cookie in a
//! `HOME` they share with `rabbitmqctl`. The three boot at once; the second
//! and third then join the first (`stop_app`, `join_cluster`, `start_app`),
//! and the cluster is up when `cluster_status` lists three running nodes.
//! That takes 15 to 30 seconds, so a test binary starts one cluster and its
//! tests take turns on it ([`RabbitCluster::shared`]). When it cannot start
//! (no `rabbitmq-server`, no cluster within two minutes) that is a missing
//! service: a skip, or a panic with the reason and the nodes' log tails when
//! `IDEM_REQUIRE_SERVICES` is set.
//!
//! Every node runs under a small shell that reads its standard input and
//! kills the node's process group when that closes: the nodes go with the
//! test process however it ends, a cluster kept in a `static` included. A
//! static is never dropped, so its directory stays behind; the next cluster
//! to start removes those whose process has ended.
//!
//! The server script is `$IDEM_RABBITMQ_SERVER`, else
//! `/usr/lib/rabbitmq/bin/rabbitmq-server`; `rabbitmqctl` and
//! `rabbitmq-queues` are taken from the same directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, OwnedMutexGuard};

/// How many nodes the cluster has.
pub const NODES: usize = 3;

/// How long the cluster may take to start, and a restarted node to run
/// again.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// The shell each node runs under: the server in the background, and the
/// whole process group killed when standard input closes (the test process
/// ended) — `$0` is the server script.
const WATCHER: &str = "\"$0\" </dev/null & read -r _; kill -KILL 0";

/// What a cluster's temporary directory is named from, so that one left
/// behind can be found.
const DIR_PREFIX: &str = "idem-rabbitmq-cluster-";

/// A running three-node cluster; every node is killed on drop.
#[derive(Debug)]
pub struct RabbitCluster {
    dir: tempfile::TempDir,
    server: PathBuf,
    nodes: Vec<Node>,
    started_in: Duration,
}

#[derive(Debug)]
struct Node {
    /// `idem-a-<pid>@localhost`.
    name: String,
    /// AMQP, at 127.0.0.1.
    port: u16,
    /// Erlang distribution (the other nodes and `rabbitmqctl` come here).
    dist_port: u16,
    /// The watcher shell, leader of the node's process group; `None` while
    /// killed.
    child: Option<Child>,
}

/// The cluster a test binary shares: started by the first test that asks.
static SHARED: OnceLock<Arc<Mutex<Option<RabbitCluster>>>> = OnceLock::new();

/// A test's turn on the shared cluster (a [`RabbitCluster`] through
/// `Deref`): the tests of a binary take turns, so that a node one kills is
/// never under another.
#[derive(Debug)]
pub struct SharedCluster(OwnedMutexGuard<Option<RabbitCluster>>);

impl std::ops::Deref for SharedCluster {
    type Target = RabbitCluster;

    fn deref(&self) -> &RabbitCluster {
        self.0.as_ref().expect("a started cluster")
    }
}

impl std::ops::DerefMut for SharedCluster {
    fn deref_mut(&mut self) -> &mut RabbitCluster {
        self.0.as_mut().expect("a started cluster")
    }
}

impl RabbitCluster {
    /// The test binary's cluster, started on first use, with every node
    /// running; the guard is this test's turn. `None` (after
    /// [`missing_service`](crate::services::missing_service)) when it cannot
    /// start. A node an earlier test left killed is restarted first.
    pub async fn shared() -> Option<SharedCluster> {
        let cell = SHARED.get_or_init(|| Arc::new(Mutex::new(None))).clone();
        let mut turn = cell.lock_owned().await;
        match turn.as_mut() {
            Some(cluster) => {
                for node in 0..NODES {
                    if !cluster.is_running(node) {
                        cluster.restart(node).await;
                    }
                }
            }
            None => *turn = Some(Self::start().await?),
        }
        Some(SharedCluster(turn))
    }

    /// Starts three nodes of a cluster of the caller's own; `None` (after
    /// [`missing_service`](crate::services::missing_service)) when it
    /// cannot.
    pub async fn start() -> Option<Self> {
        let began = Instant::now();
        let server = std::env::var_os("IDEM_RABBITMQ_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/usr/lib/rabbitmq/bin/rabbitmq-server".into());
        if !server.is_file() {
            crate::services::missing_service(
                "a RabbitMQ cluster",
                &format!("no {} (set IDEM_RABBITMQ_SERVER)", server.display()),
            );
            return None;
        }
        remove_stale_directories();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .expect("a directory for the RabbitMQ cluster");
        std::fs::write(dir.path().join("owner"), std::process::id().to_string())
            .expect("the cluster's owner");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("the cluster's HOME");
        let cookie = home.join(".erlang.cookie");
        std::fs::write(&cookie, format!("IDEMCLUSTER{:x}", rand::random::<u64>()))
            .expect("the Erlang cookie");
        // Erlang refuses a cookie file others may read.
        std::fs::set_permissions(&cookie, std::os::unix::fs::PermissionsExt::from_mode(0o400))
            .expect("the cookie's mode");
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").expect("the plugin list");
        std::fs::write(dir.path().join("rabbitmq-env.conf"), "").expect("an empty env file");
        let mut ports = Vec::new();
        while ports.len() < NODES * 2 {
            let port = crate::nats::free_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let pid = std::process::id();
        let nodes = ports
            .chunks(2)
            .zip(["a", "b", "c"])
            .map(|(ports, letter)| Node {
                name: format!("idem-{letter}-{pid}@localhost"),
                port: ports[0],
                dist_port: ports[1],
                child: None,
            })
            .collect();
        let mut cluster = Self {
            dir,
            server,
            nodes,
            started_in: Duration::ZERO,
        };
        for node in 0..NODES {
            cluster.write_config(node);
            cluster.spawn(node);
        }
        match cluster.form().await {
            Ok(()) => {
                cluster.started_in = began.elapsed();
                Some(cluster)
            }
            Err(why) => {
                let logs: String = (0..NODES)
                    .map(|node| {
                        format!(
                            "\n--- {} ---\n{}",
                            cluster.nodes[node].name,
                            cluster.log(node)
                        )
                    })
                    .collect();
                crate::services::missing_service(
                    "a three-node RabbitMQ cluster",
                    &format!("it did not form: {why}{logs}"),
                );
                None
            }
        }
    }

    /// How long [`start`](Self::start) took, from nothing to three running
    /// nodes in one cluster.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The client URL with every node, as `idem forward --from` and a
    /// destination take it (vhost `/`):
    /// `amqp://guest:guest@127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2/%2f`.
    pub fn url(&self) -> String {
        self.url_in((0..NODES).collect::<Vec<_>>().as_slice())
    }

    /// The client URL of the nodes listed, in that order.
    pub fn url_in(&self, order: &[usize]) -> String {
        let nodes: Vec<String> = order
            .iter()
            .map(|&node| format!("127.0.0.1:{}", self.nodes[node].port))
            .collect();
        format!("amqp://guest:guest@{}/%2f", nodes.join(","))
    }

    /// The AMQP port of a node, at 127.0.0.1.
    pub fn port(&self, node: usize) -> u16 {
        self.nodes[node].port
    }

    /// The Erlang node name of a node (`idem-a-<pid>@localhost`): what
    /// RabbitMQ names a queue's leader by.
    pub fn name(&self, node: usize) -> &str {
        &self.nodes[node].name
    }

    /// Whether a node is running (not killed).
    pub fn is_running(&self, node: usize) -> bool {
        self.nodes[node].child.is_some()
    }

    /// Kills a node's whole process group with SIGKILL: no goodbye to its
    /// clients or its peers; its database stays for
    /// [`restart`](Self::restart).
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again on its ports and database, and waits until
    /// the cluster lists it running again (it has rejoined its peers);
    /// returns how long that took. Panics, with its log, if it does not
    /// within two minutes.
    pub async fn restart(&mut self, node: usize) -> Duration {
        assert!(
            !self.is_running(node),
            "{} is running",
            self.nodes[node].name
        );
        let started = Instant::now();
        self.spawn(node);
        let deadline = started + READY_WITHIN;
        loop {
            let listening = tokio::net::TcpStream::connect(("127.0.0.1", self.nodes[node].port))
                .await
                .is_ok();
            if listening && self.running_nodes(node).await.len() == self.running_count() {
                return started.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not run again within {READY_WITHIN:?} of its restart:\n{}",
                self.nodes[node].name,
                self.log(node)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The node that leads quorum queue `queue` (vhost `/`) now, as a
    /// running node's `rabbitmqctl list_queues name leader` answers; `None`
    /// while it has no leader that is a node of this cluster.
    pub async fn queue_leader(&self, queue: &str) -> Option<usize> {
        let row = self.queue_row(queue, "leader").await?;
        let leader = row.get("leader")?.as_str()?;
        self.nodes.iter().position(|node| node.name == leader)
    }

    /// Queue `queue`'s (vhost `/`) row of `rabbitmqctl list_queues name
    /// <column>`, as a running node answers it; `None` when none answers or
    /// the queue is not listed.
    async fn queue_row(&self, queue: &str, column: &str) -> Option<serde_json::Value> {
        let asked = (0..NODES).find(|&node| self.is_running(node))?;
        let output = self
            .ctl(
                asked,
                &[
                    "list_queues",
                    "-p",
                    "/",
                    "name",
                    column,
                    "--formatter",
                    "json",
                ],
            )
            .await
            .ok()?;
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&output).ok()?;
        rows.into_iter().find(|row| row["name"] == queue)
    }

    /// Waits (at most a minute) until `queue` has a leader other than
    /// `not`, and returns it with how long that took.
    pub async fn await_queue_leader(&self, queue: &str, not: Option<usize>) -> (usize, Duration) {
        let started = Instant::now();
        loop {
            if let Some(leader) = self.queue_leader(queue).await
                && Some(leader) != not
                && self.is_running(leader)
            {
                return (leader, started.elapsed());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "quorum queue {queue} had no new leader within a minute"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The node a client connection named `name` (its `connection_name`
    /// client property) arrived at, found by the AMQP port it connected to;
    /// `None` when no running node lists it.
    pub async fn connection_node(&self, name: &str) -> Option<usize> {
        for asked in (0..NODES).filter(|&node| self.is_running(node)) {
            let Ok(output) = self
                .ctl(
                    asked,
                    &[
                        "list_connections",
                        "port",
                        "client_properties",
                        "--formatter",
                        "json",
                    ],
                )
                .await
            else {
                continue;
            };
            let rows: Vec<serde_json::Value> = serde_json::from_slice(&output).unwrap_or_default();
            for row in rows {
                if row["client_properties"].to_string().contains(name) {
                    let port = row["port"].as_u64()?;
                    return self
                        .nodes
                        .iter()
                        .position(|node| u64::from(node.port) == port);
                }
            }
        }
        None
    }

    /// How many messages queue `queue` (vhost `/`) holds, ready and
    /// unacknowledged together.
    pub async fn queue_messages(&self, queue: &str) -> Option<u64> {
        self.queue_row(queue, "messages").await?["messages"].as_u64()
    }

    /// The tail of what a node wrote: its standard output and its log file.
    pub fn log(&self, node: usize) -> String {
        let name = &self.nodes[node].name;
        let dir = self.node_dir(node);
        let out = std::fs::read_to_string(dir.join("out.log")).unwrap_or_default();
        let log = std::fs::read_to_string(dir.join("log").join(format!("{name}.log")))
            .unwrap_or_default();
        format!("{}\n{}", tail(&out, 20), tail(&log, 40))
    }

    fn running_count(&self) -> usize {
        (0..NODES).filter(|&node| self.is_running(node)).count()
    }

    fn node_dir(&self, node: usize) -> PathBuf {
        self.dir.path().join(&self.nodes[node].name)
    }

    fn write_config(&self, node: usize) {
        let dir = self.node_dir(node);
        for sub in ["mnesia", "log"] {
            std::fs::create_dir_all(dir.join(sub)).expect("a node's directory");
        }
        let config = format!(
            "listeners.tcp.default = 127.0.0.1:{}\nloopback_users = none\n",
            self.nodes[node].port
        );
        std::fs::write(dir.join("rabbitmq.conf"), config).expect("a node's configuration");
    }

    /// Starts a node under its watcher shell, in a process group of its own.
    fn spawn(&mut self, node: usize) {
        let dir = self.node_dir(node);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("out.log"))
            .expect("the node's output file");
        let Node {
            name,
            port,
            dist_port,
            ..
        } = &self.nodes[node];
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHER])
            .arg(&self.server)
            .env("HOME", self.dir.path().join("home"))
            .env(
                "RABBITMQ_CONF_ENV_FILE",
                self.dir.path().join("rabbitmq-env.conf"),
            )
            .env("RABBITMQ_NODENAME", name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.path().join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", dir.join("pid"))
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("the output file, twice"))
            .stderr(out);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        self.nodes[node].child = Some(command.spawn().expect("start rabbitmq-server"));
    }

    /// Waits for the three nodes to boot, joins the second and third to the
    /// first, and waits until the first lists three running nodes.
    async fn form(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        for node in 0..NODES {
            self.booted(node, deadline).await?;
        }
        let first = self.nodes[0].name.clone();
        for node in 1..NODES {
            for step in [
                vec!["stop_app"],
                vec!["join_cluster", first.as_str()],
                vec!["start_app"],
            ] {
                self.ctl(node, &step).await.map_err(|why| {
                    format!("{} {}: {why}", self.nodes[node].name, step.join(" "))
                })?;
            }
        }
        loop {
            let running = self.running_nodes(0).await;
            if running.len() == NODES {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("cluster_status lists {running:?} running"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until a node accepts AMQP connections (the last step of its
    /// boot); an error when its process ended or the deadline passed.
    async fn booted(&mut self, node: usize, deadline: Instant) -> Result<(), String> {
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.nodes[node].port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(child) = self.nodes[node].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("{} exited ({status})", self.nodes[node].name));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not listen within {READY_WITHIN:?}",
                    self.nodes[node].name
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The nodes `cluster_status` on `asked` lists as running.
    async fn running_nodes(&self, asked: usize) -> Vec<String> {
        let Ok(output) = self
            .ctl(asked, &["cluster_status", "--formatter", "json"])
            .await
        else {
            return Vec::new();
        };
        serde_json::from_slice::<serde_json::Value>(&output)
            .ok()
            .and_then(|status| {
                status["running_nodes"].as_array().map(|nodes| {
                    nodes
                        .iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// Runs `rabbitmqctl -n NODE ARGS...` off the runtime's threads; its
    /// standard output, or what it said when it failed.
    async fn ctl(&self, node: usize, args: &[&str]) -> Result<Vec<u8>, String> {
        let tool = self.tool("rabbitmqctl");
        let mut command = Command::new(tool);
        command
            .env("HOME", self.dir.path().join("home"))
            .args(["-q", "-n", &self.nodes[node].name])
            .args(args);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("rabbitmqctl: {e}"))?;
        checked(output)
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.server
            .parent()
            .unwrap_or(Path::new("/usr/lib/rabbitmq/bin"))
            .join(name)
    }
}

fn checked(output: Output) -> Result<Vec<u8>, String> {
    if output.status.success() {
        Ok(output.stdout)
    } else {
        Err(format!(
            "{}: {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        ))
    }
}

/// Removes the directories of clusters whose test process has ended.
fn remove_stale_directories() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(DIR_PREFIX));
        let owner = std::fs::read_to_string(path.join("owner"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok());
        if let (true, Some(pid)) = (ours, owner)
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        for node in 0..NODES {
            self.kill(node);
        }
    }
}
