//! Proof tools for Idem: what happened, written down, and checked.
//!
//! Effectively-once cannot be shown by a test that passes; it is shown by
//! recording what every client asked and was told (a *history*), reading
//! what the system actually did (an *effect log*), and checking the two
//! against each other. This crate holds both formats:
//!
//! - [`history`]: one JSON object per line for each step of an operation —
//!   `invoke`, then `ok`, `fail` or `unknown` — with the process, the key,
//!   the payload's fingerprint and the answer;
//! - [`effects`]: one JSON object per line for each effect the system
//!   applied, with the key that caused it and, for guarded writes, the
//!   resource and its fencing token or version.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod effects;
pub mod history;
