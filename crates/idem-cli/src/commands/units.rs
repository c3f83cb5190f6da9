//! Durations and sizes as people write them on the command line and in
//! config files (`300ms`, `7d`, `64KiB`), with errors that say what to write.

use std::time::Duration;

use anyhow::bail;

/// A duration such as `300ms`, `60s`, `2m`, `7d`, `1h 30m`; more than zero.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        anyhow::anyhow!("{text:?} is not a duration ({e}); write a number and a unit, such as 300ms, 60s, 2m, 24h or 7d")
    })?;
    if duration.is_zero() {
        bail!("{text:?} is zero; give a duration longer than that");
    }
    Ok(duration)
}

/// A size such as `65536`, `64KiB`, `1MiB`, `1MB` (KB, MB, GB are powers of
/// 1000; KiB, MiB, GiB of 1024); more than zero.
pub fn parse_size(text: &str) -> anyhow::Result<usize> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let explain = || {
        anyhow::anyhow!(
            "{text:?} is not a size; write a whole number of bytes with an optional unit, such as 65536, 64KiB or 1MiB"
        )
    };
    let number: u64 = number.parse().map_err(|_| explain())?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1000 * 1000,
        "mib" => 1 << 20,
        "g" | "gb" => 1000 * 1000 * 1000,
        "gib" => 1 << 30,
        _ => return Err(explain()),
    };
    let bytes = number.checked_mul(scale).ok_or_else(explain)?;
    if bytes == 0 {
        bail!("{text:?} is zero; give a size of at least one byte");
    }
    usize::try_from(bytes).map_err(|_| explain())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_as_people_write_them() {
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1 mb").unwrap(), 1_000_000);
        for bad in ["", "MiB", "1.5MiB", "12 parsecs", "0", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        let error = parse_duration("sixty").unwrap_err().to_string();
        assert!(error.contains("such as 300ms"), "{error}");
        assert!(parse_duration("0s").is_err());
    }
}
