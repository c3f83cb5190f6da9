//! Kafka: where a `kafka://` URL names brokers and a topic, the settings
//! Idem insists on, and the header the key travels in; with the `kafka`
//! feature, the clients' configurations (`connect`), why the brokers could
//! not be reached (`refusal`), the consumer transport (`consume`: offsets
//! committed after the effect), the idempotent publisher (`publish`), and
//! consume-transform-produce inside a Kafka transaction ([`transact`]).
//!
//! Kafka's own exactly-once (the idempotent producer, transactions,
//! `read_committed` readers) covers writes to Kafka and consumer offsets, and
//! nothing else: a database write or a payment call made while handling a
//! record is outside it. Those effects go through Idem's store, whose record
//! commits with the effect; the offset is committed after that
//! ([`crate::consume`]). For pipelines that only read from Kafka and write to
//! Kafka, [`transact`] runs consume-transform-produce inside one Kafka
//! transaction.
//!
//! The URL and [`Settings`] are read in every build, so a destination or a
//! source parses whatever the features; the rest of this folder needs the
//! `kafka` feature.

#[cfg(feature = "kafka")]
mod connect;
#[cfg(feature = "kafka")]
pub(crate) mod consume;
#[cfg(feature = "kafka")]
pub(crate) mod publish;
#[cfg(feature = "kafka")]
mod refusal;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod transact;

mod settings;

pub use settings::{Settings, UnsafeSetting};

/// The record header that carries a message's idempotency key.
pub const KEY_HEADER: &str = "idempotency-key";

/// A `kafka://` URL taken apart: the brokers, the path's segments
/// (percent-decoded), and the query's pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KafkaUrl {
    pub(crate) brokers: String,
    pub(crate) path: Vec<String>,
    pub(crate) query: Vec<(String, String)>,
}

impl KafkaUrl {
    /// Parses `kafka://HOST:PORT[,HOST:PORT...]/PATH[?QUERY]`; the error says
    /// what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let rest = text
            .strip_prefix("kafka://")
            .ok_or_else(|| "not a kafka:// URL".to_owned())?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (brokers, path) = rest.split_once('/').unwrap_or((rest, ""));
        if brokers.is_empty() || brokers.split(',').any(|b| b.trim().is_empty()) {
            return Err("names no broker; write kafka://HOST:PORT[,HOST:PORT]/...".into());
        }
        if brokers.contains('@') {
            return Err(
                "Kafka takes no user-info in the URL; give sasl.username and sasl.password as query settings"
                    .into(),
            );
        }
        let path = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| {
                // Decoded as a form value, the way `Display` encodes it; a
                // literal `&` is part of the segment, not a pair separator.
                let s = s.replace('&', "%26");
                url::form_urlencoded::parse(format!("x={s}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            })
            .collect();
        let query = url::form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Ok(Self {
            brokers: brokers.to_owned(),
            path,
            query,
        })
    }
}
