//! [`PipeError`], and which Kafka errors end a pipe.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DefaultProducerContext, Producer, ThreadedProducer};

/// Why a pipe could not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipeError {
    /// The configuration or a setting was refused, or a topic is missing.
    #[error("Kafka transactional pipe: {0}")]
    Config(String),
    /// The brokers or the transaction coordinator did not answer.
    #[error("Kafka transactional pipe: could not {doing}: {detail}")]
    Unavailable {
        /// What was being done.
        doing: String,
        /// What went wrong, and what to check.
        detail: String,
    },
    /// Another instance with the same `transactional.id` initialised after
    /// this one: the brokers refuse this one's transactions. It must stop.
    #[error(
        "Kafka transactional pipe fenced: a newer instance with the same transactional.id {transactional_id:?} started, so the brokers refuse this instance's transactions ({detail}); this instance must not continue: its uncommitted transaction was discarded and the newer instance reads from the last committed offsets; stop this one, and do not restart it while the newer one runs (that would fence the newer one in turn)"
    )]
    Fenced {
        /// The `transactional.id` both instances use.
        transactional_id: String,
        /// librdkafka's report.
        detail: String,
    },
    /// The transform kept failing on a batch.
    #[error(
        "Kafka transactional pipe: the transform failed {attempts} times in a row, last on record {at}: {message}; each failed transaction was aborted, nothing of it is visible and the offsets stay before it; fix the transform, or have it write records it cannot handle to a dead-letter topic instead of failing"
    )]
    Transform {
        /// `topic/partition/offset` of the record the transform failed on.
        at: String,
        /// Failed attempts in a row.
        attempts: u32,
        /// The transform's error.
        message: String,
    },
    /// librdkafka reported an error after which this producer or consumer
    /// cannot go on.
    #[error(
        "Kafka transactional pipe: fatal error while {doing}: {detail}; the open transaction is not committed and the offsets stay before it; start a new instance"
    )]
    Fatal {
        /// What was being done.
        doing: String,
        /// librdkafka's report.
        detail: String,
    },
}

/// The error that ends the pipe, if `error` (or the producer's state) is
/// fatal: fenced by a newer instance, or another fatal error.
pub(super) fn fatal(
    producer: &ThreadedProducer<DefaultProducerContext>,
    error: &KafkaError,
    transactional_id: &str,
) -> Option<PipeError> {
    let reported = match error {
        KafkaError::Transaction(e) if e.is_fatal() => Some((e.code(), e.to_string())),
        _ => None,
    };
    let (code, detail) = reported.or_else(|| producer.client().fatal_error())?;
    let fenced = matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    );
    Some(if fenced {
        PipeError::Fenced {
            transactional_id: transactional_id.to_owned(),
            detail,
        }
    } else {
        PipeError::Fatal {
            doing: "running a transaction".into(),
            detail,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fenced_error_says_what_happened_and_what_to_do() {
        let shown = PipeError::Fenced {
            transactional_id: "pricing-0".into(),
            detail: "Producer fenced by newer instance".into(),
        }
        .to_string();
        for expected in [
            "fenced",
            "newer instance",
            "\"pricing-0\"",
            "must not continue",
        ] {
            assert!(shown.contains(expected), "{shown}");
        }
    }
}
