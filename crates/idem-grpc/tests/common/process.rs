//! A server in a process of its own, so that a test can kill it in the
//! middle of a call and start it again on the same port: the test binary run
//! again for one ignored test, which serves until killed, and the client's
//! retries that reach the restarted server.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_grpc::GrpcRetry;
use idem_retry::{Backoff, RetryBudget, RetryConfig};
use tokio::net::TcpListener;

use super::{CHARGE, Ledger, Running};

const DIR: &str = "IDEM_GRPC_CHILD_DIR";
const PORT: &str = "IDEM_GRPC_CHILD_PORT";
const HANG: &str = "IDEM_GRPC_CHILD_HANG";

/// What a server process was started with.
#[derive(Debug)]
pub(crate) struct Started {
    /// The test's directory, where the store and the ledger are.
    pub(crate) dir: PathBuf,
    /// Whether its charges hang.
    pub(crate) hang: bool,
}

/// The body of the ignored test that is the server process: binds the port
/// it was given, serves what `serve` starts there, and waits to be killed.
/// Run other than as a server process, it returns at once.
pub(crate) fn serve_until_killed<F, Fut>(serve: F)
where
    F: FnOnce(TcpListener, Started) -> Fut,
    Fut: Future<Output = Running>,
{
    let (Ok(dir), Ok(port)) = (std::env::var(DIR), std::env::var(PORT)) else {
        return;
    };
    let started = Started {
        dir: PathBuf::from(dir),
        hang: std::env::var(HANG).is_ok(),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap()))
            .await
            .expect("bind");
        let _server = serve(listener, started).await;
        std::future::pending::<()>().await;
    });
}

/// Starts the server process: this test binary, running only the ignored
/// test `test`, serving on `port` from `dir`.
pub(crate) fn start(test: &str, dir: &Path, port: u16, hang: bool) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", test, "--nocapture"])
        .env(DIR, dir)
        .env(PORT, port.to_string());
    if hang {
        command.env(HANG, "1");
    } else {
        command.env_remove(HANG);
    }
    command.spawn().expect("start the server process")
}

/// A loopback port that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Retries that keep calling, for up to 30 seconds, while the server is
/// killed and started again.
pub(crate) fn until_restarted() -> GrpcRetry {
    GrpcRetry::new(
        RetryConfig::default()
            .with_backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(200),
                200,
            ))
            .with_deadline(Duration::from_secs(30)),
        Arc::new(RetryBudget::unlimited()),
    )
}

/// Waits until the server process has received a charge.
pub(crate) async fn first_charge(ledger: &Ledger) {
    let waited = Instant::now();
    while ledger.calls(CHARGE) == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
