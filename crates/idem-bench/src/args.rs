//! The arguments of `idem bench …`, as the `idem` command parses them. They
//! live with the benchmarks so that a benchmark and its flags change together;
//! the command line only mounts [`BenchCommand`] under `bench`.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

/// `idem bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Bare transaction vs atomic apply vs replay vs batched apply, in one run.
    Apply(BenchApplyArgs),
    /// The same upstream called directly and through the gateway (unique keys,
    /// replays, no key), in one run, with an in-process upstream and gateway.
    Http(BenchHttpArgs),
    /// A tonic service called bare, behind the gRPC layer (new keys,
    /// replays) and through the gateway over HTTP/2, in one run.
    Grpc(BenchGrpcArgs),
    /// Bursts of concurrent duplicates through the gateway, their original
    /// slow: duplicates answered 409 and polling (Retry-After) against
    /// duplicates waiting for the original's answer, in one run.
    Wait(BenchWaitArgs),
    /// The sweep of expired records with tombstones off and on, and the
    /// space a tombstone takes, in one run.
    Sweep(BenchSweepArgs),
    /// An effectively-once consumer vs a plain at-least-once one on RabbitMQ,
    /// NATS JetStream or Kafka into PostgreSQL, one message per transaction and batched.
    Consume(BenchConsumeArgs),
    /// The effect auditor's cost on the database (`idem audit`): a full
    /// pass over an effect log and its records, an idle pass and a pass over
    /// new rows, against reading the effects query whole, in one run.
    Audit(BenchAuditArgs),
}

/// `idem bench audit`
#[derive(Debug, Args)]
pub struct BenchAuditArgs {
    /// Effect rows (each with its completed record) in the log, such as
    /// 100000 or 100k.
    #[arg(long, default_value = "100k", value_parser = parse_count)]
    pub rows: u64,
    /// Rows per query.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// The wait between two queries of a pass in the paced phase.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub pause: Duration,
    /// Rows (and records) added before the last pass.
    #[arg(long, default_value_t = 1000)]
    pub new_rows: u64,
}

/// `idem bench apply`
#[derive(Debug, Args)]
pub struct BenchApplyArgs {
    /// Operations per phase.
    #[arg(long, default_value_t = 4000)]
    pub ops: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Share of extra deliveries that repeat an earlier key in the atomic phase (0.0-1.0).
    #[arg(long, default_value_t = 0.0)]
    pub duplicates: f64,
    /// Operations per transaction in the batched phase.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Accounts the operations update (fewer means more row contention).
    #[arg(long, default_value_t = 1000)]
    pub accounts: i64,
    /// Completed records to put in the dedupe table before measuring, spread
    /// over the retention window, such as 1000000 or 10M (k and M suffixes).
    #[arg(long, default_value = "0", value_parser = parse_count)]
    pub prefill: u64,
    /// Records past their window to put in the dedupe table, such as 1M;
    /// then atomic apply is measured without a sweep and again while the
    /// sweeper deletes them.
    #[arg(long, default_value = "0", value_parser = parse_count)]
    pub expired: u64,
}

/// A count such as `250000`, `250k` or `10M`.
fn parse_count(text: &str) -> Result<u64, String> {
    let trimmed = text.trim().replace('_', "");
    let (digits, scale) = match trimmed.strip_suffix(['k', 'K']) {
        Some(digits) => (digits, 1_000),
        None => match trimmed.strip_suffix('M') {
            Some(digits) => (digits, 1_000_000),
            None => (trimmed.as_str(), 1),
        },
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| {
            format!("{text:?} is not a count; write a whole number such as 1000000, 250k or 10M")
        })
}

/// `idem bench http`
#[derive(Debug, Args)]
pub struct BenchHttpArgs {
    /// Requests per phase.
    #[arg(long, default_value_t = 4000)]
    pub requests: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// What the upstream does per POST.
    #[arg(long, value_enum, default_value_t = UpstreamWork::Both)]
    pub upstream: UpstreamWork,
    /// Size of each request's JSON body, in bytes.
    #[arg(long, default_value_t = 256)]
    pub body: usize,
    /// Rounds in which the phases take turns, each sending requests/rounds
    /// per phase.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
}

/// `idem bench wait`
#[derive(Debug, Args)]
pub struct BenchWaitArgs {
    /// Keys per mode; each is sent by --duplicates clients at once.
    #[arg(long, default_value_t = 400)]
    pub keys: usize,
    /// Copies of each request sent at once (the original and its
    /// concurrent duplicates).
    #[arg(long, default_value_t = 8)]
    pub duplicates: usize,
    /// Keys in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// How long the upstream works on each request, such as 100ms.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub work: Duration,
    /// The longest a duplicate waits in the waiting mode (--concurrent
    /// wait:DURATION).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Rounds in which the two modes take turns, each sending keys/rounds
    /// keys per mode.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
}

/// `idem bench sweep`
#[derive(Debug, Args)]
pub struct BenchSweepArgs {
    /// Expired records swept per mode and round.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Records deleted per sweep transaction.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// The tombstone grace period of the mode with tombstones on.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// Rounds in which the two modes take turns.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// `idem bench grpc`
#[derive(Debug, Args)]
pub struct BenchGrpcArgs {
    /// Unary calls per phase.
    #[arg(long, default_value_t = 4000)]
    pub calls: usize,
    /// Concurrent callers on each channel.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// What the service does per call.
    #[arg(long, value_enum, default_value_t = UpstreamWork::Both)]
    pub upstream: UpstreamWork,
    /// Rounds in which the phases take turns, each making calls/rounds per
    /// phase.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
}

/// The in-process upstream of `idem bench http` and `idem bench grpc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UpstreamWork {
    /// Commits one row per POST to its own SQLite file (synchronous=FULL): a
    /// service whose POSTs have a durable effect, the kind keys exist for.
    Durable,
    /// Answers at once and keeps nothing: shows the gateway's own cost.
    Echo,
    /// Both, one after the other.
    Both,
}

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
    /// The Kafka bootstrap brokers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The SQS endpoint the benchmark's queues are made on (an emulator's,
    /// such as moto's server; credentials come from the AWS chain, e.g.
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long, default_value = "http://127.0.0.1:5000")]
    pub sqs_endpoint: String,
    /// The SQS region.
    #[arg(long, default_value = "us-east-1")]
    pub sqs_region: String,
    /// Partitions of each Kafka topic the benchmark makes (a partition is
    /// applied in order, one record at a time in the single phases).
    #[arg(long, default_value_t = 8)]
    pub kafka_partitions: i32,
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
    /// Kafka (rdkafka): a topic per phase, consumed by a consumer group.
    Kafka,
    /// Amazon SQS (the AWS SDK): a standard queue per phase.
    Sqs,
}
