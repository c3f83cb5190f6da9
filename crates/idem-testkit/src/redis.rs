//! Redis for tests: the machine's server (its URL and a key prefix of the
//! test's own), a private `redis-server` on a free port that a test can
//! kill and restart with its files kept (append-only file on, fsync on every
//! write), and a Redis Cluster of private servers (three primaries, with or
//! without a replica each) made with `redis-cli --cluster create`.
//!
//! The binaries are `$IDEM_REDIS_SERVER` and `$IDEM_REDIS_CLI`, else
//! `redis-server` and `redis-cli` on the `PATH`, as Debian's `redis-server`
//! package installs them. Everything is spoken over plain TCP here (a
//! `PING`, `CLUSTER INFO`), so this module needs no Redis client.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::nats::free_port;

/// The machine's Redis: `$IDEM_TEST_REDIS_URL`, else `redis://127.0.0.1:6379/0`.
pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned())
}

/// The machine's Redis Cluster (started by `scripts/services.sh` on ports
/// 7001-7003): `$IDEM_TEST_REDIS_CLUSTER_URL`, else
/// `redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003`.
pub fn redis_cluster_url() -> String {
    std::env::var("IDEM_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        "redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003".to_owned()
    })
}

/// The `(host, port)` of each node a `redis://` or `redis+cluster://` URL names.
pub fn nodes_of(url: &str) -> Vec<(String, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            let (host, port) = h.rsplit_once(':').unwrap_or((h, "6379"));
            (host.to_owned(), port.parse().unwrap_or(6379))
        })
        .collect()
}

/// Checks that the machine's Redis Cluster answers and is in
/// `cluster_state:ok`; `false` (after
/// [`missing_service`](crate::services::missing_service)) when it is not.
pub fn machine_cluster_answers() -> bool {
    let url = redis_cluster_url();
    let Some((host, port)) = nodes_of(&url).into_iter().next() else {
        crate::services::missing_service("Redis Cluster", &format!("{url} names no node"));
        return false;
    };
    match command(&host, port, &["CLUSTER", "INFO"]) {
        Ok(info) if info.contains("cluster_state:ok") => true,
        Ok(info) => {
            crate::services::missing_service(
                "Redis Cluster",
                &format!(
                    "{host}:{port} is not in cluster_state:ok ({}); run scripts/services.sh",
                    info.lines().nth(1).unwrap_or("")
                ),
            );
            false
        }
        Err(why) => {
            crate::services::missing_service(
                "Redis Cluster",
                &format!("{why} (run scripts/services.sh, or set IDEM_TEST_REDIS_CLUSTER_URL)"),
            );
            false
        }
    }
}

/// A key prefix no other test uses: `idem-test:<name>:<random>:`.
pub fn test_prefix(name: &str) -> String {
    format!("idem-test:{name}:{:016x}:", rand::random::<u64>())
}

/// Whether the server at `host:port` answers `PING`; on failure, why not.
pub fn ping(host: &str, port: u16) -> Result<(), String> {
    let reply = command(host, port, &["PING"])?;
    if reply.starts_with("+PONG") {
        Ok(())
    } else {
        Err(format!("{host}:{port} answered {reply:?} to PING"))
    }
}

/// Sends one command in RESP and returns the raw reply (as text, lossy).
pub fn command(host: &str, port: u16, args: &[&str]) -> Result<String, String> {
    let address = format!("{host}:{port}");
    let mut stream = TcpStream::connect(&address).map_err(|e| format!("{address}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{address}: {e}"))?;
    let mut reply = vec![0; 64 * 1024];
    let n = stream
        .read(&mut reply)
        .map_err(|e| format!("{address}: {e}"))?;
    Ok(String::from_utf8_lossy(&reply[..n]).into_owned())
}

/// Checks that the machine's Redis answers; `false` (after
/// [`missing_service`](crate::services::missing_service)) when it does not.
pub fn machine_redis_answers() -> bool {
    let url = redis_url();
    let (host, port) = nodes_of(&url)
        .into_iter()
        .next()
        .unwrap_or(("127.0.0.1".to_owned(), 6379));
    match ping(&host, port) {
        Ok(()) => true,
        Err(why) => {
            crate::services::missing_service(
                "Redis",
                &format!("{why} (run scripts/services.sh, or set IDEM_TEST_REDIS_URL)"),
            );
            false
        }
    }
}

fn binary(variable: &str, name: &str) -> Option<PathBuf> {
    if let Ok(path) = std::env::var(variable) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

/// A private `redis-server` on a free loopback port, in a directory of its
/// own that outlives its restarts. Killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    _owned: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// Starts a server with the append-only file on and fsynced on every
    /// write (`--appendonly yes --appendfsync always`), so a restart finds
    /// every acknowledged write; `None` (after
    /// [`missing_service`](crate::services::missing_service)) when no
    /// `redis-server` binary is found.
    pub fn start_durable() -> Option<Self> {
        Self::start(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    /// Starts a server with `args` added to the defaults (a free port,
    /// loopback, a directory of its own, no RDB snapshots).
    pub fn start(args: &[&str]) -> Option<Self> {
        let dir = tempfile::tempdir().expect("a directory for redis-server");
        let path = dir.path().to_owned();
        Self::start_in(&path, Some(dir), free_port(), args)
    }

    fn start_in(
        dir: &Path,
        owned: Option<tempfile::TempDir>,
        port: u16,
        args: &[&str],
    ) -> Option<Self> {
        if binary("IDEM_REDIS_SERVER", "redis-server").is_none() {
            crate::services::missing_service(
                "redis-server",
                "no redis-server binary (install Debian's redis-server, or set IDEM_REDIS_SERVER)",
            );
            return None;
        }
        let mut server = Self {
            child: None,
            port,
            dir: dir.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            _owned: owned,
        };
        server.launch();
        Some(server)
    }

    fn launch(&mut self) {
        let binary = binary("IDEM_REDIS_SERVER", "redis-server").expect("redis-server");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .expect("the server's log");
        let child = Command::new(binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log, twice"))
            .stderr(log)
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ping("127.0.0.1", self.port).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("redis-server exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer within 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server at once (`SIGKILL`: no shutdown, no final save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port and files.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Its directory (the append-only file, its log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The end of its log.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        text[start..].to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback port for a cluster node: its bus port, 10000 above it,
/// must be free too and below 65536, which the system's ephemeral ports
/// (up to 60999) do not ensure.
fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = 20_000 + rand::random::<u16>() % 20_000;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free pair of loopback ports (PORT and PORT + 10000) between 20000 and 50000");
}

/// A Redis Cluster of private servers: three primaries, each with
/// `replicas` replicas, on free loopback ports. Killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts the servers with `--cluster-enabled yes` (and a node timeout of
    /// one second, so a failover takes seconds) and joins them with
    /// `redis-cli --cluster create`; `None` (after
    /// [`missing_service`](crate::services::missing_service)) when
    /// `redis-server` or `redis-cli` is missing.
    pub fn start(replicas: usize) -> Option<Self> {
        let Some(cli) = binary("IDEM_REDIS_CLI", "redis-cli") else {
            crate::services::missing_service(
                "redis-cli",
                "no redis-cli binary (install Debian's redis-tools, or set IDEM_REDIS_CLI)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("a directory for the cluster");
        let mut nodes = Vec::new();
        for i in 0..3 * (1 + replicas) {
            let node_dir = dir.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir).expect("a node's directory");
            nodes.push(RedisServer::start_in(
                &node_dir,
                None,
                free_cluster_port(),
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--appendonly",
                    "yes",
                ],
            )?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Self { nodes, _dir: dir };
        cluster.wait_until_ok(Duration::from_secs(30));
        // A replica is of use once it has the primary's data: wait until
        // every primary reports each of its replicas online.
        let deadline = Instant::now() + Duration::from_secs(60);
        while replicas > 0 && !cluster.replicas_online(replicas) {
            assert!(
                Instant::now() < deadline,
                "the cluster's replicas did not come online within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(cluster)
    }

    /// Whether every primary reports at least `replicas` replicas online.
    fn replicas_online(&self, replicas: usize) -> bool {
        self.nodes
            .iter()
            .filter_map(|n| command("127.0.0.1", n.port(), &["INFO", "replication"]).ok())
            .filter(|info| info.contains("role:master"))
            .all(|info| info.matches("state=online").count() >= replicas)
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub fn wait_until_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                command("127.0.0.1", n.port(), &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...` naming every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The port of each node, in the order they were started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The nodes, in the order they were started (the first three are the
    /// primaries `redis-cli --cluster create` chose first).
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The role the node on `port` reports (`master` or `slave`, from
    /// `ROLE`), if it answers.
    pub fn role_of(&self, port: u16) -> Option<String> {
        let info = command("127.0.0.1", port, &["ROLE"]).ok()?;
        info.lines().nth(2).map(|role| role.trim().to_owned())
    }
}
