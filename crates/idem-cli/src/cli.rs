//! Command-line arguments.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Idem: at-least-once delivery, effectively-once processing by idempotency keys.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
pub struct Cli {
    /// Where the store lives: sqlite://PATH or postgres://USER@HOST:PORT/DATABASE
    /// [default: sqlite://idem.db; `demo` and `bench` default to a temporary file].
    #[arg(long, env = "IDEM_STORE", global = true)]
    pub store: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the store's schema.
    Migrate,
    /// Look at stored idempotency records.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Delete records past retention, in bounded batches.
    Gc(GcArgs),
    /// Deliver a payment workload 1-3 times per message to a naive handler and
    /// to Idem, and compare the effects.
    Demo(DemoArgs),
    /// Measure throughput.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// `idem keys ...`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// List records, newest first.
    Ls(LsArgs),
    /// Show one record in full.
    Show(ShowArgs),
}

/// How records are printed.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `idem keys ls`
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Only this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// At most this many records.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `idem keys show`
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The record's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A record state, as typed on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    /// Claimed, effect running (or its worker died).
    #[value(name = "in_flight", alias = "in-flight")]
    InFlight,
    /// Applied; replayed to duplicates.
    Completed,
    /// Failed terminally; replayed to duplicates.
    Failed,
}

/// `idem gc`
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Records deleted per transaction.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
}

/// `idem demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Payments in the workload.
    #[arg(long, default_value_t = 2000)]
    pub payments: usize,
    /// Accounts the payments debit.
    #[arg(long, default_value_t = 20)]
    pub accounts: i64,
    /// Concurrent workers consuming the deliveries.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Seed for the workload and the delivery order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// `idem bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Bare transaction vs atomic apply vs replay vs batched apply, in one run.
    Apply(BenchApplyArgs),
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
}
