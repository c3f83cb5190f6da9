//! `idem forward`, run as a user would, outlives its broker connection: the
//! connection is cut under it (through a fault proxy of the test's own), its
//! `/healthz` says it is reconnecting while the cut lasts, and every message
//! published before and during the cut reaches the endpoint once per key.

mod common;

use common::free_port;
use common::store::TestStore;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use idem_testkit::faultproxy::{FaultProxy, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Calls per key.
type Calls = Arc<Mutex<HashMap<String, u32>>>;

async fn receive(State(calls): State<Calls>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    *calls.lock().unwrap().entry(key).or_default() += 1;
    StatusCode::OK
}

async fn endpoint() -> (Calls, SocketAddr) {
    let calls = Calls::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(Arc::clone(&calls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    (calls, addr)
}

/// The status line and body of `GET /healthz`, or `None` while nothing
/// listens.
async fn healthz(admin: SocketAddr) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: admin\r\n\r\n")
        .await
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    Some((status, body))
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the process when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_forward_outlives_a_cut_broker_connection_and_says_so_on_healthz() {
    let Some(queue) = common::TestQueue::declare("idem-t-forward").await else {
        return;
    };
    let publish = async |key: &str| queue.publish(key).await;

    let (calls, hook) = endpoint().await;
    let proxy = FaultProxy::start("127.0.0.1:5672".parse().unwrap())
        .await
        .unwrap();
    let store = TestStore::sqlite();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let from = format!("amqp://guest:guest@{}/{}", proxy.addr(), queue.name);
    let mut forward = Running(
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", &store.url, "forward", "--from", &from])
            .args(["--to", &format!("http://{hook}/hook")])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--reconnect-min", "50ms", "--reconnect-max", "300ms"])
            .env_remove("IDEM_STORE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start idem forward"),
    );
    let applied = |n: usize| {
        let calls = Arc::clone(&calls);
        async move || calls.lock().unwrap().len() >= n
    };

    for i in 0..5 {
        publish(&format!("before-{i}")).await;
    }
    until("the first five are forwarded", applied(5)).await;
    assert_eq!(healthz(admin).await.map(|h| h.0), Some(200));

    proxy.set(Mode::Drop);
    until("/healthz reports the lost connection", async || {
        matches!(healthz(admin).await, Some((503, body)) if body.contains("reconnecting") && body.contains(&queue.name))
    })
    .await;
    for i in 0..5 {
        publish(&format!("during-{i}")).await;
    }
    assert!(
        forward.0.try_wait().unwrap().is_none(),
        "idem forward is still running during the cut"
    );
    proxy.set(Mode::Pass);
    until(
        "the five published during the cut are forwarded",
        applied(10),
    )
    .await;
    until("/healthz is ready again", async || {
        healthz(admin).await.map(|h| h.0) == Some(200)
    })
    .await;
    assert!(forward.0.try_wait().unwrap().is_none(), "still running");

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 10, "every key reached the endpoint: {calls:?}");
    queue.delete().await;
}

/// What connecting again cannot fix ends `idem forward` at once, with status
/// 1 and what to change: here a queue that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_forward_exits_for_a_missing_queue_saying_what_to_do() {
    if !common::rabbitmq_answers().await {
        return;
    }
    let store = TestStore::sqlite();
    let from = format!(
        "amqp://guest:guest@127.0.0.1:5672/no-such-queue-{}",
        free_port()
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", &store.url, "forward", "--from", &from])
            .args(["--to", "http://127.0.0.1:9/hook"])
            .env_remove("IDEM_STORE")
            .output()
            .expect("run idem forward")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the queue does not exist: declare it"),
        "{stderr}"
    );
}
