//! The HTTP layer's test helpers: the sockets and client are the test kit's
//! (`idem_testkit::http`); the bank behind the atomic handlers is here.

#![allow(dead_code, unused_imports)]

pub(crate) use idem_testkit::http::*;

pub(crate) mod bank;

/// A database of its own for one test.
pub(crate) mod pg {
    pub(crate) use idem_testkit::http::PgDatabase;
}
