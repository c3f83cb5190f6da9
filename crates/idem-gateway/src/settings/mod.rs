//! The settings of `idem serve`, from four places in this order: a flag, its
//! `IDEM_*` variable (the command line reads both into [`GivenSettings`]), the
//! TOML config file (read into a [`GivenSettings`] too), the default. Every
//! bad value is reported with where it came from and what to write.
//!
//! - `given`: [`GivenSettings`], each setting declared once (flag,
//!   variable, file key, help);
//! - `file`: the config file, and picking each setting from the flags or
//!   the file with where it came from;
//! - `resolve`: [`GatewaySettings::resolve`], one small function per group
//!   (upstream, store, protocol, listener, gRPC, fingerprint);
//! - `parse`: reading sizes, durations, lists and limits as people write
//!   them;
//! - `write`: the settings written back out, as a config file and as the
//!   start-up line.
//!
//! ```
//! use idem_gateway::{GatewaySettings, GivenSettings, SettingsFile};
//! let file = SettingsFile::new("idem.toml", "upstream = \"http://127.0.0.1:9000\"\nlease = \"30s\"\n");
//! let given = GivenSettings { lease: Some("10s".into()), ..GivenSettings::default() };
//! let settings = GatewaySettings::resolve(&given, Some(file)).unwrap();
//! assert_eq!(settings.lease, std::time::Duration::from_secs(10));
//! assert_eq!(settings.upstream.to_string(), "http://127.0.0.1:9000");
//! ```

mod file;
mod given;
mod parse;
mod resolve;
#[cfg(test)]
mod tests;
mod write;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Method};
use idem::{FingerprintRule, StoreLocation};
use idem_http::{
    Concurrent, IdempotencyConfig, KeyRequirement, Mode, ReplayCache, StatusPolicy, WaiterCaps,
};

use crate::admin::AllowedHosts;
use crate::{GatewayConfig, ListenerTls, Probe, Runtime, TlsError, Upstream, UpstreamTls};

pub use file::SettingsFile;
pub use given::GivenSettings;
pub use parse::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_RUNTIME, MAX_CONCURRENT_WAIT, MAX_IN_FLIGHT, MIN_LEASE,
    parse_concurrent, parse_duration, parse_grpc_methods, parse_lease, parse_limit, parse_methods,
    parse_routes, parse_size, parse_waiters,
};

/// Where the gateway listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The store the gateway opens when none is given: the embedded one.
pub const DEFAULT_STORE: &str = "sqlite://idem.db";

/// The answer spool when the store is not a local file and none is given.
pub(crate) const DEFAULT_SPOOL: &str = "idem.spool";

/// A setting that cannot be used; the message says where it came from and
/// what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

impl SettingsError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// The same error, said of the setting found at `origin`.
    pub(crate) fn of(self, origin: &str) -> Self {
        Self(format!("invalid {origin}: {}", self.0))
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
    /// Where connections are served: one runtime per core (by default,
    /// [`DEFAULT_RUNTIME`]), or the process's shared runtime.
    pub runtime: Runtime,
    /// How many runtimes serve with [`Runtime::PerCore`]; `None`: one per
    /// core.
    pub workers: Option<NonZeroUsize>,
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

impl GatewaySettings {
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
        config = config.runtime(self.runtime);
        if let Some(workers) = self.workers {
            config = config.workers(workers);
        }
        Ok(match &self.probe {
            Some(probe) => config.probe(probe.clone()),
            None => config,
        })
    }
}
