//! `payments-probe`: serves the payments API on `--listen`, its table in `--db`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

/// A payments upstream that answers `idem serve --probe`.
#[derive(Parser)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "PAYMENTS_LISTEN", default_value = "127.0.0.1:9000")]
    listen: String,
    /// The SQLite file of payments.
    #[arg(long, env = "PAYMENTS_DB", default_value = "payments-probe.db")]
    db: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let db = payments_probe::open(&args.db)
        .with_context(|| format!("cannot open {}", args.db.display()))?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!(
        "payments-probe: listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, payments_probe::app(db))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
