//! Reading a keyed request's body whole, under the configured limit, before
//! anything is claimed or forwarded: the fingerprint needs all of it, and a
//! body over the limit must be refused (413) before it reaches the service.

use bytes::Bytes;
use http::HeaderMap;
use http::header::CONTENT_LENGTH;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::idempotency::problem::Refusal;

/// Reads `body` whole, refusing it at once when `Content-Length` already says
/// it is over `limit`, and as soon as more than `limit` bytes arrived otherwise.
pub(crate) async fn read_limited<B>(
    headers: &HeaderMap,
    body: B,
    limit: usize,
) -> Result<Bytes, Refusal>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(Refusal::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(Refusal::BodyTooLarge { limit }),
        Err(error) => Err(Refusal::BodyUnreadable(error.to_string())),
    }
}
