//! `idem forward` and `idem dlq` on the stores without an SQL database,
//! Redis and DynamoDB, run as a user would: the failed attempts of a message
//! that keeps failing are counted in the store, it is dead-lettered there
//! after its attempts, `idem dlq` lists and redrives it with its original
//! key, and the messages that succeed reach the endpoint once per key.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use common::store::TestStore;

/// Calls per key; keys starting with `bad-` are answered 500 while `failing`.
#[derive(Default)]
struct Endpoint {
    calls: HashMap<String, u32>,
    healed: bool,
}

type Shared = Arc<Mutex<Endpoint>>;

async fn receive(State(endpoint): State<Shared>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    let mut endpoint = endpoint.lock().unwrap();
    let failing = key.starts_with("bad-") && !endpoint.healed;
    *endpoint.calls.entry(key).or_default() += 1;
    if failing {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

async fn endpoint() -> (Shared, SocketAddr) {
    let shared = Shared::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(Arc::clone(&shared));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    (shared, addr)
}

/// Kills the process when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `idem --store STORE ARGS` off the runtime's workers.
async fn idem(store: &str, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .args(["--store", store])
        .args(args)
        .env_remove("IDEM_STORE");
    tokio::task::spawn_blocking(move || command.output().expect("run idem"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_counts_attempts_and_dead_letters_in_redis_and_dlq_redrives_them() {
    if let Some(store) = TestStore::redis("forward") {
        forward_counts_attempts_and_dead_letters(&store, "redis").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_counts_attempts_and_dead_letters_in_dynamodb_and_dlq_redrives_them() {
    if let Some(store) = TestStore::dynamodb("forward") {
        forward_counts_attempts_and_dead_letters(&store, "dynamodb").await;
    }
}

/// `idem forward` from a queue of its own to an endpoint that fails `bad-`
/// keys until healed, its attempts and dead letters in `store`.
async fn forward_counts_attempts_and_dead_letters(store: &TestStore, name: &str) {
    let Some(queue) = common::TestQueue::declare(&format!("idem-t-forward-{name}")).await else {
        return;
    };
    let (calls, hook) = endpoint().await;
    let from = format!("amqp://guest:guest@127.0.0.1:5672/{}", queue.name);
    let _forward = Running(
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", &store.url, "forward", "--from", &from])
            .args(["--to", &format!("http://{hook}/hook")])
            .args(["--max-attempts", "3"])
            .env_remove("IDEM_STORE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start idem forward"),
    );
    for key in ["ok-1", "bad-1", "ok-2"] {
        queue.publish(key).await;
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let letters = loop {
        let out = idem(&store.url, &["dlq", "ls", "--json"]).await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if listed.as_array().is_some_and(|l| !l.is_empty()) {
            break listed;
        }
        assert!(Instant::now() < deadline, "no dead letter within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let letter = &letters[0];
    assert_eq!(letter["key"], "bad-1");
    assert_eq!(
        letter["attempts"], 3,
        "the attempts were counted in the store"
    );
    assert!(
        letter["last_error"].as_str().unwrap().contains("500"),
        "{letter}"
    );
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.calls.get("bad-1"), Some(&3));
        assert_eq!(calls.calls.get("ok-1"), Some(&1));
        assert_eq!(calls.calls.get("ok-2"), Some(&1));
    }

    calls.lock().unwrap().healed = true;
    let id = letter["id"].as_i64().unwrap().to_string();
    let out = idem(&store.url, &["dlq", "redrive", &id]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The letter goes back to the queue it came from; the running `idem
    // forward` takes it from there, so its call arrives a moment later.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let bad = calls.lock().unwrap().calls.get("bad-1").copied();
        if bad == Some(4) {
            break;
        }
        assert!(
            bad == Some(3) && Instant::now() < deadline,
            "the redriven letter should reach the endpoint once: {bad:?} calls"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(calls.lock().unwrap().calls.get("bad-1"), Some(&4));
    let out = idem(&store.url, &["dlq", "ls"]).await;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("0 waiting, 1 redriven"), "{listed}");
    queue.delete().await;
}
