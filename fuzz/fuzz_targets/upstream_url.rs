//! The gateway's upstream URL (`idem serve --upstream`, `upstream` in its
//! config file): what parses shows as `http://AUTHORITY/BASE`,
//! `https://AUTHORITY/BASE` or `h2c://AUTHORITY/BASE`, never with a password,
//! and written out with its password parses back to the same upstream.
#![no_main]

use idem_gateway::Upstream;
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
    let written = upstream.to_url_with_password();
    let again = written
        .parse::<Upstream>()
        .unwrap_or_else(|e| panic!("{written:?} (from {text:?}) does not parse back: {e}"));
    assert_eq!(again, upstream, "{written:?} from {text:?}");
    if upstream.basic_auth().is_none() {
        assert_eq!(shown, written, "{text:?}");
    } else {
        // The user-info is shown without its password.
        let user_info = |url: &str| {
            let rest = &url[url.find("://").unwrap() + 3..];
            let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
            authority[..authority.rfind('@').unwrap()].to_owned()
        };
        let (written_user, shown_user) = (user_info(&written), user_info(&shown));
        if let Some((user, _password)) = written_user.split_once(':') {
            // Shown as the user and `***`, whatever the password.
            assert_eq!(shown_user, format!("{user}:***"), "{shown:?} from {text:?}");
        }
    }
});
