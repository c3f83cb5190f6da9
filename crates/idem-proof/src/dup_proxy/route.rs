//! A request's route for the report: its method and path, with the segments
//! that look like identifiers written `{id}`, so `/orders/42` and
//! `/orders/43` count as one route and the report stays one line per
//! endpoint.

use http::Method;

use idem_http::observe::looks_like_an_id;

/// `POST /orders/{id}/refunds` for `POST /orders/42/refunds?x=1`.
pub(crate) fn route_of(method: &Method, path: &str) -> String {
    let mut route = format!("{method} ");
    if path.is_empty() || path == "/" {
        route.push('/');
        return route;
    }
    for segment in path.split('/').skip(1) {
        route.push('/');
        route.push_str(if looks_like_an_id(segment) {
            "{id}"
        } else {
            segment
        });
    }
    route
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_become_placeholders_and_words_stay() {
        for (path, expected) in [
            ("/orders/42", "POST /orders/{id}"),
            ("/orders/42/refunds", "POST /orders/{id}/refunds"),
            (
                "/users/8e03978e-40d5-43e8-bc93-6894a57f9324/cards",
                "POST /users/{id}/cards",
            ),
            ("/blobs/5e1d0a9c3f2b7e6d", "POST /blobs/{id}"),
            ("/v2/orders", "POST /v2/orders"),
            ("/cafe", "POST /cafe"),
            ("/", "POST /"),
            ("/orders/", "POST /orders/"),
        ] {
            assert_eq!(route_of(&Method::POST, path), expected, "{path}");
        }
    }
}
