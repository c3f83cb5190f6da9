//! [`WriteTx`]: the store's `BEGIN IMMEDIATE` transaction on the writer
//! connection, handed to effects as the connection itself.
//!
//! rusqlite's own `Transaction` borrows its connection shared, and a shared
//! borrow of a `Connection` cannot cross threads (it is not `Sync`), so an
//! effect's future holding one could never be `Send`. The effect gets
//! `&mut Connection` instead, inside this transaction, which the store
//! commits; dropped without a commit, it rolls back.

use std::ops::{Deref, DerefMut};

use idem_core::{Error, ErrorKind, StoreError};
use rusqlite::Connection;

use crate::error::map_error;

/// An open `BEGIN IMMEDIATE` transaction on `conn`; rolled back on drop
/// unless committed.
pub(crate) struct WriteTx<'c> {
    conn: &'c mut Connection,
    open: bool,
}

impl<'c> WriteTx<'c> {
    /// Begins a write transaction: takes SQLite's write lock now, so the
    /// reads that follow cannot be overtaken by another writer.
    pub(crate) fn begin(conn: &'c mut Connection) -> Result<Self, Error> {
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| map_error("begin a write transaction", e))?;
        Ok(Self { conn, open: true })
    }

    /// Commits.
    pub(crate) fn commit(mut self) -> Result<(), Error> {
        self.open = false;
        if self.conn.is_autocommit() {
            return Err(StoreError::new(
                ErrorKind::Other,
                "the effect ended the store's transaction itself (COMMIT or ROLLBACK), so the \
                 record could not commit with it; leave committing to the store",
            )
            .into());
        }
        self.conn
            .execute_batch("COMMIT")
            .map_err(|e| map_error("commit", e))
    }
}

impl Deref for WriteTx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl DerefMut for WriteTx<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        if self.open && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}
