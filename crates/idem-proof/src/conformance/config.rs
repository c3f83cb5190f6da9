//! What the tester is pointed at and what it accepts: the target request
//! (URL, method, body template, headers), where effects are counted, which
//! refusal statuses pass, and the optional triggers some rules need.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, Uri};

/// The placeholder a body template carries: each request gets a number of
/// its own there, so no two requests of a run send the same body by chance.
pub const PLACEHOLDER: &str = "{seq}";

/// Which refusal statuses a rule accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    /// The IETF draft: a reused key is refused with 422.
    Ietf,
    /// Stripe's API: a reused key is refused with 400.
    Stripe,
    /// Either.
    Any,
}

impl Expect {
    /// The statuses a reused key may be refused with.
    pub(crate) fn reuse_statuses(self) -> &'static [u16] {
        match self {
            Expect::Ietf => &[422],
            Expect::Stripe => &[400],
            Expect::Any => &[400, 422],
        }
    }

    /// Whether the key is sent as an RFC 8941 String (`"key"`), as the IETF
    /// draft writes it, or bare, as Stripe's clients send it.
    pub(crate) fn quotes_keys(self) -> bool {
        self != Expect::Stripe
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expect::Ietf => "ietf",
            Expect::Stripe => "stripe",
            Expect::Any => "any",
        })
    }
}

/// A body with [`PLACEHOLDER`] in it.
#[derive(Debug, Clone)]
pub struct BodyTemplate(String);

/// A body template without the placeholder.
#[derive(Debug, thiserror::Error)]
#[error(
    "the body template {0:?} has no {PLACEHOLDER}: put {PLACEHOLDER} where a value may change from one request to the next (such as {{\"amount\": 100, \"reference\": \"{PLACEHOLDER}\"}}), so the tester can send a reused key with another body"
)]
pub struct NoPlaceholder(String);

impl BodyTemplate {
    /// Checks that the template has the placeholder.
    pub fn new(template: impl Into<String>) -> Result<Self, NoPlaceholder> {
        let template = template.into();
        if template.contains(PLACEHOLDER) {
            Ok(Self(template))
        } else {
            Err(NoPlaceholder(template))
        }
    }

    /// The body with `n` in place of the placeholder.
    pub(crate) fn body(&self, n: u64) -> String {
        self.0.replace(PLACEHOLDER, &n.to_string())
    }
}

impl std::str::FromStr for BodyTemplate {
    type Err = NoPlaceholder;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::new(text)
    }
}

/// One header given on the command line as `Name: value`.
#[derive(Debug, Clone)]
pub struct HeaderLine {
    /// The header's name.
    pub name: HeaderName,
    /// Its value.
    pub value: HeaderValue,
}

impl std::str::FromStr for HeaderLine {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, value) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?} is not a header: write it as Name: value"))?;
        let name = HeaderName::try_from(name.trim())
            .map_err(|_| format!("{:?} is not a header name", name.trim()))?;
        let value = HeaderValue::try_from(value.trim())
            .map_err(|_| format!("{:?} is not a header value", value.trim()))?;
        Ok(Self { name, value })
    }
}

/// Where the tester reads how many effects the server applied, so a rule
/// can say how many of its requests were applied.
#[derive(Debug, Clone)]
pub enum EffectSource {
    /// A GET answering the count: a number, or JSON `{"count": N}`.
    Url(Uri),
    /// A query whose rows are the effect log, as `idem check --effects-query`
    /// reads it (a column `key`, one row per effect); the count is its rows.
    Query {
        /// The query.
        sql: String,
        /// The database it runs on: `sqlite://PATH` or `postgres://…`.
        store: String,
    },
}

/// How a rule makes the server answer 5xx: a header, or a path. What the
/// server does before it answers depends on the hook: for
/// [`ConformanceConfig::fail`] it applies nothing, for
/// [`ConformanceConfig::apply_then_fail`] it applies the request first.
#[derive(Debug, Clone)]
pub enum FailTrigger {
    /// Requests carrying this header are answered 5xx.
    Header(HeaderLine),
    /// This path answers 5xx to the first request with a key and succeeds
    /// on a retry.
    Path(String),
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct ConformanceConfig {
    /// The endpoint under test, with its path.
    pub url: Uri,
    /// The method of every request (POST unless told).
    pub method: Method,
    /// The bodies.
    pub body: BodyTemplate,
    /// The request's `Content-Type`.
    pub content_type: HeaderValue,
    /// The key's header.
    pub key_header: HeaderName,
    /// Headers sent with every request (credentials).
    pub headers: Vec<HeaderLine>,
    /// The header whose value is the caller's identity, and two values of
    /// it, for the principals rule.
    pub principals: Option<(HeaderName, [HeaderValue; 2])>,
    /// Where effects are counted.
    pub effects: Option<EffectSource>,
    /// Which refusal statuses pass.
    pub expect: Expect,
    /// How many duplicates go at once in the concurrency rule.
    pub concurrency: usize,
    /// How the 5xx rule makes the server fail without applying anything.
    pub fail: Option<FailTrigger>,
    /// How the ambiguous-answer rule makes the server apply a request and
    /// then answer 5xx (an application that crashed after its commit, a
    /// load balancer that gave up on a slow answer).
    pub apply_then_fail: Option<FailTrigger>,
    /// How long to wait for each answer.
    pub timeout: Duration,
}

impl ConformanceConfig {
    /// A run against `url` with the defaults: POST, a JSON body, the
    /// `Idempotency-Key` header, either refusal vocabulary, 8 concurrent
    /// duplicates, 10 seconds per answer.
    pub fn new(url: Uri) -> Self {
        Self {
            url,
            method: Method::POST,
            body: BodyTemplate::new(DEFAULT_BODY).expect("the default body has the placeholder"),
            content_type: HeaderValue::from_static("application/json"),
            key_header: HeaderName::from_static("idempotency-key"),
            headers: Vec::new(),
            principals: None,
            effects: None,
            expect: Expect::Any,
            concurrency: 8,
            fail: None,
            apply_then_fail: None,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The body sent when no template is given.
pub const DEFAULT_BODY: &str = r#"{"conformance": "{seq}"}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_needs_its_placeholder_and_numbers_each_body() {
        let template = BodyTemplate::new(r#"{"amount": {seq}, "ref": "r-{seq}"}"#).unwrap();
        assert_eq!(template.body(7), r#"{"amount": 7, "ref": "r-7"}"#);
        let error = BodyTemplate::new(r#"{"amount": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("has no {seq}"), "{error}");
    }

    #[test]
    fn headers_are_read_as_name_and_value() {
        let header: HeaderLine = "Authorization:  Bearer t0k ".parse().unwrap();
        assert_eq!(header.name, "authorization");
        assert_eq!(header.value, "Bearer t0k");
        let error = "Authorization Bearer".parse::<HeaderLine>().unwrap_err();
        assert!(error.contains("Name: value"), "{error}");
        let error = "Bad Name: x".parse::<HeaderLine>().unwrap_err();
        assert!(error.contains("not a header name"), "{error}");
    }

    #[test]
    fn each_mode_accepts_its_reuse_refusals() {
        assert_eq!(Expect::Ietf.reuse_statuses(), &[422]);
        assert_eq!(Expect::Stripe.reuse_statuses(), &[400]);
        assert_eq!(Expect::Any.reuse_statuses(), &[400, 422]);
        assert!(!Expect::Stripe.quotes_keys());
        assert!(Expect::Ietf.quotes_keys());
    }
}
