//! [`GrpcIdempotencyConfig`]: which methods are protected, where the key is,
//! how large a request message may be, the lease the claims are renewed by,
//! and what each status code a service answers means for its key.

use std::collections::BTreeSet;
use std::time::Duration;

use http::HeaderName;
use idem_core::DEFAULT_LEASE;
use idem_http::Verdict;
use tonic::Code;

use crate::GrpcStatusPolicy;

/// The metadata entry the key is read from unless configured otherwise.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The largest request message read by default: 4 MiB, tonic's own default
/// decoding limit.
pub const DEFAULT_MESSAGE_LIMIT: usize = 4 * 1024 * 1024;

/// The layer's settings.
///
/// Only the methods named with [`unary`](Self::unary) are protected; every
/// other call (streaming calls, and unary calls not named) passes through
/// untouched, key or not. The generated code does not say at run time which
/// methods stream, and a streaming call cannot be told from its first bytes
/// (a server-streaming call sends one message, like a unary one), so the rule
/// is an explicit list.
///
/// ```
/// use std::time::Duration;
/// use idem_grpc::GrpcIdempotencyConfig;
///
/// let config = GrpcIdempotencyConfig::default()
///     .unary("/payments.v1.Payments/Charge")
///     .require_key(true)
///     .lease(Duration::from_secs(30));
/// assert!(config.protects("/payments.v1.Payments/Charge"));
/// assert!(!config.protects("/payments.v1.Payments/ListCharges"));
/// ```
#[derive(Debug, Clone)]
pub struct GrpcIdempotencyConfig {
    pub(crate) key_metadata: HeaderName,
    pub(crate) unary: BTreeSet<String>,
    pub(crate) require_key: bool,
    pub(crate) message_limit: usize,
    pub(crate) lease: Duration,
    pub(crate) principal: Option<HeaderName>,
    pub(crate) on_code: GrpcStatusPolicy,
}

impl Default for GrpcIdempotencyConfig {
    fn default() -> Self {
        Self {
            key_metadata: IDEMPOTENCY_KEY,
            unary: BTreeSet::new(),
            require_key: false,
            message_limit: DEFAULT_MESSAGE_LIMIT,
            lease: DEFAULT_LEASE,
            principal: Some(http::header::AUTHORIZATION),
            on_code: GrpcStatusPolicy::standard(),
        }
    }
}

impl GrpcIdempotencyConfig {
    /// Protects the unary method at `path` (`/package.Service/Method`).
    pub fn unary(mut self, path: impl Into<String>) -> Self {
        self.unary.insert(path.into());
        self
    }

    /// Protects each of these unary methods.
    pub fn unary_methods<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.unary.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Reads the key from this metadata entry instead of `idempotency-key`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid ASCII metadata name (lowercase, no `-bin`
    /// suffix is meant here).
    pub fn key_metadata(mut self, name: &str) -> Self {
        self.key_metadata = HeaderName::try_from(name).expect("a valid metadata name");
        self
    }

    /// Whether a protected method without a key is refused
    /// (`INVALID_ARGUMENT`) instead of running unprotected. Off by default.
    pub fn require_key(mut self, required: bool) -> Self {
        self.require_key = required;
        self
    }

    /// The largest request message read, in bytes; a larger one is refused
    /// with `RESOURCE_EXHAUSTED`.
    pub fn message_limit(mut self, bytes: usize) -> Self {
        self.message_limit = bytes;
        self
    }

    /// The store's lease: the layer renews a claim every third of it while the
    /// service works. Open the store with the same lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Scopes keys by this metadata entry (a tenant, an API key) instead of
    /// `authorization`: its value is hashed into the record's scope (never
    /// stored), so two callers sending the same key get two calls, and
    /// neither is ever replayed the other's answer.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid ASCII metadata name.
    pub fn principal_metadata(mut self, name: &str) -> Self {
        self.principal = Some(HeaderName::try_from(name).expect("a valid metadata name"));
        self
    }

    /// Scopes keys by the method alone: every caller shares one key space.
    pub fn without_principal(mut self) -> Self {
        self.principal = None;
        self
    }

    /// What an answer with status `code` means for its key, instead of the
    /// default ([`GrpcStatusPolicy`]'s table).
    ///
    /// ```
    /// use idem_grpc::GrpcIdempotencyConfig;
    /// use idem_http::Verdict;
    /// use tonic::Code;
    ///
    /// // This service answers INTERNAL only before it has written anything.
    /// let config = GrpcIdempotencyConfig::default().on_code(Code::Internal, Verdict::Release);
    /// assert_eq!(config.status_policy().verdict(Some(Code::Internal), true), Verdict::Release);
    /// ```
    pub fn on_code(mut self, code: Code, verdict: Verdict) -> Self {
        self.on_code = self.on_code.on(code, verdict);
        self
    }

    /// Every code's verdict from `policy` (parsed from text such as
    /// `internal=store,unavailable=unknown`).
    pub fn on_codes(mut self, policy: GrpcStatusPolicy) -> Self {
        self.on_code = policy;
        self
    }

    /// What each status code means for its key.
    pub fn status_policy(&self) -> &GrpcStatusPolicy {
        &self.on_code
    }

    /// The record's scope for a call to `path` with these headers:
    /// `grpc:{principal}:{path}`, the principal a hash of the configured
    /// metadata entry (`anon` without one), the path hashed if the scope
    /// would be too long.
    pub(crate) fn scope(&self, headers: &http::HeaderMap, path: &str) -> idem_core::Scope {
        let principal = idem_http::principal_of(headers, self.principal.as_ref());
        idem_core::Scope::new(format!("grpc:{principal}:{path}")).unwrap_or_else(|_| {
            let hashed = &idem_core::Fingerprint::of_bytes(path.as_bytes()).to_hex()[..32];
            idem_core::Scope::new(format!("grpc:{principal}:#{hashed}"))
                .expect("a principal and a hex hash make a valid scope")
        })
    }

    /// Whether calls to `path` are protected.
    pub fn protects(&self, path: &str) -> bool {
        self.unary.contains(path)
    }
}
