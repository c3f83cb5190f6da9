//! The leased-mode conformance rows against the machine's Redis, each test
//! under a key prefix of its own.

mod common;

idem_testkit::leased_conformance_suite!(common::Redis);
