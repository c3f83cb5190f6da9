//! [`error_chain`]: an error and its causes on one line.
//!
//! Many errors say little on their own (a client's "connection error") and the
//! useful part is a few `source()`s down. Where such an error becomes text, in an
//! error message returned to a caller or a log field, every crate writes it the
//! same way with this function.

use std::error::Error as StdError;

/// `error`, then each of its causes, separated by `": "`: `send failed: connection
/// error: Connection refused (os error 111)`.
///
/// Every cause appears once. A cause whose text already appears in the line is
/// left out, so an error that prints its source in its own message is not
/// repeated. So is a cause that only wraps its own source with a prefix
/// (`error communicating with database: Connection refused`) when the line
/// already holds that source's text: the outer message said it, with more
/// context, and the prefix adds nothing.
///
/// ```
/// use idem_core::{ErrorKind, StoreError, error_chain};
///
/// let cause = std::io::Error::other("disk full");
/// let error = StoreError::with_source(ErrorKind::Unavailable, "could not write the record", cause);
/// assert_eq!(
///     error_chain(&error),
///     "database unavailable: could not write the record: disk full"
/// );
/// ```
pub fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut line = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !line.contains(&text) && !wraps_what_is_said(&line, &text, cause.source()) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    line
}

/// Whether `text` (a cause's) only repeats its own `source`, which `line`
/// already holds.
fn wraps_what_is_said(line: &str, text: &str, source: Option<&(dyn StdError + 'static)>) -> bool {
    source.is_some_and(|source| {
        let inner = source.to_string();
        !inner.is_empty() && text.contains(&inner) && line.contains(&inner)
    })
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        cause: Option<Box<Layer>>,
    }

    fn layers(messages: &[&'static str]) -> Layer {
        let mut chain = None;
        for message in messages.iter().rev() {
            chain = Some(Layer {
                message,
                cause: chain.map(Box::new),
            });
        }
        chain.expect("at least one layer")
    }

    #[test]
    fn an_error_without_a_source_is_its_own_text() {
        assert_eq!(error_chain(&layers(&["no route"])), "no route");
    }

    #[test]
    fn causes_follow_in_order() {
        let error = layers(&["send failed", "connection error", "connection refused"]);
        assert_eq!(
            error_chain(&error),
            "send failed: connection error: connection refused"
        );
    }

    #[test]
    fn a_cause_already_in_the_text_is_not_repeated() {
        let error = layers(&["could not connect: refused", "refused", "os error 111"]);
        assert_eq!(
            error_chain(&error),
            "could not connect: refused: os error 111"
        );
    }

    #[test]
    fn a_wrapper_of_a_cause_already_said_is_left_out() {
        // A store error that names the refusal and gives a hint, over a
        // driver error that wraps the same refusal, over the refusal itself:
        // the refusal once, and the hint kept.
        let error = layers(&[
            "database unavailable: cannot reach PostgreSQL at 127.0.0.1:1: Connection refused (os error 111); is the server running?",
            "error communicating with database: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]);
        let line = error_chain(&error);
        assert_eq!(
            line,
            "database unavailable: cannot reach PostgreSQL at 127.0.0.1:1: Connection refused (os error 111); is the server running?"
        );
        assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
    }

    #[test]
    fn a_wrapper_of_a_cause_not_yet_said_is_kept() {
        let error = layers(&["send failed", "connection error: refused", "refused"]);
        assert_eq!(
            error_chain(&error),
            "send failed: connection error: refused"
        );
    }

    #[test]
    fn io_errors_show_their_inner_message() {
        let inner = layers(&["handshake failed", "bad certificate"]);
        let io = std::io::Error::other(inner);
        assert_eq!(error_chain(&io), "handshake failed: bad certificate");
    }
}
