//! [`IdempotencyConfig`]: everything the layer and the atomic handlers decide
//! by, and its defaults.

use std::collections::BTreeSet;
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{HeaderName, Method};
use idem_core::{DEFAULT_LEASE, DEFAULT_RETENTION, FingerprintRule, Settings};
use idem_trace::KeyInSpans;

/// Which vocabulary refusals are written in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The IETF draft: `application/problem+json` bodies (RFC 9457), 422 for a
    /// reused key.
    #[default]
    Ietf,
    /// Stripe-compatible: `{"error":{"type":"idempotency_error","message":...}}`,
    /// 400 for a reused key.
    Stripe,
}

/// Where a request without a key is refused. Only requests whose method is
/// one of [`IdempotencyConfig::methods`] are ever refused for lack of a key;
/// a request that carries a key is deduplicated whatever its unsafe method.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyRequirement {
    /// A key is optional everywhere: requests without one pass through
    /// untouched (the default).
    #[default]
    Optional,
    /// Every request whose method is one of the configured methods must carry
    /// one.
    Always,
    /// Only these routes (matched against the route template, else the path)
    /// require a key, on the configured methods.
    Routes(BTreeSet<String>),
}

impl KeyRequirement {
    /// Whether a request to `route` must carry a key.
    pub fn applies_to(&self, route: &str) -> bool {
        match self {
            Self::Optional => false,
            Self::Always => true,
            Self::Routes(routes) => routes.contains(route),
        }
    }
}

/// What a concurrent duplicate gets: a request whose key is claimed by an
/// original that is still running.
///
/// ```
/// use std::time::Duration;
/// use idem_http::{Concurrent, IdempotencyConfig};
///
/// let config = IdempotencyConfig::default().concurrent(Concurrent::Wait(Duration::from_secs(5)));
/// assert_eq!(config.concurrent_duplicates(), Concurrent::Wait(Duration::from_secs(5)));
/// assert_eq!(IdempotencyConfig::default().concurrent_duplicates(), Concurrent::Reject);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Concurrent {
    /// 409 with `Retry-After` at once; the client polls (the default).
    #[default]
    Reject,
    /// Waits up to this long for the original's answer: the replay as soon
    /// as it is stored, or 409 with `Retry-After` when the wait runs out or
    /// the original ends without a stored answer. Bounded by
    /// [`WaiterCaps`]: past them the 409 comes at once.
    Wait(Duration),
}

/// How many concurrent duplicates may wait at once ([`Concurrent::Wait`]),
/// on one key and in all, in one process; past either, a duplicate is
/// answered 409 at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaiterCaps {
    /// Waiters on one key (default [`DEFAULT_WAITERS_PER_KEY`]).
    pub per_key: usize,
    /// Waiters in all (default [`DEFAULT_WAITERS`]).
    pub total: usize,
}

/// The default cap on waiters on one key: 64.
pub const DEFAULT_WAITERS_PER_KEY: usize = 64;

/// The default cap on waiters in all: 1024.
pub const DEFAULT_WAITERS: usize = 1024;

impl Default for WaiterCaps {
    fn default() -> Self {
        Self {
            per_key: DEFAULT_WAITERS_PER_KEY,
            total: DEFAULT_WAITERS,
        }
    }
}

/// The default body limit: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// How the layer and the atomic handlers treat keyed requests.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderName, Method};
/// use idem_http::{IdempotencyConfig, KeyRequirement, Mode};
///
/// let config = IdempotencyConfig::default()
///     .mode(Mode::Stripe)
///     .methods([Method::POST])
///     .require_key_on(["/payments"])
///     .principal_header(HeaderName::from_static("x-tenant-id"))
///     .body_limit(64 * 1024)
///     .lease(Duration::from_secs(30));
/// assert!(config.key_requirement().applies_to("/payments"));
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    pub(crate) mode: Mode,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: KeyRequirement,
    pub(crate) principal_header: Option<HeaderName>,
    pub(crate) body_limit: usize,
    pub(crate) on_status: super::StatusPolicy,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) tombstones: Option<Duration>,
    pub(crate) key_in_spans: KeyInSpans,
    pub(crate) fingerprint: FingerprintRule,
    pub(crate) concurrent: Concurrent,
    pub(crate) waiter_caps: WaiterCaps,
    pub(crate) replay_cache: super::ReplayCache,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Ietf,
            methods: vec![Method::POST, Method::PATCH],
            require_key: KeyRequirement::Optional,
            principal_header: Some(AUTHORIZATION),
            body_limit: DEFAULT_BODY_LIMIT,
            on_status: super::StatusPolicy::standard(),
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            tombstones: None,
            key_in_spans: KeyInSpans::Raw,
            fingerprint: FingerprintRule::default(),
            concurrent: Concurrent::Reject,
            waiter_caps: WaiterCaps::default(),
            replay_cache: super::ReplayCache::default(),
        }
    }
}

impl IdempotencyConfig {
    /// IETF (default) or Stripe vocabulary.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The methods on which a missing key is refused where
    /// [`require_key`](Self::require_key) says so (default POST and PATCH).
    ///
    /// This list does not decide what is deduplicated: a request that carries
    /// a key is deduplicated whatever its method, as long as the method is
    /// not safe (POST, PUT, PATCH, DELETE and any other method with effects).
    /// A PUT or DELETE handler is idempotent only if its code makes it so; the
    /// key is the client's word that a retry is the same operation. Requests
    /// with a safe method (GET, HEAD, OPTIONS, TRACE) pass through untouched,
    /// key or not; the answer then carries `Idempotency-Key-Ignored: true`.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Where a missing key is refused (default: nowhere).
    pub fn require_key(mut self, requirement: KeyRequirement) -> Self {
        self.require_key = requirement;
        self
    }

    /// Requires a key on these routes (route templates such as
    /// `/accounts/{id}`, or paths when the layer runs outside a router).
    pub fn require_key_on<R: Into<String>>(self, routes: impl IntoIterator<Item = R>) -> Self {
        self.require_key(KeyRequirement::Routes(
            routes.into_iter().map(Into::into).collect(),
        ))
    }

    /// The header that names the caller (default `Authorization`). Its value is
    /// hashed into the scope and never stored. Use a stable tenant or account
    /// header when credentials rotate between retries.
    pub fn principal_header(mut self, header: HeaderName) -> Self {
        self.principal_header = Some(header);
        self
    }

    /// Scopes keys by method and route only: every caller shares one key
    /// space. Only for services with a single client.
    pub fn without_principal(mut self) -> Self {
        self.principal_header = None;
        self
    }

    /// The largest keyed request body read (default 1 MiB); larger ones get 413.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// What each answer status means for its key: stored and replayed,
    /// released for the next retry, or an unknown outcome that keeps the
    /// claim (default [`StatusPolicy::standard`](super::StatusPolicy::standard)).
    pub fn on_status(mut self, policy: super::StatusPolicy) -> Self {
        self.on_status = policy;
        self
    }

    /// What each answer status means for its key.
    pub fn status_policy(&self) -> &super::StatusPolicy {
        &self.on_status
    }

    /// How long an in-flight claim is protected (default 60 s). The layer renews
    /// a claim every third of this while the service works on it, so give the
    /// store the same lease: [`store_settings`](Self::store_settings) has it
    /// for opening the store (`IdempotencyLayer::open` does so itself).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long records are kept: the dedupe window (default 7 days). Applied to
    /// the store opened with [`store_settings`](Self::store_settings) (as
    /// `IdempotencyLayer::open` does).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a key is still refused after its window ended (off by
    /// default): the store's sweep leaves a tombstone in place of each record,
    /// and a late retry gets 410 Gone with the date its key expired instead
    /// of running again. Applied to the store opened with
    /// [`store_settings`](Self::store_settings) (as `IdempotencyLayer::open`
    /// does).
    pub fn tombstones(mut self, grace: Option<Duration>) -> Self {
        self.tombstones = grace;
        self
    }

    /// Settled answers kept in memory, so replays cost no trip to the store
    /// (on by default: 64 MiB, each answer served for at most 5 s after it
    /// was cached, never past its record's expiry); `ReplayCache::off()` to
    /// read the store for every replay.
    pub fn replay_cache(mut self, cache: super::ReplayCache) -> Self {
        self.replay_cache = cache;
        self
    }

    /// How the key appears in the layer's `idempotency` span: as it is (the
    /// default) or hashed.
    pub fn key_in_spans(mut self, shown: KeyInSpans) -> Self {
        self.key_in_spans = shown;
        self
    }

    /// What a request's fingerprint covers besides its method, route and
    /// target: the whole body (the default), selected JSON fields or the body
    /// less some, and chosen headers. A retry whose covered parts differ is
    /// refused as key reuse; a record fingerprinted under another rule (the
    /// rule changed since) is replayed to its retry, logged and counted.
    ///
    /// ```
    /// use idem::FingerprintRule;
    /// use idem_http::IdempotencyConfig;
    ///
    /// let config = IdempotencyConfig::default().fingerprint(
    ///     FingerprintRule::default()
    ///         .select("json:/amount,/currency,/account")?
    ///         .header("content-type")?,
    /// );
    /// assert_eq!(
    ///     config.fingerprint_rule().to_string(),
    ///     "json:/account,/amount,/currency header:content-type"
    /// );
    /// # Ok::<(), idem::FingerprintRuleError>(())
    /// ```
    pub fn fingerprint(mut self, rule: FingerprintRule) -> Self {
        self.fingerprint = rule;
        self
    }

    /// What a request's fingerprint covers.
    pub fn fingerprint_rule(&self) -> &FingerprintRule {
        &self.fingerprint
    }

    /// What a concurrent duplicate gets (default [`Concurrent::Reject`]: 409
    /// at once).
    pub fn concurrent(mut self, concurrent: Concurrent) -> Self {
        self.concurrent = concurrent;
        self
    }

    /// How many concurrent duplicates may wait at once, per key and in all
    /// (each at least one); see [`WaiterCaps`].
    pub fn waiter_caps(mut self, caps: WaiterCaps) -> Self {
        self.waiter_caps = WaiterCaps {
            per_key: caps.per_key.max(1),
            total: caps.total.max(1),
        };
        self
    }

    /// What a concurrent duplicate gets.
    pub fn concurrent_duplicates(&self) -> Concurrent {
        self.concurrent
    }

    /// The caps on waiting duplicates.
    pub fn waiters(&self) -> WaiterCaps {
        self.waiter_caps
    }

    /// How long a claim holds its key before another request may take it over.
    pub fn lease_length(&self) -> Duration {
        self.lease
    }

    /// The header whose value names the principal a key belongs to; `None`:
    /// keys are not scoped by principal.
    pub fn principal(&self) -> Option<&HeaderName> {
        self.principal_header.as_ref()
    }

    /// The vocabulary of refusals.
    pub fn vocabulary(&self) -> Mode {
        self.mode
    }

    /// Where a missing key is refused.
    pub fn key_requirement(&self) -> &KeyRequirement {
        &self.require_key
    }

    /// Whether a request with `method` that carries a key is deduplicated:
    /// every method that is not safe (not GET, HEAD, OPTIONS or TRACE).
    pub fn accepts_key(&self, method: &Method) -> bool {
        !method.is_safe()
    }

    /// Whether a request with `method` to `route` is refused without a key:
    /// its method is one of [`methods`](Self::methods) and the
    /// [`KeyRequirement`] covers its route.
    pub fn requires_key(&self, method: &Method, route: &str) -> bool {
        self.methods.contains(method) && self.require_key.applies_to(route)
    }

    /// The methods on which a missing key may be refused.
    pub fn key_methods(&self) -> &[Method] {
        &self.methods
    }

    /// Lease and retention as store settings, for opening a store by hand:
    /// `SqliteStore::builder(path).settings(config.store_settings())`.
    pub fn store_settings(&self) -> Settings {
        Settings::default()
            .with_lease(self.lease)
            .with_retention(self.retention)
            .with_tombstones(self.tombstones)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = IdempotencyConfig::default();
        assert_eq!(config.mode, Mode::Ietf);
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(config.accepts_key(&method), "{method}");
        }
        let custom = Method::from_bytes(b"PURGE").unwrap();
        assert!(config.accepts_key(&custom));
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(!config.accepts_key(&method), "{method}");
        }
        assert_eq!(config.key_methods(), [Method::POST, Method::PATCH]);
        assert!(!config.require_key.applies_to("/anything"));
        assert_eq!(config.principal_header, Some(AUTHORIZATION));
        assert_eq!(config.body_limit, 1024 * 1024);
        assert_eq!(config.store_settings().lease, Duration::from_secs(60));
        assert_eq!(
            config.store_settings().retention,
            Duration::from_secs(7 * 24 * 3600)
        );
    }

    #[test]
    fn a_key_is_required_only_on_the_listed_methods_and_routes() {
        let config = IdempotencyConfig::default()
            .methods([Method::POST, Method::PUT])
            .require_key_on(["/payments"]);
        assert!(config.requires_key(&Method::POST, "/payments"));
        assert!(config.requires_key(&Method::PUT, "/payments"));
        assert!(!config.requires_key(&Method::DELETE, "/payments"));
        assert!(!config.requires_key(&Method::POST, "/orders"));
        // Listed or not, a keyed DELETE is deduplicated.
        assert!(config.accepts_key(&Method::DELETE));
    }
}
