//! `idem bench wait`: what a concurrent duplicate costs its client, with the
//! gateway answering 409 at once (the client polls, as `Retry-After` says)
//! and with the gateway letting it wait for the original's answer
//! (`--concurrent wait:DURATION`), in one run and one process.
//!
//! An in-process upstream works `--work` on each request. For each key,
//! `--duplicates` clients send the same request at once: one becomes the
//! original, the others are its concurrent duplicates. A client is done at
//! its *final answer*: the original's own, or the replay of it. In the
//! rejecting mode a duplicate gets 409 and sends again after `Retry-After`
//! until it gets the replay; in the waiting mode it gets the replay as soon
//! as the original's answer is stored. The two modes take turns in rounds,
//! each through its own gateway on the same store. Reported per mode: final
//! answers per second, the time to a final answer (p50, p99), the HTTP
//! requests it took, and the waiting mode's ratios to the rejecting one. The
//! upstream's effect count is checked: one per key in both modes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::StoreLocation;
use idem_demo::store::given_or_temporary;
use idem_gateway::{self as gateway, Gateway, GatewayConfig};
use idem_http::{
    Concurrent, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyConfig, IdempotencyLayer,
    WaiterCaps,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::args::BenchWaitArgs;
use crate::phase::Phase;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The upstream: works `work` on each POST, then counts one effect.
#[derive(Clone)]
struct Upstream {
    work: Duration,
    effects: Arc<AtomicUsize>,
}

async fn order(State(upstream): State<Upstream>, body: Bytes) -> (StatusCode, String) {
    tokio::time::sleep(upstream.work).await;
    let effect = upstream.effects.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!("{{\"order\":{effect},\"bytes\":{}}}", body.len()),
    )
}

/// Serves `app` on a free loopback port until `stop` is sent or dropped.
async fn serve(app: Router) -> anyhow::Result<(SocketAddr, oneshot::Sender<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                stopped.await.ok();
            })
            .await
    });
    Ok((addr, stop))
}

/// A gateway in front of `upstream` on `location`, answering concurrent
/// duplicates as `concurrent` says.
async fn start_gateway(
    location: &StoreLocation,
    upstream: SocketAddr,
    concurrent: Concurrent,
    waiters: usize,
) -> anyhow::Result<(SocketAddr, oneshot::Sender<()>)> {
    let config = IdempotencyConfig::default()
        .concurrent(concurrent)
        .waiter_caps(WaiterCaps {
            per_key: waiters,
            total: waiters,
        });
    let layer = IdempotencyLayer::open(location, config)
        .await
        .with_context(|| format!("cannot open the store at {location}"))?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let config = GatewayConfig::new(format!("http://{upstream}").parse()?)
        .upstream_timeout(Duration::from_secs(60));
    tokio::spawn(gateway::run(listener, Gateway::new(layer, config), async {
        stopped.await.ok();
    }));
    Ok((addr, stop))
}

/// What one client saw: the time to its final answer, how many requests
/// that took, and whether the final answer was a replay.
struct Final {
    took: Duration,
    requests: usize,
    replayed: bool,
    body: Bytes,
}

/// Sends the request until a final answer (201, fresh or replayed),
/// sleeping `Retry-After` after each 409.
async fn until_final(client: &HttpClient, uri: &Uri, key: &HeaderValue) -> anyhow::Result<Final> {
    let start = Instant::now();
    let mut requests = 0;
    loop {
        let mut request = Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(b"{\"amount\":10}")))?;
        request.headers_mut().insert(IDEMPOTENCY_KEY, key.clone());
        requests += 1;
        let response = client.request(request).await.context("request failed")?;
        let status = response.status();
        let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body = response.into_body().collect().await?.to_bytes();
        match status {
            StatusCode::CREATED => {
                return Ok(Final {
                    took: start.elapsed(),
                    requests,
                    replayed,
                    body,
                });
            }
            StatusCode::CONFLICT => {
                let pause = retry_after.context("a 409 without Retry-After")?;
                tokio::time::sleep(Duration::from_secs(pause)).await;
            }
            other => anyhow::bail!(
                "expected 201 or 409, got {other}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }
}

/// A mode's totals.
struct Measured {
    phase: Phase,
    requests: usize,
    replays: usize,
}

/// Sends `keys` keys, `concurrency` at a time, each by `duplicates` clients
/// at once, to the gateway at `target`.
async fn burst(
    client: &HttpClient,
    target: SocketAddr,
    label: &str,
    keys: usize,
    args: &BenchWaitArgs,
    name: &'static str,
) -> anyhow::Result<Measured> {
    let uri: Uri = format!("http://{target}/orders").parse()?;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut lanes = JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let (client, uri, next, label) = (
            client.clone(),
            uri.clone(),
            Arc::clone(&next),
            label.to_owned(),
        );
        let duplicates = args.duplicates.max(1);
        lanes.spawn(async move {
            let mut finals = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return Ok::<_, anyhow::Error>(finals);
                }
                let key = HeaderValue::try_from(format!("\"{label}-{i}\""))?;
                let mut copies = JoinSet::new();
                for _ in 0..duplicates {
                    let (client, uri, key) = (client.clone(), uri.clone(), key.clone());
                    copies.spawn(async move { until_final(&client, &uri, &key).await });
                }
                let answers: Vec<Final> = copies
                    .join_all()
                    .await
                    .into_iter()
                    .collect::<anyhow::Result<_>>()?;
                let fresh = answers.iter().filter(|a| !a.replayed).count();
                anyhow::ensure!(fresh == 1, "{fresh} fresh answers for one key");
                anyhow::ensure!(
                    answers.iter().all(|a| a.body == answers[0].body),
                    "a replay differs from its original"
                );
                finals.extend(answers);
            }
        });
    }
    let mut finals = Vec::new();
    while let Some(lane) = lanes.join_next().await {
        finals.extend(lane??);
    }
    let elapsed = start.elapsed();
    Ok(Measured {
        requests: finals.iter().map(|f| f.requests).sum(),
        replays: finals.iter().filter(|f| f.replayed).count(),
        phase: Phase {
            name,
            latencies: finals.iter().map(|f| f.took).collect(),
            elapsed,
        },
    })
}

/// Runs the benchmark on `location`, or on a temporary SQLite file.
pub(crate) async fn run(
    location: Option<StoreLocation>,
    args: &BenchWaitArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.keys > 0 && args.duplicates > 1 && args.concurrency > 0,
        "--keys and --concurrency must be positive, and --duplicates at least 2 (an original and a duplicate)"
    );
    let (_temporary, location) = given_or_temporary(location)?;
    let effects = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(order))
        .with_state(Upstream {
            work: args.work,
            effects: Arc::clone(&effects),
        });
    let (upstream, stop_upstream) = serve(app).await?;
    // Room for every duplicate in flight: the caps are not what is measured.
    let waiters = args.concurrency * args.duplicates;
    let (rejecting, stop_rejecting) =
        start_gateway(&location, upstream, Concurrent::Reject, waiters).await?;
    let (waiting, stop_waiting) =
        start_gateway(&location, upstream, Concurrent::Wait(args.wait), waiters).await?;

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(waiters * 2)
        .build(connector);
    println!(
        "{} keys per mode, each sent by {} clients at once, {} keys at a time; the upstream works {} per request; waiting up to {}; gateway store {location}; upstream, gateways and clients in one process on {} cores",
        args.keys,
        args.duplicates,
        args.concurrency,
        humantime::format_duration(args.work),
        humantime::format_duration(args.wait),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let run: u32 = rand::random();
    let rounds = args.rounds.clamp(1, args.keys);
    let mut modes = [
        (rejecting, "409, client polls", Vec::new()),
        (waiting, "wait for the original", Vec::new()),
    ];
    for round in 0..rounds {
        let share = args.keys / rounds + usize::from(round < args.keys % rounds);
        for (i, (target, name, parts)) in modes.iter_mut().enumerate() {
            let label = format!("bench-wait-{run:08x}-{i}-{round}");
            parts.push(burst(&client, *target, &label, share, args, name).await?);
        }
    }
    let measured: Vec<Measured> = modes
        .into_iter()
        .map(|(_, name, parts)| {
            let mut total = Measured {
                phase: Phase::empty(name),
                requests: 0,
                replays: 0,
            };
            for part in parts {
                total.phase.add(part.phase);
                total.requests += part.requests;
                total.replays += part.replays;
            }
            total.phase.latencies.sort_unstable();
            total
        })
        .collect();

    let applied = effects.load(Ordering::SeqCst);
    anyhow::ensure!(
        applied == 2 * args.keys,
        "the upstream applied {applied} effects where {} were expected (one per key)",
        2 * args.keys
    );
    stop_rejecting.send(()).ok();
    stop_waiting.send(()).ok();
    stop_upstream.send(()).ok();

    let base = &measured[0];
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "concurrent duplicates",
        "final answers",
        "answers/s",
        "p50 ms to final",
        "p99 ms to final",
        "HTTP requests",
        "× 409 mode answers/s",
    ]);
    for mode in &measured {
        table.add_row([
            mode.phase.name.to_owned(),
            format!("{} ({} replays)", mode.phase.latencies.len(), mode.replays),
            format!("{:.0}", mode.phase.per_second()),
            format!("{:.1}", mode.phase.percentile_ms(0.50)),
            format!("{:.1}", mode.phase.percentile_ms(0.99)),
            mode.requests.to_string(),
            format!("{:.2}", mode.phase.per_second() / base.phase.per_second()),
        ]);
    }
    println!("{table}");
    let waited = &measured[1];
    println!(
        "waiting ÷ 409: answers per second {:.2}×, p50 time to a final answer {:.2}×, p99 {:.2}×, HTTP requests {:.2}×; upstream effects {applied} (one per key)",
        waited.phase.per_second() / base.phase.per_second(),
        waited.phase.percentile_ms(0.50) / base.phase.percentile_ms(0.50),
        waited.phase.percentile_ms(0.99) / base.phase.percentile_ms(0.99),
        waited.requests as f64 / base.requests as f64,
    );
    Ok(())
}
