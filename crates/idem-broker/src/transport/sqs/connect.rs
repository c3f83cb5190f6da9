//! The SDK client an SQS URL names: its endpoint, region and credentials,
//! or the standard AWS chain's; and the SDK's failures sorted the way the
//! transports and publishers sort theirs.

use std::time::Duration;

use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};

use super::SqsUrl;

/// The region an emulator's endpoint gets when nothing names one.
const EMULATOR_REGION: &str = "us-east-1";

/// The longest a receive waits for messages (SQS's own limit, 20 s).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(20);

impl SqsUrl {
    /// A client for the queue's endpoint, with the URL's region and
    /// credentials or the standard chain's.
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

/// The SDK client and the queue's URL.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    pub(crate) sdk: aws_sdk_sqs::Client,
    pub(crate) queue_url: String,
}

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

/// A failure, sorted, with what was being done.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) kind: FailureKind,
    pub(crate) message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

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
