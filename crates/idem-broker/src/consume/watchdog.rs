//! The watchdog: notices a consumer that holds deliveries without progress
//! and restarts it, so the broker delivers them again.

use std::time::Duration;

use tokio::task::JoinSet;

use super::error::ConsumeError;
use super::transport::Transport;

/// Notices a consumer that holds deliveries and makes no progress (nothing
/// settled, nothing received) for its limit, and restarts it: the work in
/// hand is dropped unsettled and the transport's connection replaced, so the
/// broker delivers those messages again.
pub(crate) struct Watchdog {
    after: Option<Duration>,
    last: tokio::time::Instant,
}

impl Watchdog {
    pub(crate) fn new(after: Option<Duration>) -> Self {
        Self {
            after,
            last: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn on(&self) -> bool {
        self.after.is_some()
    }

    /// Something was received or settled.
    pub(crate) fn progress(&mut self) {
        self.last = tokio::time::Instant::now();
    }

    /// Completes when the limit has passed since the last progress (never
    /// when off).
    pub(crate) async fn stalled(&self) {
        match self.after {
            Some(after) => tokio::time::sleep_until(self.last + after).await,
            None => std::future::pending().await,
        }
    }

    /// Drops the work in hand and restarts the transport, or says why it
    /// cannot.
    pub(crate) async fn restart<T: Transport>(
        &mut self,
        transport: &mut T,
        working: &mut JoinSet<Result<(), ConsumeError>>,
    ) -> Result<(), ConsumeError> {
        let after = self.after.unwrap_or_default();
        let held = working.len();
        let origin = transport.route().origin;
        tracing::error!(
            source = origin.as_str(),
            held,
            after_s = after.as_secs(),
            "the consumer held messages without settling any for too long; restarting it (the messages in hand are left for the broker to redeliver)"
        );
        metrics::counter!("consumer_watchdog_restarts_total", "origin" => origin).increment(1);
        working.abort_all();
        while working.join_next().await.is_some() {}
        self.progress();
        if transport.restart("the watchdog restarted the consumer") {
            Ok(())
        } else {
            Err(ConsumeError::Stalled { after, held })
        }
    }
}
