//! A Kafka-protocol broker of the test's own: `tansu` on a free loopback
//! port, its records in a SQLite file in a temporary directory, so a test
//! can kill and restart it without touching the shared broker.
//!
//! A broker may advertise another address than the one it listens on (a
//! TLS proxy's in front of it): clients that bootstrap through that address
//! are sent back to it by the metadata.
//!
//! The binary is `IDEM_TEST_TANSU`, or `tansu/bin/tansu` in the services
//! cache (`IDEM_CACHE`, default `~/.cache/idem`), where the services script
//! installs it. A missing binary skips the test, or fails it when
//! `IDEM_REQUIRE_SERVICES` is set.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting broker may take to answer.
const START: Duration = Duration::from_secs(20);

/// A running (or killed) tansu broker on its own port and file.
pub(crate) struct Tansu {
    binary: PathBuf,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    /// The address the metadata gives clients (`addr` unless a proxy is in
    /// front).
    advertised: SocketAddr,
    child: Option<Child>,
    /// Whether clients must authenticate (SASL).
    authentication: bool,
}

fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("IDEM_TEST_TANSU") {
        return path.into();
    }
    let cache = std::env::var_os("IDEM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/idem")
        });
    cache.join("tansu/bin/tansu")
}

impl Tansu {
    /// Starts a broker on a free port and waits until it answers, or `None`
    /// when there is no tansu binary.
    pub(crate) async fn start() -> Option<Self> {
        Self::start_at(None, None).await
    }

    /// Starts a broker on `addr` (a free port when `None`) that tells
    /// clients to connect to `advertised` (its own address when `None`).
    pub(crate) async fn start_at(
        addr: Option<SocketAddr>,
        advertised: Option<SocketAddr>,
    ) -> Option<Self> {
        let binary = binary();
        if !binary.is_file() {
            idem_testkit::services::missing_service(
                "tansu (a Kafka-protocol broker)",
                &format!("no binary at {}", binary.display()),
            );
            return None;
        }
        let addr = addr.unwrap_or_else(free_port);
        let mut broker = Self {
            binary,
            dir: tempfile::tempdir().expect("a data directory"),
            addr,
            advertised: advertised.unwrap_or(addr),
            child: None,
            authentication: false,
        };
        broker.restart().await;
        Some(broker)
    }

    /// Starts a broker that requires SASL authentication, with these users
    /// (name, password) for SCRAM-SHA-256 and SCRAM-SHA-512, or `None` when
    /// there is no tansu binary.
    pub(crate) async fn start_with_users(users: &[(&str, &str)]) -> Option<Self> {
        Self::start_with_users_at(users, None, None).await
    }

    /// Like [`start_with_users`](Self::start_with_users), on `addr`, telling
    /// clients to connect to `advertised` (as [`start_at`](Self::start_at)).
    /// tansu makes users through the broker itself,
    /// which refuses them once it requires authentication: they are made on
    /// an open broker over the same file (reached at its own address), which
    /// then restarts requiring it.
    pub(crate) async fn start_with_users_at(
        users: &[(&str, &str)],
        addr: Option<SocketAddr>,
        advertised: Option<SocketAddr>,
    ) -> Option<Self> {
        let mut broker = Self::start_at(addr, advertised).await?;
        for (name, password) in users {
            for mechanism in ["scram256", "scram512"] {
                let output = Command::new(&broker.binary)
                    .args(["user", "create", "--mechanism", mechanism])
                    .args(["--broker", &format!("tcp://{}", broker.addr)])
                    .args([name, password])
                    .current_dir(broker.dir.path())
                    .stdin(Stdio::null())
                    .output()
                    .unwrap_or_else(|e| panic!("run {}: {e}", broker.binary.display()));
                assert!(
                    output.status.success(),
                    "tansu user create --mechanism {mechanism} {name}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        broker.kill();
        broker.authentication = true;
        broker.restart().await;
        Some(broker)
    }

    /// `host:port`, for `bootstrap.servers`.
    pub(crate) fn brokers(&self) -> String {
        self.addr.to_string()
    }

    /// Kills the broker (SIGKILL) and waits until it is gone.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker on the same port and file (after [`kill`](Self::kill))
    /// and waits until it answers.
    pub(crate) async fn restart(&mut self) {
        assert!(self.child.is_none(), "the broker is running");
        let url = format!("tcp://{}", self.addr);
        let advertised = format!("tcp://{}", self.advertised);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("tansu.log"))
            .expect("the broker's log file");
        let mut command = Command::new(&self.binary);
        command.arg("broker");
        if self.authentication {
            command.arg("--authentication");
        }
        let child = command
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the broker's log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + START;
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("tansu exited at start ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "tansu did not answer on {} within {START:?}: {}",
                self.addr,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The broker's output so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }
}

/// A loopback address nothing listens on now.
pub(crate) fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.kill();
    }
}
