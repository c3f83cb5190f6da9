//! Which way a leased claim or completion goes when group commit is on: in
//! the next group, or in a transaction of its own.
//!
//! A group saves commits and round trips per key, but each caller pays for
//! the hop to the runner, its look-up before queueing and the group's extra
//! statements. On a server that commits fast, with few callers at once, that
//! costs more than it saves; under a long queue or a slow disk it is the
//! other way round. So neither way is fixed: each kind of call keeps a moving
//! average of how long a call took each way, sends its calls the faster way,
//! and sends one call in [`EXPLORE_EVERY`] the other way, so the slower one's
//! average stays current as the load changes.
//!
//! The grouped way has to be faster by a quarter to be taken: what a group
//! costs the database (its look-up, its larger statements) is paid by every
//! caller, not in the grouped call's own time, so on a server with CPU to
//! spare the two averages sit close and going alone is the cheaper bet. When
//! commits are slow (a busy disk, a long queue at the server) a call alone
//! takes several times a grouped one, far past that margin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One call in this many takes the way that was slower, to keep measuring
/// it.
pub(crate) const EXPLORE_EVERY: u64 = 32;

/// A new measure's weight in the moving average: 1/2^`SHIFT`.
const SHIFT: u32 = 3;

/// The way a call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// In the next group, with the calls of other callers.
    Grouped,
    /// In a transaction of its own.
    Alone,
}

impl Way {
    /// The metrics label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Grouped => "grouped",
            Self::Alone => "alone",
        }
    }

    fn other(self) -> Self {
        match self {
            Self::Grouped => Self::Alone,
            Self::Alone => Self::Grouped,
        }
    }
}

/// The moving averages of one kind of call (claims, or completions).
#[derive(Debug, Default)]
pub(crate) struct Choice {
    calls: AtomicU64,
    /// Nanoseconds, 0 until measured.
    grouped: AtomicU64,
    alone: AtomicU64,
}

impl Choice {
    /// The way the next call goes: one not measured yet first, then the
    /// faster (grouped by a quarter, or else alone), and the other once in
    /// [`EXPLORE_EVERY`] calls.
    pub(crate) fn next(&self) -> Way {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let grouped = self.grouped.load(Ordering::Relaxed);
        let alone = self.alone.load(Ordering::Relaxed);
        if grouped == 0 {
            return Way::Grouped;
        }
        if alone == 0 {
            return Way::Alone;
        }
        let faster = if grouped.saturating_add(grouped / 4) < alone {
            Way::Grouped
        } else {
            Way::Alone
        };
        if n % EXPLORE_EVERY == EXPLORE_EVERY - 1 {
            faster.other()
        } else {
            faster
        }
    }

    /// Takes in how long a call that went `way` took. (Callers racing here
    /// may lose one another's measure; an average needs no exactness.)
    pub(crate) fn took(&self, way: Way, elapsed: Duration) {
        let slot = match way {
            Way::Grouped => &self.grouped,
            Way::Alone => &self.alone,
        };
        let measured = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1);
        let average = slot.load(Ordering::Relaxed);
        let next = if average == 0 {
            measured
        } else {
            average - (average >> SHIFT) + (measured >> SHIFT)
        };
        slot.store(next.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_way_is_measured_first_then_the_faster_is_taken() {
        let choice = Choice::default();
        assert_eq!(choice.next(), Way::Grouped);
        choice.took(Way::Grouped, Duration::from_millis(4));
        assert_eq!(choice.next(), Way::Alone);
        choice.took(Way::Alone, Duration::from_millis(1));
        let ways: Vec<Way> = (0..EXPLORE_EVERY * 4).map(|_| choice.next()).collect();
        let alone = ways.iter().filter(|w| **w == Way::Alone).count() as u64;
        assert_eq!(alone, EXPLORE_EVERY * 4 - 4, "{ways:?}");
    }

    #[test]
    fn grouped_is_taken_only_when_clearly_faster() {
        let choice = Choice::default();
        choice.took(Way::Grouped, Duration::from_micros(900));
        choice.took(Way::Alone, Duration::from_micros(1000));
        assert_eq!(
            choice.next(),
            Way::Alone,
            "a tenth faster is within the margin"
        );
        let choice = Choice::default();
        choice.took(Way::Grouped, Duration::from_micros(700));
        choice.took(Way::Alone, Duration::from_micros(1000));
        assert_eq!(choice.next(), Way::Grouped);
    }

    #[test]
    fn the_choice_follows_the_load() {
        let choice = Choice::default();
        choice.took(Way::Grouped, Duration::from_millis(4));
        choice.took(Way::Alone, Duration::from_millis(1));
        assert_eq!(choice.next(), Way::Alone);
        // The commits slow down alone (a long queue at the server): the
        // explored grouped calls stay fast, and the average crosses over.
        for _ in 0..64 {
            choice.took(Way::Alone, Duration::from_millis(10));
        }
        let ways: Vec<Way> = (0..EXPLORE_EVERY).map(|_| choice.next()).collect();
        assert_eq!(
            ways.iter().filter(|w| **w == Way::Grouped).count() as u64,
            EXPLORE_EVERY - 1
        );
    }
}
