//! Command-line arguments.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Idem: at-least-once delivery, effectively-once processing by idempotency keys.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
pub(crate) struct Cli {
    /// Where the store lives: sqlite://PATH or postgres://USER@HOST:PORT/DATABASE,
    /// or for leased mode only (serve, forward, keys, gc, dlq, audit-log)
    /// redis://HOST:PORT/DB or redis+cluster://HOST:PORT,HOST:PORT
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
    #[command(subcommand)]
    Bench(idem_bench::BenchCommand),
    /// Put Idempotency-Key semantics in front of any HTTP service: a gateway
    /// that forwards to --upstream and replays stored answers to retries.
    Serve(crate::commands::serve::ServeArgs),
    /// Deliver each message of a RabbitMQ queue or a NATS JetStream consumer
    /// to an HTTP endpoint with Idempotency-Key = the message's key; ack after
    /// the answer, retry with backoff, dead-letter after the last attempt.
    Forward(crate::commands::forward::ForwardArgs),
    /// Publish the store's outbox rows, each with its own key (AMQP message_id,
    /// Nats-Msg-Id, Idempotency-Key); retry with jitter, dead-letter after N attempts.
    Relay(crate::commands::relay::RelayArgs),
    /// List, show, redrive, discard and archive dead letters; a redrive
    /// keeps the original key.
    #[command(subcommand)]
    Dlq(crate::commands::dlq::DlqCommand),
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
    DupProxy(crate::commands::dup_proxy::DupProxyArgs),
    /// Test any HTTP endpoint that claims Idempotency-Key semantics, rule by
    /// rule: exit 0 when every required rule passes, 1 otherwise.
    Conformance(crate::commands::conformance::ConformanceArgs),
    /// Audit a running service: read its effect log incrementally beside it
    /// and report double effects, missing effects and effects without a
    /// record, with a counter per kind on /metrics.
    Audit(crate::commands::audit::AuditArgs),
    /// Check a history of requests and answers against the effects they
    /// caused: exit 0 when clean, 1 on a violation, 2 on unreadable input.
    Check(crate::commands::check::CheckArgs),
    /// Run a fault campaign on the local stack: kill the gateway, fire crash
    /// points, cut it off its database, and check every trial's history.
    Torture(crate::commands::torture::TortureArgs),
}

/// `idem keys ...`
#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// List records, newest first.
    Ls(LsArgs),
    /// Show one record in full.
    Show(ShowArgs),
    /// Evict a key: show its record, remove it (after a confirmation, or
    /// with --yes) and log it in the audit log. The key's next use applies
    /// its effect again.
    Rm(ChangeArgs),
    /// End a stuck in-flight claim now: its token is fenced (the holder's
    /// completion is refused) and the next claim runs at once with a
    /// greater token. Logged in the audit log.
    Release(ChangeArgs),
}

/// Who changes the store by hand, and whether they confirmed.
#[derive(Debug, Args)]
pub(crate) struct ConfirmArgs {
    /// Do it without asking; without it, idem asks on a terminal and
    /// otherwise only says what would change, and exits with status 1.
    #[arg(long)]
    pub yes: bool,
    /// Who does it, for the audit log [default: the operating-system user].
    #[arg(long, env = "IDEM_ACTOR", value_name = "NAME")]
    pub actor: Option<String>,
}

/// `idem keys rm` and `idem keys release`
#[derive(Debug, Args)]
pub(crate) struct ChangeArgs {
    /// The record's scope, as `idem keys ls` shows it (a principal's hash
    /// stays a hash).
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    #[command(flatten)]
    pub confirm: ConfirmArgs,
}

/// `idem console`
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    /// Where to serve the console. Any address but a loopback one needs
    /// --token-file.
    #[arg(long, default_value = "127.0.0.1:9300", value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// A file holding the operator token (read and act); callers send it as
    /// `Authorization: Bearer <token>`, browsers sign in with it once.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// A file holding a read-only token: its pages show no actions, and
    /// its actions are refused.
    #[arg(long, value_name = "FILE")]
    pub read_only_token_file: Option<std::path::PathBuf>,
    /// Another Host name the console answers to besides the loopback ones
    /// (localhost, *.localhost, 127.0.0.0/8, [::1]); a request naming any
    /// other is refused (421), so a web page cannot reach the console
    /// through DNS rebinding. Checked without a token always, with one when
    /// names are given. Repeat the flag or separate names with commas;
    /// *.example.com allows the names under example.com [default: loopback
    /// names only].
    #[arg(
        long = "allow-host",
        env = "IDEM_ALLOW_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); the
    /// sign-in cookies are then marked Secure [default: plain HTTP].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// How often the last hour's charts take a sample.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub sample_every: std::time::Duration,
    #[command(flatten)]
    pub auditor: ConsoleAuditorArgs,
}

/// The live auditor the console runs, shown on its Auditor page: the options
/// of `idem audit`, prefixed `--audit-`.
#[derive(Debug, Args)]
#[command(next_help_heading = "Auditor (the Auditor page)")]
pub(crate) struct ConsoleAuditorArgs {
    /// Run the auditor in the console over this effect log: a SQL query on
    /// the store's database, as `idem audit --effects-query` takes [default:
    /// no auditor].
    #[arg(long, value_name = "SQL", requires = "audit_scopes")]
    pub audit_effects_query: Option<String>,
    /// The integer column of the query that grows with every row.
    #[arg(long, value_name = "COLUMN", default_value = "id")]
    pub audit_cursor_column: String,
    /// A scope whose records are compared with the effects (repeat for several).
    #[arg(long = "audit-scope", value_name = "SCOPE")]
    pub audit_scopes: Vec<String>,
    /// Start after this cursor value instead of at the beginning of the log.
    #[arg(long, value_name = "CURSOR", allow_hyphen_values = true)]
    pub audit_after: Option<i64>,
    /// Rows per query (effects or records).
    #[arg(long, default_value_t = 1000)]
    pub audit_batch: usize,
    /// The wait between two queries of a pass.
    #[arg(long, value_name = "DURATION", default_value = "100ms")]
    pub audit_pause: humantime::Duration,
    /// The wait between two passes.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub audit_interval: humantime::Duration,
    /// How long after a record completed its effect may still be missing.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub audit_grace: humantime::Duration,
    /// The dedupe window: two effects of one key less than this apart are a
    /// double effect.
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub audit_window: humantime::Duration,
}

/// `idem audit-log`
#[derive(Debug, Args)]
pub(crate) struct AuditLogArgs {
    /// At most this many entries, newest first.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How records are printed.
#[derive(Debug, Args)]
pub(crate) struct OutputArgs {
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `idem keys ls`
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
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
pub(crate) struct ShowArgs {
    /// The record's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A record state, as typed on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StateArg {
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
pub(crate) struct GcArgs {
    /// Records deleted per transaction.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Leave a tombstone of each swept key for this long, such as 30d, so a
    /// late retry is refused instead of running again; give the gateway's
    /// `--tombstones` here too [default: off].
    #[arg(long, env = "IDEM_TOMBSTONES", value_name = "DURATION|off", value_parser = parse_grace)]
    pub tombstones: Option<Grace>,
}

/// A tombstone grace period as given: a duration, or `off`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grace(pub Option<std::time::Duration>);

fn parse_grace(text: &str) -> Result<Grace, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(Grace(None));
    }
    humantime::parse_duration(text.trim())
        .map(|d| Grace(Some(d)))
        .map_err(|e| format!("{e}; give a duration such as 30d or 12h, or off"))
}

/// `idem demo`
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
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

/// Parses a broker URL (`--from`, `--to`) whose error must not repeat it:
/// clap's own message for an invalid value quotes the value, password and
/// all. The type's error already shows the URL redacted.
#[derive(Debug)]
pub(crate) struct SecretUrl<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Clone for SecretUrl<T> {
    fn clone(&self) -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T> SecretUrl<T> {
    pub(crate) fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T> clap::builder::TypedValueParser for SecretUrl<T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Display,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg.map(ToString::to_string).unwrap_or_default();
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidUtf8,
                format!("the value of {name} is not UTF-8\n"),
            )
            .with_cmd(cmd)
        })?;
        text.parse().map_err(|e: T::Err| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {name}: {e}\n"),
            )
            .with_cmd(cmd)
        })
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
        assert_eq!(args.lease.as_deref(), Some("-5s"));
        assert_eq!(args.upstream_timeout.as_deref(), Some("-1m"));
        assert_eq!(args.body_timeout.as_deref(), Some("-2s"));
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
