//! `idem-demo`: the payment demo on its own, with the same flags and the same
//! table as `idem demo`. Parses the arguments and runs [`idem_demo::run`].

use anyhow::Context;
use clap::Parser;
use idem::StoreLocation;

/// Deliver a payment workload 1-3 times per message to a naive handler and
/// to Idem, and compare the effects.
#[derive(Debug, Parser)]
#[command(name = "idem-demo", version)]
struct Cli {
    /// Where the store lives: sqlite://PATH, or postgres://USER@HOST:PORT/DATABASE
    /// when built with the `postgres` feature [default: a temporary file,
    /// removed after the run].
    #[arg(long, env = "IDEM_STORE", hide_env_values = true)]
    store: Option<String>,

    #[command(flatten)]
    demo: idem_demo::DemoArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match demo(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", idem::error_chain(error.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn demo(cli: Cli) -> anyhow::Result<()> {
    let location = cli
        .store
        .map(|url| url.parse::<StoreLocation>())
        .transpose()
        .context("invalid --store (or IDEM_STORE)")?;
    if let Some(location) = &location {
        anyhow::ensure!(
            location.offers_atomic_mode(),
            "the demo needs atomic mode, where an effect and its record commit in one transaction of the store's database, and {location} is not an SQL store: use a sqlite:// or postgres:// store"
        );
    }
    idem_demo::run(location, &cli.demo).await
}
