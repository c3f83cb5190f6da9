//! `idem forward`: the sidecar. Consumes a RabbitMQ queue, a JetStream
//! consumer or a Kafka topic (as a consumer group member) and `POST`s each message to an HTTP endpoint with
//! `Idempotency-Key` = the message's key; acks after a 2xx (or a terminal
//! 4xx, recorded as a dead letter), retries 409/408/429/5xx with jittered
//! backoff, dead-letters after the last attempt. Failure counts and dead
//! letters live in the store (`--store`, default `sqlite://idem.db`).

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use idem::{AnyStore, Scope};
use idem_broker::consume::{ConsumerConfig, KeyRule, KeySource, MissingKey, Source, SourceOptions};
use idem_broker::forward::{self, ForwardConfig};
use idem_trace::KeyInSpans;

use super::args::SecretUrl;
use super::reconnect::{ReconnectArgs, Watchdog};
use super::upkeep::{Upkeep, UpkeepArgs};

/// `idem forward`
#[derive(Debug, Args)]
pub(crate) struct ForwardArgs {
    /// Where messages come from: amqp://[USER:PASS@]HOST[:PORT][,HOST:PORT]/[VHOST/]QUEUE
    /// (several nodes of a cluster, tried in order on every connection),
    /// nats://HOST[:PORT][,HOST:PORT]/STREAM/CONSUMER (a durable pull
    /// consumer, created with explicit acks if missing; several servers of a
    /// cluster, the client moving to another when one drops), or
    /// kafka://HOST:PORT[,HOST:PORT]/TOPIC?group=GROUP (offsets committed
    /// after each record was answered; other query pairs are librdkafka settings),
    /// or sqs://[HOST]/[ACCOUNT/]QUEUE[?region=REGION] (Amazon SQS; no host:
    /// the AWS chain's endpoint; deleted after each message was answered;
    /// --ack-wait is the visibility timeout).
    /// amqps:// and tls:// connect with TLS (see "Connecting securely").
    #[arg(long, value_parser = SecretUrl::<Source>::new())]
    pub from: Source,
    /// The HTTP endpoint each message is POSTed to: http:// or https://.
    #[arg(long)]
    pub to: http::Uri,
    /// For an https:// endpoint: a PEM file of the CA certificates its
    /// certificate is checked against [default: the bundled webpki roots].
    #[arg(long, value_name = "FILE")]
    pub to_ca: Option<std::path::PathBuf>,
    /// Where each message's idempotency key is: message-id (AMQP message_id,
    /// Nats-Msg-Id, Kafka's idempotency-key header, SQS's idempotency-key
    /// attribute or a FIFO MessageDeduplicationId), record-key (Kafka),
    /// header:NAME, or json:PATH (/order/id or order.id).
    #[arg(long, default_value = "message-id")]
    pub key: KeySource,
    /// Key messages without one by their log position (NATS STREAM/SEQUENCE,
    /// Kafka TOPIC/PARTITION/OFFSET, SQS QUEUE/MESSAGE-ID): the
    /// last resort, which does not dedupe a publisher's repeats. Without it
    /// they are dead-lettered.
    #[arg(long)]
    pub key_from_position: bool,
    /// The scope failure counts are kept under.
    #[arg(long, default_value = "forward")]
    pub scope: String,
    /// Attempts before a message is dead-lettered.
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// Messages forwarded at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Deliveries held unacked at once (RabbitMQ prefetch, NATS pull batch,
    /// Kafka records fetched ahead per partition).
    #[arg(long, default_value_t = 64)]
    pub prefetch: u16,
    /// How long one request may take before it counts as failed.
    #[arg(long, default_value = "30s")]
    pub timeout: humantime::Duration,
    /// NATS ack-wait of a consumer that is created; SQS's visibility timeout
    /// (extended while a message is in hand).
    #[arg(long, default_value = "30s")]
    pub ack_wait: humantime::Duration,
    /// Ack terminal 4xx answers without recording them as dead letters.
    #[arg(long)]
    pub ack_rejected: bool,
    /// Restart the consumer in place (a new broker connection; the messages
    /// in hand are redelivered) when it holds messages and settles none for
    /// this long, such as 2m; `off` to never. Keep it well above
    /// --timeout.
    #[arg(long, value_name = "DURATION", default_value = "2m")]
    pub watchdog: Watchdog,
    #[command(flatten)]
    pub reconnect: ReconnectArgs,
    #[command(flatten)]
    pub upkeep: UpkeepArgs,
}

pub(crate) async fn run(
    store: AnyStore,
    args: &ForwardArgs,
    key_in_spans: KeyInSpans,
) -> anyhow::Result<()> {
    let scope = Scope::new(args.scope.clone()).context("invalid --scope")?;
    let missing = if args.key_from_position {
        MissingKey::Coordinates
    } else {
        MissingKey::DeadLetter
    };
    let mut consumer = ConsumerConfig::new(scope)
        .key(KeyRule::new(args.key.clone()).or_else(missing))
        .max_attempts(args.max_attempts)
        .concurrency(args.concurrency)
        .dead_letter_terminal_failures(!args.ack_rejected)
        .key_in_spans(key_in_spans);
    if let Watchdog(Some(after)) = args.watchdog {
        consumer = consumer.watchdog(after);
    }
    let mut forward = ForwardConfig::new(args.to.clone());
    forward.timeout = Duration::from(args.timeout);
    forward.key_in_spans = key_in_spans;
    forward.reconnect = args.reconnect.reconnect();
    if let Some(ca) = &args.to_ca {
        let tls = idem_gateway::UpstreamTls {
            ca: Some(ca.clone()),
            ..Default::default()
        };
        forward.tls = Some(std::sync::Arc::new(tls.client_config().context("--to-ca")?));
    }
    let options = SourceOptions {
        prefetch: args
            .prefetch
            .max(u16::try_from(args.concurrency).unwrap_or(u16::MAX)),
        ack_wait: args.ack_wait.into(),
        per_partition: 1,
    };
    eprintln!(
        "forwarding {} to {} (key: {}); Ctrl-C stops after the messages in hand are settled",
        args.from, args.to, args.key
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let upkeep = Upkeep::start(&store, &args.upkeep)
        .await?
        .with_dead_letter_gauges(&store);
    upkeep.announce("idem forward");
    let forwarded = forward::run(&args.from, options, store, forward, consumer, shutdown).await;
    upkeep.stop().await;
    let stats = forwarded.with_context(|| {
        format!(
            "forwarding from {} stopped on what reconnecting cannot fix",
            args.from
        )
    })?;
    eprintln!(
        "stopped: {} applied, {} duplicates answered by the endpoint, {} dead-lettered, {} given back for redelivery",
        stats.applied, stats.replayed, stats.dead_lettered, stats.requeued
    );
    Ok(())
}
