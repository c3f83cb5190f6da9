//! Reading a keyed request's body whole, under the configured limit, before
//! anything is claimed or forwarded: the fingerprint needs all of it, and a
//! body over the limit must be refused (413) before it reaches the service.
//!
//! A client that sent `Expect: 100-continue` waits for `100 Continue`
//! before it sends the body, and the server sends that when the body is
//! first read: a body whose `Content-Length` is already over the limit is
//! then refused without a read, so the client gets the 413 and never sends
//! it.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::{CONTENT_LENGTH, EXPECT};
use http_body::Body;
use http_body_util::BodyExt;

use crate::idempotency::problem::Refusal;

/// How much more than the limit a refused body may still be read (and thrown
/// away) before the refusal is answered, and for how long. A client still
/// sending the body when the server answers and closes may otherwise see the
/// connection reset instead of the 413 (the reason for nginx's lingering
/// close). Past either bound the connection is closed with the rest unread.
const DRAIN_BYTES: u64 = 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Reads `body` whole, refusing it when `Content-Length` already says it is
/// over `limit`, and as soon as more than `limit` bytes arrived otherwise;
/// a refused body is drained within bounds first (see [`DRAIN_BYTES`]).
pub(crate) async fn read_limited<B>(
    headers: &HeaderMap,
    body: B,
    limit: usize,
) -> Result<Bytes, Refusal>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if let Some(length) = declared.filter(|length| *length > limit as u64) {
        // Reading would ask a client that expects 100-continue to send what
        // is refused anyway.
        if length <= limit as u64 + DRAIN_BYTES && !expects_continue(headers) {
            drain(body, DRAIN_BYTES).await;
        }
        return Err(Refusal::BodyTooLarge { limit });
    }
    let mut received = BytesMut::new();
    loop {
        // The frame's result is taken apart before the next await: the
        // body's error type need not be `Send`.
        let data = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame.into_data().ok(),
            Some(Err(error)) => return Err(Refusal::BodyUnreadable(error.into().to_string())),
        };
        let Some(data) = data else {
            continue; // trailers
        };
        if received.len() + data.len() > limit {
            drain(body, DRAIN_BYTES).await;
            return Err(Refusal::BodyTooLarge { limit });
        }
        received.extend_from_slice(&data);
    }
    Ok(received.freeze())
}

/// Whether the client waits for `100 Continue` before sending the body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get_all(EXPECT)
        .iter()
        .any(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads and drops what is left of `body`, at most `bytes` of it and for at
/// most [`DRAIN_TIME`].
async fn drain<B>(mut body: std::pin::Pin<&mut B>, bytes: u64)
where
    B: Body<Data = Bytes>,
{
    let mut left = bytes;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        loop {
            let length = match body.frame().await {
                Some(Ok(frame)) => frame.into_data().map_or(0, |data| data.len() as u64),
                _ => return,
            };
            match left.checked_sub(length) {
                Some(rest) => left = rest,
                None => return,
            }
        }
    })
    .await;
}
