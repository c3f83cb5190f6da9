//! Amazon SQS publisher: the key as the `idempotency-key` message attribute,
//! and on a FIFO queue as the `MessageDeduplicationId`; `Ok` once
//! `SendMessage` answered with a message id.
//!
//! A FIFO queue drops a second message with the same deduplication id for
//! five minutes after the first was sent, and answers it as if sent: a second
//! line of dedupe behind the consumer's, which keeps working after those five
//! minutes (a relay that publishes a row again after a restart, a redrive
//! days later). A standard queue keeps every copy, and may deliver a message
//! more than once even when it was sent once.
//!
//! The body is the payload as text: SQS takes only Unicode text (a payload
//! that is not UTF-8 is rejected, not retried). Headers become string
//! attributes; SQS takes at most ten attributes per message, the key's
//! included, so headers beyond nine are refused the same way.

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;

use super::connect::{self, FailureKind};
use super::{KEY_ATTRIBUTE, SqsUrl};
use crate::publish::destination::{Destination, SqsGroup};
use crate::publish::error::{PublishError, PublishErrorKind};
use crate::publish::message::{Message, Publish};

/// SQS's limit on a message's attributes.
const MAX_ATTRIBUTES: usize = 10;

/// Publishes to one SQS queue.
#[derive(Debug)]
pub struct SqsPublisher {
    destination: Destination,
    client: connect::Client,
    fifo: bool,
    group: SqsGroup,
}

impl SqsPublisher {
    /// Makes the client and finds the queue (failing at once if it does not
    /// exist or the endpoint does not answer).
    pub async fn connect(destination: &Destination) -> Result<Self, PublishError> {
        let Destination::Sqs { url, group } = destination else {
            return Err(PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                "not an sqs:// destination",
            ));
        };
        let parsed = SqsUrl::parse(url).map_err(|why| {
            PublishError::new(PublishErrorKind::Config, destination.redacted(), why)
        })?;
        let client = parsed
            .client(std::time::Duration::from_secs(30))
            .await
            .map_err(|failure| {
                let kind = match failure.kind {
                    FailureKind::Unavailable => PublishErrorKind::Unavailable,
                    FailureKind::Missing => PublishErrorKind::NotTaken,
                    FailureKind::Refused | FailureKind::Config => PublishErrorKind::Config,
                };
                PublishError::new(kind, destination.redacted(), failure.to_string())
                    .with_source(failure)
            })?;
        Ok(Self {
            destination: destination.clone(),
            client,
            fifo: parsed.fifo(),
            group: group.clone(),
        })
    }

    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    fn rejected(&self, why: impl Into<String>) -> PublishError {
        PublishError::new(
            PublishErrorKind::Rejected,
            self.destination.redacted(),
            why.into(),
        )
    }
}

fn text(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("data type is set")
}

impl Publish for SqsPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let body = std::str::from_utf8(&message.payload).map_err(|_| {
            self.rejected("SQS takes only text bodies and this payload is not UTF-8")
        })?;
        let mut attributes = HashMap::new();
        for (name, value) in &message.headers {
            if !name.eq_ignore_ascii_case(KEY_ATTRIBUTE) && !value.is_empty() {
                attributes.insert(name.clone(), text(value));
            }
        }
        attributes.insert(KEY_ATTRIBUTE.to_owned(), text(message.key.as_str()));
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(self.rejected(format!(
                "the message has {} headers and SQS takes at most {} message attributes, the key's included",
                attributes.len() - 1,
                MAX_ATTRIBUTES
            )));
        }
        let mut send = self
            .client
            .sdk
            .send_message()
            .queue_url(&self.client.queue_url)
            .message_body(body)
            .set_message_attributes(Some(attributes));
        if self.fifo {
            let group = match &self.group {
                SqsGroup::Fixed(name) => name.clone(),
                SqsGroup::MessageKey => message.key.as_str().to_owned(),
                SqsGroup::Header(name) => message
                    .headers
                    .iter()
                    .find(|(h, _)| h.eq_ignore_ascii_case(name))
                    .map_or_else(|| message.key.as_str().to_owned(), |(_, v)| v.clone()),
            };
            send = send
                .message_group_id(group)
                .message_deduplication_id(dedup_id(message.key.as_str()));
        }
        let sent = send.send().await.map_err(|e| {
            let failure = connect::sort(&e, "SendMessage");
            let kind = match failure.kind {
                FailureKind::Unavailable => PublishErrorKind::Unavailable,
                FailureKind::Missing => PublishErrorKind::NotTaken,
                FailureKind::Refused => PublishErrorKind::Config,
                FailureKind::Config => PublishErrorKind::Rejected,
            };
            PublishError::new(kind, self.destination.redacted(), failure.to_string())
                .with_source(failure)
        })?;
        if sent.message_id.is_none() {
            return Err(PublishError::new(
                PublishErrorKind::NotTaken,
                self.destination.redacted(),
                "SendMessage answered without a message id",
            ));
        }
        Ok(())
    }
}

/// A FIFO deduplication id for `key`: the key itself when SQS takes it (up
/// to 128 characters of `a-zA-Z0-9` and punctuation), else its BLAKE3 hash
/// in hex, which is stable for the key.
fn dedup_id(key: &str) -> String {
    let fits = key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic());
    if fits {
        key.to_owned()
    } else {
        blake3::hash(key.as_bytes()).to_hex().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::dedup_id;

    #[test]
    fn a_key_sqs_cannot_take_as_a_deduplication_id_is_hashed() {
        assert_eq!(dedup_id("order-42/created"), "order-42/created");
        let spaced = dedup_id("order 42");
        assert_eq!(spaced.len(), 64);
        assert_eq!(spaced, dedup_id("order 42"));
        assert_eq!(dedup_id(&"k".repeat(129)).len(), 64);
    }
}
