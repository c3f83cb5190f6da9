//! The lab: Idem's benchmarks, apart from the product. `idem bench …` hands
//! its subcommands to [`run`]; each benchmark prints its ratios against a
//! baseline measured in the same run, on the same machine and database,
//! because ratios — not absolute numbers — are what carry between machines.
//!
//! Modules:
//! - [`args`]: the flags of `idem bench apply|http|grpc|wait|consume|audit`;
//! - `apply`: `idem bench apply`, atomic apply against the bare transaction;
//! - `http`: `idem bench http`, the gateway against the upstream called directly;
//! - `grpc`: `idem bench grpc`, a tonic service behind the gRPC layer and
//!   through the gateway against the service called bare;
//! - `wait`: `idem bench wait`, bursts of concurrent duplicates answered
//!   409 (the client polls) against duplicates that wait for the original;
//! - `phase`: a measured phase of requests and the table of phases;
//! - `consume`: `idem bench consume`, the effectively-once consumer against a
//!   plain at-least-once one;
//! - `audit`: `idem bench audit`, the effect auditor's passes against
//!   reading the effects query whole;
//! - [`stores`]: a fresh PostgreSQL database for a run, and the way to it
//!   through the relay (the temporary SQLite file a run uses when given no
//!   store is `idem-demo`'s, as are the payment workload and its ledger);
//! - [`latency`]: a relay that delays every byte to and from PostgreSQL, so
//!   a loopback database costs what one across a network does.

pub mod args;
pub mod latency;
pub mod stores;

mod apply;
mod audit;
mod consume;
mod grpc;
mod http;
mod phase;
mod sweep;
mod wait;

pub use args::BenchCommand;

use idem::StoreLocation;

/// Runs the benchmark `command` asks for, on `store` or on a store made for
/// the run.
pub async fn run(store: Option<StoreLocation>, command: &BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Apply(args) => apply::run(store, args).await,
        BenchCommand::Http(args) => http::run(store, args).await,
        BenchCommand::Grpc(args) => grpc::run(store, args).await,
        BenchCommand::Wait(args) => wait::run(store, args).await,
        BenchCommand::Sweep(args) => sweep::run(store, args).await,
        BenchCommand::Consume(args) => consume::run(store, args).await,
        BenchCommand::Audit(args) => audit::run(store, args).await,
    }
}
