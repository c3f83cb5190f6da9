//! Per-key advisory locks: how concurrent callers of one `(scope, key)` are kept
//! apart without ever queueing a duplicate behind the original.
//!
//! Every path that reads a record and then writes it runs in a transaction that
//! first takes a transaction-scoped advisory lock on a 64-bit hash of the scope
//! and key. Claim paths *try* the lock and answer a duplicate with `InFlight` at
//! once when it is taken; completion paths for a held token *wait* for it, since
//! its holder is either a short claim or a takeover whose commit rightly fences
//! them. The lock is released by the commit or rollback, never by hand, so a
//! crashed caller cannot leave a key locked. (A leased claim first tries the
//! lock inside the one statement that claims a new key, and its completion
//! then takes no lock; see `leased`.)
//!
//! Two details make the lock sound:
//!
//! - the transaction runs at READ COMMITTED whatever the server's default, so
//!   each statement reads a fresh snapshot;
//! - the lock is taken in its own statement and the record is read in the next
//!   one. A statement's snapshot is taken when the statement starts, before any
//!   lock inside it is granted; reading in the same statement could miss what
//!   the previous holder committed just before releasing the lock. The next
//!   statement's snapshot is taken after the grant, and PostgreSQL releases a
//!   transaction's locks only after its commit is visible, so it sees it.

use idem_core::{IdempotencyKey, Scope};
use sqlx::postgres::{PgConnection, PgPool, Postgres};
use sqlx::{Row, Transaction};

use crate::literal;

/// The advisory lock key of `(scope, key)`: the first 8 bytes (big-endian) of
/// BLAKE3 over the scope, a zero byte and the key. Scopes and keys are visible
/// ASCII, so the zero byte cannot be part of either and the framing is
/// unambiguous. Two different keys share a lock only on a 64-bit hash collision,
/// which at worst answers one of them `InFlight` for a moment. The keys live in
/// PostgreSQL's single-`bigint` advisory lock space, which an application's own
/// advisory locks may share; a clash there has the same harmless effect.
pub(crate) fn lock_key(scope: &Scope, key: &IdempotencyKey) -> i64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(scope.as_str().as_bytes());
    hasher.update(&[0]);
    hasher.update(key.as_str().as_bytes());
    let hash = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    i64::from_be_bytes(first)
}

/// The statement every locked read-then-write begins with: READ COMMITTED,
/// whatever `default_transaction_isolation` says. Under REPEATABLE READ or
/// SERIALIZABLE the snapshot would be taken by the lock statement, before the
/// lock is granted (see the module docs).
pub(crate) const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Opens a transaction with `begin` ([`BEGIN`], or what the store's
/// pooling begins with: see `pooler`), on a task of its own.
///
/// A `BEGIN` cut off before its answer (the caller's future dropped) would
/// leave the pooled connection inside a transaction that sqlx does not count,
/// and the pool would hand it out like that: the next user's statements would
/// run in it and commit only by chance. On its own task the `BEGIN` always
/// finishes; if nobody waits for the transaction any more, dropping it rolls
/// it back before the connection is reused.
pub(crate) async fn begin(
    pool: &PgPool,
    begin: &'static str,
) -> sqlx::Result<Transaction<'static, Postgres>> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.begin_with(begin).await })
        .await
        .map_err(|e| sqlx::Error::Protocol(format!("beginning a transaction failed: {e}")))?
}

/// `pg_try_advisory_xact_lock` of `key` as SQL text with the key inlined, for a simple query; its one
/// row has the boolean column `granted`.
pub(crate) fn try_lock_inline(key: i64) -> String {
    format!(
        "SELECT pg_try_advisory_xact_lock({}) AS granted",
        literal::bigint(Some(key))
    )
}

/// Takes the key's lock, waiting for its holder to commit or roll back.
pub(crate) async fn lock(conn: &mut PgConnection, key: i64) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(key)
        .execute(conn)
        .await?;
    Ok(())
}

/// Takes every key's lock in one statement, waiting for each holder in turn.
/// `keys` must be sorted: callers that take many locks all take them in one
/// order, so two of them never wait for each other.
pub(crate) async fn lock_all(conn: &mut PgConnection, keys: &[i64]) -> sqlx::Result<()> {
    debug_assert!(keys.is_sorted(), "locks are taken in one order");
    // A function scan returns the array's elements in order, and the
    // aggregate takes the locks as the rows arrive.
    sqlx::query("SELECT count(pg_advisory_xact_lock(t.k)) FROM unnest($1::bigint[]) AS t(k)")
        .bind(keys)
        .execute(conn)
        .await?;
    Ok(())
}

/// Tries every key's lock in one statement; element `i` of the answer says
/// whether `keys[i]` was granted. Trying never waits, so the order in which the
/// locks are taken cannot deadlock.
pub(crate) async fn try_lock_all(conn: &mut PgConnection, keys: &[i64]) -> sqlx::Result<Vec<bool>> {
    let rows = sqlx::query(
        "SELECT t.i, pg_try_advisory_xact_lock(t.k) \
         FROM unnest($1::bigint[]) WITH ORDINALITY AS t(k, i)",
    )
    .bind(keys)
    .fetch_all(conn)
    .await?;
    let mut granted = vec![false; keys.len()];
    for row in rows {
        let ordinal: i64 = row.try_get(0)?;
        let slot = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|i| granted.get_mut(i))
            .ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "advisory lock answer for unknown position {ordinal}"
                ))
            })?;
        *slot = row.try_get(1)?;
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_depend_on_scope_and_key_with_unambiguous_framing() {
        let scope = |s: &str| Scope::new(s).unwrap();
        let key = |k: &str| IdempotencyKey::new(k).unwrap();
        let a = lock_key(&scope("payments"), &key("k-1"));
        assert_eq!(a, lock_key(&scope("payments"), &key("k-1")));
        assert_ne!(a, lock_key(&scope("payments"), &key("k-2")));
        assert_ne!(a, lock_key(&scope("emails"), &key("k-1")));
        assert_ne!(
            lock_key(&scope("ab"), &key("c")),
            lock_key(&scope("a"), &key("bc"))
        );
    }
}
