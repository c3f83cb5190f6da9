//! `payments-grpc`: serves the payments service until Ctrl-C (`serve`), or
//! pays once through it with retries that carry one key (`pay`).

use std::sync::Arc;

use clap::{Parser, Subcommand};
use idem::IdempotencyKey;
use idem_grpc::GrpcRetry;
use idem_retry::{RetryBudget, RetryConfig};
use payments_grpc::proto::PayRequest;
use payments_grpc::proto::payments_client::PaymentsClient;

/// A gRPC payments service whose debits are applied once per idempotency key.
#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves the service.
    Serve {
        /// Where to listen.
        #[arg(long, env = "PAYMENTS_LISTEN", default_value = "127.0.0.1:50051")]
        listen: String,
        /// The SQLite database (created if missing).
        #[arg(long, env = "PAYMENTS_DB", default_value = "payments-grpc.db")]
        db: String,
    },
    /// Pays once: one key, retried on UNAVAILABLE and the like.
    Pay {
        /// The server.
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        server: String,
        /// The idempotency key: the same key for the same payment.
        #[arg(long)]
        key: String,
        /// The account debited.
        #[arg(long, default_value = "acc-1")]
        account: String,
        /// The amount, in cents.
        #[arg(long)]
        amount: i64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Args::parse().command {
        Command::Serve { listen, db } => {
            let service = payments_grpc::service(&db).await?;
            let listener = tokio::net::TcpListener::bind(&listen).await?;
            tracing::info!(
                "payments service on {} with database {db}",
                listener.local_addr()?
            );
            payments_grpc::run(listener, service, async {
                tokio::signal::ctrl_c().await.ok();
            })
            .await?;
        }
        Command::Pay {
            server,
            key,
            account,
            amount,
        } => {
            let client = PaymentsClient::connect(server).await?;
            let retry = GrpcRetry::new(RetryConfig::default(), Arc::new(RetryBudget::default()));
            let reply = retry
                .call(
                    IdempotencyKey::new(key)?,
                    PayRequest { account, amount },
                    |request| {
                        let mut client = client.clone();
                        async move { client.pay(request).await }
                    },
                )
                .await?;
            let replayed = reply.metadata().contains_key("idempotent-replayed");
            let reply = reply.into_inner();
            println!(
                "payment {} of {} from {}: balance {}{}",
                reply.payment,
                reply.amount,
                reply.account,
                reply.balance,
                if replayed { " (replayed)" } else { "" }
            );
        }
    }
    Ok(())
}
