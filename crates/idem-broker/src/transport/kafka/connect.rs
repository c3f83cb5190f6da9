//! The librdkafka configurations Idem makes from [`Settings`], and the check
//! that refuses a setting that would break the guarantee.
//!
//! A consumer commits offsets itself, after the effect committed: librdkafka
//! must neither commit on a timer (`enable.auto.commit`) nor advance the
//! offset to commit when it hands a record over (`enable.auto.offset.store`).
//! A producer must be idempotent so its own retries neither duplicate nor
//! reorder: `enable.idempotence=true`, `acks=all`, at most 5 requests in
//! flight per connection, and retries bounded by a delivery timeout.

use rdkafka::ClientConfig;

use super::{Settings, UnsafeSetting};

impl Settings {
    /// The first of `names` that is set, with its value.
    fn get(&self, names: &[&str]) -> Option<(&str, &str)> {
        names
            .iter()
            .find_map(|name| self.iter().find(|(set, _)| set == name))
    }

    /// The configuration of a consumer in `group` reading from `brokers`:
    /// offsets committed only by Idem, transactional records read only once
    /// committed, a new group starting from the earliest record. Settings
    /// given here override those defaults, except the two Idem needs.
    pub fn consumer(&self, brokers: &str, group: &str) -> Result<ClientConfig, UnsafeSetting> {
        for name in ["enable.auto.commit", "enable.auto.offset.store"] {
            if let Some((name, value)) = self.get(&[name])
                && !is_false(value)
            {
                return Err(UnsafeSetting {
                    name: name.to_owned(),
                    value: value.to_owned(),
                    why: "an effectively-once consumer commits each offset itself, only after the record's effect committed; leave it out (Idem sets it to false)".into(),
                });
            }
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false");
        for (name, value) in self.iter() {
            config.set(name, value);
        }
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        Ok(config)
    }

    /// The configuration of an idempotent producer to `brokers`: the broker
    /// drops a retried batch it already has (producer id and sequence), so
    /// a retry neither duplicates nor reorders. Settings that would turn
    /// that off are refused.
    pub fn producer(&self, brokers: &str) -> Result<ClientConfig, UnsafeSetting> {
        let refuse = |(name, value): (&str, &str), why: &str| UnsafeSetting {
            name: name.to_owned(),
            value: value.to_owned(),
            why: why.to_owned(),
        };
        if let Some(found) = self.get(&["enable.idempotence"])
            && is_false(found.1)
        {
            return Err(refuse(
                found,
                "without the idempotent producer a retried send can write the record twice, or out of order; leave it out (Idem sets it to true)",
            ));
        }
        if let Some(found) = self.get(&["acks", "request.required.acks"])
            && !matches!(found.1, "all" | "-1")
        {
            return Err(refuse(
                found,
                "a record acknowledged by fewer than all in-sync replicas is lost when the leader fails; use acks=all",
            ));
        }
        if let Some(found) = self.get(&["max.in.flight.requests.per.connection", "max.in.flight"])
            && found.1.parse::<u32>().is_ok_and(|n| n > 5)
        {
            return Err(refuse(
                found,
                "the broker keeps the order of an idempotent producer's retries only for up to 5 requests in flight per connection; use 5 or fewer",
            ));
        }
        if let Some(found) = self.get(&["delivery.timeout.ms", "message.timeout.ms"])
            && found.1.parse::<u64>().is_ok_and(|n| n == 0)
        {
            return Err(refuse(
                found,
                "0 retries a send forever; give the retries a bound (the relay retries the message itself after that), e.g. 30000",
            ));
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("message.timeout.ms", "30000");
        for (name, value) in self.iter() {
            config.set(name, value);
        }
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "max.in.flight.requests.per.connection",
                self.get(&["max.in.flight.requests.per.connection", "max.in.flight"])
                    .map_or("5", |(_, v)| v),
            );
        Ok(config)
    }
}

fn is_false(value: &str) -> bool {
    matches!(value.to_ascii_lowercase().as_str(), "false" | "0" | "no")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_never_commits_on_its_own() {
        let config = Settings::new().consumer("k:9092", "billing").unwrap();
        assert_eq!(config.get("enable.auto.commit"), Some("false"));
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
        for name in ["enable.auto.commit", "enable.auto.offset.store"] {
            let error = Settings::new()
                .set(name, "true")
                .consumer("k:9092", "billing")
                .unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
        let kept = Settings::new()
            .set("auto.offset.reset", "latest")
            .consumer("k:9092", "g")
            .unwrap();
        assert_eq!(kept.get("auto.offset.reset"), Some("latest"));
    }

    #[test]
    fn a_producer_stays_idempotent() {
        let config = Settings::new().producer("k:9092").unwrap();
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(
            config.get("max.in.flight.requests.per.connection"),
            Some("5")
        );
        for (name, value) in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("max.in.flight.requests.per.connection", "6"),
            ("delivery.timeout.ms", "0"),
        ] {
            let error = Settings::new()
                .set(name, value)
                .producer("k:9092")
                .unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
        assert!(
            Settings::new()
                .set("max.in.flight", "1")
                .producer("k:9092")
                .is_ok()
        );
    }
}
