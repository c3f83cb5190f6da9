//! JSON fingerprints: any body hashes without a panic, and a JSON body hashes
//! the same however its objects' keys are ordered and however it is spaced.
#![no_main]

use idem_core::Fingerprint;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// `value` as JSON text with every object's keys in reverse order.
fn reversed(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(key).expect("a string"));
                out.push(':');
                reversed(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reversed(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&serde_json::to_string(scalar).expect("a scalar")),
    }
}

fuzz_target!(|body: &[u8]| {
    let fingerprint = Fingerprint::of_json_or_bytes(body);
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        assert_eq!(fingerprint, Fingerprint::of_bytes(body));
        return;
    };
    let Ok(canonical) = Fingerprint::of_json(&value) else {
        return;
    };
    assert_eq!(fingerprint, canonical);

    let mut text = String::new();
    reversed(&value, &mut text);
    assert_eq!(
        Fingerprint::of_json_or_bytes(text.as_bytes()),
        canonical,
        "{text}"
    );
    let pretty = serde_json::to_string_pretty(&value).expect("a value");
    assert_eq!(
        Fingerprint::of_json_or_bytes(pretty.as_bytes()),
        canonical,
        "{pretty}"
    );
});
