//! The sidecar (`idem forward`): consumes a queue or a JetStream consumer and
//! delivers each message to an HTTP endpoint, for services in any language.
//!
//! Each message is `POST`ed with `Idempotency-Key` set to the message's key,
//! so an endpoint that implements the Idempotency-Key semantics (Idem's own
//! layer, `idem serve`, Stripe-style APIs) applies it once however often it
//! arrives. The message is acked only after the endpoint answered:
//!
//! | endpoint answered | the sidecar |
//! | --- | --- |
//! | 2xx (first time, or a replay with `Idempotent-Replayed: true`) | acks |
//! | 409 with `Retry-After` (the same key is still being worked on) | waits as told and sends again; not a failed attempt |
//! | 408, 429, 5xx, a timeout, a broken connection | a failed attempt: redelivered after a jittered delay (at least the `Retry-After`), dead-lettered after the last |
//! | any other 4xx (400, 404, 422, a bare 409), 3xx | a terminal answer (the endpoint stores it and replays it to any retry): recorded as a dead letter, then acked |
//!
//! Why the sidecar keeps no dedupe records of its own: the endpoint is the one
//! that applies the effect, and it dedupes on the key it receives; the
//! sidecar only has to keep sending the same key until it gets an answer.
//! Its store holds the failure counts and the dead letters. A timeout after
//! the request was sent is an unknown outcome; sending again with the same
//! key is exactly what lets the endpoint sort it out.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full, Limited};
use idem_core::{Applied, ApplyError, Error, Outcome, error_chain};
use idem_retry::{HttpPolicy, IDEMPOTENCY_KEY, Verdict, key_header_value};
use idem_trace::{Headers, HttpHeadersMut, KeyInSpans};
use tracing::Instrument;

use crate::consume::{
    Apply, ConsumeError, Consumer, ConsumerConfig, ConsumerStore, KeyedMessage, Reconnect, Source,
    SourceOptions, StatsSnapshot,
};
use crate::transport::http::{HttpClient, client};

/// The response header that marks a replayed answer.
const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The most of a response body kept for a dead letter or a stored outcome.
const BODY_LIMIT: usize = 64 * 1024;

/// Where and how messages are forwarded.
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    /// The endpoint (`http://...`, or `https://...` checked per `tls`).
    pub to: Uri,
    /// How long one request may take before it counts as a failed attempt
    /// whose outcome is unknown (default 30 s).
    pub timeout: Duration,
    /// How the key appears in the `forward` span (default as it is).
    pub key_in_spans: KeyInSpans,
    /// How a lost broker connection is made again (default: full jitter from
    /// 100 ms up to 30 s, for as long as it takes).
    pub reconnect: Reconnect,
    /// How an `https://` endpoint is reached (the roots it is checked
    /// against, a client certificate); `None`: webpki's bundled roots.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl ForwardConfig {
    /// Forwarding to `to` with a 30 s timeout.
    pub fn new(to: Uri) -> Self {
        Self {
            to,
            timeout: Duration::from_secs(30),
            key_in_spans: KeyInSpans::Raw,
            reconnect: Reconnect::default(),
            tls: None,
        }
    }
}

/// Why a forward attempt failed (every one of these is retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// No answer in time: whether the endpoint applied it is unknown; the
    /// retry carries the same key.
    #[error("no answer from the endpoint within {}s; outcome unknown, it will be sent again with the same key", .0.as_secs())]
    Timeout(Duration),
    /// The connection failed.
    #[error("the endpoint could not be reached: {0}")]
    Unreachable(String),
    /// A retryable status (408, 429, 5xx).
    #[error("the endpoint answered {status}: {body}")]
    Status {
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
        /// The endpoint's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
}

/// Delivers messages to an HTTP endpoint; an [`Apply`] for the consumer
/// runtime. `S` keeps the failure counts and dead letters.
pub struct HttpForward<S> {
    store: S,
    client: HttpClient,
    policy: HttpPolicy,
    config: ForwardConfig,
}

impl<S> fmt::Debug for HttpForward<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpForward")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: ConsumerStore> HttpForward<S> {
    /// A forwarder to `config.to`, counting failures in `store`.
    pub fn new(store: S, config: ForwardConfig) -> Self {
        Self {
            store,
            client: client(config.tls.as_deref()),
            policy: HttpPolicy::new(),
            config,
        }
    }

    /// One delivery attempt, in a `forward` span (a child of the consumer's
    /// span, so of the message's trace).
    async fn send(&self, message: &KeyedMessage) -> Result<Applied, ApplyError<ForwardError>> {
        let span = tracing::info_span!(
            "forward",
            scope = message.scope.as_str(),
            idempotency_key = self.config.key_in_spans.show(&message.key),
            to = %self.config.to,
        );
        self.attempt(message).instrument(span).await
    }

    async fn attempt(&self, message: &KeyedMessage) -> Result<Applied, ApplyError<ForwardError>> {
        let content_type = message
            .message
            .content_type
            .as_deref()
            .unwrap_or("application/octet-stream");
        let mut request = Request::post(self.config.to.clone())
            .header(IDEMPOTENCY_KEY, key_header_value(&message.key))
            .header(CONTENT_TYPE, content_type)
            .body(Full::new(message.message.payload.clone()))
            .map_err(|e| ApplyError::Effect(ForwardError::Unreachable(e.to_string())))?;
        // The endpoint joins the message's trace.
        idem_trace::pass_on(
            &Headers(&message.message.headers),
            &mut HttpHeadersMut(request.headers_mut()),
        );
        let response =
            match tokio::time::timeout(self.config.timeout, self.client.request(request)).await {
                Err(_elapsed) => {
                    return Err(ApplyError::Effect(ForwardError::Timeout(
                        self.config.timeout,
                    )));
                }
                Ok(Err(error)) => {
                    return Err(ApplyError::Effect(ForwardError::Unreachable(error_chain(
                        &error,
                    ))));
                }
                Ok(Ok(response)) => response,
            };
        let (parts, body) = response.into_parts();
        let body = match tokio::time::timeout(
            self.config.timeout,
            Limited::new(body, BODY_LIMIT).collect(),
        )
        .await
        {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(error)) => {
                // A body over the limit is cut, not an error of the delivery.
                tracing::debug!(%error, "response body not read in full");
                Bytes::new()
            }
            Err(_elapsed) => {
                return Err(ApplyError::Effect(ForwardError::Timeout(
                    self.config.timeout,
                )));
            }
        };
        let status = parts.status;
        let replayed = parts
            .headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let verdict = self.policy.classify_status(status, &parts.headers);
        match verdict {
            Verdict::RetryAfter(retry_after) if status == StatusCode::CONFLICT => {
                Err(ApplyError::Protocol(Error::InFlight {
                    scope: message.scope.clone(),
                    key: message.key.clone(),
                    retry_after,
                }))
            }
            Verdict::Retry | Verdict::RetryAfter(_) => {
                Err(ApplyError::Effect(ForwardError::Status {
                    status: status.as_u16(),
                    body: excerpt(&body),
                    retry_after: verdict.hint(),
                }))
            }
            Verdict::DontRetry => {
                let outcome = if status.is_success() {
                    Outcome::success(body.to_vec())
                } else {
                    Outcome::terminal_failure(
                        format!("HTTP {}: {}", status.as_u16(), excerpt(&body)).into_bytes(),
                    )
                }
                .with_meta("status", status.as_u16().to_string());
                Ok(if replayed {
                    Applied::Replayed(outcome)
                } else {
                    Applied::Fresh(outcome)
                })
            }
        }
    }
}

impl<S: ConsumerStore> Apply for HttpForward<S> {
    type Error = ForwardError;
    type Store = S;

    fn store(&self) -> &S {
        &self.store
    }

    async fn apply(&self, message: Arc<KeyedMessage>) -> Result<Applied, ApplyError<ForwardError>> {
        self.send(&message).await
    }

    fn retry_hint(&self, error: &ForwardError) -> Option<Duration> {
        match error {
            ForwardError::Status { retry_after, .. } => *retry_after,
            ForwardError::Timeout(_) | ForwardError::Unreachable(_) => None,
        }
    }

    fn busy_wait(&self, retry_after: Duration, _step: Duration) -> Duration {
        retry_after
    }
}

/// Runs the sidecar: consumes `source`, forwards every message per
/// `forward`, keeps failure counts and dead letters in `store`, until
/// `shutdown` completes. Terminal answers (4xx) are recorded as dead letters
/// unless `consumer` says otherwise.
///
/// A lost broker connection is made again ([`Source::connect_reconnecting`]
/// with `forward.reconnect`), and the consumer's watchdog, if `consumer` has
/// one, restarts it in place. It returns with an error only for what a
/// restart cannot fix: refused credentials, a missing queue, stream or topic,
/// a wrong setting, a store that cannot be prepared.
pub async fn run<S: ConsumerStore>(
    source: &Source,
    options: SourceOptions,
    store: S,
    forward: ForwardConfig,
    consumer: ConsumerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<StatsSnapshot, ConsumeError> {
    let transport = source
        .connect_reconnecting(options, forward.reconnect)
        .await?;
    tracing::info!(%source, to = %forward.to, "forwarding");
    Consumer::new(transport, HttpForward::new(store, forward), consumer)
        .run(shutdown)
        .await
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut cut: String = text.chars().take(512).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}
