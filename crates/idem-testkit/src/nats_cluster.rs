//! A NATS JetStream cluster of a test's own: three `nats-server` processes
//! on free loopback ports, routed to each other (`cluster { routes }`),
//! JetStream on each with a store directory of its own, to kill (SIGKILL)
//! and restart one node at a time while a consumer or the relay works
//! against the cluster's server list.
//!
//! Production runs JetStream this way: streams replicated on three servers
//! (R3), each stream's writes ordered by its RAFT leader, clients given
//! every server's address. A single server in a test shows none of what a
//! client meets there: a connection moving to another server, a stream
//! without a leader for the seconds an election takes, a node catching up
//! after a restart.
//!
//! The cluster counts as up when every running node's `/healthz` answers ok
//! (JetStream current, a meta leader known) and an R3 stream can be created
//! and deleted. When it cannot start (no binary, no quorum within a minute)
//! [`NatsCluster::start`] reports a missing service: a skip, or a panic with
//! the reason and the nodes' logs when `IDEM_REQUIRE_SERVICES` is set.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How many servers the cluster has.
pub const NODES: usize = 3;

/// The connection name of the clients this module makes, so a test can tell
/// them from its own in [`NatsCluster::connections`].
pub const ADMIN_CLIENT: &str = "idem-testkit-admin";

/// How long the cluster (or a restarted node) has to become healthy.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A running three-node cluster; every node is killed on drop.
#[derive(Debug)]
pub struct NatsCluster {
    dir: tempfile::TempDir,
    binary: PathBuf,
    nodes: Vec<Node>,
}

#[derive(Debug)]
struct Node {
    /// Clients connect here.
    port: u16,
    /// The other servers route here.
    route_port: u16,
    /// `/healthz` and `/connz`.
    monitor_port: u16,
    /// `None` while killed.
    child: Option<Child>,
}

/// A client connection a node reports (`/connz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConnection {
    /// The name the client gave (empty when none).
    pub name: String,
    /// The client library's language (`rust` for async-nats).
    pub lang: String,
    /// How many subscriptions it holds.
    pub subscriptions: u64,
}

impl NatsCluster {
    /// Starts three nodes and waits until the cluster is healthy; `None`
    /// (after [`missing_service`](crate::services::missing_service)) when it
    /// cannot.
    pub async fn start() -> Option<Self> {
        let Some(binary) = crate::nats::binary() else {
            crate::services::missing_service(
                "a NATS cluster",
                "no nats-server binary (set IDEM_NATS_SERVER, or put it on the PATH)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("a directory for the NATS cluster");
        let mut ports = Vec::new();
        while ports.len() < NODES * 3 {
            let port = crate::nats::free_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let nodes: Vec<Node> = ports
            .chunks(3)
            .map(|p| Node {
                port: p[0],
                route_port: p[1],
                monitor_port: p[2],
                child: None,
            })
            .collect();
        let mut cluster = Self { dir, binary, nodes };
        for node in 0..NODES {
            cluster.write_config(node);
            cluster.spawn(node);
        }
        match cluster.ready().await {
            Ok(()) => Some(cluster),
            Err(why) => {
                let logs: String = (0..NODES)
                    .map(|node| format!("\n--- n{node} ---\n{}", tail(&cluster.log(node))))
                    .collect();
                crate::services::missing_service(
                    "a three-node NATS cluster",
                    &format!("it did not become healthy: {why}{logs}"),
                );
                None
            }
        }
    }

    /// The client URL with every node: `nats://127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2`.
    pub fn url(&self) -> String {
        let servers: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("nats://{}", servers.join(","))
    }

    /// The client URL of one node alone.
    pub fn node_url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[node].port)
    }

    /// The server name of a node (`n0`, `n1`, `n2`): what JetStream names a
    /// stream's leader by.
    pub fn name(node: usize) -> String {
        format!("n{node}")
    }

    /// Whether a node is running (not killed).
    pub fn is_running(&self, node: usize) -> bool {
        self.nodes[node].child.is_some()
    }

    /// A client of the cluster, named [`ADMIN_CLIENT`], given every node.
    pub async fn client(&self) -> async_nats::Client {
        self.client_named(ADMIN_CLIENT).await
    }

    /// A client of the cluster named `name` (its connection in
    /// [`connections`](Self::connections)), given every node.
    pub async fn client_named(&self, name: &str) -> async_nats::Client {
        let servers: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("nats://127.0.0.1:{}", node.port))
            .collect();
        async_nats::ConnectOptions::new()
            .name(name)
            .connect(servers.as_slice())
            .await
            .expect("connect to the NATS cluster")
    }

    /// Kills a node with SIGKILL: no lame-duck mode, no goodbye to its
    /// clients or routes; its store directory stays for [`restart`](Self::restart).
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again on its ports and store, and waits until it
    /// is healthy (it has caught up with the meta leader and its streams);
    /// returns how long that took. Panics, with its log, if it does not
    /// within a minute.
    pub async fn restart(&mut self, node: usize) -> Duration {
        assert!(!self.is_running(node), "n{node} is running");
        let started = Instant::now();
        self.spawn(node);
        let deadline = started + READY_WITHIN;
        loop {
            match self.healthz(node).await {
                Ok(()) => return started.elapsed(),
                Err(why) if Instant::now() > deadline => panic!(
                    "n{node} was not healthy a minute after its restart ({why}):\n{}",
                    tail(&self.log(node))
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            if let Some(status) = self.exited(node) {
                panic!(
                    "n{node} exited after its restart ({status}):\n{}",
                    tail(&self.log(node))
                );
            }
        }
    }

    /// The node that leads `stream` now, as `$JS.API.STREAM.INFO.<stream>`
    /// answers (`cluster.leader`); `None` while it has no leader or the
    /// request fails.
    pub async fn stream_leader(&self, stream: &str) -> Option<usize> {
        let client = tokio::time::timeout(Duration::from_secs(5), self.client())
            .await
            .ok()?;
        let mut js = jetstream::new(client);
        js.set_timeout(Duration::from_secs(2));
        let info = js.get_stream(stream).await.ok()?.cached_info().clone();
        let leader = info.cluster?.leader?;
        (0..NODES).find(|&node| Self::name(node) == leader)
    }

    /// The node that leads the durable consumer `consumer` of `stream` now
    /// (`$JS.API.CONSUMER.INFO.<stream>.<consumer>` → `cluster.leader`): a
    /// replicated consumer has a RAFT group, and a leader, of its own.
    pub async fn consumer_leader(&self, stream: &str, consumer: &str) -> Option<usize> {
        let client = tokio::time::timeout(Duration::from_secs(5), self.client())
            .await
            .ok()?;
        let mut js = jetstream::new(client);
        js.set_timeout(Duration::from_secs(2));
        let found = js.get_stream(stream).await.ok()?;
        let info = found.consumer_info(consumer).await.ok()?;
        let leader = info.cluster.as_ref()?.leader.clone()?;
        (0..NODES).find(|&node| Self::name(node) == leader)
    }

    /// Waits until `stream` has a leader other than `not` (a node just
    /// killed), and returns it and how long the wait took. Panics after a
    /// minute.
    pub async fn await_stream_leader(&self, stream: &str, not: Option<usize>) -> (usize, Duration) {
        let started = Instant::now();
        loop {
            if let Some(leader) = self.stream_leader(stream).await
                && Some(leader) != not
            {
                return (leader, started.elapsed());
            }
            assert!(
                started.elapsed() < READY_WITHIN,
                "stream {stream} had no leader but n{not:?} for a minute"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The client connections a running node holds now (`/connz`).
    pub async fn connections(&self, node: usize) -> Vec<ClientConnection> {
        let Ok((200, body)) = http_get(self.nodes[node].monitor_port, "/connz?subs=1").await else {
            return Vec::new();
        };
        let Ok(connz) = serde_json::from_str::<serde_json::Value>(&body) else {
            return Vec::new();
        };
        connz["connections"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|c| ClientConnection {
                        name: c["name"].as_str().unwrap_or_default().to_owned(),
                        lang: c["lang"].as_str().unwrap_or_default().to_owned(),
                        subscriptions: c["subscriptions"].as_u64().unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What a node wrote to its log so far, restarts included.
    pub fn log(&self, node: usize) -> String {
        std::fs::read_to_string(self.log_file(node)).unwrap_or_default()
    }

    /// Every running node healthy and an R3 stream made and deleted, or why not.
    async fn ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        let mut why = String::from("not asked yet");
        while Instant::now() < deadline {
            for node in 0..NODES {
                if let Some(status) = self.exited(node) {
                    return Err(format!("n{node} exited ({status})"));
                }
            }
            match self.probe().await {
                Ok(()) => return Ok(()),
                Err(error) => why = error,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(why)
    }

    async fn probe(&self) -> Result<(), String> {
        for node in (0..NODES).filter(|&node| self.is_running(node)) {
            self.healthz(node).await?;
        }
        let client = tokio::time::timeout(Duration::from_secs(5), self.client())
            .await
            .map_err(|_| "no node accepted a client within 5 s".to_owned())?;
        let mut js = jetstream::new(client);
        js.set_timeout(Duration::from_secs(5));
        let probe = "IDEM_CLUSTER_PROBE";
        js.create_stream(jetstream::stream::Config {
            name: probe.into(),
            subjects: vec!["idem-cluster-probe".into()],
            num_replicas: NODES,
            ..jetstream::stream::Config::default()
        })
        .await
        .map_err(|e| format!("an R3 stream could not be created: {e}"))?;
        js.delete_stream(probe)
            .await
            .map_err(|e| format!("the R3 probe stream could not be deleted: {e}"))?;
        Ok(())
    }

    /// `/healthz` of one node: ok once its JetStream is current.
    async fn healthz(&self, node: usize) -> Result<(), String> {
        match http_get(self.nodes[node].monitor_port, "/healthz").await {
            Ok((200, _)) => Ok(()),
            Ok((status, body)) => Err(format!("n{node} /healthz: {status} {}", body.trim())),
            Err(error) => Err(format!("n{node} /healthz: {error}")),
        }
    }

    /// How a node that should run exited, if it did.
    fn exited(&mut self, node: usize) -> Option<std::process::ExitStatus> {
        self.nodes[node]
            .child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    fn write_config(&self, node: usize) {
        let me = &self.nodes[node];
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != node)
            .map(|(_, other)| format!("\"nats-route://127.0.0.1:{}\"", other.route_port))
            .collect();
        let store = self.dir.path().join(Self::name(node));
        let text = format!(
            "server_name: {name}\n\
             listen: \"127.0.0.1:{port}\"\n\
             http: \"127.0.0.1:{monitor}\"\n\
             jetstream {{ store_dir: {store:?}, max_memory_store: 67108864, max_file_store: 1073741824 }}\n\
             cluster {{\n  name: idem-test\n  listen: \"127.0.0.1:{route}\"\n  routes: [{routes}]\n}}\n",
            name = Self::name(node),
            port = me.port,
            monitor = me.monitor_port,
            store = store.display().to_string(),
            route = me.route_port,
            routes = routes.join(", "),
        );
        std::fs::write(self.config_file(node), text).expect("write a node's configuration");
    }

    fn spawn(&mut self, node: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file(node))
            .expect("a node's log");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(self.config_file(node))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log, twice"))
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        self.nodes[node].child = Some(child);
    }

    fn config_file(&self, node: usize) -> PathBuf {
        self.dir.path().join(format!("n{node}.conf"))
    }

    fn log_file(&self, node: usize) -> PathBuf {
        self.dir.path().join(format!("n{node}.log"))
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in 0..self.nodes.len() {
            self.kill(node);
        }
    }
}

/// The last lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `GET path` on the monitoring port: the status and the body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .map_err(|_| "no answer within 3 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {head:?}"))?;
    Ok((status, body.to_owned()))
}
