//! What a store implementation needs and an application does not: the
//! decision table every store follows ([`decide`]), the grouping of a batch's
//! operations by key ([`decide_batch`]), the shape of an atomic call
//! ([`TxCall`]), shared refusals, and the bulk seeding hook the benchmarks use.
//!
//! Applications write against the crate root ([`AtomicStore`](crate::AtomicStore),
//! [`LeaseStore`](crate::LeaseStore) and the stores); nothing here is needed
//! to use them.

pub use idem_core::{
    BatchPlan, Decision, Plan, RecordSeed, TxCall, UnknownState, decide, decide_batch,
    no_such_dead_letter, outcome_count_mismatch,
};
