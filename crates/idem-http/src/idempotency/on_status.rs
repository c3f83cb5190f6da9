//! [`StatusPolicy`]: what an answer that came back after the request was sent
//! means for its key — [`Verdict::Store`], [`Verdict::Release`] or
//! [`Verdict::Unknown`] — by its status, exact code or class.
//!
//! # Why three verdicts
//!
//! Storing every answer would turn a "try again" (503, 429) into a permanent
//! refusal; releasing every 5xx, as a status-blind layer does, lets the retry
//! of "502, but the payment went through" charge again. A 502 or 504 from a
//! load balancer, or a 500 from an application that crashed after its commit,
//! says nothing about whether the effect happened: those keep the claim and
//! are reconciled (asked about with the probe, or held until the lease ends).
//!
//! | status | verdict |
//! |---|---|
//! | 2xx | store |
//! | 4xx except 408, 409, 425, 429 | store |
//! | 408, 409, 425, 429 | release |
//! | 502, 504 | unknown |
//! | 500 | unknown with a probe, release without one |
//! | 503 and other 5xx, 1xx, 3xx | release |
//!
//! 500 depends on the probe because it is the one status both a crash after
//! the commit and a plain bug answer with. With a probe the upstream is
//! asked, and a bug costs one question; without one, holding every 500 for
//! a lease would block the retries of every request a bug refused.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use http::StatusCode;

/// What an answer means for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The answer is final: recorded and replayed to every duplicate.
    Store,
    /// Nothing happened upstream: the key is freed and the next retry is
    /// forwarded.
    Release,
    /// The effect may or may not have happened: the claim is kept and
    /// reconciled — with a probe, the next retry asks it at once; without
    /// one, the key stays reserved until its lease ends.
    Unknown,
}

impl Verdict {
    /// `store`, `release` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Release => "release",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Verdict {
    type Err = StatusPolicyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "store" => Ok(Self::Store),
            "release" => Ok(Self::Release),
            "unknown" => Ok(Self::Unknown),
            other => Err(StatusPolicyError(format!(
                "`{other}` is not a verdict; write store, release or unknown"
            ))),
        }
    }
}

/// Which answers a rule covers: one code (`502`) or a class (`5xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatusRule {
    /// Exactly this code.
    Code(u16),
    /// Every code of this class: `5` for `5xx`.
    Class(u8),
}

impl StatusRule {
    fn covers(self, status: StatusCode) -> bool {
        match self {
            Self::Code(code) => status.as_u16() == code,
            Self::Class(class) => status.as_u16() / 100 == u16::from(class),
        }
    }
}

impl fmt::Display for StatusRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(code) => write!(f, "{code}"),
            Self::Class(class) => write!(f, "{class}xx"),
        }
    }
}

impl FromStr for StatusRule {
    type Err = StatusPolicyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim().to_ascii_lowercase();
        let bad = || {
            StatusPolicyError(format!(
                "`{text}` is not a status; write a code from 100 to 599 (`502`) or a class (`5xx`)"
            ))
        };
        if let Some(class) = text.strip_suffix("xx") {
            return match class.parse::<u8>() {
                Ok(digit @ 1..=5) if class.len() == 1 => Ok(Self::Class(digit)),
                _ => Err(bad()),
            };
        }
        match text.parse::<u16>() {
            Ok(code @ 100..=599) => Ok(Self::Code(code)),
            _ => Err(bad()),
        }
    }
}

/// A status policy that cannot be used; the message says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StatusPolicyError(String);

/// What each answer status means for its key: the defaults of the module's
/// table, with rules set per code or class on top. An exact code's rule wins
/// over its class's.
///
/// ```
/// use http::StatusCode;
/// use idem_http::{StatusPolicy, Verdict};
///
/// let policy: StatusPolicy = "500=store,5xx=unknown".parse()?;
/// assert_eq!(policy.verdict(StatusCode::INTERNAL_SERVER_ERROR, false), Verdict::Store);
/// assert_eq!(policy.verdict(StatusCode::SERVICE_UNAVAILABLE, false), Verdict::Unknown);
/// assert_eq!(policy.verdict(StatusCode::CREATED, false), Verdict::Store);
///
/// let standard = StatusPolicy::standard();
/// assert_eq!(standard.verdict(StatusCode::BAD_GATEWAY, false), Verdict::Unknown);
/// assert_eq!(standard.verdict(StatusCode::INTERNAL_SERVER_ERROR, true), Verdict::Unknown);
/// assert_eq!(standard.verdict(StatusCode::INTERNAL_SERVER_ERROR, false), Verdict::Release);
/// assert_eq!(standard.verdict(StatusCode::TOO_MANY_REQUESTS, true), Verdict::Release);
/// # Ok::<(), idem_http::StatusPolicyError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusPolicy {
    rules: BTreeMap<StatusRule, Verdict>,
}

impl StatusPolicy {
    /// The defaults alone.
    pub fn standard() -> Self {
        Self::default()
    }

    /// This policy with `rule` answered by `verdict`.
    pub fn on(mut self, rule: StatusRule, verdict: Verdict) -> Self {
        self.rules.insert(rule, verdict);
        self
    }

    /// The rules set on top of the defaults.
    pub fn rules(&self) -> impl Iterator<Item = (StatusRule, Verdict)> + '_ {
        self.rules.iter().map(|(rule, verdict)| (*rule, *verdict))
    }

    /// What an answer with `status` means, `probed` saying whether a probe
    /// (a reconcile hook) can be asked about an unknown outcome.
    pub fn verdict(&self, status: StatusCode, probed: bool) -> Verdict {
        let exact = self.rules.get(&StatusRule::Code(status.as_u16()));
        let class = || {
            self.rules
                .iter()
                .find(|(rule, _)| matches!(rule, StatusRule::Class(_)) && rule.covers(status))
                .map(|(_, verdict)| verdict)
        };
        match exact.or_else(class) {
            Some(verdict) => *verdict,
            None => standard_verdict(status, probed),
        }
    }

    /// Whether an answer with `status` is stored (the atomic handlers, whose
    /// effect rolls back with any answer that is not).
    pub fn stores(&self, status: StatusCode) -> bool {
        self.verdict(status, false) == Verdict::Store
    }

    /// The policy as the start-up line shows it: `standard` and the rules
    /// set on top, `standard,500=store,5xx=unknown`.
    pub fn describe(&self) -> String {
        let mut text = String::from("standard");
        for (rule, verdict) in &self.rules {
            text.push_str(&format!(",{rule}={verdict}"));
        }
        text
    }
}

/// The verdict of the defaults.
fn standard_verdict(status: StatusCode, probed: bool) -> Verdict {
    match status.as_u16() {
        408 | 409 | 425 | 429 => Verdict::Release,
        200..=299 | 400..=499 => Verdict::Store,
        502 | 504 => Verdict::Unknown,
        500 if probed => Verdict::Unknown,
        _ => Verdict::Release,
    }
}

impl FromStr for StatusPolicy {
    type Err = StatusPolicyError;

    /// Rules separated by commas, each `STATUS=VERDICT`: `500=store,502=unknown,4xx=store`.
    /// `standard` (or nothing) is the defaults alone.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut policy = Self::standard();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.eq_ignore_ascii_case("standard") {
                continue;
            }
            let Some((rule, verdict)) = part.split_once('=') else {
                return Err(StatusPolicyError(format!(
                    "`{part}` is not a rule; write STATUS=VERDICT, as in 500=store or 5xx=unknown"
                )));
            };
            policy = policy.on(rule.parse()?, verdict.parse()?);
        }
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(policy: &StatusPolicy, code: u16, probed: bool) -> Verdict {
        policy.verdict(StatusCode::from_u16(code).unwrap(), probed)
    }

    #[test]
    fn the_defaults_are_the_documented_table() {
        let standard = StatusPolicy::standard();
        for probed in [false, true] {
            for code in [200, 201, 204, 400, 402, 404, 410, 422] {
                assert_eq!(verdict(&standard, code, probed), Verdict::Store, "{code}");
            }
            for code in [101, 301, 304, 408, 409, 425, 429, 501, 503, 505] {
                assert_eq!(verdict(&standard, code, probed), Verdict::Release, "{code}");
            }
            for code in [502, 504] {
                assert_eq!(verdict(&standard, code, probed), Verdict::Unknown, "{code}");
            }
        }
        assert_eq!(verdict(&standard, 500, true), Verdict::Unknown);
        assert_eq!(verdict(&standard, 500, false), Verdict::Release);
    }

    #[test]
    fn an_exact_code_wins_over_its_class() {
        let policy: StatusPolicy = "5xx=store, 503=release ,500=unknown".parse().unwrap();
        assert_eq!(verdict(&policy, 500, false), Verdict::Unknown);
        assert_eq!(verdict(&policy, 503, false), Verdict::Release);
        assert_eq!(verdict(&policy, 502, false), Verdict::Store);
        assert_eq!(verdict(&policy, 404, false), Verdict::Store);
        assert_eq!(
            policy.describe(),
            "standard,500=unknown,503=release,5xx=store"
        );
        assert_eq!(policy.describe().parse::<StatusPolicy>().unwrap(), policy);
    }

    #[test]
    fn bad_rules_say_what_to_write() {
        for (text, hint) in [
            ("500", "STATUS=VERDICT"),
            ("500=maybe", "store, release or unknown"),
            ("600=store", "from 100 to 599"),
            ("6xx=store", "a class"),
            ("05xx=store", "a class"),
            ("abc=store", "from 100 to 599"),
        ] {
            let error = text.parse::<StatusPolicy>().unwrap_err().to_string();
            assert!(error.contains(hint), "{text}: {error}");
        }
        assert_eq!(
            "".parse::<StatusPolicy>().unwrap(),
            StatusPolicy::standard()
        );
        assert_eq!(
            "standard".parse::<StatusPolicy>().unwrap(),
            StatusPolicy::standard()
        );
    }
}
