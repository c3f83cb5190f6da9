//! Consume-transform-produce inside one Kafka transaction.
//!
//! Placeholder replaced below.
