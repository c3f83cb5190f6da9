//! `idem dup-proxy` run as a user runs it: a child process in front of an
//! upstream this test starts, stopped with SIGTERM, its report read on stdout.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

fn idem() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command
}

fn fails_clearly(args: &[&str], expected: &str) {
    let Output { status, stderr, .. } = idem().args(args).output().expect("run idem");
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_flags_get_a_clear_error() {
    let proxy = |extra: &[&str]| {
        let mut args = vec!["dup-proxy", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    for (extra, expected) in [
        (
            &["--upstream", "ftp://example.com"][..],
            "the gateway speaks HTTP or HTTPS",
        ),
        (&["--upstream", "127.0.0.1:9000"], "write http://HOST:PORT"),
        (&[], "--upstream <URL>"),
        (
            &["--upstream", "http://127.0.0.1:9", "--share", "1.5"],
            "not a share of requests",
        ),
        (
            &["--upstream", "http://127.0.0.1:9", "--delay", "soon"],
            "such as 300ms",
        ),
        (
            &[
                "--upstream",
                "http://127.0.0.1:9",
                "--delay",
                "1s",
                "--reorder",
            ],
            "cannot be used with",
        ),
        (
            &["--upstream", "http://127.0.0.1:9", "--effects-url", "stats"],
            "write http://HOST:PORT/PATH",
        ),
        (
            &["--upstream", "http://127.0.0.1:9", "--copies", "2"],
            "unexpected argument '--copies'",
        ),
    ] {
        let args = proxy(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_clearly(&args, expected);
    }
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("missing").join("history.jsonl");
    fails_clearly(
        &[
            "dup-proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
            "--history",
            history.to_str().unwrap(),
        ],
        "cannot create the history file",
    );
}

async fn naive(State(orders): State<Arc<AtomicU64>>) -> (axum::http::StatusCode, String) {
    let id = orders.fetch_add(1, Ordering::SeqCst) + 1;
    (axum::http::StatusCode::CREATED, format!("{{\"id\":{id}}}"))
}

/// Kills the child if the test fails before it exits.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
    }
}

#[tokio::test]
async fn the_report_names_the_naive_route_on_sigterm() {
    let orders = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route("/orders", post(naive))
        .with_state(Arc::clone(&orders));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut child = Running(
        idem()
            .args([
                "dup-proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                &format!("http://{upstream}"),
                "--share",
                "100%",
                "--reorder",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run idem dup-proxy"),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let addr: SocketAddr = first
        .strip_prefix("idem dup-proxy: listening on http://")
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("the listening line: {first:?}"))
        .parse()
        .unwrap();
    assert!(
        first.contains("sending 100% of the requests twice, the copy ahead of the original"),
        "{first}"
    );

    let client = Client::builder(TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", "order-1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 201);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"id\":2}", "the original went second");

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let exit = tokio::task::spawn_blocking(move || child.0.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{rest}");
    let line = rest
        .lines()
        .find(|line| line.contains("POST /orders"))
        .unwrap_or_else(|| panic!("a line for POST /orders in:\n{rest}"));
    assert!(
        line.contains("NOT IDEMPOTENT") && line.contains("order-1"),
        "{rest}"
    );
    assert_eq!(orders.load(Ordering::SeqCst), 2);
}
