//! Classification of Idem's own errors, so a caller of an idempotent operation
//! retries exactly what the protocol says may succeed later.

use idem_core::{ApplyError, Error};

use super::{Classify, Verdict};

/// Retries what [`idem_core`] calls retryable: an in-flight duplicate after its
/// `retry_after`, transient store failures (busy, serialization failure,
/// unavailable) and an effect's failure (the claim was released, so the next
/// attempt runs the effect again). Never retries key reuse, fencing or a
/// malformed key: another attempt would be refused the same way, and after
/// fencing it would be wrong.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Error, IdempotencyKey, Scope};
/// use idem_retry::{Classify, ProtocolErrorPolicy, Verdict};
///
/// let in_flight = Error::InFlight {
///     scope: Scope::new("payments").unwrap(),
///     key: IdempotencyKey::new("order-42").unwrap(),
///     retry_after: Duration::from_secs(1),
/// };
/// assert_eq!(ProtocolErrorPolicy.classify(&in_flight), Verdict::RetryAfter(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProtocolErrorPolicy;

impl Classify<Error> for ProtocolErrorPolicy {
    fn classify(&self, error: &Error) -> Verdict {
        match error {
            Error::InFlight { retry_after, .. } => Verdict::RetryAfter(*retry_after),
            other if other.is_retryable() => Verdict::Retry,
            _ => Verdict::DontRetry,
        }
    }
}

impl<E> Classify<ApplyError<E>> for ProtocolErrorPolicy {
    fn classify(&self, error: &ApplyError<E>) -> Verdict {
        match error {
            ApplyError::Protocol(error) => self.classify(error),
            ApplyError::Effect(_) => Verdict::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{ErrorKind, FencingToken, IdempotencyKey, Scope, StoreError};

    fn scope() -> Scope {
        Scope::new("payments").unwrap()
    }
    fn key() -> IdempotencyKey {
        IdempotencyKey::new("order-42").unwrap()
    }

    #[test]
    fn retries_what_the_protocol_calls_retryable() {
        let busy = Error::Store(StoreError::new(ErrorKind::Busy, "locked"));
        assert_eq!(ProtocolErrorPolicy.classify(&busy), Verdict::Retry);
        let effect: ApplyError<&str> = ApplyError::Effect("upstream 503");
        assert_eq!(ProtocolErrorPolicy.classify(&effect), Verdict::Retry);
    }

    #[test]
    fn never_retries_reuse_fencing_or_corruption() {
        let reuse = Error::KeyReuse {
            scope: scope(),
            key: key(),
        };
        let fenced = Error::Fenced {
            scope: scope(),
            key: key(),
            held: FencingToken::FIRST,
            current: None,
        };
        let corrupt = Error::Store(StoreError::new(ErrorKind::Corrupt, "bad row"));
        for error in [reuse, fenced, corrupt] {
            assert_eq!(ProtocolErrorPolicy.classify(&error), Verdict::DontRetry);
        }
    }
}
