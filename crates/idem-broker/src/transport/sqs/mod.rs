//! Reaching an Amazon SQS queue through the official SDK: the queue written
//! as one URL, the client made from it and the standard AWS chain, and the
//! SDK's failures sorted the way the transports and publishers sort theirs.
//!
//! `sqs://[KEY:SECRET@][HOST[:PORT]]/[ACCOUNT/]QUEUE[?region=REGION]`:
//!
//! - no host (`sqs:///orders`): the SDK's own endpoint (`AWS_ENDPOINT_URL`,
//!   the profile, or the region's SQS endpoint);
//! - a host: that endpoint over HTTPS; `sqs+http://` reaches it over plain
//!   HTTP (a local emulator on loopback);
//! - the region: `?region=`, else the standard chain (`AWS_REGION`, the
//!   profile), else the one in an `sqs.REGION.amazonaws.com` host; an
//!   endpoint that is not Amazon's and names none gets `us-east-1`, which
//!   emulators accept;
//! - credentials: `KEY:SECRET@` in the URL, else the standard chain
//!   (environment, profile, web identity, container and instance roles);
//! - `ACCOUNT`: the queue's owner, when it is not the caller's account.

//!
//! The URL parses whatever the features; the client needs the `sqs` feature.

#[cfg(feature = "sqs")]
use std::time::Duration;

#[cfg(feature = "sqs")]
use aws_sdk_sqs::config::{Credentials, Region};
#[cfg(feature = "sqs")]
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use url::Url;

/// The region an emulator's endpoint gets when nothing names one.
#[cfg(feature = "sqs")]
const EMULATOR_REGION: &str = "us-east-1";

/// The longest a receive waits for messages (SQS's own limit, 20 s).
#[cfg(feature = "sqs")]
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(20);

/// A queue, as an SQS URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "sqs"), allow(dead_code))]
pub(crate) struct SqsUrl {
    /// `https://HOST[:PORT]` or `http://HOST[:PORT]`; `None`: the SDK's.
    pub(crate) endpoint: Option<String>,
    /// `?region=`, or the one an Amazon host names.
    pub(crate) region: Option<String>,
    /// Static credentials from the URL's user-info.
    pub(crate) credentials: Option<(String, String)>,
    /// The queue owner's account id.
    pub(crate) account: Option<String>,
    /// The queue's name (`orders`, `orders.fifo`).
    pub(crate) queue: String,
    /// The other query pairs, for the transport or the publisher to read.
    pub(crate) query: Vec<(String, String)>,
}

impl SqsUrl {
    /// Parses `text`; the reason is meant for a person.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let parsed = Url::parse(text).map_err(|e| e.to_string())?;
        let scheme = match parsed.scheme() {
            "sqs" => "https",
            "sqs+http" => "http",
            other => {
                return Err(format!(
                    "unknown scheme {other:?}: write sqs:// (or sqs+http:// for an emulator reached over plain HTTP)"
                ));
            }
        };
        let host = parsed.host_str().unwrap_or_default();
        let endpoint = (!host.is_empty()).then(|| match parsed.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        });
        if endpoint.is_none() && scheme == "http" {
            return Err(
                "sqs+http:// names the endpoint it reaches: write sqs+http://HOST:PORT/QUEUE"
                    .into(),
            );
        }
        let credentials = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (key, Some(secret)) if !key.is_empty() => Some((decode(key), decode(secret))),
            _ => {
                return Err(
                    "credentials in the URL are written KEY:SECRET@ (both parts), or left to the AWS chain".into(),
                );
            }
        };
        let segments: Vec<String> = parsed
            .path_segments()
            .map(|s| s.filter(|s| !s.is_empty()).map(decode).collect())
            .unwrap_or_default();
        let (account, queue) = match segments.as_slice() {
            [queue] => (None, queue.clone()),
            [account, queue] => (Some(account.clone()), queue.clone()),
            [] => return Err("names no queue: write sqs://HOST/QUEUE or sqs:///QUEUE".into()),
            _ => return Err("the path is [ACCOUNT/]QUEUE".into()),
        };
        if !valid_queue_name(&queue) {
            return Err(format!(
                "{queue:?} is not a queue name: up to 80 letters, digits, '-' or '_', with '.fifo' at the end of a FIFO queue"
            ));
        }
        let mut region = amazon_region(host);
        let mut query = Vec::new();
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "region" => region = Some(value.into_owned()),
                _ => query.push((name.into_owned(), value.into_owned())),
            }
        }
        Ok(Self {
            endpoint,
            region,
            credentials,
            account,
            queue,
            query,
        })
    }

    /// Whether the queue is a FIFO queue (its name says so).
    #[cfg_attr(not(feature = "sqs"), allow(dead_code))]
    pub(crate) fn fifo(&self) -> bool {
        self.queue.ends_with(".fifo")
    }

    /// A client for the queue's endpoint, with the URL's region and
    /// credentials or the standard chain's.
    #[cfg(feature = "sqs")]
    pub(crate) async fn client(&self, attempt_timeout: Duration) -> Result<Client, Failure> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader =
            aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some((key, secret)) = &self.credentials {
            loader = loader.credentials_provider(Credentials::new(
                key.clone(),
                secret.clone(),
                None,
                None,
                "the queue's URL",
            ));
        }
        let shared = loader.load().await;
        let mut config = aws_sdk_sqs::config::Builder::from(&shared).timeout_config(
            aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(attempt_timeout)
                .build(),
        );
        if shared.region().is_none() {
            if self.endpoint.is_none() {
                return Err(Failure {
                    kind: FailureKind::Config,
                    message:
                        "no AWS region: set AWS_REGION, a profile's region, or ?region= in the URL"
                            .into(),
                });
            }
            config = config.region(Region::new(EMULATOR_REGION));
        }
        let client = aws_sdk_sqs::Client::from_conf(config.build());
        let mut lookup = client.get_queue_url().queue_name(&self.queue);
        if let Some(account) = &self.account {
            lookup = lookup.queue_owner_aws_account_id(account);
        }
        let queue_url = lookup
            .send()
            .await
            .map_err(|e| sort(&e, &format!("find queue {:?}", self.queue)))?
            .queue_url
            .ok_or_else(|| Failure {
                kind: FailureKind::Unavailable,
                message: format!("find queue {:?}: the answer had no queue URL", self.queue),
            })?;
        Ok(Client {
            sdk: client,
            queue_url,
        })
    }
}

#[cfg(feature = "sqs")]
/// The SDK client and the queue's URL.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    pub(crate) sdk: aws_sdk_sqs::Client,
    pub(crate) queue_url: String,
}

#[cfg(feature = "sqs")]
/// What a failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// The endpoint did not answer, timed out, or answered with a server
    /// error: trying again may help.
    Unavailable,
    /// The credentials were refused or lack the permission.
    Refused,
    /// The queue does not exist.
    Missing,
    /// The request itself is wrong (a malformed setting, a message SQS does
    /// not take).
    Config,
}

#[cfg(feature = "sqs")]
/// A failure, sorted, with what was being done.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) kind: FailureKind,
    pub(crate) message: String,
}

#[cfg(feature = "sqs")]
impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(feature = "sqs")]
impl std::error::Error for Failure {}

#[cfg(feature = "sqs")]
/// Sorts an SDK failure while doing `context`.
pub(crate) fn sort<E, R>(error: &SdkError<E, R>, context: &str) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let (kind, detail) = match error {
        SdkError::ServiceError(service) => {
            let err = service.err();
            let code = err.code().unwrap_or_default();
            let kind = match code {
                _ if code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist") => {
                    FailureKind::Missing
                }
                "AccessDenied"
                | "AccessDeniedException"
                | "InvalidClientTokenId"
                | "SignatureDoesNotMatch"
                | "UnrecognizedClientException"
                | "InvalidSecurity"
                | "MissingAuthenticationToken"
                | "ExpiredToken" => FailureKind::Refused,
                _ if code.contains("Throttl")
                    || code.contains("ServiceUnavailable")
                    || code.contains("InternalError")
                    || code.contains("RequestThrottled")
                    || code.contains("KmsThrottled") =>
                {
                    FailureKind::Unavailable
                }
                "" => FailureKind::Unavailable,
                _ => FailureKind::Config,
            };
            let message = err.message().unwrap_or_default();
            (kind, format!("{code}: {message}"))
        }
        SdkError::ConstructionFailure(_) => (FailureKind::Config, source_chain(error)),
        _ => (FailureKind::Unavailable, source_chain(error)),
    };
    Failure {
        kind,
        message: format!("{context}: {detail}"),
    }
}

#[cfg(feature = "sqs")]
/// An error and its sources, one after another: the SDK's own `Display`
/// says only "dispatch failure".
fn source_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

/// The region of an Amazon endpoint (`sqs.eu-west-1.amazonaws.com`).
fn amazon_region(host: &str) -> Option<String> {
    let rest = host.strip_prefix("sqs.")?;
    let (region, domain) = rest.split_once('.')?;
    domain.starts_with("amazonaws.").then(|| region.to_owned())
}

fn valid_queue_name(name: &str) -> bool {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    !base.is_empty()
        && name.len() <= 80
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_endpoint_region_credentials_and_queue() {
        let moto = SqsUrl::parse(
            "sqs+http://test:s3cret@127.0.0.1:5000/orders.fifo?region=eu-west-1&group=g",
        )
        .unwrap();
        assert_eq!(moto.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(moto.region.as_deref(), Some("eu-west-1"));
        assert_eq!(moto.credentials, Some(("test".into(), "s3cret".into())));
        assert_eq!(moto.queue, "orders.fifo");
        assert!(moto.fifo());
        assert_eq!(moto.query, [("group".to_owned(), "g".to_owned())]);

        let aws =
            SqsUrl::parse("sqs://sqs.eu-central-1.amazonaws.com/123456789012/orders").unwrap();
        assert_eq!(
            aws.endpoint.as_deref(),
            Some("https://sqs.eu-central-1.amazonaws.com")
        );
        assert_eq!(aws.region.as_deref(), Some("eu-central-1"));
        assert_eq!(aws.account.as_deref(), Some("123456789012"));
        assert!(!aws.fifo());

        let chain = SqsUrl::parse("sqs:///orders").unwrap();
        assert_eq!(
            (chain.endpoint, chain.region, chain.credentials),
            (None, None, None)
        );

        assert!(SqsUrl::parse("sqs+http:///orders").is_err());
        assert!(SqsUrl::parse("sqs://h/").is_err());
        assert!(SqsUrl::parse("sqs://h/bad name").is_err());
        assert!(SqsUrl::parse("sqs://key@h/q").is_err());
    }
}
