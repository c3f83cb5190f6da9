//! [`GatewayConfig`]: where the upstream is and how long the gateway waits
//! for it and for its clients. What is keyed, stored and for how long is the
//! layer's [`IdempotencyConfig`](crate::IdempotencyConfig).
//!
//! An upstream URL may carry a user and password (`http://user:pass@host`):
//! they are sent as `Authorization: Basic` and never printed; the URL shows
//! them as `user:***`.

use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::uri::{Authority, PathAndQuery, Scheme, Uri};

use super::Probe;

/// How long the gateway waits for the upstream by default: 30 s.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client may take to send a request's head, and a keyed
/// request's whole body, by default: 30 s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest the gateway waits to open a connection to the upstream. A
/// connection that could not be opened carried nothing, so this failure is
/// told apart from a timeout after the request was sent.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The service the gateway forwards to: `http://HOST:PORT`,
/// `https://HOST:PORT`, or `h2c://HOST:PORT` for an upstream spoken to in
/// HTTP/2 without TLS (prior knowledge: a gRPC server, say), with an
/// optional base path that is put in front of every request path.
///
/// A user and password in the URL (`http://user:pass@HOST:PORT`, percent-
/// encoded as in any URL) are sent to the upstream as `Authorization: Basic`
/// on every request that carries no `Authorization` of its own. The password
/// is never shown: `Display` and `Debug` write it as `***`.
///
/// ```
/// use idem_gateway::Upstream;
///
/// let upstream: Upstream = "http://127.0.0.1:9000/api/".parse()?;
/// assert_eq!(upstream.to_string(), "http://127.0.0.1:9000/api");
/// let guarded: Upstream = "http://gateway:s3cret@127.0.0.1:9000".parse()?;
/// assert_eq!(guarded.to_string(), "http://gateway:***@127.0.0.1:9000");
/// let secure: Upstream = "https://api.example.com".parse()?;
/// assert!(secure.is_https());
/// let grpc: Upstream = "h2c://127.0.0.1:50051".parse()?;
/// assert!(grpc.is_http2());
/// assert!("ftp://example.com".parse::<Upstream>().is_err());
/// # Ok::<(), idem_gateway::UpstreamError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Upstream {
    scheme: Scheme,
    /// The host and port, without the user-info.
    authority: Authority,
    base_path: String,
    /// Spoken to in HTTP/2 with prior knowledge (`h2c://`).
    http2: bool,
    /// The user-info of the URL, if it had one.
    credentials: Option<Credentials>,
}

/// The user and password of an upstream URL, as written (percent-encoded),
/// and the `Authorization` value they make.
#[derive(Clone, PartialEq, Eq)]
struct Credentials {
    /// The user-info as written in the URL, for writing the URL back.
    written: String,
    /// The user name as written, for showing.
    user: String,
    /// `Basic base64(user:password)`, decoded from the percent-encoding.
    basic: HeaderValue,
}

impl Credentials {
    fn parse(written: &str) -> Option<Self> {
        let (user, password) = written.split_once(':').unwrap_or((written, ""));
        let mut plain = percent_decode(user)?;
        plain.push(b':');
        plain.extend(percent_decode(password)?);
        let mut basic = HeaderValue::try_from(format!("Basic {}", base64(&plain))).ok()?;
        basic.set_sensitive(true);
        Some(Self {
            written: written.to_owned(),
            user: user.to_owned(),
            basic,
        })
    }

    /// The user-info as shown: the user, and `***` for a password.
    fn shown(&self) -> String {
        if self.written.contains(':') {
            format!("{}:***", self.user)
        } else {
            self.user.clone()
        }
    }
}

/// The bytes a percent-encoded URL part stands for; `None` for a `%` not
/// followed by two hex digits.
fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    Some(decoded)
}

/// Standard base64 with padding (RFC 4648 §4), as Basic authentication
/// writes its credentials.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut encoded = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                encoded.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                encoded.push('=');
            }
        }
    }
    encoded
}

/// An upstream URL the gateway cannot forward to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// Not a URL at all.
    #[error(
        "upstream {url:?} is not a URL ({reason}): write http://HOST:PORT, https://HOST:PORT or h2c://HOST:PORT, optionally with a base path such as http://127.0.0.1:9000/api"
    )]
    NotAUrl {
        /// The text as given.
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// A scheme other than `http`, `https` and `h2c`.
    #[error(
        "upstream {url:?} uses {scheme}, but the gateway speaks HTTP or HTTPS to its upstream: write http://HOST:PORT, https://HOST:PORT, or h2c://HOST:PORT for HTTP/2 without TLS"
    )]
    Scheme {
        /// The text as given.
        url: String,
        /// The scheme found (or `none`).
        scheme: String,
    },
    /// A query string, which would be glued to every request.
    #[error(
        "upstream {url:?} has a query string: give only http(s)://HOST:PORT (or h2c://) and an optional base path"
    )]
    Query {
        /// The text as given.
        url: String,
    },
}

impl FromStr for Upstream {
    type Err = UpstreamError;

    fn from_str(given: &str) -> Result<Self, UpstreamError> {
        // Errors quote the URL without its password.
        let url = &idem::redact_url(given);
        let uri: Uri =
            given
                .parse()
                .map_err(|e: http::uri::InvalidUri| UpstreamError::NotAUrl {
                    url: url.to_owned(),
                    reason: e.to_string(),
                })?;
        let http2 = uri.scheme_str() == Some("h2c");
        let scheme = match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP || *scheme == Scheme::HTTPS => scheme.clone(),
            Some(_) if http2 => Scheme::HTTP,
            other => {
                return Err(UpstreamError::Scheme {
                    url: url.to_owned(),
                    scheme: other.map_or_else(|| "no scheme".to_owned(), |s| format!("{s}://")),
                });
            }
        };
        let Some(authority) = uri.authority().cloned() else {
            return Err(UpstreamError::NotAUrl {
                url: url.to_owned(),
                reason: "no host".to_owned(),
            });
        };
        if uri.query().is_some() {
            return Err(UpstreamError::Query {
                url: url.to_owned(),
            });
        }
        let (credentials, authority) = match authority.as_str().rsplit_once('@') {
            None => (None, authority),
            Some((user_info, host)) => {
                let credentials =
                    Credentials::parse(user_info).ok_or_else(|| UpstreamError::NotAUrl {
                        url: url.to_owned(),
                        reason: "the user name or password is not validly percent-encoded"
                            .to_owned(),
                    })?;
                let host =
                    host.parse()
                        .map_err(|e: http::uri::InvalidUri| UpstreamError::NotAUrl {
                            url: url.to_owned(),
                            reason: e.to_string(),
                        })?;
                (Some(credentials), host)
            }
        };
        Ok(Self {
            scheme,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            http2,
            credentials,
        })
    }
}

impl Upstream {
    /// Where a request for `target` (a path and query) goes upstream.
    pub(crate) fn uri_for(&self, target: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        let Some(target) = target.filter(|target| target.as_str().starts_with('/')) else {
            // No target, or an asterisk-form one (`OPTIONS *`): the
            // upstream's base.
            return builder
                .path_and_query(format!("{}/", self.base_path))
                .build();
        };
        if self.base_path.is_empty() {
            // The client's target as it came (sharing its bytes).
            return builder.path_and_query(target.clone()).build();
        }
        builder
            .path_and_query(format!("{}{}", self.base_path, target.as_str()))
            .build()
    }
}

impl Upstream {
    /// Whether the upstream is reached over TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// Whether the upstream is spoken to in HTTP/2 with prior knowledge
    /// (`h2c://`); otherwise HTTP/1.1.
    pub fn is_http2(&self) -> bool {
        self.http2
    }

    /// The `Authorization: Basic` value made of the URL's user and password,
    /// if it had them (marked sensitive, so hyper never logs it).
    pub fn basic_auth(&self) -> Option<&HeaderValue> {
        self.credentials.as_ref().map(|c| &c.basic)
    }

    /// The URL as given, password included, for a config file that must
    /// resolve to it again; [`Display`](fmt::Display) hides the password.
    pub fn to_url_with_password(&self) -> String {
        self.write(
            self.credentials
                .as_ref()
                .map(|c| c.written.clone())
                .as_deref(),
        )
    }

    fn write(&self, user_info: Option<&str>) -> String {
        let scheme = if self.http2 {
            "h2c"
        } else {
            self.scheme.as_str()
        };
        match user_info {
            Some(user_info) => format!(
                "{scheme}://{user_info}@{}{}",
                self.authority, self.base_path
            ),
            None => format!("{scheme}://{}{}", self.authority, self.base_path),
        }
    }

    /// The host and the port (the scheme's default when none is written).
    pub(crate) fn host_and_port(&self) -> (&str, u16) {
        let port = self
            .authority
            .port_u16()
            .unwrap_or(if self.is_https() { 443 } else { 80 });
        (self.authority.host(), port)
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.credentials.as_ref().map(Credentials::shown);
        f.write_str(&self.write(shown.as_deref()))
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Upstream({self})")
    }
}

/// The gateway's own settings.
///
/// ```
/// use std::time::Duration;
/// use idem_gateway::GatewayConfig;
///
/// let config = GatewayConfig::new("http://127.0.0.1:9000".parse()?)
///     .upstream_timeout(Duration::from_secs(10));
/// assert_eq!(config.shutdown_grace_period(), Duration::from_secs(15));
/// # Ok::<(), idem_gateway::UpstreamError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub(crate) upstream: Upstream,
    pub(crate) upstream_timeout: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) shutdown_grace: Option<Duration>,
    pub(crate) probe: Option<Probe>,
    pub(crate) grpc_probed: bool,
    pub(crate) max_in_flight: Option<usize>,
    pub(crate) routes: Vec<String>,
    pub(crate) upstream_tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) tls_subject_principal: bool,
    pub(crate) runtime: Runtime,
    pub(crate) workers: Option<NonZeroUsize>,
}

/// Where the gateway's connections are served.
///
/// - [`Shared`](Self::Shared): on the runtime that calls [`run`](crate::run),
///   as every other task of the process. With tokio's multi-thread runtime a
///   request may hop between worker threads as it goes from the client's
///   connection to the upstream's and back, and each hop is a wake-up of
///   another thread.
/// - [`PerCore`](Self::PerCore): on single-threaded runtimes of their own,
///   one per core ([`GatewayConfig::workers`]), each with its own listening
///   socket and its own pool of upstream connections, so a request is read,
///   forwarded and answered on one thread. The store and the layer are
///   shared by all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Runtime {
    /// The caller's runtime.
    #[default]
    Shared,
    /// One single-threaded runtime per core.
    PerCore,
}

impl Runtime {
    /// The setting's name: `shared` or `per-core`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::PerCore => "per-core",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A runtime name other than `shared` and `per-core`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a runtime; write per-core or shared")]
pub struct RuntimeError(String);

impl FromStr for Runtime {
    type Err = RuntimeError;

    fn from_str(given: &str) -> Result<Self, RuntimeError> {
        match given.trim().to_ascii_lowercase().as_str() {
            "shared" => Ok(Self::Shared),
            "per-core" | "per_core" => Ok(Self::PerCore),
            _ => Err(RuntimeError(given.to_owned())),
        }
    }
}

impl GatewayConfig {
    /// Forwards to `upstream`, with the default timeout (30 s).
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            shutdown_grace: None,
            probe: None,
            grpc_probed: false,
            max_in_flight: None,
            routes: Vec::new(),
            upstream_tls: None,
            tls_subject_principal: false,
            runtime: Runtime::default(),
            workers: None,
        }
    }

    /// Where connections are served (see [`Runtime`]; default:
    /// [`Runtime::Shared`], the runtime that calls [`run`](crate::run);
    /// `idem serve` sets [`Runtime::PerCore`] unless told otherwise).
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// With [`Runtime::PerCore`], how many runtimes serve (default: the
    /// number of cores the process may use).
    pub fn workers(mut self, workers: NonZeroUsize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Where connections are served.
    pub fn serving_runtime(&self) -> Runtime {
        self.runtime
    }

    /// How many runtimes serve with [`Runtime::PerCore`]: as set, else the
    /// number of cores the process may use.
    pub fn worker_count(&self) -> NonZeroUsize {
        self.workers
            .unwrap_or_else(|| std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN))
    }

    /// Scopes keys by the verified client certificate's subject (its CN):
    /// the gateway puts it in the [`TLS_SUBJECT_HEADER`](super::TLS_SUBJECT_HEADER)
    /// header (dropping any value the client sent), which the layer's
    /// principal header must then be. Needs a listener that requires client
    /// certificates ([`ListenerTls::client_ca`](super::ListenerTls)); a
    /// request that came without one has no such header (`anon`).
    pub fn principal_from_tls_subject(mut self) -> Self {
        self.tls_subject_principal = true;
        self
    }

    /// How an `https://` upstream is reached: the roots trusted and the
    /// client certificate, if any (see [`UpstreamTls`](super::UpstreamTls));
    /// default: webpki's bundled roots, no client certificate.
    pub fn upstream_tls(mut self, tls: rustls::ClientConfig) -> Self {
        self.upstream_tls = Some(Arc::new(tls));
        self
    }

    /// Asks the upstream with `probe` before a retry takes over a claim whose
    /// earlier attempt ended unknown (see [`Probe`] for its contract).
    pub fn probe(mut self, probe: Probe) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Says that the gRPC guard asks a lookup method about unknown outcomes
    /// (`--grpc-probe`), so the gateway's own answer to a gRPC call whose
    /// outcome is unknown tells the client its retry is reconciled, not held
    /// for the lease.
    pub fn grpc_probed(mut self, probed: bool) -> Self {
        self.grpc_probed = probed;
        self
    }

    /// The probe, if any.
    pub fn probe_template(&self) -> Option<&Probe> {
        self.probe.as_ref()
    }

    /// How long the gateway waits for the upstream's answer (the response
    /// head, and for a keyed request the whole body) after sending a request.
    /// When it runs out the outcome is unknown: the client gets 504 and a
    /// keyed request's key stays reserved until its lease ends.
    pub fn upstream_timeout(mut self, timeout: Duration) -> Self {
        self.upstream_timeout = timeout;
        self
    }

    /// How long a client may take to send a keyed request's whole body,
    /// counted from its head (default: 30 s). Past it the request is
    /// answered 408 with nothing claimed, so its retry runs at once. It is
    /// also how long an HTTP/1.1 client may take to send a request's head,
    /// which is how long an idle keep-alive connection is kept.
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// How long a graceful shutdown waits for requests in flight before it
    /// gives up on them (default: the upstream timeout plus 5 s, so every
    /// forwarded request gets its answer or its timeout).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// At most `limit` requests in flight (at least one); past it a request
    /// is answered 503 with `Retry-After: 1` at once, before its key is
    /// claimed or its body read (default: no limit).
    pub fn max_in_flight(mut self, limit: usize) -> Self {
        self.max_in_flight = Some(limit.max(1));
        self
    }

    /// The route templates (`/payments/{id}`, `/orders`) that name a
    /// request's route in the metrics' `route` label; a `{name}` segment
    /// matches any one segment. A request that matches none is labelled with
    /// its first path segment.
    pub fn routes<R: Into<String>>(mut self, routes: impl IntoIterator<Item = R>) -> Self {
        self.routes = routes.into_iter().map(Into::into).collect();
        self
    }

    /// The upstream.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The upstream timeout.
    pub fn timeout(&self) -> Duration {
        self.upstream_timeout
    }

    /// How long a graceful shutdown waits for requests in flight.
    pub fn shutdown_grace_period(&self) -> Duration {
        self.shutdown_grace
            .unwrap_or(self.upstream_timeout + Duration::from_secs(5))
    }

    /// How long opening a connection to the upstream may take: less than the
    /// upstream timeout, so a connection that cannot be opened is reported as
    /// such (nothing sent, key released) rather than as an unknown outcome.
    pub(crate) fn connect_timeout(&self) -> Duration {
        (self.upstream_timeout / 2).min(MAX_CONNECT_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_targets_keep_the_base_path_and_the_query() {
        let upstream: Upstream = "http://127.0.0.1:9000/api/".parse().unwrap();
        let target = PathAndQuery::from_static("/orders?limit=2");
        assert_eq!(
            upstream.uri_for(Some(&target)).unwrap(),
            "http://127.0.0.1:9000/api/orders?limit=2"
        );
        let bare: Upstream = "http://localhost:8081".parse().unwrap();
        assert_eq!(bare.uri_for(None).unwrap(), "http://localhost:8081/");
        assert_eq!(bare.to_string(), "http://localhost:8081");
        let secure: Upstream = "https://api.example.com/v1".parse().unwrap();
        assert_eq!(
            secure.uri_for(Some(&target)).unwrap(),
            "https://api.example.com/v1/orders?limit=2"
        );
        assert_eq!(secure.to_string(), "https://api.example.com/v1");
        let grpc: Upstream = "h2c://127.0.0.1:50051".parse().unwrap();
        assert!(grpc.is_http2() && !grpc.is_https());
        assert_eq!(
            grpc.uri_for(Some(&target)).unwrap(),
            "http://127.0.0.1:50051/orders?limit=2"
        );
        assert_eq!(grpc.to_string(), "h2c://127.0.0.1:50051");
        assert_eq!(grpc.to_string().parse::<Upstream>().unwrap(), grpc);
    }

    #[test]
    fn credentials_are_written_back_whole_and_shown_without_the_password() {
        for (url, shown, basic) in [
            (
                "http://gw:s3cr%3At@127.0.0.1:9000/api",
                "http://gw:***@127.0.0.1:9000/api",
                // "gw:s3cr:t"
                "Basic Z3c6czNjcjp0",
            ),
            (
                "https://only-user@api.example.com",
                "https://only-user@api.example.com",
                // "only-user:"
                "Basic b25seS11c2VyOg==",
            ),
            (
                "h2c://u:@[::1]:50051",
                "h2c://u:***@[::1]:50051",
                "Basic dTo=",
            ),
        ] {
            let upstream: Upstream = url.parse().unwrap();
            assert_eq!(upstream.to_string(), shown);
            assert_eq!(format!("{upstream:?}"), format!("Upstream({shown})"));
            assert_eq!(upstream.to_url_with_password(), url);
            assert_eq!(
                upstream.to_url_with_password().parse::<Upstream>().unwrap(),
                upstream
            );
            assert_eq!(upstream.basic_auth().unwrap(), basic);
            assert!(upstream.basic_auth().unwrap().is_sensitive());
            let target = PathAndQuery::from_static("/orders");
            let uri = upstream.uri_for(Some(&target)).unwrap().to_string();
            assert!(!uri.contains('@'), "{uri}");
        }
        let plain: Upstream = "http://127.0.0.1:9000".parse().unwrap();
        assert_eq!(plain.basic_auth(), None);
        assert_eq!(plain.to_url_with_password(), plain.to_string());
        let bad = "http://gw:50%zz@127.0.0.1:9000"
            .parse::<Upstream>()
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("percent-encoded") && !bad.contains("50%zz"),
            "{bad}"
        );
    }

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn bad_upstreams_say_what_to_write() {
        for (url, expected) in [
            ("ftp://example.com", "HTTP or HTTPS"),
            ("127.0.0.1:9000", "http://HOST:PORT"),
            ("http://exa mple", "not a URL"),
            ("http://h:1/?x=1", "query string"),
        ] {
            let error = url.parse::<Upstream>().unwrap_err().to_string();
            assert!(error.contains(expected), "{url}: {error}");
        }
    }
}
