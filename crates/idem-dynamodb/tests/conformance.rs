//! The leased-mode conformance rows against moto's DynamoDB, each test on a
//! table of its own.

mod common;

idem_testkit::leased_conformance_suite!(common::Dynamo);
