//! Command-line arguments.

use std::path::PathBuf;

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
    Serve(ServeArgs),
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

/// `idem serve`. Each setting comes from its flag, else its `IDEM_*`
/// variable, else the `--config` file, else the default. The store is the
/// global `--store` (or `IDEM_STORE`, or `store` in the file) [default: sqlite://idem.db].
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The service to forward to: http://HOST:PORT or https://HOST:PORT
    /// (HTTP/1.1), or h2c://HOST:PORT (HTTP/2 without TLS, for gRPC),
    /// optionally with a base path.
    #[arg(
        long,
        env = "IDEM_UPSTREAM",
        value_name = "URL",
        hide_env_values = true
    )]
    pub upstream: Option<String>,
    /// For an https:// upstream: a PEM file of the CA certificates its
    /// certificate is checked against [default: the bundled webpki roots].
    #[arg(
        long,
        env = "IDEM_UPSTREAM_CA",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub upstream_ca: Option<String>,
    /// For an https:// upstream: a PEM client certificate to present (with
    /// --upstream-key) [default: none].
    #[arg(
        long,
        env = "IDEM_UPSTREAM_CERT",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub upstream_cert: Option<String>,
    /// The PEM private key of --upstream-cert.
    #[arg(
        long,
        env = "IDEM_UPSTREAM_KEY",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub upstream_key: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); reloaded
    /// on SIGHUP and when the file changes, without dropping connections
    /// [default: plain HTTP].
    #[arg(
        long,
        env = "IDEM_TLS_CERT",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub tls_cert: Option<String>,
    /// The PEM private key of --tls-cert.
    #[arg(
        long,
        env = "IDEM_TLS_KEY",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub tls_key: Option<String>,
    /// Require client certificates signed by a CA in this PEM file (mTLS);
    /// with --principal-header tls-subject their CN scopes the keys
    /// [default: none].
    #[arg(
        long,
        env = "IDEM_TLS_CLIENT_CA",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub tls_client_ca: Option<String>,
    /// A file holding the bearer token the admin listener requires
    /// (Authorization: Bearer TOKEN) on /metrics; needed when --admin-listen
    /// is not a loopback address [default: none].
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN_FILE",
        value_name = "FILE",
        hide_env_values = true
    )]
    pub admin_token_file: Option<String>,
    /// Another Host name the admin listener and its console answer to
    /// besides the loopback ones (localhost, *.localhost, 127.0.0.0/8,
    /// [::1]); a request naming any other is refused (421), so a web page
    /// cannot reach them through DNS rebinding. Repeat the flag or separate
    /// names with commas; *.example.com allows the names under example.com
    /// [default: loopback names only].
    #[arg(
        long = "allow-host",
        env = "IDEM_ALLOW_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// Where the gateway listens [default: 127.0.0.1:8080].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// How refusals are written: ietf (problem+json, 422 for a reused key) or
    /// stripe (idempotency_error, 400) [default: ietf].
    #[arg(long, env = "IDEM_MODE", value_name = "MODE")]
    pub mode: Option<String>,
    /// Refuse requests that carry no Idempotency-Key (400) when their method
    /// is one of --methods [default: false].
    #[arg(
        long,
        env = "IDEM_REQUIRE_KEY",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub require_key: Option<bool>,
    /// Largest keyed request body read, such as 1MiB, 64KiB or 65536; larger
    /// ones get 413 [default: 1MiB].
    #[arg(long, env = "IDEM_MAX_BODY", value_name = "SIZE")]
    pub max_body: Option<String>,
    /// How long an in-flight claim is protected, such as 60s or 2m; at least
    /// 1s [default: 60s].
    #[arg(
        long,
        env = "IDEM_LEASE",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub lease: Option<String>,
    /// How long answers are kept for replay: the dedupe window, such as 24h or
    /// 7d [default: 7d].
    #[arg(
        long,
        env = "IDEM_RETENTION",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub retention: Option<String>,
    /// Keep a tombstone of each swept key this much longer, such as 30d, so a
    /// late retry is refused with 410 Gone instead of running again
    /// [default: off].
    #[arg(
        long,
        env = "IDEM_TOMBSTONES",
        value_name = "DURATION|off",
        allow_hyphen_values = true
    )]
    pub tombstones: Option<String>,
    /// Settled answers kept in memory so replays skip the store, such as
    /// 64MiB, or `off`; an answer is served from memory until its record
    /// expires, and for at most 5 s after it was cached [default: 64MiB].
    #[arg(long, env = "IDEM_REPLAY_CACHE", value_name = "SIZE|off")]
    pub replay_cache: Option<String>,
    /// Serve /metrics (Prometheus) and /healthz on this address [default: off].
    #[arg(long, env = "IDEM_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// How long to wait for the upstream's answer; past it the outcome is
    /// unknown and the client gets 504 [default: 30s].
    #[arg(
        long,
        env = "IDEM_UPSTREAM_TIMEOUT",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub upstream_timeout: Option<String>,
    /// How long a client may take to send a keyed request's whole body;
    /// past it the request gets 408 and its key stays free. Also how long an
    /// HTTP/1.1 client may take to send a request's head, or leave its
    /// connection idle [default: 30s].
    #[arg(
        long,
        env = "IDEM_BODY_TIMEOUT",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub body_timeout: Option<String>,
    /// Ask the upstream before forwarding a retry whose earlier attempt ended
    /// unknown, such as 'GET /payments/by-key/{key}': 2xx = applied (its
    /// answer is stored and replayed), 404 = not applied (forwarded), anything
    /// else = 503 [default: off].
    #[arg(long, env = "IDEM_PROBE", value_name = "TEMPLATE")]
    pub probe: Option<String>,
    /// What an upstream answer means for its key, per status or class:
    /// store (kept and replayed), release (nothing happened: the retry is
    /// forwarded) or unknown (the key is kept; with --probe the retry asks
    /// it, else the key stays reserved for the lease), as in
    /// '500=store,502=unknown,5xx=release' [default: 2xx and 4xx store;
    /// 408, 409, 425, 429, 503 release; 502, 504 unknown; 500 unknown with a
    /// probe, else release].
    #[arg(long, env = "IDEM_ON_STATUS", value_name = "STATUS=VERDICT,...")]
    pub on_status: Option<String>,
    /// The local file where answers the store could not take yet are kept
    /// (synced) until stored, also across a restart; `off` for none
    /// [default: next to an SQLite store, STORE.spool; else idem.spool].
    #[arg(long, env = "IDEM_SPOOL", value_name = "PATH")]
    pub spool: Option<String>,
    /// The header that names the caller; keys are scoped by its hash, `none`
    /// to share one key space, `tls-subject` for the client certificate's CN
    /// (with --tls-client-ca) [default: authorization].
    #[arg(long, env = "IDEM_PRINCIPAL_HEADER", value_name = "HEADER")]
    pub principal_header: Option<String>,
    /// The methods on which --require-key refuses a request without an
    /// Idempotency-Key, comma-separated. A request that carries a key is
    /// deduplicated whatever its method (POST, PUT, PATCH, DELETE, ...);
    /// GET, HEAD, OPTIONS and TRACE pass through [default: POST,PATCH].
    #[arg(long, env = "IDEM_METHODS", value_name = "LIST")]
    pub methods: Option<String>,
    /// How often expired records are swept, ±50 % jitter, such as 60s or
    /// 10m; `off` when a cron job runs `idem gc` instead [default: 60s].
    #[arg(
        long,
        env = "IDEM_SWEEP_EVERY",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub sweep_every: Option<String>,
    /// The most requests answered at once; past it a request is answered 503
    /// with Retry-After at once instead of waiting in a queue, such as 256,
    /// or `off` [default: 1024].
    #[arg(long, env = "IDEM_MAX_IN_FLIGHT", value_name = "N")]
    pub max_in_flight: Option<String>,
    /// What a duplicate gets while its original is still running: `reject`
    /// (409 with Retry-After at once) or `wait:DURATION`, such as wait:5s
    /// (the original's answer as a replay as soon as it is stored, or 409
    /// when the wait runs out or the original ends without one)
    /// [default: reject].
    #[arg(long, env = "IDEM_CONCURRENT", value_name = "reject|wait:DURATION")]
    pub concurrent: Option<String>,
    /// With --concurrent wait: the most duplicates waiting at once in this
    /// process; past it a duplicate gets 409 at once [default: 1024].
    #[arg(long, env = "IDEM_MAX_WAITERS", value_name = "N")]
    pub max_waiters: Option<String>,
    /// With --concurrent wait: the most duplicates waiting on one key in
    /// this process; past it a duplicate gets 409 at once [default: 64].
    #[arg(long, env = "IDEM_MAX_WAITERS_PER_KEY", value_name = "N")]
    pub max_waiters_per_key: Option<String>,
    /// Route templates that name the `route` label of the metrics,
    /// comma-separated, such as '/payments/{id},/orders'; a path that
    /// matches none is labelled with its first segment [default: none].
    #[arg(long, env = "IDEM_ROUTES", value_name = "LIST")]
    pub routes: Option<String>,
    /// The unary gRPC methods whose calls with an idempotency-key metadata
    /// entry are deduplicated (answers stored with their trailers, refusals
    /// as gRPC status codes), comma-separated, such as
    /// '/payments.v1.Payments/Charge'; every other gRPC call, streaming ones
    /// among them, is forwarded untouched [default: none].
    #[arg(long, env = "IDEM_GRPC_UNARY", value_name = "LIST")]
    pub grpc_unary: Option<String>,
    /// Ask the upstream's lookup method before running a --grpc-unary call
    /// again whose earlier attempt ended unknown, such as
    /// '/payments.v1.Payments/Lookup' (sent the retry's metadata and
    /// message): OK = applied (its reply is stored and replayed), NOT_FOUND
    /// = not applied (forwarded), anything else = UNAVAILABLE; or
    /// METHOD=LOOKUP pairs, comma-separated [default: off].
    #[arg(long, env = "IDEM_GRPC_PROBE", value_name = "METHOD")]
    pub grpc_probe: Option<String>,
    /// What a --grpc-unary call's status code means for its key, by name or
    /// number: store, release or unknown, as in 'internal=store,14=unknown'
    /// [default: OK and the client errors store; UNAVAILABLE,
    /// RESOURCE_EXHAUSTED, ABORTED release; DEADLINE_EXCEEDED, UNKNOWN,
    /// DATA_LOSS, CANCELLED unknown; INTERNAL unknown with --grpc-probe,
    /// else release].
    #[arg(long, env = "IDEM_ON_GRPC_STATUS", value_name = "CODE=VERDICT,...")]
    pub on_grpc_status: Option<String>,
    /// Fingerprint only these fields of a keyed JSON body (with the method,
    /// route and target), as JSON Pointers (RFC 6901) after json:, such as
    /// 'json:/amount,/currency,/account': a retry that differs elsewhere is
    /// replayed, one that differs in them is refused as key reuse. A missing
    /// field counts as absent (not null); a body that is not JSON is
    /// fingerprinted whole [default: the whole body].
    #[arg(long, env = "IDEM_FINGERPRINT", value_name = "json:FIELDS")]
    pub fingerprint: Option<String>,
    /// Fingerprint the keyed body less these JSON fields, such as
    /// 'json:/sent_at,/trace_id' (instead of --fingerprint) [default: none].
    #[arg(long, env = "IDEM_FINGERPRINT_IGNORE", value_name = "json:FIELDS")]
    pub fingerprint_ignore: Option<String>,
    /// Fingerprint this request header's values too, such as content-type;
    /// repeat the flag or separate names with commas (a missing header
    /// differs from an empty one) [default: none].
    #[arg(
        long,
        env = "IDEM_FINGERPRINT_HEADER",
        value_name = "HEADER",
        value_delimiter = ','
    )]
    pub fingerprint_header: Vec<String>,
    /// A TOML file with the same settings: upstream, listen, store, mode,
    /// require_key, max_body, lease, retention, tombstones, replay_cache,
    /// admin_listen,
    /// upstream_timeout, body_timeout, probe, on_status, spool, principal_header, methods, sweep_every,
    /// max_in_flight, concurrent, max_waiters, max_waiters_per_key, routes,
    /// grpc_unary, grpc_probe, on_grpc_status, fingerprint, fingerprint_ignore, fingerprint_header,
    /// upstream_ca, upstream_cert, upstream_key, tls_cert, tls_key,
    /// tls_client_ca, admin_token_file, allow_hosts.
    #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
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
