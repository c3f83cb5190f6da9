//! Idem's payment demo, apart from the product and from the lab: `idem demo`
//! and the `idem-demo` binary run [`run`] with [`DemoArgs`], and the
//! benchmarks of `idem-bench` run the same workload. It builds with the `idem`
//! facade and its embedded SQLite store alone; feature `postgres` adds the
//! workload's SQL for PostgreSQL.
//!
//! Modules:
//! - [`demo`]: the run: each payment delivered 1–3 times, shuffled, to
//!   concurrent workers, once to a naive handler and once through Idem, and
//!   the table comparing their effects;
//! - [`workload`]: the payment workload (accounts, a ledger, one debit) run
//!   bare or through atomic apply, written once against the atomic contract;
//! - [`ledger`]: the workload's SQL, the one part written per database;
//! - [`payment`]: a payment and the ledger's totals, which both speak;
//! - [`store`]: the store a run uses when none is given, a temporary SQLite
//!   file removed after the run.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod demo;
pub mod ledger;
pub mod payment;
pub mod store;
pub mod workload;

pub use demo::{DemoArgs, run};
