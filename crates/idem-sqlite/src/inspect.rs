//! Schema, inspection and retention for operators and the `idem` command:
//! [`RecordStore`] over the same table, and [`RecordScan`]'s bounded pages
//! for the effect auditor.
//!
//! Reads go to a reader connection; migrations and the bounded sweeps of
//! expired records go to the writer.

use idem_core::{
    Error, ExpiryPosition, IdempotencyKey, Record, RecordCount, RecordFilter, RecordGlance,
    RecordScan, RecordStore, Scope, Settings,
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

impl RecordScan for SqliteStore {
    async fn records_of(&self, keys: &[(Scope, IdempotencyKey)]) -> Result<Vec<Record>, Error> {
        let keys: Vec<(String, String)> = keys
            .iter()
            .map(|(scope, key)| (scope.to_string(), key.to_string()))
            .collect();
        self.connections()
            .read(move |conn| {
                let pairs: Vec<(&str, &str)> =
                    keys.iter().map(|(s, k)| (s.as_str(), k.as_str())).collect();
                records::select_many(conn, &pairs)
            })
            .await
    }

    async fn records_by_expiry(
        &self,
        scopes: &[Scope],
        after: Option<&ExpiryPosition>,
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let scopes: Vec<String> = scopes.iter().map(Scope::to_string).collect();
        let after = after.map(|p| (p.expires_at.0, p.scope.to_string(), p.key.to_string()));
        self.connections()
            .read(move |conn| {
                let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
                let after = after
                    .as_ref()
                    .map(|(at, scope, key)| (*at, scope.as_str(), key.as_str()));
                records::by_expiry(conn, &scopes, after, limit)
            })
            .await
    }
}
