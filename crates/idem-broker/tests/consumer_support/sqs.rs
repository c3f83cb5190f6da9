//! An SQS queue of the test's own on the SQS-compatible server the test
//! command starts (moto's, `IDEM_TEST_SQS_ENDPOINT`, default
//! `http://127.0.0.1:5000`), reached through the SDK exactly as Amazon's
//! would be: an endpoint override and dummy credentials. Deleted when the
//! test ends.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use idem_broker::consume::{KeyRule, SqsOptions, SqsTransport};

use super::brokers::Broker;
use super::suffix;

/// The server's endpoint.
pub(crate) fn endpoint() -> String {
    std::env::var("IDEM_TEST_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:5000".to_owned())
}

/// An SDK client for the test server: dummy credentials, any region.
pub(crate) fn client() -> aws_sdk_sqs::Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(http)
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint())
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// The URL the transport and publisher take for `queue` on the test server.
pub(crate) fn queue_url(queue: &str) -> String {
    let endpoint = endpoint();
    let host = endpoint
        .strip_prefix("http://")
        .unwrap_or(&endpoint)
        .trim_end_matches('/');
    format!("sqs+http://test:test@{host}/{queue}?region=us-east-1")
}

/// The options of the tests' consumers: a short visibility timeout (so a
/// message given up by a crashed consumer comes back in seconds) and short
/// polls.
pub(crate) fn options() -> SqsOptions {
    SqsOptions {
        visibility: Duration::from_secs(2),
        wait: Duration::from_secs(1),
        ..SqsOptions::default()
    }
}

/// A queue of the test's own.
pub(crate) struct Sqs {
    /// The queue's URL for the transport and the publisher (`sqs+http://…`).
    pub url: String,
    /// The queue's name.
    pub queue: String,
    /// The server's URL of the queue, for the SDK.
    pub queue_url: String,
    pub client: aws_sdk_sqs::Client,
    pub options: SqsOptions,
    owner: bool,
}

impl Sqs {
    /// A queue with these attributes; a FIFO queue when `fifo`.
    pub(crate) async fn create(
        fifo: bool,
        attributes: &[(QueueAttributeName, String)],
    ) -> Option<Self> {
        let client = client();
        let queue = if fifo {
            format!("idem-t-{}.fifo", suffix())
        } else {
            format!("idem-t-{}", suffix())
        };
        let mut create = client.create_queue().queue_name(&queue);
        if fifo {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (name, value) in attributes {
            create = create.attributes(name.clone(), value);
        }
        let queue_url = match create.send().await {
            Ok(created) => created.queue_url.expect("a queue URL"),
            Err(error) => {
                idem_testkit::services::missing_service(
                    "SQS (moto's server on IDEM_TEST_SQS_ENDPOINT)",
                    &format!("{error:?}"),
                );
                return None;
            }
        };
        Some(Self {
            url: queue_url_for(&queue),
            queue,
            queue_url,
            client,
            options: options(),
            owner: true,
        })
    }

    /// Sends `payload` with these message attributes and, on a FIFO queue,
    /// this group and deduplication id.
    pub(crate) async fn send(
        &self,
        payload: &[u8],
        attributes: &[(&str, &str)],
        fifo: Option<(&str, &str)>,
    ) {
        let attributes: HashMap<String, MessageAttributeValue> = attributes
            .iter()
            .map(|(name, value)| {
                (
                    (*name).to_owned(),
                    MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(*value)
                        .build()
                        .expect("attribute"),
                )
            })
            .collect();
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(std::str::from_utf8(payload).expect("text payload"))
            .set_message_attributes((!attributes.is_empty()).then_some(attributes));
        if let Some((group, dedup)) = fifo {
            send = send.message_group_id(group).message_deduplication_id(dedup);
        }
        send.send().await.expect("send to SQS");
    }

    /// Messages visible or in flight, as the server counts them.
    pub(crate) async fn depth(&self) -> (u64, u64) {
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .expect("queue attributes")
            .attributes
            .unwrap_or_default();
        let read = |name: &QueueAttributeName| {
            attributes
                .get(name)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (
            read(&QueueAttributeName::ApproximateNumberOfMessages),
            read(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }

    /// A transport with `options`.
    pub(crate) async fn transport_with(&self, options: SqsOptions) -> SqsTransport {
        SqsTransport::connect(&self.url, options)
            .await
            .expect("consume the test queue")
    }
}

fn queue_url_for(queue: &str) -> String {
    queue_url(queue)
}

impl Broker for Sqs {
    type Transport = SqsTransport;
    const NAME: &'static str = "sqs";

    async fn start() -> Option<Self> {
        Self::create(false, &[]).await
    }

    async fn from_env() -> Self {
        let queue = std::env::var("IDEM_T_SQS_QUEUE").expect("IDEM_T_SQS_QUEUE");
        let client = client();
        let queue_url = client
            .get_queue_url()
            .queue_name(&queue)
            .send()
            .await
            .expect("find the test queue")
            .queue_url
            .expect("a queue URL");
        Self {
            url: queue_url_for(&queue),
            queue,
            queue_url,
            client,
            options: options(),
            owner: false,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("IDEM_T_SQS_QUEUE", self.queue.clone())]
    }

    async fn publish(&self, key: Option<&str>, payload: &[u8]) {
        let mut attributes = vec![("content-type", "application/json")];
        if let Some(key) = key {
            attributes.push(("idempotency-key", key));
        }
        self.send(payload, &attributes, None).await;
    }

    async fn transport(&self) -> SqsTransport {
        self.transport_with(self.options).await
    }

    fn key_rule(&self) -> KeyRule {
        KeyRule::default()
    }
}

impl Drop for Sqs {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let queue_url = self.queue_url.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                if client()
                    .delete_queue()
                    .queue_url(&queue_url)
                    .send()
                    .await
                    .is_err()
                {
                    eprintln!("could not delete test queue {queue_url}");
                }
            });
        })
        .join();
    }
}
