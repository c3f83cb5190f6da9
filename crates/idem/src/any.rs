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
