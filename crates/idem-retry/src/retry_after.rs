//! The server's own word on when to come back, and how it bends the backoff.
//!
//! Why: a server that answers 429, 503 or an idempotent endpoint's 409 "still in
//! flight" with `Retry-After` knows better than any client-side guess when a
//! retry has a chance. Retrying sooner only spends budget on an answer that is
//! already known. So the next delay is *at least* the hint: the jittered delay
//! still applies when it is longer, so clients told the same instant do not all
//! return in the same millisecond.
//!
//! Why stop at the deadline instead of sleeping: a caller with a deadline cannot
//! use an answer that arrives after it. Sleeping past it would hold a connection,
//! a task and the caller's patience for nothing, so a hint (or a delay) that ends
//! beyond what is left of the deadline ends retrying with
//! [`DeadlineReached`], which says what the wait would have been and how
//! much time was left.
//!
//! Both forms of RFC 9110 §10.2.3 are read: delta-seconds (`120`) and an
//! HTTP-date (`Fri, 31 Dec 1999 23:59:59 GMT`, with the obsolete RFC 850 and
//! asctime forms accepted as the RFC asks).

use std::time::{Duration, SystemTime};

/// A parsed `Retry-After` value: either a delay or an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// `Retry-After: <delta-seconds>`.
    Delay(Duration),
    /// `Retry-After: <HTTP-date>`.
    At(SystemTime),
}

/// A `Retry-After` value that is neither delta-seconds nor an HTTP-date.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Retry-After value {value:?} is neither a number of seconds nor an HTTP-date such as \"Sun, 06 Nov 1994 08:49:37 GMT\""
)]
pub struct InvalidRetryAfter {
    /// The value as received (cut to 64 characters).
    pub value: String,
}

impl RetryAfter {
    /// Parses a header value. Surrounding whitespace is ignored; a number of
    /// seconds too large to represent saturates (it is far past any deadline).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime, UNIX_EPOCH};
    /// use idem_retry::RetryAfter;
    ///
    /// assert_eq!(RetryAfter::parse("120").unwrap(), RetryAfter::Delay(Duration::from_secs(120)));
    /// let date = RetryAfter::parse("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
    /// assert_eq!(date, RetryAfter::At(UNIX_EPOCH + Duration::from_secs(784_111_777)));
    /// assert!(RetryAfter::parse("soon").is_err());
    /// ```
    pub fn parse(value: &str) -> Result<Self, InvalidRetryAfter> {
        let value = value.trim();
        if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
            let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
            return Ok(Self::Delay(Duration::from_secs(seconds)));
        }
        httpdate::parse_http_date(value)
            .map(Self::At)
            .map_err(|_| InvalidRetryAfter {
                value: value.chars().take(64).collect(),
            })
    }

    /// Parses raw header bytes (as `http::HeaderValue::as_bytes` gives them).
    pub fn parse_bytes(value: &[u8]) -> Result<Self, InvalidRetryAfter> {
        match std::str::from_utf8(value) {
            Ok(text) => Self::parse(text),
            Err(_) => Err(InvalidRetryAfter {
                value: String::from_utf8_lossy(value).chars().take(64).collect(),
            }),
        }
    }

    /// How long to wait from `now`. A date in the past means "now": zero.
    pub fn delay_from(self, now: SystemTime) -> Duration {
        match self {
            Self::Delay(delay) => delay,
            Self::At(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
        }
    }
}

/// Why retrying stopped at the deadline instead of sleeping past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeadlineReached {
    /// The server asked for a wait longer than what is left of the deadline.
    #[error(
        "the server asked to retry after {hint:?}, but only {remaining:?} of the deadline is left; stopping now instead of sleeping past the deadline"
    )]
    HintBeyondDeadline {
        /// The server's `Retry-After`, as a delay.
        hint: Duration,
        /// What was left of the deadline when the hint arrived.
        remaining: Duration,
    },
    /// The backoff's own delay would end at or after the deadline.
    #[error(
        "the next backoff delay of {delay:?} would end at or after the deadline, which has {remaining:?} left; stopping now"
    )]
    DelayBeyondDeadline {
        /// The jittered delay that was drawn.
        delay: Duration,
        /// What was left of the deadline.
        remaining: Duration,
    },
}

/// The delay before the next attempt: the jittered `backoff` delay, raised to
/// the server's `hint` if that is longer, checked against what `remaining` of
/// the deadline (if there is one).
///
/// An attempt that would start at or after the deadline could not finish
/// before it, so a wait that ends there stops retrying too.
///
/// ```
/// use std::time::Duration;
/// use idem_retry::{DeadlineReached, next_delay};
///
/// let ms = Duration::from_millis;
/// // The hint wins when it is longer than the jitter...
/// assert_eq!(next_delay(ms(150), Some(ms(2_000)), None), Ok(ms(2_000)));
/// // ...and the jitter when it is longer than the hint.
/// assert_eq!(next_delay(ms(150), Some(ms(100)), None), Ok(ms(150)));
/// // A hint past the deadline ends retrying, saying what was asked and what was left.
/// assert_eq!(
///     next_delay(ms(150), Some(ms(30_000)), Some(ms(5_000))),
///     Err(DeadlineReached::HintBeyondDeadline { hint: ms(30_000), remaining: ms(5_000) })
/// );
/// ```
pub fn next_delay(
    backoff: Duration,
    hint: Option<Duration>,
    remaining: Option<Duration>,
) -> Result<Duration, DeadlineReached> {
    let delay = hint.map_or(backoff, |hint| hint.max(backoff));
    let Some(remaining) = remaining else {
        return Ok(delay);
    };
    match hint {
        Some(hint) if hint >= remaining => {
            Err(DeadlineReached::HintBeyondDeadline { hint, remaining })
        }
        _ if delay >= remaining => Err(DeadlineReached::DelayBeyondDeadline { delay, remaining }),
        _ => Ok(delay),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn parses_delta_seconds() {
        assert_eq!(
            RetryAfter::parse("0"),
            Ok(RetryAfter::Delay(Duration::ZERO))
        );
        assert_eq!(RetryAfter::parse(" 3 "), Ok(RetryAfter::Delay(3 * SEC)));
        assert_eq!(
            RetryAfter::parse("99999999999999999999999"),
            Ok(RetryAfter::Delay(Duration::from_secs(u64::MAX)))
        );
        assert_eq!(
            RetryAfter::parse_bytes(b"7").map(|r| r.delay_from(UNIX_EPOCH)),
            Ok(7 * SEC)
        );
    }

    #[test]
    fn parses_all_three_http_date_forms() {
        let expected = RetryAfter::At(UNIX_EPOCH + Duration::from_secs(784_111_777));
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(RetryAfter::parse(form), Ok(expected), "{form}");
        }
    }

    #[test]
    fn an_http_date_becomes_the_time_left_until_it() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        let in_90s = RetryAfter::parse("Sun, 06 Nov 1994 08:51:07 GMT").unwrap();
        assert_eq!(in_90s.delay_from(now), 90 * SEC);
        let past = RetryAfter::parse("Sun, 06 Nov 1994 08:00:00 GMT").unwrap();
        assert_eq!(past.delay_from(now), Duration::ZERO);
    }

    #[test]
    fn refuses_anything_else_and_quotes_it() {
        for bad in ["", "-1", "1.5", "soon", "Sun, 06 Nov 1994"] {
            let err = RetryAfter::parse(bad).unwrap_err();
            assert!(err.to_string().contains("HTTP-date"), "{err}");
        }
        assert!(RetryAfter::parse_bytes(&[0xff, b'1']).is_err());
    }

    #[test]
    fn the_next_delay_is_at_least_the_hint() {
        assert_eq!(next_delay(SEC, None, None), Ok(SEC));
        assert_eq!(next_delay(SEC, Some(5 * SEC), None), Ok(5 * SEC));
        assert_eq!(next_delay(5 * SEC, Some(SEC), None), Ok(5 * SEC));
        assert_eq!(next_delay(SEC, Some(5 * SEC), Some(6 * SEC)), Ok(5 * SEC));
    }

    #[test]
    fn a_hint_past_the_deadline_stops_with_both_figures() {
        let err = next_delay(SEC, Some(120 * SEC), Some(10 * SEC)).unwrap_err();
        assert_eq!(
            err,
            DeadlineReached::HintBeyondDeadline {
                hint: 120 * SEC,
                remaining: 10 * SEC
            }
        );
        let text = err.to_string();
        assert!(text.contains("120s") && text.contains("10s"), "{text}");
    }

    #[test]
    fn a_backoff_delay_past_the_deadline_stops_too() {
        assert_eq!(
            next_delay(3 * SEC, None, Some(2 * SEC)),
            Err(DeadlineReached::DelayBeyondDeadline {
                delay: 3 * SEC,
                remaining: 2 * SEC
            })
        );
        assert_eq!(
            next_delay(Duration::ZERO, None, Some(Duration::ZERO)),
            Err(DeadlineReached::DelayBeyondDeadline {
                delay: Duration::ZERO,
                remaining: Duration::ZERO
            })
        );
    }
}
