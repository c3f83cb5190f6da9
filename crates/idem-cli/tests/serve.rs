//! `idem serve` run as a user runs it: a child process in front of an
//! upstream this test starts, killed, stopped and restarted on the same file.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use common::store::sqlite_in;

/// An upstream that dedupes on the forwarded `Idempotency-Key`: the first
/// request with a key applies the effect and then waits for the gate; later
/// ones with that key get the first one's answer.
#[derive(Clone)]
struct Upstream {
    effects: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    answers: Arc<Mutex<HashMap<String, String>>>,
    gate: Arc<Semaphore>,
}

impl Upstream {
    fn new() -> Self {
        Self {
            effects: Arc::default(),
            calls: Arc::default(),
            answers: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn start(&self) -> SocketAddr {
        let app = Router::new()
            .route("/pay", post(pay))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

async fn pay(State(up): State<Upstream>, headers: HeaderMap) -> (StatusCode, String) {
    up.calls.fetch_add(1, Ordering::SeqCst);
    let Some(key) = headers.get("idempotency-key").and_then(|k| k.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key".into());
    };
    let known = up.answers.lock().unwrap().get(key).cloned();
    if let Some(answer) = known {
        return (StatusCode::CREATED, answer);
    }
    let effect = up.effects.fetch_add(1, Ordering::SeqCst) + 1;
    let answer = format!("{{\"effect\":{effect}}}");
    up.answers
        .lock()
        .unwrap()
        .insert(key.to_owned(), answer.clone());
    up.gate.acquire().await.unwrap().forget();
    (StatusCode::CREATED, answer)
}

/// A running `idem serve`, killed if still running when dropped.
struct Serve {
    child: Child,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    settings: String,
    /// Every line written on stdout up to the settings line.
    announced: String,
    stderr: Arc<Mutex<String>>,
    /// The thread collecting stderr; it ends at end of file, once the
    /// process has exited and everything it wrote has been read.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

fn idem() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command
}

impl Serve {
    /// Starts `idem <args>` and waits for it to say where it listens.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut child = idem()
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run idem serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let collected = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut text = collected.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        let (lines_tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    return;
                }
            }
        });
        let (mut addr, mut admin) = (None, None);
        let mut announced = String::new();
        let settings = loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!(
                        "idem serve did not start; stderr:\n{}",
                        stderr.lock().unwrap()
                    )
                });
            announced.push_str(&line);
            announced.push('\n');
            if let Some(rest) = line
                .strip_prefix("idem serve: listening on http://")
                .or_else(|| line.strip_prefix("idem serve: listening on https://"))
            {
                addr = Some(rest.split(',').next().unwrap().parse().unwrap());
            } else if let Some(rest) = line.strip_prefix("idem serve: admin on http://") {
                admin = Some(rest.split(' ').next().unwrap().parse().unwrap());
            } else if let Some(rest) = line.strip_prefix("idem serve: store ") {
                break rest.to_owned();
            }
        };
        Serve {
            child,
            addr: addr.expect("the listening line"),
            admin,
            settings,
            announced,
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                if let Some(reader) = self.stderr_reader.take() {
                    reader.join().unwrap();
                }
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "idem serve did not exit; stderr:\n{}",
            self.stderr.lock().unwrap()
        );
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> Result<Reply, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    let request = request
        .body(Full::new(Bytes::from_static(b"{\"amount\":10}")))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .map_err(|_| "no answer within 30 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status,
        headers,
        body,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_mid_request_and_restarted_on_the_same_file_the_effect_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    killed_mid_request_and_restarted_the_effect_is_applied_once(&sqlite_in(dir.path()), "order-1")
        .await;
}

/// The same on Redis: the claim of the killed gateway is in Redis, and the
/// restarted one finds it; `idem keys show` then shows the completed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_mid_request_and_restarted_on_redis_the_effect_is_applied_once() {
    if !idem_testkit::redis::machine_redis_answers() {
        return;
    }
    let store = idem_testkit::redis::redis_url();
    let key = idem_testkit::redis::test_prefix("serve");
    killed_mid_request_and_restarted_then_shown_completed(&store, &key).await;
}

/// The same on a DynamoDB table of its own (moto's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_mid_request_and_restarted_on_dynamodb_the_effect_is_applied_once() {
    let Some(store) = idem_testkit::dynamodb::fresh_table_url("serve") else {
        return;
    };
    killed_mid_request_and_restarted_then_shown_completed(&store, "order-1").await;
}

/// [`killed_mid_request_and_restarted_the_effect_is_applied_once`] on a
/// store of a server's own, then `idem keys show` on it.
async fn killed_mid_request_and_restarted_then_shown_completed(store: &str, key: &str) {
    killed_mid_request_and_restarted_the_effect_is_applied_once(store, key).await;
    let shown = idem()
        .args([
            "--store",
            store,
            "keys",
            "show",
            "http:anon:POST:/pay",
            key,
            "--json",
        ])
        .output()
        .expect("run idem keys show");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let record: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(record["state"], "completed", "{record}");
}

/// `idem serve` killed (SIGKILL) while the upstream holds a request, then
/// started again on the same store: after the lease, the retry is forwarded
/// again with the same key, the upstream applies it once, and it is replayed.
async fn killed_mid_request_and_restarted_the_effect_is_applied_once(store: &str, key: &str) {
    let upstream = Upstream::new();
    let up = upstream.start().await;
    let store = store.to_owned();
    let upstream_url = format!("http://{up}");
    // The spool in a directory of the test's own (a store that is not a
    // file would put it in the working directory).
    let spool_dir = tempfile::tempdir().unwrap();
    let spool = spool_dir.path().join("idem.spool").display().to_string();
    let args = [
        "--store",
        &store,
        "serve",
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
        "--lease",
        "1s",
        "--spool",
        &spool,
    ];
    let mut first = Serve::start(&args, &[]);
    let addr = first.addr;
    let moved = key.to_owned();
    let in_flight = tokio::spawn(async move { send(addr, "POST", "/pay", Some(&moved)).await });
    while upstream.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.child.kill().expect("SIGKILL"); // mid-request: the upstream holds it
    first.wait();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the client lost its answer"
    );

    let second = Serve::start(&args, &[]);
    // The dead gateway's claim holds until its lease (1 s) ends; then the
    // retry is forwarded again, with the same key, and the upstream dedupes.
    let mut reply = send(second.addr, "POST", "/pay", Some(key)).await.unwrap();
    let mut tries = 0;
    while reply.status == StatusCode::CONFLICT {
        assert!(reply.headers.contains_key("retry-after"));
        tries += 1;
        assert!(tries < 100, "still 409 after 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
        reply = send(second.addr, "POST", "/pay", Some(key)).await.unwrap();
    }
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    assert_eq!(reply.body, "{\"effect\":1}");
    assert_eq!(upstream.calls(), 2, "forwarded again after the lease");
    assert_eq!(upstream.effects(), 1, "applied once");

    let replay = send(second.addr, "POST", "/pay", Some(key)).await.unwrap();
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, reply.body);
    assert_eq!(upstream.calls(), 2);
    upstream.gate.add_permits(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_the_request_in_flight_finish_and_its_answer_is_kept() {
    let upstream = Upstream::new();
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let upstream_url = format!("http://{up}");
    let args = [
        "--store",
        &store,
        "serve",
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    let mut serve = Serve::start(&args, &[]);
    let admin = serve.admin.expect("an admin address");
    let health = send(admin, "GET", "/healthz", None).await.unwrap();
    assert_eq!(health.status, StatusCode::OK);

    let addr = serve.addr;
    let in_flight = tokio::spawn(async move { send(addr, "POST", "/pay", Some("order-2")).await });
    while upstream.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    serve.terminate();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        serve.child.try_wait().unwrap().is_none(),
        "it waits for the request in flight"
    );
    upstream.gate.add_permits(1);
    let answer = in_flight
        .await
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(answer.status, StatusCode::CREATED);
    let status = serve.wait();
    assert!(
        status.success(),
        "{status}; stderr:\n{}",
        serve.stderr.lock().unwrap()
    );
    assert!(serve.stderr.lock().unwrap().contains("shutting down"));

    // The answer was stored before the process exited: a new gateway replays it.
    let again = Serve::start(&args, &[]);
    let replay = send(again.addr, "POST", "/pay", Some("order-2"))
        .await
        .unwrap();
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, answer.body);
    assert_eq!(upstream.calls(), 1);
    let metrics = send(again.admin.unwrap(), "GET", "/metrics", None)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("gateway_requests_total{outcome=\"replayed\",route=\"POST /pay\"} 1"),
        "{text}"
    );
    assert!(text.contains("dedupe_records 1"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_listener_serves_the_operator_console() {
    let upstream = Upstream::new();
    upstream.gate.add_permits(10);
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let upstream_url = format!("http://{up}");
    let args = [
        "--store",
        &store,
        "serve",
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    let serve = Serve::start(&args, &[]);
    let admin = serve.admin.expect("an admin address");
    for _ in 0..2 {
        let paid = send(serve.addr, "POST", "/pay", Some("order-7"))
            .await
            .unwrap();
        assert_eq!(paid.status, StatusCode::CREATED);
    }
    let listed = send(admin, "GET", "/api/v1/records?key_prefix=order-", None)
        .await
        .unwrap();
    assert_eq!(listed.status, StatusCode::OK);
    let listed: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    let records = listed["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{listed}");
    assert_eq!(records[0]["key"], "order-7");
    assert_eq!(records[0]["state"], "completed");
    let page = send(admin, "GET", "/records", None).await.unwrap();
    assert_eq!(page.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&page.body).contains("order-7"));
    let metrics = send(admin, "GET", "/metrics", None).await.unwrap();
    assert_eq!(metrics.status, StatusCode::OK);
    assert_eq!(upstream.calls(), 1);
}

#[test]
fn settings_come_from_flags_then_environment_then_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "upstream = \"http://127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\nmax_body = \"10KiB\"\nlease = \"5s\"\nmode = \"stripe\"\n",
    )
    .unwrap();
    let store = sqlite_in(dir.path());
    let config = config.display().to_string();
    let base = ["--store", &store, "serve", "--config", &config];

    let from_file = Serve::start(&base, &[]);
    assert!(
        from_file.settings.contains("max body 10240 bytes"),
        "{}",
        from_file.settings
    );
    assert!(
        from_file.settings.contains("lease 5s"),
        "{}",
        from_file.settings
    );
    assert!(
        from_file.settings.contains("mode stripe"),
        "{}",
        from_file.settings
    );
    drop(from_file);

    let env = [("IDEM_MAX_BODY", "20KiB"), ("IDEM_LEASE", "7s")];
    let from_env = Serve::start(&base, &env);
    assert!(
        from_env.settings.contains("max body 20480 bytes"),
        "{}",
        from_env.settings
    );
    assert!(
        from_env.settings.contains("lease 7s"),
        "{}",
        from_env.settings
    );
    drop(from_env);

    let mut flagged: Vec<&str> = base.to_vec();
    flagged.extend(["--max-body", "30KiB", "--mode", "ietf", "--require-key"]);
    let from_flags = Serve::start(&flagged, &env);
    assert!(
        from_flags.settings.contains("max body 30720 bytes"),
        "{}",
        from_flags.settings
    );
    assert!(
        from_flags.settings.contains("lease 7s"),
        "{}",
        from_flags.settings
    );
    assert!(
        from_flags.settings.contains("mode ietf"),
        "{}",
        from_flags.settings
    );
    assert!(
        from_flags.settings.contains("key required"),
        "{}",
        from_flags.settings
    );
}

#[test]
fn bad_settings_are_refused_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "upstream = \"http://127.0.0.1:9\"\nretension = \"7d\"\n",
    )
    .unwrap();
    let config = config.display().to_string();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM").unwrap();
    let garbage = garbage.display().to_string();
    let missing = dir.path().join("missing.pem").display().to_string();
    let store = sqlite_in(dir.path());
    for (args, expected) in [
        (vec!["serve", "--config", &config], "retension"),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--max-body",
                "lots",
            ],
            "1MiB",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--lease",
                "soon",
            ],
            "--lease",
        ),
        (vec!["serve", "--listen", "127.0.0.1:0"], "--upstream"),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--lease",
                "-5s",
            ],
            "a negative duration",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--lease",
                "1ms",
            ],
            "shortest lease",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://localhost:18088/api",
                "--listen",
                "127.0.0.1:18088",
            ],
            "the gateway's own listener",
        ),
        (
            vec!["serve", "--upstream", "ftp://gw:SECRETPW@127.0.0.1:9"],
            "gw:***@",
        ),
        (
            vec!["serve", "--upstream", "ftp://127.0.0.1:9"],
            "HTTP or HTTPS",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--tls-cert",
                &garbage,
            ],
            "without --tls-key",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--tls-cert",
                &garbage,
                "--tls-key",
                &garbage,
            ],
            "no certificate in it",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "https://127.0.0.1:9",
                "--upstream-ca",
                &missing,
            ],
            "cannot read the upstream CA file",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "0.0.0.0:0",
            ],
            "--admin-token-file",
        ),
        (
            vec![
                "--store",
                "postgres://postgres@127.0.0.1:1/nowhere",
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
            ],
            "cannot open the store",
        ),
    ] {
        let mut args = args;
        if !args.contains(&"--store") {
            args.splice(0..0, ["--store", store.as_str()]);
        }
        let out = idem().args(&args).output().expect("run idem");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("SECRETPW"), "{args:?}: {stderr}");
    }
}

#[test]
fn the_upstream_password_is_never_printed_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let mut serve = Serve::start(
        &[
            "--store",
            &store,
            "serve",
            "--upstream",
            "http://gw:SECRETPW@127.0.0.1:9/api",
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert!(
        serve
            .announced
            .contains("forwarding to http://gw:***@127.0.0.1:9/api"),
        "{}",
        serve.announced
    );
    serve.terminate();
    assert!(serve.wait().success());
    let stderr = serve.stderr.lock().unwrap().clone();
    let everything = format!("{}{stderr}", serve.announced);
    assert!(!everything.contains("SECRETPW"), "{everything}");
}

#[test]
fn fingerprint_flags_are_read_and_bad_ones_refused_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let base = [
        "--store",
        &store,
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
    ];
    let mut good: Vec<&str> = base.to_vec();
    good.extend([
        "--fingerprint",
        "json:/currency,/amount",
        "--fingerprint-header",
        "X-Tenant",
        "--fingerprint-header",
        "content-type",
    ]);
    let serve = Serve::start(&good, &[]);
    assert!(
        serve
            .settings
            .contains("fingerprint json:/amount,/currency header:content-type header:x-tenant"),
        "{}",
        serve.settings
    );
    drop(serve);
    let from_env = Serve::start(&base, &[("IDEM_FINGERPRINT_IGNORE", "json:/sent_at")]);
    assert!(
        from_env
            .settings
            .contains("fingerprint ignore json:/sent_at"),
        "{}",
        from_env.settings
    );
    drop(from_env);

    for (flags, expected) in [
        (
            vec!["--fingerprint", "/amount"],
            "does not start with json:",
        ),
        (vec!["--fingerprint", "json:"], "names no field"),
        (
            vec!["--fingerprint-ignore", "json:sent_at"],
            "is not a JSON Pointer (RFC 6901): it does not start with /",
        ),
        (
            vec!["--fingerprint", "json:/a~3"],
            "a ~ that is not ~0 or ~1",
        ),
        (
            vec![
                "--fingerprint",
                "json:/amount",
                "--fingerprint-ignore",
                "json:/sent_at",
            ],
            "give one of the two",
        ),
        (
            vec!["--fingerprint-header", "x tenant"],
            "is not a header name",
        ),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(flags);
        let out = idem().args(&args).output().expect("run idem");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn a_bad_probe_and_a_spool_in_use_are_refused_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let out = idem()
        .args([
            "--store",
            &store,
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(["--probe", "GET /payments"])
        .output()
        .expect("run idem");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--probe") && stderr.contains("GET /payments/by-key/{key}"),
        "{stderr}"
    );

    let spool = dir.path().join("shared.spool").display().to_string();
    let first = Serve::start(
        &[
            "--store",
            &store,
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
        ],
        &[("IDEM_LISTEN", "127.0.0.1:0"), ("IDEM_SPOOL", &spool)],
    );
    let other = format!("sqlite://{}", dir.path().join("other.db").display());
    let out = idem()
        .args([
            "--store",
            &other,
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(["--listen", "127.0.0.1:0", "--spool", &spool])
        .output()
        .expect("run idem");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("in use by another process") && stderr.contains("--spool"),
        "{stderr}"
    );
    drop(first);
}

/// Retention runs itself: with a two-second window and a sweep every 200 ms,
/// a gateway taking a steady stream of new keys keeps its table near the
/// keys of the last two seconds or so — without the sweeper it would hold every
/// key it ever saw — and reports the sweep on /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_retention_under_steady_load_keeps_the_table_bounded() {
    use idem::RecordStore;

    let upstream = Upstream::new();
    upstream.gate.add_permits(1 << 20);
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let upstream_url = format!("http://{up}");
    let serve = Serve::start(
        &[
            "--store",
            &store,
            "serve",
            "--upstream",
            &upstream_url,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--lease",
            "1s",
            "--retention",
            "2s",
            "--sweep-every",
            "200ms",
        ],
        &[],
    );
    let records = idem::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();

    let started = std::time::Instant::now();
    let (mut sent, mut most) = (0, 0);
    while started.elapsed() < Duration::from_secs(4) {
        for _ in 0..10 {
            let reply = send(serve.addr, "POST", "/pay", Some(&format!("k-{sent}")))
                .await
                .unwrap();
            assert_eq!(reply.status, StatusCode::CREATED);
            sent += 1;
        }
        most = most.max(records.count().await.unwrap().total);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let per_second = sent as f64 / started.elapsed().as_secs_f64();
    assert_eq!(upstream.effects(), sent);
    assert!(
        (most as f64) < 3.5 * per_second + 20.0 && most < sent as u64 * 3 / 4,
        "the table held up to {most} records of {sent} sent at {per_second:.0}/s with a 2 s window"
    );

    let metrics = send(serve.admin.unwrap(), "GET", "/metrics", None)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    let swept: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("dedupe_records_swept_total "))
        .unwrap_or_else(|| panic!("no dedupe_records_swept_total in:\n{text}"))
        .trim()
        .parse()
        .unwrap();
    assert!(swept > 0.0, "{text}");
    assert!(text.contains("dedupe_retention_seconds 2"), "{text}");
}

/// `--tombstones`: a retry that arrives after its key's window, once the
/// sweeper has turned the record into a tombstone, is refused with 410 Gone
/// and runs nothing; every keyed answer said when its key would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_retry_is_refused_with_410_while_the_tombstone_lasts() {
    use idem::RecordStore;

    let upstream = Upstream::new();
    upstream.gate.add_permits(1 << 20);
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let upstream_url = format!("http://{up}");
    let serve = Serve::start(
        &[
            "--store",
            &store,
            "serve",
            "--upstream",
            &upstream_url,
            "--listen",
            "127.0.0.1:0",
            "--lease",
            "1s",
            "--retention",
            "2s",
            "--tombstones",
            "1h",
            "--sweep-every",
            "100ms",
        ],
        &[],
    );
    let first = send(serve.addr, "POST", "/pay", Some("late-1"))
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let expires = first
        .headers
        .get("idempotency-key-expires")
        .and_then(|v| v.to_str().ok())
        .map(httpdate::parse_http_date)
        .expect("an Idempotency-Key-Expires header")
        .expect("an HTTP-date");
    let left = expires
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(left <= Duration::from_secs(2), "{left:?}");

    let records = idem::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let swept = async {
        while records.count().await.unwrap().total > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), swept)
        .await
        .expect("the sweeper removes the expired record");
    let late = send(serve.addr, "POST", "/pay", Some("late-1"))
        .await
        .unwrap();
    assert_eq!(late.status, StatusCode::GONE, "{:?}", late.body);
    let problem: serde_json::Value = serde_json::from_slice(&late.body).unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:idempotency-key-expired");
    assert!(late.headers.contains_key("idempotency-key-expires"));
    assert_eq!(upstream.effects(), 1, "a late retry must not run");
}

/// What `idem serve` wrote on stderr (a pipe here) from start to a SIGTERM,
/// logging at info with `extra` flags.
fn logs_until_stopped(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let mut args = vec!["--store", &store];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
    ]);
    let mut serve = Serve::start(&args, &[("IDEM_LOG", "info")]);
    serve.terminate();
    assert!(serve.wait().success());
    // The reader thread has the last lines once the pipe closed.
    std::thread::sleep(Duration::from_millis(100));
    let logged = serve.stderr.lock().unwrap().clone();
    assert!(
        logged.contains("stopped accepting"),
        "the shutdown is logged at info:\n{logged}"
    );
    logged
}

#[test]
fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let logged = logs_until_stopped(&[]);
    assert!(!logged.contains("\x1b["), "ANSI escapes in:\n{logged}");
    assert!(logged.contains(" INFO "), "{logged}");
}

#[test]
fn log_format_json_writes_one_object_per_event() {
    let logged = logs_until_stopped(&["--log-format", "json"]);
    let events: Vec<serde_json::Value> = logged
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        events.iter().any(|event| event["level"] == "INFO"
            && event["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("stopped accepting"))),
        "{logged}"
    );
    assert!(!logged.contains(" INFO "), "no text lines: {logged}");
}

/// A crash point shipped in the binary: `IDEM_CRASH=http.before-answer`
/// makes the gateway abort after storing the answer and before sending it.
/// The client loses its answer; a gateway started again on the same file
/// replays it, and the upstream's effect happened once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_point_between_the_stored_answer_and_the_response_loses_nothing() {
    use std::os::unix::process::ExitStatusExt;

    let upstream = Upstream::new();
    upstream.gate.add_permits(16);
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let upstream_url = format!("http://{up}");
    let args = [
        "--store",
        &store,
        "serve",
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
    ];
    let mut armed = Serve::start(&args, &[("IDEM_CRASH", "http.before-answer")]);
    let lost = send(armed.addr, "POST", "/pay", Some("order-9")).await;
    assert!(lost.is_err(), "the answer never left");
    let status = armed.wait();
    assert_eq!(status.signal(), Some(6), "aborted (SIGABRT)");
    assert!(
        armed
            .stderr
            .lock()
            .unwrap()
            .contains("crash point http.before-answer reached"),
        "the point names itself"
    );

    let again = Serve::start(&args, &[]);
    let replay = send(again.addr, "POST", "/pay", Some("order-9"))
        .await
        .unwrap();
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(upstream.effects(), 1);
    assert_eq!(upstream.calls(), 1);
}

#[test]
fn an_unreadable_crash_setting_is_refused_at_start() {
    let output = idem()
        .args(["serve", "--upstream", "http://127.0.0.1:9"])
        .env("IDEM_CRASH", "apply.after-comit")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"apply.after-comit\" is not a crash point")
            && stderr.contains("apply.after-commit"),
        "{stderr}"
    );
}

/// The certificate `addr` serves, trusting only `ca`.
async fn served_certificate(addr: SocketAddr, ca: &idem_testkit::tls::TestCa) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_over_tls_reloads_its_certificate_on_sighup_and_guards_its_admin_listener() {
    let dir = tempfile::tempdir().unwrap();
    let ca = idem_testkit::tls::TestCa::new("test CA");
    let first = ca.server_for("first", &["127.0.0.1"]);
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, &first.cert_pem).unwrap();
    std::fs::write(&key, &first.key_pem).unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let store = sqlite_in(dir.path());
    let (cert, key, token) = (
        cert.display().to_string(),
        key.display().to_string(),
        token.display().to_string(),
    );
    let serve = Serve::start(
        &[
            "--store",
            &store,
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token-file",
            &token,
        ],
        &[],
    );
    assert_eq!(
        served_certificate(serve.addr, &ca).await,
        first.der.to_vec()
    );

    let second = ca.server_for("second", &["127.0.0.1"]);
    std::fs::write(&key, &second.key_pem).unwrap();
    std::fs::write(&cert, &second.cert_pem).unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &serve.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while served_certificate(serve.addr, &ca).await != second.der.to_vec() {
        assert!(
            std::time::Instant::now() < deadline,
            "never reloaded; stderr:\n{}",
            serve.stderr.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stderr = serve.stderr.lock().unwrap().clone();
    assert!(!stderr.contains("t0ken"), "the token is never printed");

    let admin = serve.admin.expect("the admin line");
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let scrape = |token: Option<&str>| {
        let mut request = http::Request::get(format!("http://{admin}/metrics"));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        client.request(request.body(Full::new(Bytes::new())).unwrap())
    };
    assert_eq!(
        scrape(None).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        scrape(Some("t0ken")).await.unwrap().status(),
        StatusCode::OK
    );
    serve.terminate();
}

/// A gRPC upstream in plain HTTP/2 (h2c), written against hyper: every call
/// answers one message naming the call's number, then a trailer with it and
/// `grpc-status: 0`.
async fn grpc_upstream(calls: Arc<AtomicUsize>) -> SocketAddr {
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let calls = Arc::clone(&calls);
            let answer = hyper::service::service_fn(move |request: http::Request<_>| {
                let calls = Arc::clone(&calls);
                async move {
                    let _request: hyper::body::Incoming = request.into_body();
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let message = format!("call {n}");
                    let mut framed = vec![0u8];
                    framed.extend((message.len() as u32).to_be_bytes());
                    framed.extend(message.as_bytes());
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    trailers.insert("x-call", n.to_string().parse().unwrap());
                    let frames = futures::stream::iter([
                        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(framed))),
                        Ok(Frame::trailers(trailers)),
                    ]);
                    let response = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(http_body_util::StreamBody::new(frames))
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), answer),
            );
        }
    });
    addr
}

/// One gRPC call in HTTP/2 to `addr`: its head, message and trailers.
async fn grpc_call(
    addr: SocketAddr,
    method: &str,
    key: &str,
) -> (http::HeaderMap, Bytes, http::HeaderMap) {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("http://{addr}{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1])))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .expect("an answer within 30 s")
        .expect("an HTTP/2 answer");
    assert_eq!(response.version(), http::Version::HTTP_2);
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.expect("the body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (headers, collected.to_bytes(), trailers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_calls_through_serve_over_http2_are_replayed_with_their_trailers() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = grpc_upstream(Arc::clone(&calls)).await;
    let serve = Serve::start(
        &[
            "--store",
            &sqlite_in(dir.path()),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &format!("h2c://{upstream}"),
            "--grpc-unary",
            "/test.v1.Orders/Place",
        ],
        &[],
    );
    let (head, message, trailers) = grpc_call(serve.addr, "/test.v1.Orders/Place", "g-1").await;
    assert!(!head.contains_key("idempotent-replayed"));
    assert_eq!(trailers["x-call"], "1");
    let (again_head, again_message, again_trailers) =
        grpc_call(serve.addr, "/test.v1.Orders/Place", "g-1").await;
    assert_eq!(again_head["idempotent-replayed"], "true");
    assert_eq!(again_message, message);
    assert_eq!(again_trailers["x-call"], "1");
    assert_eq!(again_trailers["grpc-status"], "0");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A method not listed passes through, key or not.
    for expected in [2, 3] {
        let (_, _, trailers) = grpc_call(serve.addr, "/test.v1.Orders/List", "g-1").await;
        assert_eq!(trailers["x-call"], expected.to_string().as_str());
    }
}
