//! [`GatewaySettings::resolve`]: every setting from the flags, the file and
//! the defaults, one small function per group — the upstream, the store, the
//! protocol, the listener, keyed gRPC calls, the fingerprint — and the
//! checks that span groups.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Method};
use idem::{FingerprintRule, StoreLocation};
use idem_http::{
    Concurrent, DEFAULT_BODY_LIMIT, DEFAULT_WAITERS, DEFAULT_WAITERS_PER_KEY, Mode, ReplayCache,
    StatusPolicy, WaiterCaps,
};

use super::file::{Found, Sources, pick};
use super::parse::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_RUNTIME, parse_concurrent, parse_duration, parse_grpc_methods,
    parse_grpc_probe, parse_lease, parse_limit, parse_methods, parse_routes, parse_size,
    parse_waiters, parse_workers,
};
use super::{
    DEFAULT_LISTEN, DEFAULT_SPOOL, DEFAULT_STORE, GatewaySettings, GivenSettings, SettingsError,
    SettingsFile,
};
use crate::admin::AllowedHosts;
use crate::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT, ListenerTls, Probe, Runtime, TLS_SUBJECT,
    TLS_SUBJECT_HEADER, Upstream, UpstreamTls,
};

impl GatewaySettings {
    /// Resolves every setting from what the command line gave, the config
    /// file if there is one, and the defaults.
    pub fn resolve(
        given: &GivenSettings,
        file: Option<SettingsFile<'_>>,
    ) -> Result<Self, SettingsError> {
        let sources = Sources::new(given, file)?;
        let upstream = UpstreamGroup::resolve(&sources)?;
        let store = StoreGroup::resolve(&sources)?;
        let protocol = ProtocolGroup::resolve(&sources)?;
        let listener = ListenerGroup::resolve(&sources)?;
        let grpc = GrpcGroup::resolve(&sources)?;
        let fingerprint = fingerprint_rule(&sources)?;
        if protocol.principal_tls_subject
            && listener
                .tls
                .as_ref()
                .is_none_or(|tls| tls.client_ca.is_none())
        {
            return Err(SettingsError::new(
                "--principal-header tls-subject scopes keys by the client certificate, so it needs client certificates: give --tls-cert, --tls-key and --tls-client-ca",
            ));
        }
        Ok(Self {
            upstream: upstream.upstream,
            upstream_timeout: upstream.timeout,
            probe: upstream.probe,
            on_status: upstream.on_status,
            upstream_tls: upstream.tls,
            store: store.store,
            lease: store.lease,
            retention: store.retention,
            tombstones: store.tombstones,
            replay_cache: store.replay_cache,
            sweep_every: store.sweep_every,
            spool: store.spool,
            mode: protocol.mode,
            require_key: protocol.require_key,
            methods: protocol.methods,
            max_body: protocol.max_body,
            concurrent: protocol.concurrent,
            waiter_caps: protocol.waiter_caps,
            principal_header: protocol.principal_header,
            principal_tls_subject: protocol.principal_tls_subject,
            listen: listener.listen,
            admin_listen: listener.admin_listen,
            body_timeout: listener.body_timeout,
            max_in_flight: listener.max_in_flight,
            runtime: listener.runtime,
            workers: listener.workers,
            routes: listener.routes,
            tls: listener.tls,
            admin_token_file: listener.admin_token_file,
            allow_hosts: listener.allow_hosts,
            grpc_unary: grpc.unary,
            grpc_probe: grpc.probe,
            on_grpc_status: grpc.on_status,
            fingerprint,
        })
    }
}

/// Where requests go, how long their answers are awaited, what the answers
/// mean, and what is asked after an unknown one.
struct UpstreamGroup {
    upstream: Upstream,
    timeout: Duration,
    probe: Option<Probe>,
    on_status: StatusPolicy,
    tls: UpstreamTls,
}

impl UpstreamGroup {
    fn resolve(sources: &Sources<'_>) -> Result<Self, SettingsError> {
        let Some(found) = pick!(sources, upstream) else {
            return Err(SettingsError::new(
                "no upstream to forward to: give --upstream http://HOST:PORT (or IDEM_UPSTREAM, or `upstream` in the --config file)",
            ));
        };
        let upstream: Upstream = found
            .value
            .parse()
            .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?;
        let tls = UpstreamTls {
            ca: pem_path(pick!(sources, upstream_ca))?,
            cert: pem_path(pick!(sources, upstream_cert))?,
            key: pem_path(pick!(sources, upstream_key))?,
        };
        match (&tls.cert, &tls.key) {
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
        if !tls.is_default() && !upstream.is_https() {
            return Err(SettingsError::new(format!(
                "--upstream-ca, --upstream-cert and --upstream-key are for an https:// upstream, but the upstream is {upstream}"
            )));
        }
        let probe = match unless_off(pick!(sources, probe)) {
            None => None,
            Some(found) => Some(
                found
                    .value
                    .parse::<Probe>()
                    .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?,
            ),
        };
        let on_status = match pick!(sources, on_status) {
            None => StatusPolicy::standard(),
            Some(found) => found
                .value
                .parse::<StatusPolicy>()
                .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?,
        };
        Ok(Self {
            upstream,
            timeout: duration_or(pick!(sources, upstream_timeout), DEFAULT_UPSTREAM_TIMEOUT)?,
            probe,
            on_status,
            tls,
        })
    }
}

/// The store, and how long what it holds is kept.
struct StoreGroup {
    store: StoreLocation,
    lease: Duration,
    retention: Duration,
    tombstones: Option<Duration>,
    replay_cache: ReplayCache,
    sweep_every: Option<Duration>,
    spool: Option<PathBuf>,
}

impl StoreGroup {
    fn resolve(sources: &Sources<'_>) -> Result<Self, SettingsError> {
        let found = pick!(sources, store).unwrap_or(Found {
            value: DEFAULT_STORE.to_owned(),
            origin: "the default store".to_owned(),
        });
        let store: StoreLocation = found
            .value
            .parse()
            .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?;
        let lease = match pick!(sources, lease) {
            None => idem::DEFAULT_LEASE,
            Some(found) => parse_lease(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let retention = duration_or(pick!(sources, retention), idem::DEFAULT_RETENTION)?;
        if retention <= lease {
            return Err(SettingsError::new(format!(
                "the retention ({}) must be longer than the lease ({}): answers are kept for the retention, claims are protected for the lease",
                humantime::format_duration(retention),
                humantime::format_duration(lease)
            )));
        }
        let replay_cache = match pick!(sources, replay_cache) {
            None => ReplayCache::default(),
            Some(found) if is_off(&found) => ReplayCache::off(),
            Some(found) => {
                ReplayCache::bytes(parse_size(&found.value).map_err(|e| e.of(&found.origin))? as u64)
            }
        };
        let sweep_every = match pick!(sources, sweep_every) {
            None => Some(idem::sweeper::DEFAULT_SWEEP_INTERVAL),
            found => optional_duration(found)?,
        };
        let spool = match pick!(sources, spool) {
            None => Some(default_spool(&store)),
            Some(found) if is_off(&found) => None,
            Some(found) if found.value.trim().is_empty() => {
                return Err(SettingsError::new(format!(
                    "invalid {}: no path given; write the path of a local file, such as /var/lib/idem/idem.spool, or off",
                    found.origin
                )));
            }
            Some(found) => Some(PathBuf::from(found.value)),
        };
        Ok(Self {
            store,
            lease,
            retention,
            tombstones: optional_duration(pick!(sources, tombstones))?,
            replay_cache,
            sweep_every,
            spool,
        })
    }
}

/// How keyed requests are read, scoped and refused.
struct ProtocolGroup {
    mode: Mode,
    require_key: bool,
    methods: Vec<Method>,
    max_body: usize,
    concurrent: Concurrent,
    waiter_caps: WaiterCaps,
    principal_header: Option<HeaderName>,
    principal_tls_subject: bool,
}

impl ProtocolGroup {
    fn resolve(sources: &Sources<'_>) -> Result<Self, SettingsError> {
        let mode = match pick!(sources, mode) {
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
        let methods = match pick!(sources, methods) {
            None => vec![Method::POST, Method::PATCH],
            Some(found) => parse_methods(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let max_body = match pick!(sources, max_body) {
            None => DEFAULT_BODY_LIMIT,
            Some(found) => parse_size(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let concurrent = match pick!(sources, concurrent) {
            None => Concurrent::Reject,
            Some(found) => parse_concurrent(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let waiters = |found: Option<Found>, default| match found {
            None => Ok(default),
            Some(found) => parse_waiters(&found.value).map_err(|e| e.of(&found.origin)),
        };
        let waiter_caps = WaiterCaps {
            per_key: waiters(pick!(sources, max_waiters_per_key), DEFAULT_WAITERS_PER_KEY)?,
            total: waiters(pick!(sources, max_waiters), DEFAULT_WAITERS)?,
        };
        let (principal_header, principal_tls_subject) =
            principal(pick!(sources, principal_header))?;
        Ok(Self {
            mode,
            require_key: sources.require_key().unwrap_or(false),
            methods,
            max_body,
            concurrent,
            waiter_caps,
            principal_header,
            principal_tls_subject,
        })
    }
}

/// The header that scopes keys by caller (`authorization` by default), and
/// whether it is the client certificate's subject instead.
fn principal(found: Option<Found>) -> Result<(Option<HeaderName>, bool), SettingsError> {
    Ok(match found {
        None => (Some(http::header::AUTHORIZATION), false),
        Some(found) if found.value.eq_ignore_ascii_case("none") => (None, false),
        Some(found) if found.value.eq_ignore_ascii_case(TLS_SUBJECT) => {
            (Some(HeaderName::from_static(TLS_SUBJECT_HEADER)), true)
        }
        Some(found) => (
            Some(HeaderName::try_from(found.value.as_str()).map_err(|_| {
                SettingsError::new(format!(
                    "invalid {}: {:?} is not a header name; write one such as authorization or x-tenant-id, or none",
                    found.origin, found.value
                ))
            })?),
            false,
        ),
    })
}

/// Where the gateway and its admin listener serve, and what they accept.
struct ListenerGroup {
    listen: SocketAddr,
    admin_listen: Option<SocketAddr>,
    body_timeout: Duration,
    max_in_flight: Option<usize>,
    runtime: Runtime,
    workers: Option<NonZeroUsize>,
    routes: Vec<String>,
    tls: Option<ListenerTls>,
    admin_token_file: Option<PathBuf>,
    allow_hosts: AllowedHosts,
}

impl ListenerGroup {
    fn resolve(sources: &Sources<'_>) -> Result<Self, SettingsError> {
        let listen = match pick!(sources, listen) {
            None => DEFAULT_LISTEN.parse().expect("a valid default"),
            Some(found) => address(&found)?,
        };
        let admin_listen = pick!(sources, admin_listen)
            .map(|found| address(&found))
            .transpose()?;
        let max_in_flight = match pick!(sources, max_in_flight) {
            None => Some(DEFAULT_MAX_IN_FLIGHT),
            Some(found) => parse_limit(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let runtime = match pick!(sources, runtime) {
            None => DEFAULT_RUNTIME,
            Some(found) => found
                .value
                .parse()
                .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?,
        };
        let workers = match pick!(sources, workers) {
            None => None,
            Some(found) if runtime == Runtime::Shared => {
                return Err(SettingsError::new(format!(
                    "{} sets how many runtimes serve one per core, but the runtime is shared: give --runtime per-core too, or leave the workers out",
                    found.origin
                )));
            }
            Some(found) => Some(parse_workers(&found.value).map_err(|e| e.of(&found.origin))?),
        };
        let routes = match pick!(sources, routes) {
            None => Vec::new(),
            Some(found) => parse_routes(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let allow_hosts = match pick!(sources, allow_hosts listed) {
            None => AllowedHosts::loopback(),
            Some(found) => AllowedHosts::parse([found.value.as_str()])
                .map_err(|e| SettingsError::new(format!("invalid {}: {e}", found.origin)))?,
        };
        Ok(Self {
            listen,
            admin_listen,
            body_timeout: duration_or(pick!(sources, body_timeout), DEFAULT_BODY_TIMEOUT)?,
            max_in_flight,
            runtime,
            workers,
            routes,
            tls: listener_tls(sources)?,
            admin_token_file: pem_path(pick!(sources, admin_token_file))?,
            allow_hosts,
        })
    }
}

/// The listener's certificate, key and client CA: a pair or nothing.
fn listener_tls(sources: &Sources<'_>) -> Result<Option<ListenerTls>, SettingsError> {
    let cert = pem_path(pick!(sources, tls_cert))?;
    let key = pem_path(pick!(sources, tls_key))?;
    let client_ca = pem_path(pick!(sources, tls_client_ca))?;
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(ListenerTls {
            cert,
            key,
            client_ca,
        })),
        (None, None) if client_ca.is_some() => Err(SettingsError::new(
            "--tls-client-ca needs a TLS listener: give --tls-cert and --tls-key too",
        )),
        (None, None) => Ok(None),
        (Some(_), None) => Err(SettingsError::new(
            "--tls-cert was given without --tls-key: give both (the listener's certificate and its key), or neither for plain HTTP",
        )),
        (None, Some(_)) => Err(SettingsError::new(
            "--tls-key was given without --tls-cert: give both (the listener's certificate and its key), or neither for plain HTTP",
        )),
    }
}

/// Keyed unary gRPC calls: which methods, what is asked after an unknown
/// outcome, what their status codes mean.
struct GrpcGroup {
    unary: Vec<String>,
    probe: Option<String>,
    on_status: Option<String>,
}

impl GrpcGroup {
    fn resolve(sources: &Sources<'_>) -> Result<Self, SettingsError> {
        let unary = match pick!(sources, grpc_unary) {
            None => Vec::new(),
            Some(found) => parse_grpc_methods(&found.value).map_err(|e| e.of(&found.origin))?,
        };
        let needs_methods = |found: &Found, what: &str| {
            SettingsError::new(format!(
                "{} {what}, and there are none: give the unary methods with --grpc-unary too",
                found.origin
            ))
        };
        let probe = match unless_off(pick!(sources, grpc_probe)) {
            None => None,
            Some(found) => {
                let probe = parse_grpc_probe(&found.value).map_err(|e| e.of(&found.origin))?;
                if unary.is_empty() {
                    return Err(needs_methods(&found, "asks about keyed gRPC calls"));
                }
                Some(probe)
            }
        };
        let on_status = match pick!(sources, on_grpc_status) {
            None => None,
            Some(found) => {
                if unary.is_empty() {
                    return Err(needs_methods(
                        &found,
                        "says what keyed gRPC calls' codes mean",
                    ));
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
        Ok(Self {
            unary,
            probe,
            on_status,
        })
    }
}

/// The fingerprint rule from `--fingerprint`, `--fingerprint-ignore` and
/// `--fingerprint-header` (or their variables, or the file's keys).
fn fingerprint_rule(sources: &Sources<'_>) -> Result<FingerprintRule, SettingsError> {
    let invalid = |found: &Found, error: idem::FingerprintRuleError| {
        SettingsError::new(format!("invalid {}: {error}", found.origin))
    };
    let mut rule = FingerprintRule::default();
    match (
        pick!(sources, fingerprint),
        pick!(sources, fingerprint_ignore),
    ) {
        (Some(select), Some(ignore)) => {
            return Err(SettingsError::new(format!(
                "{} selects the fields a fingerprint covers and {} leaves some out: give one of the two (the selection, such as json:/amount,/currency, or the fields to leave out, such as json:/sent_at)",
                select.origin, ignore.origin
            )));
        }
        (Some(found), None) => {
            rule = rule.select(&found.value).map_err(|e| invalid(&found, e))?;
        }
        (None, Some(found)) => {
            rule = rule.ignore(&found.value).map_err(|e| invalid(&found, e))?;
        }
        (None, None) => {}
    }
    if let Some(found) = pick!(sources, fingerprint_header listed) {
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
            rule = rule.header(name).map_err(|e| invalid(&found, e))?;
        }
    }
    Ok(rule)
}

/// Whether a setting says `off`.
fn is_off(found: &Found) -> bool {
    found.value.trim().eq_ignore_ascii_case("off")
}

/// The setting, unless it says `off`.
fn unless_off(found: Option<Found>) -> Option<Found> {
    found.filter(|found| !is_off(found))
}

/// A duration, `default` when not given.
fn duration_or(found: Option<Found>, default: Duration) -> Result<Duration, SettingsError> {
    match found {
        None => Ok(default),
        Some(found) => parse_duration(&found.value).map_err(|e| e.of(&found.origin)),
    }
}

/// A duration, or `None` when not given or `off`.
fn optional_duration(found: Option<Found>) -> Result<Option<Duration>, SettingsError> {
    unless_off(found)
        .map(|found| parse_duration(&found.value).map_err(|e| e.of(&found.origin)))
        .transpose()
}

/// The path of a PEM (or token) file; an empty one is refused.
fn pem_path(found: Option<Found>) -> Result<Option<PathBuf>, SettingsError> {
    match found {
        None => Ok(None),
        Some(found) if found.value.trim().is_empty() => Err(SettingsError::new(format!(
            "invalid {}: no path given; write the path of a PEM file",
            found.origin
        ))),
        Some(found) => Ok(Some(PathBuf::from(found.value))),
    }
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
        StoreLocation::Postgres(_) | StoreLocation::Redis(_) | StoreLocation::DynamoDb(_) => {
            PathBuf::from(DEFAULT_SPOOL)
        }
    }
}

fn address(found: &Found) -> Result<SocketAddr, SettingsError> {
    found.value.parse().map_err(|_| {
        SettingsError::new(format!(
            "invalid {}: {:?} is not an address; write IP:PORT, such as 127.0.0.1:8080 or 0.0.0.0:8080",
            found.origin, found.value
        ))
    })
}
