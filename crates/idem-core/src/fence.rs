//! Fencing tokens and versioned writes: the half of the problem that dedupe does
//! not solve.
//!
//! Deduplication stops the same message from applying twice; it does nothing
//! against *reordering* (version 1 arriving after version 2) or against a
//! *zombie* (a worker that paused — a GC pause, a stalled VM — past the end of its
//! lease and then wakes up and writes as if it still owned the resource). Both
//! are answered the same way: every write carries a number that only grows, and
//! the storage refuses a write whose number is older than what it has seen.
//!
//! - A [`FenceStore`] hands out leases on named resources, each with a token
//!   greater than any token ever issued for that resource, even across restarts
//!   (the counter lives in the database and is never deleted).
//! - A [`Guard`] names the column of the user's own table that holds the last
//!   token or version seen; the stores' `guarded_write` helpers advance it inside
//!   the caller's transaction and refuse stale writes with [`Error::Stale`],
//!   which must never be retried.

use std::future::Future;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::key::Resource;
use crate::record::FencingToken;

/// A lease on a resource, held until `until` unless renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The resource.
    pub resource: Resource,
    /// This holder's token; carry it on every write to the resource.
    pub token: FencingToken,
    /// When the lease ends.
    pub until: Timestamp,
}

/// Leases with monotonic fencing tokens on named resources.
///
/// ```
/// # async fn demo(fences: impl idem_core::FenceStore) -> Result<(), idem_core::Error> {
/// use std::time::Duration;
/// use idem_core::Resource;
/// let report = Resource::new("nightly-report").unwrap();
/// let lease = fences.acquire(&report, Duration::from_secs(30)).await?;
/// // ... write with lease.token through a guarded write, renew while working ...
/// let lease = fences.renew(&lease, Duration::from_secs(30)).await?;
/// fences.release(&lease).await?;
/// # Ok(()) }
/// ```
pub trait FenceStore: Send + Sync {
    /// Takes the lease if nobody holds a live one, with a token greater than every
    /// token issued before for this resource; `LeaseHeld` otherwise.
    fn acquire(
        &self,
        resource: &Resource,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease, Error>> + Send;

    /// Extends the lease; `Stale` if a newer holder has taken the resource.
    fn renew(
        &self,
        lease: &Lease,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease, Error>> + Send;

    /// Ends the lease now so the next `acquire` succeeds at once; `Stale` if a
    /// newer holder has taken the resource.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), Error>> + Send;
}

/// How a guarded write compares the number it carries with the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Versions: each version is written once, so the carried version must be
    /// strictly greater than the stored one.
    Version,
    /// Fencing tokens: one holder writes many times with the same token, so the
    /// carried token must be at least the stored one.
    Fence,
}

/// The user's column that holds the last version or token seen for a row:
/// `UPDATE table SET column = carried WHERE id_column = id AND column < carried`.
///
/// Names are SQL identifiers (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes); they
/// are checked here and quoted by the stores, never spliced in raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    table: String,
    id_column: String,
    column: String,
    ordering: Ordering,
}

/// A table or column name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not a plain SQL identifier: use letters, digits and underscores, starting with a letter or underscore, at most 63 characters"
)]
pub struct IdentifierError {
    /// The refused name.
    pub name: String,
}

fn identifier(name: &str) -> Result<String, IdentifierError> {
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if starts_well && name.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(name.to_owned())
    } else {
        Err(IdentifierError {
            name: name.to_owned(),
        })
    }
}

impl Guard {
    /// A guard on `table.column`, rows found by `id_column`.
    pub fn new(
        table: &str,
        id_column: &str,
        column: &str,
        ordering: Ordering,
    ) -> Result<Self, IdentifierError> {
        Ok(Self {
            table: identifier(table)?,
            id_column: identifier(id_column)?,
            column: identifier(column)?,
            ordering,
        })
    }

    /// A version guard (carried must be greater than stored).
    pub fn version(table: &str, id_column: &str, column: &str) -> Result<Self, IdentifierError> {
        Self::new(table, id_column, column, Ordering::Version)
    }

    /// A fencing guard (carried must be at least the stored token).
    pub fn fence(table: &str, id_column: &str, column: &str) -> Result<Self, IdentifierError> {
        Self::new(table, id_column, column, Ordering::Fence)
    }

    /// The statement that advances the stored number, with `$1` the carried
    /// number and `$2` the row id (PostgreSQL and SQLite both accept `$n`).
    /// It changes one row when the write may go ahead and none otherwise.
    pub fn advance_sql(&self) -> String {
        let comparison = match self.ordering {
            Ordering::Version => "<",
            Ordering::Fence => "<=",
        };
        format!(
            r#"UPDATE "{table}" SET "{column}" = $1 WHERE "{id}" = $2 AND "{column}" {comparison} $1"#,
            table = self.table,
            column = self.column,
            id = self.id_column,
        )
    }

    /// The statement that reads the stored number of row `$1`, to explain a refusal.
    pub fn stored_sql(&self) -> String {
        format!(
            r#"SELECT "{column}" FROM "{table}" WHERE "{id}" = $1"#,
            table = self.table,
            column = self.column,
            id = self.id_column,
        )
    }

    /// The refusal for a write carrying `carried` where `stored` is kept
    /// (`None`: the row does not exist).
    pub fn stale(&self, row: &str, carried: i64, stored: Option<i64>) -> Error {
        let error = Error::Stale {
            target: format!("{}.{} of row {row}", self.table, self.column),
            carried,
            stored,
        };
        crate::observe::refused(&error);
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_quote_checked_identifiers_only() {
        let g = Guard::version("accounts", "id", "version").unwrap();
        assert_eq!(
            g.advance_sql(),
            r#"UPDATE "accounts" SET "version" = $1 WHERE "id" = $2 AND "version" < $1"#
        );
        let f = Guard::fence("jobs", "name", "fence").unwrap();
        assert!(f.advance_sql().ends_with(r#""fence" <= $1"#));
        for bad in ["", "1x", "a;drop table t", "a\"b", &"x".repeat(64)] {
            assert!(Guard::version(bad, "id", "v").is_err(), "{bad}");
        }
    }

    #[test]
    fn resources_follow_the_key_rules() {
        assert!(Resource::new("ledger/acc-7").is_ok());
        assert!(Resource::new("").is_err());
        assert!(Resource::new("has space").is_err());
    }
}
