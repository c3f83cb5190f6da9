//! The one mapping of the AWS SDK's failures to [`ErrorKind`], and the
//! refusals of DynamoDB's size limits, which are this store's own.
//!
//! A refused condition (`ConditionalCheckFailedException`, a transaction
//! cancelled on a condition) is not a failure here: the code that wrote the
//! condition reads it as an answer ([`is_condition_failure`]) and decides.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem_core::{Error, ErrorKind, StoreError};

/// DynamoDB's limit on one item, in bytes (400 KB).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// DynamoDB's limit on the items of one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

/// DynamoDB's limit on the total size of one `TransactWriteItems`, in bytes (4 MB).
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// Maps an SDK failure met while doing `what` (for example "claiming
/// payments/p-1") onto a store error whose message says what failed and what
/// to do. `write` tells whether the request changes data: a write whose
/// answer never came may or may not have been applied
/// ([`ErrorKind::CommitUnknown`]).
pub fn map_error<E, R>(what: &str, write: bool, error: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let (kind, advice) = match &error {
        SdkError::ServiceError(_) => by_code(error.code().unwrap_or_default()),
        SdkError::ConstructionFailure(_) => (
            ErrorKind::Config,
            "the request could not be made: check the region and the credentials the AWS chain found",
        ),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
            if write =>
        {
            (
                ErrorKind::CommitUnknown,
                "no answer came for the write, so whether DynamoDB applied it is unknown; retrying under the same key is safe",
            )
        }
        _ => (
            ErrorKind::Unavailable,
            "DynamoDB could not be reached: check the endpoint and the network, and retry once it answers",
        ),
    };
    let detail = match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => chain(&error),
    };
    StoreError::new(
        kind,
        format!("{what} on DynamoDB failed ({detail}): {advice}"),
    )
    .into()
}

/// The kind of a service error, and what to do about it.
fn by_code(code: &str) -> (ErrorKind, &'static str) {
    match code {
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "LimitExceededException"
        | "TransactionInProgressException" => (
            ErrorKind::Busy,
            "DynamoDB is throttling this table; retry after a short backoff",
        ),
        "TransactionConflictException" => (
            ErrorKind::SerializationFailure,
            "another transaction wrote one of the same items at the same time; retry",
        ),
        "InternalServerError" | "InternalFailure" | "ServiceUnavailable" => (
            ErrorKind::Unavailable,
            "DynamoDB answered with a server error; retry shortly",
        ),
        "ResourceNotFoundException" => (
            ErrorKind::Config,
            "the table does not exist (or not in this region): open the store once with permission to create it, or create it with a string partition key named pk",
        ),
        "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "MissingAuthenticationTokenException"
        | "ExpiredTokenException"
        | "IncompleteSignatureException" => (
            ErrorKind::Config,
            "the credentials were refused or lack the permission: check the key in the URL or the AWS chain's, and the IAM policy on the table",
        ),
        "ItemCollectionSizeLimitExceededException" => (
            ErrorKind::Other,
            "an item collection grew past DynamoDB's limit",
        ),
        _ => (ErrorKind::Other, "see DynamoDB's answer for the cause"),
    }
}

/// Whether `error` is DynamoDB refusing a write's condition: the answer
/// that the item is not as the write expected.
pub(crate) fn is_condition_failure<E, R>(error: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    matches!(error, SdkError::ServiceError(_))
        && error.code() == Some("ConditionalCheckFailedException")
}

/// The refusal of an item over 400 KB. `what` says which item; `answer`
/// whether it holds a stored answer (which `--max-answer` bounds).
pub(crate) fn item_too_large(what: &str, bytes: usize, answer: bool) -> Error {
    let advice = if answer {
        "the answer is refused whole rather than cut; lower --max-answer (the largest answer the store is asked to keep) below the limit, or keep such answers on a store without this limit"
    } else {
        "write it in smaller items"
    };
    StoreError::new(
        ErrorKind::Other,
        format!(
            "{what} would be a DynamoDB item of {bytes} bytes, over DynamoDB's limit of {MAX_ITEM_BYTES} bytes (400 KB) per item: {advice}"
        ),
    )
    .into()
}

/// An error and its sources, one after another: the SDK's own `Display`
/// says only "dispatch failure".
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_conflicts_are_transient_and_access_is_configuration() {
        assert!(by_code("ThrottlingException").0.is_transient());
        assert!(by_code("TransactionConflictException").0.is_transient());
        assert!(by_code("InternalServerError").0.is_transient());
        assert_eq!(by_code("AccessDeniedException").0, ErrorKind::Config);
        assert_eq!(by_code("ResourceNotFoundException").0, ErrorKind::Config);
        assert_eq!(by_code("SomethingNew").0, ErrorKind::Other);
    }

    #[test]
    fn the_size_refusal_names_the_limit_and_the_setting() {
        let message = item_too_large("the answer of s/k", 500_000, true).to_string();
        assert!(message.contains("400 KB"), "{message}");
        assert!(message.contains("--max-answer"), "{message}");
        assert!(message.contains("500000"), "{message}");
    }
}
