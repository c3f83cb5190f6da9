//! Reading the `Idempotency-Key` header.
//!
//! The IETF draft defines the header as an RFC 8941 Structured Field *String*
//! item (`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`). Most clients
//! in the wild (Stripe's among them) send the key bare, without quotes, and many
//! such keys (a UUID starting with a digit) are not even valid RFC 8941 tokens.
//! So the rule here is:
//!
//! - a value that starts with `"` is parsed as an RFC 8941 Item (with the `sfv`
//!   crate); it must be a String, and its parameters, if any, are ignored as the
//!   RFC asks;
//! - any other value is the key itself, with surrounding spaces and tabs removed.
//!
//! Either way the key must then pass [`IdempotencyKey`]'s rules (1–255 visible
//! ASCII characters), and a refusal names the rule that was broken with that
//! type's own error text. Several `Idempotency-Key` fields in one request are
//! refused: there is no way to tell which one the client meant.

use http::{HeaderMap, HeaderName};
use idem_core::{IdempotencyKey, KeyError};
use sfv::{BareItem, Item, Parser, Version};

pub use idem_retry::IDEMPOTENCY_KEY;

/// The response header set (to `true`) on every replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The response header on every answer to a keyed request that claimed its
/// key or replayed it: until when the key is remembered (the end of its
/// dedupe window, an HTTP-date). A retry sent before then is answered from
/// the record; after it the key is new again, unless the server keeps
/// tombstones, which refuse a late retry with 410 Gone for a while longer.
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");

/// Says on `headers` until when the key of the answer is remembered.
pub(crate) fn mark_expiry(headers: &mut http::HeaderMap, expires_at: idem_core::Timestamp) {
    let date = httpdate::fmt_http_date(expires_at.system_time());
    if let Ok(value) = http::HeaderValue::from_str(&date) {
        headers.insert(IDEMPOTENCY_KEY_EXPIRES, value);
    }
}

/// The response header set (to `true`) when a request with a safe method
/// (GET, HEAD, OPTIONS, TRACE) carried an `Idempotency-Key`: such a request
/// changes nothing, so it ran as usual and its key was not used.
pub const IDEMPOTENCY_KEY_IGNORED: HeaderName = HeaderName::from_static("idempotency-key-ignored");

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The request carried the header more than once.
    #[error(
        "the request has {count} Idempotency-Key headers; send exactly one, the same on every retry"
    )]
    Several {
        /// How many were found.
        count: usize,
    },
    /// A quoted value that is not an RFC 8941 String item.
    #[error(
        "the Idempotency-Key header is not an RFC 8941 String ({reason}); send the key in double quotes, or bare"
    )]
    NotAString {
        /// What the structured-field parser found wrong.
        reason: String,
    },
    /// The key broke one of the key rules.
    #[error(transparent)]
    Invalid(#[from] KeyError),
}

/// The key carried by `headers`: `Ok(None)` when there is none, an error when
/// there are several or the one there is malformed.
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use idem_http::{read_key, IDEMPOTENCY_KEY};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(read_key(&headers), Ok(None));
/// headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("\"order-42\""));
/// assert_eq!(read_key(&headers).unwrap().unwrap().as_str(), "order-42");
/// headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("8e03978e-40d5"));
/// assert_eq!(read_key(&headers).unwrap().unwrap().as_str(), "8e03978e-40d5");
/// headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("another"));
/// assert!(read_key(&headers).is_err());
/// ```
pub fn read_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyHeaderError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let more = values.count();
    if more > 0 {
        return Err(KeyHeaderError::Several { count: more + 1 });
    }
    parse_key(first.as_bytes()).map(Some)
}

/// Parses one header value (quoted RFC 8941 String, or bare) into a key.
pub fn parse_key(value: &[u8]) -> Result<IdempotencyKey, KeyHeaderError> {
    let value = value.trim_ascii();
    if value.first() != Some(&b'"') {
        return Ok(IdempotencyKey::new(String::from_utf8_lossy(value))?);
    }
    match Parser::new(value)
        .with_version(Version::Rfc8941)
        .parse_item::<Item>()
    {
        Ok(item) => match item.bare_item {
            BareItem::String(text) => Ok(IdempotencyKey::new(text.as_str())?),
            other => Err(KeyHeaderError::NotAString {
                reason: format!("found {}", kind(&other)),
            }),
        },
        Err(error) => {
            // A String may hold only 0x20..=0x7E. When the quoted text holds
            // anything else, the key rule it breaks is the clearer answer.
            let inner = value[1..].strip_suffix(b"\"").unwrap_or(&value[1..]);
            if !inner.iter().all(|b| (0x20..=0x7e).contains(b))
                && let Err(rule) = IdempotencyKey::new(String::from_utf8_lossy(inner))
            {
                return Err(rule.into());
            }
            Err(KeyHeaderError::NotAString {
                reason: error.to_string(),
            })
        }
    }
}

fn kind(item: &BareItem) -> &'static str {
    match item {
        BareItem::Integer(_) => "an Integer",
        BareItem::Decimal(_) => "a Decimal",
        BareItem::String(_) => "a String",
        BareItem::Token(_) => "a Token",
        BareItem::ByteSequence(_) => "a Byte Sequence",
        BareItem::Boolean(_) => "a Boolean",
        BareItem::Date(_) => "a Date",
        BareItem::DisplayString(_) => "a Display String",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Result<String, KeyHeaderError> {
        parse_key(value).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn quoted_strings_and_bare_keys_give_the_same_key() {
        assert_eq!(key(br#""abc-123""#).unwrap(), "abc-123");
        assert_eq!(key(b"abc-123").unwrap(), "abc-123");
        assert_eq!(key(b"  abc-123\t").unwrap(), "abc-123");
        assert_eq!(key(br#"  "abc-123"  "#).unwrap(), "abc-123");
        // A UUID starting with a digit is no RFC 8941 token, and still a key.
        assert_eq!(
            key(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        // Escapes inside a String are honoured; parameters are ignored.
        assert_eq!(key(br#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(key(br#""abc";v=1"#).unwrap(), "abc");
    }

    #[test]
    fn each_broken_rule_is_named() {
        let empty = key(b"").unwrap_err();
        assert!(empty.to_string().contains("is empty"), "{empty}");
        let empty_quoted = key(br#""""#).unwrap_err();
        assert!(
            empty_quoted.to_string().contains("is empty"),
            "{empty_quoted}"
        );

        let long = key("k".repeat(256).as_bytes()).unwrap_err();
        assert!(long.to_string().contains("at most 255"), "{long}");
        let long_quoted = key(format!("\"{}\"", "k".repeat(256)).as_bytes()).unwrap_err();
        assert!(
            long_quoted.to_string().contains("at most 255"),
            "{long_quoted}"
        );

        let tab = key(b"ab\tcd").unwrap_err();
        assert!(tab.to_string().contains("not visible ASCII"), "{tab}");
        let control_quoted = key(b"\"ab\x01cd\"").unwrap_err();
        assert!(
            matches!(
                control_quoted,
                KeyHeaderError::Invalid(KeyError::Invisible { position: 2, .. })
            ),
            "{control_quoted:?}"
        );
        let space_quoted = key(br#""a b""#).unwrap_err();
        assert!(
            space_quoted.to_string().contains("not visible ASCII"),
            "{space_quoted}"
        );
        let non_ascii = key("ключ".as_bytes()).unwrap_err();
        assert!(
            non_ascii.to_string().contains("not visible ASCII"),
            "{non_ascii}"
        );
    }

    #[test]
    fn quoted_values_must_be_one_string() {
        let unterminated = key(br#""abc"#).unwrap_err();
        assert!(
            matches!(unterminated, KeyHeaderError::NotAString { .. }),
            "{unterminated:?}"
        );
        let list = key(br#""a", "b""#).unwrap_err();
        assert!(
            matches!(list, KeyHeaderError::NotAString { .. }),
            "{list:?}"
        );
    }

    #[test]
    fn several_headers_are_refused() {
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, "a".parse().unwrap());
        headers.append(IDEMPOTENCY_KEY, "a".parse().unwrap());
        assert_eq!(
            read_key(&headers),
            Err(KeyHeaderError::Several { count: 2 })
        );
    }
}
