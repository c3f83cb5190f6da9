//! Hop-by-hop headers: they describe one connection, not the message, so a
//! proxy removes them in both directions (RFC 9110 §7.6.1) — the fixed list,
//! and every header the `Connection` header names, except `Idempotency-Key`:
//! the gateway dedupes on it, so the upstream must get it too, or a client
//! could have the gateway dedupe on a key the upstream never sees.

use http::HeaderMap;
use http::header::{self, HeaderName};

use idem_http::IDEMPOTENCY_KEY;

/// Headers that never cross a proxy, whatever `Connection` says.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes the hop-by-hop headers of one message: those the `Connection`
/// header names first (never `Idempotency-Key`, which is end to end), then
/// the fixed list (which includes `Connection`).
pub fn strip(headers: &mut HeaderMap) {
    // `close` and `keep-alive`, the usual values, name no other header: no
    // list is made for them.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|name| {
            !name.eq_ignore_ascii_case("close") && !name.eq_ignore_ascii_case("keep-alive")
        })
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .filter(|name| *name != IDEMPOTENCY_KEY)
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn strips_the_fixed_list_and_whatever_connection_names() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, X-Session-Hop"),
            ("connection", "x-other-hop"),
            ("keep-alive", "timeout=5"),
            ("x-session-hop", "1"),
            ("x-other-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic Zm9v"),
            ("idempotency-key", "\"k-1\""),
            ("authorization", "Bearer t"),
            ("content-length", "12"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "content-length", "idempotency-key"]);
    }

    #[test]
    fn connection_cannot_take_the_key_away() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("Idempotency-Key, x-hop"),
        );
        headers.insert("idempotency-key", HeaderValue::from_static("\"k-1\""));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        strip(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert_eq!(headers["idempotency-key"], "\"k-1\"");
    }
}
