//! Holding a request so it can be sent twice, and sending one request to the upstream on the gateway's client (the same
//! header rewriting, the same pool) and telling apart how it ended: a whole
//! answer, an answer still streaming, or none.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use idem::error_chain;

use super::verdict::Seen;
use idem_gateway::{
    ClientAddr, Upstream, UpstreamConnector, hop, rewrite_for, upstream_client_for,
};
use idem_http::{IDEMPOTENT_REPLAYED, KeyHeld, Mode, Refusal};

/// A request as it came, kept so it can be sent more than once.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) headers: HeaderMap,
    pub(crate) peer: SocketAddr,
    pub(crate) body: Bytes,
}

impl Held {
    /// One more request like it.
    pub(crate) fn request(&self) -> Request<Body> {
        let mut request = Request::new(Body::from(self.body.clone()));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request.extensions_mut().insert(ClientAddr(self.peer));
        request
    }
}

/// How one send ended.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The whole answer.
    Whole(http::response::Parts, Bytes),
    /// The answer's head; its body streams on to the client.
    Streaming(Response<Incoming>),
    /// No answer.
    Failed(Failure),
}

/// Why a send got no answer.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// No connection could be opened: nothing was sent.
    Unreachable(String),
    /// No answer within the upstream timeout, after the request was sent.
    Timeout(Duration),
    /// The connection broke after the request was sent.
    Broke(String),
}

impl Failure {
    /// The answer the client gets: the gateway's problem bodies.
    fn refusal(&self) -> Refusal {
        match self {
            Self::Unreachable(cause) => Refusal::UpstreamUnreachable {
                cause: cause.clone(),
            },
            Self::Timeout(after) => Refusal::UpstreamTimeout {
                after: *after,
                held: KeyHeld::NoKey,
            },
            Self::Broke(cause) => Refusal::UpstreamBroke {
                cause: cause.clone(),
                held: KeyHeld::NoKey,
            },
        }
    }

    /// Whether the request may have taken effect.
    pub(crate) fn was_sent(&self) -> bool {
        !matches!(self, Self::Unreachable(_))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.refusal().to_string())
    }
}

impl Reply {
    /// What the comparison needs of it.
    pub(crate) fn seen(&self) -> Seen {
        match self {
            Self::Whole(parts, body) => Seen::Answer {
                status: parts.status,
                body_hash: blake3::hash(body),
                replayed: replayed(&parts.headers),
            },
            Self::Streaming(_) | Self::Failed(_) => Seen::Nothing,
        }
    }

    /// The answer as the client gets it.
    pub(crate) fn into_response(self) -> Response {
        match self {
            Self::Whole(parts, body) => Response::from_parts(parts, Body::from(body)),
            Self::Streaming(response) => response.map(Body::new),
            Self::Failed(failure) => failure.refusal().to_response(Mode::Ietf),
        }
    }
}

/// Whether an answer says it is a replay.
pub(crate) fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// The upstream, its client and its timeout.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    client: Client<UpstreamConnector, Body>,
    upstream: Upstream,
    timeout: Duration,
}

impl Sender {
    pub(crate) fn new(upstream: Upstream, connect_timeout: Duration, timeout: Duration) -> Self {
        Self {
            client: upstream_client_for(&upstream, connect_timeout, None),
            upstream,
            timeout,
        }
    }

    /// Sends `request` to the upstream; the answer's body is read whole when
    /// `whole` (within the same timeout as its head), else left streaming.
    pub(crate) async fn send(&self, request: Request<Body>, whole: bool) -> Reply {
        let request = match rewrite_for(&self.upstream, request) {
            Ok(request) => request,
            Err(error) => {
                return Reply::Failed(Failure::Unreachable(format!(
                    "the request could not be rewritten for the upstream: {error}"
                )));
            }
        };
        self.exchange(request, whole).await
    }

    /// `GET uri` (any host), its body read whole.
    pub(crate) async fn get(&self, uri: &Uri) -> Reply {
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = uri.clone();
        self.exchange(request, true).await
    }

    async fn exchange(&self, request: Request<Body>, whole: bool) -> Reply {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let answer = match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) if error.is_connect() => {
                return Reply::Failed(Failure::Unreachable(error_chain(&error)));
            }
            Ok(Err(error)) => return Reply::Failed(Failure::Broke(error_chain(&error))),
            Err(_elapsed) => return Reply::Failed(Failure::Timeout(self.timeout)),
        };
        let (mut parts, body) = answer.into_parts();
        hop::strip(&mut parts.headers);
        if !whole {
            return Reply::Streaming(Response::from_parts(parts, body));
        }
        match tokio::time::timeout_at(deadline, body.collect()).await {
            Ok(Ok(collected)) => Reply::Whole(parts, collected.to_bytes()),
            Ok(Err(error)) => Reply::Failed(Failure::Broke(error_chain(&error))),
            Err(_elapsed) => Reply::Failed(Failure::Timeout(self.timeout)),
        }
    }
}

/// A request body, held when it fits.
#[derive(Debug)]
pub(crate) enum RequestBody {
    /// The whole body: it can be sent twice.
    Whole(Bytes),
    /// Over the limit: what was read, then the rest, streamed once.
    Streaming(Body),
}

/// Reads `body` whole when it is at most `limit` bytes; a larger one (by its
/// `Content-Length`, or as soon as more arrived) is handed back to stream.
pub(crate) async fn hold_body(
    headers: &HeaderMap,
    mut body: Incoming,
    limit: usize,
) -> Result<RequestBody, hyper::Error> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Ok(RequestBody::Streaming(Body::new(body)));
    }
    let mut read = Vec::new();
    let mut length = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers
        };
        length += data.len();
        read.push(data);
        if length > limit {
            let so_far = futures::stream::iter(read.into_iter().map(Ok::<_, hyper::Error>));
            let stream = so_far.chain(body.into_data_stream());
            return Ok(RequestBody::Streaming(Body::from_stream(stream)));
        }
    }
    Ok(RequestBody::Whole(match read.len() {
        0 => Bytes::new(),
        1 => read.remove(0),
        _ => read.concat().into(),
    }))
}
