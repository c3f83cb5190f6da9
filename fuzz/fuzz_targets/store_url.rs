//! Store URLs: any text parses or is refused without a panic. An SQLite
//! location shows as a URL that parses back to it; a PostgreSQL, Redis or
//! DynamoDB one shows redacted (no password), and the redacted form is stable.
#![no_main]

use idem::StoreLocation;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(location) = text.parse::<StoreLocation>() else {
        return;
    };
    let shown = location.to_string();
    let again: StoreLocation = shown
        .parse()
        .unwrap_or_else(|e| panic!("{shown:?} does not parse back: {e}"));
    match &location {
        StoreLocation::Sqlite(_) => assert_eq!(again, location, "{shown:?}"),
        StoreLocation::Postgres(_) => {
            assert!(matches!(again, StoreLocation::Postgres(_)));
            assert_eq!(again.to_string(), shown);
        }
        StoreLocation::Redis(_) => {
            assert!(matches!(again, StoreLocation::Redis(_)));
            assert_eq!(again.to_string(), shown);
        }
        StoreLocation::DynamoDb(_) => {
            assert!(matches!(again, StoreLocation::DynamoDb(_)));
            assert_eq!(again.to_string(), shown);
        }
    }
});
