//! [`DupProxyConfig`]: where the upstream is, which share of the requests is
//! sent twice and when the copy goes, and what is recorded on the side.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use http::Uri;
use http::uri::Scheme;

use idem_gateway::{DEFAULT_UPSTREAM_TIMEOUT, Upstream};
use idem_http::DEFAULT_BODY_LIMIT;

/// The share of requests sent twice by default: 5 %.
pub const DEFAULT_SHARE: Share = Share(0.05);

/// The share of requests that are sent twice: a number from 0 to 1.
///
/// ```
/// use idem_proof::dup_proxy::Share;
///
/// assert_eq!("0.25".parse::<Share>()?.get(), 0.25);
/// assert_eq!("10%".parse::<Share>()?.get(), 0.1);
/// assert!("1.5".parse::<Share>().is_err());
/// # Ok::<(), idem_proof::dup_proxy::ShareError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Share(f64);

/// A share that is not a number from 0 to 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a share of requests; write a number from 0 to 1 (0.05 sends one request in twenty twice) or a percentage such as 5%"
)]
pub struct ShareError(String);

impl Share {
    /// `share`, when it is a number from 0 to 1.
    pub fn new(share: f64) -> Result<Self, ShareError> {
        if (0.0..=1.0).contains(&share) {
            Ok(Self(share))
        } else {
            Err(ShareError(share.to_string()))
        }
    }

    /// The share, from 0 to 1.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for Share {
    type Err = ShareError;

    fn from_str(text: &str) -> Result<Self, ShareError> {
        let trimmed = text.trim();
        let (number, scale) = match trimmed.strip_suffix('%') {
            Some(percent) => (percent.trim(), 100.0),
            None => (trimmed, 1.0),
        };
        number
            .parse::<f64>()
            .ok()
            .and_then(|share| Self::new(share / scale).ok())
            .ok_or_else(|| ShareError(text.to_owned()))
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", (self.0 * 10_000.0).round() / 100.0)
    }
}

/// When the copy of a duplicated request is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyTiming {
    /// At the same time as the original: a client that retries at once, or
    /// two workers racing on one message.
    #[default]
    Concurrent,
    /// This long after the original's answer: a client that retries later.
    /// The client gets its answer at once; the copy goes in the background.
    AfterAnswer(Duration),
    /// Ahead of the original, which is sent once the copy's answer is in:
    /// the original arriving second, as after a reordering.
    Ahead,
}

impl fmt::Display for CopyTiming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Concurrent => f.write_str("concurrently with the original"),
            Self::AfterAnswer(delay) => {
                write!(f, "{} ms after the original's answer", delay.as_millis())
            }
            Self::Ahead => f.write_str("ahead of the original"),
        }
    }
}

/// Where the upstream's effect count is read: a `GET` whose answer is a JSON
/// number, or an object with a numeric `count`.
///
/// ```
/// use idem_proof::dup_proxy::EffectsUrl;
///
/// let url: EffectsUrl = "http://127.0.0.1:9000/stats/orders".parse()?;
/// assert_eq!(url.to_string(), "http://127.0.0.1:9000/stats/orders");
/// assert!("127.0.0.1:9000/stats".parse::<EffectsUrl>().is_err());
/// # Ok::<(), idem_proof::dup_proxy::EffectsUrlError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectsUrl(Uri);

/// An effects URL that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "effects URL {url:?} cannot be read ({reason}): write http://HOST:PORT/PATH, a GET that answers a JSON number or {{\"count\": N}}"
)]
pub struct EffectsUrlError {
    url: String,
    reason: String,
}

impl FromStr for EffectsUrl {
    type Err = EffectsUrlError;

    fn from_str(url: &str) -> Result<Self, EffectsUrlError> {
        let error = |reason: &str| EffectsUrlError {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| error(&e.to_string()))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(error("only plain http:// URLs are read"));
        }
        if uri.authority().is_none() {
            return Err(error("no host"));
        }
        Ok(Self(uri))
    }
}

impl EffectsUrl {
    pub(crate) fn uri(&self) -> &Uri {
        &self.0
    }
}

impl fmt::Display for EffectsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The settings of a [`DupProxy`](super::DupProxy).
///
/// ```
/// use std::time::Duration;
/// use idem_proof::dup_proxy::{CopyTiming, DupProxyConfig, Share};
///
/// let config = DupProxyConfig::new("http://127.0.0.1:9000".parse()?)
///     .share(Share::new(0.1)?)
///     .timing(CopyTiming::AfterAnswer(Duration::from_millis(200)))
///     .seed(7);
/// assert_eq!(config.copy_timing(), CopyTiming::AfterAnswer(Duration::from_millis(200)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct DupProxyConfig {
    pub(crate) upstream: Upstream,
    pub(crate) share: Share,
    pub(crate) timing: CopyTiming,
    pub(crate) seed: Option<u64>,
    pub(crate) max_body: usize,
    pub(crate) upstream_timeout: Duration,
    pub(crate) effects: Option<EffectsUrl>,
    pub(crate) history: Option<PathBuf>,
}

impl DupProxyConfig {
    /// Forwards to `upstream`, sends 5 % of the requests twice, concurrently,
    /// and reads request bodies of up to 1 MiB.
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            share: DEFAULT_SHARE,
            timing: CopyTiming::default(),
            seed: None,
            max_body: DEFAULT_BODY_LIMIT,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            effects: None,
            history: None,
        }
    }

    /// The share of requests sent twice.
    pub fn share(mut self, share: Share) -> Self {
        self.share = share;
        self
    }

    /// When the copy is sent.
    pub fn timing(mut self, timing: CopyTiming) -> Self {
        self.timing = timing;
        self
    }

    /// Picks the requests to duplicate with a generator seeded by `seed`, so
    /// a run over the same traffic picks the same requests (by default the
    /// seed is random).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The largest request body held in memory so it can be sent twice
    /// (default 1 MiB). A larger body is streamed to the upstream once and
    /// never duplicated.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// How long to wait for each answer (default 30 s); past it the client
    /// gets 504 and the outcome is unknown.
    pub fn upstream_timeout(mut self, timeout: Duration) -> Self {
        self.upstream_timeout = timeout;
        self
    }

    /// Reads the upstream's effect count around each pair, to count the
    /// effects the second send caused.
    pub fn effects_url(mut self, url: EffectsUrl) -> Self {
        self.effects = Some(url);
        self
    }

    /// Writes every exchange to `path` in the history format
    /// ([`idem_check::history`]).
    pub fn history(mut self, path: impl Into<PathBuf>) -> Self {
        self.history = Some(path.into());
        self
    }

    /// The upstream.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The share of requests sent twice.
    pub fn duplicated_share(&self) -> Share {
        self.share
    }

    /// When the copy is sent.
    pub fn copy_timing(&self) -> CopyTiming {
        self.timing
    }

    /// How long opening a connection may take: as for the gateway, less than
    /// the upstream timeout, at most 5 s.
    pub(crate) fn connect_timeout(&self) -> Duration {
        (self.upstream_timeout / 2).min(Duration::from_secs(5))
    }
}
