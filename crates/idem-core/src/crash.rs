//! Crash points: named places in the apply path, the HTTP layer, the relay
//! and the consumers where a process can be made to abort itself, to prove
//! on a real system what a crash at the worst moment does.
//!
//! They are compiled into every build and cost one atomic load each while
//! nothing is armed. A process arms them from the `IDEM_CRASH` environment
//! variable, a comma-separated list of points, each optionally followed by
//! when to fire:
//!
//! - `apply.after-commit` — the first time the point is reached;
//! - `apply.after-commit:#5` — the fifth time;
//! - `apply.after-commit:0.05` — each time with probability 0.05.
//!
//! When a point fires, the process writes one line to stderr naming it and
//! aborts (`SIGABRT`): no destructor runs, no buffer is flushed, nothing is
//! committed or acked after it — what a `kill -9` at that instant would do.
//!
//! | point | where |
//! | --- | --- |
//! | `apply.after-claim` | the key is claimed (atomic: the transaction is open; leased: the claim is committed; at most once: the key is recorded), the effect has not run |
//! | `apply.inside-effect` | the effect ran; its record is not written (atomic: not committed; leased: not completed) |
//! | `apply.after-commit` | the effect and its record are committed; the caller has not been told |
//! | `http.before-answer` | the HTTP layer stored the answer; the response is not sent |
//! | `consume.before-ack` | a consumer's message is applied (or replayed); the broker has no ack |
//! | `relay.after-publish` | the relay's message is published and confirmed; the row is not marked sent |

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms crash points.
pub const ENV: &str = "IDEM_CRASH";

/// Every crash point, by name.
pub const POINTS: [&str; 6] = [
    AFTER_CLAIM,
    INSIDE_EFFECT,
    AFTER_COMMIT,
    BEFORE_ANSWER,
    BEFORE_ACK,
    AFTER_PUBLISH,
];

/// The key is claimed, the effect has not run.
pub const AFTER_CLAIM: &str = "apply.after-claim";
/// The effect ran, its record is not written.
pub const INSIDE_EFFECT: &str = "apply.inside-effect";
/// Effect and record committed, the caller not told.
pub const AFTER_COMMIT: &str = "apply.after-commit";
/// The HTTP layer stored the answer, the response is not sent.
pub const BEFORE_ANSWER: &str = "http.before-answer";
/// A consumer applied its message, the broker has no ack.
pub const BEFORE_ACK: &str = "consume.before-ack";
/// The relay published a message, its row is not marked sent.
pub const AFTER_PUBLISH: &str = "relay.after-publish";

/// When an armed point fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// The n-th time it is reached (1-based).
    Nth(u64),
    /// Each time, with this probability.
    Probability(f64),
}

/// An `IDEM_CRASH` value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ENV}={value:?}: {why}; write POINT[:#N|:P] separated by commas, POINT one of {}", POINTS.join(", "))]
pub struct ArmError {
    value: String,
    why: String,
}

#[derive(Debug)]
struct Armed {
    point: &'static str,
    trigger: Trigger,
    reached: AtomicU64,
}

static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();

/// Reads the points to arm from `value` (the syntax of `IDEM_CRASH`).
fn parse(value: &str) -> Result<Vec<Armed>, ArmError> {
    let fail = |why: String| ArmError {
        value: value.to_owned(),
        why,
    };
    let mut armed = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, when) = match entry.split_once(':') {
            Some((name, when)) => (name.trim(), Some(when.trim())),
            None => (entry, None),
        };
        let point = POINTS
            .iter()
            .copied()
            .find(|p| *p == name)
            .ok_or_else(|| fail(format!("{name:?} is not a crash point")))?;
        let trigger = match when {
            None => Trigger::Nth(1),
            Some(n) if n.starts_with('#') => match n[1..].parse::<u64>() {
                Ok(n) if n > 0 => Trigger::Nth(n),
                _ => return Err(fail(format!("{n:?} is not a count such as #3"))),
            },
            Some(p) => match p.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Trigger::Probability(p),
                _ => {
                    return Err(fail(format!(
                        "{p:?} is neither a count such as #3 nor a probability from 0 to 1"
                    )));
                }
            },
        };
        armed.push(Armed {
            point,
            trigger,
            reached: AtomicU64::new(0),
        });
    }
    Ok(armed)
}

/// Arms the points `IDEM_CRASH` names, once per process; later calls return
/// the first answer. A process that wants a bad value refused at start-up
/// calls this first; otherwise the first [`point`] reads the variable and
/// ignores a value it cannot read (after saying so on stderr).
pub fn arm_from_env() -> Result<(), ArmError> {
    let mut result = Ok(());
    ARMED.get_or_init(|| match std::env::var(ENV) {
        Err(_) => Vec::new(),
        Ok(value) => match parse(&value) {
            Ok(armed) => armed,
            Err(error) => {
                result = Err(error);
                Vec::new()
            }
        },
    });
    result
}

/// Marks that the process reached crash point `name`; aborts the process if
/// `IDEM_CRASH` armed it and its trigger fires.
#[inline]
pub fn point(name: &'static str) {
    let armed = ARMED.get_or_init(|| match std::env::var(ENV) {
        Err(_) => Vec::new(),
        Ok(value) => parse(&value).unwrap_or_else(|error| {
            eprintln!("idem: crash points not armed: {error}");
            Vec::new()
        }),
    });
    if !armed.is_empty() {
        reached(armed, name);
    }
}

#[cold]
fn reached(armed: &[Armed], name: &'static str) {
    for arm in armed.iter().filter(|arm| arm.point == name) {
        let count = arm.reached.fetch_add(1, Ordering::Relaxed) + 1;
        let fire = match arm.trigger {
            Trigger::Nth(n) => count == n,
            Trigger::Probability(p) => unit_random() < p,
        };
        if fire {
            eprintln!("idem: crash point {name} reached (pass {count}, armed by {ENV}); aborting");
            std::process::abort();
        }
    }
}

/// A number in [0, 1) from the standard library's randomly keyed hasher
/// (a new key per call), so this module needs no random-number crate.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_documented() {
        let armed =
            parse("apply.after-commit, relay.after-publish:#3 ,consume.before-ack:0.25").unwrap();
        let read: Vec<_> = armed.iter().map(|a| (a.point, a.trigger)).collect();
        assert_eq!(
            read,
            [
                (AFTER_COMMIT, Trigger::Nth(1)),
                (AFTER_PUBLISH, Trigger::Nth(3)),
                (BEFORE_ACK, Trigger::Probability(0.25)),
            ]
        );
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_values_say_what_to_write() {
        for (bad, says) in [
            (
                "apply.after-comit",
                "\"apply.after-comit\" is not a crash point",
            ),
            ("apply.after-commit:#0", "not a count such as #3"),
            ("apply.after-commit:1.5", "probability from 0 to 1"),
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(error.contains("apply.after-claim"), "{error}");
        }
    }

    #[test]
    fn random_numbers_spread_over_the_unit_interval() {
        let draws: Vec<f64> = (0..2000).map(|_| unit_random()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let low = draws.iter().filter(|d| **d < 0.5).count();
        assert!((800..1200).contains(&low), "{low} of 2000 below 0.5");
    }
}
