//! The start-up check of the dedupe window against every way a copy of a
//! message can still arrive.
//!
//! A consumer's window must be at least the longest of three horizons:
//!
//! - the producer's retry horizon: how long after its first send a producer
//!   (a relay, a client with retries) may send the same message again;
//! - the broker's redelivery horizon: how long the broker keeps a message it
//!   could hand out again — a Kafka topic's retention, a JetStream stream's
//!   max age (with its duplicate window, the broker's own publish dedupe),
//!   an SQS queue's `MessageRetentionPeriod`;
//! - an allowance for manual replays: how far back an operator may re-publish
//!   or rewind during an incident.
//!
//! A copy arriving after the window closed finds no record and is applied a
//! second time, so a window shorter than any term stops the consumer before
//! it applies anything, and the error names every term.

use std::fmt;
use std::time::Duration;

use super::config::ConsumerConfig;

/// How many deliveries the broker allows a message before it moves the
/// message aside itself (an SQS queue's redrive policy), as read at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryLimit {
    /// Deliveries, the last one included.
    pub deliveries: u32,
    /// What sets it, as printed.
    pub origin: String,
}

/// How long a broker keeps messages it could hand out again, as read from
/// the broker at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerHorizon {
    /// `None`: kept forever.
    pub keeps: Option<Duration>,
    /// What keeps them, as printed: `topic orders`, `stream ORDERS (duplicate window 2m)`.
    pub origin: String,
}

/// The window and every term it must cover, as found at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowTerms {
    /// The dedupe window: the store's retention.
    pub window: Duration,
    /// [`ConsumerConfig::producer_horizon`], if given.
    pub producer: Option<Duration>,
    /// The broker's own horizon, where it can be read.
    pub broker: Option<BrokerHorizon>,
    /// [`ConsumerConfig::manual_replay_allowance`], if given.
    pub manual_replays: Option<Duration>,
    /// [`ConsumerConfig::allow_replays_beyond_window`]: the broker's term is
    /// waived.
    pub broker_waived: bool,
}

/// Which term the window does not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Uncovered {
    /// The producer's horizon or the manual-replay allowance: the window
    /// must grow (or the term shrink).
    Term(Duration),
    /// The broker keeps messages longer (`None`: forever); waivable.
    Broker(Option<Duration>),
}

impl WindowTerms {
    pub(crate) fn new(
        window: Duration,
        config: &ConsumerConfig,
        broker: Option<BrokerHorizon>,
    ) -> Self {
        Self {
            window,
            producer: config.producer_horizon,
            broker,
            manual_replays: config.manual_replay_allowance,
            broker_waived: config.replays_beyond_window,
        }
    }

    /// The first term the window falls short of: the producer's and the
    /// manual allowance first (they cannot be waived), then the broker's.
    pub(crate) fn uncovered(&self) -> Option<Uncovered> {
        let longest = self.producer.max(self.manual_replays);
        if let Some(term) = longest
            && self.window < term
        {
            return Some(Uncovered::Term(term));
        }
        match &self.broker {
            Some(broker) if !self.broker_waived && broker.keeps.is_none_or(|k| self.window < k) => {
                Some(Uncovered::Broker(broker.keeps))
            }
            _ => None,
        }
    }
}

fn duration(d: Option<Duration>, none: &str) -> String {
    d.map_or_else(
        || none.to_owned(),
        |d| humantime::format_duration(d).to_string(),
    )
}

impl fmt::Display for WindowTerms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = |term: Option<Duration>| match term {
            Some(t) if self.window < t => " (longer than the window)",
            _ => "",
        };
        write!(
            f,
            "the producer's retry horizon: {}{}; ",
            duration(
                self.producer,
                "not given (ConsumerConfig::producer_horizon)"
            ),
            mark(self.producer)
        )?;
        match &self.broker {
            Some(broker) => {
                let longer = broker.keeps.is_none_or(|k| self.window < k);
                write!(
                    f,
                    "how long {} keeps messages: {}{}; ",
                    broker.origin,
                    duration(broker.keeps, "forever"),
                    match (longer, self.broker_waived) {
                        (true, true) =>
                            " (longer than the window; waived by allow_replays_beyond_window)",
                        (true, false) => " (longer than the window)",
                        (false, _) => "",
                    }
                )?;
            }
            None => write!(f, "the broker's horizon: not readable from this broker; ")?,
        }
        write!(
            f,
            "the allowance for manual replays: {}{}",
            duration(
                self.manual_replays,
                "not given (ConsumerConfig::manual_replay_allowance)"
            ),
            mark(self.manual_replays)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn terms(
        producer: Option<u32>,
        broker: Option<Option<u32>>,
        manual: Option<u32>,
    ) -> WindowTerms {
        WindowTerms {
            window: 7 * DAY,
            producer: producer.map(|d| DAY * d),
            broker: broker.map(|keeps| BrokerHorizon {
                keeps: keeps.map(|d| DAY * d),
                origin: "topic orders".to_owned(),
            }),
            manual_replays: manual.map(|d| DAY * d),
            broker_waived: false,
        }
    }

    #[test]
    fn the_window_must_cover_the_longest_term() {
        assert_eq!(terms(None, None, None).uncovered(), None);
        assert_eq!(terms(Some(1), Some(Some(3)), Some(7)).uncovered(), None);
        assert_eq!(
            terms(Some(1), None, Some(8)).uncovered(),
            Some(Uncovered::Term(8 * DAY))
        );
        assert_eq!(
            terms(Some(9), Some(Some(30)), Some(8)).uncovered(),
            Some(Uncovered::Term(9 * DAY)),
            "the unwaivable terms first"
        );
        assert_eq!(
            terms(None, Some(None), None).uncovered(),
            Some(Uncovered::Broker(None))
        );
        let mut waived = terms(Some(1), Some(Some(30)), None);
        waived.broker_waived = true;
        assert_eq!(waived.uncovered(), None);
    }

    #[test]
    fn every_term_is_named_with_its_value() {
        let text = terms(Some(1), Some(Some(30)), Some(8)).to_string();
        assert!(
            text.contains("the producer's retry horizon: 1day;"),
            "{text}"
        );
        assert!(
            text.contains("how long topic orders keeps messages: 30days (longer than the window)"),
            "{text}"
        );
        assert!(
            text.contains("the allowance for manual replays: 8days (longer than the window)"),
            "{text}"
        );
        let unknown = terms(None, None, None).to_string();
        assert!(
            unknown.contains("not given (ConsumerConfig::producer_horizon)"),
            "{unknown}"
        );
        assert!(
            unknown.contains("not readable from this broker"),
            "{unknown}"
        );
    }
}
