//! What users run to prove their own systems effectively-once, apart from the
//! product: the `idem` binary's `idem dup-proxy`, `idem conformance` and
//! `idem torture` commands are thin wrappers over this crate.
//!
//! # Modules
//!
//! - [`conformance`](mod@conformance): tests any HTTP endpoint that claims
//!   `Idempotency-Key` semantics, rule by rule (a retry replayed, a reused
//!   key refused, concurrent duplicates applied once, malformed keys
//!   refused, …), counting the server's effects when it can read them.
//!   [`conformance()`] runs `idem conformance` with its flags
//!   ([`ConformanceArgs`]);
//! - [`dup_proxy`](mod@dup_proxy): a reverse proxy for staging that sends a
//!   share of the requests twice and reports the routes that answer the copy
//!   as a new request, built on the gateway's proxy pieces of `idem-http`;
//!   its history is in `idem-check`'s format. [`dup_proxy()`] runs `idem
//!   dup-proxy` with its flags ([`DupProxyArgs`]);
//! - [`torture`](mod@torture): a fault campaign over the real local stack:
//!   the scenarios, the processes under test and what they depend on, the
//!   clients that write the history, the verdict per trial, and the report
//!   with its plots. [`torture()`] runs `idem torture` with its flags
//!   ([`TortureArgs`]). Feature `torture`, off by default: it brings
//!   `idem-testkit`, the broker clients and the plots, which the other two
//!   need none of.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod conformance;
pub mod dup_proxy;
#[cfg(feature = "torture")]
#[cfg_attr(docsrs, doc(cfg(feature = "torture")))]
pub mod torture;

pub use conformance::ConformanceArgs;
pub use conformance::command::run as conformance;
pub use dup_proxy::DupProxyArgs;
pub use dup_proxy::command::run as dup_proxy;
#[cfg(feature = "torture")]
#[cfg_attr(docsrs, doc(cfg(feature = "torture")))]
pub use torture::{TortureArgs, run as torture};
