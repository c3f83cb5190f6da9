//! In-process try-locks on keys.
//!
//! SQLite has a single writer, so a second caller with the same key would
//! otherwise wait in the writer's queue until the first caller's transaction
//! commits. Instead, a caller first takes a hold on its `(scope, key)` in this
//! process; a concurrent duplicate finds the hold taken and is answered
//! `InFlight` at once. The hold is released when the caller's write finishes.
//! Across processes sharing one file, SQLite's own lock serialises writers for
//! at most the busy timeout; that store is meant for one process.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

type Pair = (String, String);

/// The set of keys held by callers in this process.
#[derive(Debug, Default, Clone)]
pub(crate) struct Holds(Arc<Mutex<HashSet<Pair>>>);

/// A held key; dropping it releases the hold.
#[derive(Debug)]
pub(crate) struct Hold {
    set: Arc<Mutex<HashSet<Pair>>>,
    pair: Pair,
}

impl Holds {
    /// Takes the hold on `(scope, key)`, or `None` if another caller has it.
    pub(crate) fn try_hold(&self, scope: &str, key: &str) -> Option<Hold> {
        let pair = (scope.to_owned(), key.to_owned());
        let inserted = self
            .0
            .lock()
            .expect("hold set poisoned")
            .insert(pair.clone());
        inserted.then(|| Hold {
            set: Arc::clone(&self.0),
            pair,
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.set
            .lock()
            .expect("hold set poisoned")
            .remove(&self.pair);
    }
}
