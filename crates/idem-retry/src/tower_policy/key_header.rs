//! The `Idempotency-Key` request header, written in one place.

use http::{HeaderName, HeaderValue, Request};
use idem_core::IdempotencyKey;

/// The `Idempotency-Key` header ([`idem_core::IDEMPOTENCY_KEY_HEADER`]) as an
/// `http` header name, which is always lowercase. The one `HeaderName` for it:
/// `idem-http` re-exports this constant.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header value for `key`: an RFC 8941 String (`"order-42"`), the form the
/// IETF draft specifies, with `\` and `"` escaped.
pub fn key_header_value(key: &IdempotencyKey) -> HeaderValue {
    let mut text = String::with_capacity(key.as_str().len() + 2);
    text.push('"');
    for ch in key.as_str().chars() {
        if matches!(ch, '"' | '\\') {
            text.push('\\');
        }
        text.push(ch);
    }
    text.push('"');
    HeaderValue::from_str(&text)
        .expect("a key is visible ASCII, which is always a valid header value")
}

/// Attaches `key` to a request, once, before it enters the retry layer. Every
/// attempt the layer makes carries it as the `Idempotency-Key` header.
pub fn with_idempotency_key<B>(mut request: Request<B>, key: IdempotencyKey) -> Request<B> {
    request.extensions_mut().insert(key);
    request
}

/// Sets the header from the key attached to the request, if one is.
pub(crate) fn stamp<B>(request: &mut Request<B>) {
    if let Some(key) = request.extensions().get::<IdempotencyKey>() {
        let value = key_header_value(key);
        request.headers_mut().insert(IDEMPOTENCY_KEY, value);
    }
}

/// Whether the request carries a key, attached or already in its headers.
pub(crate) fn has_key<B>(request: &Request<B>) -> bool {
    request.extensions().get::<IdempotencyKey>().is_some()
        || request.headers().contains_key(IDEMPOTENCY_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_name_is_the_core_one() {
        assert!(
            IDEMPOTENCY_KEY
                .as_str()
                .eq_ignore_ascii_case(idem_core::IDEMPOTENCY_KEY_HEADER)
        );
        assert_eq!(
            HeaderName::from_bytes(idem_core::IDEMPOTENCY_KEY_HEADER.as_bytes()).unwrap(),
            IDEMPOTENCY_KEY
        );
    }

    #[test]
    fn writes_a_structured_field_string() {
        let key = IdempotencyKey::new("order-42").unwrap();
        assert_eq!(key_header_value(&key), "\"order-42\"");
        let awkward = IdempotencyKey::new(r#"a"b\c"#).unwrap();
        assert_eq!(key_header_value(&awkward), r#""a\"b\\c""#);
    }

    #[test]
    fn stamps_the_attached_key() {
        let key = IdempotencyKey::new("k-1").unwrap();
        let mut request = with_idempotency_key(Request::new(()), key);
        assert!(has_key(&request));
        stamp(&mut request);
        assert_eq!(request.headers()[IDEMPOTENCY_KEY], "\"k-1\"");
    }
}
