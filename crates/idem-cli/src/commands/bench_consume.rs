//! `idem bench consume`: messages per second through an effectively-once
//! consumer (apply, commit, ack) against a plain at-least-once consumer doing
//! the same effect with no dedupe (run the debit, commit, ack), on the same
//! broker and the same database, in one run; one message per transaction and
//! batches. Each phase gets a fresh queue (or stream) filled beforehand, so
//! only consuming is timed. The phases take turns in rounds, so drift during
//! the run (a checkpoint, a vacuum, a noisy neighbour) falls on all of them;
//! the ratios printed are the medians of each round's. Ratios, not absolute
//! numbers, carry between machines.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use futures::FutureExt;
use idem::{IdempotencyKey, Outcome, Scope, StoreLocation};
use idem_broker::consume::{
    ApplyBatch, Consumer, ConsumerConfig, Delivery, KeyedMessage, PgApply, Settle, Source,
    SourceOptions, SqliteApply, Transport,
};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::task::JoinSet;

use crate::latency::LatencyLink;
use crate::workload::{Bank, DebitError, Payment, pg_debit, sqlite_debit};

/// Batches applied at once in the batch phases (the runtime's default).
const BATCHES_AT_ONCE: usize = idem_broker::consume::DEFAULT_BATCHES_AT_ONCE;

/// `idem bench consume`
#[derive(Debug, Args)]
pub struct BenchConsumeArgs {
    /// The broker to consume from.
    #[arg(long, value_enum, default_value_t = BrokerArg::Amqp)]
    pub broker: BrokerArg,
    /// Messages per phase.
    #[arg(long, default_value_t = 10_000)]
    pub messages: usize,
    /// Messages per transaction in the batch phases.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Messages worked on at once in the single-message phases.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Accounts the debits spread over.
    #[arg(long, default_value_t = 1000)]
    pub accounts: i64,
    /// Rounds the phases take turns in; each round consumes a share of
    /// --messages in every phase.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The RabbitMQ broker.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
    /// The NATS server.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// One-way delay added between the benchmark and PostgreSQL, each way
    /// (for example 250us): every round trip to the database then costs
    /// twice this on top of its CPU, as across a network.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub db_latency: Option<Duration>,
    /// The PostgreSQL server a fresh database is made on when --store is not
    /// given (dropped after the run).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub postgres_server: String,
}

/// A broker for the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BrokerArg {
    /// RabbitMQ (lapin).
    Amqp,
    /// NATS JetStream (async-nats).
    Nats,
}

struct Phase {
    name: String,
    messages: usize,
    elapsed: Duration,
}

impl Phase {
    fn per_second(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Single,
    Batch,
}

pub async fn run(store: Option<StoreLocation>, args: &BenchConsumeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.messages > 0 && args.batch > 0 && args.concurrency > 0 && args.accounts > 0,
        "--messages, --batch, --concurrency and --accounts must be positive"
    );
    let run_id: u32 = rand::random();
    let (_fresh, location) = match store {
        Some(location) => (None, location),
        None => {
            let db = FreshDatabase::create(&args.postgres_server, run_id).await?;
            let location = StoreLocation::Postgres(db.url.clone());
            (Some(db), location)
        }
    };
    let (location, link) = match args.db_latency {
        Some(one_way) => {
            let (location, link) = behind_latency(&location, one_way)?;
            (location, Some(link))
        }
        None => (location, None),
    };
    let bank = Bank::open(&location).await?;
    bank.reset(args.accounts, i64::MAX / 2).await?;
    let broker = BenchBroker::new(args, run_id);
    println!(
        "broker {}; store {location}; {} messages per phase, {} at once in single mode, batches of {}",
        broker.name(),
        args.messages,
        args.concurrency,
        args.batch
    );
    if let Some(one_way) = args.db_latency {
        println!(
            "every byte to and from PostgreSQL is delayed by {} each way",
            humantime::format_duration(one_way)
        );
    }

    // A short warm-up of both consumers, not timed.
    let warm = args.messages.min(500);
    for (plain, mode) in [(true, Mode::Single), (false, Mode::Single)] {
        phase(&broker, &bank, args, warm, plain, mode, "warm").await?;
    }
    const KINDS: [(bool, Mode); 4] = [
        (true, Mode::Single),
        (false, Mode::Single),
        (true, Mode::Batch),
        (false, Mode::Batch),
    ];
    let label = |(plain, mode): (bool, Mode)| match (plain, mode) {
        (true, Mode::Single) => "plain at-least-once, 1 per tx".to_owned(),
        (false, Mode::Single) => "effectively-once, 1 per tx".to_owned(),
        (true, Mode::Batch) => format!("plain at-least-once, batch {}", args.batch),
        (false, Mode::Batch) => format!("effectively-once, batch {}", args.batch),
    };
    let mut phases: Vec<Phase> = KINDS
        .iter()
        .map(|&kind| Phase {
            name: label(kind),
            messages: 0,
            elapsed: Duration::ZERO,
        })
        .collect();
    let rounds = args.rounds.clamp(1, args.messages);
    let mut single_ratios = Vec::with_capacity(rounds);
    let mut batched_ratios = Vec::with_capacity(rounds);
    let mut batch_gains = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let share = args.messages / rounds + usize::from(round < args.messages % rounds);
        let mut rates = [0.0; 4];
        for (i, &(plain, mode)) in KINDS.iter().enumerate() {
            let tag = format!("r{round}");
            let elapsed = phase(&broker, &bank, args, share, plain, mode, &tag).await?;
            eprintln!(
                "round {}: {}: {share} messages in {:.2}s",
                round + 1,
                phases[i].name,
                elapsed.as_secs_f64()
            );
            phases[i].messages += share;
            phases[i].elapsed += elapsed;
            rates[i] = share as f64 / elapsed.as_secs_f64();
        }
        single_ratios.push(rates[1] / rates[0]);
        batched_ratios.push(rates[3] / rates[2]);
        batch_gains.push(rates[3] / rates[1]);
    }

    if let (Some(configured), Some(mean)) = (
        args.db_latency,
        link.as_ref().and_then(LatencyLink::mean_delay),
    ) {
        println!(
            "delay to and from PostgreSQL: {} each way as configured, {} measured (mean over the run, with the relay's wake-up)",
            humantime::format_duration(configured),
            humantime::format_duration(mean)
        );
    }
    let ledger = bank.ledger().await?;
    let expected = (warm * 2 + args.messages * 4) as i64;
    anyhow::ensure!(
        ledger.entries == expected,
        "{} effects were applied where {expected} were expected",
        ledger.entries
    );

    let base = phases[0].per_second();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "consumer",
        "messages",
        "seconds",
        "msg/s",
        "× plain 1/tx",
    ]);
    for phase in &phases {
        table.add_row([
            phase.name.clone(),
            phase.messages.to_string(),
            format!("{:.2}", phase.elapsed.as_secs_f64()),
            format!("{:.0}", phase.per_second()),
            format!("{:.2}", phase.per_second() / base),
        ]);
    }
    println!("{table}");
    println!(
        "effectively-once ÷ plain, median of {rounds} rounds: {:.2}× one per transaction (rounds {}), {:.2}× batched   (target ≥ 0.8×)",
        median(&mut single_ratios),
        list(&single_ratios),
        median(&mut batched_ratios),
    );
    println!(
        "effectively-once batch {} ÷ one per transaction, median of {rounds} rounds: {:.2}×   (target ≥ 3×)",
        args.batch,
        median(&mut batch_gains)
    );
    Ok(())
}

/// `location` reached through a [`LatencyLink`] that delays each direction by
/// `one_way`; PostgreSQL only.
fn behind_latency(
    location: &StoreLocation,
    one_way: Duration,
) -> anyhow::Result<(StoreLocation, LatencyLink)> {
    let StoreLocation::Postgres(url) = location else {
        anyhow::bail!("--db-latency needs a PostgreSQL store; {location} is not one");
    };
    let mut url = url::Url::parse(url).with_context(|| format!("cannot read {location}"))?;
    let host = url
        .host_str()
        .with_context(|| format!("{location} names no host to delay"))?;
    let upstream = format!("{host}:{}", url.port().unwrap_or(5432));
    let link = LatencyLink::start(&upstream, one_way)
        .with_context(|| format!("cannot start the latency relay to {upstream}"))?;
    let local = link.local_addr();
    let pointed = url.set_host(Some(&local.ip().to_string())).is_ok()
        && url.set_port(Some(local.port())).is_ok();
    anyhow::ensure!(pointed, "cannot point {location} at the latency relay");
    Ok((StoreLocation::Postgres(url.into()), link))
}

/// The median (the mean of the middle two for an even count); sorts `values`.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Ratios as `0.71 0.74 0.69`.
fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One phase of a round (`round` names it in the queue's name): a fresh
/// queue or stream, filled, then consumed to the end.
async fn phase(
    broker: &BenchBroker,
    bank: &Bank,
    args: &BenchConsumeArgs,
    messages: usize,
    plain: bool,
    mode: Mode,
    round: &str,
) -> anyhow::Result<Duration> {
    let tag = format!(
        "{round}-{}{}",
        if plain { "plain" } else { "idem" },
        match mode {
            Mode::Single => "1",
            Mode::Batch => "b",
        }
    );
    let queue = broker.declare(&tag).await?;
    let result = async {
        let keys = broker.fill(&queue, &tag, messages, args.accounts).await?;
        let prefetch = match mode {
            Mode::Single => (args.concurrency * 8).max(64),
            Mode::Batch => args.batch * (BATCHES_AT_ONCE + 1),
        };
        let options = SourceOptions {
            prefetch: u16::try_from(prefetch).unwrap_or(u16::MAX),
            ack_wait: Duration::from_secs(30),
        };
        let transport = queue
            .source
            .connect(options)
            .await
            .with_context(|| format!("cannot consume {}", queue.source))?;
        let started = Instant::now();
        if plain {
            plain_consume(transport, bank, args, mode, keys).await?;
        } else {
            idem_consume(transport, bank, args, mode, keys).await?;
        }
        Ok::<_, anyhow::Error>(started.elapsed())
    }
    .await;
    broker.delete(&queue).await;
    result
}

/// The debit a message asks for.
fn payment(key: IdempotencyKey, payload: &[u8]) -> Result<Payment, DebitError> {
    #[derive(serde::Deserialize)]
    struct Body {
        account: i64,
        amount: i64,
    }
    let body: Body = serde_json::from_slice(payload)?;
    Ok(Payment {
        id: key,
        account: body.account,
        amount: body.amount,
    })
}

/// Consumes `messages` deliveries through Idem's consumer runtime.
async fn idem_consume<T: Transport>(
    transport: T,
    bank: &Bank,
    args: &BenchConsumeArgs,
    mode: Mode,
    messages: usize,
) -> anyhow::Result<()> {
    let config = ConsumerConfig::new(Scope::new("bench-consume")?)
        .concurrency(args.concurrency)
        .batch(args.batch, Duration::from_millis(5));
    match bank {
        Bank::Sqlite(store) => {
            let apply = SqliteApply::new(store.clone(), |tx, message: &KeyedMessage| {
                let p = payment(message.key.clone(), message.payload())?;
                sqlite_debit(tx, &p).map_err(DebitError::from)
            });
            drive(Consumer::new(transport, apply, config), mode, messages).await
        }
        Bank::Postgres(store) => {
            let apply = PgApply::new(store.clone(), |conn, message: &KeyedMessage| match payment(
                message.key.clone(),
                message.payload(),
            ) {
                Ok(p) => pg_debit(conn, p)
                    .map(|r| r.map_err(DebitError::from))
                    .boxed(),
                Err(e) => futures::future::ready(Err::<Outcome, _>(e)).boxed(),
            });
            drive(Consumer::new(transport, apply, config), mode, messages).await
        }
    }
}

/// Runs a consumer until it settled `messages` deliveries.
async fn drive<T: Transport, A: ApplyBatch>(
    consumer: Consumer<T, A>,
    mode: Mode,
    messages: usize,
) -> anyhow::Result<()> {
    let stats = consumer.stats();
    let done = async {
        while (stats.snapshot().acked() as usize) < messages {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let finished = match mode {
        Mode::Single => consumer.run(done).await?,
        Mode::Batch => consumer.run_batched(done).await?,
    };
    anyhow::ensure!(
        finished.applied as usize == messages,
        "the effectively-once consumer applied {} of {messages} messages ({finished:?})",
        finished.applied
    );
    Ok(())
}

/// The plain at-least-once consumer: the same debit in its own transaction
/// (or one per batch), then the ack; no keys, no records.
async fn plain_consume<T: Transport>(
    mut transport: T,
    bank: &Bank,
    args: &BenchConsumeArgs,
    mode: Mode,
    messages: usize,
) -> anyhow::Result<()> {
    let mut done = 0;
    match mode {
        Mode::Single => {
            let mut working = JoinSet::new();
            while done < messages {
                while working.len() < args.concurrency && done + working.len() < messages {
                    let delivery = transport.receive().await?.context("the queue ended")?;
                    let bank = bank.clone();
                    working.spawn(async move {
                        let key = IdempotencyKey::new("plain").expect("valid key");
                        let p = payment(key, &delivery.message.payload)
                            .map_err(|e| anyhow::anyhow!(e))?;
                        bank.debit_bare(&p).await?;
                        delivery.settle.ack().await?;
                        Ok::<_, anyhow::Error>(())
                    });
                }
                if let Some(joined) = working.join_next().await {
                    joined??;
                    done += 1;
                }
            }
        }
        Mode::Batch => {
            // Four batches at once, like the effectively-once consumer; each
            // acks its own deliveries one by one after its commit.
            let mut working = JoinSet::new();
            let mut received = 0;
            while done < messages {
                while working.len() < BATCHES_AT_ONCE && received < messages {
                    let want = args.batch.min(messages - received);
                    let mut batch: Vec<Delivery<T::Settle>> = Vec::with_capacity(want);
                    batch.push(transport.receive().await?.context("the queue ended")?);
                    while batch.len() < want {
                        match tokio::time::timeout(Duration::from_millis(5), transport.receive())
                            .await
                        {
                            Ok(next) => batch.push(next?.context("the queue ended")?),
                            Err(_quiet) => break,
                        }
                    }
                    received += batch.len();
                    let bank = bank.clone();
                    working.spawn(async move {
                        let payments = batch
                            .iter()
                            .map(|d| {
                                let key = IdempotencyKey::new("plain").expect("valid key");
                                payment(key, &d.message.payload).map_err(|e| anyhow::anyhow!(e))
                            })
                            .collect::<anyhow::Result<Vec<_>>>()?;
                        bank.debit_bare_batch(&payments).await?;
                        for delivery in &batch {
                            delivery.settle.ack().await?;
                        }
                        Ok::<_, anyhow::Error>(batch.len())
                    });
                }
                if let Some(joined) = working.join_next().await {
                    done += joined??;
                }
            }
        }
    }
    transport.close().await;
    Ok(())
}

/// A queue or stream made for one phase.
struct BenchQueue {
    source: Source,
    name: String,
}

enum BenchBroker {
    Amqp { url: String, run: u32 },
    Nats { url: String, run: u32 },
}

impl BenchBroker {
    fn new(args: &BenchConsumeArgs, run: u32) -> Self {
        match args.broker {
            BrokerArg::Amqp => Self::Amqp {
                url: args.amqp_url.clone(),
                run,
            },
            BrokerArg::Nats => Self::Nats {
                url: args.nats_url.clone(),
                run,
            },
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Amqp { .. } => "RabbitMQ",
            Self::Nats { .. } => "NATS JetStream",
        }
    }

    async fn declare(&self, tag: &str) -> anyhow::Result<BenchQueue> {
        match self {
            Self::Amqp { url, run } => {
                let name = format!("idem-bench-{run:08x}-{tag}");
                let connection = amqp::connect(url).await?;
                let channel = connection.create_channel().await?;
                channel
                    .queue_declare(
                        name.as_str().into(),
                        amqp::QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        amqp::FieldTable::default(),
                    )
                    .await
                    .with_context(|| format!("cannot declare queue {name}"))?;
                connection.close(200, "declared".into()).await.ok();
                Ok(BenchQueue {
                    source: Source::Amqp {
                        url: url.clone(),
                        queue: name.clone(),
                    },
                    name,
                })
            }
            Self::Nats { url, run } => {
                let name = format!("IDEM_BENCH_{run:08X}_{}", tag.to_uppercase());
                let js = nats_context(url).await?;
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("idem-bench.{run:08x}.{tag}")],
                    ..Default::default()
                })
                .await
                .with_context(|| format!("cannot create stream {name}"))?;
                Ok(BenchQueue {
                    source: Source::Nats {
                        url: url.clone(),
                        stream: name.clone(),
                        consumer: "bench".into(),
                    },
                    name,
                })
            }
        }
    }

    /// Publishes `messages` debits, each with its own key, and waits until
    /// the broker confirmed them all.
    async fn fill(
        &self,
        queue: &BenchQueue,
        tag: &str,
        messages: usize,
        accounts: i64,
    ) -> anyhow::Result<usize> {
        let body = |i: usize| {
            serde_json::json!({ "account": i as i64 % accounts, "amount": 1 })
                .to_string()
                .into_bytes()
        };
        match self {
            Self::Amqp { url, run } => {
                let connection = amqp::connect(url).await?;
                let channel = connection.create_channel().await?;
                channel
                    .confirm_select(amqp::ConfirmSelectOptions::default())
                    .await?;
                for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
                    let mut confirms = Vec::with_capacity(chunk.len());
                    for &i in chunk {
                        let properties = amqp::BasicProperties::default()
                            .with_message_id(format!("bench-{run:08x}-{tag}-{i}").into())
                            .with_delivery_mode(2);
                        confirms.push(
                            channel
                                .basic_publish(
                                    "".into(),
                                    queue.name.as_str().into(),
                                    amqp::BasicPublishOptions::default(),
                                    &body(i),
                                    properties,
                                )
                                .await?,
                        );
                    }
                    for confirm in futures::future::join_all(confirms).await {
                        confirm?;
                    }
                }
                connection.close(200, "filled".into()).await.ok();
            }
            Self::Nats { url, run } => {
                let js = nats_context(url).await?;
                let subject = format!("idem-bench.{run:08x}.{tag}");
                for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
                    let mut acks = Vec::with_capacity(chunk.len());
                    for &i in chunk {
                        let mut headers = async_nats::HeaderMap::new();
                        headers
                            .insert("Nats-Msg-Id", format!("bench-{run:08x}-{tag}-{i}").as_str());
                        acks.push(
                            js.publish_with_headers(subject.clone(), headers, body(i).into())
                                .await?,
                        );
                    }
                    for ack in futures::future::join_all(
                        acks.into_iter().map(std::future::IntoFuture::into_future),
                    )
                    .await
                    {
                        ack?;
                    }
                }
            }
        }
        Ok(messages)
    }

    async fn delete(&self, queue: &BenchQueue) {
        let deleted: anyhow::Result<()> = async {
            match self {
                Self::Amqp { url, .. } => {
                    let connection = amqp::connect(url).await?;
                    let channel = connection.create_channel().await?;
                    channel
                        .queue_delete(queue.name.as_str().into(), Default::default())
                        .await?;
                    connection.close(200, "deleted".into()).await.ok();
                }
                Self::Nats { url, .. } => {
                    nats_context(url).await?.delete_stream(&queue.name).await?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(error) = deleted {
            eprintln!("warning: could not delete {}: {error:#}", queue.name);
        }
    }
}

async fn nats_context(url: &str) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("cannot connect to NATS at {url}"))?;
    Ok(async_nats::jetstream::new(client))
}

mod amqp {
    pub use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
    pub use lapin::types::FieldTable;
    pub use lapin::{BasicProperties, Connection};

    pub async fn connect(url: &str) -> anyhow::Result<Connection> {
        use anyhow::Context;
        Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .with_context(|| format!("cannot connect to RabbitMQ at {url}"))
    }
}

/// A PostgreSQL database made for one run and dropped after it.
struct FreshDatabase {
    url: String,
    server: String,
    name: String,
}

impl FreshDatabase {
    async fn create(server: &str, run: u32) -> anyhow::Result<Self> {
        let name = format!("idem_bench_consume_{run:08x}");
        let mut admin = PgConnection::connect(server)
            .await
            .with_context(|| format!("cannot connect to PostgreSQL at {server}; pass --store"))?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        admin.close().await.ok();
        let base = server.rsplit_once('/').map_or(server, |(base, _)| base);
        Ok(Self {
            url: format!("{base}/{name}"),
            server: server.to_owned(),
            name,
        })
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&server).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
                admin.close().await?;
                Ok::<_, anyhow::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: could not drop database {}", self.name);
        }
    }
}
