//! The live auditor behind `idem audit`: it reads a service's effect log
//! beside the service, incrementally, and reports what must never happen
//! under effectively-once processing:
//!
//! - a **double effect**: one key with two or more effects inside its
//!   dedupe window;
//! - a **missing effect**: a completed record whose effect the log does
//!   not hold, a grace period after the record completed;
//! - an **effect without a record**: an effect of an audited scope whose
//!   key has no record.
//!
//! Modules: [`Auditor`] holds the rules and the memory and does no I/O;
//! [`Audit`] runs passes of it over an [`EffectLog`] (the effects query in
//! pages past a cursor) and a [`RecordScan`](idem_core::RecordScan) store;
//! [`Finding`] is what it reports.
//!
//! Each effect row is read once, and each record is judged once, so a
//! finding is reported once by a running auditor; a restarted one reads
//! from where it is told to start.

mod auditor;
mod finding;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod pass;

pub use auditor::{AuditSettings, Auditor, Judged};
pub use finding::{Finding, FindingKind, RecordSeen};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use pass::{Audit, AuditError, EffectLog, PassLimits, PassReport, SqlLog};
