//! DynamoDB for tests: moto's server on loopback (started by
//! `scripts/services.sh` on 127.0.0.1:5000), or the endpoint in
//! `$IDEM_DYNAMODB_URL`, and a table name of the test's own, so no two tests
//! share records. The store creates its table on first open.
//!
//! Only a TCP connection is made here, so this module needs no AWS client;
//! a missing server skips the test, or fails it when `IDEM_REQUIRE_SERVICES`
//! is set.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The variable naming another DynamoDB endpoint than moto's on loopback: a
/// store URL without its table (`dynamodb+http://KEY:SECRET@HOST:PORT`).
pub const ENDPOINT_VAR: &str = "IDEM_DYNAMODB_URL";

/// The endpoint the tests use, without a table: `$IDEM_DYNAMODB_URL`, else
/// `dynamodb+http://test:test@127.0.0.1:5000` (moto takes any credentials).
pub fn endpoint() -> String {
    std::env::var(ENDPOINT_VAR)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "dynamodb+http://test:test@127.0.0.1:5000".to_owned())
}

/// The store URL of table `table` at the tests' endpoint.
pub fn url_of(table: &str) -> String {
    format!("{}/{table}", endpoint().trim_end_matches('/'))
}

/// A table name no other test (of this process or another) uses:
/// `idem-NAME-PID-N-NANOS`, within DynamoDB's rule for names.
pub fn unique_table(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .take(120)
        .collect();
    format!(
        "idem-{name}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The URL of a new table for the test `name`, or `None` when the endpoint
/// does not accept connections (after
/// [`missing_service`](crate::services::missing_service), which fails the
/// test when services are required).
pub fn fresh_table_url(name: &str) -> Option<String> {
    endpoint_answers().then(|| url_of(&unique_table(name)))
}

/// Whether the endpoint accepts connections; reports it missing (skip, or
/// fail under `IDEM_REQUIRE_SERVICES`) when not.
pub fn endpoint_answers() -> bool {
    let url = endpoint();
    let (host, port) = host_and_port(&url);
    let reached = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())
        .and_then(|mut addrs| addrs.next().ok_or_else(|| format!("{host} has no address")))
        .and_then(|addr: SocketAddr| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())
        });
    match reached {
        Ok(_) => true,
        Err(why) => {
            crate::services::missing_service(
                "DynamoDB (moto's server)",
                &format!(
                    "{host}:{port}: {why}; scripts/services.sh starts it, or set {ENDPOINT_VAR}"
                ),
            );
            false
        }
    }
}

/// The host and port a `dynamodb+http://[KEY:SECRET@]HOST:PORT` endpoint
/// names (443 without a port, 127.0.0.1 without a host).
fn host_and_port(url: &str) -> (String, u16) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let hostport = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hostport)| hostport);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().unwrap_or(443)),
        None => (hostport, 443),
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    (host.to_owned(), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_host_and_port_of_an_endpoint() {
        assert_eq!(
            host_and_port("dynamodb+http://test:test@127.0.0.1:5000"),
            ("127.0.0.1".to_owned(), 5000)
        );
        assert_eq!(
            host_and_port("dynamodb://dynamodb.eu-west-1.amazonaws.com/"),
            ("dynamodb.eu-west-1.amazonaws.com".to_owned(), 443)
        );
    }

    #[test]
    fn table_names_are_unique_and_valid() {
        let (a, b) = (unique_table("a test/name"), unique_table("a test/name"));
        assert_ne!(a, b);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')),
            "{a}"
        );
        assert!(a.len() <= 255);
    }
}
