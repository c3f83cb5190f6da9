//! The gateway's upstream URL (`idem serve --upstream`, `upstream` in its
//! config file): what parses shows as `http://AUTHORITY/BASE`,
//! `https://AUTHORITY/BASE` or `h2c://AUTHORITY/BASE` and parses back to the
//! same upstream.
#![no_main]

use idem_http::gateway::Upstream;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(upstream) = text.parse::<Upstream>() else {
        return;
    };
    let shown = upstream.to_string();
    assert!(
        shown.starts_with("http://")
            || shown.starts_with("https://")
            || (shown.starts_with("h2c://") && upstream.is_http2()),
        "{shown:?}"
    );
    let again = shown
        .parse::<Upstream>()
        .unwrap_or_else(|e| panic!("{shown:?} (from {text:?}) does not parse back: {e}"));
    assert_eq!(again, upstream, "{shown:?} from {text:?}");
});
