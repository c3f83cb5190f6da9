//! The settings of `idem serve`, from four places in this order: a flag, its
//! `IDEM_*` variable (the command line reads both into [`GivenSettings`]), the
//! TOML config file, the default. Every bad value is reported with where it
//! came from and what to write.
//!
//! ```
//! use crate::{GatewaySettings, GivenSettings, SettingsFile};
//! let file = SettingsFile::new("idem.toml", "upstream = \"http://127.0.0.1:9000\"\nlease = \"30s\"\n");
//! let given = GivenSettings { lease: Some("10s".into()), ..GivenSettings::default() };
//! let settings = GatewaySettings::resolve(&given, Some(file)).unwrap();
//! assert_eq!(settings.lease, std::time::Duration::from_secs(10));
//! assert_eq!(settings.upstream.to_string(), "http://127.0.0.1:9000");
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, Method};
use idem::{FingerprintRule, StoreLocation};
use serde::Deserialize;

use crate::admin::AllowedHosts;

use super::tls::{TLS_SUBJECT, TLS_SUBJECT_HEADER};
use super::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT, GatewayConfig, ListenerTls, Probe, TlsError,
    Upstream, UpstreamTls,
};
use idem_http::{
    Concurrent, DEFAULT_BODY_LIMIT, DEFAULT_WAITERS, DEFAULT_WAITERS_PER_KEY, IdempotencyConfig,
    KeyRequirement, Mode, ReplayCache, StatusPolicy, WaiterCaps,
};

/// Where the gateway listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The store the gateway opens when none is given: the embedded one.
pub const DEFAULT_STORE: &str = "sqlite://idem.db";

/// The answer spool when the store is not a local file and none is given.
pub(super) const DEFAULT_SPOOL: &str = "idem.spool";

/// A setting that cannot be used; the message says where it came from and
/// what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

impl SettingsError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// The same error, said of the setting found at `origin`.
    fn of(self, origin: &str) -> Self {
        Self(format!("invalid {origin}: {}", self.0))
    }
}

/// What the command line gave, before the file and the defaults: each flag's
/// text (or its variable's), `None` where neither was set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenSettings {
    /// `--upstream`: the service requests are forwarded to.
    pub upstream: Option<String>,
    /// `--listen`: the address the gateway serves on.
    pub listen: Option<String>,
    /// The global `--store` (or `IDEM_STORE`).
    pub store: Option<String>,
    /// `--mode`: `ietf` or `stripe`.
    pub mode: Option<String>,
    /// `--require-key`: refuse keyless requests on the `--methods`.
    pub require_key: Option<bool>,
    /// `--max-body`: the largest keyed body read.
    pub max_body: Option<String>,
    /// `--lease`: how long a claim is protected.
    pub lease: Option<String>,
    /// `--retention`: how long answers are kept.
    pub retention: Option<String>,
    /// `--tombstones`: how long a key is still refused after its window
    /// (`off` or a duration).
    pub tombstones: Option<String>,
    /// `--replay-cache`: the bytes of settled answers kept in memory (`off`
    /// or a size).
    pub replay_cache: Option<String>,
    /// `--admin-listen`: where `/metrics` and `/healthz` are served.
    pub admin_listen: Option<String>,
    /// `--upstream-timeout`: how long an upstream answer is awaited.
    pub upstream_timeout: Option<String>,
    /// `--body-timeout`: how long a client may take to send a request's
    /// head and a keyed request's body.
    pub body_timeout: Option<String>,
    /// `--probe`: the upstream request asked about an unknown outcome, or `off`.
    pub probe: Option<String>,
    /// `--on-status`: what answer statuses mean for their keys
    /// (`500=store,502=unknown`).
    pub on_status: Option<String>,
    /// `--spool`: the file of answers not yet stored, or `off`.
    pub spool: Option<String>,
    /// `--principal-header`: the header naming the caller, or `none`.
    pub principal_header: Option<String>,
    /// `--methods`: the methods on which `--require-key` refuses keyless
    /// requests.
    pub methods: Option<String>,
    /// `--sweep-every`: how often expired records are swept, or `off`.
    pub sweep_every: Option<String>,
    /// `--max-in-flight`: the most requests answered at once, or `off`.
    pub max_in_flight: Option<String>,
    /// `--concurrent`: what a concurrent duplicate gets, `reject` or
    /// `wait:DURATION`.
    pub concurrent: Option<String>,
    /// `--max-waiters`: the most concurrent duplicates waiting at once.
    pub max_waiters: Option<String>,
    /// `--max-waiters-per-key`: the most waiting on one key.
    pub max_waiters_per_key: Option<String>,
    /// `--routes`: route templates for the metrics' `route` label.
    pub routes: Option<String>,
    /// `--upstream-ca`: a PEM file of the CAs an `https://` upstream is
    /// checked against (default: webpki's bundled roots).
    pub upstream_ca: Option<String>,
    /// `--upstream-cert`: a PEM client certificate shown to the upstream.
    pub upstream_cert: Option<String>,
    /// `--upstream-key`: its PEM private key.
    pub upstream_key: Option<String>,
    /// `--tls-cert`: the listener's PEM certificate chain (serve HTTPS).
    pub tls_cert: Option<String>,
    /// `--tls-key`: its PEM private key.
    pub tls_key: Option<String>,
    /// `--tls-client-ca`: require client certificates signed by these CAs.
    pub tls_client_ca: Option<String>,
    /// `--admin-token-file`: the bearer token the admin listener requires.
    pub admin_token_file: Option<String>,
    /// `--allow-host`: `Host` names the admin listener answers to besides
    /// the loopback ones, comma-separated (the flag may be repeated).
    pub allow_hosts: Option<String>,
    /// `--grpc-unary`: the unary gRPC methods whose keyed calls are
    /// deduplicated.
    pub grpc_unary: Option<String>,
    /// `--grpc-probe`: the upstream's lookup method asked before a gRPC
    /// call whose outcome is unknown runs again, or `off`.
    pub grpc_probe: Option<String>,
    /// `--on-grpc-status`: what gRPC status codes mean for their keys
    /// (`internal=store,deadline_exceeded=unknown`).
    pub on_grpc_status: Option<String>,
    /// `--fingerprint`: the JSON fields a fingerprint covers (`json:/a,/b`).
    pub fingerprint: Option<String>,
    /// `--fingerprint-ignore`: the JSON fields a fingerprint leaves out.
    pub fingerprint_ignore: Option<String>,
    /// `--fingerprint-header`: the headers a fingerprint covers,
    /// comma-separated (the flag may be repeated).
    pub fingerprint_header: Option<String>,
}

/// A config file's text, and its path for messages.
#[derive(Debug, Clone, Copy)]
pub struct SettingsFile<'a> {
    path: &'a Path,
    text: &'a str,
}

impl<'a> SettingsFile<'a> {
    /// The file read from `path`.
    pub fn new(path: &'a (impl AsRef<Path> + ?Sized), text: &'a str) -> Self {
        Self {
            path: path.as_ref(),
            text,
        }
    }
}

/// The config file: the flags' names with underscores. Unknown keys are an
/// error, so a misspelt setting is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    upstream: Option<String>,
    listen: Option<String>,
    store: Option<String>,
    mode: Option<String>,
    require_key: Option<bool>,
    max_body: Option<NumberOrText>,
    lease: Option<String>,
    retention: Option<String>,
    tombstones: Option<String>,
    replay_cache: Option<NumberOrText>,
    admin_listen: Option<String>,
    upstream_timeout: Option<String>,
    body_timeout: Option<String>,
    probe: Option<String>,
    on_status: Option<String>,
    spool: Option<String>,
    principal_header: Option<String>,
    methods: Option<Listed>,
    sweep_every: Option<String>,
    max_in_flight: Option<NumberOrText>,
    concurrent: Option<String>,
    max_waiters: Option<NumberOrText>,
    max_waiters_per_key: Option<NumberOrText>,
    routes: Option<Listed>,
    upstream_ca: Option<String>,
    upstream_cert: Option<String>,
    upstream_key: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    tls_client_ca: Option<String>,
    admin_token_file: Option<String>,
    allow_hosts: Option<Listed>,
    grpc_unary: Option<Listed>,
    grpc_probe: Option<String>,
    on_grpc_status: Option<String>,
    fingerprint: Option<String>,
    fingerprint_ignore: Option<String>,
    fingerprint_header: Option<Listed>,
}

/// A list in the file (methods, routes, gRPC methods): `"POST,PUT"` or
/// `["POST", "PUT"]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Listed {
    Text(String),
    List(Vec<String>),
}

impl Listed {
    fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::List(list) => list.join(","),
        }
    }
}

/// A number in the file, bare or as text: `max_body = 65536` or `"1MiB"`,
/// `max_in_flight = 256` or `"off"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl NumberOrText {
    fn text(&self) -> String {
        match self {
            Self::Number(n) => n.to_string(),
            Self::Text(text) => text.clone(),
        }
    }
}

impl FileSettings {
    fn parse(file: &SettingsFile<'_>) -> Result<Self, SettingsError> {
        toml::from_str(file.text).map_err(|error| {
            SettingsError::new(format!(
                "the config file {} is not valid: {}",
                file.path.display(),
                error.to_string().trim_end()
            ))
        })
    }
}

/// Everything `idem serve` runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySettings {
    /// The service requests are forwarded to.
    pub upstream: Upstream,
    /// Where the gateway serves.
    pub listen: SocketAddr,
    /// The dedupe store.
    pub store: StoreLocation,
    /// The vocabulary of refusals.
    pub mode: Mode,
    /// Whether keyless requests on [`methods`](Self::methods) are refused.
    pub require_key: bool,
    /// The largest keyed body read, in bytes.
    pub max_body: usize,
    /// How long a claim is protected.
    pub lease: Duration,
    /// How long answers are kept.
    pub retention: Duration,
    /// How long a key is still refused (410) after its window ended; `None`:
    /// new again at once.
    pub tombstones: Option<Duration>,
    /// The settled answers kept in memory.
    pub replay_cache: ReplayCache,
    /// Where `/metrics` and `/healthz` are served, if anywhere.
    pub admin_listen: Option<SocketAddr>,
    /// How long an upstream answer is awaited.
    pub upstream_timeout: Duration,
    /// How long a client may take to send a request's head, and a keyed
    /// request's whole body (408 past it).
    pub body_timeout: Duration,
    /// What the upstream is asked at the first retry after an unknown
    /// outcome, if anything.
    pub probe: Option<Probe>,
    /// What each answer status means for its key.
    pub on_status: StatusPolicy,
    /// Where answers the store could not take yet are kept; `None`: in
    /// memory only.
    pub spool: Option<PathBuf>,
    /// `None`: one key space for every caller.
    pub principal_header: Option<HeaderName>,
    /// The methods on which a keyless request is refused when
    /// [`require_key`](Self::require_key) is set. A request that carries a
    /// key is deduplicated whatever its unsafe method, listed here or not.
    pub methods: Vec<Method>,
    /// How often expired records are swept; `None`: never (a cron job runs
    /// `idem gc`).
    pub sweep_every: Option<Duration>,
    /// The most requests answered at once; past it a request gets 503 +
    /// `Retry-After` at once. `None`: no limit (`off`); by default
    /// [`DEFAULT_MAX_IN_FLIGHT`].
    pub max_in_flight: Option<usize>,
    /// What a concurrent duplicate gets: 409 at once, or a bounded wait for
    /// the original's answer.
    pub concurrent: Concurrent,
    /// How many concurrent duplicates may wait, per key and in all.
    pub waiter_caps: WaiterCaps,
    /// Route templates (`/payments/{id}`) naming the metrics' `route` label.
    pub routes: Vec<String>,
    /// How an `https://` upstream is reached (CA file, client certificate).
    pub upstream_tls: UpstreamTls,
    /// The listener's TLS files; `None` serves plain HTTP.
    pub tls: Option<ListenerTls>,
    /// The keys are scoped by the client certificate's subject (CN)
    /// instead of a header: `principal_header = "tls-subject"`, with
    /// `--tls-client-ca`.
    pub principal_tls_subject: bool,
    /// The file holding the admin listener's bearer token.
    pub admin_token_file: Option<PathBuf>,
    /// The `Host` names the admin listener (and the console on it) answers
    /// to: the loopback ones and those added.
    pub allow_hosts: AllowedHosts,
    /// The unary gRPC methods (`/package.Service/Method`) whose calls with
    /// an `idempotency-key` metadata entry are deduplicated; every other
    /// gRPC call (streaming ones among them) is forwarded untouched.
    pub grpc_unary: Vec<String>,
    /// The upstream's lookup methods asked before a `grpc_unary` call whose
    /// outcome is unknown runs again: `/pkg.Service/Lookup` for every
    /// method, `METHOD=LOOKUP` pairs for one each (checked; `idem_grpc`'s
    /// `GrpcProbe` reads it). `None`: not asked.
    pub grpc_probe: Option<String>,
    /// What the `grpc_unary` calls' status codes mean for their keys, on top
    /// of the standard table (`idem_grpc`'s `GrpcStatusPolicy` reads it).
    /// `None`: the standard table.
    pub on_grpc_status: Option<String>,
    /// What a request's fingerprint covers besides its method, route and
    /// target (default: the whole body).
    pub fingerprint: FingerprintRule,
}

/// One setting's value and where it came from, for error messages.
struct Found {
    value: String,
    origin: String,
}

/// Picks a setting: the flag (or its variable), else the file's key.
struct Sources<'a> {
    file: FileSettings,
    path: Option<&'a Path>,
}

impl Sources<'_> {
    fn pick(
        &self,
        flag: &str,
        env: &str,
        given: Option<&String>,
        from_file: impl FnOnce(&FileSettings) -> Option<String>,
    ) -> Option<Found> {
        if let Some(value) = given {
            return Some(Found {
                value: value.clone(),
                origin: format!("--{flag} (or {env})"),
            });
        }
        let value = from_file(&self.file)?;
        let key = flag.replace('-', "_");
        let path = self
            .path
            .map_or_else(String::new, |p| p.display().to_string());
        Some(Found {
            value,
            origin: format!("`{key}` in {path}"),
        })
    }

    fn duration(
        &self,
        flag: &str,
        env: &str,
        given: Option<&String>,
        in_file: fn(&FileSettings) -> Option<String>,
        default: Duration,
    ) -> Result<Duration, SettingsError> {
        match self.pick(flag, env, given, in_file) {
            None => Ok(default),
            Some(found) => parse_duration(&found.value).map_err(|e| e.of(&found.origin)),
        }
    }
}

impl GatewaySettings {
    /// Resolves every setting from what the command line gave, the config
    /// file if there is one, and the defaults.
    pub fn resolve(
        given: &GivenSettings,
        file: Option<SettingsFile<'_>>,
    ) -> Result<Self, SettingsError> {
        let sources = Sources {
            file: file
                .as_ref()
                .map(FileSettings::parse)
                .transpose()?
                .unwrap_or_default(),
            path: file.map(|f| f.path),
        };
        let Some(upstream) =
            sources.pick("upstream", "IDEM_UPSTREAM", given.upstream.as_ref(), |f| {
                f.upstream.clone()
            })
        else {
            return Err(SettingsError::new(
                "no upstream to forward to: give --upstream http://HOST:PORT (or IDEM_UPSTREAM, or `upstream` in the --config file)",
            ));
        };
        let upstream: Upstream = upstream
            .value
            .parse()
            .map_err(|e| SettingsError::new(format!("invalid {}: {e}", upstream.origin)))?;

        let listen = sources
            .pick("listen", "IDEM_LISTEN", given.listen.as_ref(), |f| {
                f.listen.clone()
            })
            .map(|found| address(&found))
            .transpose()?
            .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("a valid default"));
        let admin_listen = sources
            .pick(
                "admin-listen",
                "IDEM_ADMIN_LISTEN",
                given.admin_listen.as_ref(),
                |f| f.admin_listen.clone(),
            )
            .map(|found| address(&found))
            .transpose()?;

        let store = sources
            .pick("store", "IDEM_STORE", given.store.as_ref(), |f| {
                f.store.clone()
            })
            .unwrap_or(Found {
                value: DEFAULT_STORE.to_owned(),
                origin: "the default store".to_owned(),
            });
        let store: StoreLocation = store
            .value
            .parse()
            .map_err(|e| SettingsError::new(format!("invalid {}: {e}", store.origin)))?;

        let mode = match sources.pick("mode", "IDEM_MODE", given.mode.as_ref(), |f| f.mode.clone())
        {
            None => Mode::Ietf,
            Some(found) => match found.value.to_ascii_lowercase().as_str() {
                "ietf" => Mode::Ietf,
                "stripe" => Mode::Stripe,
                other => {
                    return Err(SettingsError::new(format!(
                        "invalid {}: {other:?} is not a mode; write ietf or stripe",
                        found.origin
                    )));
                }
            },
        };
        let require_key = given
            .require_key
            .or(sources.file.require_key)
            .unwrap_or(false);

        let max_body =
            match sources.pick("max-body", "IDEM_MAX_BODY", given.max_body.as_ref(), |f| {
                f.max_body.as_ref().map(NumberOrText::text)
            }) {
                None => DEFAULT_BODY_LIMIT,
                Some(found) => parse_size(&found.value).map_err(|e| e.of(&found.origin))?,
            };
        let lease = match sources.pick("lease", "IDEM_LEASE", given.lease.as_ref(), |f| {
            f.lease.clone()
        }) {
            None => idem::DEFAULT_LEASE,
            Some(found) => parse_lease(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let retention = sources.duration(
            "retention",
            "IDEM_RETENTION",
            given.retention.as_ref(),
            |f| f.retention.clone(),
            idem::DEFAULT_RETENTION,
        )?;
        let upstream_timeout = sources.duration(
            "upstream-timeout",
            "IDEM_UPSTREAM_TIMEOUT",
            given.upstream_timeout.as_ref(),
            |f| f.upstream_timeout.clone(),
            DEFAULT_UPSTREAM_TIMEOUT,
        )?;
        let body_timeout = sources.duration(
            "body-timeout",
            "IDEM_BODY_TIMEOUT",
            given.body_timeout.as_ref(),
            |f| f.body_timeout.clone(),
            DEFAULT_BODY_TIMEOUT,
        )?;
        let tombstones = match sources.pick(
            "tombstones",
            "IDEM_TOMBSTONES",
            given.tombstones.as_ref(),
            |f| f.tombstones.clone(),
        ) {
            None => None,
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => None,
            Some(found) => Some(parse_duration(&found.value).map_err(|e| e.of(&found.origin))?),
        };
        let replay_cache = match sources.pick(
            "replay-cache",
            "IDEM_REPLAY_CACHE",
            given.replay_cache.as_ref(),
            |f| f.replay_cache.as_ref().map(NumberOrText::text),
        ) {
            None => ReplayCache::default(),
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => ReplayCache::off(),
            Some(found) => {
                ReplayCache::bytes(parse_size(&found.value).map_err(|e| e.of(&found.origin))? as u64)
            }
        };
        if retention <= lease {
            return Err(SettingsError::new(format!(
                "the retention ({}) must be longer than the lease ({}): answers are kept for the retention, claims are protected for the lease",
                humantime::format_duration(retention),
                humantime::format_duration(lease)
            )));
        }

        let probe = match sources.pick("probe", "IDEM_PROBE", given.probe.as_ref(), |f| {
            f.probe.clone()
        }) {
            None => None,
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => None,
            Some(found) => Some(
                found
                    .value
                    .parse::<Probe>()
                    .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?,
            ),
        };
        let on_status = match sources.pick(
            "on-status",
            "IDEM_ON_STATUS",
            given.on_status.as_ref(),
            |f| f.on_status.clone(),
        ) {
            None => StatusPolicy::standard(),
            Some(found) => found
                .value
                .parse::<StatusPolicy>()
                .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?,
        };
        let spool = match sources.pick("spool", "IDEM_SPOOL", given.spool.as_ref(), |f| {
            f.spool.clone()
        }) {
            None => Some(default_spool(&store)),
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => None,
            Some(found) if found.value.trim().is_empty() => {
                return Err(SettingsError::new(format!(
                    "invalid {}: no path given; write the path of a local file, such as /var/lib/idem/idem.spool, or off",
                    found.origin
                )));
            }
            Some(found) => Some(PathBuf::from(found.value)),
        };

        let mut principal_tls_subject = false;
        let principal_header = match sources.pick(
            "principal-header",
            "IDEM_PRINCIPAL_HEADER",
            given.principal_header.as_ref(),
            |f| f.principal_header.clone(),
        ) {
            None => Some(http::header::AUTHORIZATION),
            Some(found) if found.value.eq_ignore_ascii_case("none") => None,
            Some(found) if found.value.eq_ignore_ascii_case(TLS_SUBJECT) => {
                principal_tls_subject = true;
                Some(HeaderName::from_static(TLS_SUBJECT_HEADER))
            }
            Some(found) => Some(HeaderName::try_from(found.value.as_str()).map_err(|_| {
                SettingsError::new(format!(
                    "invalid {}: {:?} is not a header name; write one such as authorization or x-tenant-id, or none",
                    found.origin, found.value
                ))
            })?),
        };

        let methods = match sources.pick("methods", "IDEM_METHODS", given.methods.as_ref(), |f| {
            f.methods.as_ref().map(Listed::text)
        }) {
            None => vec![Method::POST, Method::PATCH],
            Some(found) => parse_methods(&found.value).map_err(|e| e.of(&found.origin))?,
        };

        let sweep_every = match sources.pick(
            "sweep-every",
            "IDEM_SWEEP_EVERY",
            given.sweep_every.as_ref(),
            |f| f.sweep_every.clone(),
        ) {
            None => Some(idem::sweeper::DEFAULT_SWEEP_INTERVAL),
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => None,
            Some(found) => Some(parse_duration(&found.value).map_err(|e| e.of(&found.origin))?),
        };

        let max_in_flight = match sources.pick(
            "max-in-flight",
            "IDEM_MAX_IN_FLIGHT",
            given.max_in_flight.as_ref(),
            |f| f.max_in_flight.as_ref().map(NumberOrText::text),
        ) {
            None => Some(DEFAULT_MAX_IN_FLIGHT),
            Some(found) => parse_limit(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let concurrent = match sources.pick(
            "concurrent",
            "IDEM_CONCURRENT",
            given.concurrent.as_ref(),
            |f| f.concurrent.clone(),
        ) {
            None => Concurrent::Reject,
            Some(found) => parse_concurrent(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let waiters = |flag: &str,
                       env: &str,
                       given: Option<&String>,
                       in_file: fn(&FileSettings) -> Option<String>,
                       default: usize|
         -> Result<usize, SettingsError> {
            match sources.pick(flag, env, given, in_file) {
                None => Ok(default),
                Some(found) => parse_waiters(&found.value).map_err(|e| e.of(&found.origin)),
            }
        };
        let waiter_caps = WaiterCaps {
            per_key: waiters(
                "max-waiters-per-key",
                "IDEM_MAX_WAITERS_PER_KEY",
                given.max_waiters_per_key.as_ref(),
                |f| f.max_waiters_per_key.as_ref().map(NumberOrText::text),
                DEFAULT_WAITERS_PER_KEY,
            )?,
            total: waiters(
                "max-waiters",
                "IDEM_MAX_WAITERS",
                given.max_waiters.as_ref(),
                |f| f.max_waiters.as_ref().map(NumberOrText::text),
                DEFAULT_WAITERS,
            )?,
        };
        let routes = match sources.pick("routes", "IDEM_ROUTES", given.routes.as_ref(), |f| {
            f.routes.as_ref().map(Listed::text)
        }) {
            None => Vec::new(),
            Some(found) => parse_routes(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let grpc_unary = match sources.pick(
            "grpc-unary",
            "IDEM_GRPC_UNARY",
            given.grpc_unary.as_ref(),
            |f| f.grpc_unary.as_ref().map(Listed::text),
        ) {
            None => Vec::new(),
            Some(found) => parse_grpc_methods(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let grpc_probe = match sources.pick(
            "grpc-probe",
            "IDEM_GRPC_PROBE",
            given.grpc_probe.as_ref(),
            |f| f.grpc_probe.clone(),
        ) {
            None => None,
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => None,
            Some(found) => {
                let probe = parse_grpc_probe(&found.value).map_err(|e| e.of(&found.origin))?;
                if grpc_unary.is_empty() {
                    return Err(SettingsError::new(format!(
                        "{} asks about keyed gRPC calls, and there are none: give the unary methods with --grpc-unary too",
                        found.origin
                    )));
                }
                Some(probe)
            }
        };

        let on_grpc_status = match sources.pick(
            "on-grpc-status",
            "IDEM_ON_GRPC_STATUS",
            given.on_grpc_status.as_ref(),
            |f| f.on_grpc_status.clone(),
        ) {
            None => None,
            Some(found) => {
                if grpc_unary.is_empty() {
                    return Err(SettingsError::new(format!(
                        "{} says what keyed gRPC calls' codes mean, and there are none: give the unary methods with --grpc-unary too",
                        found.origin
                    )));
                }
                if let Some(part) = found.value.split(',').map(str::trim).find(|p| {
                    !p.is_empty() && !p.eq_ignore_ascii_case("standard") && !p.contains('=')
                }) {
                    return Err(SettingsError::new(format!(
                        "invalid {}: `{part}` is not a rule; write CODE=VERDICT, as in internal=store or 14=unknown",
                        found.origin
                    )));
                }
                Some(found.value.trim().to_owned())
            }
        };

        let fingerprint = fingerprint_rule(&sources, given)?;

        let path = |flag: &str,
                    env: &str,
                    given: Option<&String>,
                    in_file: fn(&FileSettings) -> Option<String>|
         -> Result<Option<PathBuf>, SettingsError> {
            match sources.pick(flag, env, given, in_file) {
                None => Ok(None),
                Some(found) if found.value.trim().is_empty() => Err(SettingsError::new(format!(
                    "invalid {}: no path given; write the path of a PEM file",
                    found.origin
                ))),
                Some(found) => Ok(Some(PathBuf::from(found.value))),
            }
        };
        let upstream_tls = UpstreamTls {
            ca: path(
                "upstream-ca",
                "IDEM_UPSTREAM_CA",
                given.upstream_ca.as_ref(),
                |f| f.upstream_ca.clone(),
            )?,
            cert: path(
                "upstream-cert",
                "IDEM_UPSTREAM_CERT",
                given.upstream_cert.as_ref(),
                |f| f.upstream_cert.clone(),
            )?,
            key: path(
                "upstream-key",
                "IDEM_UPSTREAM_KEY",
                given.upstream_key.as_ref(),
                |f| f.upstream_key.clone(),
            )?,
        };
        match (&upstream_tls.cert, &upstream_tls.key) {
            (Some(_), None) => {
                return Err(SettingsError::new(
                    "--upstream-cert was given without --upstream-key: give both (the client certificate and its key), or neither",
                ));
            }
            (None, Some(_)) => {
                return Err(SettingsError::new(
                    "--upstream-key was given without --upstream-cert: give both (the client certificate and its key), or neither",
                ));
            }
            _ => {}
        }
        if !upstream_tls.is_default() && !upstream.is_https() {
            return Err(SettingsError::new(format!(
                "--upstream-ca, --upstream-cert and --upstream-key are for an https:// upstream, but the upstream is {upstream}"
            )));
        }
        let tls_cert = path("tls-cert", "IDEM_TLS_CERT", given.tls_cert.as_ref(), |f| {
            f.tls_cert.clone()
        })?;
        let tls_key = path("tls-key", "IDEM_TLS_KEY", given.tls_key.as_ref(), |f| {
            f.tls_key.clone()
        })?;
        let tls_client_ca = path(
            "tls-client-ca",
            "IDEM_TLS_CLIENT_CA",
            given.tls_client_ca.as_ref(),
            |f| f.tls_client_ca.clone(),
        )?;
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(ListenerTls {
                cert,
                key,
                client_ca: tls_client_ca,
            }),
            (None, None) => {
                if tls_client_ca.is_some() {
                    return Err(SettingsError::new(
                        "--tls-client-ca needs a TLS listener: give --tls-cert and --tls-key too",
                    ));
                }
                None
            }
            (Some(_), None) => {
                return Err(SettingsError::new(
                    "--tls-cert was given without --tls-key: give both (the listener's certificate and its key), or neither for plain HTTP",
                ));
            }
            (None, Some(_)) => {
                return Err(SettingsError::new(
                    "--tls-key was given without --tls-cert: give both (the listener's certificate and its key), or neither for plain HTTP",
                ));
            }
        };
        if principal_tls_subject && tls.as_ref().is_none_or(|tls| tls.client_ca.is_none()) {
            return Err(SettingsError::new(
                "--principal-header tls-subject scopes keys by the client certificate, so it needs client certificates: give --tls-cert, --tls-key and --tls-client-ca",
            ));
        }
        let admin_token_file = path(
            "admin-token-file",
            "IDEM_ADMIN_TOKEN_FILE",
            given.admin_token_file.as_ref(),
            |f| f.admin_token_file.clone(),
        )?;
        let allow_hosts = allowed_hosts(&sources, given)?;

        Ok(Self {
            allow_hosts,
            fingerprint,
            grpc_unary,
            grpc_probe,
            on_grpc_status,
            upstream_tls,
            tls,
            principal_tls_subject,
            admin_token_file,
            upstream,
            listen,
            store,
            mode,
            require_key,
            max_body,
            lease,
            retention,
            tombstones,
            replay_cache,
            admin_listen,
            upstream_timeout,
            body_timeout,
            probe,
            on_status,
            spool,
            principal_header,
            methods,
            sweep_every,
            max_in_flight,
            concurrent,
            waiter_caps,
            routes,
        })
    }

    /// The layer's configuration.
    pub fn idempotency(&self) -> IdempotencyConfig {
        let config = IdempotencyConfig::default()
            .mode(self.mode)
            .body_limit(self.max_body)
            .lease(self.lease)
            .retention(self.retention)
            .tombstones(self.tombstones)
            .replay_cache(self.replay_cache)
            .methods(self.methods.iter().cloned())
            .concurrent(self.concurrent)
            .waiter_caps(self.waiter_caps)
            .on_status(self.on_status.clone())
            .require_key(if self.require_key {
                KeyRequirement::Always
            } else {
                KeyRequirement::Optional
            });
        let config = config.fingerprint(self.fingerprint.clone());
        match &self.principal_header {
            Some(header) => config.principal_header(header.clone()),
            None => config.without_principal(),
        }
    }

    /// The gateway's configuration. Reads the upstream's CA and client
    /// certificate files, if any.
    pub fn gateway(&self) -> Result<GatewayConfig, TlsError> {
        let mut config = GatewayConfig::new(self.upstream.clone())
            .upstream_timeout(self.upstream_timeout)
            .body_timeout(self.body_timeout)
            .grpc_probed(self.grpc_probe.is_some())
            .routes(self.routes.iter().cloned());
        if self.upstream.is_https() {
            config = config.upstream_tls(self.upstream_tls.client_config()?);
        }
        if self.principal_tls_subject {
            config = config.principal_from_tls_subject();
        }
        if let Some(limit) = self.max_in_flight {
            config = config.max_in_flight(limit);
        }
        Ok(match &self.probe {
            Some(probe) => config.probe(probe.clone()),
            None => config,
        })
    }

    /// These settings as a config file that resolves to them again, every
    /// key written out (the store's and the upstream's passwords included:
    /// keep the file as private as the settings it came from).
    pub fn to_toml(&self) -> String {
        let store = match &self.store {
            StoreLocation::Sqlite(path) => format!("sqlite://{}", path.display()),
            StoreLocation::Postgres(url) | StoreLocation::Redis(url) => url.clone(),
        };
        let mut lines = vec![
            format!(
                "upstream = {}",
                quoted(&self.upstream.to_url_with_password())
            ),
            format!("listen = {}", quoted(&self.listen.to_string())),
            format!("store = {}", quoted(&store)),
            format!("mode = {}", quoted(mode_name(self.mode))),
            format!("require_key = {}", self.require_key),
            format!("max_body = {}", self.max_body),
            format!("lease = {}", quoted(&duration_text(self.lease))),
            format!("retention = {}", quoted(&duration_text(self.retention))),
            format!(
                "tombstones = {}",
                quoted(
                    &self
                        .tombstones
                        .map_or_else(|| "off".to_owned(), duration_text)
                )
            ),
            format!(
                "upstream_timeout = {}",
                quoted(&duration_text(self.upstream_timeout))
            ),
            format!(
                "body_timeout = {}",
                quoted(&duration_text(self.body_timeout))
            ),
            format!(
                "spool = {}",
                quoted(
                    &self
                        .spool
                        .as_ref()
                        .map_or_else(|| "off".to_owned(), |p| p.display().to_string())
                )
            ),
            format!(
                "principal_header = {}",
                quoted(if self.principal_tls_subject {
                    TLS_SUBJECT
                } else {
                    self.principal_header
                        .as_ref()
                        .map_or("none", HeaderName::as_str)
                })
            ),
            format!(
                "methods = [{}]",
                self.methods
                    .iter()
                    .map(|m| quoted(m.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "sweep_every = {}",
                quoted(
                    &self
                        .sweep_every
                        .map_or_else(|| "off".to_owned(), duration_text)
                )
            ),
            format!(
                "max_in_flight = {}",
                self.max_in_flight
                    .map_or_else(|| quoted("off"), |limit| limit.to_string())
            ),
            format!("concurrent = {}", quoted(&concurrent_text(self.concurrent))),
            format!("max_waiters = {}", self.waiter_caps.total),
            format!("max_waiters_per_key = {}", self.waiter_caps.per_key),
            format!(
                "routes = [{}]",
                self.routes
                    .iter()
                    .map(|r| quoted(r))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "grpc_unary = [{}]",
                self.grpc_unary
                    .iter()
                    .map(|m| quoted(m))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ];
        if let Some(fields) = self.fingerprint.selected() {
            lines.push(format!("fingerprint = {}", quoted(&fields)));
        }
        if let Some(fields) = self.fingerprint.ignored() {
            lines.push(format!("fingerprint_ignore = {}", quoted(&fields)));
        }
        if !self.fingerprint.headers().is_empty() {
            lines.push(format!(
                "fingerprint_header = [{}]",
                self.fingerprint
                    .headers()
                    .iter()
                    .map(|h| quoted(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(admin) = self.admin_listen {
            lines.push(format!("admin_listen = {}", quoted(&admin.to_string())));
        }
        if let Some(probe) = &self.probe {
            lines.push(format!("probe = {}", quoted(&probe.to_string())));
        }
        if let Some(probe) = &self.grpc_probe {
            lines.push(format!("grpc_probe = {}", quoted(probe)));
        }
        if let Some(policy) = &self.on_grpc_status {
            lines.push(format!("on_grpc_status = {}", quoted(policy)));
        }
        lines.push(format!(
            "on_status = {}",
            quoted(&self.on_status.describe())
        ));
        let mut file = |key: &str, path: Option<&PathBuf>| {
            if let Some(path) = path {
                lines.push(format!("{key} = {}", quoted(&path.display().to_string())));
            }
        };
        file("upstream_ca", self.upstream_tls.ca.as_ref());
        file("upstream_cert", self.upstream_tls.cert.as_ref());
        file("upstream_key", self.upstream_tls.key.as_ref());
        file("tls_cert", self.tls.as_ref().map(|tls| &tls.cert));
        file("tls_key", self.tls.as_ref().map(|tls| &tls.key));
        file(
            "tls_client_ca",
            self.tls.as_ref().and_then(|tls| tls.client_ca.as_ref()),
        );
        file("admin_token_file", self.admin_token_file.as_ref());
        if self.allow_hosts.is_extended() {
            let names: Vec<String> = self.allow_hosts.added().iter().map(|n| quoted(n)).collect();
            lines.push(format!("allow_hosts = [{}]", names.join(", ")));
        }
        lines.join("\n") + "\n"
    }
}

/// The `Host` names from `--allow-host` (or `IDEM_ALLOW_HOSTS`), else the
/// file's `allow_hosts`, added to the loopback ones.
fn allowed_hosts(
    sources: &Sources<'_>,
    given: &GivenSettings,
) -> Result<AllowedHosts, SettingsError> {
    let (names, origin) = match (&given.allow_hosts, &sources.file.allow_hosts) {
        (Some(names), _) => (
            names.clone(),
            "--allow-host (or IDEM_ALLOW_HOSTS)".to_owned(),
        ),
        (None, Some(listed)) => (
            listed.text(),
            format!(
                "`allow_hosts` in {}",
                sources
                    .path
                    .map_or_else(String::new, |p| p.display().to_string())
            ),
        ),
        (None, None) => return Ok(AllowedHosts::loopback()),
    };
    AllowedHosts::parse([names.as_str()])
        .map_err(|e| SettingsError::new(format!("invalid {origin}: {e}")))
}

/// The fingerprint rule from `--fingerprint`, `--fingerprint-ignore` and
/// `--fingerprint-header` (or their variables, or the file's keys).
fn fingerprint_rule(
    sources: &Sources<'_>,
    given: &GivenSettings,
) -> Result<FingerprintRule, SettingsError> {
    let select = sources.pick(
        "fingerprint",
        "IDEM_FINGERPRINT",
        given.fingerprint.as_ref(),
        |f| f.fingerprint.clone(),
    );
    let ignore = sources.pick(
        "fingerprint-ignore",
        "IDEM_FINGERPRINT_IGNORE",
        given.fingerprint_ignore.as_ref(),
        |f| f.fingerprint_ignore.clone(),
    );
    let headers = sources.pick(
        "fingerprint-header",
        "IDEM_FINGERPRINT_HEADER",
        given.fingerprint_header.as_ref(),
        |f| f.fingerprint_header.as_ref().map(Listed::text),
    );
    let invalid = |found: &Found, error: idem::FingerprintRuleError| {
        SettingsError::new(format!("invalid {}: {error}", found.origin))
    };
    let mut rule = FingerprintRule::default();
    match (&select, &ignore) {
        (Some(select), Some(ignore)) => {
            return Err(SettingsError::new(format!(
                "{} selects the fields a fingerprint covers and {} leaves some out: give one of the two (the selection, such as json:/amount,/currency, or the fields to leave out, such as json:/sent_at)",
                select.origin, ignore.origin
            )));
        }
        (Some(found), None) => {
            rule = rule.select(&found.value).map_err(|e| invalid(found, e))?;
        }
        (None, Some(found)) => {
            rule = rule.ignore(&found.value).map_err(|e| invalid(found, e))?;
        }
        (None, None) => {}
    }
    if let Some(found) = &headers {
        let names: Vec<&str> = found
            .value
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .collect();
        if names.is_empty() {
            return Err(SettingsError::new(format!(
                "invalid {}: no header named; write one or more, such as content-type or x-tenant-id",
                found.origin
            )));
        }
        for name in names {
            rule = rule.header(name).map_err(|e| invalid(found, e))?;
        }
    }
    Ok(rule)
}

/// The spool when none is given: next to an SQLite store's file
/// (`idem.db.spool`), else `idem.spool` in the working directory.
fn default_spool(store: &StoreLocation) -> PathBuf {
    match store {
        StoreLocation::Sqlite(path) => {
            let mut name = path.as_os_str().to_owned();
            name.push(".spool");
            PathBuf::from(name)
        }
        StoreLocation::Postgres(_) | StoreLocation::Redis(_) => PathBuf::from(DEFAULT_SPOOL),
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Ietf => "ietf",
        Mode::Stripe => "stripe",
    }
}

/// What a concurrent duplicate gets, as [`parse_concurrent`] reads it.
fn concurrent_text(concurrent: Concurrent) -> String {
    match concurrent {
        Concurrent::Reject => "reject".to_owned(),
        Concurrent::Wait(up_to) => format!("wait:{}", duration_text(up_to)),
    }
}

/// A TOML basic string.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// A duration as [`parse_duration`] reads it back exactly.
fn duration_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

fn address(found: &Found) -> Result<SocketAddr, SettingsError> {
    found.value.parse().map_err(|_| {
        SettingsError::new(format!(
            "invalid {}: {:?} is not an address; write IP:PORT, such as 127.0.0.1:8080 or 0.0.0.0:8080",
            found.origin, found.value
        ))
    })
}

/// A comma-separated method list such as `POST,PATCH,PUT,DELETE`: the
/// methods on which a key is required. Safe methods are refused: a GET
/// changes nothing, so a key on it protects nothing.
pub fn parse_methods(text: &str) -> Result<Vec<Method>, SettingsError> {
    let mut methods = Vec::new();
    for name in text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let method = Method::from_bytes(name.to_ascii_uppercase().as_bytes())
            .map_err(|_| SettingsError::new(format!("{name:?} is not an HTTP method")))?;
        if method.is_safe() {
            return Err(SettingsError::new(format!(
                "{method} changes nothing on the upstream, so there is no reason to require a key on it; list methods with effects, such as POST,PATCH,PUT,DELETE"
            )));
        }
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    if methods.is_empty() {
        return Err(SettingsError::new(
            "no method given; write a list such as POST,PATCH,PUT,DELETE",
        ));
    }
    Ok(methods)
}

/// The most requests in flight at a time: a whole number from 1 to
/// [`MAX_IN_FLIGHT`], or `off` (`None`) for no limit.
pub fn parse_limit(text: &str) -> Result<Option<usize>, SettingsError> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let explain = || {
        SettingsError::new(format!(
            "{text:?} is not a number of requests; write a whole number from 1 to {MAX_IN_FLIGHT}, such as 256, or off for no limit"
        ))
    };
    let limit: usize = text.parse().map_err(|_| explain())?;
    if limit == 0 || limit > MAX_IN_FLIGHT {
        return Err(explain());
    }
    Ok(Some(limit))
}

/// The longest wait `--concurrent wait:DURATION` takes: 10 minutes.
pub const MAX_CONCURRENT_WAIT: Duration = Duration::from_secs(600);

/// What a concurrent duplicate gets: `reject` (409 at once) or
/// `wait:DURATION` (such as `wait:5s`, up to [`MAX_CONCURRENT_WAIT`]).
pub fn parse_concurrent(text: &str) -> Result<Concurrent, SettingsError> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("reject") {
        return Ok(Concurrent::Reject);
    }
    let explain = |why: String| {
        SettingsError::new(format!(
            "{text:?} is not a way to answer concurrent duplicates ({why}); write reject (409 at once) or wait:DURATION, such as wait:5s"
        ))
    };
    let Some((word, duration)) = trimmed.split_once(':') else {
        return Err(explain("neither reject nor wait:DURATION".to_owned()));
    };
    if !word.trim().eq_ignore_ascii_case("wait") {
        return Err(explain(format!("{:?} is not wait", word.trim())));
    }
    let up_to = parse_duration(duration).map_err(|e| explain(e.to_string()))?;
    if up_to > MAX_CONCURRENT_WAIT {
        return Err(explain(format!(
            "longer than {}, the longest wait",
            duration_text(MAX_CONCURRENT_WAIT)
        )));
    }
    Ok(Concurrent::Wait(up_to))
}

/// A cap on waiting duplicates: a whole number from 1 to [`MAX_IN_FLIGHT`].
pub fn parse_waiters(text: &str) -> Result<usize, SettingsError> {
    let text = text.trim();
    match text.parse::<usize>() {
        Ok(cap) if (1..=MAX_IN_FLIGHT).contains(&cap) => Ok(cap),
        _ => Err(SettingsError::new(format!(
            "{text:?} is not a number of waiting requests; write a whole number from 1 to {MAX_IN_FLIGHT}, such as 64"
        ))),
    }
}

/// The largest `--max-in-flight`.
pub const MAX_IN_FLIGHT: usize = 1 << 20;

/// `--max-in-flight` when none is given: 1024. Each request in flight holds
/// a client connection, an upstream connection and, when keyed, its body
/// (up to `--max-body`, 1 MiB by default): 1024 of them bound the gateway
/// to about 1 GiB of bodies and a few thousand sockets under a flood, far
/// above what one upstream usually serves at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The shortest `--lease`: 1 s. A claim is renewed every third of its
/// lease, and each renewal is a round trip to the store; a shorter lease
/// leaves no headroom for one, so a claim would lapse while its request is
/// still running, and a copy of the request would run beside it.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// A lease: a duration of at least [`MIN_LEASE`].
pub fn parse_lease(text: &str) -> Result<Duration, SettingsError> {
    let lease = parse_duration(text)?;
    if lease < MIN_LEASE {
        return Err(SettingsError::new(format!(
            "{text:?} is shorter than {}, the shortest lease: a claim is renewed every third of its lease, and each renewal is a round trip to the store that needs headroom, so a shorter lease lapses while its request still runs and a copy of the request runs beside it; give 1s or more, such as 60s",
            duration_text(MIN_LEASE)
        )));
    }
    Ok(lease)
}

/// A comma-separated list of route templates such as
/// `/payments/{id},/orders`: each starts with `/`, is visible ASCII, and
/// writes a placeholder as a whole segment (`{id}`, or `{*rest}` last).
/// Repeats are dropped; an empty list is no templates.
pub fn parse_routes(text: &str) -> Result<Vec<String>, SettingsError> {
    let mut routes: Vec<String> = Vec::new();
    for route in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let explain = |why: &str| {
            SettingsError::new(format!(
                "{route:?} is not a route template ({why}); write paths such as /payments/{{id}},/orders"
            ))
        };
        if !route.starts_with('/') {
            return Err(explain("it does not start with /"));
        }
        if !route.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(explain("only visible ASCII characters, no spaces"));
        }
        let segments: Vec<&str> = route.split('/').filter(|s| !s.is_empty()).collect();
        for (i, segment) in segments.iter().enumerate() {
            let braces = segment.contains(['{', '}']);
            let whole = segment.len() > 2
                && segment.starts_with('{')
                && segment.ends_with('}')
                && !segment[1..segment.len() - 1].contains(['{', '}']);
            if braces && !whole {
                return Err(explain("a placeholder is a whole segment, such as {id}"));
            }
            if whole && segment.starts_with("{*") && i + 1 != segments.len() {
                return Err(explain("{*rest} can only be the last segment"));
            }
        }
        if !routes.iter().any(|r| r == route) {
            routes.push(route.to_owned());
        }
    }
    Ok(routes)
}

/// A comma-separated list of unary gRPC methods, each as its path
/// `/package.Service/Method`. Repeats are dropped; an empty list is none.
pub fn parse_grpc_methods(text: &str) -> Result<Vec<String>, SettingsError> {
    let mut methods: Vec<String> = Vec::new();
    for method in text.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let parts: Vec<&str> = method.split('/').collect();
        let valid = parts.len() == 3
            && parts[0].is_empty()
            && !parts[1].is_empty()
            && !parts[2].is_empty()
            && method
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_'));
        if !valid {
            return Err(SettingsError::new(format!(
                "{method:?} is not a gRPC method path; write each as /package.Service/Method, such as /payments.v1.Payments/Charge"
            )));
        }
        if !methods.iter().any(|m| m == method) {
            methods.push(method.to_owned());
        }
    }
    Ok(methods)
}

/// The gRPC lookup methods asked before a takeover: a method path for every
/// method (`/payments.v1.Payments/Lookup`), `METHOD=LOOKUP` pairs for one
/// each, or both, comma-separated; written back without spaces.
fn parse_grpc_probe(text: &str) -> Result<String, SettingsError> {
    let mut parts = Vec::new();
    let mut every = 0;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let paths: Vec<&str> = part.split('=').map(str::trim).collect();
        if paths.len() > 2 {
            return Err(SettingsError::new(format!(
                "{part:?} is not a gRPC probe; write the lookup method, such as /payments.v1.Payments/Lookup, or METHOD=LOOKUP"
            )));
        }
        every += usize::from(paths.len() == 1);
        parse_grpc_methods(&paths.join(","))?;
        parts.push(paths.join("="));
    }
    if parts.is_empty() || every > 1 {
        return Err(SettingsError::new(format!(
            "{text:?} is not a gRPC probe: give one lookup method for every method, such as /payments.v1.Payments/Lookup, and METHOD=LOOKUP pairs for methods with their own"
        )));
    }
    Ok(parts.join(","))
}

/// A duration such as `300ms`, `60s`, `2m`, `7d`, `1h 30m`; more than zero.
pub fn parse_duration(text: &str) -> Result<Duration, SettingsError> {
    if text.trim_start().starts_with('-') {
        return Err(SettingsError::new(format!(
            "{text:?} is a negative duration; give one longer than zero, such as 300ms, 60s, 2m, 24h or 7d"
        )));
    }
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        SettingsError::new(format!(
            "{text:?} is not a duration ({e}); write a number and a unit, such as 300ms, 60s, 2m, 24h or 7d"
        ))
    })?;
    if duration.is_zero() {
        return Err(SettingsError::new(format!(
            "{text:?} is zero; give a duration longer than that"
        )));
    }
    Ok(duration)
}

/// A size such as `65536`, `64KiB`, `1MiB`, `1MB` (KB, MB, GB are powers of
/// 1000; KiB, MiB, GiB of 1024); more than zero.
pub fn parse_size(text: &str) -> Result<usize, SettingsError> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let explain = || {
        SettingsError::new(format!(
            "{text:?} is not a size; write a whole number of bytes with an optional unit, such as 65536, 64KiB or 1MiB"
        ))
    };
    let number: u64 = number.parse().map_err(|_| explain())?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1000 * 1000,
        "mib" => 1 << 20,
        "g" | "gb" => 1000 * 1000 * 1000,
        "gib" => 1 << 30,
        _ => return Err(explain()),
    };
    let bytes = number.checked_mul(scale).ok_or_else(explain)?;
    if bytes == 0 {
        return Err(SettingsError::new(format!(
            "{text:?} is zero; give a size of at least one byte"
        )));
    }
    usize::try_from(bytes).map_err(|_| explain())
}

/// The settings in one line, for the start-up message.
impl fmt::Display for GatewaySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store {}; mode {}; key {} on {}; max body {} bytes; lease {}; retention {}; upstream timeout {}; body timeout {}; principal {}; in flight {}; fingerprint {}; concurrent duplicates {}",
            self.store,
            mode_name(self.mode),
            if self.require_key {
                "required"
            } else {
                "optional"
            },
            self.methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(","),
            self.max_body,
            humantime::format_duration(self.lease),
            humantime::format_duration(self.retention),
            humantime::format_duration(self.upstream_timeout),
            humantime::format_duration(self.body_timeout),
            if self.principal_tls_subject {
                "the client certificate's subject"
            } else {
                self.principal_header
                    .as_ref()
                    .map_or("none (one key space)", HeaderName::as_str)
            },
            self.max_in_flight.map_or_else(
                || "unlimited".to_owned(),
                |limit| format!("at most {limit}")
            ),
            self.fingerprint,
            match self.concurrent {
                Concurrent::Reject => "409 at once".to_owned(),
                Concurrent::Wait(up_to) => format!(
                    "wait up to {} (at most {} per key, {} in all)",
                    duration_text(up_to),
                    self.waiter_caps.per_key,
                    self.waiter_caps.total
                ),
            },
        )?;
        let probed = self.probe.is_some();
        let verdicts = [500, 502, 503, 504, 429]
            .into_iter()
            .filter_map(|code| http::StatusCode::from_u16(code).ok())
            .map(|status| {
                format!(
                    "{}={}",
                    status.as_u16(),
                    self.on_status.verdict(status, probed)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        write!(f, "; answers {} ({verdicts})", self.on_status.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream() -> GivenSettings {
        GivenSettings {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..GivenSettings::default()
        }
    }

    fn from_file(given: &GivenSettings, text: &str) -> Result<GatewaySettings, SettingsError> {
        GatewaySettings::resolve(given, Some(SettingsFile::new("idem.toml", text)))
    }

    fn error(given: &GivenSettings) -> String {
        GatewaySettings::resolve(given, None)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn fingerprint_rules_read_from_flags_and_file_and_bad_ones_say_what_to_write() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert!(defaults.fingerprint.is_whole_body());

        let mut given = upstream();
        given.fingerprint = Some("json:/currency,/amount".into());
        given.fingerprint_header = Some("Content-Type,x-tenant".into());
        let flagged = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(
            flagged.fingerprint.to_string(),
            "json:/amount,/currency header:content-type header:x-tenant"
        );
        assert_eq!(
            flagged.idempotency().fingerprint_rule(),
            &flagged.fingerprint
        );
        assert!(
            flagged
                .to_string()
                .contains("fingerprint json:/amount,/currency header:content-type")
        );
        let again = from_file(&GivenSettings::default(), &flagged.to_toml()).unwrap();
        assert_eq!(again, flagged);

        let text = "upstream = \"http://127.0.0.1:9000\"\nfingerprint_ignore = \"json:/sent_at\"\nfingerprint_header = [\"x-tenant\"]\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(
            filed.fingerprint.to_string(),
            "ignore json:/sent_at header:x-tenant"
        );
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again, filed);

        let bad = |select: Option<&str>, ignore: Option<&str>, header: Option<&str>| {
            let mut given = upstream();
            given.fingerprint = select.map(Into::into);
            given.fingerprint_ignore = ignore.map(Into::into);
            given.fingerprint_header = header.map(Into::into);
            error(&given)
        };
        let e = bad(Some("/amount"), None, None);
        assert!(
            e.contains("--fingerprint (or IDEM_FINGERPRINT)")
                && e.contains("does not start with json:"),
            "{e}"
        );
        let e = bad(Some("json:"), None, None);
        assert!(e.contains("names no field"), "{e}");
        let e = bad(None, Some("json:sent_at"), None);
        assert!(
            e.contains("--fingerprint-ignore (or IDEM_FINGERPRINT_IGNORE)")
                && e.contains("not a JSON Pointer"),
            "{e}"
        );
        let e = bad(Some("json:/a"), Some("json:/b"), None);
        assert!(e.contains("give one of the two"), "{e}");
        let e = bad(None, None, Some("x tenant"));
        assert!(
            e.contains("--fingerprint-header (or IDEM_FINGERPRINT_HEADER)")
                && e.contains("is not a header name"),
            "{e}"
        );
        let e = bad(None, None, Some(" , "));
        assert!(e.contains("no header named"), "{e}");
        let e = from_file(
            &GivenSettings::default(),
            "upstream = \"http://127.0.0.1:9000\"\nfingerprint = \"amount\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`fingerprint` in idem.toml"), "{e}");
    }

    #[test]
    fn the_grpc_code_policy_needs_grpc_calls_and_rules() {
        let mut given = upstream();
        given.on_grpc_status = Some("internal=store".into());
        let alone = GatewaySettings::resolve(&given, None)
            .unwrap_err()
            .to_string();
        assert!(alone.contains("--grpc-unary"), "{alone}");
        given.grpc_unary = Some("/p.Pay/Charge".into());
        let set = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(set.on_grpc_status.as_deref(), Some("internal=store"));
        let again = GatewaySettings::resolve(
            &GivenSettings::default(),
            Some(SettingsFile::new("again.toml", &set.to_toml())),
        )
        .unwrap();
        assert_eq!(again.on_grpc_status, set.on_grpc_status);
        given.on_grpc_status = Some("internal".into());
        let bad = GatewaySettings::resolve(&given, None)
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("--on-grpc-status (or IDEM_ON_GRPC_STATUS)")
                && bad.contains("CODE=VERDICT"),
            "{bad}"
        );
    }

    #[test]
    fn the_grpc_probe_is_read_checked_and_written_out() {
        let text = "upstream = \"h2c://127.0.0.1:50051\"\ngrpc_unary = [\"/p.Pay/Charge\"]\ngrpc_probe = \"/p.Pay/Lookup, /p.Pay/Refund = /p.Pay/LookupRefund\"\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(
            filed.grpc_probe.as_deref(),
            Some("/p.Pay/Lookup,/p.Pay/Refund=/p.Pay/LookupRefund")
        );
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again, filed);
        assert!(filed.gateway().unwrap().grpc_probed);
        assert!(!again.gateway().is_ok_and(|g| g.probe.is_some()));

        let mut given = upstream();
        given.grpc_unary = Some("/p.Pay/Charge".into());
        given.grpc_probe = Some("off".into());
        assert_eq!(
            GatewaySettings::resolve(&given, None).unwrap().grpc_probe,
            None
        );
        for (bad, says) in [
            ("Lookup", "not a gRPC method path"),
            ("/p.Pay/A=/p.Pay/B=/p.Pay/C", "METHOD=LOOKUP"),
            ("/p.Pay/L1,/p.Pay/L2", "one lookup method for every method"),
        ] {
            given.grpc_probe = Some(bad.into());
            let e = GatewaySettings::resolve(&given, None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--grpc-probe (or IDEM_GRPC_PROBE)") && e.contains(says),
                "{bad}: {e}"
            );
        }
        let mut alone = upstream();
        alone.grpc_probe = Some("/p.Pay/Lookup".into());
        let e = GatewaySettings::resolve(&alone, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--grpc-unary"), "{e}");
    }

    #[test]
    fn grpc_methods_read_from_flags_and_file_and_bad_ones_say_what_to_write() {
        let text = "upstream = \"h2c://127.0.0.1:50051\"\ngrpc_unary = [\"/payments.v1.Payments/Charge\"]\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(filed.grpc_unary, ["/payments.v1.Payments/Charge"]);
        assert!(filed.upstream.is_http2());
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again, filed);

        let mut given = upstream();
        given.grpc_unary = Some("/a.B/C, /a.B/C,/a.B/D".into());
        let flagged = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(flagged.grpc_unary, ["/a.B/C", "/a.B/D"]);
        for bad in ["a.B/C", "/a.B", "/a.B/C/D", "/a B/C"] {
            given.grpc_unary = Some(bad.into());
            let error = error(&given);
            assert!(
                error.contains("--grpc-unary (or IDEM_GRPC_UNARY)")
                    && error.contains("/package.Service/Method"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn defaults_need_only_an_upstream() {
        let missing = error(&GivenSettings::default());
        assert!(missing.contains("--upstream"), "{missing}");
        let settings = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(settings.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(settings.store, StoreLocation::Sqlite("idem.db".into()));
        assert_eq!(settings.mode, Mode::Ietf);
        assert!(!settings.require_key);
        assert_eq!(settings.max_body, 1 << 20);
        assert_eq!(settings.lease, Duration::from_secs(60));
        assert_eq!(settings.retention, Duration::from_secs(7 * 86400));
        assert_eq!(settings.upstream_timeout, Duration::from_secs(30));
        assert_eq!(settings.admin_listen, None);
        assert_eq!(settings.principal_header, Some(http::header::AUTHORIZATION));
        assert_eq!(settings.methods, [Method::POST, Method::PATCH]);
        assert_eq!(settings.sweep_every, Some(Duration::from_secs(60)));
        assert_eq!(settings.body_timeout, Duration::from_secs(30));
        assert_eq!(settings.max_in_flight, Some(DEFAULT_MAX_IN_FLIGHT));
        assert_eq!(
            settings.gateway().unwrap().max_in_flight,
            Some(DEFAULT_MAX_IN_FLIGHT)
        );
        assert!(settings.routes.is_empty());
    }

    #[test]
    fn the_limit_in_flight_and_the_routes_read_from_flags_and_file() {
        let text = "upstream = \"http://127.0.0.1:9000\"\nmax_in_flight = 256\nroutes = [\"/payments/{id}\", \"/orders\"]\n";
        let mut given = GivenSettings::default();
        let filed = from_file(&given, text).unwrap();
        assert_eq!(filed.max_in_flight, Some(256));
        assert_eq!(filed.routes, ["/payments/{id}", "/orders"]);
        assert_eq!(filed.gateway().unwrap().max_in_flight, Some(256));

        given.max_in_flight = Some("off".into());
        given.routes = Some("/files/{*path}, /orders,/orders".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(flagged.max_in_flight, None);
        assert_eq!(flagged.routes, ["/files/{*path}", "/orders"]);
        assert_eq!(from_file(&given, &flagged.to_toml()).unwrap(), flagged);

        for (bad, says) in [
            ("0", "from 1 to"),
            ("many", "off for no limit"),
            ("2000000", "from 1 to"),
        ] {
            given.max_in_flight = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--max-in-flight (or IDEM_MAX_IN_FLIGHT)") && error.contains(says),
                "{bad}: {error}"
            );
        }
        given.max_in_flight = None;
        for (bad, says) in [
            ("payments", "start with /"),
            ("/a b", "no spaces"),
            ("/pay{id}", "whole segment"),
            ("/files/{*rest}/x", "last segment"),
            ("/{}", "whole segment"),
        ] {
            given.routes = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--routes (or IDEM_ROUTES)") && error.contains(says),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn concurrent_duplicates_wait_only_when_asked_and_bad_values_say_what_to_write() {
        let text = "upstream = \"http://127.0.0.1:9000\"\n";
        let mut given = GivenSettings::default();
        let defaults = from_file(&given, text).unwrap();
        assert_eq!(defaults.concurrent, Concurrent::Reject);
        assert_eq!(defaults.waiter_caps, WaiterCaps::default());
        assert_eq!(
            defaults.idempotency().concurrent_duplicates(),
            Concurrent::Reject
        );

        let filed = from_file(
            &given,
            "upstream = \"http://127.0.0.1:9000\"\nconcurrent = \"wait:5s\"\nmax_waiters = 500\nmax_waiters_per_key = \"8\"\n",
        )
        .unwrap();
        assert_eq!(filed.concurrent, Concurrent::Wait(Duration::from_secs(5)));
        assert_eq!(
            filed.waiter_caps,
            WaiterCaps {
                per_key: 8,
                total: 500
            }
        );
        let config = filed.idempotency();
        assert_eq!(config.waiters().per_key, 8);
        assert_eq!(
            config.concurrent_duplicates(),
            Concurrent::Wait(Duration::from_secs(5))
        );
        assert_eq!(from_file(&given, &filed.to_toml()).unwrap(), filed);
        assert!(filed.to_string().contains("wait up to 5s"), "{filed}");

        given.concurrent = Some("WAIT:250ms".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(
            flagged.concurrent,
            Concurrent::Wait(Duration::from_millis(250))
        );
        assert_eq!(from_file(&given, &flagged.to_toml()).unwrap(), flagged);
        given.concurrent = Some("reject".into());
        assert_eq!(
            from_file(&given, text).unwrap().concurrent,
            Concurrent::Reject
        );

        for (bad, says) in [
            ("wait", "reject (409 at once) or wait:DURATION"),
            ("sleep:5s", "\"sleep\" is not wait"),
            ("wait:0s", "is zero"),
            ("wait:soon", "not a duration"),
            ("wait:1h", "longer than 10m"),
        ] {
            given.concurrent = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--concurrent (or IDEM_CONCURRENT)") && error.contains(says),
                "{bad}: {error}"
            );
        }
        given.concurrent = None;
        given.max_waiters_per_key = Some("0".into());
        let error = from_file(&given, text).unwrap_err().to_string();
        assert!(
            error.contains("--max-waiters-per-key (or IDEM_MAX_WAITERS_PER_KEY)")
                && error.contains("from 1 to"),
            "{error}"
        );
    }

    #[test]
    fn put_and_delete_require_a_key_when_listed() {
        let text =
            "upstream = \"http://127.0.0.1:9000\"\nmethods = [\"post\", \"PUT\", \"DELETE\"]\n";
        let mut given = GivenSettings::default();
        let settings = from_file(&given, text).unwrap();
        assert_eq!(
            settings.methods,
            [Method::POST, Method::PUT, Method::DELETE]
        );
        let config = settings.idempotency();
        assert!(config.accepts_key(&Method::PUT) && config.accepts_key(&Method::DELETE));
        // Not listed: keyless PATCH passes, keyed PATCH is still deduplicated.
        assert!(config.accepts_key(&Method::PATCH));
        assert_eq!(
            config.key_methods(),
            [Method::POST, Method::PUT, Method::DELETE]
        );

        given.methods = Some("POST, PATCH,PUT".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(flagged.methods, [Method::POST, Method::PATCH, Method::PUT]);

        for (bad, says) in [
            ("GET,POST", "changes nothing"),
            ("", "no method given"),
            ("PO ST", "not an HTTP method"),
        ] {
            given.methods = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--methods (or IDEM_METHODS)") && error.contains(says),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_defaults() {
        let text = r#"
            upstream = "http://127.0.0.1:9000/api"
            listen = "0.0.0.0:8081"
            store = "sqlite:///var/lib/idem/idem.db"
            mode = "stripe"
            require_key = true
            max_body = 4096
            lease = "30s"
            retention = "24h"
            admin_listen = "127.0.0.1:9090"
            upstream_timeout = "5s"
            principal_header = "x-tenant-id"
            sweep_every = "off"
            "#;
        let mut given = GivenSettings::default();
        let filed = from_file(&given, text).unwrap();
        assert_eq!(filed.upstream.to_string(), "http://127.0.0.1:9000/api");
        assert_eq!(filed.listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(
            filed.store,
            StoreLocation::Sqlite("/var/lib/idem/idem.db".into())
        );
        assert_eq!(filed.mode, Mode::Stripe);
        assert!(filed.require_key);
        assert_eq!(filed.max_body, 4096);
        assert_eq!(filed.lease, Duration::from_secs(30));
        assert_eq!(filed.retention, Duration::from_secs(86400));
        assert_eq!(filed.admin_listen, Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(filed.upstream_timeout, Duration::from_secs(5));
        assert_eq!(filed.principal_header.unwrap().as_str(), "x-tenant-id");
        assert_eq!(filed.sweep_every, None);

        given.upstream = Some("http://10.1.2.3:80".into());
        given.store = Some("sqlite://other.db".into());
        given.mode = Some("ietf".into());
        given.require_key = Some(false);
        given.max_body = Some("2KiB".into());
        given.lease = Some("10s".into());
        given.principal_header = Some("none".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(flagged.upstream.to_string(), "http://10.1.2.3:80");
        assert_eq!(flagged.store, StoreLocation::Sqlite("other.db".into()));
        assert_eq!(flagged.mode, Mode::Ietf);
        assert!(!flagged.require_key);
        assert_eq!(flagged.max_body, 2048);
        assert_eq!(flagged.lease, Duration::from_secs(10));
        assert_eq!(flagged.principal_header, None);
        // Not given as flags: still from the file.
        assert_eq!(flagged.retention, Duration::from_secs(86400));
        assert_eq!(flagged.listen, "0.0.0.0:8081".parse().unwrap());
    }

    #[test]
    fn tombstones_are_off_unless_given_a_duration() {
        let mut given = upstream();
        let resolved = |given: &GivenSettings| GatewaySettings::resolve(given, None).unwrap();
        assert_eq!(resolved(&given).tombstones, None);
        assert_eq!(
            resolved(&given).idempotency().store_settings().tombstones,
            None
        );
        given.tombstones = Some("30d".into());
        let on = resolved(&given);
        assert_eq!(on.tombstones, Some(Duration::from_secs(30 * 86400)));
        assert_eq!(
            on.idempotency().store_settings().tombstones,
            Some(Duration::from_secs(30 * 86400))
        );
        given.tombstones = Some("off".into());
        assert_eq!(resolved(&given).tombstones, None);
        given.tombstones = Some("a month".into());
        let refused = error(&given);
        assert!(refused.contains("--tombstones"), "{refused}");
        let filed = from_file(
            &GivenSettings::default(),
            "upstream = \"http://127.0.0.1:9000\"\ntombstones = \"12h\"\n",
        )
        .unwrap();
        assert_eq!(filed.tombstones, Some(Duration::from_secs(12 * 3600)));
    }

    #[test]
    fn bad_input_names_its_source_and_what_to_write() {
        let given = GivenSettings::default();
        let misspelt = from_file(
            &given,
            "upstream = \"http://127.0.0.1:9000\"\nlease_time = \"5s\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            misspelt.contains("lease_time") && misspelt.contains("idem.toml"),
            "{misspelt}"
        );
        let size = from_file(
            &given,
            "upstream = \"http://127.0.0.1:9000\"\nmax_body = \"lots\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            size.contains("`max_body` in idem.toml") && size.contains("1MiB"),
            "{size}"
        );

        let mut given = upstream();
        given.lease = Some("forever".into());
        let lease = error(&given);
        assert!(
            lease.contains("--lease (or IDEM_LEASE)") && lease.contains("60s"),
            "{lease}"
        );
        given.lease = None;
        given.retention = Some("30s".into());
        assert!(error(&given).contains("longer than the lease"));
        given.retention = None;
        given.listen = Some("localhost".into());
        assert!(error(&given).contains("IP:PORT"));
        given.listen = None;
        given.mode = Some("paypal".into());
        assert!(error(&given).contains("ietf or stripe"));
        given.mode = None;
        given.store = Some("mysql://x".into());
        let store = error(&given);
        assert!(
            store.contains("--store") && store.contains("sqlite://"),
            "{store}"
        );
        given.store = None;
        given.upstream = Some("ftp://example.com".into());
        let scheme = error(&given);
        assert!(
            scheme.contains("--upstream") && scheme.contains("HTTP or HTTPS"),
            "{scheme}"
        );
    }

    #[test]
    fn tls_files_come_in_pairs_and_fit_the_upstream_and_the_principal() {
        let secure = || GivenSettings {
            upstream: Some("https://api.example.com".into()),
            ..GivenSettings::default()
        };
        let settings = GatewaySettings::resolve(&secure(), None).unwrap();
        assert!(settings.upstream.is_https());
        assert!(settings.upstream_tls.is_default());
        assert_eq!(settings.tls, None);

        let mut given = secure();
        given.tls_cert = Some("cert.pem".into());
        assert!(error(&given).contains("--tls-cert was given without --tls-key"));
        given.tls_cert = None;
        given.tls_key = Some("key.pem".into());
        assert!(error(&given).contains("--tls-key was given without --tls-cert"));
        given.tls_key = None;
        given.tls_client_ca = Some("clients.pem".into());
        assert!(error(&given).contains("needs a TLS listener"));
        given.tls_client_ca = None;
        given.upstream_cert = Some("client.pem".into());
        assert!(error(&given).contains("without --upstream-key"));
        given.upstream_cert = None;
        given.principal_header = Some("tls-subject".into());
        assert!(error(&given).contains("--tls-client-ca"));

        let mut plain = upstream();
        plain.upstream_ca = Some("ca.pem".into());
        assert!(error(&plain).contains("https:// upstream"));

        let text = r#"
            upstream = "https://api.example.com"
            upstream_ca = "/etc/idem/upstream-ca.pem"
            tls_cert = "/etc/idem/cert.pem"
            tls_key = "/etc/idem/key.pem"
            tls_client_ca = "/etc/idem/clients.pem"
            principal_header = "tls-subject"
            admin_token_file = "/etc/idem/admin-token"
        "#;
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert!(filed.principal_tls_subject);
        assert_eq!(
            filed.principal_header.as_ref().map(HeaderName::as_str),
            Some(TLS_SUBJECT_HEADER)
        );
        let tls = filed.tls.clone().unwrap();
        assert_eq!(tls.cert, PathBuf::from("/etc/idem/cert.pem"));
        assert_eq!(tls.client_ca, Some(PathBuf::from("/etc/idem/clients.pem")));
        assert_eq!(
            filed.admin_token_file,
            Some(PathBuf::from("/etc/idem/admin-token"))
        );
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again.tls, filed.tls);
        assert_eq!(again.upstream_tls, filed.upstream_tls);
        assert_eq!(again.admin_token_file, filed.admin_token_file);
        assert!(again.principal_tls_subject);
        // The CA file is read only when the gateway is set up: a missing one
        // is named then.
        let missing = filed.gateway().unwrap_err().to_string();
        assert!(missing.contains("upstream-ca.pem"), "{missing}");
    }

    #[test]
    fn settings_written_out_resolve_to_themselves() {
        let text = r#"
            upstream = "http://127.0.0.1:9000/api"
            store = "postgres://idem:secret@127.0.0.1:5432/idem"
            mode = "stripe"
            max_body = "64KiB"
            lease = "1m 30s"
            admin_listen = "127.0.0.1:9090"
            principal_header = "none"
            methods = "put,post"
            "#;
        let settings = from_file(&GivenSettings::default(), text).unwrap();
        let written = settings.to_toml();
        assert!(written.contains("secret"), "{written}");
        assert_eq!(
            from_file(&GivenSettings::default(), &written).unwrap(),
            settings
        );
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(
            from_file(&GivenSettings::default(), &defaults.to_toml()).unwrap(),
            defaults
        );
    }

    #[test]
    fn the_fuzz_seeds_that_resolve_write_out_to_themselves() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus/gateway_settings");
        let mut resolved = 0;
        for entry in std::fs::read_dir(seeds).expect("the seed corpus") {
            let text = std::fs::read_to_string(entry.expect("a seed").path()).expect("a seed");
            let Ok(settings) = from_file(&GivenSettings::default(), &text) else {
                continue;
            };
            resolved += 1;
            assert_eq!(
                from_file(&GivenSettings::default(), &settings.to_toml()).unwrap(),
                settings
            );
        }
        assert!(resolved >= 3, "{resolved} seeds resolved");
    }

    #[test]
    fn the_status_policy_is_read_from_each_source_checked_and_shown() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.on_status, StatusPolicy::standard());
        assert!(
            defaults.to_string().contains(
                "answers standard (500=release,502=unknown,503=release,504=unknown,429=release)"
            ),
            "{defaults}"
        );
        let file = SettingsFile::new(
            "idem.toml",
            "upstream = \"http://127.0.0.1:9000\"\non_status = \"500=store\"\nprobe = \"GET /p/{key}\"\n",
        );
        let filed = GatewaySettings::resolve(&GivenSettings::default(), Some(file)).unwrap();
        assert!(
            filed
                .to_string()
                .contains("answers standard,500=store (500=store,502=unknown"),
            "{filed}"
        );
        let again = GatewaySettings::resolve(
            &GivenSettings::default(),
            Some(SettingsFile::new("again.toml", &filed.to_toml())),
        )
        .unwrap();
        assert_eq!(again.on_status, filed.on_status);
        let mut given = upstream();
        given.on_status = Some("5xx=unknown".into());
        let flagged = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(
            flagged
                .idempotency()
                .status_policy()
                .verdict(http::StatusCode::SERVICE_UNAVAILABLE, false),
            idem_http::Verdict::Unknown
        );
        given.on_status = Some("502=maybe".into());
        let refused = GatewaySettings::resolve(&given, None)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("--on-status (or IDEM_ON_STATUS)")
                && refused.contains("store, release or unknown"),
            "{refused}"
        );
    }

    #[test]
    fn the_probe_and_the_spool_are_read_checked_and_written_out() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.probe, None);
        assert_eq!(defaults.spool, Some(PathBuf::from("idem.db.spool")));
        assert_eq!(defaults.gateway().unwrap().probe_template(), None);

        let text = "upstream = \"http://127.0.0.1:9000\"\nstore = \"postgres://127.0.0.1/idem\"\nprobe = \"GET /payments/by-key/{key}\"\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(filed.spool, Some(PathBuf::from(DEFAULT_SPOOL)));
        assert_eq!(
            filed.probe.as_ref().map(ToString::to_string).as_deref(),
            Some("GET /payments/by-key/{key}")
        );
        assert!(filed.gateway().unwrap().probe_template().is_some());
        assert_eq!(
            from_file(&GivenSettings::default(), &filed.to_toml()).unwrap(),
            filed
        );

        let mut given = upstream();
        given.spool = Some("off".into());
        given.probe = Some("off".into());
        let off = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!((off.spool.clone(), off.probe.clone()), (None, None));
        assert_eq!(
            from_file(&GivenSettings::default(), &off.to_toml()).unwrap(),
            off
        );

        given.spool = Some(" ".into());
        let empty = error(&given);
        assert!(
            empty.contains("--spool (or IDEM_SPOOL)") && empty.contains("off"),
            "{empty}"
        );
        given.spool = None;
        given.probe = Some("GET /payments".into());
        let probe = error(&given);
        assert!(
            probe.contains("--probe (or IDEM_PROBE)")
                && probe.contains("no {key}")
                && probe.contains("GET /payments/by-key/{key}"),
            "{probe}"
        );
    }

    #[test]
    fn a_lease_under_a_second_and_a_negative_duration_are_refused_with_why() {
        let mut given = upstream();
        for short in ["1ms", "999ms", "500ms"] {
            given.lease = Some(short.into());
            let refused = error(&given);
            assert!(
                refused.contains("--lease (or IDEM_LEASE)")
                    && refused.contains("shortest lease")
                    && refused.contains("renewed every third of its lease"),
                "{short}: {refused}"
            );
        }
        given.lease = Some("1s".into());
        assert_eq!(
            GatewaySettings::resolve(&given, None).unwrap().lease,
            Duration::from_secs(1)
        );
        let filed = from_file(
            &GivenSettings::default(),
            "upstream = \"http://127.0.0.1:9000\"\nlease = \"10ms\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            filed.contains("`lease` in idem.toml") && filed.contains("shortest lease"),
            "{filed}"
        );

        given.lease = Some("-5s".into());
        let negative = error(&given);
        assert!(
            negative.contains("--lease (or IDEM_LEASE)")
                && negative.contains("a negative duration"),
            "{negative}"
        );
        given.lease = None;
        given.upstream_timeout = Some(" -1m".into());
        assert!(error(&given).contains("a negative duration"));
    }

    #[test]
    fn the_body_timeout_reads_from_flags_and_file_and_is_written_out() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.body_timeout, DEFAULT_BODY_TIMEOUT);
        assert!(
            defaults.to_string().contains("body timeout 30s"),
            "{defaults}"
        );
        let text = "upstream = \"http://127.0.0.1:9000\"\nbody_timeout = \"5s\"\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(filed.body_timeout, Duration::from_secs(5));
        assert_eq!(
            filed.gateway().unwrap().body_timeout,
            Duration::from_secs(5)
        );
        assert_eq!(
            from_file(&GivenSettings::default(), &filed.to_toml()).unwrap(),
            filed
        );
        let mut given = upstream();
        given.body_timeout = Some("2s".into());
        assert_eq!(
            from_file(&given, text).unwrap().body_timeout,
            Duration::from_secs(2)
        );
        given.body_timeout = Some("slowly".into());
        assert!(error(&given).contains("--body-timeout (or IDEM_BODY_TIMEOUT)"));
    }

    #[test]
    fn the_upstream_password_is_used_and_never_shown() {
        let mut given = upstream();
        given.upstream = Some("http://gw:pa%40ss@127.0.0.1:9000/api".into());
        let settings = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(
            settings.upstream.to_string(),
            "http://gw:***@127.0.0.1:9000/api"
        );
        for shown in [
            settings.to_string(),
            format!("{settings:?}"),
            format!("{:?}", settings.gateway().unwrap()),
        ] {
            assert!(
                !shown.contains("pa%40ss") && !shown.contains("pa@ss"),
                "{shown}"
            );
        }
        // "gw:pa@ss" in base64.
        assert_eq!(
            settings.upstream.basic_auth().unwrap(),
            "Basic Z3c6cGFAc3M="
        );
        // A config file written out keeps it, like the store's password.
        assert!(settings.to_toml().contains("gw:pa%40ss@"));
        assert_eq!(
            from_file(&GivenSettings::default(), &settings.to_toml()).unwrap(),
            settings
        );
        given.upstream = Some("ftp://gw:s3cret@127.0.0.1:9000".into());
        let refused = error(&given);
        assert!(
            refused.contains("gw:***@") && !refused.contains("s3cret"),
            "{refused}"
        );
    }

    #[test]
    fn sizes_and_durations_read_as_people_write_them() {
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1 mb").unwrap(), 1_000_000);
        for bad in ["", "MiB", "1.5MiB", "12 parsecs", "0", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        let error = parse_duration("sixty").unwrap_err().to_string();
        assert!(error.contains("such as 300ms"), "{error}");
        assert!(parse_duration("0s").is_err());
    }
}

#[cfg(test)]
mod allow_hosts_tests {
    use super::{GatewaySettings, GivenSettings, SettingsFile};

    fn resolve(given: &GivenSettings, text: &str) -> Result<GatewaySettings, String> {
        let file = SettingsFile::new("idem.toml", text);
        GatewaySettings::resolve(given, Some(file)).map_err(|e| e.to_string())
    }

    #[test]
    fn allowed_hosts_come_from_the_flag_else_the_file() {
        let upstream = "upstream = \"http://127.0.0.1:9000\"\n";
        let none = resolve(&GivenSettings::default(), upstream).unwrap();
        assert!(!none.allow_hosts.is_extended());
        assert!(!none.to_toml().contains("allow_hosts"));

        let text = format!("{upstream}allow_hosts = [\"console.internal\", \"*.ops.example\"]\n");
        let filed = resolve(&GivenSettings::default(), &text).unwrap();
        assert!(filed.allow_hosts.admits("console.internal:9090"));
        assert!(filed.allow_hosts.admits("a.ops.example"));
        assert!(!filed.allow_hosts.admits("evil.example"));
        let again = resolve(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again.allow_hosts, filed.allow_hosts);

        let flagged = GivenSettings {
            allow_hosts: Some("admin.example,10.0.0.5".into()),
            ..GivenSettings::default()
        };
        let flagged = resolve(&flagged, &text).unwrap();
        assert!(flagged.allow_hosts.admits("admin.example"));
        assert!(
            !flagged.allow_hosts.admits("console.internal"),
            "the flag wins"
        );

        let error = resolve(
            &GivenSettings::default(),
            &format!("{upstream}allow_hosts = \"*\"\n"),
        )
        .unwrap_err();
        assert!(error.contains("`allow_hosts` in idem.toml"), "{error}");
        let bad = GivenSettings {
            allow_hosts: Some("host:9090".into()),
            ..GivenSettings::default()
        };
        let error = resolve(&bad, upstream).unwrap_err();
        assert!(
            error.contains("--allow-host") && error.contains("port"),
            "{error}"
        );
    }
}
