//! Schema, inspection and retention for operators and the `idem` command:
//! [`RecordStore`] over the same table, and [`RecordScan`]'s bounded pages
//! for the effect auditor.
//!
//! Retention is enforced by deleting expired records in bounded batches; each
//! batch skips rows a running transaction holds (`FOR UPDATE SKIP LOCKED`), so a
//! sweep never waits for, nor blocks, the protocol.

use idem_core::{
    Error, ExpiryPosition, IdempotencyKey, Record, RecordCount, RecordFilter, RecordGlance,
    RecordScan, RecordStore, Scope,
};

use crate::records;
use crate::store::PgStore;

impl RecordStore for PgStore {
    fn now(&self) -> idem_core::Timestamp {
        self.clock().now()
    }

    fn settings(&self) -> &idem_core::Settings {
        PgStore::settings(self)
    }

    async fn migrate(&self) -> Result<(), Error> {
        if self.pooling().sessions() {
            return records::MIGRATOR
                .run(self.pool())
                .await
                .map_err(|e| self.fail(e.into()));
        }
        let mut conn = self.pool().acquire().await.map_err(|e| self.fail(e))?;
        crate::pooler::migrate(&mut conn)
            .await
            .map_err(|e| self.fail(e.into()))
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        crate::pooler::one_shot!(self, |conn| records::fetch(conn, scope, key)
            .await
            .map_err(|e| self.fail(e)))
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        crate::pooler::one_shot!(self, |conn| records::list(conn, filter)
            .await
            .map_err(|e| self.fail(e)))
    }

    async fn count(&self) -> Result<RecordCount, Error> {
        crate::pooler::one_shot!(self, |conn| records::count(conn, self.clock().now())
            .await
            .map_err(|e| self.fail(e)))
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        crate::pooler::one_shot!(self, |conn| records::sweep(
            conn,
            self.clock().now(),
            limit,
            self.settings().tombstones,
        )
        .await
        .map_err(|e| self.fail(e)))
    }

    async fn sweep_batch_alone(&self, limit: usize) -> Result<Option<u64>, Error> {
        records::sweep_alone(
            self.pool(),
            self.clock().now(),
            limit,
            self.settings().tombstones,
            self.pooling().begin(),
        )
        .await
        .map_err(|e| self.fail(e))
    }

    async fn glance(&self) -> Result<RecordGlance, Error> {
        let now = self.clock().now();
        crate::pooler::one_shot!(self, |conn| records::glance(conn, now)
            .await
            .map_err(|e| self.fail(e)))
    }
}

impl RecordScan for PgStore {
    async fn records_of(&self, keys: &[(Scope, IdempotencyKey)]) -> Result<Vec<Record>, Error> {
        let pairs: Vec<(&Scope, &IdempotencyKey)> = keys.iter().map(|(s, k)| (s, k)).collect();
        crate::pooler::one_shot!(self, |conn| records::fetch_all(conn, &pairs)
            .await
            .map_err(|e| self.fail(e)))
    }

    async fn records_by_expiry(
        &self,
        scopes: &[Scope],
        after: Option<&ExpiryPosition>,
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let scopes: Vec<&str> = scopes.iter().map(Scope::as_str).collect();
        let after = after.map(|p| (p.expires_at, p.scope.as_str(), p.key.as_str()));
        crate::pooler::one_shot!(self, |conn| records::by_expiry(conn, &scopes, after, limit)
            .await
            .map_err(|e| self.fail(e)))
    }
}
