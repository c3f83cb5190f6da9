//! One connected publisher per destination, opened on first use and kept for
//! the relay's life; dropped after a failure that says the connection is gone,
//! so the next use reconnects. Each destination's connection is registered
//! with the process's health ([`idem_core::health`]) and reported as
//! `relay_connected{connection}` (1 up, 0 lost) and
//! `relay_reconnects_total{connection}` (connections lost).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::health;
use tokio::sync::Mutex;

use crate::publish::{
    self, ConnectOptions, Destination, PublishError, PublishErrorKind, Publisher,
};

#[derive(Debug)]
pub(super) struct Publishers {
    open: Mutex<HashMap<Destination, Arc<Publisher>>>,
    health: std::sync::Mutex<HashMap<Destination, health::Connection>>,
    options: ConnectOptions,
    connect_timeout: Duration,
}

impl Publishers {
    /// None open yet; each is opened with `options`, and an attempt to open
    /// one that takes longer than `connect_timeout` (a broker that accepted
    /// the connection and says nothing) counts as a lost connection.
    pub(super) fn new(options: ConnectOptions, connect_timeout: Duration) -> Self {
        Self {
            options,
            connect_timeout,
            open: Mutex::default(),
            health: std::sync::Mutex::default(),
        }
    }

    /// The publisher for `destination`, connecting if there is none.
    pub(super) async fn get(
        &self,
        destination: &Destination,
    ) -> Result<Arc<Publisher>, PublishError> {
        let mut open = self.open.lock().await;
        if let Some(publisher) = open.get(destination) {
            return Ok(Arc::clone(publisher));
        }
        let connect = publish::connect_with(destination, &self.options);
        let connected = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .unwrap_or_else(|_| {
                Err(PublishError::new(
                    PublishErrorKind::Unavailable,
                    destination.redacted(),
                    format!(
                        "no answer to the connect within {}",
                        humantime::format_duration(self.connect_timeout)
                    ),
                ))
            });
        let publisher = match connected {
            Ok(publisher) => Arc::new(publisher),
            Err(error) => {
                self.mark(destination, Some(&error));
                return Err(error);
            }
        };
        self.mark(destination, None);
        open.insert(destination.clone(), Arc::clone(&publisher));
        Ok(publisher)
    }

    /// Forgets the publisher of `destination` after `error`, if the error
    /// means its connection is unusable.
    pub(super) async fn forget_after(&self, destination: &Destination, error: &PublishError) {
        if error.kind() == PublishErrorKind::Unavailable
            && self.open.lock().await.remove(destination).is_some()
        {
            tracing::warn!(destination = %destination.redacted(), %error, "the connection to a destination was lost; the next publish connects again");
            metrics::counter!("relay_reconnects_total", "connection" => destination.redacted())
                .increment(1);
            self.mark(destination, Some(error));
        }
    }

    /// Drops every connection: the next publish to each destination makes a
    /// new one. For the watchdog.
    pub(super) async fn forget_all(&self) {
        self.open.lock().await.clear();
    }

    /// Records whether `destination`'s connection is up (`None`) or lost.
    fn mark(&self, destination: &Destination, error: Option<&PublishError>) {
        let mut health = self
            .health
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let connection = health
            .entry(destination.clone())
            .or_insert_with(|| health::Connection::register(destination.redacted()));
        match error {
            None => connection.up(),
            Some(error) => connection.down(error),
        }
        metrics::gauge!("relay_connected", "connection" => destination.redacted())
            .set(if error.is_none() { 1.0 } else { 0.0 });
    }
}
