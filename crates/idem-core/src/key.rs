//! Validated identifiers: the idempotency key a caller sends, the scope it is
//! applied in, and the name of a resource guarded by fencing tokens.
//!
//! Both are checked once, at the edge, so that every store and every log line can
//! trust them: a key is 1–255 visible ASCII characters (the limit Stripe uses and
//! the IETF draft leaves to policy), a scope is a non-empty name of the same
//! alphabet. The dedupe primary key is always `(scope, key)`, never the key alone.

use std::fmt;
use std::str::FromStr;

/// Longest key accepted, in bytes (all characters are ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// The name of the header that carries the key: `Idempotency-Key`, as the IETF
/// draft and Stripe write it. HTTP reads header names in any case; message
/// headers (AMQP) are matched exactly, so this is the spelling written there.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// Why a key or scope was refused. Each variant names the rule that was broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value was empty.
    #[error("{what} is empty: it must be 1 to {MAX_KEY_LEN} visible ASCII characters")]
    Empty {
        /// "idempotency key" or "scope".
        what: &'static str,
    },
    /// The value was longer than [`MAX_KEY_LEN`].
    #[error(
        "{what} is {len} characters long: at most {MAX_KEY_LEN} are allowed; send a shorter key such as a UUID"
    )]
    TooLong {
        /// "idempotency key" or "scope".
        what: &'static str,
        /// Length of the refused value.
        len: usize,
    },
    /// The value held a character outside visible ASCII (0x21..=0x7E).
    #[error(
        "{what} has a character that is not visible ASCII ({found}) at position {position}: only characters 0x21 to 0x7E are allowed"
    )]
    Invisible {
        /// "idempotency key" or "scope".
        what: &'static str,
        /// Zero-based character position of the first bad character.
        position: usize,
        /// The bad character, escaped for printing.
        found: String,
    },
}

pub(crate) fn validate(what: &'static str, value: &str) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::Empty { what });
    }
    if let Some((position, ch)) = value
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_graphic())
    {
        return Err(KeyError::Invisible {
            what,
            position,
            found: ch.escape_default().to_string(),
        });
    }
    if value.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong {
            what,
            len: value.len(),
        });
    }
    Ok(())
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Checks `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
                let value = value.into();
                validate($what, &value)?;
                Ok(Self(value))
            }

            /// The text as given.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = KeyError;
            fn from_str(s: &str) -> Result<Self, KeyError> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = KeyError;
            fn try_from(s: &str) -> Result<Self, KeyError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = KeyError;
            fn try_from(s: String) -> Result<Self, KeyError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

validated_name!(
    /// An idempotency key: made once where the intent is formed and sent unchanged
    /// with every retry of that one operation.
    ///
    /// ```
    /// use idem_core::IdempotencyKey;
    /// let key = IdempotencyKey::new("order-42/payment").unwrap();
    /// assert_eq!(key.as_str(), "order-42/payment");
    /// assert!(IdempotencyKey::new("").is_err());
    /// assert!(IdempotencyKey::new("has space").is_err());
    /// assert!(IdempotencyKey::new("k".repeat(256)).is_err());
    /// ```
    IdempotencyKey,
    "idempotency key"
);

validated_name!(
    /// Who applies a key: the handler or operation name, plus the tenant or
    /// principal where one exists (for example `payments/tenant-7`).
    Scope,
    "scope"
);

impl Scope {
    /// The scope's first segment (up to the first `/` or `:`), used as the
    /// metrics label so that per-tenant or per-principal scopes do not create a
    /// time series each.
    ///
    /// ```
    /// use idem_core::Scope;
    /// assert_eq!(Scope::new("payments/tenant-7").unwrap().family(), "payments");
    /// assert_eq!(Scope::new("http:3f2a:POST:/orders").unwrap().family(), "http");
    /// assert_eq!(Scope::new("emails").unwrap().family(), "emails");
    /// ```
    pub fn family(&self) -> &str {
        self.0.split(['/', ':']).next().unwrap_or(&self.0)
    }
}

/// A named resource guarded by fencing tokens (`ledger/acc-7`, `report-job`).
/// 1–255 visible ASCII characters, like keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource(String);

impl Resource {
    /// Checks and wraps a resource name.
    pub fn new(name: impl Into<String>) -> Result<Self, KeyError> {
        let name = name.into();
        validate("resource name", &name)?;
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_full_visible_range_and_the_length_limit() {
        let all: String = (0x21u8..=0x7e).map(char::from).collect();
        assert!(IdempotencyKey::new(all).is_ok());
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
    }

    #[test]
    fn names_the_rule_that_was_broken() {
        let err = IdempotencyKey::new("k".repeat(256)).unwrap_err();
        assert_eq!(
            err,
            KeyError::TooLong {
                what: "idempotency key",
                len: 256
            }
        );
        assert!(err.to_string().contains("at most 255"));

        let err = IdempotencyKey::new("").unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");

        let err = IdempotencyKey::new("ab\ncd").unwrap_err();
        assert_eq!(
            err,
            KeyError::Invisible {
                what: "idempotency key",
                position: 2,
                found: "\\n".into()
            }
        );
        assert!(err.to_string().contains("position 2"), "{err}");

        let err = IdempotencyKey::new("ключ").unwrap_err();
        assert!(matches!(err, KeyError::Invisible { position: 0, .. }));

        let err = Scope::new("").unwrap_err();
        assert!(err.to_string().starts_with("scope is empty"), "{err}");
    }
}
