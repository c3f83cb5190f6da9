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
pub(crate) trait Broker: Sized + Send + Sync + 'static {
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
pub(crate) struct Rabbit {
    pub url: String,
    pub queue: String,
    _connection: Connection,
    channel: lapin::Channel,
    owner: bool,
}

impl Rabbit {
    /// A queue of the given type (`classic` or `quorum`).
    pub(crate) async fn declare(kind: &str) -> Option<Self> {
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
pub(crate) struct Jet {
    pub url: String,
    pub stream: String,
    pub subject: String,
    js: jetstream::Context,
    owner: bool,
}

/// The durable consumer the tests use.
pub(crate) const WORKER: &str = "worker";

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

    /// A stream of its own keeping messages for `max_age` (zero: forever).
    pub(crate) async fn with_max_age(max_age: Duration) -> Option<Self> {
        let js = Self::connect().await?;
        let name = suffix();
        let stream = format!("IDEM_T_{}", name.to_uppercase());
        let subject = format!("idem-t.{name}");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            max_age,
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

    /// Publishes with `Nats-Msg-Id` set (JetStream dedupes a repeat of it).
    pub(crate) async fn publish_with_msg_id(&self, id: &str, payload: &[u8]) {
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
        // Inside the dedupe window, so a consumer's start-up check passes.
        Self::with_max_age(Duration::from_secs(24 * 3600)).await
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

fn kafka_brokers() -> String {
    std::env::var("IDEM_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// The librdkafka settings of the tests' consumers: a dead member leaves the
/// group after 6 s instead of 45 s.
pub(crate) fn kafka_test_settings() -> idem_broker::kafka::Settings {
    let settings = idem_broker::kafka::Settings::new()
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    match std::env::var("IDEM_T_KAFKA_DEBUG") {
        Ok(debug) => settings.set("debug", debug),
        Err(_) => settings,
    }
}

/// A Kafka topic of the test's own (2 partitions) and a consumer group of
/// its own. Keys travel in the `idempotency-key` header, the default rule.
pub(crate) struct Kafka {
    pub brokers: String,
    pub topic: String,
    pub group: String,
    producer: rdkafka::producer::FutureProducer,
    owner: bool,
}

impl Kafka {
    /// A fresh topic with `partitions` partitions, or `None` when no broker answers.
    pub(crate) async fn with_partitions(partitions: i32) -> Option<Self> {
        Self::create(partitions, &[]).await
    }

    /// A fresh topic with these topic settings (`retention.ms`, ...).
    pub(crate) async fn create(partitions: i32, settings: &[(&str, &str)]) -> Option<Self> {
        Self::create_at(kafka_brokers(), partitions, settings).await
    }

    /// A fresh topic on the broker at `brokers`.
    pub(crate) async fn create_at(
        brokers: String,
        partitions: i32,
        settings: &[(&str, &str)],
    ) -> Option<Self> {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .try_init();
        }
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;

        let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("Kafka admin client");
        let name = format!("idem-t-{}", suffix());
        let mut topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
        for (key, value) in settings {
            topic = topic.set(key, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        match admin.create_topics([&topic], &options).await {
            Ok(results) => {
                for result in results {
                    result.expect("create the test topic");
                }
            }
            Err(error) => {
                idem_testkit::services::missing_service("Kafka", &error.to_string());
                return None;
            }
        }
        Some(Self::attach(brokers, name.clone(), name, true))
    }

    fn attach(brokers: String, topic: String, group: String, owner: bool) -> Self {
        let producer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .create()
            .expect("Kafka producer");
        Self {
            brokers,
            topic,
            group,
            producer,
            owner,
        }
    }

    /// A transport with these options (the test settings added).
    pub(crate) async fn transport_with(
        &self,
        mut options: idem_broker::consume::KafkaOptions,
    ) -> idem_broker::consume::KafkaTransport {
        for (name, value) in kafka_test_settings().iter() {
            options.settings = options.settings.set(name, value);
        }
        idem_broker::consume::KafkaTransport::connect(
            &self.brokers,
            &self.topic,
            &self.group,
            options,
        )
        .await
        .expect("consume the test topic")
    }

    /// Publishes with a record key (records with one key share a partition).
    pub(crate) async fn publish_keyed(&self, record_key: &str, key: Option<&str>, payload: &[u8]) {
        self.send(Some(record_key), key, payload).await;
    }

    async fn send(&self, record_key: Option<&str>, key: Option<&str>, payload: &[u8]) {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::FutureRecord;

        let mut headers = OwnedHeaders::new().insert(Header {
            key: "content-type",
            value: Some("application/json"),
        });
        if let Some(key) = key {
            headers = headers.insert(Header {
                key: "idempotency-key",
                value: Some(key),
            });
        }
        let mut record = FutureRecord::<str, [u8]>::to(&self.topic)
            .payload(payload)
            .headers(headers);
        if let Some(record_key) = record_key {
            record = record.key(record_key);
        }
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("produce to the test topic");
    }
}

impl Broker for Kafka {
    type Transport = idem_broker::consume::KafkaTransport;
    const NAME: &'static str = "kafka";

    async fn start() -> Option<Self> {
        Self::with_partitions(2).await
    }

    async fn from_env() -> Self {
        Self::attach(
            kafka_brokers(),
            std::env::var("IDEM_T_TOPIC").expect("IDEM_T_TOPIC"),
            std::env::var("IDEM_T_GROUP").expect("IDEM_T_GROUP"),
            false,
        )
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_T_TOPIC", self.topic.clone()),
            ("IDEM_T_GROUP", self.group.clone()),
        ]
    }

    async fn publish(&self, key: Option<&str>, payload: &[u8]) {
        self.send(None, key, payload).await;
    }

    async fn transport(&self) -> idem_broker::consume::KafkaTransport {
        self.transport_with(idem_broker::consume::KafkaOptions {
            commit_interval: Duration::from_millis(20),
            ..idem_broker::consume::KafkaOptions::default()
        })
        .await
    }

    fn key_rule(&self) -> KeyRule {
        KeyRule::new(KeySource::MessageId)
    }
}

/// Test topics are deleted only when `IDEM_T_DELETE_TOPICS` is set: a topic
/// deleted while clients in other test processes refresh their metadata has
/// crashed librdkafka 2.12 (a segmentation fault in its metadata cache) on
/// the broker the tests run against. The broker's data directory holds them.
impl Drop for Kafka {
    fn drop(&mut self) {
        if !self.owner || std::env::var_os("IDEM_T_DELETE_TOPICS").is_none() {
            return;
        }
        let (brokers, topic) = (self.brokers.clone(), self.topic.clone());
        let _ = std::thread::spawn(move || {
            use rdkafka::admin::{AdminClient, AdminOptions};
            use rdkafka::client::DefaultClientContext;

            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let admin: Result<AdminClient<DefaultClientContext>, _> =
                    rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", &brokers)
                        .create();
                let deleted = match admin {
                    Ok(admin) => admin
                        .delete_topics(&[&topic], &AdminOptions::new())
                        .await
                        .is_ok(),
                    Err(_) => false,
                };
                if !deleted {
                    eprintln!("could not delete test topic {topic}");
                }
            });
        })
        .join();
    }
}
