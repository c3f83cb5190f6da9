//! [`AnyStore`]: a store chosen at run time from a [`StoreLocation`], for
//! programs (like the `idem` command) that serve either backend.

use std::sync::Arc;

use idem_core::{
    Claim, Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Record, RecordCount,
    RecordFilter, RecordStore, Scope, Settings, SharedClock, SystemClock,
};

use crate::StoreLocation;

/// Either store, behind the shared traits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// The embedded SQLite store.
    #[cfg(feature = "sqlite")]
    Sqlite(idem_sqlite::SqliteStore),
    /// The PostgreSQL store.
    #[cfg(feature = "postgres")]
    Postgres(idem_postgres::PgStore),
}

impl AnyStore {
    /// Opens the store at `location` with default settings and the system clock,
    /// creating or upgrading its schema.
    pub async fn open(location: &StoreLocation) -> Result<Self, Error> {
        Self::open_with(location, Settings::default(), Arc::new(SystemClock)).await
    }

    /// Opens the store at `location` with the given settings and clock.
    pub async fn open_with(
        location: &StoreLocation,
        settings: Settings,
        clock: SharedClock,
    ) -> Result<Self, Error> {
        match location {
            #[cfg(feature = "sqlite")]
            StoreLocation::Sqlite(path) => Ok(Self::Sqlite(
                idem_sqlite::SqliteStore::builder(path)
                    .settings(settings)
                    .clock(clock)
                    .open()
                    .await?,
            )),
            #[cfg(feature = "postgres")]
            StoreLocation::Postgres(url) => Ok(Self::Postgres(
                idem_postgres::PgStore::builder(url.clone())
                    .settings(settings)
                    .clock(clock)
                    .connect()
                    .await?,
            )),
            #[allow(unreachable_patterns)]
            other => Err(idem_core::StoreError::new(
                idem_core::ErrorKind::Config,
                format!("this build of idem has no support for {other}; enable the crate feature for that store"),
            )
            .into()),
        }
    }
}

macro_rules! each_store {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
        }
    };
}

impl LeaseStore for AnyStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        each_store!(self, s => s.claim(scope, key, fingerprint).await)
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        each_store!(self, s => s.renew(claim).await)
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        each_store!(self, s => s.complete(claim, outcome).await)
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        each_store!(self, s => s.release(claim).await)
    }
}

impl RecordStore for AnyStore {
    async fn migrate(&self) -> Result<(), Error> {
        each_store!(self, s => s.migrate().await)
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        each_store!(self, s => s.get(scope, key).await)
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        each_store!(self, s => s.list(filter).await)
    }

    async fn count(&self) -> Result<RecordCount, Error> {
        each_store!(self, s => s.count().await)
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_batch(limit).await)
    }
}

// The outbox, dead letters and failed attempts of whichever store it is.

impl idem_core::OutboxStore for AnyStore {
    fn outbox_clock(&self) -> SharedClock {
        each_store!(self, s => s.outbox_clock())
    }

    async fn enqueue_now(&self, message: &idem_core::OutboxMessage) -> Result<i64, Error> {
        each_store!(self, s => s.enqueue_now(message).await)
    }

    async fn claim_outbox(
        &self,
        owner: &str,
        now: idem_core::Timestamp,
        lease: std::time::Duration,
        limit: usize,
        with_default: bool,
    ) -> Result<Vec<idem_core::Pending>, Error> {
        each_store!(self, s => s.claim_outbox(owner, now, lease, limit, with_default).await)
    }

    async fn mark_sent(&self, ids: &[i64], now: idem_core::Timestamp) -> Result<u64, Error> {
        each_store!(self, s => s.mark_sent(ids, now).await)
    }

    async fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: idem_core::Timestamp,
        error: &str,
    ) -> Result<bool, Error> {
        each_store!(self, s => s.retry_later(id, owner, attempts, due, error).await)
    }

    async fn bury(
        &self,
        id: i64,
        owner: &str,
        letter: &idem_core::NewDeadLetter,
        now: idem_core::Timestamp,
    ) -> Result<Option<i64>, Error> {
        each_store!(self, s => s.bury(id, owner, letter, now).await)
    }

    async fn sweep_sent(&self, before: idem_core::Timestamp, limit: usize) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_sent(before, limit).await)
    }

    async fn outbox_stats(&self) -> Result<idem_core::OutboxStats, Error> {
        each_store!(self, s => s.outbox_stats().await)
    }

    async fn wake_ups(&self) -> Result<Option<Box<dyn idem_core::WakeUps>>, Error> {
        each_store!(self, s => s.wake_ups().await)
    }
}

impl idem_core::DeadLetterStore for AnyStore {
    async fn record_dead_letter(&self, letter: &idem_core::NewDeadLetter) -> Result<i64, Error> {
        each_store!(self, s => s.record_dead_letter(letter).await)
    }

    async fn list_dead_letters(
        &self,
        limit: usize,
        include_redriven: bool,
    ) -> Result<Vec<idem_core::DeadLetter>, Error> {
        each_store!(self, s => s.list_dead_letters(limit, include_redriven).await)
    }

    async fn get_dead_letter(&self, id: i64) -> Result<Option<idem_core::DeadLetter>, Error> {
        each_store!(self, s => s.get_dead_letter(id).await)
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        each_store!(self, s => s.mark_redriven(id).await)
    }

    async fn dead_letter_stats(&self) -> Result<idem_core::DeadLetterStats, Error> {
        each_store!(self, s => s.dead_letter_stats().await)
    }

    async fn sweep_dead_letters(
        &self,
        retention: std::time::Duration,
        limit: usize,
    ) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_dead_letters(retention, limit).await)
    }
}

impl idem_core::AttemptStore for AnyStore {
    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<idem_core::Failures, Error> {
        each_store!(self, s => s.record_failure(scope, key, error).await)
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        each_store!(self, s => s.forget_failures(scope, key).await)
    }

    async fn sweep_failures(
        &self,
        before: idem_core::Timestamp,
        limit: usize,
    ) -> Result<u64, Error> {
        each_store!(self, s => s.sweep_failures(before, limit).await)
    }

    fn now(&self) -> idem_core::Timestamp {
        each_store!(self, s => idem_core::AttemptStore::now(s))
    }
}
