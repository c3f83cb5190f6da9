//! `idem conformance` run as a user runs it: against an `idem serve` child
//! process in front of an upstream this test starts (exit 0, the JSON
//! report), and against that upstream alone, which applies every request
//! (exit 1, the failed rules named).

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::Value;

use common::store::TestStore;

fn idem() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command
}

/// Orders made, and by which key.
#[derive(Clone)]
struct Orders {
    applied: Arc<AtomicU64>,
    by_key: Arc<Mutex<HashMap<String, u64>>>,
}

/// Applies every `POST /orders` (one order each, 201 with its number), but
/// answers 500 without applying anything to a request carrying `X-Fail`,
/// and applies and then answers 502 to one carrying `X-Apply-Then-Fail`;
/// `GET /orders/by-key/{key}` is the probe (the order made under a key, or
/// 404); `GET /effects` answers the count as a plain number.
async fn start_orders(applied: Arc<AtomicU64>) -> SocketAddr {
    let orders = Orders {
        applied,
        by_key: Arc::default(),
    };
    let app = Router::new()
        .route(
            "/orders",
            post(
                |State(orders): State<Orders>, headers: HeaderMap| async move {
                    if headers.contains_key("x-fail") {
                        return (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "failing on purpose".to_owned(),
                        );
                    }
                    let order = orders.applied.fetch_add(1, Ordering::SeqCst) + 1;
                    if let Some(key) = headers
                        .get("idempotency-key")
                        .and_then(|v| idem_http::parse_key(v.as_bytes()).ok())
                    {
                        orders
                            .by_key
                            .lock()
                            .unwrap()
                            .insert(key.as_str().to_owned(), order);
                    }
                    if headers.contains_key("x-apply-then-fail") {
                        return (
                            StatusCode::BAD_GATEWAY,
                            "applied, then the proxy in front gave up".to_owned(),
                        );
                    }
                    (StatusCode::CREATED, format!("{{\"order\":{order}}}"))
                },
            ),
        )
        .route(
            "/orders/by-key/{key}",
            get(
                |State(orders): State<Orders>, Path(key): Path<String>| async move {
                    match orders.by_key.lock().unwrap().get(&key) {
                        Some(order) => (
                            StatusCode::OK,
                            [("idempotency-original-status", "201")],
                            format!("{{\"order\":{order}}}"),
                        )
                            .into_response(),
                        None => StatusCode::NOT_FOUND.into_response(),
                    }
                },
            ),
        )
        .route(
            "/effects",
            get(|State(orders): State<Orders>| async move {
                orders.applied.load(Ordering::SeqCst).to_string()
            }),
        )
        .with_state(orders);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `idem serve` in front of `upstream`, killed when dropped.
struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Serve {
    fn start(store: &str, upstream: SocketAddr) -> Serve {
        let mut child = idem()
            .args(["--store", store, "serve", "--listen", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--probe", "GET /orders/by-key/{key}"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run idem serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("idem serve said where it listens")
                .unwrap();
            if let Some(rest) = line.strip_prefix("idem serve: listening on http://") {
                break rest.split(',').next().unwrap().parse().unwrap();
            }
        };
        // Keep reading, so the child never blocks on a full pipe.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        Serve { child, addr }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `idem conformance` with `args`, run off the runtime that serves the
/// upstream.
async fn conformance(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        idem()
            .arg("conformance")
            .args(args)
            .output()
            .expect("run idem conformance")
    })
    .await
    .unwrap()
}

fn every_rule(server: SocketAddr, upstream: SocketAddr, json: bool) -> Vec<String> {
    let mut args = vec![
        format!("http://{server}"),
        "--path".into(),
        "/orders".into(),
        "--body".into(),
        r#"{"item": "book", "quantity": {seq}}"#.into(),
        "--effects-url".into(),
        format!("http://{upstream}/effects"),
        "--fail-header".into(),
        "X-Fail: 1".into(),
        "--apply-then-fail-header".into(),
        "X-Apply-Then-Fail: 1".into(),
        "--principal-header".into(),
        "Authorization".into(),
        "--principals".into(),
        "Bearer alice,Bearer bob".into(),
        "--timeout".into(),
        "5s".into(),
    ];
    if json {
        args.push("--json".into());
    }
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_serve_passes_every_rule_and_exits_0() {
    let applied = Arc::new(AtomicU64::new(0));
    let upstream = start_orders(Arc::clone(&applied)).await;
    let store = TestStore::sqlite();
    let serve = Serve::start(&store.url, upstream);

    let mut args = every_rule(serve.addr, upstream, true);
    args.extend(["--mode".into(), "ietf".into()]);
    let output = conformance(args).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert!(
        !stdout.contains("Bearer alice"),
        "a credential in the report"
    );
    assert_eq!(report["mode"], "ietf");
    assert_eq!(report["effects_counted"], true);
    let rules = report["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 9);
    let mut total = 0;
    for rule in rules {
        let name = rule["rule"].as_str().unwrap();
        let want = if name == "missing-key" {
            "info"
        } else {
            "pass"
        };
        assert_eq!(rule["outcome"], want, "{name}: {rule:#}");
        assert!(!rule["exchanges"].as_array().unwrap().is_empty(), "{name}");
        total += rule["effects"].as_u64().unwrap_or(0);
        if let Some(expected) = rule["effects_expected"].as_u64() {
            assert_eq!(rule["effects"].as_u64(), Some(expected), "{name}");
        }
    }
    assert_eq!(total, applied.load(Ordering::SeqCst));
    let concurrent = rules
        .iter()
        .find(|r| r["rule"] == "concurrent-applied-once")
        .unwrap();
    assert_eq!(concurrent["effects"], 1);
    let reuse = rules
        .iter()
        .find(|r| r["rule"] == "key-reuse-refused")
        .unwrap();
    assert_eq!(reuse["exchanges"][1]["status"], 422);
    assert!(
        reuse["exchanges"][0]["key"]
            .as_str()
            .unwrap()
            .starts_with("\"idem-conformance-")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_naive_upstream_fails_and_exits_1_naming_the_rules() {
    let applied = Arc::new(AtomicU64::new(0));
    let upstream = start_orders(Arc::clone(&applied)).await;
    let output = conformance(every_rule(upstream, upstream, false)).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "6 of 9 rules failed: retry-replayed, key-reuse-refused, concurrent-applied-once, ambiguous-5xx-applied-once, malformed-keys-refused, principals-kept-apart"
        ),
        "{stderr}"
    );
    assert!(
        stdout.contains("9 (want 1)"),
        "the concurrent copies' effects:\n{stdout}"
    );
    assert!(stdout.contains("FAIL"), "{stdout}");
    // 2 + 2 + 9 + 1 + 2 + 1 + 4 + 4 requests applied, every one.
    assert_eq!(applied.load(Ordering::SeqCst), 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    for (args, expected) in [
        (
            vec![
                format!("http://{dead}/orders"),
                "--body".into(),
                "{}".into(),
            ],
            "has no {seq}",
        ),
        (vec![format!("http://{dead}/orders")], "does not answer"),
        (
            vec!["ftp://example.com/x".into()],
            "not an http:// or https:// URL",
        ),
        (
            vec![
                format!("http://{dead}/orders"),
                "--effects-query".into(),
                "SELECT 1 AS key".into(),
            ],
            "--effects-store",
        ),
        (
            vec![
                format!("http://{dead}/orders"),
                "--effects-url".into(),
                "/effects".into(),
            ],
            "not a full URL",
        ),
        (
            vec![
                format!("http://{dead}/orders"),
                "--principal-header".into(),
                "Authorization".into(),
                "--principals".into(),
                "a,b,c".into(),
            ],
            "takes two values",
        ),
    ] {
        let output = conformance(args).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
