//! `idem dup-proxy` as a child process of the current binary, a hop between
//! the clients and the gateway: it sends a share of the requests twice, so
//! the gateway also sees copies nobody retried. The campaign's history stays
//! the clients'; the proxy's report says how many requests it duplicated,
//! and its own history which copies ended with an unknown outcome (attempts
//! the clients never saw).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use super::child::idem_command;

/// The share of requests sent twice.
const SHARE: &str = "0.5";

/// When the copy is sent, varied from trial to trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timing {
    /// Alongside the original.
    Concurrent,
    /// 100 ms after the original's answer.
    After,
    /// First, the original once the copy's answer is in.
    Ahead,
}

impl Timing {
    /// A trial's timing.
    pub(super) fn of_trial(index: usize) -> Self {
        [Self::Concurrent, Self::After, Self::Ahead][index % 3]
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Self::Concurrent => &[],
            Self::After => &["--delay", "100ms"],
            Self::Ahead => &["--reorder"],
        }
    }
}

/// A running `idem dup-proxy`; killed when dropped.
#[derive(Debug)]
pub(super) struct DupProxy {
    addr: SocketAddr,
    admin: SocketAddr,
    _child: Child,
}

impl DupProxy {
    /// Starts the proxy in front of `upstream` (the gateway, which must keep
    /// its address across restarts), writing its own history to `history`,
    /// and waits for its addresses.
    pub(super) async fn start(
        upstream: SocketAddr,
        timing: Timing,
        log: &Path,
        history: &Path,
    ) -> anyhow::Result<Self> {
        let (mut command, log_file) = idem_command(log, None)?;
        command
            .arg("dup-proxy")
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--share", SHARE, "--upstream-timeout", "10s"])
            .arg("--history")
            .arg(history)
            .args(timing.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        let mut child = command.spawn().context("cannot start idem dup-proxy")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let announced = tokio::time::timeout(Duration::from_secs(30), async {
            let (mut addr, mut admin) = (None, None);
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("idem dup-proxy: listening on http://") {
                    addr = Some(first_address(rest)?);
                } else if let Some(rest) = line.strip_prefix("idem dup-proxy: admin on http://") {
                    admin = Some(first_address(rest)?);
                }
                if let (Some(addr), Some(admin)) = (addr, admin) {
                    return Ok((addr, admin));
                }
            }
            bail!("idem dup-proxy ended before announcing its addresses")
        })
        .await;
        let (addr, admin) = match announced {
            Ok(Ok(addresses)) => addresses,
            _ => bail!("idem dup-proxy did not start; see {}", log.display()),
        };
        // Keep reading, so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            addr,
            admin,
            _child: child,
        })
    }

    /// Where the clients send.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests the proxy sent twice, from its `/report`.
    pub(super) async fn duplicated(&self) -> anyhow::Result<u64> {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let uri: http::Uri = format!("http://{}/report", self.admin).parse()?;
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let response = client.get(uri).await?;
            anyhow::Ok(response.into_body().collect().await?.to_bytes())
        })
        .await
        .context("the dup-proxy's /report did not answer")??;
        let report: serde_json::Value = serde_json::from_slice(&answer)?;
        Ok(report["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|route| route["duplicated"].as_u64())
            .sum())
    }
}

/// The address at the start of an announcement (`ADDR, forwarding …`).
fn first_address(rest: &str) -> anyhow::Result<SocketAddr> {
    let end = rest.find([',', ' ', '/']).unwrap_or(rest.len());
    Ok(rest[..end].parse()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_announced_addresses() {
        assert_eq!(
            super::first_address("127.0.0.1:4000, forwarding to http://127.0.0.1:5000")
                .unwrap()
                .port(),
            4000
        );
        assert_eq!(
            super::first_address("127.0.0.1:4001 (/report, /metrics, /healthz)")
                .unwrap()
                .port(),
            4001
        );
    }
}
