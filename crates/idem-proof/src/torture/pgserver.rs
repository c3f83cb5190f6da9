//! A PostgreSQL server of the campaign's own: `initdb` into a temporary
//! directory, started with `pg_ctl` on a free loopback port with trust
//! authentication, restarted mid-load, stopped and removed at the end.
//!
//! A restart cuts every connection of every client, which the shared server
//! other runs use must never see; so the restart scenario brings its own.
//! PostgreSQL refuses to run as root: a campaign run as root runs the server
//! as the `postgres` system user, in a directory that user owns.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, bail};

/// How the server is restarted (`pg_ctl restart -m MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shutdown {
    /// Sessions are ended and the server shuts down cleanly.
    Fast,
    /// The server stops at once, as in a crash, and recovers from its WAL
    /// on the next start.
    Immediate,
}

impl Shutdown {
    /// The mode's name, for `pg_ctl` and the report.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Immediate => "immediate",
        }
    }
}

/// A running private server; stopped and removed when dropped.
#[derive(Debug)]
pub(super) struct PrivatePostgres {
    bin: PathBuf,
    // Removed (with the data) when the server is dropped.
    dir: tempfile::TempDir,
    run_as: Option<String>,
    addr: SocketAddr,
}

impl PrivatePostgres {
    /// Creates a cluster and starts it on a free loopback port.
    pub(super) fn start() -> anyhow::Result<Self> {
        let bin = binaries_under(Path::new(idem_testkit::postgres::INSTALLED_SERVERS))?;
        let dir = tempfile::Builder::new()
            .prefix("idem-torture-pg-")
            .tempdir()
            .context("cannot create the private PostgreSQL's directory")?;
        let run_as = if running_as_root()? {
            let (uid, gid) = system_user("postgres").context(
                "PostgreSQL refuses to run as root, and there is no `postgres` user to run it as",
            )?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .context("cannot hand the private PostgreSQL's directory to `postgres`")?;
            Some("postgres".to_owned())
        } else {
            None
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("cannot find a free port")?
            .port();
        let server = Self {
            bin,
            dir,
            run_as,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let data = server.data();
        server.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
            ],
        )?;
        server.pg_ctl(&["start", "-w", "-t", "60", "-o", &server.options()])?;
        Ok(server)
    }

    /// Where the server listens.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Restarts the server in `mode` and waits until it accepts connections.
    pub(super) async fn restart(&self, mode: Shutdown) -> anyhow::Result<()> {
        let options = self.options();
        let args = [
            "restart",
            "-w",
            "-t",
            "60",
            "-m",
            mode.name(),
            "-o",
            &options,
        ];
        let command = self.pg_ctl_command(&args);
        let output = tokio::process::Command::from(command).output().await;
        check("pg_ctl restart", output)
            .with_context(|| format!("the server's log is {}", self.log()))
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Loopback only, its socket in its own directory, no fsync (the
    /// machine does not crash in a trial, only the server).
    fn options(&self) -> String {
        format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off -c max_connections=200",
            self.addr.port(),
            self.dir.path().display()
        )
    }

    fn log(&self) -> String {
        self.dir.path().join("server.log").display().to_string()
    }

    fn pg_ctl_command(&self, args: &[&str]) -> Command {
        let (log, data) = (self.log(), self.data());
        let mut all = vec!["-D", data.as_str(), "-l", log.as_str()];
        all.extend_from_slice(args);
        self.command("pg_ctl", &all)
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        check("pg_ctl", self.pg_ctl_command(args).output())
            .with_context(|| format!("the server's log is {}", self.log()))
    }

    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let output = self.command(program, args).output();
        check(program, output)
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = self.bin.join(program);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(path);
                command
            }
            None => Command::new(path),
        };
        command
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        command
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.data();
        let stopped = self
            .command("pg_ctl", &["-D", &data, "stop", "-m", "immediate", "-w"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !stopped.is_ok_and(|status| status.success()) {
            eprintln!(
                "warning: the private PostgreSQL in {} may still be running",
                self.dir.path().display()
            );
        }
    }
}

fn check(program: &str, output: std::io::Result<Output>) -> anyhow::Result<()> {
    let output = output.with_context(|| format!("cannot run {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The newest `ROOT/VERSION/bin` that has `initdb`, `pg_ctl` and `postgres`.
fn binaries_under(root: &Path) -> anyhow::Result<PathBuf> {
    match idem_testkit::postgres::server_binaries(root) {
        Some(bin) => Ok(bin),
        None => bail!(
            "the PostgreSQL server programs (initdb, pg_ctl, postgres under {}/VERSION/bin) are not installed; install the `postgresql` package (apt-get install postgresql)",
            root.display()
        ),
    }
}

fn running_as_root() -> anyhow::Result<bool> {
    let output = Command::new("id")
        .arg("-u")
        .output()
        .context("cannot run id")?;
    Ok(String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// A system user's uid and gid.
fn system_user(name: &str) -> anyhow::Result<(u32, u32)> {
    let id = |flag: &str| -> anyhow::Result<u32> {
        let output = Command::new("id").args([flag, name]).output()?;
        if !output.status.success() {
            bail!("no user {name}");
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().parse()?)
    };
    Ok((id("-u")?, id("-g")?))
}

#[cfg(test)]
mod tests {
    use super::binaries_under;

    #[test]
    fn a_missing_installation_says_what_to_install() {
        let root = tempfile::tempdir().unwrap();
        let error = binaries_under(root.path()).unwrap_err().to_string();
        assert!(
            error.contains("install the `postgresql` package"),
            "{error}"
        );
    }

    #[test]
    fn the_newest_complete_installation_is_chosen() {
        let root = tempfile::tempdir().unwrap();
        for (version, programs) in [
            ("15", &["initdb", "pg_ctl", "postgres"][..]),
            ("16", &["initdb", "pg_ctl", "postgres"][..]),
            ("17", &["pg_ctl"][..]),
        ] {
            let bin = root.path().join(version).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            for program in programs {
                std::fs::write(bin.join(program), "").unwrap();
            }
        }
        assert_eq!(
            binaries_under(root.path()).unwrap(),
            root.path().join("16").join("bin")
        );
    }
}
