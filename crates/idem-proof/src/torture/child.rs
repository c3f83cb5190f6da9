//! The campaign's own `idem` subcommands as child processes (`idem relay`,
//! `idem forward`): started with a clean environment, killed with SIGKILL,
//! watched for a crash point firing or an exit nobody asked for, restarted.

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use tokio::process::{Child, Command};

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exit {
    /// A crash point fired (SIGABRT).
    Crashed,
    /// Any other way.
    Other,
}

/// The current binary as a child command: no `IDEM_*` variable of this
/// process, `IDEM_CRASH=crash` when given, and the log file (appended to)
/// for its stderr.
pub(super) fn idem_command(log: &Path, crash: Option<&str>) -> anyhow::Result<(Command, File)> {
    let exe = std::env::current_exe().context("cannot find the idem binary")?;
    let log = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let mut command = Command::new(exe);
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    if let Some(crash) = crash {
        command.env(idem::crash::ENV, crash);
    }
    Ok((command, log))
}

/// A command of the current binary, across its restarts; killed when dropped.
#[derive(Debug)]
pub(super) struct Process {
    name: &'static str,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    /// `idem --store STORE relay --to TO`, polling often, with a short lease
    /// so a killed relay's rows are taken over within a trial.
    pub(super) fn relay(store: &str, to: &str, log: &Path) -> Self {
        let args = [
            "--store",
            store,
            "relay",
            "--to",
            to,
            "--poll",
            "100ms",
            "--lease",
            "2s",
            "--max-attempts",
            "20",
            "--sweep-every",
            "off",
        ];
        Self::new("relay", &args, log)
    }

    /// `idem --store STORE forward --from FROM --to TO`, keyed by the
    /// message id the relay set.
    pub(super) fn forward(from: &str, to: &str, store: &str, log: &Path) -> Self {
        let args = [
            "--store",
            store,
            "forward",
            "--from",
            from,
            "--to",
            to,
            "--key",
            "message-id",
            "--ack-wait",
            "5s",
            "--timeout",
            "5s",
            "--max-attempts",
            "20",
            "--sweep-every",
            "off",
        ];
        Self::new("forward", &args, log)
    }

    fn new(name: &'static str, args: &[&str], log: &Path) -> Self {
        Self {
            name,
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            log: log.to_owned(),
            child: None,
        }
    }

    /// The subcommand's name.
    pub(super) fn name(&self) -> &'static str {
        self.name
    }

    /// Starts a process (the previous one must be gone), arming
    /// `IDEM_CRASH=crash` when given; its stderr goes to the log.
    pub(super) fn start(&mut self, crash: Option<&str>) -> anyhow::Result<()> {
        let (mut command, log) = idem_command(&self.log, crash)?;
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start idem {}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL, then waits for the process to be gone.
    pub(super) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether the process has ended, and how.
    pub(super) fn exited(&mut self) -> Option<Exit> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(if status.signal() == Some(6) {
            Exit::Crashed
        } else {
            Exit::Other
        })
    }
}
