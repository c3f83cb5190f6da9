//! A private PostgreSQL primary with a synchronous standby, for tests of a
//! failover: the primary is crashed, the standby promoted, and a client
//! given both hosts must carry on against the new primary.
//!
//! [`PgCluster::start`] runs `initdb` for the primary (trust authentication,
//! loopback only, `synchronous_standby_names = '*'`), starts it on a free
//! loopback port, makes the standby with `pg_basebackup -R` (streaming
//! replication, `standby.signal`), starts it on another free port, and waits
//! until the primary reports it as its synchronous standby: from then on a
//! commit the primary acknowledges is on the standby too. Both servers are
//! stopped and their directory removed when the value is dropped.
//!
//! As with [`TlsPostgres`](crate::tls_postgres::TlsPostgres), a test run as
//! root runs the servers as the `postgres` system user, the programs are
//! looked for under `/usr/lib/postgresql/VERSION/bin` (or in
//! `IDEM_TEST_POSTGRES_BIN`), and a cluster that cannot start skips the test
//! with a message, or fails it when `IDEM_REQUIRE_SERVICES` is set.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::server_process::{
    NotAccepting, SERVER_USER, append_file, check, command_as, fail, free_port, postgres_binaries,
    server_dir, wait_until_accepting,
};
use crate::tls_postgres::{BIN_VARIABLE, StartError};

/// One server of the cluster.
#[derive(Debug)]
struct Node {
    name: &'static str,
    data: PathBuf,
    log: PathBuf,
    port: u16,
}

/// A running primary and its synchronous standby; both stopped and removed
/// when dropped.
pub struct PgCluster {
    bin: PathBuf,
    // Removed (with both data directories) when the cluster is dropped.
    dir: tempfile::TempDir,
    run_as: Option<String>,
    primary: Node,
    standby: Node,
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir.path())
            .field("primary_port", &self.primary.port)
            .field("standby_port", &self.standby.port)
            .finish_non_exhaustive()
    }
}

impl PgCluster {
    /// Starts the cluster; `None` (after saying so) when it cannot start and
    /// services are not required, a panic when they are.
    pub fn start() -> Option<PgCluster> {
        match Self::try_start() {
            Ok(cluster) => Some(cluster),
            Err(error) => {
                crate::services::missing_service(
                    "a private PostgreSQL primary with a synchronous standby",
                    &error.to_string(),
                );
                None
            }
        }
    }

    /// Starts the cluster.
    pub fn try_start() -> Result<PgCluster, StartError> {
        let bin = postgres_binaries(BIN_VARIABLE, Path::new(crate::postgres::INSTALLED_SERVERS))?;
        if !bin.join("pg_basebackup").exists() {
            return Err(fail(format!(
                "pg_basebackup is not in {}; install the `postgresql` package",
                bin.display()
            )));
        }
        let (dir, owner) = server_dir("idem-pg-cluster-", "PostgreSQL")?;
        let run_as = owner.map(|_| SERVER_USER.to_owned());
        let node = |name: &'static str| -> Result<Node, StartError> {
            Ok(Node {
                name,
                data: dir.path().join(name),
                log: dir.path().join(format!("{name}.log")),
                port: free_port()?,
            })
        };
        let cluster = PgCluster {
            primary: node("primary")?,
            standby: node("standby")?,
            bin,
            dir,
            run_as,
        };

        let primary = &cluster.primary;
        cluster.run(
            "initdb",
            &[
                "-D",
                &primary.data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
            ],
        )?;
        let config = format!(
            "\n# idem-testkit: a primary with one synchronous standby, loopback only\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{dir}'\n\
             wal_level = replica\n\
             max_wal_senders = 4\n\
             synchronous_standby_names = '*'\n\
             synchronous_commit = on\n\
             hot_standby = on\n\
             max_connections = 100\n\
             fsync = off\n",
            port = primary.port,
            dir = cluster.dir.path().display(),
        );
        append_file(&primary.data.join("postgresql.conf"), &config)?;
        cluster.start_node(primary)?;

        let standby = &cluster.standby;
        cluster.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &standby.data.display().to_string(),
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        )?;
        // The copy's configuration is the primary's; the standby's own
        // settings, appended, win. Once promoted it has no standby of its
        // own, so it must not wait for one: its commits would never return.
        append_file(
            &standby.data.join("postgresql.conf"),
            &format!(
                "\n# idem-testkit: the standby\nport = {}\nsynchronous_standby_names = ''\n",
                standby.port
            ),
        )?;
        cluster.start_node(standby)?;
        cluster.wait_for_sync_standby()?;
        Ok(cluster)
    }

    /// The primary's loopback port.
    pub fn primary_port(&self) -> u16 {
        self.primary.port
    }

    /// The standby's loopback port.
    pub fn standby_port(&self) -> u16 {
        self.standby.port
    }

    /// `postgres://postgres@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/postgres?QUERY`
    /// (no `?` when `query` is empty): both servers, primary first.
    pub fn url(&self, query: &str) -> String {
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres{query}",
            self.primary.port, self.standby.port
        )
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: one server of the two.
    pub fn single_url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    /// Crashes the primary: `pg_ctl stop -m immediate`, which ends every
    /// backend at once without a checkpoint, as a power cut would (the
    /// server is not started again).
    pub fn crash_primary(&self) -> Result<(), StartError> {
        self.stop(&self.primary)
    }

    /// Promotes the standby to primary and waits until it accepts writes.
    pub fn promote_standby(&self) -> Result<(), StartError> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.standby.data.display().to_string(),
                "-w",
                "-t",
                "60",
                "promote",
            ],
        )
    }

    /// Both servers' logs so far, to explain a failure.
    pub fn log_text(&self) -> String {
        [&self.primary, &self.standby]
            .iter()
            .map(|node| {
                format!(
                    "--- {} (port {}) ---\n{}",
                    node.name,
                    node.port,
                    std::fs::read_to_string(&node.log).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn start_node(&self, node: &Node) -> Result<(), StartError> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &node.data.display().to_string(),
                "-l",
                &node.log.display().to_string(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        wait_until_accepting(node.port, || None).map_err(|_: NotAccepting| {
            fail(format!(
                "the {} did not accept connections on port {} within 30 s; the logs:\n{}",
                node.name,
                node.port,
                self.log_text()
            ))
        })
    }

    fn stop(&self, node: &Node) -> Result<(), StartError> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &node.data.display().to_string(),
                "stop",
                "-m",
                "immediate",
                "-w",
            ],
        )
    }

    /// Waits until the primary streams to the standby synchronously.
    fn wait_for_sync_standby(&self) -> Result<(), StartError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let psql = self.bin.join("psql");
        loop {
            let output = self
                .command(&psql)
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.primary.port.to_string(),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-At",
                    "-c",
                    "SELECT sync_state FROM pg_stat_replication",
                ])
                .output();
            if let Ok(output) = &output
                && String::from_utf8_lossy(&output.stdout).trim() == "sync"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(fail(format!(
                    "the standby did not become the primary's synchronous standby within 60 s; the logs:\n{}",
                    self.log_text()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn command(&self, program: &Path) -> Command {
        command_as(program, self.run_as.as_deref(), self.dir.path())
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), StartError> {
        let path = self.bin.join(program);
        let output = self.command(&path).args(args).output();
        check(&path.display().to_string(), output).map_err(|e| {
            let logs = self.log_text();
            fail(format!("{e}; the logs:\n{logs}"))
        })
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for node in [&self.standby, &self.primary] {
            // The crashed primary is already stopped: say nothing for it.
            if node.data.join("postmaster.pid").exists()
                && let Err(error) = self.stop(node)
            {
                eprintln!(
                    "warning: the private PostgreSQL {} in {} may still be running: {error}",
                    node.name,
                    self.dir.path().display()
                );
            }
        }
    }
}
