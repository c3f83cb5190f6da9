//! Comparing the two answers of a duplicated pair. Only the status, the
//! body's hash and `Idempotent-Replayed` are compared: other headers (a
//! `Date`, a request id) differ between any two answers and say nothing.
//!
//! | first answer | second answer | verdict |
//! |---|---|---|
//! | any | `Idempotent-Replayed: true` (either one) | `replayed`: an idempotency layer answered |
//! | 2xx | 409 (in flight) or 422 (key reused) | `refused`: an idempotency layer answered |
//! | status, body | same status, same body | `same` |
//! | 2xx, body | another 2xx, same body (201 then 200) | `same` |
//! | 2xx, body | 2xx, another body (201 then 201) | `different`: the tell of a path that applied the copy |
//! | anything else that differs | | `different` |
//! | no answer to either | | `no_answer`: nothing to compare |

use http::StatusCode;
use serde::Serialize;

/// What one send of a pair was answered, as far as the comparison goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// An answer.
    Answer {
        status: StatusCode,
        body_hash: blake3::Hash,
        replayed: bool,
    },
    /// None: unreachable, timed out, broken off.
    Nothing,
}

/// How the copy of a request was answered, compared with the original.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The same status and body (or another 2xx with the same body).
    Same,
    /// Answered as a replay (`Idempotent-Replayed: true`).
    Replayed,
    /// Refused by an idempotency layer: 409 while the original ran, 422 for
    /// a reused key.
    Refused,
    /// Answered differently: the path applied the copy as a new request.
    Different,
    /// One of the two got no answer, so there is nothing to compare.
    NoAnswer,
}

impl Verdict {
    /// The verdict on a pair, given the answer to the send that went first
    /// (or the original, when both went at once) and the other one.
    pub(crate) fn of(first: &Seen, second: &Seen) -> Self {
        let (
            Seen::Answer {
                status: a,
                body_hash: a_hash,
                replayed: a_replayed,
            },
            Seen::Answer {
                status: b,
                body_hash: b_hash,
                replayed: b_replayed,
            },
        ) = (first, second)
        else {
            return Self::NoAnswer;
        };
        if *a_replayed || *b_replayed {
            return Self::Replayed;
        }
        let refusal =
            |s: &StatusCode| matches!(*s, StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY);
        if refusal(a) != refusal(b) {
            return Self::Refused;
        }
        let same_body = a_hash == b_hash;
        if same_body && (a == b || (a.is_success() && b.is_success())) {
            Self::Same
        } else {
            Self::Different
        }
    }

    /// The name in the report and the metrics' `verdict` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::Replayed => "replayed",
            Self::Refused => "refused",
            Self::Different => "different",
            Self::NoAnswer => "no_answer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str, replayed: bool) -> Seen {
        Seen::Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body_hash: blake3::hash(body.as_bytes()),
            replayed,
        }
    }

    #[test]
    fn the_table_of_the_module_docs() {
        let created = answer(201, "{\"id\":1}", false);
        for (second, expected) in [
            (answer(201, "{\"id\":1}", true), Verdict::Replayed),
            (answer(409, "in flight", false), Verdict::Refused),
            (answer(422, "reused", false), Verdict::Refused),
            (answer(201, "{\"id\":1}", false), Verdict::Same),
            (answer(200, "{\"id\":1}", false), Verdict::Same),
            (answer(201, "{\"id\":2}", false), Verdict::Different),
            (answer(500, "{\"id\":1}", false), Verdict::Different),
            (Seen::Nothing, Verdict::NoAnswer),
        ] {
            assert_eq!(Verdict::of(&created, &second), expected, "{second:?}");
        }
        let bad = answer(400, "bad", false);
        assert_eq!(Verdict::of(&bad, &bad.clone()), Verdict::Same);
    }
}
