//! `idem serve` as a child of the current binary: started, killed with
//! SIGKILL, watched for a crash point firing, and restarted on the same store
//! and the same port (a proxy in front of it keeps its upstream address).

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use super::child::{Exit, idem_command};

/// The lease the gateway is started with: short, so a retry after an
/// unknown outcome is forwarded again within a trial.
pub(super) const LEASE: Duration = Duration::from_secs(2);

/// How long the gateway waits for the upstream.
const UPSTREAM_TIMEOUT: &str = "3s";

/// Where the clients find the gateway; changes on each restart.
pub(super) type Address = Arc<Mutex<SocketAddr>>;

/// One gateway, across its restarts.
#[derive(Debug)]
pub(super) struct Gateway {
    store: String,
    upstream: String,
    log: PathBuf,
    /// Its answer spool, next to its log: its own across its restarts.
    spool: PathBuf,
    /// What it asks the upstream before a takeover, if anything.
    probe: Option<String>,
    addr: Address,
    /// Where it listens: a free port the first time, then that port again.
    listen: SocketAddr,
    child: Option<Child>,
}

impl Gateway {
    /// Starts `idem --store STORE serve --upstream UPSTREAM` (with `--probe
    /// PROBE` when given), arming `IDEM_CRASH=crash` when given, and waits
    /// for its "listening on" line. Its stderr goes to `log`.
    pub(super) async fn start(
        store: String,
        upstream: String,
        log: &Path,
        crash: Option<&str>,
        probe: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut gateway = Self {
            store,
            upstream,
            log: log.to_owned(),
            spool: log.with_extension("spool"),
            probe: probe.map(str::to_owned),
            addr: Arc::new(Mutex::new(SocketAddr::from(([127, 0, 0, 1], 9)))),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            child: None,
        };
        gateway.restart(crash).await?;
        Ok(gateway)
    }

    /// The address the clients send to.
    pub(super) fn addr(&self) -> Address {
        Arc::clone(&self.addr)
    }

    /// Starts a new process on the same store and port (the old one must be
    /// gone). A port the killed process held may take a moment to be free.
    pub(super) async fn restart(&mut self, crash: Option<&str>) -> anyhow::Result<()> {
        let mut tries = 0;
        let (child, addr) = loop {
            tries += 1;
            match self.spawn(crash).await {
                Ok(started) => break started,
                Err(error) if tries >= 5 => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        *self.addr.lock().unwrap_or_else(|p| p.into_inner()) = addr;
        self.listen = addr;
        self.child = Some(child);
        Ok(())
    }

    async fn spawn(&self, crash: Option<&str>) -> anyhow::Result<(Child, SocketAddr)> {
        let (mut command, log) = idem_command(&self.log, crash)?;
        let lease = format!("{}s", LEASE.as_secs());
        let listen = self.listen.to_string();
        command
            .args([
                "--store",
                &self.store,
                "serve",
                "--upstream",
                &self.upstream,
            ])
            .args(["--listen", &listen, "--lease", &lease])
            .args(["--upstream-timeout", UPSTREAM_TIMEOUT])
            .args(["--sweep-every", "off", "--principal-header", "none"])
            .arg("--spool")
            .arg(&self.spool)
            .args(
                self.probe
                    .iter()
                    .flat_map(|probe| ["--probe", probe.as_str()]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let mut child = command.spawn().context("cannot start idem serve")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("idem serve: listening on http://") {
                    let addr = rest.split(',').next().unwrap_or_default();
                    return Ok(Some(addr.parse::<SocketAddr>()?));
                }
            }
            anyhow::Ok(None)
        })
        .await;
        let addr = match addr {
            Ok(Ok(Some(addr))) => addr,
            _ => {
                let _ = child.kill().await;
                bail!(
                    "idem serve did not start on {} ({listen}); see {}",
                    idem::redact_url(&self.store),
                    self.log.display()
                )
            }
        };
        // Keep reading, so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((child, addr))
    }

    /// SIGKILL, then waits for the process to be gone.
    pub(super) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether the process has ended, and how.
    pub(super) fn exited(&mut self) -> Option<Exit> {
        let child = self.child.as_mut()?;
        let status: ExitStatus = child.try_wait().ok()??;
        self.child = None;
        Some(if status.signal() == Some(6) {
            Exit::Crashed
        } else {
            Exit::Other
        })
    }
}

/// What `idem serve` logs when it gave up storing an answer it handed out:
/// the store refused the completion, and by the time it could take it the
/// claim had been taken over (an answer the store is only late to take is
/// kept in the spool and stored, and not logged so).
const UNSTORED: &str = "could not store the response";

/// How many answers the gateway logged it could not store, over its runs.
/// Each leaves the key claimed until its lease ends, and a retry after that
/// is forwarded again although its client was answered.
pub(super) fn unstored_answers(log: &Path) -> anyhow::Result<usize> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("cannot read {}", log.display()))?;
    Ok(text.lines().filter(|line| line.contains(UNSTORED)).count())
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_the_answers_the_gateway_could_not_store() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("gateway.log");
        std::fs::write(
            &log,
            "idem serve: listening\n\
             WARN could not store the response: its claim was taken over after its lease ran out, so a retry may run again\n\
             WARN the store did not take the response yet; the client gets it, and its completion is retried until stored\n\
             WARN could not store the response: its claim was taken over after its lease ran out, so a retry may run again\n",
        )
        .unwrap();
        assert_eq!(super::unstored_answers(&log).unwrap(), 2);
    }
}
