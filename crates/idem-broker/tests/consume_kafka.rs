//! The consumer runtime against a real Kafka-protocol broker, on SQLite and
//! PostgreSQL: each test creates a topic and a consumer group of its own.

mod consumer_support;

use consumer_support::Kafka;

consumer_tests!(Kafka);
