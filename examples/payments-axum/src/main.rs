//! `payments-axum`: parses its arguments and serves the payments API until
//! Ctrl-C. Everything else is in the library.

use clap::Parser;
use idem::StoreLocation;

/// A payments API whose debits are applied once per Idempotency-Key.
#[derive(Debug, Parser)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "PAYMENTS_LISTEN", default_value = "127.0.0.1:3000")]
    listen: String,
    /// The database: sqlite://PATH (embedded, the default) or postgres://USER@HOST:PORT/DB.
    #[arg(long, env = "PAYMENTS_STORE", default_value = "sqlite://payments.db")]
    store: StoreLocation,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let app = payments_axum::app(&args.store).await?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!(
        "payments API on http://{} with store {}",
        listener.local_addr()?,
        args.store
    );
    payments_axum::run(listener, app, async {
        tokio::signal::ctrl_c().await.ok();
    })
    .await?;
    Ok(())
}
