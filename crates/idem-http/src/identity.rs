//! What a keyed request is, for the store: its scope (who applies the key, and
//! where) and its fingerprint (what it asked for).
//!
//! The **scope** is `http:{principal}:{METHOD}:{route}`. The principal is a
//! BLAKE3 hash of the configured credential header (`Authorization` by
//! default), so the credential itself is never stored, and one client can
//! never be replayed another client's response: the same key sent by two
//! principals lives in two scopes. The route is axum's [`MatchedPath`] (the
//! route template, `/accounts/{id}`) when the layer runs inside a router, else
//! the URI path. A scope longer than the store allows (255 characters) keeps a
//! hash of the route instead of the route.
//!
//! The **fingerprint** covers the method, the route, the request target (path
//! and query, so `/accounts/1` and `/accounts/2` under one template are
//! different payloads) and what the [`FingerprintRule`] covers of the body and
//! headers: by default the whole body, in its RFC 8785 canonical form when it
//! is JSON (so key order and spacing do not turn a retry into key reuse), the
//! raw bytes otherwise. A rule other than the default seals the fingerprint
//! with its id.

use axum::extract::MatchedPath;
use http::request::Parts;
use http::{HeaderMap, HeaderName, Method};
use idem_core::{Fingerprint, FingerprintRule, Scope};

/// The principal part of a scope for requests without the credential header.
const ANONYMOUS: &str = "anon";

/// The route a request is scoped to: the matched route template, else the path.
pub(crate) fn route_of(parts_uri: &http::Uri, extensions: &http::Extensions) -> String {
    match extensions.get::<MatchedPath>() {
        Some(matched) => matched.as_str().to_owned(),
        None => parts_uri.path().to_owned(),
    }
}

/// A short, one-way name for whoever sent `header`: 32 hex characters of a
/// domain-separated BLAKE3 hash of every value of the header, or `anon`.
pub fn principal_of(headers: &HeaderMap, header: Option<&HeaderName>) -> String {
    let Some(header) = header else {
        return ANONYMOUS.to_owned();
    };
    let mut values = headers.get_all(header).iter().peekable();
    if values.peek().is_none() {
        return ANONYMOUS.to_owned();
    }
    let mut hasher = blake3::Hasher::new_derive_key("idem-http 2025 principal of a request");
    for value in values {
        hasher.update(&(value.len() as u64).to_le_bytes());
        hasher.update(value.as_bytes());
    }
    hasher.finalize().to_hex()[..32].to_owned()
}

/// `http:{principal}:{METHOD}:{route}`, with the route hashed if the scope would
/// otherwise break the scope rules (too long, or not visible ASCII).
pub(crate) fn scope_of(principal: &str, method: &Method, route: &str) -> Scope {
    Scope::new(format!("http:{principal}:{method}:{route}")).unwrap_or_else(|_| {
        let hashed = &blake3::hash(route.as_bytes()).to_hex()[..32];
        Scope::new(format!("http:{principal}:{method}:#{hashed}"))
            .expect("principal, method and a hex hash make a valid scope")
    })
}

/// The fingerprint of a request: method, route, target, and what `rule`
/// covers of the body and headers.
pub(crate) fn fingerprint_of(
    rule: &FingerprintRule,
    method: &Method,
    route: &str,
    parts: &Parts,
    body: &[u8],
) -> Fingerprint {
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let covered = rule.digest(body, |name| {
        parts
            .headers
            .get_all(name)
            .iter()
            .map(|value| value.as_bytes().to_vec())
            .collect()
    });
    rule.seal(Fingerprint::of_parts([
        method.as_str().as_bytes(),
        route.as_bytes(),
        target.as_bytes(),
        covered.as_bytes(),
    ]))
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, Request, header::AUTHORIZATION};

    use super::*;

    fn parts(uri: &str) -> Parts {
        Request::post(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn principals_are_hashed_and_never_raw() {
        let mut headers = HeaderMap::new();
        assert_eq!(principal_of(&headers, Some(&AUTHORIZATION)), "anon");
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Bearer secret-token"),
        );
        let alice = principal_of(&headers, Some(&AUTHORIZATION));
        assert_eq!(alice.len(), 32);
        assert!(!alice.contains("secret"));
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Bearer other-token"),
        );
        assert_ne!(principal_of(&headers, Some(&AUTHORIZATION)), alice);
        assert_eq!(principal_of(&headers, None), "anon");
    }

    #[test]
    fn scopes_hold_principal_method_and_route_and_stay_valid() {
        let scope = scope_of("anon", &Method::POST, "/payments");
        assert_eq!(scope.as_str(), "http:anon:POST:/payments");
        let long = format!("/{}", "x".repeat(300));
        let hashed = scope_of("anon", &Method::POST, &long);
        assert!(hashed.as_str().starts_with("http:anon:POST:#"));
        assert_ne!(hashed, scope_of("anon", &Method::POST, &format!("{long}y")));
        let odd = scope_of("anon", &Method::PATCH, "/café");
        assert!(odd.as_str().starts_with("http:anon:PATCH:#"));
    }

    #[test]
    fn fingerprints_see_target_and_canonical_json() {
        let a = fingerprint_of(
            &FingerprintRule::default(),
            &Method::POST,
            "/a/{id}",
            &parts("/a/1"),
            br#"{"x":1,"y":2}"#,
        );
        let same = fingerprint_of(
            &FingerprintRule::default(),
            &Method::POST,
            "/a/{id}",
            &parts("/a/1"),
            br#"{ "y":2, "x":1 }"#,
        );
        let other_target = fingerprint_of(
            &FingerprintRule::default(),
            &Method::POST,
            "/a/{id}",
            &parts("/a/2"),
            br#"{"x":1,"y":2}"#,
        );
        let other_query = fingerprint_of(
            &FingerprintRule::default(),
            &Method::POST,
            "/a/{id}",
            &parts("/a/1?v=2"),
            br#"{"x":1,"y":2}"#,
        );
        let other_body = fingerprint_of(
            &FingerprintRule::default(),
            &Method::POST,
            "/a/{id}",
            &parts("/a/1"),
            br#"{"x":1,"y":3}"#,
        );
        assert_eq!(a, same);
        assert_eq!(a.rule_id(), None);
        assert_ne!(a, other_target);
        assert_ne!(a, other_query);
        assert_ne!(a, other_body);
        assert_ne!(
            a,
            fingerprint_of(
                &FingerprintRule::default(),
                &Method::PATCH,
                "/a/{id}",
                &parts("/a/1"),
                br#"{"x":1,"y":2}"#
            )
        );
    }

    #[test]
    fn a_rule_sees_its_fields_and_headers_and_seals_the_fingerprint() {
        let rule = FingerprintRule::default()
            .ignore("json:/sent_at")
            .unwrap()
            .header("x-tenant")
            .unwrap();
        let with = |tenant: &'static str| {
            let mut parts = parts("/p");
            parts
                .headers
                .insert("x-tenant", HeaderValue::from_static(tenant));
            parts
        };
        let of =
            |parts: &Parts, body: &[u8]| fingerprint_of(&rule, &Method::POST, "/p", parts, body);
        let a = of(&with("t1"), br#"{"amount":1,"sent_at":1}"#);
        assert_eq!(a.rule_id(), rule.id());
        assert_eq!(a, of(&with("t1"), br#"{"amount":1,"sent_at":2}"#));
        assert_ne!(a, of(&with("t2"), br#"{"amount":1,"sent_at":1}"#));
        assert_ne!(a, of(&parts("/p"), br#"{"amount":1,"sent_at":1}"#));
        assert_ne!(a, of(&with("t1"), br#"{"amount":2,"sent_at":1}"#));
    }
}
