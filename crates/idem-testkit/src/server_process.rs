//! What the private servers a test starts ([`TlsPostgres`], [`PgCluster`],
//! [`PgBouncer`]) share: a directory of their own, a free loopback port, the
//! `postgres` system user to run as, and a wait until the server accepts
//! connections.
//!
//! PostgreSQL and PgBouncer both refuse to run as root: a test run as root
//! runs them as the `postgres` system user, in a directory that user owns,
//! with the files written for them handed to it.
//!
//! [`TlsPostgres`]: crate::tls_postgres::TlsPostgres
//! [`PgCluster`]: crate::pg_cluster::PgCluster
//! [`PgBouncer`]: crate::pgbouncer::PgBouncer

use std::fmt;
use std::io::Write as _;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The system user a server started by root runs as.
pub(crate) const SERVER_USER: &str = "postgres";

/// Why a private server could not be started.
#[derive(Debug)]
pub struct StartError(pub(crate) String);

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

pub(crate) fn fail(message: impl Into<String>) -> StartError {
    StartError(message.into())
}

/// A temporary directory named `prefix…` for a server `program` to run in,
/// and, when the test runs as root, the uid and gid of [`SERVER_USER`], who
/// then owns it.
pub(crate) fn server_dir(
    prefix: &str,
    program: &str,
) -> Result<(tempfile::TempDir, Option<(u32, u32)>), StartError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| fail(format!("cannot create a temporary directory: {e}")))?;
    let owner = if running_as_root()? {
        let (uid, gid) = system_user(SERVER_USER, program)?;
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
            .map_err(|e| fail(format!("cannot hand the directory to `{SERVER_USER}`: {e}")))?;
        Some((uid, gid))
    } else {
        None
    };
    Ok((dir, owner))
}

/// A loopback port nothing listens on now.
pub(crate) fn free_port() -> Result<u16, StartError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| fail(format!("cannot find a free port: {e}")))
}

/// A command running `program` in `dir`, as `user` (with `runuser`) when
/// one is given, with nothing on its standard input.
pub(crate) fn command_as(program: &Path, user: Option<&str>, dir: &Path) -> Command {
    let mut command = match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    };
    command.current_dir(dir).stdin(Stdio::null());
    command
}

/// Why a server did not come to accept connections.
pub(crate) enum NotAccepting {
    /// Its process ended first, with this status.
    Exited(ExitStatus),
    /// It did not within 30 s.
    TimedOut,
}

/// Waits (at most 30 s) until loopback port `port` accepts a connection;
/// `exited` says whether the server's process has ended meanwhile.
pub(crate) fn wait_until_accepting(
    port: u16,
    mut exited: impl FnMut() -> Option<ExitStatus>,
) -> Result<(), NotAccepting> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = exited() {
            return Err(NotAccepting::Exited(status));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(NotAccepting::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `text` to `path` with permissions `mode`, owned by `owner` when
/// one is given.
pub(crate) fn write_file(
    path: &Path,
    text: &str,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), StartError> {
    let written = (|| {
        std::fs::write(path, text)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        }
        Ok::<_, std::io::Error>(())
    })();
    written.map_err(|e| fail(format!("cannot write {}: {e}", path.display())))
}

pub(crate) fn append_file(path: &Path, text: &str) -> Result<(), StartError> {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| fail(format!("cannot append to {}: {e}", path.display())))
}

/// `Ok` when `program` ran and succeeded; else what went wrong, with its
/// standard error.
pub(crate) fn check(program: &str, output: std::io::Result<Output>) -> Result<(), StartError> {
    let output = output.map_err(|e| fail(format!("cannot run {program}: {e}")))?;
    if !output.status.success() {
        return Err(fail(format!(
            "{program} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// The directory of the PostgreSQL server programs: `variable` if set, else
/// the newest version's under `root`.
pub(crate) fn postgres_binaries(variable: &str, root: &Path) -> Result<PathBuf, StartError> {
    if let Some(dir) = std::env::var_os(variable) {
        return Ok(PathBuf::from(dir));
    }
    crate::postgres::server_binaries(root).ok_or_else(|| {
        fail(format!(
            "the PostgreSQL server programs (initdb, pg_ctl, postgres under {}/VERSION/bin, or in ${variable}) are not installed; install the `postgresql` package",
            root.display()
        ))
    })
}

fn running_as_root() -> Result<bool, StartError> {
    let output = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| fail(format!("cannot run id: {e}")))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// A system user's uid and gid, to run `program` as.
fn system_user(name: &str, program: &str) -> Result<(u32, u32), StartError> {
    let id = |flag: &str| -> Option<u32> {
        let output = Command::new("id").args([flag, name]).output().ok()?;
        if !output.status.success() {
            return None;
        }
        String::from_utf8_lossy(&output.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Ok((uid, gid)),
        _ => Err(fail(format!(
            "{program} refuses to run as root, and there is no `{name}` user to run it as"
        ))),
    }
}
