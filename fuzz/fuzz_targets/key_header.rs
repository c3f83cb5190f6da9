//! The `Idempotency-Key` header: any bytes either give a key that obeys the
//! key rules or a refusal, never a panic; and a key read from a header reads
//! the same whether it comes back bare or as an RFC 8941 String.
#![no_main]

use http::{HeaderMap, HeaderValue};
use idem_http::{IDEMPOTENCY_KEY, parse_key, read_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = parse_key(data);

    // One header field carrying these bytes reads as parse_key says.
    if let Ok(value) = HeaderValue::from_bytes(data) {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, value);
        assert_eq!(read_key(&headers), parsed.clone().map(Some));
    }

    let Ok(key) = parsed else { return };
    let text = key.as_str();
    assert!((1..=255).contains(&text.len()), "{text:?}");
    assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text:?}");

    // Quoted as an RFC 8941 String, with `"` and `\` escaped: the same key.
    let quoted = format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(parse_key(quoted.as_bytes()).as_ref(), Ok(&key), "{quoted}");
    // Bare (a key starting with `"` would be read as a quoted one).
    if !text.starts_with('"') {
        assert_eq!(parse_key(text.as_bytes()).as_ref(), Ok(&key));
    }
});
