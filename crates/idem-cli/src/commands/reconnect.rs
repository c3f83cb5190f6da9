//! The flags `idem forward` and `idem relay` share for outliving their
//! connections: the reconnect backoff, the connect timeout and the watchdog.

use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use idem_broker::consume::Reconnect;

/// `--reconnect-min`, `--reconnect-max`, `--connect-timeout`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ReconnectArgs {
    /// The first ceiling of the full-jitter backoff between attempts to make
    /// a lost broker or database connection again.
    #[arg(long, value_name = "DURATION", default_value = "100ms")]
    pub reconnect_min: humantime::Duration,
    /// The largest ceiling of that backoff; attempts go on for as long as it
    /// takes.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub reconnect_max: humantime::Duration,
    /// How long one attempt to connect to a broker may take, handshake
    /// included, before it counts as failed and the next one is drawn.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub connect_timeout: humantime::Duration,
}

impl ReconnectArgs {
    /// The backoff asked for.
    pub(crate) fn reconnect(&self) -> Reconnect {
        Reconnect::default()
            .min(self.reconnect_min.into())
            .max(Duration::from(self.reconnect_max).max(self.reconnect_min.into()))
            .connect_timeout(self.connect_timeout.into())
    }
}

/// `--watchdog`: a duration, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watchdog(pub Option<Duration>);

impl FromStr for Watchdog {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        match humantime::parse_duration(text.trim()) {
            Ok(after) if !after.is_zero() => Ok(Self(Some(after))),
            _ => Err(format!(
                "{text:?} is not a watchdog limit; write a duration such as 2m, or off"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_takes_a_duration_or_off() {
        assert_eq!(
            "2m".parse::<Watchdog>().unwrap(),
            Watchdog(Some(Duration::from_secs(120)))
        );
        assert_eq!("off".parse::<Watchdog>().unwrap(), Watchdog(None));
        assert!("0s".parse::<Watchdog>().unwrap_err().contains("or off"));
    }
}
