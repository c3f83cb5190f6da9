//! Whether tests may skip when a service is missing.
//!
//! A plain `cargo test` on a machine without PostgreSQL skips the tests that need
//! it and says so. CI sets `IDEM_REQUIRE_SERVICES=1`, and then a missing service
//! fails the test instead: service tests are never skipped silently.

/// The variable that makes missing services an error.
pub const REQUIRE_SERVICES: &str = "IDEM_REQUIRE_SERVICES";

/// Whether missing services must fail tests.
pub fn services_required() -> bool {
    std::env::var(REQUIRE_SERVICES).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Reports a missing service: panics when services are required, otherwise
/// prints that the test is skipped.
pub fn missing_service(service: &str, why: &str) {
    if services_required() {
        panic!("{service} is required ({REQUIRE_SERVICES} is set) but not usable: {why}");
    }
    eprintln!(
        "SKIPPED: {service} not reachable ({why}); set {REQUIRE_SERVICES}=1 to make this an error"
    );
}
