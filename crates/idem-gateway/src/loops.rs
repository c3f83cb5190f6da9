//! Requests that would come back to the gateway: an upstream that is the
//! gateway's own listener would have every request forwarded to itself
//! without end, each copy holding a connection and a body, until the process
//! runs out of file descriptors or memory.
//!
//! Two guards. At start-up, an upstream whose address is the listener's
//! (the same port, and the same address, `localhost` and `0.0.0.0` read as
//! the machine itself) is refused ([`Upstream::points_at`]). At run time,
//! every forwarded request carries a `Via` entry naming this gateway
//! instance (`Via: 1.1 idem-<random id>`, RFC 9110 §7.6.3); a request that
//! arrives already carrying it went round a loop (through another proxy, or
//! a name that resolves back to the gateway) and is answered 508 Loop
//! Detected instead of being forwarded again.

use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::header::{CONNECTION, CONTENT_TYPE, VIA};
use http::{HeaderMap, HeaderValue, StatusCode, Version};
use serde_json::json;

use super::Upstream;
use idem_http::Mode;
use idem_http::Refused;

/// How long the upstream's name may take to resolve for the start-up check;
/// a name that does not resolve in time is left to the run-time check.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The problem type of a request that came back to the gateway.
pub(crate) const LOOP_DETECTED: &str = "loop-detected";

/// The versions a request can come in, as `Via` names them; the first,
/// HTTP/1.1, also stands for any version not listed.
const VERSIONS: [(Version, &str); 5] = [
    (Version::HTTP_11, "1.1"),
    (Version::HTTP_10, "1.0"),
    (Version::HTTP_2, "2"),
    (Version::HTTP_3, "3"),
    (Version::HTTP_09, "0.9"),
];

/// One running gateway's name in `Via` headers: `idem-` and 16 random hex
/// digits, new at every start.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    token: String,
    /// This instance's `Via` entry for each version a request can come in,
    /// made once (cloning a `HeaderValue` shares its bytes).
    entries: [HeaderValue; 5],
}

impl Instance {
    /// A fresh, random instance name.
    pub(crate) fn new() -> Self {
        // std's hasher keys are random per process (and differ for every
        // `RandomState`); the time and process id make two starts differ
        // even where they are not.
        let mut hasher = std::hash::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            hasher.write_u128(now.as_nanos());
        }
        let token = format!("idem-{:016x}", hasher.finish());
        let entries = VERSIONS.map(|(_, protocol)| {
            HeaderValue::try_from(format!("{protocol} {token}"))
                .expect("a version and hex digits make a valid header value")
        });
        Self { token, entries }
    }

    /// Adds this instance's `Via` entry to a request being forwarded, after
    /// any the request came with; `version` is the one the request was
    /// received in.
    pub(crate) fn stamp(&self, version: Version, headers: &mut HeaderMap) {
        let entry = VERSIONS
            .iter()
            .position(|(known, _)| *known == version)
            .unwrap_or(0);
        headers.append(VIA, self.entries[entry].clone());
    }

    /// Whether a request's `Via` names this instance: it was forwarded by
    /// this gateway and came back.
    pub(crate) fn came_back(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(VIA)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|entry| entry.split_whitespace().nth(1) == Some(self.token.as_str()))
    }

    /// The answer to a request that came back: 508 Loop Detected, as a
    /// problem (or a Stripe error), closing an HTTP/1 connection.
    pub(crate) fn refusal(&self, mode: Mode, version: Version) -> Response {
        let detail = format!(
            "this request was already forwarded by this gateway (its Via header names {}): the gateway's upstream leads back to the gateway; point the upstream at the service behind it",
            self.token
        );
        tracing::error!(instance = %self.token, "{detail}");
        let mut response = problem(
            mode,
            StatusCode::LOOP_DETECTED,
            LOOP_DETECTED,
            "Loop detected",
            &detail,
        );
        if version <= Version::HTTP_11 {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// A refusal the gateway writes itself, in the layer's vocabulary: a
/// problem+json (IETF mode) or a Stripe `api_error`, counted under
/// `problem_type`.
pub(crate) fn problem(
    mode: Mode,
    status: StatusCode,
    problem_type: &'static str,
    title: &str,
    detail: &str,
) -> Response {
    let (content_type, body) = match mode {
        Mode::Ietf => (
            "application/problem+json",
            json!({
                "type": format!("urn:idem:problem:{problem_type}"),
                "title": title,
                "status": status.as_u16(),
                "detail": detail,
            }),
        ),
        Mode::Stripe => (
            "application/json",
            json!({ "error": { "type": if status.is_server_error() { "api_error" } else { "invalid_request_error" }, "message": detail } }),
        ),
    };
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.extensions_mut().insert(Refused(problem_type));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl Upstream {
    /// Whether this upstream is the listener at `listener`: the same port,
    /// and a host that is the listener's address, where `localhost` is the
    /// loopback address, `0.0.0.0` and `::` as a destination are the
    /// machine itself, and a listener on `0.0.0.0` (or `::`) is reached by
    /// every address of the machine. A host name is resolved (for at most
    /// 2 s); one that does not resolve counts as another machine.
    pub async fn points_at(&self, listener: SocketAddr) -> bool {
        let (host, port) = self.host_and_port();
        if port != listener.port() {
            return false;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let targets: Vec<IpAddr> = if let Ok(ip) = host.parse::<IpAddr>() {
            vec![ip]
        } else if host.eq_ignore_ascii_case("localhost")
            || host.to_ascii_lowercase().ends_with(".localhost")
        {
            vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
        } else {
            match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await
            {
                Ok(Ok(addrs)) => addrs.map(|addr| addr.ip()).collect(),
                _ => Vec::new(),
            }
        };
        targets
            .into_iter()
            .any(|target| reaches(target, listener.ip()))
    }
}

/// Whether a connection to `target` is accepted by a listener bound to
/// `listen` on the same port.
fn reaches(target: IpAddr, listen: IpAddr) -> bool {
    let target = match canonical(target) {
        // As a destination, the unspecified address is this machine.
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    };
    let listen = canonical(listen);
    if target == listen {
        return true;
    }
    match listen {
        // Every address of the machine, of its family.
        IpAddr::V4(ip) if ip.is_unspecified() => target.is_ipv4() && is_local(target),
        // Every address of the machine, IPv4 too (dual stack).
        IpAddr::V6(ip) if ip.is_unspecified() => is_local(target),
        _ => false,
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` is an address of this machine: a loopback one, or one a
/// socket can be bound to.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> Upstream {
        url.parse().unwrap()
    }

    #[tokio::test]
    async fn an_upstream_that_is_the_listener_is_recognised() {
        let listener: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let any6: SocketAddr = "[::]:8080".parse().unwrap();
        for (url, at) in [
            ("http://127.0.0.1:8080", listener),
            ("http://localhost:8080/api", listener),
            ("http://LOCALHOST:8080", listener),
            ("http://0.0.0.0:8080", listener),
            ("http://u:p@127.0.0.1:8080", listener),
            ("http://127.0.0.1:8080", any),
            ("http://localhost:8080", any),
            ("http://0.0.0.0:8080", any),
            ("http://127.0.0.1:8080", any6),
            ("http://[::1]:8080", any6),
            ("http://[::ffff:127.0.0.1]:8080", listener),
            ("h2c://127.0.0.1:8080", listener),
        ] {
            assert!(upstream(url).points_at(at).await, "{url} at {at}");
        }
        let port80: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert!(upstream("http://127.0.0.1").points_at(port80).await);
        for (url, at) in [
            ("http://127.0.0.1:9000", listener),
            ("http://127.0.0.2:8080", listener),
            ("http://[::1]:8080", any),
            ("https://127.0.0.1", port80),
            ("http://192.0.2.1:8080", any),
        ] {
            assert!(!upstream(url).points_at(at).await, "{url} at {at}");
        }
    }

    #[test]
    fn a_request_stamped_by_this_instance_is_seen_coming_back() {
        let instance = Instance::new();
        let other = Instance::new();
        assert_ne!(instance.token, other.token);
        assert!(instance.token.starts_with("idem-") && instance.token.len() == 21);

        let mut headers = HeaderMap::new();
        headers.insert(VIA, HeaderValue::from_static("1.1 edge (nginx)"));
        other.stamp(Version::HTTP_2, &mut headers);
        assert!(!instance.came_back(&headers));
        instance.stamp(Version::HTTP_11, &mut headers);
        let written: Vec<&str> = headers
            .get_all(VIA)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(
            written,
            [
                "1.1 edge (nginx)".to_owned(),
                format!("2 {}", other.token),
                format!("1.1 {}", instance.token)
            ]
        );
        assert!(instance.came_back(&headers) && other.came_back(&headers));

        let mut joined = HeaderMap::new();
        joined.insert(
            VIA,
            HeaderValue::try_from(format!("1.0 fred, 1.1 {} (x)", instance.token)).unwrap(),
        );
        assert!(instance.came_back(&joined));
    }
}
