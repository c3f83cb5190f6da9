//! [`GivenSettings`]: every `idem serve` setting declared once — its flag
//! and environment variable (clap, with the `cli` feature), its key in the
//! config file (serde: the field's name) and its help text (the doc
//! comment). Values stay text here; [`GatewaySettings::resolve`] reads them.
//!
//! [`GatewaySettings::resolve`]: super::GatewaySettings::resolve

use serde::{Deserialize, Deserializer};

/// What was given, before the defaults: each setting's text as its flag (or
/// environment variable) or its config-file key gave it; `None` (or empty)
/// where it was not given. The command line and the config file each make
/// one of these; [`GatewaySettings::resolve`](super::GatewaySettings::resolve)
/// takes the flag's value over the file's. Unknown keys in the file are an
/// error, so a misspelt setting is not silently ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct GivenSettings {
    /// The service to forward to: http://HOST:PORT or https://HOST:PORT
    /// (HTTP/1.1), or h2c://HOST:PORT (HTTP/2 without TLS, for gRPC),
    /// optionally with a base path.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_UPSTREAM",
            value_name = "URL",
            hide_env_values = true
        )
    )]
    pub upstream: Option<String>,
    /// The dedupe store's URL: `sqlite://PATH`, `postgres://…`, `redis://…`,
    /// `dynamodb:///TABLE` [default: sqlite://idem.db]. On the command line it is the global
    /// `--store` (or `IDEM_STORE`), which every command shares.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub store: Option<String>,
    /// For an https:// upstream: a PEM file of the CA certificates its
    /// certificate is checked against [default: the bundled webpki roots].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_UPSTREAM_CA",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub upstream_ca: Option<String>,
    /// For an https:// upstream: a PEM client certificate to present (with
    /// --upstream-key) [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_UPSTREAM_CERT",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub upstream_cert: Option<String>,
    /// The PEM private key of --upstream-cert.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_UPSTREAM_KEY",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub upstream_key: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); reloaded
    /// on SIGHUP and when the file changes, without dropping connections
    /// [default: plain HTTP].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_TLS_CERT",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub tls_cert: Option<String>,
    /// The PEM private key of --tls-cert.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_TLS_KEY",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub tls_key: Option<String>,
    /// Require client certificates signed by a CA in this PEM file (mTLS);
    /// with --principal-header tls-subject their CN scopes the keys
    /// [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_TLS_CLIENT_CA",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub tls_client_ca: Option<String>,
    /// A file holding the bearer token the admin listener requires
    /// (Authorization: Bearer TOKEN) on /metrics; needed when --admin-listen
    /// is not a loopback address [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_ADMIN_TOKEN_FILE",
            value_name = "FILE",
            hide_env_values = true
        )
    )]
    pub admin_token_file: Option<String>,
    /// Another Host name the admin listener and its console answer to
    /// besides the loopback ones (localhost, *.localhost, 127.0.0.0/8 and
    /// ::1); a request naming any other is refused (421), so a web page
    /// cannot reach them through DNS rebinding. Repeat the flag or separate
    /// names with commas; *.example.com allows the names under example.com
    /// [default: loopback names only].
    #[cfg_attr(
        feature = "cli",
        arg(
            long = "allow-host",
            env = "IDEM_ALLOW_HOSTS",
            value_name = "NAME",
            value_delimiter = ','
        )
    )]
    #[serde(default, deserialize_with = "listed")]
    pub allow_hosts: Vec<String>,
    /// Where the gateway listens [default: 127.0.0.1:8080].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_LISTEN", value_name = "ADDR"))]
    pub listen: Option<String>,
    /// How refusals are written: ietf (problem+json, 422 for a reused key) or
    /// stripe (idempotency_error, 400) [default: ietf].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_MODE", value_name = "MODE"))]
    pub mode: Option<String>,
    /// Refuse requests that carry no Idempotency-Key (400) when their method
    /// is one of --methods [default: false].
    #[cfg_attr(feature = "cli", arg(
        long,
        env = "IDEM_REQUIRE_KEY",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    ))]
    pub require_key: Option<bool>,
    /// Largest keyed request body read, such as 1MiB, 64KiB or 65536; larger
    /// ones get 413 [default: 1MiB].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_MAX_BODY", value_name = "SIZE"))]
    #[serde(default, deserialize_with = "number_or_text")]
    pub max_body: Option<String>,
    /// How long an in-flight claim is protected, such as 60s or 2m; at least
    /// 1s [default: 60s].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_LEASE",
            value_name = "DURATION",
            allow_hyphen_values = true
        )
    )]
    pub lease: Option<String>,
    /// How long answers are kept for replay: the dedupe window, such as 24h or
    /// 7d [default: 7d].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_RETENTION",
            value_name = "DURATION",
            allow_hyphen_values = true
        )
    )]
    pub retention: Option<String>,
    /// Keep a tombstone of each swept key this much longer, such as 30d, so a
    /// late retry is refused with 410 Gone instead of running again
    /// [default: off].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_TOMBSTONES",
            value_name = "DURATION|off",
            allow_hyphen_values = true
        )
    )]
    pub tombstones: Option<String>,
    /// Settled answers kept in memory so replays skip the store, such as
    /// 64MiB, or `off`; an answer is served from memory until its record
    /// expires, and for at most 5 s after it was cached [default: 64MiB].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_REPLAY_CACHE", value_name = "SIZE|off")
    )]
    #[serde(default, deserialize_with = "number_or_text")]
    pub replay_cache: Option<String>,
    /// Serve /metrics (Prometheus) and /healthz on this address [default: off].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_ADMIN_LISTEN", value_name = "ADDR")
    )]
    pub admin_listen: Option<String>,
    /// How long to wait for the upstream's answer; past it the outcome is
    /// unknown and the client gets 504 [default: 30s].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_UPSTREAM_TIMEOUT",
            value_name = "DURATION",
            allow_hyphen_values = true
        )
    )]
    pub upstream_timeout: Option<String>,
    /// How long a client may take to send a keyed request's whole body;
    /// past it the request gets 408 and its key stays free. Also how long an
    /// HTTP/1.1 client may take to send a request's head, or leave its
    /// connection idle [default: 30s].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_BODY_TIMEOUT",
            value_name = "DURATION",
            allow_hyphen_values = true
        )
    )]
    pub body_timeout: Option<String>,
    /// Ask the upstream before forwarding a retry whose earlier attempt ended
    /// unknown, such as 'GET /payments/by-key/{key}': 2xx = applied (its
    /// answer is stored and replayed), 404 = not applied (forwarded), anything
    /// else = 503 [default: off].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_PROBE", value_name = "TEMPLATE")
    )]
    pub probe: Option<String>,
    /// What an upstream answer means for its key, per status or class:
    /// store (kept and replayed), release (nothing happened: the retry is
    /// forwarded) or unknown (the key is kept; with --probe the retry asks
    /// it, else the key stays reserved for the lease), as in
    /// '500=store,502=unknown,5xx=release' [default: 2xx and 4xx store;
    /// 408, 409, 425, 429, 503 release; 502, 504 unknown; 500 unknown with a
    /// probe, else release].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_ON_STATUS", value_name = "STATUS=VERDICT,...")
    )]
    pub on_status: Option<String>,
    /// The local file where answers the store could not take yet are kept
    /// (synced) until stored, also across a restart; `off` for none
    /// [default: next to an SQLite store, STORE.spool; else idem.spool].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_SPOOL", value_name = "PATH"))]
    pub spool: Option<String>,
    /// The header that names the caller; keys are scoped by its hash, `none`
    /// to share one key space, `tls-subject` for the client certificate's CN
    /// (with --tls-client-ca) [default: authorization].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_PRINCIPAL_HEADER", value_name = "HEADER")
    )]
    pub principal_header: Option<String>,
    /// The methods on which --require-key refuses a request without an
    /// Idempotency-Key, comma-separated. A request that carries a key is
    /// deduplicated whatever its method (POST, PUT, PATCH, DELETE, ...);
    /// GET, HEAD, OPTIONS and TRACE pass through [default: POST,PATCH].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_METHODS", value_name = "LIST"))]
    #[serde(default, deserialize_with = "listed_text")]
    pub methods: Option<String>,
    /// How often expired records are swept, ±50 % jitter, such as 60s or
    /// 10m; `off` when a cron job runs `idem gc` instead [default: 60s].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_SWEEP_EVERY",
            value_name = "DURATION",
            allow_hyphen_values = true
        )
    )]
    pub sweep_every: Option<String>,
    /// The most requests answered at once; past it a request is answered 503
    /// with Retry-After at once instead of waiting in a queue, such as 256,
    /// or `off` [default: 1024].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_MAX_IN_FLIGHT", value_name = "N")
    )]
    #[serde(default, deserialize_with = "number_or_text")]
    pub max_in_flight: Option<String>,
    /// Where connections are served: per-core (one single-threaded runtime
    /// per core, each with its own listening socket and upstream
    /// connections, so a request stays on one thread) or shared (the
    /// process's multi-threaded runtime) [default: per-core].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_RUNTIME", value_name = "per-core|shared")
    )]
    pub runtime: Option<String>,
    /// With --runtime per-core: how many runtimes (threads) serve
    /// [default: the number of cores].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_WORKERS", value_name = "N"))]
    #[serde(default, deserialize_with = "number_or_text")]
    pub workers: Option<String>,
    /// What a duplicate gets while its original is still running: `reject`
    /// (409 with Retry-After at once) or `wait:DURATION`, such as wait:5s
    /// (the original's answer as a replay as soon as it is stored, or 409
    /// when the wait runs out or the original ends without one)
    /// [default: reject].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_CONCURRENT", value_name = "reject|wait:DURATION")
    )]
    pub concurrent: Option<String>,
    /// With --concurrent wait: the most duplicates waiting at once in this
    /// process; past it a duplicate gets 409 at once [default: 1024].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_MAX_WAITERS", value_name = "N"))]
    #[serde(default, deserialize_with = "number_or_text")]
    pub max_waiters: Option<String>,
    /// With --concurrent wait: the most duplicates waiting on one key in
    /// this process; past it a duplicate gets 409 at once [default: 64].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_MAX_WAITERS_PER_KEY", value_name = "N")
    )]
    #[serde(default, deserialize_with = "number_or_text")]
    pub max_waiters_per_key: Option<String>,
    /// Route templates that name the `route` label of the metrics,
    /// comma-separated, such as '/payments/{id},/orders'; a path that
    /// matches none is labelled with its first segment [default: none].
    #[cfg_attr(feature = "cli", arg(long, env = "IDEM_ROUTES", value_name = "LIST"))]
    #[serde(default, deserialize_with = "listed_text")]
    pub routes: Option<String>,
    /// The unary gRPC methods whose calls with an idempotency-key metadata
    /// entry are deduplicated (answers stored with their trailers, refusals
    /// as gRPC status codes), comma-separated, such as
    /// '/payments.v1.Payments/Charge'; every other gRPC call, streaming ones
    /// among them, is forwarded untouched [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_GRPC_UNARY", value_name = "LIST")
    )]
    #[serde(default, deserialize_with = "listed_text")]
    pub grpc_unary: Option<String>,
    /// Ask the upstream's lookup method before running a --grpc-unary call
    /// again whose earlier attempt ended unknown, such as
    /// '/payments.v1.Payments/Lookup' (sent the retry's metadata and
    /// message): OK = applied (its reply is stored and replayed), NOT_FOUND
    /// = not applied (forwarded), anything else = UNAVAILABLE; or
    /// METHOD=LOOKUP pairs, comma-separated [default: off].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_GRPC_PROBE", value_name = "METHOD")
    )]
    pub grpc_probe: Option<String>,
    /// What a --grpc-unary call's status code means for its key, by name or
    /// number: store, release or unknown, as in 'internal=store,14=unknown'
    /// [default: OK and the client errors store; UNAVAILABLE,
    /// RESOURCE_EXHAUSTED, ABORTED release; DEADLINE_EXCEEDED, UNKNOWN,
    /// DATA_LOSS, CANCELLED unknown; INTERNAL unknown with --grpc-probe,
    /// else release].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_ON_GRPC_STATUS", value_name = "CODE=VERDICT,...")
    )]
    pub on_grpc_status: Option<String>,
    /// Fingerprint only these fields of a keyed JSON body (with the method,
    /// route and target), as JSON Pointers (RFC 6901) after json:, such as
    /// 'json:/amount,/currency,/account': a retry that differs elsewhere is
    /// replayed, one that differs in them is refused as key reuse. A missing
    /// field counts as absent (not null); a body that is not JSON is
    /// fingerprinted whole [default: the whole body].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_FINGERPRINT", value_name = "json:FIELDS")
    )]
    pub fingerprint: Option<String>,
    /// Fingerprint the keyed body less these JSON fields, such as
    /// 'json:/sent_at,/trace_id' (instead of --fingerprint) [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "IDEM_FINGERPRINT_IGNORE", value_name = "json:FIELDS")
    )]
    pub fingerprint_ignore: Option<String>,
    /// Fingerprint this request header's values too, such as content-type;
    /// repeat the flag or separate names with commas (a missing header
    /// differs from an empty one) [default: none].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            env = "IDEM_FINGERPRINT_HEADER",
            value_name = "HEADER",
            value_delimiter = ','
        )
    )]
    #[serde(default, deserialize_with = "listed")]
    pub fingerprint_header: Vec<String>,
}

/// A number in the file, bare or as text: `max_body = 65536` or `"1MiB"`,
/// `max_in_flight = 256` or `"off"`.
fn number_or_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumberOrText {
        Number(u64),
        Text(String),
    }
    Ok(Some(match NumberOrText::deserialize(d)? {
        NumberOrText::Number(n) => n.to_string(),
        NumberOrText::Text(text) => text,
    }))
}

/// A list in the file: `"POST,PUT"` or `["POST", "PUT"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Listed {
    Text(String),
    List(Vec<String>),
}

/// A list in the file as the flag's comma-separated text.
fn listed_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Some(match Listed::deserialize(d)? {
        Listed::Text(text) => text,
        Listed::List(list) => list.join(","),
    }))
}

/// A list in the file as the repeated flag's values.
fn listed<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Listed::deserialize(d)? {
        Listed::Text(text) => vec![text],
        Listed::List(list) => list,
    })
}
