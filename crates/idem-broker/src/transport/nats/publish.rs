//! NATS JetStream publisher: `Nats-Msg-Id` = the key, `Ok` on the stream's
//! `PubAck`.
//!
//! JetStream drops a second message with the same `Nats-Msg-Id` inside the
//! stream's duplicate window (2 minutes by default) and answers it with a
//! `duplicate` ack: a second line of dedupe behind the consumer's, which keeps
//! working after that window. A duplicate ack is a success: the stream has the
//! message.

use async_nats::jetstream::{self, context::PublishErrorKind as JsKind};
use async_nats::{Client, HeaderMap};

use super::MSG_ID_HEADER;
use super::connect::{Failure, connect};
use crate::publish::destination::Destination;
use crate::publish::error::{PublishError, PublishErrorKind};
use crate::publish::message::{Message, Publish};

/// Publishes to one JetStream subject.
#[derive(Debug)]
pub struct NatsPublisher {
    destination: Destination,
    subject: String,
    jetstream: jetstream::Context,
    // Kept for its connection state in errors; the context holds a clone.
    client: Client,
}

impl NatsPublisher {
    /// Connects to the server (failing at once if it does not answer; the
    /// client reconnects by itself afterwards).
    pub async fn connect(destination: &Destination) -> Result<Self, PublishError> {
        let Destination::Nats { url, subject } = destination else {
            return Err(PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                "not a nats:// destination",
            ));
        };
        let client = connect(url, async_nats::ConnectOptions::new())
            .await
            .map_err(|failure| {
                let (kind, advice) = match failure.kind {
                    Failure::Unavailable => (
                        PublishErrorKind::Unavailable,
                        "; is nats-server running there with JetStream (-js)?",
                    ),
                    Failure::Refused | Failure::Config => (PublishErrorKind::Config, ""),
                };
                let error = PublishError::new(
                    kind,
                    destination.redacted(),
                    format!("could not connect: {}{advice}", failure.message),
                );
                match failure.source {
                    Some(source) => error.with_source(source),
                    None => error,
                }
            })?;
        Ok(Self {
            destination: destination.clone(),
            subject: subject.clone(),
            jetstream: jetstream::new(client.clone()),
            client,
        })
    }

    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    fn failed(&self, error: jetstream::context::PublishError) -> PublishError {
        let (kind, advice) = match error.kind() {
            JsKind::StreamNotFound => (
                PublishErrorKind::NotTaken,
                "no stream captures this subject; create a stream whose subjects include it",
            ),
            JsKind::TimedOut | JsKind::BrokenPipe | JsKind::MaxAckPending => (
                PublishErrorKind::Unavailable,
                "the server did not acknowledge in time",
            ),
            JsKind::MaxPayloadExceeded => (
                PublishErrorKind::Rejected,
                "the message is larger than the server's max_payload",
            ),
            _ => (PublishErrorKind::NotTaken, "the stream did not store it"),
        };
        PublishError::new(
            kind,
            self.destination.redacted(),
            format!(
                "JetStream publish to {} failed: {error}; {advice} (connection {:?})",
                self.subject,
                self.client.connection_state()
            ),
        )
        .with_source(error)
    }
}

impl Publish for NatsPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            headers.insert(name.as_str(), value.as_str());
        }
        headers.insert(MSG_ID_HEADER, message.key.as_str());
        let ack = self
            .jetstream
            .publish_with_headers(
                self.subject.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await
            .map_err(|e| self.failed(e))?
            .await
            .map_err(|e| self.failed(e))?;
        if ack.duplicate {
            tracing::info!(
                stream = %ack.stream,
                sequence = ack.sequence,
                "JetStream already had this Nats-Msg-Id; duplicate suppressed by the stream"
            );
        }
        Ok(())
    }
}
