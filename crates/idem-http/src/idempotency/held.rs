//! Keys this process holds after an unknown outcome, with the end of their
//! lease: what makes the 409 a retry meets say how long the key really
//! stays reserved, instead of the short hint given for an original that is
//! still running.
//!
//! Only the process that saw the unknown outcome knows it; another gateway
//! instance sharing the store answers such a retry with the usual short
//! in-flight hint, which is safe (the client comes back sooner and is told
//! again). With a probe there is nothing to remember: the lease is ended at
//! once and the next retry asks the probe.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_core::{IdempotencyKey, Scope, Timestamp};

/// The most keys remembered; past it, those whose lease ended are forgotten
/// first, and a key that finds no room gets the short hint.
const MOST: usize = 100_000;

/// Keys held after an unknown outcome, and when their leases end.
#[derive(Debug, Default)]
pub(crate) struct HeldUnknown {
    keys: Mutex<HashMap<(Scope, IdempotencyKey), Timestamp>>,
}

impl HeldUnknown {
    /// Remembers that `(scope, key)` is held until `lease_until`.
    pub(crate) fn hold(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        lease_until: Timestamp,
        now: Timestamp,
    ) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.len() >= MOST {
            keys.retain(|_, until| *until > now);
        }
        if keys.len() < MOST {
            keys.insert((scope.clone(), key.clone()), lease_until);
        }
    }

    /// How long `(scope, key)` stays reserved, if this process holds it
    /// after an unknown outcome and its lease has not ended.
    pub(crate) fn left(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Option<Duration> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let id = (scope.clone(), key.clone());
        match keys.get(&id) {
            Some(until) if *until > now => Some(now.until(*until)),
            Some(_) => {
                keys.remove(&id);
                None
            }
            None => None,
        }
    }

    /// Forgets `(scope, key)`: a later attempt settled or released it.
    pub(crate) fn forget(&self, scope: &Scope, key: &IdempotencyKey) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if !keys.is_empty() {
            keys.remove(&(scope.clone(), key.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_key_says_its_time_left_until_the_lease_ends() {
        let held = HeldUnknown::default();
        let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
        assert_eq!(held.left(&scope, &key, Timestamp(0)), None);
        held.hold(&scope, &key, Timestamp(60_000), Timestamp(0));
        assert_eq!(
            held.left(&scope, &key, Timestamp(15_000)),
            Some(Duration::from_secs(45))
        );
        assert_eq!(held.left(&scope, &key, Timestamp(60_000)), None);
        held.hold(&scope, &key, Timestamp(90_000), Timestamp(60_000));
        held.forget(&scope, &key);
        assert_eq!(held.left(&scope, &key, Timestamp(61_000)), None);
    }
}
