//! What several process-level tests share: the store a test runs on
//! ([`store`]), a RabbitMQ queue of the test's own, and free loopback ports.

// Each test binary uses a part of this module.
#![allow(dead_code)]

pub(crate) mod store;

use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// The shared RabbitMQ the tests declare their queues on.
pub(crate) const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A free loopback port.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether the shared RabbitMQ answers (reported, or a failure when services
/// are required, when it does not).
pub(crate) async fn rabbitmq_answers() -> bool {
    match Connection::connect(AMQP_URL, ConnectionProperties::default()).await {
        Ok(_) => true,
        Err(error) => {
            idem_testkit::services::missing_service("RabbitMQ", &error.to_string());
            false
        }
    }
}

/// A queue of the test's own on the shared RabbitMQ, deleted by
/// [`TestQueue::delete`].
pub(crate) struct TestQueue {
    _connection: Connection,
    channel: Channel,
    /// The queue's name.
    pub(crate) name: String,
}

impl TestQueue {
    /// Declares a queue named `prefix` and a unique suffix, or `None` (after
    /// reporting it, or failing when services are required) when RabbitMQ
    /// does not answer.
    pub(crate) async fn declare(prefix: &str) -> Option<TestQueue> {
        let connection = match Connection::connect(AMQP_URL, ConnectionProperties::default()).await
        {
            Ok(connection) => connection,
            Err(error) => {
                idem_testkit::services::missing_service("RabbitMQ", &error.to_string());
                return None;
            }
        };
        let channel = connection.create_channel().await.unwrap();
        let name = format!("{prefix}-{}", free_port());
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Some(TestQueue {
            _connection: connection,
            channel,
            name,
        })
    }

    /// Publishes `{}` with message id `key` and waits for the broker's confirm.
    pub(crate) async fn publish(&self, key: &str) {
        self.channel
            .basic_publish(
                "".into(),
                self.name.as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                BasicProperties::default().with_message_id(key.into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Deletes the queue.
    pub(crate) async fn delete(self) {
        self.channel
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}
