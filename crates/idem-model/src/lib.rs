//! An exhaustive model check of the claim / lease / fence protocol on one key.
//!
//! Unit tests and the conformance suite try the scenes someone thought of; a
//! model checker tries every interleaving of a small world. Here the world is
//! a few workers delivering the same key, a clock that moves in ticks and ends
//! leases, a store whose claims are decided by [`idem_core::decide`] itself
//! (the model borrows the decision table, it does not restate it), and a
//! resource outside the store that accepts a write only with a token at least
//! as new as the last it saw. Workers claim, write, complete, renew, release,
//! end their lease after an unknown outcome, crash, and stall (the clock
//! moves while they hold a claim); the checker
//! visits every state this can reach and checks the properties in each.
//!
//! Modules:
//! - [`config`]: the bounds of a run, the order of effect and record, and the
//!   bugs that can be planted in the store;
//! - [`store`]: the store's transitions, through `decide` and `Plan`;
//! - [`resource`]: the guarded write the effect makes;
//! - [`worker`]: what a worker remembers;
//! - [`model`]: the state, the steps and the properties;
//! - [`check`](mod@check): runs the checker and sorts what it found.
//!
//! ```
//! use idem_model::{Config, check};
//! let report = check(Config { workers: 2, horizon: 3, ..Config::default() });
//! assert!(report.counterexamples.is_empty());
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod config;
pub mod model;
pub mod resource;
pub mod store;
pub mod worker;

pub use check::{Report, check, first_counterexample};
pub use config::{Bug, Config, Order};
pub use model::{Action, ProtocolModel, State};
