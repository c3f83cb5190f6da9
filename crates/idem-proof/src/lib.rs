//! What users run to prove their own systems effectively-once, apart from the
//! product: the `idem` binary's `idem dup-proxy` and `idem torture` commands
//! are thin wrappers over this crate.
//!
//! # Modules
//!
//! - [`dup_proxy`]: a reverse proxy for staging that sends a share of the
//!   requests twice and reports the routes that answer the copy as a new
//!   request (`idem dup-proxy`), built on the gateway's proxy pieces of
//!   `idem-http`; its history is in `idem-check`'s format;
//! - [`torture`]: a fault campaign over the real local stack (`idem
//!   torture`): the scenarios, the processes under test and what they depend
//!   on, the clients that write the history, the verdict per trial, and the
//!   report with its plots.
#![forbid(unsafe_code)]

pub mod dup_proxy;
pub mod torture;

pub use dup_proxy::DupProxyArgs;
pub use dup_proxy::command::run as dup_proxy;
pub use torture::{TortureArgs, run as torture};
