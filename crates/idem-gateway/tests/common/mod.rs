//! The gateway's test helpers: the sockets and client are the test kit's
//! (`idem_testkit::http`); a gateway in front of an upstream, and a store of
//! each kind, are here.

#![allow(dead_code, unused_imports)]

pub(crate) use idem_testkit::http::*;

pub(crate) mod gateway;
#[macro_use]
pub(crate) mod stores;

/// A database of its own for one test.
pub(crate) mod pg {
    pub(crate) use idem_testkit::http::PgDatabase;
}
