//! Schema, inspection and retention for operators and the `idem` command:
//! [`RecordStore`] over the same table.
//!
//! Reads go to a reader connection; migrations and the bounded sweeps of
//! expired records go to the writer.

use idem_core::{
    Error, IdempotencyKey, Record, RecordCount, RecordFilter, RecordGlance, RecordStore, Scope,
    Settings,
};

use crate::store::SqliteStore;
use crate::{records, schema};

impl RecordStore for SqliteStore {
    fn now(&self) -> idem_core::Timestamp {
        self.clock().now()
    }

    fn settings(&self) -> &Settings {
        SqliteStore::settings(self)
    }

    async fn migrate(&self) -> Result<(), Error> {
        self.connections().write(schema::migrate).await?
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        let (scope, key) = (scope.to_string(), key.to_string());
        self.connections()
            .read(move |conn| records::select(conn, &scope, &key))
            .await
    }

    async fn list(&self, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
        let filter = filter.clone();
        self.connections()
            .read(move |conn| records::list(conn, &filter))
            .await
    }

    async fn count(&self) -> Result<RecordCount, Error> {
        let now = self.clock().now();
        self.connections()
            .read(move |conn| {
                records::count(conn, now).map(|(total, expired)| RecordCount { total, expired })
            })
            .await
    }

    async fn sweep_batch(&self, limit: usize) -> Result<u64, Error> {
        let now = self.clock().now();
        let grace = self.settings().tombstones;
        self.connections()
            .write(move |conn| records::sweep_batch(conn, now, limit, grace))
            .await?
    }

    async fn glance(&self) -> Result<RecordGlance, Error> {
        let now = self.clock().now();
        self.connections()
            .read(move |conn| records::glance(conn, now))
            .await
    }
}
