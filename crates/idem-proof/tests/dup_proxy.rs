//! The duplicate-injection proxy on real sockets, in front of an upstream
//! with one idempotent route and one that applies every request it gets.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_check::history::Event;
use idem_proof::dup_proxy::{
    self, CopyTiming, DupProxy, DupProxyConfig, Report, RouteReport, RouteVerdict, Share,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// `POST /idempotent` creates one order per `Idempotency-Key` and answers a
/// repeat with the same answer; `POST /naive` creates one per request;
/// `GET /effects` counts the orders created.
#[derive(Clone, Default)]
struct Upstream {
    orders: Arc<AtomicU64>,
    by_key: Arc<Mutex<HashMap<String, String>>>,
}

impl Upstream {
    async fn start(&self) -> SocketAddr {
        let app = Router::new()
            .route("/idempotent", post(idempotent))
            .route("/naive", post(naive))
            .route(
                "/effects",
                get(|State(up): State<Upstream>| async move {
                    format!("{{\"count\":{}}}", up.orders.load(Ordering::SeqCst))
                }),
            )
            .with_state(self.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    fn create(&self) -> String {
        let id = self.orders.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{{\"id\":{id}}}")
    }
}

async fn idempotent(State(up): State<Upstream>, headers: HeaderMap) -> (StatusCode, String) {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let mut by_key = up.by_key.lock().unwrap();
    let answer = by_key.entry(key).or_insert_with(|| up.create());
    (StatusCode::CREATED, answer.clone())
}

async fn naive(State(up): State<Upstream>) -> (StatusCode, String) {
    (StatusCode::CREATED, up.create())
}

/// A proxy running in a task, stopped (and its copies awaited) by [`stop`](Self::stop).
struct Running {
    addr: SocketAddr,
    proxy: DupProxy,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn start(config: DupProxyConfig) -> Self {
        let proxy = DupProxy::new(config).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(dup_proxy::run(listener, proxy.clone(), async {
            stopped.await.ok();
        }));
        Self {
            addr,
            proxy,
            stop,
            task,
        }
    }

    /// Stops the proxy, waits for the copies still due, and reports.
    async fn stop(self) -> Report {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
        self.proxy.report().await
    }
}

fn config(upstream: SocketAddr) -> DupProxyConfig {
    DupProxyConfig::new(format!("http://{upstream}").parse().unwrap())
        .share(Share::new(1.0).unwrap())
        .seed(1)
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    proxy: SocketAddr,
    path: &str,
    key: Option<&str>,
    body: &'static [u8],
) -> (StatusCode, String) {
    let mut request = http::Request::post(format!("http://{proxy}{path}"));
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    let request = request.body(Full::new(Bytes::from_static(body))).unwrap();
    let response = client().request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn route<'a>(report: &'a Report, route: &str) -> &'a RouteReport {
    report
        .routes
        .iter()
        .find(|r| r.route == route)
        .unwrap_or_else(|| panic!("{route} in {report:?}"))
}

fn read_history(path: &Path) -> Vec<Event> {
    let file = std::fs::File::open(path).unwrap();
    idem_check::history::read(std::io::BufReader::new(file)).unwrap()
}

/// Every operation has an invoke and one completion, every copy names an
/// original, and each original's answer is one a client got.
fn check_history(events: &[Event], client_bodies: &[String]) {
    let mut invoked = HashMap::new();
    let mut answers = HashMap::new();
    for event in events {
        match event {
            Event::Invoke {
                op,
                process,
                key,
                fingerprint,
                duplicate_of,
                request,
                ..
            } => {
                assert_eq!(process, "dup-proxy");
                assert!(key.as_deref().is_some_and(|k| !k.contains('"')), "{key:?}");
                assert!(fingerprint.is_some());
                assert_eq!(request.as_ref().unwrap().method, "POST");
                invoked.insert(*op, *duplicate_of);
            }
            Event::Ok { op, answer, .. } => {
                assert!(
                    answers.insert(*op, answer.clone()).is_none(),
                    "op {op} twice"
                );
            }
            other => panic!("no failure expected: {other:?}"),
        }
    }
    assert_eq!(invoked.len(), answers.len(), "{events:?}");
    let copies: Vec<u64> = invoked.values().filter_map(|d| *d).collect();
    assert_eq!(
        copies.len() * 2,
        invoked.len(),
        "every request was sent twice"
    );
    for original in &copies {
        assert_eq!(invoked.get(original), Some(&None), "copy of an original");
    }
    for body in client_bodies {
        let hash = blake3::hash(body.as_bytes()).to_hex().to_string();
        // Every order id is created once, so a naive route's original and
        // copy never share a body.
        assert!(
            answers.iter().any(|(op, answer)| {
                answer.body_hash.as_deref() == Some(hash.as_str()) && invoked[op].is_none()
            }),
            "the client got {body}, the answer of an original and not of a copy"
        );
    }
}

#[tokio::test]
async fn concurrent_copies_single_out_the_naive_route() {
    let upstream = Upstream::default();
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let running = Running::start(config(up).history(&history)).await;
    let admin = idem_gateway::admin::start_admin_without_store(
        "127.0.0.1:0".parse().unwrap(),
        running.proxy.report_routes(),
        None,
        idem_gateway::admin::AllowedHosts::loopback(),
    )
    .await
    .unwrap();

    let mut bodies = Vec::new();
    for i in 0..3 {
        for path in ["/naive", "/idempotent"] {
            let (status, body) =
                send(running.addr, path, Some(&format!("k-{path}-{i}")), b"{}").await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            bodies.push(body);
        }
    }

    let report: serde_json::Value = {
        let uri = format!("http://{}/report", admin.local_addr());
        let response = client().get(uri.parse().unwrap()).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    };
    // A page of another site that rebinds its name to loopback is refused.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut socket = tokio::net::TcpStream::connect(admin.local_addr())
            .await
            .unwrap();
        socket
            .write_all(b"GET /report HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
        assert!(!answer.contains("not_idempotent"), "{answer}");
    }
    let naive = report["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == "POST /naive")
        .unwrap();
    assert_eq!(naive["verdict"], "not_idempotent", "{report}");
    assert_eq!(naive["different"], 3, "{report}");
    let metrics = {
        let uri = format!("http://{}/metrics", admin.local_addr());
        let response = client().get(uri.parse().unwrap()).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    };
    // Other tests in this process count into the same recorder.
    assert!(
        metrics.contains("dup_proxy_divergent_answers_total{route=\"POST /naive\"}"),
        "{metrics}"
    );
    assert!(!metrics.contains("divergent_answers_total{route=\"POST /idempotent\""));
    admin.stop().await;

    let report = running.stop().await;
    let naive = route(&report, "POST /naive");
    assert_eq!(naive.verdict, RouteVerdict::NotIdempotent);
    assert_eq!(
        (naive.requests, naive.duplicated, naive.different),
        (3, 3, 3)
    );
    assert!(
        naive
            .example_key
            .as_deref()
            .is_some_and(|k| k.starts_with("k-/naive"))
    );
    let idem = route(&report, "POST /idempotent");
    assert_eq!(idem.verdict, RouteVerdict::Idempotent);
    assert_eq!((idem.duplicated, idem.same, idem.different), (3, 3, 0));
    // Three orders per naive pair's two sends, one per idempotent pair.
    assert_eq!(upstream.orders.load(Ordering::SeqCst), 9);

    check_history(&read_history(&history), &bodies);
}

#[tokio::test]
async fn copies_after_the_answer_count_the_extra_effects() {
    let upstream = Upstream::default();
    let up = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let config = config(up)
        .timing(CopyTiming::AfterAnswer(Duration::from_millis(20)))
        .effects_url(format!("http://{up}/effects").parse().unwrap())
        .history(&history);
    let running = Running::start(config).await;

    let mut bodies = Vec::new();
    for i in 0..2 {
        for path in ["/naive", "/idempotent"] {
            let (status, body) =
                send(running.addr, path, Some(&format!("d-{path}-{i}")), b"{}").await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            bodies.push(body);
        }
    }
    // Stopping waits for the copies still due.
    let report = running.stop().await;
    let naive = route(&report, "POST /naive");
    assert_eq!(naive.verdict, RouteVerdict::NotIdempotent);
    assert_eq!((naive.duplicated, naive.different), (2, 2));
    assert_eq!(naive.extra_effects, Some(2));
    let idem = route(&report, "POST /idempotent");
    assert_eq!(idem.verdict, RouteVerdict::Idempotent);
    assert_eq!(idem.extra_effects, Some(0));
    let effects = report.effects.expect("an effect count");
    assert_eq!((effects.at_start, effects.now), (Some(0), Some(6)));
    assert!(effects.per_pair);

    check_history(&read_history(&history), &bodies);
}

#[tokio::test]
async fn a_copy_ahead_of_the_original_leaves_the_client_the_original_answer() {
    let upstream = Upstream::default();
    let up = upstream.start().await;
    let config = config(up)
        .timing(CopyTiming::Ahead)
        .effects_url(format!("http://{up}/effects").parse().unwrap());
    let running = Running::start(config).await;

    // The copy goes first and creates order 1; the client gets the original's order 2.
    let (status, body) = send(running.addr, "/naive", Some("r-1"), b"{}").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "{\"id\":2}"));
    let (_, body) = send(running.addr, "/idempotent", Some("r-2"), b"{}").await;
    assert_eq!(body, "{\"id\":3}");

    let report = running.stop().await;
    let naive = route(&report, "POST /naive");
    assert_eq!(
        (naive.verdict, naive.extra_effects),
        (RouteVerdict::NotIdempotent, Some(1))
    );
    assert_eq!(naive.example_key.as_deref(), Some("r-1"));
    let idem = route(&report, "POST /idempotent");
    assert_eq!(
        (idem.verdict, idem.extra_effects),
        (RouteVerdict::Idempotent, Some(0))
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_sent_once() {
    let upstream = Upstream::default();
    let up = upstream.start().await;
    let running = Running::start(config(up).max_body(16)).await;
    let (status, body) = send(running.addr, "/naive", Some("big"), &[b'x'; 100]).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "{\"id\":1}"));
    let report = running.stop().await;
    let naive = route(&report, "POST /naive");
    assert_eq!(
        (naive.requests, naive.too_large, naive.duplicated),
        (1, 1, 0)
    );
    assert_eq!(naive.verdict, RouteVerdict::Untested);
    assert_eq!(upstream.orders.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unreachable_upstream_gets_502_with_a_readable_body() {
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let running = Running::start(config(closed).history(&history)).await;
    let (status, body) = send(running.addr, "/orders/42", Some("u-1"), b"{}").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(body.contains("the upstream could not be reached"), "{body}");
    assert!(
        body.contains("urn:idem:problem:upstream-unreachable"),
        "{body}"
    );

    let report = running.stop().await;
    let orders = route(&report, "POST /orders/{id}");
    assert_eq!((orders.duplicated, orders.no_answer), (1, 1));
    assert_eq!(orders.verdict, RouteVerdict::Untested);
    let events = read_history(&history);
    let fails = events
        .iter()
        .filter(|e| matches!(e, Event::Fail { answer: None, .. }))
        .count();
    assert_eq!((events.len(), fails), (4, 2), "{events:?}");
}

#[tokio::test]
async fn the_admin_listener_with_a_token_guards_the_report_and_metrics() {
    let upstream = Upstream::default();
    let up = upstream.start().await;
    let running = Running::start(config(up)).await;
    let token = idem_gateway::admin::AdminToken::new("proxy-admin-t0ken").unwrap();

    let open = idem_gateway::admin::start_admin_without_store(
        "0.0.0.0:0".parse().unwrap(),
        running.proxy.report_routes(),
        None,
        idem_gateway::admin::AllowedHosts::loopback(),
    )
    .await;
    let Err(refused) = open else {
        panic!("a listener on every address needs a token");
    };
    assert!(
        refused.to_string().contains("--admin-token-file"),
        "{refused}"
    );

    let admin = idem_gateway::admin::start_admin_without_store(
        "127.0.0.1:0".parse().unwrap(),
        running.proxy.report_routes(),
        Some(token),
        idem_gateway::admin::AllowedHosts::loopback(),
    )
    .await
    .unwrap();
    let get = |path: &str, bearer: Option<&str>| {
        let mut request = axum::http::Request::get(format!("http://{}{path}", admin.local_addr()));
        if let Some(bearer) = bearer {
            request = request.header("authorization", format!("Bearer {bearer}"));
        }
        let request = request.body(Full::new(Bytes::new())).unwrap();
        async move { client().request(request).await.unwrap().status() }
    };
    assert_eq!(get("/report", None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        get("/metrics", Some("wrong")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get("/report", Some("proxy-admin-t0ken")).await,
        StatusCode::OK
    );
    assert_eq!(
        get("/metrics", Some("proxy-admin-t0ken")).await,
        StatusCode::OK
    );
    assert_eq!(get("/healthz", None).await, StatusCode::OK);
    admin.stop().await;
    running.stop().await;
}
