//! Keys this process holds after an unknown outcome, with the end of their
//! lease, so a retry meanwhile is told how long the key really stays
//! reserved instead of the short hint given for a call still running.
//!
//! The end is kept on this process's monotonic clock (the moment the claim
//! was renewed, plus the lease), so the layer needs nothing of the store but
//! its lease: the time told is late by at most the renewal's round trip.
//!
//! Only the process that saw the unknown outcome knows it; another server
//! sharing the store answers such a retry with the usual short in-flight
//! pushback, which is safe (the client comes back sooner and is told again).
//! With a reconcile hook nothing is held: the lease is ended at once and the
//! next retry asks the hook.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::{IdempotencyKey, Scope};

/// The most keys remembered; past it, those whose lease ended are dropped
/// first, and a key that finds no room gets the short pushback.
const MOST: usize = 100_000;

/// Keys held after an unknown outcome, and when their leases end.
#[derive(Debug, Default)]
pub(crate) struct Held {
    until: Mutex<HashMap<(Scope, IdempotencyKey), Instant>>,
}

impl Held {
    /// Remembers that `(scope, key)` is reserved until `lease_until`.
    pub(crate) fn hold(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        lease_until: Instant,
        now: Instant,
    ) {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if until.len() >= MOST {
            until.retain(|_, end| *end > now);
        }
        if until.len() < MOST {
            until.insert((scope.clone(), key.clone()), lease_until);
        }
    }

    /// How long `(scope, key)` stays reserved, if it is held and its lease
    /// has not ended.
    pub(crate) fn left(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Instant,
    ) -> Option<Duration> {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (scope.clone(), key.clone());
        let end = *until.get(&id)?;
        if end > now {
            return Some(end - now);
        }
        until.remove(&id);
        None
    }

    /// Forgets `(scope, key)`: a later call settled or released it.
    pub(crate) fn forget(&self, scope: &Scope, key: &IdempotencyKey) {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if !until.is_empty() {
            until.remove(&(scope.clone(), key.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_key_has_the_time_left_until_its_lease_ends() {
        let held = Held::default();
        let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(held.left(&scope, &key, at(0)), None);
        held.hold(&scope, &key, at(30), at(0));
        assert_eq!(
            held.left(&scope, &key, at(10)),
            Some(Duration::from_secs(20))
        );
        assert_eq!(held.left(&scope, &key, at(30)), None);
        held.hold(&scope, &key, at(60), at(30));
        held.forget(&scope, &key);
        assert_eq!(held.left(&scope, &key, at(31)), None);
    }
}
