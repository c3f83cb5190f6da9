//! Retention that runs itself: a task that deletes expired dedupe records in
//! bounded batches on a jittered schedule, and publishes the record gauges.
//!
//! A dedupe table nobody sweeps outgrows the tables it protects within a
//! year. `idem serve`, `idem forward`, `idem relay` and the consumers run a
//! [`Sweeper`]; an application spawns one with [`Sweeper::spawn`] next to
//! its store. Several processes on one PostgreSQL database take turns (each
//! batch holds an advisory lock, and a sweeper that finds it taken skips its
//! pass); `idem gc` remains for a cron job.
//!
//! Why a jittered schedule: processes started together (a deployment) would
//! otherwise all wake at the same second, forever. Why bounded batches: one
//! `DELETE` of a million rows holds its locks and bloats the write-ahead log
//! for as long as it runs, while traffic waits.
//!
//! Metrics, through the `metrics` facade:
//! - `dedupe_records_swept_total`: records deleted;
//! - `dedupe_sweeps_total{result="ok"|"failed"|"skipped"}`: passes, and
//!   passes skipped because another process was sweeping;
//! - `dedupe_records` (gauge): records stored (PostgreSQL's estimate);
//! - `dedupe_oldest_record_age_seconds` (gauge): age of the record that
//!   expires first. Above `dedupe_retention_seconds` plus the interval, the
//!   sweeper is not keeping up;
//! - `dedupe_retention_seconds` (gauge): the dedupe window this process runs.
//!
//! The gauges are read once per pass from the expiry index and the
//! planner's estimate, never by a scan per scrape.

use std::future::Future;
use std::time::Duration;

use idem_core::{Error, RecordGlance, RecordStore};
use rand::Rng;
use tokio::task::JoinHandle;

/// How often a sweeper runs by default (±50 % jitter).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Records deleted per transaction by default.
pub const DEFAULT_SWEEP_BATCH: usize = 1000;
/// Batches in one pass at most by default; the rest waits for the next pass,
/// so a backlog is worked off in steps rather than in one long burst.
pub const DEFAULT_SWEEP_MAX_BATCHES: usize = 100;

/// Name of the counter of deleted records.
pub const RECORDS_SWEPT_TOTAL: &str = "dedupe_records_swept_total";
/// Name of the counter of passes, labelled `result`.
pub const SWEEPS_TOTAL: &str = "dedupe_sweeps_total";
/// Name of the gauge of stored records.
pub const RECORDS: &str = "dedupe_records";
/// Name of the gauge of the age of the record that expires first.
pub const OLDEST_RECORD_AGE: &str = "dedupe_oldest_record_age_seconds";
/// Name of the gauge of the configured retention.
pub const RETENTION: &str = "dedupe_retention_seconds";

/// Deletes expired records of one store, pass after pass.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem::{SqliteStore, Sweeper};
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let sweeper = Sweeper::new(store).interval(Duration::from_secs(30)).spawn();
/// // ... serve traffic ...
/// sweeper.stop().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Sweeper<S> {
    store: S,
    interval: Duration,
    batch: usize,
    max_batches: usize,
    busy_share: Option<f64>,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepPass {
    /// Records deleted.
    pub deleted: u64,
    /// Another process's sweeper was deleting, so this one stepped aside.
    pub skipped: bool,
    /// The record figures after the pass.
    pub glance: RecordGlance,
}

impl<S: RecordStore> Sweeper<S> {
    /// A sweeper with the defaults: a pass every 60 s ± 50 %, batches of
    /// 1000, at most 100 batches a pass.
    pub fn new(store: S) -> Self {
        Self {
            store,
            interval: DEFAULT_SWEEP_INTERVAL,
            batch: DEFAULT_SWEEP_BATCH,
            max_batches: DEFAULT_SWEEP_MAX_BATCHES,
            busy_share: None,
        }
    }

    /// The mean time between passes; each wait is drawn from half to one and
    /// a half times it.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Records deleted per transaction.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Batches in one pass at most.
    pub fn max_batches(mut self, max_batches: usize) -> Self {
        self.max_batches = max_batches.max(1);
        self
    }

    /// Paces a pass so that deleting takes at most `share` (0–1] of its
    /// time: after a batch that took `t`, the sweeper waits `t × (1 − share)
    /// ÷ share` before the next. On a store with one writer (SQLite) or a
    /// busy server, a pass then leaves the rest of the time to the traffic;
    /// without pacing (the default) batches follow each other at once.
    pub fn busy_share(mut self, share: f64) -> Self {
        self.busy_share = (share > 0.0 && share < 1.0).then_some(share);
        self
    }

    /// The store swept.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One pass: batches until the expired records run out, the pass's
    /// batch limit is reached or another process is found sweeping; then the
    /// gauges.
    pub async fn pass(&self) -> Result<SweepPass, Error> {
        let mut pass = SweepPass::default();
        for _ in 0..self.max_batches {
            let started = std::time::Instant::now();
            match self.store.sweep_batch_alone(self.batch).await {
                Err(error) => {
                    metrics::counter!(SWEEPS_TOTAL, "result" => "failed").increment(1);
                    return Err(error);
                }
                Ok(None) => {
                    pass.skipped = true;
                    break;
                }
                Ok(Some(deleted)) => {
                    pass.deleted += deleted;
                    metrics::counter!(RECORDS_SWEPT_TOTAL).increment(deleted);
                    if deleted < self.batch as u64 {
                        break;
                    }
                    // Let waiting requests in between two batches.
                    match self.busy_share {
                        Some(share) => {
                            let busy = started.elapsed();
                            tokio::time::sleep(busy.mul_f64((1.0 - share) / share)).await;
                        }
                        None => tokio::task::yield_now().await,
                    }
                }
            }
        }
        let result = if pass.skipped { "skipped" } else { "ok" };
        metrics::counter!(SWEEPS_TOTAL, "result" => result).increment(1);
        pass.glance = self.store.glance().await?;
        publish(pass.glance);
        Ok(pass)
    }

    /// Runs passes on the jittered schedule until `shutdown` completes. A
    /// failed pass is logged and retried at the next one; the store going
    /// away for a while does not stop the sweeper.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        publish_retention(self.store.settings().retention);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let wait = jittered(self.interval);
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(wait) => {}
            }
            match self.pass().await {
                Ok(pass) if pass.deleted > 0 => tracing::debug!(
                    deleted = pass.deleted,
                    records = pass.glance.records,
                    "expired idempotency records swept"
                ),
                Ok(_) => {}
                Err(error) => tracing::warn!(
                    %error,
                    "the retention sweep failed; it runs again at the next interval"
                ),
            }
        }
    }

    /// Spawns [`run`](Self::run) on the current tokio runtime.
    pub fn spawn(self) -> SweeperTask
    where
        S: Send + Sync + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.run(async move {
            let _ = stopped.await;
        }));
        SweeperTask { stop, task }
    }
}

/// A spawned sweeper. Dropping it detaches the task; [`stop`](Self::stop)
/// ends it between two passes (a batch in progress finishes).
#[derive(Debug)]
pub struct SweeperTask {
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl SweeperTask {
    /// Stops the sweeper and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Sets the record gauges from `glance`.
pub fn publish(glance: RecordGlance) {
    metrics::gauge!(RECORDS).set(glance.records as f64);
    metrics::gauge!(OLDEST_RECORD_AGE).set(glance.oldest_age.map_or(0.0, |age| age.as_secs_f64()));
}

/// Sets the `dedupe_retention_seconds` gauge.
pub fn publish_retention(retention: Duration) {
    metrics::gauge!(RETENTION).set(retention.as_secs_f64());
}

/// A wait drawn uniformly from half to one and a half times `interval`.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::rng().random_range(0.5..1.5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_spread_around_the_interval() {
        let interval = Duration::from_secs(60);
        let waits: Vec<_> = (0..1000).map(|_| jittered(interval)).collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= interval / 2 && *w < interval * 3 / 2)
        );
        let (min, max) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(*max - *min > Duration::from_secs(30), "{min:?}..{max:?}");
    }
}
