//! What the consumer runtime needs of a store besides the effect's own
//! transaction: somewhere to record dead letters, and failed attempts counted
//! per message. Both are the store's tables, reached through the contracts of
//! `idem-core` ([`DeadLetterStore`], [`AttemptStore`]), so the runtime is
//! written once for every store.

use idem_core::{AttemptStore, DeadLetterStore};

/// A store a consumer can keep its dead letters and failure counts in.
/// Implemented for every store that holds both tables.
pub trait ConsumerStore: DeadLetterStore + AttemptStore + Clone + Send + Sync + 'static {}

impl<S> ConsumerStore for S where S: DeadLetterStore + AttemptStore + Clone + Send + Sync + 'static {}
