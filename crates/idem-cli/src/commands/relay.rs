//! `idem relay`: publish the store's outbox rows, each with its own key, until
//! stopped (or once, with `--once`).
//!
//! Routing: a row enqueued with a destination goes there; a row enqueued for
//! the default (`Route::Default`) goes to `--to`. `--to` never redirects a row
//! that names its own destination: a message is published where the code that
//! enqueued it said. Without `--to`, default-routed rows wait for a relay
//! that has one.

use anyhow::Context;
use clap::Args;
use idem::AnyStore;
use idem_broker::outbox::{self, OutboxStore};
use idem_broker::publish::Destination;
use idem_broker::relay::{Pass, Relay, RelayConfig};
use idem_trace::KeyInSpans;

use super::args::SecretUrl;
use super::reconnect::{ReconnectArgs, Watchdog};
use super::upkeep::{Upkeep, UpkeepArgs};

/// `idem relay`
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Where rows enqueued without a destination go:
    /// amqp://USER:PASS@HOST:PORT[,HOST:PORT]/VHOST?queue=Q (or
    /// ?exchange=X&routing_key=K; several nodes of a cluster, tried in order),
    /// nats://HOST:PORT[,HOST:PORT]/SUBJECT (several servers of a cluster),
    /// kafka://HOST:PORT/TOPIC,
    /// sqs://[HOST]/[ACCOUNT/]QUEUE[?region=R&group=G] (Amazon SQS; on a FIFO
    /// queue the key is the MessageDeduplicationId and group= the
    /// MessageGroupId: NAME, key or header:NAME), or http(s)://HOST/PATH. Rows that name their
    /// own destination always go there. amqps:// and tls:// connect with TLS
    /// (see "Connecting securely").
    #[arg(long, value_parser = SecretUrl::<Destination>::new())]
    pub to: Option<Destination>,
    /// For https:// webhook destinations: a PEM file of the CA certificates
    /// their certificates are checked against [default: the bundled webpki
    /// roots].
    #[arg(long, value_name = "FILE")]
    pub webhook_ca: Option<std::path::PathBuf>,
    /// Publish every row that is due, sweep, and stop (instead of running until
    /// Ctrl-C or SIGTERM).
    #[arg(long)]
    pub once: bool,
    /// Rows claimed per pass.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Publishes in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Attempts before a row is moved to the dead letters (`idem dlq`).
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// How long a claimed row is protected from other relays.
    #[arg(long, default_value = "30s")]
    pub lease: humantime::Duration,
    /// How often to look for due rows when nothing woke the relay (PostgreSQL
    /// wakes it at once with NOTIFY).
    #[arg(long, default_value = "1s")]
    pub poll: humantime::Duration,
    /// How long sent rows and dead letters are kept.
    #[arg(long, default_value = "7d")]
    pub retention: humantime::Duration,
    /// Abandon a pass that takes longer than this (its broker connections
    /// are dropped and made again; its rows are published again when their
    /// claims end), such as 5m; `off` to never.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub watchdog: Watchdog,
    #[command(flatten)]
    pub reconnect: ReconnectArgs,
    #[command(flatten)]
    pub upkeep: UpkeepArgs,
}

pub(crate) async fn run(
    store: AnyStore,
    args: &RelayArgs,
    key_in_spans: KeyInSpans,
) -> anyhow::Result<()> {
    let mut connect = idem_broker::publish::ConnectOptions::default();
    if let Some(ca) = &args.webhook_ca {
        let tls = idem_gateway::UpstreamTls {
            ca: Some(ca.clone()),
            ..Default::default()
        };
        connect.webhook_tls = Some(std::sync::Arc::new(
            tls.client_config().context("--webhook-ca")?,
        ));
    }
    let config = RelayConfig {
        connect,
        default_destination: args.to.clone(),
        batch: args.batch.max(1),
        concurrency: args.concurrency.max(1),
        max_attempts: args.max_attempts.max(1),
        lease: args.lease.into(),
        poll_interval: args.poll.into(),
        retention: args.retention.into(),
        key_in_spans,
        reconnect: args.reconnect.reconnect(),
        watchdog: args.watchdog.0,
        ..RelayConfig::default()
    };
    outbox::migrate(&store)
        .await
        .context("cannot create the outbox tables")?;
    let upkeep = match args.once {
        true => None,
        false => Some(Upkeep::start(&store, &args.upkeep).await?),
    };
    let relay = Relay::new(store, config);
    let to = args
        .to
        .as_ref()
        .map_or_else(|| "none".to_owned(), Destination::redacted);
    if args.once {
        let pass = relay.drain().await.context("the relay pass failed")?;
        let swept = relay.upkeep().await.context("the sweep failed")?;
        report(&pass);
        let left = relay.store().outbox_stats().await?;
        println!(
            "{} rows still pending (retries not yet due, or no destination); swept {} sent rows and {} dead letters past retention",
            left.pending, swept.sent_rows, swept.dead_letters
        );
        return Ok(());
    }
    eprintln!(
        "relay {} publishing the outbox (default destination: {to}); Ctrl-C stops",
        relay.owner()
    );
    if let Some(upkeep) = &upkeep {
        upkeep.announce("idem relay");
    }
    eprintln!(
        "a message may be published again up to {} after its first publish: consumers need a dedupe window at least that long",
        humantime::format_duration(relay.config().retry_horizon())
    );
    let stopped = relay.run(shutdown()).await;
    if let Some(upkeep) = upkeep {
        upkeep.stop().await;
    }
    stopped.context("the relay stopped on an error")?;
    eprintln!("relay stopped");
    Ok(())
}

fn report(pass: &Pass) {
    println!(
        "claimed {}, sent {}, retrying later {}, postponed by the retry budget {}, dead-lettered {}",
        pass.claimed, pass.sent, pass.retried, pass.postponed, pass.dead_lettered
    );
    if pass.dead_lettered > 0 {
        println!("see them with `idem dlq ls`; `idem dlq redrive ID` sends one again with its key");
    }
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("install the SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
