//! Proof tools for Idem: what happened, written down, and checked.
//!
//! Effectively-once cannot be shown by a test that passes; it is shown by
//! recording what every client asked and was told (a *history*), reading
//! what the system actually did (an *effect log*), and checking the two
//! against each other. Modules:
//!
//! - [`history`]: one JSON object per line for each step of an operation —
//!   `invoke`, then `ok`, `fail` or `unknown` — with the process, the key,
//!   the payload's fingerprint and the answer;
//! - [`effects`]: one JSON object per line for each effect the system
//!   applied, with the key that caused it and, for guarded writes, the
//!   resource and its fencing token or version; with the `sqlite` or
//!   `postgres` feature, the same read from a query on the user's database;
//! - [`check()`]: the rules, the history against the effect log;
//! - [`report`]: what a check found, for people and for scripts;
//! - [`audit`]: the live auditor, which reads the effect log incrementally
//!   beside a running service and compares it with the store's records.
//!
//! ```
//! use idem_check::history::{Answer, Event};
//! use idem_check::{Effect, ViolationKind, check};
//!
//! let invoke = |op| Event::Invoke {
//!     op, process: "client-1".into(), at_ms: 0, scope: None,
//!     key: Some("order-42".into()), fingerprint: None, request: None, duplicate_of: None,
//! };
//! let ok = |op| Event::Ok {
//!     op, process: "client-1".into(), at_ms: 1,
//!     answer: Answer { status: 201, body_hash: None, replayed: op > 1 },
//! };
//! let history = [invoke(1), ok(1), invoke(2), ok(2)];
//! let once = [Effect { key: "order-42".into(), scope: None, resource: None, fence: None }];
//! assert!(check(&history, &once).is_clean());
//!
//! let twice = [once[0].clone(), once[0].clone()];
//! let report = check(&history, &twice);
//! assert_eq!(report.violations[0].kind, ViolationKind::DoubleEffect);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod audit;
mod check;
pub mod effects;
pub mod history;
pub mod report;

pub use check::check;
pub use effects::{Effect, LoggedEffect};
pub use history::Event;
pub use report::{Counts, Report, Violation, ViolationKind};
