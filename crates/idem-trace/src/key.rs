//! [`KeyInSpans`]: how the idempotency key appears in spans.
//!
//! Why a choice: a key is often made from business identifiers (an order
//! number, an account and a date), and span attributes are shipped to a
//! tracing backend that more people can read than the database. Hashed, the
//! key still joins every retry of one operation (the same key always gives
//! the same hash) without showing what it is made of.

use std::fmt;
use std::str::FromStr;

use idem_core::IdempotencyKey;

/// How the idempotency key is written into spans (the field
/// `idempotency_key`).
///
/// ```
/// use idem_core::IdempotencyKey;
/// use idem_trace::KeyInSpans;
///
/// let key = IdempotencyKey::new("order-42/created").unwrap();
/// assert_eq!(KeyInSpans::Raw.show(&key), "order-42/created");
/// let hashed = KeyInSpans::Hashed.show(&key);
/// assert_eq!(hashed.len(), 16);
/// assert_eq!(hashed, KeyInSpans::Hashed.show(&key)); // stable across processes
/// assert_eq!("hashed".parse::<KeyInSpans>().unwrap(), KeyInSpans::Hashed);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KeyInSpans {
    /// The key as it came (the default).
    #[default]
    Raw,
    /// The first 16 hex digits of the key's BLAKE3 hash: the same key gives
    /// the same value everywhere, and the key itself is not shown. Keys with
    /// little entropy (a small counter) can still be guessed from it.
    Hashed,
}

impl KeyInSpans {
    /// The value of the `idempotency_key` span field for `key`.
    pub fn show(self, key: &IdempotencyKey) -> String {
        match self {
            Self::Raw => key.as_str().to_owned(),
            Self::Hashed => blake3::hash(key.as_str().as_bytes()).to_hex()[..16].to_owned(),
        }
    }
}

impl fmt::Display for KeyInSpans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Raw => "raw",
            Self::Hashed => "hashed",
        })
    }
}

/// Text that is neither `raw` nor `hashed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidKeyInSpans(String);

impl fmt::Display for InvalidKeyInSpans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a way to show keys in spans; write raw or hashed",
            self.0
        )
    }
}

impl std::error::Error for InvalidKeyInSpans {}

impl FromStr for KeyInSpans {
    type Err = InvalidKeyInSpans;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "raw" => Ok(Self::Raw),
            "hashed" | "hash" => Ok(Self::Hashed),
            _ => Err(InvalidKeyInSpans(text.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_keys_are_short_stable_and_distinct() {
        let a = IdempotencyKey::new("a").unwrap();
        let b = IdempotencyKey::new("b").unwrap();
        let shown = KeyInSpans::Hashed.show(&a);
        assert!(shown.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(shown, KeyInSpans::Hashed.show(&a));
        assert_ne!(shown, KeyInSpans::Hashed.show(&b));
        assert_eq!(KeyInSpans::default().show(&a), "a");
    }

    #[test]
    fn settings_read_and_print_the_same_words() {
        for setting in [KeyInSpans::Raw, KeyInSpans::Hashed] {
            assert_eq!(setting.to_string().parse::<KeyInSpans>().unwrap(), setting);
        }
        assert!("plain".parse::<KeyInSpans>().is_err());
    }
}
