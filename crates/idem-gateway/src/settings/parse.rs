//! Settings as people write them: sizes (`1MiB`), durations (`30s`, `7d`),
//! limits (`256`, `off`), method, route and gRPC method lists, each refused
//! with what to write instead.

use std::num::NonZeroUsize;
use std::time::Duration;

use http::Method;
use idem_http::Concurrent;

use super::SettingsError;
use super::write::duration_text;

/// A comma-separated method list such as `POST,PATCH,PUT,DELETE`: the
/// methods on which a key is required. Safe methods are refused: a GET
/// changes nothing, so a key on it protects nothing.
pub fn parse_methods(text: &str) -> Result<Vec<Method>, SettingsError> {
    let mut methods = Vec::new();
    for name in text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let method = Method::from_bytes(name.to_ascii_uppercase().as_bytes())
            .map_err(|_| SettingsError::new(format!("{name:?} is not an HTTP method")))?;
        if method.is_safe() {
            return Err(SettingsError::new(format!(
                "{method} changes nothing on the upstream, so there is no reason to require a key on it; list methods with effects, such as POST,PATCH,PUT,DELETE"
            )));
        }
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    if methods.is_empty() {
        return Err(SettingsError::new(
            "no method given; write a list such as POST,PATCH,PUT,DELETE",
        ));
    }
    Ok(methods)
}

/// The most requests in flight at a time: a whole number from 1 to
/// [`MAX_IN_FLIGHT`], or `off` (`None`) for no limit.
pub fn parse_limit(text: &str) -> Result<Option<usize>, SettingsError> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let explain = || {
        SettingsError::new(format!(
            "{text:?} is not a number of requests; write a whole number from 1 to {MAX_IN_FLIGHT}, such as 256, or off for no limit"
        ))
    };
    let limit: usize = text.parse().map_err(|_| explain())?;
    if limit == 0 || limit > MAX_IN_FLIGHT {
        return Err(explain());
    }
    Ok(Some(limit))
}

/// The most `--workers`.
pub(crate) const MAX_WORKERS: usize = 1024;

/// A number of serving runtimes (`--workers`): 1 to [`MAX_WORKERS`].
pub(crate) fn parse_workers(text: &str) -> Result<NonZeroUsize, SettingsError> {
    match text.trim().parse::<usize>() {
        Ok(workers) if workers <= MAX_WORKERS => NonZeroUsize::new(workers),
        _ => None,
    }
    .ok_or_else(|| {
        SettingsError::new(format!(
            "{text:?} is not a number of runtimes; write a whole number from 1 to {MAX_WORKERS}, such as 4"
        ))
    })
}

/// The longest wait `--concurrent wait:DURATION` takes: 10 minutes.
pub const MAX_CONCURRENT_WAIT: Duration = Duration::from_secs(600);

/// What a concurrent duplicate gets: `reject` (409 at once) or
/// `wait:DURATION` (such as `wait:5s`, up to [`MAX_CONCURRENT_WAIT`]).
pub fn parse_concurrent(text: &str) -> Result<Concurrent, SettingsError> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("reject") {
        return Ok(Concurrent::Reject);
    }
    let explain = |why: String| {
        SettingsError::new(format!(
            "{text:?} is not a way to answer concurrent duplicates ({why}); write reject (409 at once) or wait:DURATION, such as wait:5s"
        ))
    };
    let Some((word, duration)) = trimmed.split_once(':') else {
        return Err(explain("neither reject nor wait:DURATION".to_owned()));
    };
    if !word.trim().eq_ignore_ascii_case("wait") {
        return Err(explain(format!("{:?} is not wait", word.trim())));
    }
    let up_to = parse_duration(duration).map_err(|e| explain(e.to_string()))?;
    if up_to > MAX_CONCURRENT_WAIT {
        return Err(explain(format!(
            "longer than {}, the longest wait",
            duration_text(MAX_CONCURRENT_WAIT)
        )));
    }
    Ok(Concurrent::Wait(up_to))
}

/// A cap on waiting duplicates: a whole number from 1 to [`MAX_IN_FLIGHT`].
pub fn parse_waiters(text: &str) -> Result<usize, SettingsError> {
    let text = text.trim();
    match text.parse::<usize>() {
        Ok(cap) if (1..=MAX_IN_FLIGHT).contains(&cap) => Ok(cap),
        _ => Err(SettingsError::new(format!(
            "{text:?} is not a number of waiting requests; write a whole number from 1 to {MAX_IN_FLIGHT}, such as 64"
        ))),
    }
}

/// The largest `--max-in-flight`.
pub const MAX_IN_FLIGHT: usize = 1 << 20;

/// `--max-in-flight` when none is given: 1024. Each request in flight holds
/// a client connection, an upstream connection and, when keyed, its body
/// (up to `--max-body`, 1 MiB by default): 1024 of them bound the gateway
/// to about 1 GiB of bodies and a few thousand sockets under a flood, far
/// above what one upstream usually serves at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// `--runtime` when none is given: one single-threaded runtime per core. On
/// the gateway's benchmark it passed requests through faster than the
/// shared runtime, at the same CPU per request, and was as fast for new
/// keys and replays. (The library's [`GatewayConfig`](crate::GatewayConfig)
/// keeps [`Runtime::Shared`](crate::Runtime::Shared) unless told: an
/// application that embeds the gateway decides its own threads.)
pub const DEFAULT_RUNTIME: crate::Runtime = crate::Runtime::PerCore;

/// The shortest `--lease`: 1 s. A claim is renewed every third of its
/// lease, and each renewal is a round trip to the store; a shorter lease
/// leaves no headroom for one, so a claim would lapse while its request is
/// still running, and a copy of the request would run beside it.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// A lease: a duration of at least [`MIN_LEASE`].
pub fn parse_lease(text: &str) -> Result<Duration, SettingsError> {
    let lease = parse_duration(text)?;
    if lease < MIN_LEASE {
        return Err(SettingsError::new(format!(
            "{text:?} is shorter than {}, the shortest lease: a claim is renewed every third of its lease, and each renewal is a round trip to the store that needs headroom, so a shorter lease lapses while its request still runs and a copy of the request runs beside it; give 1s or more, such as 60s",
            duration_text(MIN_LEASE)
        )));
    }
    Ok(lease)
}

/// A comma-separated list of route templates such as
/// `/payments/{id},/orders`: each starts with `/`, is visible ASCII, and
/// writes a placeholder as a whole segment (`{id}`, or `{*rest}` last).
/// Repeats are dropped; an empty list is no templates.
pub fn parse_routes(text: &str) -> Result<Vec<String>, SettingsError> {
    let mut routes: Vec<String> = Vec::new();
    for route in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let explain = |why: &str| {
            SettingsError::new(format!(
                "{route:?} is not a route template ({why}); write paths such as /payments/{{id}},/orders"
            ))
        };
        if !route.starts_with('/') {
            return Err(explain("it does not start with /"));
        }
        if !route.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(explain("only visible ASCII characters, no spaces"));
        }
        let segments: Vec<&str> = route.split('/').filter(|s| !s.is_empty()).collect();
        for (i, segment) in segments.iter().enumerate() {
            let braces = segment.contains(['{', '}']);
            let whole = segment.len() > 2
                && segment.starts_with('{')
                && segment.ends_with('}')
                && !segment[1..segment.len() - 1].contains(['{', '}']);
            if braces && !whole {
                return Err(explain("a placeholder is a whole segment, such as {id}"));
            }
            if whole && segment.starts_with("{*") && i + 1 != segments.len() {
                return Err(explain("{*rest} can only be the last segment"));
            }
        }
        if !routes.iter().any(|r| r == route) {
            routes.push(route.to_owned());
        }
    }
    Ok(routes)
}

/// A comma-separated list of unary gRPC methods, each as its path
/// `/package.Service/Method`. Repeats are dropped; an empty list is none.
pub fn parse_grpc_methods(text: &str) -> Result<Vec<String>, SettingsError> {
    let mut methods: Vec<String> = Vec::new();
    for method in text.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let parts: Vec<&str> = method.split('/').collect();
        let valid = parts.len() == 3
            && parts[0].is_empty()
            && !parts[1].is_empty()
            && !parts[2].is_empty()
            && method
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_'));
        if !valid {
            return Err(SettingsError::new(format!(
                "{method:?} is not a gRPC method path; write each as /package.Service/Method, such as /payments.v1.Payments/Charge"
            )));
        }
        if !methods.iter().any(|m| m == method) {
            methods.push(method.to_owned());
        }
    }
    Ok(methods)
}

/// The gRPC lookup methods asked before a takeover: a method path for every
/// method (`/payments.v1.Payments/Lookup`), `METHOD=LOOKUP` pairs for one
/// each, or both, comma-separated; written back without spaces.
pub(super) fn parse_grpc_probe(text: &str) -> Result<String, SettingsError> {
    let mut parts = Vec::new();
    let mut every = 0;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let paths: Vec<&str> = part.split('=').map(str::trim).collect();
        if paths.len() > 2 {
            return Err(SettingsError::new(format!(
                "{part:?} is not a gRPC probe; write the lookup method, such as /payments.v1.Payments/Lookup, or METHOD=LOOKUP"
            )));
        }
        every += usize::from(paths.len() == 1);
        parse_grpc_methods(&paths.join(","))?;
        parts.push(paths.join("="));
    }
    if parts.is_empty() || every > 1 {
        return Err(SettingsError::new(format!(
            "{text:?} is not a gRPC probe: give one lookup method for every method, such as /payments.v1.Payments/Lookup, and METHOD=LOOKUP pairs for methods with their own"
        )));
    }
    Ok(parts.join(","))
}

/// A duration such as `300ms`, `60s`, `2m`, `7d`, `1h 30m`; more than zero.
pub fn parse_duration(text: &str) -> Result<Duration, SettingsError> {
    if text.trim_start().starts_with('-') {
        return Err(SettingsError::new(format!(
            "{text:?} is a negative duration; give one longer than zero, such as 300ms, 60s, 2m, 24h or 7d"
        )));
    }
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        SettingsError::new(format!(
            "{text:?} is not a duration ({e}); write a number and a unit, such as 300ms, 60s, 2m, 24h or 7d"
        ))
    })?;
    if duration.is_zero() {
        return Err(SettingsError::new(format!(
            "{text:?} is zero; give a duration longer than that"
        )));
    }
    Ok(duration)
}

/// A size such as `65536`, `64KiB`, `1MiB`, `1MB` (KB, MB, GB are powers of
/// 1000; KiB, MiB, GiB of 1024); more than zero.
pub fn parse_size(text: &str) -> Result<usize, SettingsError> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let explain = || {
        SettingsError::new(format!(
            "{text:?} is not a size; write a whole number of bytes with an optional unit, such as 65536, 64KiB or 1MiB"
        ))
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
        return Err(SettingsError::new(format!(
            "{text:?} is zero; give a size of at least one byte"
        )));
    }
    usize::try_from(bytes).map_err(|_| explain())
}
