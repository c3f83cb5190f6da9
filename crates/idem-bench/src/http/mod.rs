//! `idem bench http`: the cost of the gateway, measured against the same
//! upstream called directly, in one run and one process: an in-process
//! upstream, an in-process gateway on the embedded store (or `--store`), and
//! N concurrent hyper-util clients.
//!
//! Phases, per upstream: direct POSTs; the same POSTs through the gateway with
//! unique keys (claim, forward, store); the same keys again (replays, answered
//! from the store without reaching the upstream); and POSTs without a key
//! (passed through). The phases take turns in rounds, so drift during the run
//! (disk flush latency, a growing WAL) weighs on all of them alike.
//! Throughput, p50/p99 latency and each phase's ratio to direct. Two
//! upstreams ([`upstream`]) show the two ends: one whose POSTs commit a row
//! durably (what idempotency keys exist for), and one that does nothing (the
//! gateway's own cost, on the same two cores as everything else).

mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use axum::http::StatusCode;
use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::StoreLocation;
use idem_demo::store::given_or_temporary;
use idem_gateway::{self as gateway, Gateway, GatewayConfig};
use idem_http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyConfig, IdempotencyLayer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::args::{BenchHttpArgs, UpstreamWork};
use crate::phase::{self, Phase};
use upstream::Upstream;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One request of a phase: where it goes, its key, its body.
struct Planned {
    uri: Uri,
    key: Option<HeaderValue>,
    body: Bytes,
}

/// What a phase expects of every answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Fresh,
    Replay,
}

/// Sends every planned request with `concurrency` clients, each its own task.
async fn drive(
    client: &HttpClient,
    name: &'static str,
    concurrency: usize,
    planned: Arc<Vec<Planned>>,
    expect: Expect,
) -> anyhow::Result<Phase> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, planned, next) = (client.clone(), Arc::clone(&planned), Arc::clone(&next));
        clients.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(plan) = planned.get(i) else {
                    return Ok::<_, anyhow::Error>(latencies);
                };
                let mut request = Request::post(plan.uri.clone())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(plan.body.clone()))?;
                if let Some(key) = &plan.key {
                    request.headers_mut().insert(IDEMPOTENCY_KEY, key.clone());
                }
                let sent = Instant::now();
                let response = client.request(request).await.context("request failed")?;
                let status = response.status();
                let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
                let body = response.into_body().collect().await?.to_bytes();
                latencies.push(sent.elapsed());
                anyhow::ensure!(
                    status == StatusCode::CREATED,
                    "{name}: expected 201, got {status}: {}",
                    String::from_utf8_lossy(&body)
                );
                anyhow::ensure!(
                    replayed == (expect == Expect::Replay),
                    "{name}: a request was {} where it should not have been",
                    if replayed { "replayed" } else { "forwarded" }
                );
            }
        });
    }
    let mut latencies = Vec::with_capacity(planned.len());
    while let Some(done) = clients.join_next().await {
        latencies.extend(done??);
    }
    let elapsed = start.elapsed();
    Ok(Phase {
        name,
        latencies,
        elapsed,
    })
}

fn plan(
    target: SocketAddr,
    label: &str,
    run: u32,
    n: usize,
    keyed: bool,
    body: usize,
) -> Arc<Vec<Planned>> {
    let uri: Uri = format!("http://{target}/orders")
        .parse()
        .expect("a valid URI");
    Arc::new(
        (0..n)
            .map(|i| {
                let filler = "x".repeat(body.saturating_sub(48));
                Planned {
                    uri: uri.clone(),
                    key: keyed.then(|| {
                        HeaderValue::try_from(format!("\"bench-{run:08x}-{label}-{i}\""))
                            .expect("a valid header")
                    }),
                    body: Bytes::from(format!(
                        "{{\"order\":{i},\"amount\":1,\"note\":\"{filler}\"}}"
                    )),
                }
            })
            .collect(),
    )
}

async fn measure(
    work: UpstreamWork,
    location: &StoreLocation,
    args: &BenchHttpArgs,
    client: &HttpClient,
) -> anyhow::Result<Vec<Phase>> {
    let upstream = Upstream::start(work).await?;
    let layer = IdempotencyLayer::open(location, IdempotencyConfig::default())
        .await
        .with_context(|| format!("cannot open the store at {location}"))?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let gateway_addr = listener.local_addr()?;
    let config = GatewayConfig::new(format!("http://{}", upstream.addr).parse()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(gateway::run(listener, Gateway::new(layer, config), async {
        stopped.await.ok();
    }));

    let run: u32 = rand::random();
    let (n, c, size) = (args.requests, args.concurrency, args.body);
    let warm = 200.min(n);
    drive(
        client,
        "warm-up",
        c,
        plan(upstream.addr, "w-direct", run, warm, true, size),
        Expect::Fresh,
    )
    .await?;
    drive(
        client,
        "warm-up",
        c,
        plan(gateway_addr, "w-gateway", run, warm, true, size),
        Expect::Fresh,
    )
    .await?;

    // Rounds interleave the phases, so drift (disk flush latency, a growing
    // WAL) weighs on direct and gateway alike.
    let rounds = args.rounds.clamp(1, n);
    let mut phases = [
        Phase::empty("direct"),
        Phase::empty("gateway, unique keys"),
        Phase::empty("gateway, replays"),
        Phase::empty("gateway, no key"),
    ];
    for round in 0..rounds {
        let share = n / rounds + usize::from(round < n % rounds);
        let label = |phase: &str| format!("{phase}-{round}");
        let unique = plan(gateway_addr, &label("unique"), run, share, true, size);
        let chunks = [
            (
                plan(upstream.addr, &label("direct"), run, share, true, size),
                Expect::Fresh,
            ),
            (Arc::clone(&unique), Expect::Fresh),
            (unique, Expect::Replay),
            (
                plan(gateway_addr, &label("none"), run, share, false, size),
                Expect::Fresh,
            ),
        ];
        for (phase, (planned, expect)) in phases.iter_mut().zip(chunks) {
            phase.add(drive(client, phase.name, c, planned, expect).await?);
        }
    }
    for phase in &mut phases {
        phase.latencies.sort_unstable();
    }

    let effects = upstream.effects().await?;
    let expected = 2 * warm + 3 * n;
    anyhow::ensure!(
        effects == expected,
        "the upstream applied {effects} effects where {expected} were expected (replays must add none)"
    );
    stop.send(()).ok();
    serving.await??;
    upstream.stop();
    Ok(phases.into())
}

/// Runs the benchmark with the gateway on `location`, or on a temporary
/// SQLite file per upstream.
pub(crate) async fn run(
    location: Option<StoreLocation>,
    args: &BenchHttpArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.requests > 0 && args.concurrency > 0,
        "--requests and --concurrency must be positive"
    );
    let works = match args.upstream {
        UpstreamWork::Both => vec![UpstreamWork::Durable, UpstreamWork::Echo],
        one => vec![one],
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(args.concurrency * 2)
        .build(connector);
    println!(
        "{} requests per phase, {} concurrent clients, {}-byte JSON bodies; upstream, gateway and clients in one process on {} cores",
        args.requests,
        args.concurrency,
        args.body,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for work in works {
        let (_temporary, location) = given_or_temporary(location.clone())?;
        let phases = measure(work, &location, args, &client).await?;
        let base = phases[0].per_second();
        let table = phase::table(&phases, base, "× direct");
        let what = match work {
            UpstreamWork::Durable => "durable: one SQLite commit (synchronous=FULL) per POST",
            _ => "echo: answers at once, keeps nothing",
        };
        println!("\nupstream {what}; gateway store {location}");
        println!("{table}");
        println!(
            "gateway ÷ direct: unique keys {:.2}× (target ≥ 0.5×), replays {:.2}× (target ≥ 0.9×)",
            phases[1].per_second() / base,
            phases[2].per_second() / base
        );
    }
    Ok(())
}
