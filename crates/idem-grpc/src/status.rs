//! gRPC status codes: what a service's answer means for its key
//! ([`GrpcStatusPolicy`]), and the codes of the layer's own refusals.
//!
//! # What an answer means
//!
//! Every answer that comes back after the call was handed to the service
//! gets a [`Verdict`]: **store** (recorded and replayed to every duplicate),
//! **release** (nothing happened: the key is freed and the next retry runs
//! the call), or **unknown** (the call may or may not have taken effect: the
//! claim is kept and reconciled). Releasing every error, as a code-blind
//! layer does, lets the retry of "`INTERNAL`, but the charge was written"
//! charge again; storing every error turns a "try again" into a permanent
//! refusal.
//!
//! | service's code | verdict | why |
//! |---|---|---|
//! | `OK` | store | the call's answer |
//! | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`, `UNAUTHENTICATED` | store | a definite refusal: the same call fails the same way |
//! | `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED` | release | "try again": gRPC's codes for a service that did not do the work (not ready, shedding load, a conflict rolled back) |
//! | `INTERNAL` | unknown with a reconcile hook, release without one | a crash after the commit and a plain bug both answer it |
//! | `DEADLINE_EXCEEDED`, `UNKNOWN`, `DATA_LOSS`, `CANCELLED`, no status | unknown | the work may have been done before the answer was given up |
//!
//! `INTERNAL` depends on the hook for the reason HTTP's 500 does: with a hook
//! the service is asked, and a bug costs one question; without one, holding
//! every `INTERNAL` for a lease would block the retries of every call a bug
//! refused.
//!
//! `UNAVAILABLE` is released when the service itself answers it. When a
//! proxy wrote it because the call was sent and no answer came back (the
//! gateway's broken connection), the answer carries the
//! [`UnknownOutcome`](idem_http::UnknownOutcome) marker, which makes any code
//! unknown.
//!
//! On **unknown**, with a reconcile hook the claim's lease is ended at once,
//! so the next retry takes it over and asks the hook before anything runs;
//! without one the key stays reserved for a lease from the answer, and a
//! retry meanwhile is refused with `ABORTED` and the time left in
//! `grpc-retry-pushback-ms`.
//!
//! Each code's verdict can be set: [`GrpcIdempotencyConfig::on_code`](crate::GrpcIdempotencyConfig::on_code),
//! or rules in text, `internal=store,unavailable=unknown,4=release`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderValue;
use idem_http::Verdict;
use tonic::{Code, Status};

/// The trailer (or, in a trailers-only answer, header) through which a
/// server tells a client when to retry, in milliseconds.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Every code, by number: the names rules are written with.
const NAMES: [&str; 17] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// A code's rule name: `deadline_exceeded`.
pub(crate) fn code_name(code: Code) -> &'static str {
    NAMES[code as usize]
}

/// A code from its name (any case, `-` or `_`) or its number.
fn code_from(text: &str) -> Result<Code, GrpcStatusPolicyError> {
    let name = text.trim().to_ascii_lowercase().replace('-', "_");
    let number = match name.parse::<usize>() {
        Ok(number) => Some(number),
        Err(_) => NAMES.iter().position(|known| *known == name),
    };
    match number {
        Some(number @ 0..=16) => Ok(Code::from_i32(number as i32)),
        _ => Err(GrpcStatusPolicyError(format!(
            "`{}` is not a gRPC status code; write a name such as internal or deadline_exceeded, or a number from 0 to 16",
            text.trim()
        ))),
    }
}

/// A status policy that cannot be used; the message says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrpcStatusPolicyError(String);

/// What each status code a service answers with means for its key: the
/// defaults of the module's table, with rules set per code on top.
///
/// ```
/// use idem_grpc::GrpcStatusPolicy;
/// use idem_http::Verdict;
/// use tonic::Code;
///
/// let policy: GrpcStatusPolicy = "internal=store,unavailable=unknown,4=release".parse()?;
/// assert_eq!(policy.verdict(Some(Code::Internal), false), Verdict::Store);
/// assert_eq!(policy.verdict(Some(Code::Unavailable), false), Verdict::Unknown);
/// assert_eq!(policy.verdict(Some(Code::DeadlineExceeded), true), Verdict::Release);
///
/// let standard = GrpcStatusPolicy::standard();
/// assert_eq!(standard.verdict(Some(Code::Internal), true), Verdict::Unknown);
/// assert_eq!(standard.verdict(Some(Code::Internal), false), Verdict::Release);
/// assert_eq!(standard.verdict(None, false), Verdict::Unknown);
/// # Ok::<(), idem_grpc::GrpcStatusPolicyError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcStatusPolicy {
    rules: BTreeMap<i32, Verdict>,
}

impl GrpcStatusPolicy {
    /// The defaults alone.
    pub fn standard() -> Self {
        Self::default()
    }

    /// This policy with `code` answered by `verdict`.
    pub fn on(mut self, code: Code, verdict: Verdict) -> Self {
        self.rules.insert(code as i32, verdict);
        self
    }

    /// What an answer with status `code` (`None`: no `grpc-status`) means,
    /// `probed` saying whether a reconcile hook can be asked about an
    /// unknown outcome. A missing status is always unknown.
    pub fn verdict(&self, code: Option<Code>, probed: bool) -> Verdict {
        let Some(code) = code else {
            return Verdict::Unknown;
        };
        match self.rules.get(&(code as i32)) {
            Some(verdict) => *verdict,
            None => standard_verdict(code, probed),
        }
    }

    /// Whether an answer with status `code` is stored (the atomic handlers,
    /// whose writes roll back with any answer that is not).
    pub fn stores(&self, code: Code) -> bool {
        self.verdict(Some(code), false) == Verdict::Store
    }

    /// The policy as text: `standard` and the rules set on top,
    /// `standard,internal=store`.
    pub fn describe(&self) -> String {
        let mut text = String::from("standard");
        for (code, verdict) in &self.rules {
            text.push_str(&format!(",{}={verdict}", code_name(Code::from_i32(*code))));
        }
        text
    }
}

impl fmt::Display for GrpcStatusPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The verdict of the defaults.
fn standard_verdict(code: Code, probed: bool) -> Verdict {
    match code {
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Unauthenticated => Verdict::Store,
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => Verdict::Release,
        Code::Internal if probed => Verdict::Unknown,
        Code::Internal => Verdict::Release,
        Code::DeadlineExceeded | Code::Unknown | Code::DataLoss | Code::Cancelled => {
            Verdict::Unknown
        }
    }
}

impl FromStr for GrpcStatusPolicy {
    type Err = GrpcStatusPolicyError;

    /// Rules separated by commas, each `CODE=VERDICT`, the code by name or
    /// number: `internal=store,14=unknown`. `standard` (or nothing) is the
    /// defaults alone.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut policy = Self::standard();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.eq_ignore_ascii_case("standard") {
                continue;
            }
            let Some((code, verdict)) = part.split_once('=') else {
                return Err(GrpcStatusPolicyError(format!(
                    "`{part}` is not a rule; write CODE=VERDICT, as in internal=store or 14=unknown"
                )));
            };
            let verdict = verdict
                .parse::<Verdict>()
                .map_err(|e| GrpcStatusPolicyError(e.to_string()))?;
            policy = policy.on(code_from(code)?, verdict);
        }
        Ok(policy)
    }
}

/// The status code of an answer: `grpc-status` from its trailers, or from its
/// headers when it is trailers-only.
pub(crate) fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Option<Code> {
    let value = trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))?;
    let code: i32 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Code::from_i32(code))
}

/// Why the layer answered a call itself.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("this method requires an idempotency key in the `{0}` metadata entry")]
    MissingKey(String),
    #[error("the idempotency key is malformed: {0}")]
    MalformedKey(String),
    #[error("a unary call's request must be exactly one length-prefixed message")]
    NotOneMessage,
    #[error("the request message is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the request body broke off: {0}")]
    Broken(String),
    #[error("{0}")]
    KeyReuse(String),
    #[error("{message}")]
    InFlight {
        message: String,
        retry_after: Duration,
    },
    #[error("the store is unavailable: {0}")]
    StoreUnavailable(String),
    #[error("the stored answer cannot be read: {0}")]
    Corrupt(String),
    #[error(
        "the call was handed to the service but no complete answer came back, so whether it took effect is unknown; a retry with the same key is held until the key's lease ends, or, where the service can be asked, asks it first"
    )]
    OutcomeUnknown,
    #[error(
        "an earlier call with this idempotency key ended with an unknown outcome: it may have taken effect. The key stays reserved for {} more (grpc-retry-pushback-ms); a retry with the same key after that runs the call again", humane(*left)
    )]
    HeldUnknown { left: Duration },
    #[error(
        "an earlier call with this idempotency key ended with an unknown outcome, and the service could not say whether it took effect ({cause}); nothing was run now. Retry with the same key after {} (grpc-retry-pushback-ms): the service is asked again before anything runs", humane(*retry_after)
    )]
    ReconcileUnknown {
        cause: String,
        retry_after: Duration,
    },
}

/// A duration as people write it, to the millisecond: `1m 30s`,
/// `2s 500ms`, `250ms`.
fn humane(duration: Duration) -> String {
    let total = duration.as_millis();
    let (minutes, seconds, millis) = (total / 60_000, (total / 1000) % 60, total % 1000);
    let mut parts = Vec::new();
    if minutes > 0 {
        parts.push(format!("{minutes}m"));
    }
    if seconds > 0 {
        parts.push(format!("{seconds}s"));
    }
    if millis > 0 || parts.is_empty() {
        parts.push(format!("{millis}ms"));
    }
    parts.join(" ")
}

impl Refusal {
    /// From a store's refusal of a claim.
    pub(crate) fn from_store(error: idem_core::Error) -> Self {
        match error {
            idem_core::Error::KeyReuse { .. } => Self::KeyReuse(error.to_string()),
            idem_core::Error::InFlight { retry_after, .. } => Self::InFlight {
                message: error.to_string(),
                retry_after,
            },
            other if other.is_retryable() => Self::StoreUnavailable(other.to_string()),
            other => Self::Corrupt(other.to_string()),
        }
    }

    /// The status code the refusal is sent with.
    pub(crate) fn code(&self) -> Code {
        match self {
            Self::MissingKey(_) | Self::MalformedKey(_) | Self::NotOneMessage => {
                Code::InvalidArgument
            }
            Self::TooLarge(_) => Code::ResourceExhausted,
            Self::Broken(_) => Code::Cancelled,
            // The key and the message are each valid; what fails is the
            // key's record, which holds another message. The same call with
            // a new key, or after the record's window, succeeds: a failed
            // precondition on the system's state, not a bad argument.
            Self::KeyReuse(_) => Code::FailedPrecondition,
            Self::InFlight { .. } => Code::Aborted,
            Self::StoreUnavailable(_) => Code::Unavailable,
            Self::Corrupt(_) => Code::Internal,
            Self::OutcomeUnknown => Code::Unavailable,
            // The key is held by an earlier call's unknown outcome: the
            // same code as a duplicate of a call still running, with the
            // time the key really stays reserved.
            Self::HeldUnknown { .. } => Code::Aborted,
            // Nothing ran; the service could not be asked: try again.
            Self::ReconcileUnknown { .. } => Code::Unavailable,
        }
    }

    /// The refusal as a status, with a retry hint where there is one.
    pub(crate) fn to_status(&self) -> Status {
        let mut status = Status::new(self.code(), self.to_string());
        let pushback = match self {
            Self::InFlight { retry_after, .. } | Self::ReconcileUnknown { retry_after, .. } => {
                Some(*retry_after)
            }
            Self::HeldUnknown { left } => Some(*left),
            _ => None,
        };
        if let Some(retry_after) = pushback {
            let millis = retry_after.as_millis().max(1).to_string();
            status.metadata_mut().insert(
                RETRY_PUSHBACK,
                millis.parse().expect("digits are valid metadata"),
            );
        }
        status
    }

    /// The refusal as a trailers-only answer.
    pub(crate) fn to_response(&self) -> http::Response<tonic::body::Body> {
        let mut response: http::Response<tonic::body::Body> = self.to_status().into_http();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_documented_table() {
        let standard = GrpcStatusPolicy::standard();
        for probed in [false, true] {
            for code in [
                Code::Ok,
                Code::InvalidArgument,
                Code::NotFound,
                Code::AlreadyExists,
                Code::PermissionDenied,
                Code::FailedPrecondition,
                Code::OutOfRange,
                Code::Unimplemented,
                Code::Unauthenticated,
            ] {
                assert_eq!(
                    standard.verdict(Some(code), probed),
                    Verdict::Store,
                    "{code:?}"
                );
            }
            for code in [Code::Unavailable, Code::ResourceExhausted, Code::Aborted] {
                assert_eq!(
                    standard.verdict(Some(code), probed),
                    Verdict::Release,
                    "{code:?}"
                );
            }
            for code in [
                Code::DeadlineExceeded,
                Code::Unknown,
                Code::DataLoss,
                Code::Cancelled,
            ] {
                assert_eq!(
                    standard.verdict(Some(code), probed),
                    Verdict::Unknown,
                    "{code:?}"
                );
            }
            assert_eq!(standard.verdict(None, probed), Verdict::Unknown);
        }
        assert_eq!(
            standard.verdict(Some(Code::Internal), true),
            Verdict::Unknown
        );
        assert_eq!(
            standard.verdict(Some(Code::Internal), false),
            Verdict::Release
        );
        assert!(standard.stores(Code::NotFound));
        assert!(!standard.stores(Code::Internal));
    }

    #[test]
    fn rules_by_name_or_number_read_back() {
        let policy: GrpcStatusPolicy = " INTERNAL=store, 14=unknown ,deadline-exceeded=release"
            .parse()
            .unwrap();
        assert_eq!(policy.verdict(Some(Code::Internal), false), Verdict::Store);
        assert_eq!(
            policy.verdict(Some(Code::Unavailable), false),
            Verdict::Unknown
        );
        assert_eq!(
            policy.verdict(Some(Code::DeadlineExceeded), true),
            Verdict::Release
        );
        assert_eq!(
            policy.describe(),
            "standard,deadline_exceeded=release,internal=store,unavailable=unknown"
        );
        assert_eq!(
            policy.describe().parse::<GrpcStatusPolicy>().unwrap(),
            policy
        );
        assert_eq!(
            "".parse::<GrpcStatusPolicy>().unwrap(),
            GrpcStatusPolicy::standard()
        );
        for (text, hint) in [
            ("internal", "CODE=VERDICT"),
            ("internal=maybe", "store, release or unknown"),
            ("17=store", "from 0 to 16"),
            ("teapot=store", "deadline_exceeded"),
        ] {
            let error = text.parse::<GrpcStatusPolicy>().unwrap_err().to_string();
            assert!(error.contains(hint), "{text}: {error}");
        }
    }

    #[test]
    fn a_held_key_says_the_time_it_has_left() {
        let refusal = Refusal::HeldUnknown {
            left: Duration::from_millis(29_500),
        };
        let status = refusal.to_status();
        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "29500");
        assert!(
            status.message().contains("29s 500ms"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn an_in_flight_refusal_carries_a_pushback() {
        let refusal = Refusal::InFlight {
            message: "busy".into(),
            retry_after: Duration::from_millis(250),
        };
        let status = refusal.to_status();
        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "250");
    }
}
