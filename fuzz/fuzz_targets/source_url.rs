//! Source URLs (`idem forward --from`): any text parses or is refused
//! without a panic, and a parsed source shows (redacted) without a panic.
//! Its display is for people, not a round trip: it hides the password and
//! the Kafka settings.
#![no_main]

use idem_broker::consume::Source;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match text.parse::<Source>() {
        Ok(source) => {
            let shown = source.to_string();
            if let Source::Kafka { group, .. } = &source {
                assert!(!group.is_empty(), "{shown:?}");
            }
        }
        Err(refusal) => {
            let _ = refusal.to_string();
        }
    }
});
