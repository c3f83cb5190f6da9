//! `idem relay` and `idem dlq`, run as a user would, against a local webhook
//! that applies each `Idempotency-Key` once: a relay process killed with
//! SIGKILL in the middle of a publish is republished by the next one and the
//! receiver keeps one effect; a dead letter is listed, shown and redriven with
//! its key.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use idem::IdempotencyKey;
use idem_broker::outbox::{self, Route};
use idem_broker::publish::{Destination, Message};

use common::store::TestStore;

#[derive(Default)]
struct Hook {
    /// Calls per key, duplicates included.
    calls: HashMap<String, u32>,
    /// Keys applied (first call of each).
    effects: u32,
    answer: u16,
    /// Hold every answer (the request was received and applied, the answer never comes).
    hang: bool,
}

type Shared = Arc<Mutex<Hook>>;

async fn receive(State(hook): State<Shared>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    let (answer, hang) = {
        let mut hook = hook.lock().unwrap();
        let calls = hook.calls.entry(key).or_default();
        *calls += 1;
        if *calls == 1 {
            hook.effects += 1;
        }
        (hook.answer, hook.hang)
    };
    if hang {
        std::future::pending::<()>().await;
    }
    StatusCode::from_u16(answer).unwrap()
}

async fn start_hook(answer: u16) -> (Shared, SocketAddr) {
    let hook: Shared = Arc::new(Mutex::new(Hook {
        answer,
        ..Hook::default()
    }));
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(Arc::clone(&hook));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    (hook, addr)
}

fn idem(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem")
}

/// Runs `idem` off the runtime's worker, so the webhook keeps answering.
async fn idem_async(store: &str, args: &[&str]) -> Output {
    let store = store.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idem(&store, &args)
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An SQLite store of the test's own whose outbox holds a row to `to` for
/// each of `keys`.
async fn store_with(to: &Destination, keys: &[&str]) -> TestStore {
    let store = TestStore::sqlite();
    let any = store.open().await;
    for key in keys {
        let message = Message::new(IdempotencyKey::new(*key).unwrap(), b"{}".to_vec());
        outbox::enqueue_now(&any, Route::To(to), &message)
            .await
            .unwrap();
    }
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_publish_is_republished_and_the_receiver_keeps_one_effect() {
    let (hook, addr) = start_hook(200).await;
    hook.lock().unwrap().hang = true;
    let to: Destination = format!("http://{addr}/hook").parse().unwrap();
    let store = store_with(&to, &["order-1/receipt"]).await;

    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "--store", &store.url, "relay", "--lease", "4s", "--poll", "100ms",
        ])
        .env_remove("IDEM_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start idem relay");
    // Wait until the webhook has the request (and applied it): the relay is
    // now inside the publish, waiting for the answer (for at most half the
    // lease, 2 s, before it would give up and try again).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while hook.lock().unwrap().effects == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never called"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("SIGKILL the relay");
    child.wait().unwrap();

    // The lease runs out; the next relay publishes the row again.
    hook.lock().unwrap().hang = false;
    tokio::time::sleep(Duration::from_millis(4100)).await;
    let out = idem_async(&store.url, &["relay", "--once"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("sent 1"),
        "{}",
        text(&out.stdout)
    );

    let hook = hook.lock().unwrap();
    assert_eq!(
        hook.calls.get("order-1/receipt"),
        Some(&2),
        "republished with the same key"
    );
    assert_eq!(hook.effects, 1, "the receiver's dedupe keeps one effect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_lists_shows_and_redrives_with_the_original_key() {
    let (hook, addr) = start_hook(500).await;
    let to: Destination = format!("http://{addr}/hook").parse().unwrap();
    let store = store_with(&to, &["refund-4/notice"]).await;

    let out = idem_async(&store.url, &["relay", "--once", "--max-attempts", "1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("dead-lettered 1"),
        "{}",
        text(&out.stdout)
    );

    let out = idem_async(&store.url, &["dlq", "ls", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let letter = &listed[0];
    assert_eq!(letter["key"], "refund-4/notice");
    assert_eq!(letter["attempts"], 1);
    assert!(letter["last_error"].as_str().unwrap().contains("500"));
    let id = letter["id"].as_i64().unwrap().to_string();

    let out = idem_async(&store.url, &["dlq", "show", &id]).await;
    assert!(
        text(&out.stdout).contains("refund-4/notice"),
        "{}",
        text(&out.stdout)
    );
    let out = idem_async(&store.url, &["dlq", "ls"]).await;
    assert!(
        text(&out.stdout).contains("1 waiting, 0 redriven"),
        "{}",
        text(&out.stdout)
    );

    hook.lock().unwrap().answer = 200;
    let out = idem_async(&store.url, &["dlq", "redrive", &id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("with key refund-4/notice"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(hook.lock().unwrap().calls.get("refund-4/notice"), Some(&2));

    let out = idem_async(&store.url, &["dlq", "ls"]).await;
    assert!(
        text(&out.stdout).contains("0 waiting, 1 redriven"),
        "{}",
        text(&out.stdout)
    );
    let out = idem_async(&store.url, &["dlq", "redrive", "--all"]).await;
    assert!(
        text(&out.stdout).contains("0 redriven, 0 failed"),
        "{}",
        text(&out.stdout)
    );
    let out = idem_async(&store.url, &["dlq", "redrive", "999"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no dead letter with id 999"),
        "{}",
        text(&out.stderr)
    );
}

/// `idem relay --admin-listen` exports what the relay records: the outbox
/// and dead-letter gauges, the publish counters and the record gauges, with
/// `/healthz` beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_serves_its_metrics_and_health() {
    use std::io::{BufRead, BufReader};

    let (hook, addr) = start_hook(200).await;
    let to: Destination = format!("http://{addr}/hook").parse().unwrap();
    let store = store_with(&to, &["order-7/receipt"]).await;

    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "--store",
            &store.url,
            "relay",
            "--poll",
            "100ms",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env_remove("IDEM_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start idem relay");
    let stderr = child.stderr.take().unwrap();
    let (found, admin) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("idem relay: admin on http://") {
                let addr = rest.split_whitespace().next().unwrap().to_owned();
                let _ = found.send(addr);
            }
        }
    });
    let admin = admin
        .recv_timeout(Duration::from_secs(30))
        .expect("the relay announces its admin address");

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while hook.lock().unwrap().effects == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never called"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let get = |path: &str| {
        let url = format!("http://{admin}{path}");
        async move {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Empty<bytes::Bytes>>();
            let response = client.get(url.parse().unwrap()).await.unwrap();
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status, text(&body))
        }
    };
    let (status, _) = get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    let mut scraped = String::new();
    for _ in 0..100 {
        scraped = get("/metrics").await.1;
        if scraped.contains("outbox_sent_total 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().ok();
    child.wait().ok();
    for line in [
        "outbox_sent_total 1",
        "outbox_pending ",
        "outbox_lag_seconds ",
        "dead_letters 0",
        "messages_published_total{",
        "dedupe_retention_seconds ",
        "dedupe_records ",
    ] {
        assert!(scraped.contains(line), "no {line} in:\n{scraped}");
    }
}

/// The relay's crash point: aborted after the publish was confirmed and
/// before the row was marked sent, the next relay publishes it again with
/// the same key, and the receiver keeps one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_aborted_after_publish_republishes_with_the_same_key() {
    use std::os::unix::process::ExitStatusExt;

    let (hook, addr) = start_hook(200).await;
    let to: Destination = format!("http://{addr}/hook").parse().unwrap();
    let store = store_with(&to, &["order-8/receipt"]).await;

    let store_arg = store.url.clone();
    let aborted = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "--store", &store_arg, "relay", "--poll", "100ms", "--lease", "1s",
            ])
            .env_remove("IDEM_STORE")
            .env("IDEM_CRASH", "relay.after-publish")
            .output()
            .expect("run idem relay")
    })
    .await
    .unwrap();
    assert_eq!(
        aborted.status.signal(),
        Some(6),
        "{}",
        text(&aborted.stderr)
    );
    assert!(text(&aborted.stderr).contains("crash point relay.after-publish reached"));
    assert_eq!(hook.lock().unwrap().effects, 1);

    // The dead relay's claim on the row runs out; the next relay takes it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = idem_async(&store.url, &["relay", "--once"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("sent 1"),
        "{}",
        text(&out.stdout)
    );
    let hook = hook.lock().unwrap();
    assert_eq!(hook.calls.get("order-8/receipt"), Some(&2));
    assert_eq!(hook.effects, 1, "one effect across both publishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_groups_letters_by_cause_and_redrives_one_group_only_when_told_yes() {
    let (hook, addr) = start_hook(500).await;
    let to: Destination = format!("http://{addr}/hook").parse().unwrap();
    let store = store_with(&to, &["a/1", "b/2"]).await;
    let out = idem_async(&store.url, &["relay", "--once", "--max-attempts", "1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A third letter dies of another cause.
    hook.lock().unwrap().answer = 422;
    let any = store.open().await;
    let message = Message::new(IdempotencyKey::new("c/3").unwrap(), b"{}".to_vec());
    outbox::enqueue_now(&any, Route::To(&to), &message)
        .await
        .unwrap();
    let out = idem_async(&store.url, &["relay", "--once", "--max-attempts", "1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = idem_async(&store.url, &["dlq", "groups", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let groups: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!(groups[0]["letters"], 2);
    assert_eq!(groups[1]["letters"], 1);
    let five_hundred = groups[0]["cause"].as_str().unwrap().to_owned();
    assert!(five_hundred.contains("500"), "{five_hundred}");
    let table = idem_async(&store.url, &["dlq", "groups"]).await;
    assert!(
        text(&table.stdout).contains("3 letters in 2 groups"),
        "{}",
        text(&table.stdout)
    );

    // Without --yes: what would happen, and nothing redriven.
    hook.lock().unwrap().answer = 200;
    let out = idem_async(&store.url, &["dlq", "redrive", "--group", &five_hundred]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("would redrive 2 waiting letters"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(hook.lock().unwrap().calls.get("a/1"), Some(&1));

    // A cause nobody has is an error that says where to look.
    let out = idem_async(&store.url, &["dlq", "redrive", "--group", "no such cause"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("idem dlq groups"),
        "{}",
        text(&out.stderr)
    );

    let out = idem_async(
        &store.url,
        &["dlq", "redrive", "--group", &five_hundred, "--yes"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("2 redriven, 0 failed"),
        "{}",
        text(&out.stdout)
    );
    {
        let hook = hook.lock().unwrap();
        assert_eq!(hook.calls.get("a/1"), Some(&2));
        assert_eq!(hook.calls.get("b/2"), Some(&2));
        assert_eq!(hook.calls.get("c/3"), Some(&1), "the other group is left");
    }
    let out = idem_async(&store.url, &["dlq", "ls"]).await;
    assert!(
        text(&out.stdout).contains("1 waiting, 2 redriven"),
        "{}",
        text(&out.stdout)
    );
}
