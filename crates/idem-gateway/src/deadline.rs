//! The deadline on a keyed request's body. The layer reads a keyed body
//! whole before it claims the key; a client that sends it a byte at a time
//! would otherwise hold a connection, a place under `--max-in-flight` and a
//! buffer for as long as it likes. [`Deadline`] ends such a body with an
//! error once its time is up, the layer refuses it (nothing claimed), and
//! the gateway answers 408 with a problem body: the retry runs at once.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use http::header::CONNECTION;
use http::{HeaderValue, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};

use super::loops::problem;
use idem_http::Mode;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The problem type of a body that did not arrive in time.
pub(crate) const REQUEST_TIMEOUT: &str = "request-timeout";

/// The error a body gets when its deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct TimedOut;

/// A request body with an optional deadline; past it the next read fails and
/// the request is marked as timed out.
pub(crate) struct Deadline<B> {
    body: B,
    /// The deadline and the flag set when it passes; `None` without one.
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, Arc<AtomicBool>)>,
}

impl<B> Deadline<B> {
    /// `body`, failing once `within` has passed (from now) when given; and
    /// the flag that says whether it did.
    pub(crate) fn new(body: B, within: Option<Duration>) -> (Self, Expired) {
        let Some(within) = within else {
            return (
                Self {
                    body,
                    deadline: None,
                },
                Expired(None),
            );
        };
        let expired = Arc::new(AtomicBool::new(false));
        let sleep = Box::pin(tokio::time::sleep(within));
        (
            Self {
                body,
                deadline: Some((sleep, Arc::clone(&expired))),
            },
            Expired(Some(expired)),
        )
    }
}

/// Whether a [`Deadline`] body ran out of time.
#[derive(Debug, Clone)]
pub(crate) struct Expired(Option<Arc<AtomicBool>>);

impl Expired {
    pub(crate) fn get(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|expired| expired.load(Ordering::Acquire))
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if let Some((deadline, expired)) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            expired.store(true, Ordering::Release);
            this.deadline = None;
            return Poll::Ready(Some(Err(TimedOut.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a keyed request whose body did not arrive within `after`:
/// 408, closing an HTTP/1 connection (the rest of the body is never read).
pub(crate) fn too_slow(mode: Mode, after: Duration, version: Version) -> Response {
    let detail = format!(
        "the request body did not arrive within {}: nothing was claimed or forwarded, and the key is free; send the request again",
        humantime::format_duration(after)
    );
    tracing::debug!("{detail}");
    let mut response = problem(
        mode,
        StatusCode::REQUEST_TIMEOUT,
        REQUEST_TIMEOUT,
        "Request body too slow",
        &detail,
    );
    if version <= Version::HTTP_11 {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;

    #[tokio::test]
    async fn a_body_that_ends_in_time_is_read_whole_and_one_that_does_not_fails() {
        let (whole, expired) = Deadline::new(
            Full::new(Bytes::from_static(b"all of it")),
            Some(Duration::from_millis(50)),
        );
        let read = whole.collect().await.unwrap().to_bytes();
        assert_eq!(&read[..], b"all of it");
        assert!(!expired.get());

        let stalled = StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, std::convert::Infallible>,
        >());
        let (slow, expired) = Deadline::new(stalled, Some(Duration::from_millis(50)));
        let error = slow.collect().await.unwrap_err().to_string();
        assert!(error.contains("in time"), "{error}");
        assert!(expired.get());
    }
}
