//! librdkafka settings given on top of Idem's ([`Settings`], from a URL's
//! query or code), and the error that refuses one ([`UnsafeSetting`]). The
//! type is read in every build, since a Kafka source or destination holds
//! it; the configurations made from it, and the check, are in `connect`.

use std::collections::BTreeMap;
use std::fmt;

/// A setting that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Kafka setting {name}={value} refused: {why}")]
pub struct UnsafeSetting {
    /// The setting's name.
    pub name: String,
    /// The value given.
    pub value: String,
    /// What it would break, and what to write instead.
    pub why: String,
}

/// librdkafka settings given on top of Idem's (from a URL's query, or code):
/// `security.protocol`, `sasl.username`, `client.id`, `fetch.max.bytes`, ...
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Settings(BTreeMap<String, String>);

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: BTreeMap<&str, &str> = self
            .0
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str(),
                    if is_secret(name) {
                        "***"
                    } else {
                        value.as_str()
                    },
                )
            })
            .collect();
        f.debug_tuple("Settings").field(&shown).finish()
    }
}

/// Whether a setting's value must not be printed: passwords
/// (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`), secrets
/// (`sasl.oauthbearer.client.secret`), a private key given inline
/// (`ssl.key.pem`) and configurations that may hold any of them.
pub(crate) fn is_secret(name: &str) -> bool {
    name.contains("password")
        || name.contains("secret")
        || name == "ssl.key.pem"
        || name == "sasl.oauthbearer.config"
        || name == "sasl.jaas.config"
}

impl Settings {
    /// No extra settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one setting.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.insert(name.into(), value.into());
        self
    }

    /// The settings, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(String, String)> for Settings {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_not_printed() {
        for name in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "ssl.key.pem",
        ] {
            let shown = format!(
                "{:?}",
                Settings::new()
                    .set(name, "hunter2")
                    .set("sasl.username", "app")
            );
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app"), "{shown}");
        }
    }
}
