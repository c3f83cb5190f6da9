//! Slowing down token guesses: a wrong token at `/login` or in an
//! `Authorization` header is a failure, counted per client address (an IPv6
//! client by its /64) and over all clients.
//!
//! The first [`FREE_PER_ADDRESS`] failures of an address cost nothing;
//! after them each attempt from it must wait 1 s after its last failure,
//! then 2 s, 4 s, … up to [`MOST_PER_ADDRESS`]. Over all addresses the first
//! [`FREE_OVERALL`] failures are free and the wait grows the same way up to
//! [`MOST_OVERALL`]. An attempt that comes too early is not tried: it is
//! answered `429 Too Many Requests` with `Retry-After`. Failures are
//! forgotten [`FORGET_AFTER`] after the last one, and only then: a good
//! token does not wipe them, or a holder of the read-only token could guess
//! the operator's between two sign-ins of its own.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::Duration;

use idem::Timestamp;

/// Failures of one address that cost nothing.
pub const FREE_PER_ADDRESS: u32 = 5;
/// The longest wait one address is made to keep.
pub const MOST_PER_ADDRESS: Duration = Duration::from_secs(15 * 60);
/// Failures over all addresses that cost nothing.
pub const FREE_OVERALL: u32 = 50;
/// The longest wait every address is made to keep.
pub const MOST_OVERALL: Duration = Duration::from_secs(30);
/// How long after the last failure the failures are forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The most addresses whose failures are kept; past it new addresses are
/// limited by the overall count only.
const MOST_ADDRESSES: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Timestamp,
}

impl Failures {
    fn forgotten(&self, now: Timestamp) -> bool {
        now >= self.last.plus(FORGET_AFTER)
    }

    /// How long an attempt at `now` must still wait.
    fn wait(&self, now: Timestamp, free: u32, most: Duration) -> Option<Duration> {
        if self.forgotten(now) || self.count < free {
            return None;
        }
        let doublings = (self.count - free).min(20);
        let delay = Duration::from_secs(1u64 << doublings).min(most);
        let ready = self.last.plus(delay);
        (now < ready).then(|| now.until(ready))
    }

    fn add(slot: &mut Option<Self>, now: Timestamp) {
        *slot = Some(match *slot {
            Some(failures) if !failures.forgotten(now) => Self {
                count: failures.count.saturating_add(1),
                last: now,
            },
            _ => Self {
                count: 1,
                last: now,
            },
        });
    }
}

#[derive(Debug, Default)]
struct State {
    overall: Option<Failures>,
    by_address: HashMap<IpAddr, Failures>,
}

/// The failed sign-ins of one console.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

/// The bucket of a client: its IPv4 address, or its IPv6 /64.
fn bucket(peer: Option<IpAddr>) -> IpAddr {
    match peer {
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        Some(v4) => v4,
        None => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

impl Throttle {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long an attempt from `peer` at `now` must still wait; `None`
    /// when it may be tried.
    pub(crate) fn wait(&self, peer: Option<IpAddr>, now: Timestamp) -> Option<Duration> {
        let state = self.state();
        let own = state
            .by_address
            .get(&bucket(peer))
            .and_then(|f| f.wait(now, FREE_PER_ADDRESS, MOST_PER_ADDRESS));
        let overall = state
            .overall
            .and_then(|f| f.wait(now, FREE_OVERALL, MOST_OVERALL));
        own.max(overall)
    }

    /// Counts a wrong token from `peer`.
    pub(crate) fn failed(&self, peer: Option<IpAddr>, now: Timestamp) {
        let mut state = self.state();
        Failures::add(&mut state.overall, now);
        let bucket = bucket(peer);
        if state.by_address.len() >= MOST_ADDRESSES && !state.by_address.contains_key(&bucket) {
            state.by_address.retain(|_, f| !f.forgotten(now));
            if state.by_address.len() >= MOST_ADDRESSES {
                return;
            }
        }
        let mut slot = state.by_address.get(&bucket).copied();
        Failures::add(&mut slot, now);
        if let Some(failures) = slot {
            state.by_address.insert(bucket, failures);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use idem::Timestamp;

    use super::{FORGET_AFTER, FREE_OVERALL, FREE_PER_ADDRESS, MOST_PER_ADDRESS, Throttle};

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn an_address_waits_longer_after_each_failure_past_the_free_ones() {
        let throttle = Throttle::default();
        let mut now = Timestamp(1_000_000);
        let peer = ip("192.0.2.7");
        for _ in 0..FREE_PER_ADDRESS {
            assert_eq!(throttle.wait(peer, now), None);
            throttle.failed(peer, now);
        }
        assert_eq!(throttle.wait(peer, now), Some(Duration::from_secs(1)));
        assert_eq!(throttle.wait(ip("192.0.2.8"), now), None, "another address");
        let mut waits = Vec::new();
        for _ in 0..12 {
            let wait = throttle.wait(peer, now).unwrap();
            waits.push(wait.as_secs());
            now = now.plus(wait);
            assert_eq!(throttle.wait(peer, now), None);
            throttle.failed(peer, now);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]);
        assert_eq!(throttle.wait(peer, now), Some(MOST_PER_ADDRESS));
        assert_eq!(throttle.wait(peer, now.plus(FORGET_AFTER)), None);
    }

    #[test]
    fn an_ipv6_client_counts_by_its_prefix_and_everyone_together() {
        let throttle = Throttle::default();
        let now = Timestamp(1_000_000);
        for i in 0..FREE_PER_ADDRESS {
            throttle.failed(ip(&format!("2001:db8:1:2::{i:x}")), now);
        }
        assert!(throttle.wait(ip("2001:db8:1:2::ffff"), now).is_some());
        assert!(throttle.wait(ip("2001:db8:1:3::1"), now).is_none());
        for i in FREE_PER_ADDRESS..FREE_OVERALL {
            throttle.failed(ip(&format!("198.51.100.{i}")), now);
        }
        assert_eq!(
            throttle.wait(ip("203.0.113.1"), now),
            Some(Duration::from_secs(1)),
            "the overall count"
        );
    }
}
