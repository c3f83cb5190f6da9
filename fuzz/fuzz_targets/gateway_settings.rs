//! The gateway's TOML config file (`idem serve --config`): any text either
//! resolves to settings or is refused with a message; settings that resolve
//! keep their invariants and, written out again, resolve to themselves.
#![no_main]

use idem_gateway::{GatewaySettings, GivenSettings, SettingsFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let given = GivenSettings::default();
    let settings = match GatewaySettings::resolve(&given, Some(SettingsFile::new("fuzz.toml", text))) {
        Ok(settings) => settings,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    assert!(settings.retention > settings.lease, "{settings:?}");
    assert!(settings.max_body > 0, "{settings:?}");
    assert!(!settings.methods.is_empty(), "{settings:?}");
    assert!(settings.methods.iter().all(|m| !m.is_safe()), "{settings:?}");
    assert!(
        settings
            .max_in_flight
            .is_none_or(|limit| (1..=idem_gateway::MAX_IN_FLIGHT).contains(&limit)),
        "{settings:?}"
    );
    assert!(settings.routes.iter().all(|r| r.starts_with('/')), "{settings:?}");
    assert!(
        settings
            .grpc_unary
            .iter()
            .all(|m| m.starts_with('/') && m.split('/').count() == 3),
        "{settings:?}"
    );
    let written = settings.to_toml();
    let again = GatewaySettings::resolve(&given, Some(SettingsFile::new("fuzz.toml", &written)))
        .unwrap_or_else(|e| panic!("{written:?} (from {text:?}) does not resolve: {e}"));
    assert_eq!(again, settings, "{written:?} from {text:?}");
});
