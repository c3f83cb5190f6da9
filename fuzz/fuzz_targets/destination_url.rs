//! Destination URLs: `Display` writes the canonical form, stored in the
//! outbox and dead-letter tables, which must parse back to the same
//! destination; the redacted form never panics.
#![no_main]

use idem_broker::publish::Destination;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(destination) = text.parse::<Destination>() else {
        return;
    };
    let canonical = destination.to_string();
    let again = canonical
        .parse::<Destination>()
        .unwrap_or_else(|e| panic!("{canonical:?} (from {text:?}) does not parse back: {e}"));
    assert_eq!(again, destination, "{canonical:?} from {text:?}");
    assert_eq!(again.to_string(), canonical);
    let _ = destination.redacted();
});
