//! Bodies: reading a unary request's one message, and the replayed answer's
//! body (its message frames, then its trailers).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a unary request's body was not taken.
#[derive(Debug)]
pub(crate) enum Unread {
    /// More than the limit.
    TooLarge(usize),
    /// Not exactly one length-prefixed message.
    NotOneMessage,
    /// The body broke off.
    Broken(BoxError),
}

/// Reads a request body that must be exactly one length-prefixed gRPC
/// message (a flag byte, a four-byte big-endian length, the message) of at
/// most `limit` bytes.
pub(crate) async fn read_one_message<B>(body: B, limit: usize) -> Result<Bytes, Unread>
where
    B: Body<Data = Bytes> + Send,
    B::Error: Into<BoxError>,
{
    let bytes = match Limited::new(body, limit.saturating_add(5)).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return Err(match error.downcast::<http_body_util::LengthLimitError>() {
                Ok(_) => Unread::TooLarge(limit),
                Err(error) => Unread::Broken(error),
            });
        }
    };
    if is_one_message(&bytes) {
        Ok(bytes)
    } else {
        Err(Unread::NotOneMessage)
    }
}

/// Whether `bytes` is exactly one length-prefixed message.
pub(crate) fn is_one_message(bytes: &[u8]) -> bool {
    if bytes.len() < 5 || bytes[0] > 1 {
        return false;
    }
    let mut length = &bytes[1..5];
    let length = length.get_u32() as usize;
    bytes.len() - 5 == length
}

/// The body of a replayed answer: its message frames in one data frame, then
/// its trailers.
#[derive(Debug)]
pub(crate) struct ReplayBody {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl ReplayBody {
    pub(crate) fn new(message: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            message: Some(message).filter(|m| !m.is_empty()),
            trailers,
        }
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.message {
            Some(message) => SizeHint::with_exact(message.len() as u64),
            None => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_is_told_from_none_and_from_two() {
        assert!(is_one_message(b"\0\0\0\0\x02ab"));
        assert!(is_one_message(b"\0\0\0\0\0"));
        assert!(!is_one_message(b""));
        assert!(!is_one_message(b"\0\0\0\0\x02a"));
        assert!(!is_one_message(b"\0\0\0\0\x01a\0\0\0\0\x01b"));
        assert!(!is_one_message(b"\x07\0\0\0\x01a"));
    }
}
