//! Why a consumer stopped: [`ConsumeError`], one variant per reason, each
//! saying what to change; and why one message's apply gave no answer to ack
//! (`Failure`), which settling turns into a retry or a dead letter.

use std::time::Duration;

use idem_core::Error;

use super::transport::TransportError;
use super::window::WindowTerms;

/// Why a consumer stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The broker connection failed; unsettled deliveries go back to the broker.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The store could not be prepared.
    #[error(transparent)]
    Store(#[from] Error),
    /// An effect panicked; the consumer stopped so the broker redelivers its
    /// message to a fresh process.
    #[error("an effect panicked: {0}")]
    Panicked(String),
    /// The dedupe window is shorter than the producer's retry horizon
    /// ([`ConsumerConfig::producer_horizon`](super::ConsumerConfig::producer_horizon)) or the allowance for manual
    /// replays ([`ConsumerConfig::manual_replay_allowance`](super::ConsumerConfig::manual_replay_allowance)); the consumer did
    /// not start. The message names every term.
    #[error(
        "the dedupe window ({}, the store's retention) is shorter than {}, the longest a copy of a message may still arrive; {}. A copy arriving after the window closed would be applied twice: raise the store's retention to at least {}, or shorten the term marked longer",
        humantime::format_duration(*.window),
        humantime::format_duration(*.horizon),
        .terms,
        humantime::format_duration(*.horizon)
    )]
    WindowTooShort {
        /// The store's retention.
        window: Duration,
        /// The longest term the window falls short of.
        horizon: Duration,
        /// Every term, as found at start-up.
        terms: Box<WindowTerms>,
    },
    /// The watchdog found the consumer holding deliveries without progress
    /// for its limit ([`ConsumerConfig::watchdog`](super::ConsumerConfig::watchdog)) and the transport cannot
    /// restart; the deliveries go back to the broker when the process ends.
    #[error(
        "the consumer held {held} deliveries without settling any for {}: an effect hangs or the broker stopped answering; restart the process (a transport that reconnects, such as Source::connect_reconnecting, is restarted in place)",
        humantime::format_duration(*.after)
    )]
    Stalled {
        /// The watchdog's limit.
        after: Duration,
        /// Deliveries in hand.
        held: usize,
    },
    /// The broker keeps messages longer than the dedupe window (a Kafka
    /// topic's retention, a JetStream stream's max age), so a replay of old
    /// messages would apply them again; the consumer did not start.
    #[error(
        "the dedupe window ({}, the store's retention) is shorter than how long {origin} keeps messages ({}): messages replayed after the window closed (an offset reset to the earliest, a new consumer group or durable consumer) would be applied twice; {}. Raise the store's retention to at least {}, shorten the broker's retention (a topic's retention.ms, a stream's max age), or promise no such replays with ConsumerConfig::allow_replays_beyond_window",
        humantime::format_duration(*.window),
        horizon.map_or_else(|| "forever".to_owned(), |h| humantime::format_duration(h).to_string()),
        .terms,
        horizon.map_or_else(|| "forever".to_owned(), |h| humantime::format_duration(h).to_string())
    )]
    ReplayBeyondWindow {
        /// The store's retention.
        window: Duration,
        /// How long the broker keeps messages; `None`: forever.
        horizon: Option<Duration>,
        /// The source, as printed.
        origin: String,
        /// Every term, as found at start-up.
        terms: Box<WindowTerms>,
    },
}

/// Why an apply did not produce an answer to ack.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Another consumer holds the key right now.
    Busy { retry_after: Duration },
    /// The store is unreachable or busy; not the message's fault.
    Unavailable { error: String },
    /// The key was first used with another payload.
    KeyReuse { error: String },
    /// The effect failed (or the store failed for this message).
    Failed {
        error: String,
        hint: Option<Duration>,
    },
}
