//! The queues `idem bench consume` consumes from: a RabbitMQ queue, a NATS
//! JetStream stream, a Kafka topic or an SQS queue per phase, declared for
//! the run, filled with keyed messages (AMQP `message_id`, `Nats-Msg-Id`,
//! Kafka's `idempotency-key` header, SQS's `idempotency-key` attribute)
//! before the clock starts, and deleted after (Kafka topics are kept: see
//! [`BenchBroker::delete`]).

use anyhow::Context;
use idem_broker::consume::Source;

use crate::args::{BenchConsumeArgs, BrokerArg};

/// A queue or stream made for one phase.
pub(super) struct BenchQueue {
    /// Where the consumers read it.
    pub(super) source: Source,
    name: String,
}

/// The broker of a run; `run` names the run's queues.
pub(super) enum BenchBroker {
    Amqp {
        url: String,
        run: u32,
    },
    Nats {
        url: String,
        run: u32,
    },
    Kafka {
        brokers: String,
        partitions: i32,
        run: u32,
    },
    Sqs {
        endpoint: String,
        region: String,
        run: u32,
    },
}

impl BenchBroker {
    /// The broker `args` asks for.
    pub(super) fn new(args: &BenchConsumeArgs, run: u32) -> Self {
        match args.broker {
            BrokerArg::Amqp => Self::Amqp {
                url: args.amqp_url.clone(),
                run,
            },
            BrokerArg::Nats => Self::Nats {
                url: args.nats_url.clone(),
                run,
            },
            BrokerArg::Kafka => Self::Kafka {
                brokers: args.kafka_brokers.clone(),
                partitions: args.kafka_partitions.max(1),
                run,
            },
            BrokerArg::Sqs => Self::Sqs {
                endpoint: args.sqs_endpoint.clone(),
                region: args.sqs_region.clone(),
                run,
            },
        }
    }

    /// The broker's name, as printed.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Self::Amqp { .. } => "RabbitMQ",
            Self::Nats { .. } => "NATS JetStream",
            Self::Kafka { .. } => "Kafka",
            Self::Sqs { .. } => "Amazon SQS",
        }
    }

    /// Declares a durable queue (or creates a stream) for the phase `tag`.
    pub(super) async fn declare(&self, tag: &str) -> anyhow::Result<BenchQueue> {
        match self {
            Self::Amqp { url, run } => {
                let name = format!("idem-bench-{run:08x}-{tag}");
                let connection = amqp::connect(url).await?;
                let channel = connection.create_channel().await?;
                channel
                    .queue_declare(
                        name.as_str().into(),
                        amqp::QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        amqp::FieldTable::default(),
                    )
                    .await
                    .with_context(|| format!("cannot declare queue {name}"))?;
                connection.close(200, "declared".into()).await.ok();
                Ok(BenchQueue {
                    source: Source::Amqp {
                        url: url.clone(),
                        queue: name.clone(),
                    },
                    name,
                })
            }
            Self::Nats { url, run } => {
                let name = format!("IDEM_BENCH_{run:08X}_{}", tag.to_uppercase());
                let js = nats_context(url).await?;
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("idem-bench.{run:08x}.{tag}")],
                    // Inside the dedupe window: the consumer's start-up check.
                    max_age: std::time::Duration::from_secs(24 * 3600),
                    ..Default::default()
                })
                .await
                .with_context(|| format!("cannot create stream {name}"))?;
                Ok(BenchQueue {
                    source: Source::Nats {
                        url: url.clone(),
                        stream: name.clone(),
                        consumer: "bench".into(),
                    },
                    name,
                })
            }
            Self::Kafka {
                brokers,
                partitions,
                run,
            } => {
                let name = format!("idem-bench-{run:08x}-{tag}");
                kafka::create_topic(brokers, &name, *partitions).await?;
                Ok(BenchQueue {
                    source: Source::Kafka {
                        brokers: brokers.clone(),
                        topic: name.clone(),
                        group: name.clone(),
                        settings: idem_broker::kafka::Settings::new(),
                    },
                    name,
                })
            }
            Self::Sqs {
                endpoint,
                region,
                run,
            } => {
                let name = format!("idem-bench-{run:08x}-{tag}");
                sqs::client(endpoint, region)
                    .await
                    .create_queue()
                    .queue_name(&name)
                    .send()
                    .await
                    .with_context(|| format!("cannot create SQS queue {name} at {endpoint}"))?;
                Ok(BenchQueue {
                    source: sqs::source(endpoint, region, &name)?
                        .parse()
                        .context("the SQS source")?,
                    name,
                })
            }
        }
    }

    /// Publishes `messages` messages with the bodies `body(i)`, each with its
    /// own key, and waits until the broker confirmed them all.
    pub(super) async fn fill(
        &self,
        queue: &BenchQueue,
        tag: &str,
        messages: usize,
        body: impl Fn(usize) -> Vec<u8>,
    ) -> anyhow::Result<()> {
        match self {
            Self::Amqp { url, run } => {
                let connection = amqp::connect(url).await?;
                let channel = connection.create_channel().await?;
                channel
                    .confirm_select(amqp::ConfirmSelectOptions::default())
                    .await?;
                for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
                    let mut confirms = Vec::with_capacity(chunk.len());
                    for &i in chunk {
                        let properties = amqp::BasicProperties::default()
                            .with_message_id(format!("bench-{run:08x}-{tag}-{i}").into())
                            .with_delivery_mode(2);
                        confirms.push(
                            channel
                                .basic_publish(
                                    "".into(),
                                    queue.name.as_str().into(),
                                    amqp::BasicPublishOptions::default(),
                                    &body(i),
                                    properties,
                                )
                                .await?,
                        );
                    }
                    for confirm in futures::future::join_all(confirms).await {
                        confirm?;
                    }
                }
                connection.close(200, "filled".into()).await.ok();
            }
            Self::Nats { url, run } => {
                let js = nats_context(url).await?;
                let subject = format!("idem-bench.{run:08x}.{tag}");
                for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
                    let mut acks = Vec::with_capacity(chunk.len());
                    for &i in chunk {
                        let mut headers = async_nats::HeaderMap::new();
                        headers
                            .insert("Nats-Msg-Id", format!("bench-{run:08x}-{tag}-{i}").as_str());
                        acks.push(
                            js.publish_with_headers(subject.clone(), headers, body(i).into())
                                .await?,
                        );
                    }
                    for ack in futures::future::join_all(
                        acks.into_iter().map(std::future::IntoFuture::into_future),
                    )
                    .await
                    {
                        ack?;
                    }
                }
            }
            Self::Kafka { brokers, run, .. } => {
                kafka::fill(brokers, &queue.name, messages, |i| {
                    (format!("bench-{run:08x}-{tag}-{i}"), body(i))
                })
                .await?;
            }
            Self::Sqs {
                endpoint,
                region,
                run,
            } => {
                let client = sqs::client(endpoint, region).await;
                sqs::fill(&client, &queue.name, messages, |i| {
                    (format!("bench-{run:08x}-{tag}-{i}"), body(i))
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Deletes the queue or stream; a failure is only warned about.
    pub(super) async fn delete(&self, queue: &BenchQueue) {
        let deleted: anyhow::Result<()> = async {
            match self {
                Self::Amqp { url, .. } => {
                    let connection = amqp::connect(url).await?;
                    let channel = connection.create_channel().await?;
                    channel
                        .queue_delete(queue.name.as_str().into(), Default::default())
                        .await?;
                    connection.close(200, "deleted".into()).await.ok();
                }
                Self::Nats { url, .. } => {
                    nats_context(url).await?.delete_stream(&queue.name).await?;
                }
                // Kept: deleting a topic has crashed the Kafka-protocol broker
                // the benchmark was measured on. Its name carries the run's id.
                Self::Kafka { .. } => {}
                Self::Sqs {
                    endpoint, region, ..
                } => {
                    let client = sqs::client(endpoint, region).await;
                    let url = client
                        .get_queue_url()
                        .queue_name(&queue.name)
                        .send()
                        .await?
                        .queue_url
                        .unwrap_or_default();
                    client.delete_queue().queue_url(url).send().await?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(error) = deleted {
            eprintln!("warning: could not delete {}: {error:#}", queue.name);
        }
    }
}

async fn nats_context(url: &str) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("cannot connect to NATS at {url}"))?;
    Ok(async_nats::jetstream::new(client))
}

mod amqp {
    pub(super) use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    };
    pub(super) use lapin::types::FieldTable;
    pub(super) use lapin::{BasicProperties, Connection};

    pub(super) async fn connect(url: &str) -> anyhow::Result<Connection> {
        use anyhow::Context;
        Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .with_context(|| format!("cannot connect to RabbitMQ at {url}"))
    }
}

mod kafka {
    use std::time::Duration;

    use anyhow::Context;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    fn admin(brokers: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .with_context(|| format!("cannot make a Kafka admin client for {brokers}"))
    }

    pub(super) async fn create_topic(
        brokers: &str,
        name: &str,
        partitions: i32,
    ) -> anyhow::Result<()> {
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in admin(brokers)?
            .create_topics([&topic], &options)
            .await
            .with_context(|| format!("cannot reach Kafka at {brokers}"))?
        {
            result
                .map_err(|(topic, code)| anyhow::anyhow!("cannot create topic {topic}: {code}"))?;
        }
        Ok(())
    }

    /// Produces `messages` records, each with its key in the
    /// `idempotency-key` header, with the idempotent producer.
    pub(super) async fn fill(
        brokers: &str,
        topic: &str,
        messages: usize,
        record: impl Fn(usize) -> (String, Vec<u8>),
    ) -> anyhow::Result<()> {
        let producer: FutureProducer = idem_broker::kafka::Settings::new()
            .set("linger.ms", "5")
            .producer(brokers)?
            .create()?;
        for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
            let records: Vec<_> = chunk.iter().map(|&i| record(i)).collect();
            let sends = records.iter().map(|(key, body)| {
                let headers = OwnedHeaders::new().insert(Header {
                    key: idem_broker::kafka::KEY_HEADER,
                    value: Some(key.as_str()),
                });
                producer.send(
                    FutureRecord::<(), [u8]>::to(topic)
                        .payload(body.as_slice())
                        .headers(headers),
                    Duration::from_secs(30),
                )
            });
            for sent in futures::future::join_all(sends).await {
                sent.map_err(|(error, _)| error)
                    .with_context(|| format!("cannot produce to {topic}"))?;
            }
        }
        Ok(())
    }
}

mod sqs {
    use std::collections::HashMap;

    use anyhow::Context;
    use aws_sdk_sqs::config::Region;
    use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

    /// A client for `endpoint`, credentials from the AWS chain.
    pub(super) async fn client(endpoint: &str, region: &str) -> aws_sdk_sqs::Client {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .endpoint_url(endpoint)
            .region(Region::new(region.to_owned()))
            .load()
            .await;
        aws_sdk_sqs::Client::new(&config)
    }

    /// The source URL of queue `name` at `endpoint`.
    pub(super) fn source(endpoint: &str, region: &str, name: &str) -> anyhow::Result<String> {
        let url = url::Url::parse(endpoint).context("--sqs-endpoint is not a URL")?;
        let scheme = match url.scheme() {
            "http" => "sqs+http",
            "https" => "sqs",
            other => anyhow::bail!("--sqs-endpoint: http:// or https://, not {other}://"),
        };
        let host = url.host_str().context("--sqs-endpoint names no host")?;
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        Ok(format!("{scheme}://{host}{port}/{name}?region={region}"))
    }

    /// Sends `messages` messages, ten per `SendMessageBatch`, each with its
    /// key in the `idempotency-key` attribute.
    pub(super) async fn fill(
        client: &aws_sdk_sqs::Client,
        queue: &str,
        messages: usize,
        record: impl Fn(usize) -> (String, Vec<u8>),
    ) -> anyhow::Result<()> {
        let queue_url = client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await?
            .queue_url
            .context("no queue URL")?;
        let indexes: Vec<usize> = (0..messages).collect();
        for requests in indexes.chunks(10 * 16) {
            let sends = requests.chunks(10).map(|chunk| {
                let entries = chunk
                    .iter()
                    .map(|&i| {
                        let (key, body) = record(i);
                        let key = MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(key)
                            .build()
                            .expect("data type is set");
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(String::from_utf8_lossy(&body))
                            .set_message_attributes(Some(HashMap::from([(
                                "idempotency-key".to_owned(),
                                key,
                            )])))
                            .build()
                            .expect("id and body are set")
                    })
                    .collect::<Vec<_>>();
                client
                    .send_message_batch()
                    .queue_url(&queue_url)
                    .set_entries(Some(entries))
                    .send()
            });
            for sent in futures::future::join_all(sends).await {
                let sent = sent.with_context(|| format!("cannot send to {queue}"))?;
                if let Some(failed) = sent.failed().first() {
                    anyhow::bail!(
                        "SQS refused a message: {} {}",
                        failed.code(),
                        failed.message().unwrap_or_default()
                    );
                }
            }
        }
        Ok(())
    }
}
