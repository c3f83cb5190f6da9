//! The command line: [`Cli`] and the [`Command`]s it names, each with the
//! arguments its module in [`crate::commands`] declares; [`Cli::run`] hands
//! the parsed command to that module.

use clap::{Parser, Subcommand};

use crate::commands::audit::{self, AuditArgs};
use crate::commands::audit_log::{self, AuditLogArgs};
use crate::commands::check::{self, CheckArgs};
use crate::commands::conformance::{self, ConformanceArgs};
use crate::commands::console::{self, ConsoleArgs};
use crate::commands::demo::{self, DemoArgs};
use crate::commands::dlq::{self, DlqCommand};
use crate::commands::dup_proxy::{self, DupProxyArgs};
use crate::commands::forward::{self, ForwardArgs};
use crate::commands::gc::{self, GcArgs};
use crate::commands::keys::{self, KeysCommand};
use crate::commands::relay::{self, RelayArgs};
use crate::commands::serve::{self, ServeArgs};
#[cfg(feature = "lab")]
use crate::commands::torture::{self, TortureArgs};
use crate::commands::{atomic, location, migrate, open, open_waiting};

/// Idem: at-least-once delivery, effectively-once processing by idempotency keys.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
pub(crate) struct Cli {
    /// Where the store lives: sqlite://PATH or postgres://USER@HOST:PORT/DATABASE,
    /// or for leased mode only (serve, forward, keys, gc, dlq, audit-log,
    /// console, migrate) redis://HOST:PORT/DB, redis+cluster://HOST:PORT,HOST:PORT,
    /// dynamodb:///TABLE (the AWS chain's endpoint, region and credentials) or
    /// dynamodb+http://KEY:SECRET@HOST:PORT/TABLE (an emulator)
    /// [default: sqlite://idem.db; `demo` and `bench` default to a temporary file].
    #[arg(long, env = "IDEM_STORE", global = true, hide_env_values = true)]
    pub store: Option<String>,

    #[command(flatten)]
    pub telemetry: crate::telemetry::TelemetryArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
// Parsed once at start-up: the size of the serve variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade the store's schema.
    Migrate,
    /// Look at stored idempotency records; evict a key, end a stuck claim.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Delete records past retention, in bounded batches.
    Gc(GcArgs),
    /// Deliver a payment workload 1-3 times per message to a naive handler and
    /// to Idem, and compare the effects.
    Demo(DemoArgs),
    /// Measure throughput.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Bench(idem_bench::BenchCommand),
    /// Put Idempotency-Key semantics in front of any HTTP service: a gateway
    /// that forwards to --upstream and replays stored answers to retries.
    Serve(ServeArgs),
    /// Deliver each message of a RabbitMQ queue (amqp://, amqps://), a NATS
    /// JetStream consumer (nats://, tls://), a Kafka topic (kafka://) or an
    /// Amazon SQS queue (sqs://) to an HTTP or HTTPS endpoint with
    /// Idempotency-Key = the message's key; ack after the answer, retry with
    /// backoff, dead-letter after the last attempt.
    Forward(ForwardArgs),
    /// Publish the store's outbox rows to RabbitMQ (amqp://, amqps://), NATS
    /// (nats://, tls://), Kafka (kafka://), Amazon SQS (sqs://) or HTTP and
    /// HTTPS webhooks (http://, https://), each with its own key (AMQP
    /// message_id, Nats-Msg-Id, Kafka's idempotency-key header, SQS's
    /// idempotency-key attribute, Idempotency-Key); retry with jitter,
    /// dead-letter after N attempts.
    Relay(RelayArgs),
    /// List, show, redrive, discard and archive dead letters; a redrive
    /// keeps the original key.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// What operators changed by hand (idem keys rm and release, idem dlq
    /// discard and archive): who, when, what, and the record or letter as
    /// it was. Newest first.
    AuditLog(AuditLogArgs),
    /// The operator console: web pages and a JSON API over the store's
    /// records, in-flight claims, dead letters, outbox and audit log, with
    /// eviction and redrive. Loopback only unless given a token file.
    Console(ConsoleArgs),
    /// For staging: a reverse proxy that sends a share of the requests twice
    /// and reports the routes that answer the copy as a new request.
    DupProxy(DupProxyArgs),
    /// Test any HTTP endpoint that claims Idempotency-Key semantics, rule by
    /// rule: exit 0 when every required rule passes, 1 otherwise.
    Conformance(ConformanceArgs),
    /// Audit a running service: read its effect log incrementally beside it
    /// and report double effects, missing effects and effects without a
    /// record, with a counter per kind on /metrics.
    Audit(AuditArgs),
    /// Check a history of requests and answers against the effects they
    /// caused: exit 0 when clean, 1 on a violation, 2 on unreadable input.
    Check(CheckArgs),
    /// Run a fault campaign on the local stack: kill the gateway, fire crash
    /// points, cut it off its database, and check every trial's history.
    #[cfg(feature = "lab")]
    Torture(TortureArgs),
}

impl Cli {
    /// Runs the command.
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        idem::crash::arm_from_env()?;
        let store = self.store.as_deref();
        let key_in_spans = self.telemetry.key_in_spans;
        match self.command {
            Command::Migrate => migrate::run(&location(store)?).await,
            Command::Keys(command) => keys::run(&open(store).await?, &command).await,
            Command::AuditLog(args) => audit_log::run(&open(store).await?, &args).await,
            Command::Console(args) => {
                console::run(open(store).await?, &location(store)?, &args).await
            }
            Command::Gc(args) => gc::run(&location(store)?, &args).await,
            Command::Demo(args) => demo::run(atomic(store, "idem demo")?, &args).await,
            #[cfg(feature = "lab")]
            Command::Bench(command) => {
                idem_bench::run(atomic(store, "idem bench")?, &command).await
            }
            Command::Serve(args) => serve::run(store, &args, key_in_spans).await,
            Command::Forward(args) => {
                let opened = open_waiting(store, args.reconnect.reconnect()).await?;
                forward::run(opened, &args, key_in_spans).await
            }
            Command::Relay(args) => {
                atomic(
                    store,
                    "idem relay (it publishes the outbox rows effects write in their transaction)",
                )?;
                let opened = open_waiting(store, args.reconnect.reconnect()).await?;
                relay::run(opened, &args, key_in_spans).await
            }
            Command::Dlq(command) => dlq::run(open(store).await?, command).await,
            Command::DupProxy(args) => dup_proxy::run(&args).await,
            Command::Conformance(args) => conformance::run(&args).await,
            Command::Check(args) => check::run(store, &args).await,
            Command::Audit(args) => {
                atomic(
                    store,
                    "idem audit (it reads the effects a service writes in the store's database)",
                )?;
                audit::run(open(store).await?, &location(store)?, &args).await
            }
            #[cfg(feature = "lab")]
            Command::Torture(args) => torture::run(&args).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};

    /// The variables whose values may hold a password, a token or where
    /// one is kept.
    const SECRET_BEARING: [&str; 9] = [
        "IDEM_STORE",
        "IDEM_UPSTREAM",
        "IDEM_UPSTREAM_CA",
        "IDEM_UPSTREAM_CERT",
        "IDEM_UPSTREAM_KEY",
        "IDEM_TLS_CERT",
        "IDEM_TLS_KEY",
        "IDEM_TLS_CLIENT_CA",
        "IDEM_ADMIN_TOKEN_FILE",
    ];

    #[test]
    fn help_never_shows_the_value_of_a_secret_bearing_variable() {
        fn check(command: &clap::Command, checked: &mut usize) {
            for arg in command.get_arguments() {
                let Some(env) = arg.get_env().and_then(|env| env.to_str()) else {
                    continue;
                };
                if SECRET_BEARING.contains(&env) {
                    *checked += 1;
                    assert!(
                        arg.is_hide_env_values_set(),
                        "{} --{}: {env} would be shown in --help",
                        command.get_name(),
                        arg.get_id()
                    );
                }
            }
            for sub in command.get_subcommands() {
                check(sub, checked);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut checked = 0;
        check(&command, &mut checked);
        assert!(checked >= SECRET_BEARING.len(), "{checked}");
    }

    #[test]
    fn duration_flags_take_a_leading_hyphen_so_the_settings_can_say_what_is_wrong() {
        let cli = Cli::try_parse_from([
            "idem",
            "serve",
            "--lease",
            "-5s",
            "--upstream-timeout",
            "-1m",
            "--body-timeout",
            "-2s",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(args.settings.lease.as_deref(), Some("-5s"));
        assert_eq!(args.settings.upstream_timeout.as_deref(), Some("-1m"));
        assert_eq!(args.settings.body_timeout.as_deref(), Some("-2s"));
    }

    #[test]
    fn a_broker_url_that_does_not_parse_is_not_repeated() {
        for args in [
            vec![
                "idem",
                "forward",
                "--from",
                "tls://app:s3cret@h:4222/S/C?tls_kye=/k.pem",
                "--to",
                "http://127.0.0.1:8080/",
            ],
            vec![
                "idem",
                "relay",
                "--to",
                "nats://h:4222/s?token=s3cret&bogus=1",
            ],
            vec![
                "idem",
                "relay",
                "--to",
                "amqp://u:s3cret@h/%2f?cacertfile=/ca.pem&queue=q",
            ],
        ] {
            let error = Cli::try_parse_from(&args).unwrap_err().to_string();
            assert!(error.contains("invalid value for --"), "{error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
    }
}
