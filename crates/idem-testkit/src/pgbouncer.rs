//! A private PgBouncer in transaction pooling mode in front of the test
//! PostgreSQL server, for tests of the store through a transaction pooler.
//!
//! Through a transaction pooler, a client's connection is handed a server
//! connection for one transaction at a time: a named prepared statement, a
//! session advisory lock, `SET` without `LOCAL` or `LISTEN` made in one
//! transaction is gone (or, worse, someone else's) in the next. The pooler
//! here makes that happen for real: [`PgBouncer::start`] writes a
//! `pgbouncer.ini` with `pool_mode = transaction`, `auth_type = trust` and
//! only [`POOL_SIZE`] server connections per database, so a few clients
//! already share them, and starts Debian's `pgbouncer` (1.18 in Debian 12) on
//! a free loopback port in front of [`server_url`](crate::postgres::server_url).
//!
//! PgBouncer refuses to run as root: a test run as root runs it as the
//! `postgres` system user, in a directory that user owns. The process is
//! killed when the value is dropped.
//!
//! The program is `pgbouncer` on the `PATH` or in `/usr/sbin`, or
//! `IDEM_TEST_PGBOUNCER` if set (`scripts/services.sh` installs Debian's
//! package). When it is missing or does not start, [`PgBouncer::start`]
//! skips the test with a message, or fails it when `IDEM_REQUIRE_SERVICES` is
//! set.

use std::fmt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

pub use crate::server_process::StartError;
use crate::server_process::{
    NotAccepting, fail, free_port, server_dir, wait_until_accepting, write_file,
};

/// The variable naming the `pgbouncer` program to run.
pub const BIN_VARIABLE: &str = "IDEM_TEST_PGBOUNCER";

/// Server connections per database and user: small, so that a test's
/// concurrent clients really take turns on them.
pub const POOL_SIZE: u32 = 3;

/// How a private PgBouncer is set up.
#[derive(Debug, Clone)]
pub struct PgBouncerConfig {
    /// Whether `ignore_startup_parameters = extra_float_digits` is set
    /// (without it, PgBouncer refuses clients that send that parameter).
    pub ignore_extra_float_digits: bool,
    /// `default_pool_size`.
    pub pool_size: u32,
}

impl Default for PgBouncerConfig {
    fn default() -> Self {
        Self {
            ignore_extra_float_digits: true,
            pool_size: POOL_SIZE,
        }
    }
}

/// A running PgBouncer in transaction pooling mode; killed when dropped.
pub struct PgBouncer {
    // Removed (with the ini and the log) when the value is dropped.
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

impl fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBouncer")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl PgBouncer {
    /// Starts one with the default set-up; `None` (after saying so) when it
    /// cannot start and services are not required, a panic when they are.
    pub fn start() -> Option<PgBouncer> {
        Self::start_with(&PgBouncerConfig::default())
    }

    /// Starts one set up by `config`; `None` or a panic as with
    /// [`start`](Self::start).
    pub fn start_with(config: &PgBouncerConfig) -> Option<PgBouncer> {
        match Self::try_start(config) {
            Ok(bouncer) => Some(bouncer),
            Err(error) => {
                crate::services::missing_service("a private PgBouncer", &error.0);
                None
            }
        }
    }

    /// Starts one set up by `config`.
    pub fn try_start(config: &PgBouncerConfig) -> Result<PgBouncer, StartError> {
        let program = program()?;
        let backend = PgConnectOptions::from_str(&crate::postgres::server_url())
            .map_err(|e| fail(format!("the test server's URL is not valid: {e}")))?;
        let user = backend.get_username().to_owned();
        let (dir, run_as) = server_dir("idem-pgbouncer-", "pgbouncer")?;
        let port = free_port()?;

        let users = dir.path().join("userlist.txt");
        let ini = dir.path().join("pgbouncer.ini");
        let log = dir.path().join("pgbouncer.log");
        let ignore = if config.ignore_extra_float_digits {
            "ignore_startup_parameters = extra_float_digits\n"
        } else {
            ""
        };
        let text = format!(
            "; idem-testkit: transaction pooling in front of the test server\n\
             [databases]\n\
             * = host={host} port={backend_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool}\n\
             max_client_conn = 500\n\
             {ignore}\
             logfile = {log}\n",
            host = backend.get_host(),
            backend_port = backend.get_port(),
            users = users.display(),
            pool = config.pool_size,
            log = log.display(),
        );
        for (path, text) in [(&users, format!("\"{user}\" \"\"\n")), (&ini, text)] {
            write_file(path, &text, 0o644, run_as)?;
        }

        let mut command = match run_as {
            Some((uid, gid)) => {
                // `setpriv` executes the program itself: the child's pid is
                // PgBouncer's, so dropping the value kills PgBouncer.
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg(&program);
                command
            }
            None => Command::new(&program),
        };
        let child = command
            .arg(&ini)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| fail(format!("cannot run {}: {e}", program.display())))?;
        let mut bouncer = PgBouncer { dir, child, port };
        bouncer.wait_until_it_accepts()?;
        Ok(bouncer)
    }

    /// The loopback port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` (a URL of the test server, such as a
    /// [`TestDatabase`](crate::postgres::TestDatabase)'s) pointed at
    /// PgBouncer instead: its host and port replaced, user, database and
    /// query kept.
    pub fn route(&self, url: &str) -> String {
        routed(url, self.port)
    }

    /// PgBouncer's log so far, to explain a failure.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    fn wait_until_it_accepts(&mut self) -> Result<(), StartError> {
        let child = &mut self.child;
        wait_until_accepting(self.port, || child.try_wait().ok().flatten()).map_err(|why| match why
        {
            NotAccepting::Exited(status) => fail(format!(
                "pgbouncer exited ({status}) before accepting connections; its log:\n{}",
                self.log_text()
            )),
            NotAccepting::TimedOut => fail(format!(
                "pgbouncer did not accept connections on port {} within 30 s; its log:\n{}",
                self.port,
                self.log_text()
            )),
        })
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Err(error) = self.child.kill() {
            eprintln!(
                "warning: the private pgbouncer on port {} may still be running: {error}",
                self.port
            );
        }
        self.child.wait().ok();
    }
}

/// `url` with its host and port replaced by `127.0.0.1:port`.
fn routed(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("{scheme}://{user}127.0.0.1:{port}{tail}")
}

/// The `pgbouncer` program: `IDEM_TEST_PGBOUNCER`, else on the `PATH`, else
/// in `/usr/sbin` (where Debian installs it, often not on a user's `PATH`).
fn program() -> Result<PathBuf, StartError> {
    if let Some(path) = std::env::var_os(BIN_VARIABLE) {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            fail(format!(
                "pgbouncer is not installed (not on the PATH, not in /usr/sbin, ${BIN_VARIABLE} unset); install Debian's `pgbouncer` package (scripts/services.sh does)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_keeps_user_database_and_query() {
        assert_eq!(
            routed(
                "postgres://postgres@127.0.0.1:5432/db_1?sslmode=disable",
                6999
            ),
            "postgres://postgres@127.0.0.1:6999/db_1?sslmode=disable"
        );
        assert_eq!(
            routed("postgresql://u:p@db.example:5433/x", 6999),
            "postgresql://u:p@127.0.0.1:6999/x"
        );
    }
}
