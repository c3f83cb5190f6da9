//! A queue (RabbitMQ) or a stream (NATS JetStream) of the test's own, with a
//! random name, deleted when the test ends.

use std::future::Future;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use idem_broker::consume::{
    AmqpTransport, KeyRule, KeySource, NatsOptions, NatsTransport, Transport,
};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use super::suffix;

/// A broker the scenarios run against.
pub trait Broker: Sized + Send + Sync + 'static {
    /// Its transport.
    type Transport: Transport;
    /// What it calls itself in test output.
    const NAME: &'static str;

    /// A fresh queue or stream, or `None` when the broker is missing.
    fn start() -> impl Future<Output = Option<Self>> + Send;
    /// The same queue or stream, seen from a child process (not deleted by it).
    fn from_env() -> impl Future<Output = Self> + Send;
    /// What a child process needs to find it.
    fn env(&self) -> Vec<(&'static str, String)>;
    /// Publishes `payload` with `key` where the consumer's key rule finds it
    /// (or no key).
    fn publish(&self, key: Option<&str>, payload: &[u8]) -> impl Future<Output = ()> + Send;
    /// A consumer's transport.
    fn transport(&self) -> impl Future<Output = Self::Transport> + Send;
    /// Where its consumers take keys from.
    fn key_rule(&self) -> KeyRule;
}

fn amqp_url() -> String {
    std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn nats_url() -> String {
    std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A RabbitMQ queue of the test's own (classic, or quorum for delivery counts).
pub struct Rabbit {
    pub url: String,
    pub queue: String,
    _connection: Connection,
    channel: lapin::Channel,
    owner: bool,
}

impl Rabbit {
    /// A queue of the given type (`classic` or `quorum`).
    pub async fn declare(kind: &str) -> Option<Self> {
        let url = amqp_url();
        let connection = match Connection::connect(&url, ConnectionProperties::default()).await {
            Ok(connection) => connection,
            Err(error) => {
                idem_testkit::services::missing_service("RabbitMQ", &error.to_string());
                return None;
            }
        };
        let queue = format!("idem-t-{}", suffix());
        let channel = connection.create_channel().await.expect("channel");
        let mut arguments = FieldTable::default();
        arguments.insert("x-queue-type".into(), AMQPValue::LongString(kind.into()));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await
            .expect("declare the test queue");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("publisher confirms");
        Some(Self {
            url,
            queue,
            _connection: connection,
            channel,
            owner: true,
        })
    }

    async fn attach(queue: String) -> Self {
        let url = amqp_url();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let channel = connection.create_channel().await.expect("channel");
        Self {
            url,
            queue,
            _connection: connection,
            channel,
            owner: false,
        }
    }
}

impl Broker for Rabbit {
    type Transport = AmqpTransport;
    const NAME: &'static str = "amqp";

    async fn start() -> Option<Self> {
        Self::declare("classic").await
    }

    async fn from_env() -> Self {
        Self::attach(std::env::var("IDEM_T_QUEUE").expect("IDEM_T_QUEUE")).await
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("IDEM_T_QUEUE", self.queue.clone())]
    }

    async fn publish(&self, key: Option<&str>, payload: &[u8]) {
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        if let Some(key) = key {
            properties = properties.with_message_id(key.into());
        }
        self.channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                payload,
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("publish confirmed");
    }

    async fn transport(&self) -> AmqpTransport {
        AmqpTransport::connect(&self.url, &self.queue, 32)
            .await
            .expect("consume the test queue")
    }

    fn key_rule(&self) -> KeyRule {
        KeyRule::new(KeySource::MessageId)
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        // A connection of its own, on a runtime of its own: the test's runtime
        // may be the one blocked in this drop.
        let (url, queue) = (self.url.clone(), self.queue.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let deleted = async {
                    let connection =
                        Connection::connect(&url, ConnectionProperties::default()).await?;
                    let channel = connection.create_channel().await?;
                    channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await?;
                    connection.close(200, "test over".into()).await
                }
                .await;
                if deleted.is_err() {
                    eprintln!("could not delete test queue {queue}");
                }
            });
        })
        .join();
    }
}

/// A JetStream stream of the test's own; its consumer is `worker`.
///
/// Keys travel in an `Idem-Key` header here, not in `Nats-Msg-Id`: the
/// tests publish true duplicates, which JetStream's own dedupe window would
/// otherwise drop before any consumer saw them.
pub struct Jet {
    pub url: String,
    pub stream: String,
    pub subject: String,
    js: jetstream::Context,
    owner: bool,
}

/// The durable consumer the tests use.
pub const WORKER: &str = "worker";

impl Jet {
    async fn connect() -> Option<jetstream::Context> {
        match async_nats::connect(nats_url()).await {
            Ok(client) => Some(jetstream::new(client)),
            Err(error) => {
                idem_testkit::services::missing_service("NATS", &error.to_string());
                None
            }
        }
    }

    /// Publishes with `Nats-Msg-Id` set (JetStream dedupes a repeat of it).
    pub async fn publish_with_msg_id(&self, id: &str, payload: &[u8]) {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        self.js
            .publish_with_headers(self.subject.clone(), headers, payload.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("publish acknowledged");
    }
}

impl Broker for Jet {
    type Transport = NatsTransport;
    const NAME: &'static str = "nats";

    async fn start() -> Option<Self> {
        let js = Self::connect().await?;
        let name = suffix();
        let stream = format!("IDEM_T_{}", name.to_uppercase());
        let subject = format!("idem-t.{name}");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            ..jetstream::stream::Config::default()
        })
        .await
        .expect("create the test stream");
        Some(Self {
            url: nats_url(),
            stream,
            subject,
            js,
            owner: true,
        })
    }

    async fn from_env() -> Self {
        let js = Self::connect().await.expect("NATS");
        Self {
            url: nats_url(),
            stream: std::env::var("IDEM_T_STREAM").expect("IDEM_T_STREAM"),
            subject: std::env::var("IDEM_T_SUBJECT").expect("IDEM_T_SUBJECT"),
            js,
            owner: false,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_T_STREAM", self.stream.clone()),
            ("IDEM_T_SUBJECT", self.subject.clone()),
        ]
    }

    async fn publish(&self, key: Option<&str>, payload: &[u8]) {
        let mut headers = HeaderMap::new();
        headers.insert("Content-Type", "application/json");
        if let Some(key) = key {
            headers.insert("Idem-Key", key);
        }
        self.js
            .publish_with_headers(self.subject.clone(), headers, payload.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("publish acknowledged");
    }

    async fn transport(&self) -> NatsTransport {
        let options = NatsOptions {
            ack_wait: Duration::from_secs(2),
            prefetch: 64,
        };
        NatsTransport::connect(&self.url, &self.stream, WORKER, options)
            .await
            .expect("consume the test stream")
    }

    fn key_rule(&self) -> KeyRule {
        KeyRule::new(KeySource::Header("Idem-Key".into()))
    }
}

impl Drop for Jet {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let (url, stream) = (self.url.clone(), self.stream.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let deleted = match async_nats::connect(url).await {
                    Ok(client) => jetstream::new(client).delete_stream(&stream).await.is_ok(),
                    Err(_) => false,
                };
                if !deleted {
                    eprintln!("could not delete test stream {stream}");
                }
            });
        })
        .join();
    }
}
