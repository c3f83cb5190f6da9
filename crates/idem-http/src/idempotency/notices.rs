//! The store's side of waiting for a concurrent duplicate's original: a read
//! of the record that claims nothing ([`RecordStore::get`]), and how a
//! settlement in another process is heard ([`WaitableStore::notices`]).
//!
//! PostgreSQL has notifications: the process that settles a key sends
//! `NOTIFY idem_settled` with the key's hash, and every process with waiters
//! listens on that channel (one connection per layer, made when the first
//! duplicate waits). The other stores have none: a process's own waiters are
//! woken by the process itself, and those whose original runs elsewhere
//! re-read the record, one read per key and process, with a backoff from
//! 50 ms doubling to 1 s. So do PostgreSQL's behind a transaction pooler
//! (`pgbouncer=true`), where `LISTEN` never hears anything.

// Without PostgreSQL there are no notifications to hear or send.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::time::Duration;

use idem_core::{LeaseStore, RecordStore};

/// A key's hash: what slots and notifications are known by.
pub(crate) type KeyId = [u8; 32];

/// The PostgreSQL channel settlements are announced on.
pub(crate) const CHANNEL: &str = "idem_settled";

/// How often waiters whose store has no notifications re-read the record:
/// first after this, then twice as long each time, up to
/// [`LONGEST_REREAD`].
pub(crate) const FIRST_REREAD: Duration = Duration::from_millis(50);

/// The longest delay between two re-reads.
pub(crate) const LONGEST_REREAD: Duration = Duration::from_secs(1);

/// How a store tells its waiters that another process settled a key.
#[derive(Clone)]
#[non_exhaustive]
pub enum Notices {
    /// It cannot: waiters re-read the record with a bounded backoff.
    Reread,
    /// PostgreSQL `LISTEN`/`NOTIFY` through this pool.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(idem_postgres::sqlx::PgPool),
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reread => f.write_str("Reread"),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => f.write_str("Postgres"),
        }
    }
}

/// A store a concurrent duplicate can wait on
/// ([`Concurrent::Wait`](crate::Concurrent::Wait)): one that reads a record
/// without claiming it ([`RecordStore::get`]). Every [`LeaseStore`] that is
/// also a [`RecordStore`] is one. Waiters hear of other processes'
/// settlements through PostgreSQL's notifications on an
/// `idem_postgres::PgStore` (or the facade's `idem::AnyStore` on PostgreSQL),
/// with the crate feature `postgres`; on any other store they re-read.
pub trait WaitableStore: LeaseStore + RecordStore + 'static {
    /// How waiters hear that another process settled a key.
    fn notices(&self) -> Notices;
}

impl<T: LeaseStore + RecordStore + 'static> WaitableStore for T {
    fn notices(&self) -> Notices {
        #[cfg(feature = "postgres")]
        {
            let any: &dyn std::any::Any = self;
            let store = match any.downcast_ref::<idem::AnyStore>() {
                Some(idem::AnyStore::Postgres(store)) => Some(store),
                _ => any.downcast_ref::<idem_postgres::PgStore>(),
            };
            // Through a transaction pooler nothing is delivered: re-read.
            if let Some(store) = store
                && store.can_listen("waiting duplicates")
            {
                return Notices::Postgres(store.pool().clone());
            }
        }
        Notices::Reread
    }
}

/// What the announcement of a settled key says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// An answer is stored: read it.
    Stored,
    /// The original ended without a stored answer (released, or its outcome
    /// unknown).
    Ended,
}

impl Settled {
    fn word(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Ended => "ended",
        }
    }
}

/// The payload of a notification: the key's hash in hex, `:`, what became of it.
pub(crate) fn payload(id: &KeyId, settled: Settled) -> String {
    format!("{}:{}", hex(id), settled.word())
}

/// The key's hash and what became of it, from a notification's payload.
pub(crate) fn parse_payload(payload: &str) -> Option<(KeyId, Settled)> {
    let (id, word) = payload.split_once(':')?;
    let settled = match word {
        "stored" => Settled::Stored,
        "ended" => Settled::Ended,
        _ => return None,
    };
    let mut bytes = [0u8; 32];
    if id.len() != 64 {
        return None;
    }
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(id.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((bytes, settled))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Announces to other processes that a key was settled; nothing for a store
/// without notifications. Errors are logged: the waiters elsewhere then get
/// their 409 when their wait runs out.
pub(crate) async fn announce(notices: &Notices, id: KeyId, settled: Settled) {
    match notices {
        Notices::Reread => {
            let _ = (id, settled);
        }
        #[cfg(feature = "postgres")]
        Notices::Postgres(pool) => {
            // One simple query: safe through a pooler, where the extended
            // protocol's two exchanges could reach two server connections.
            // The channel and the payload (hex and a fixed word) need no
            // escaping.
            let sql = format!("SELECT pg_notify('{CHANNEL}', '{}')", payload(&id, settled));
            let sent = idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(sql))
                .execute(pool)
                .await;
            if let Err(error) = sent {
                tracing::warn!(%error, "could not announce a settled key to other processes; their waiters get 409 when their wait runs out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_others_are_ignored() {
        let id = [0xab; 32];
        for settled in [Settled::Stored, Settled::Ended] {
            assert_eq!(parse_payload(&payload(&id, settled)), Some((id, settled)));
        }
        for bad in ["", "ab:stored", &format!("{}:done", hex(&id)), "zz:ended"] {
            assert_eq!(parse_payload(bad), None, "{bad}");
        }
    }
}
