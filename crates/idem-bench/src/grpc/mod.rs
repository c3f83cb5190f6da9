//! `idem bench grpc`: the cost of gRPC idempotency keys, in one run and one
//! process. A tonic service is called bare; the same service behind
//! [`GrpcIdempotencyLayer`] with new keys and with the same keys again
//! (replays); and the bare service through `idem serve`'s gateway (HTTP/2
//! in, h2c to the service) with new keys, replays, and calls without a key.
//! The phases take turns in rounds, so drift weighs on all of them alike.
//! Every ratio is against the bare service called directly.

mod service;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use idem::StoreLocation;
use idem_demo::store::given_or_temporary;
use idem_gateway::{self as gateway, Gateway, GatewayConfig};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, IDEMPOTENT_REPLAYED};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;

use crate::args::{BenchGrpcArgs, UpstreamWork};
use crate::phase::{self, Phase};
use service::proto::PlaceRequest;
use service::proto::orders_client::OrdersClient;
use service::{PLACE, Service};

/// One call of a phase: its key and its request.
struct Planned {
    key: Option<AsciiMetadataValue>,
    request: PlaceRequest,
}

/// What a phase expects of every answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Fresh,
    Replay,
}

/// Makes every planned call with `concurrency` tasks over one channel (one
/// HTTP/2 connection, as a gRPC client keeps).
async fn drive(
    client: &OrdersClient<Channel>,
    name: &'static str,
    concurrency: usize,
    planned: Arc<Vec<Planned>>,
    expect: Expect,
) -> anyhow::Result<Phase> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (mut client, planned, next) = (client.clone(), Arc::clone(&planned), Arc::clone(&next));
        callers.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(plan) = planned.get(i) else {
                    return Ok::<_, anyhow::Error>(latencies);
                };
                let mut request = tonic::Request::new(plan.request.clone());
                if let Some(key) = &plan.key {
                    request
                        .metadata_mut()
                        .insert("idempotency-key", key.clone());
                }
                let sent = Instant::now();
                let reply = client
                    .place(request)
                    .await
                    .with_context(|| format!("{name}: a call failed"))?;
                latencies.push(sent.elapsed());
                let replayed = reply.metadata().contains_key(IDEMPOTENT_REPLAYED.as_str());
                anyhow::ensure!(
                    replayed == (expect == Expect::Replay),
                    "{name}: a call was {} where it should not have been",
                    if replayed { "replayed" } else { "run" }
                );
            }
        });
    }
    let mut latencies = Vec::with_capacity(planned.len());
    while let Some(done) = callers.join_next().await {
        latencies.extend(done??);
    }
    Ok(Phase {
        name,
        latencies,
        elapsed: start.elapsed(),
    })
}

fn plan(label: &str, run: u32, n: usize, keyed: bool) -> Arc<Vec<Planned>> {
    Arc::new(
        (0..n)
            .map(|i| Planned {
                key: keyed.then(|| {
                    MetadataValue::try_from(format!("bench-{run:08x}-{label}-{i}"))
                        .expect("a valid metadata value")
                }),
                request: PlaceRequest {
                    order: i as u64,
                    amount: 1,
                    note: format!("order {i} of {label}"),
                },
            })
            .collect(),
    )
}

async fn channel(addr: std::net::SocketAddr) -> anyhow::Result<OrdersClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    Ok(OrdersClient::new(channel))
}

async fn measure(
    work: UpstreamWork,
    location: &StoreLocation,
    args: &BenchGrpcArgs,
) -> anyhow::Result<Vec<Phase>> {
    let layer = IdempotencyLayer::open(location, IdempotencyConfig::default())
        .await
        .with_context(|| format!("cannot open the store at {location}"))?;
    let config = GrpcIdempotencyConfig::default().unary(PLACE);
    let bare = Service::start(work, None).await?;
    let layered = Service::start(
        work,
        Some(GrpcIdempotencyLayer::new(
            layer.store().clone(),
            config.clone(),
        )),
    )
    .await?;
    let grpc = GrpcIdempotencyLayer::new(layer.store().clone(), config);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let gateway_addr = listener.local_addr()?;
    let gateway_config = GatewayConfig::new(format!("h2c://{}", bare.addr).parse()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(gateway::run(
        listener,
        Gateway::new(layer, gateway_config).with_grpc(grpc),
        async {
            stopped.await.ok();
        },
    ));
    let direct = channel(bare.addr).await?;
    let behind_layer = channel(layered.addr).await?;
    let through_gateway = channel(gateway_addr).await?;

    let run: u32 = rand::random();
    let (n, c) = (args.calls, args.concurrency);
    let warm = 200.min(n);
    for (client, label) in [
        (&direct, "w-direct"),
        (&behind_layer, "w-layer"),
        (&through_gateway, "w-gateway"),
    ] {
        drive(
            client,
            "warm-up",
            c,
            plan(label, run, warm, true),
            Expect::Fresh,
        )
        .await?;
    }

    let rounds = args.rounds.clamp(1, n);
    let mut phases = [
        Phase::empty("direct"),
        Phase::empty("layer, new keys"),
        Phase::empty("layer, replays"),
        Phase::empty("idem serve, new keys"),
        Phase::empty("idem serve, replays"),
        Phase::empty("idem serve, no key"),
    ];
    for round in 0..rounds {
        let share = n / rounds + usize::from(round < n % rounds);
        let label = |phase: &str| format!("{phase}-{round}");
        let layer_keys = plan(&label("layer"), run, share, true);
        let gateway_keys = plan(&label("gateway"), run, share, true);
        let chunks = [
            (
                &direct,
                plan(&label("direct"), run, share, true),
                Expect::Fresh,
            ),
            (&behind_layer, Arc::clone(&layer_keys), Expect::Fresh),
            (&behind_layer, layer_keys, Expect::Replay),
            (&through_gateway, Arc::clone(&gateway_keys), Expect::Fresh),
            (&through_gateway, gateway_keys, Expect::Replay),
            (
                &through_gateway,
                plan(&label("none"), run, share, false),
                Expect::Fresh,
            ),
        ];
        for (phase, (client, planned, expect)) in phases.iter_mut().zip(chunks) {
            phase.add(drive(client, phase.name, c, planned, expect).await?);
        }
    }
    for phase in &mut phases {
        phase.latencies.sort_unstable();
    }

    // The bare service saw the direct calls and what the gateway forwarded;
    // the layered one only the new keys. Replays must add nothing.
    let expected_bare = 2 * warm + 3 * n;
    let expected_layered = warm + n;
    anyhow::ensure!(
        bare.effects() == expected_bare && layered.effects() == expected_layered,
        "effects: the bare service applied {} (expected {expected_bare}), the layered one {} (expected {expected_layered})",
        bare.effects(),
        layered.effects()
    );
    stop.send(()).ok();
    serving.await??;
    bare.stop();
    layered.stop();
    Ok(phases.into())
}

/// Runs the benchmark with the keys on `location`, or on a temporary SQLite
/// file per upstream.
pub(crate) async fn run(
    location: Option<StoreLocation>,
    args: &BenchGrpcArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.calls > 0 && args.concurrency > 0,
        "--calls and --concurrency must be positive"
    );
    let works = match args.upstream {
        UpstreamWork::Both => vec![UpstreamWork::Durable, UpstreamWork::Echo],
        one => vec![one],
    };
    println!(
        "{} unary calls per phase, {} concurrent callers per channel; services, gateway and clients in one process on {} cores",
        args.calls,
        args.concurrency,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for work in works {
        let (_temporary, location) = given_or_temporary(location.clone())?;
        let phases = measure(work, &location, args).await?;
        let base = phases[0].per_second();
        let what = match work {
            UpstreamWork::Durable => "durable: one SQLite commit (synchronous=FULL) per call",
            _ => "echo: answers at once, keeps nothing",
        };
        println!("\nservice {what}; key store {location}");
        println!("{}", phase::table(&phases, base, "× direct"));
        let ratio = |i: usize| phases[i].per_second() / base;
        println!(
            "layer ÷ bare: new keys {:.2}×, replays {:.2}×; idem serve ÷ direct: new keys {:.2}×, replays {:.2}×, no key {:.2}×",
            ratio(1),
            ratio(2),
            ratio(3),
            ratio(4),
            ratio(5)
        );
    }
    Ok(())
}
