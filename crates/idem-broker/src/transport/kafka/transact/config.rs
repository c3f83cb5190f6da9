//! [`PipeConfig`] and the client configurations a pipe is built from.

use std::time::Duration;

use rdkafka::ClientConfig;

use super::super::Settings;
use super::PipeError;

/// What a [`TransactionalPipe`](super::TransactionalPipe) reads, writes, and how it batches.
///
/// Build it with [`PipeConfig::new`] and change the defaults with struct
/// update syntax: `PipeConfig { batch_size: 100, ..PipeConfig::new(...) }`.
#[derive(Debug, Clone)]
pub struct PipeConfig {
    /// The brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic read.
    pub input_topic: String,
    /// The consumer group; its committed offsets move only inside the pipe's
    /// transactions.
    pub group: String,
    /// The topics the transform may write to. Checked to exist at start; an
    /// output to any other topic stops the pipe (after aborting its
    /// transaction), so a typo cannot create topics or write elsewhere.
    pub output_topics: Vec<String>,
    /// The producer's `transactional.id`: stable for one instance across its
    /// restarts and distinct between instances running at once. Starting a
    /// pipe fences every older one with the same id.
    pub transactional_id: String,
    /// Records per transaction at most (default 500).
    pub batch_size: usize,
    /// How long a batch waits for more records after its first one before it
    /// is transacted anyway (default 100 ms).
    pub linger: Duration,
    /// The broker aborts a transaction left open longer than this
    /// (`transaction.timeout.ms`, default 60 s); also the bound on each
    /// blocking transactional call.
    pub transaction_timeout: Duration,
    /// The pause after an aborted transaction before its records are read
    /// again (default 1 s).
    pub retry_delay: Duration,
    /// Attempts in a row whose transform fails before the pipe stops
    /// (default 3).
    pub transform_attempts: u32,
    /// librdkafka settings on top of Idem's, given to both the consumer and
    /// the producer (checked: auto commits, a non-idempotent producer and
    /// `read_uncommitted` are refused).
    pub settings: Settings,
}

impl PipeConfig {
    /// A pipe reading `input_topic` in consumer group `group` on `brokers`
    /// and writing to `output_topics` as `transactional_id`, with the default
    /// batching and timeouts.
    pub fn new(
        brokers: impl Into<String>,
        input_topic: impl Into<String>,
        group: impl Into<String>,
        output_topics: impl IntoIterator<Item = impl Into<String>>,
        transactional_id: impl Into<String>,
    ) -> Self {
        Self {
            brokers: brokers.into(),
            input_topic: input_topic.into(),
            group: group.into(),
            output_topics: output_topics.into_iter().map(Into::into).collect(),
            transactional_id: transactional_id.into(),
            batch_size: 500,
            linger: Duration::from_millis(100),
            transaction_timeout: Duration::from_secs(60),
            retry_delay: Duration::from_secs(1),
            transform_attempts: 3,
            settings: Settings::new(),
        }
    }
}

/// The consumer's and the producer's configurations: Idem's checked settings,
/// `read_committed`, the transactional id and timeout.
pub(super) fn client_configs(
    config: &PipeConfig,
) -> Result<(ClientConfig, ClientConfig), PipeError> {
    let refuse = |what: String| Err(PipeError::Config(what));
    if config.transactional_id.trim().is_empty() {
        return refuse("the transactional.id is empty; give each running instance its own stable id, e.g. the pipeline's name and the instance's ordinal".into());
    }
    if config.output_topics.is_empty() {
        return refuse("no output topic; name the topics the transform writes to".into());
    }
    if config.batch_size == 0 {
        return refuse("batch_size is 0; a transaction needs at least one record".into());
    }
    if config.transform_attempts == 0 {
        return refuse("transform_attempts is 0; give the transform at least one attempt".into());
    }
    for (name, value) in config.settings.iter() {
        let why = match name {
            "isolation.level" if value != "read_committed" => {
                "the pipe would transform records of transactions that later abort; leave it out (Idem reads read_committed)"
            }
            "transactional.id" => "give it as PipeConfig::transactional_id",
            "transaction.timeout.ms" => "give it as PipeConfig::transaction_timeout",
            _ => continue,
        };
        return refuse(format!("setting {name}={value} refused: {why}"));
    }
    let consumer = config
        .settings
        .consumer(&config.brokers, &config.group)
        .map_err(|e| PipeError::Config(e.to_string()))?;
    let mut producer = config
        .settings
        .producer(&config.brokers)
        .map_err(|e| PipeError::Config(e.to_string()))?;
    let transaction_ms = millis(config.transaction_timeout);
    // librdkafka refuses a message timeout longer than the transaction's: a
    // record must fail before the transaction it belongs to times out.
    // Idem's default is message.timeout.ms; a delivery.timeout.ms (its
    // alias) can only have come from the caller, so it wins.
    let message_ms = ["delivery.timeout.ms", "message.timeout.ms"]
        .iter()
        .find_map(|name| producer.get(name).and_then(|v| v.parse::<u64>().ok()))
        .map_or(transaction_ms, |ms| ms.min(transaction_ms));
    producer
        .remove("delivery.timeout.ms")
        .set("message.timeout.ms", message_ms.to_string())
        .set("transactional.id", &config.transactional_id)
        .set("transaction.timeout.ms", transaction_ms.to_string());
    Ok((consumer, producer))
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PipeConfig {
        PipeConfig::new("k:9092", "orders", "pricing", ["priced"], "pricing-0")
    }

    #[test]
    fn the_clients_read_committed_and_write_in_transactions() {
        let (consumer, producer) = client_configs(&config()).unwrap();
        assert_eq!(consumer.get("isolation.level"), Some("read_committed"));
        assert_eq!(consumer.get("enable.auto.commit"), Some("false"));
        assert_eq!(producer.get("transactional.id"), Some("pricing-0"));
        assert_eq!(producer.get("transaction.timeout.ms"), Some("60000"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(producer.get("message.timeout.ms"), Some("30000"));
    }

    #[test]
    fn a_record_times_out_before_its_transaction() {
        let short = PipeConfig {
            transaction_timeout: Duration::from_secs(5),
            settings: Settings::new().set("delivery.timeout.ms", "20000"),
            ..config()
        };
        let (_, producer) = client_configs(&short).unwrap();
        assert_eq!(producer.get("message.timeout.ms"), Some("5000"));
        assert_eq!(producer.get("delivery.timeout.ms"), None);
        let given = PipeConfig {
            settings: Settings::new().set("delivery.timeout.ms", "20000"),
            ..config()
        };
        let (_, producer) = client_configs(&given).unwrap();
        assert_eq!(producer.get("message.timeout.ms"), Some("20000"));
        assert_eq!(producer.get("delivery.timeout.ms"), None);
    }

    #[test]
    fn settings_that_break_the_transaction_are_refused() {
        for (name, value) in [
            ("isolation.level", "read_uncommitted"),
            ("transactional.id", "other"),
            ("transaction.timeout.ms", "1000"),
            ("enable.auto.commit", "true"),
            ("enable.idempotence", "false"),
        ] {
            let refused = client_configs(&PipeConfig {
                settings: Settings::new().set(name, value),
                ..config()
            })
            .unwrap_err();
            assert!(
                matches!(&refused, PipeError::Config(why) if why.contains(name)),
                "{refused}"
            );
        }
        for broken in [
            PipeConfig {
                transactional_id: " ".into(),
                ..config()
            },
            PipeConfig {
                output_topics: Vec::new(),
                ..config()
            },
            PipeConfig {
                batch_size: 0,
                ..config()
            },
        ] {
            assert!(matches!(client_configs(&broken), Err(PipeError::Config(_))));
        }
    }
}
