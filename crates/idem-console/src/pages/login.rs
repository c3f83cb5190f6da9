//! Signing in and out. A browser shows its token once, on a form that
//! carries its CSRF token; a good token opens a session whose random id the
//! browser keeps in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over
//! TLS). Wrong tokens are slowed down ([`crate::throttle`]); signing out ends
//! the session on the server, not only in the browser.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::layout;
use crate::Shared;
use crate::access::{
    FORM_LIMIT, SESSION_COOKIE, cookie, csrf_matches, csrf_of, peer_of, same_origin, set_cookie,
    too_many,
};

#[derive(Debug, Deserialize)]
pub(crate) struct Next {
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SignIn {
    token: String,
    next: Option<String>,
    csrf: Option<String>,
}

/// Where to go after signing in: a path of this console only.
fn local(next: Option<&str>) -> &str {
    match next {
        Some(path) if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') => {
            path
        }
        _ => "/",
    }
}

/// What the form says above its field.
enum Said {
    Nothing,
    Refused,
    Expired,
}

fn form(next: &str, csrf: &str, said: Said) -> Html<String> {
    let content = html! {
        h1 { "Sign in" }
        @match said {
            Said::Nothing => {},
            Said::Refused => div.error { "That is not one of this console's tokens." },
            Said::Expired => div.error {
                "This form has expired or was not sent from this browser's sign-in page; sign in again here."
            },
        }
        p.muted { "This console needs a token: the operator token to act, or the read-only token to look." }
        form method="post" action="/login" {
            input type="hidden" name="next" value=(next);
            input type="hidden" name="csrf" value=(csrf);
            label { "token " input type="password" name="token" required autocomplete="current-password" id="token"; }
            " "
            button type="submit" { "sign in" }
        }
    };
    Html(layout("Sign in", "", None, content).into_string())
}

/// `response` with `cookie` set, when there is one.
fn with_cookie(mut response: Response, cookie: Option<HeaderValue>) -> Response {
    if let Some(cookie) = cookie {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

pub(crate) async fn show(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<Next>,
) -> Response {
    let next = local(query.next.as_deref());
    if !shared.access.needs_token() {
        return Redirect::to(next).into_response();
    }
    let (csrf, set_csrf) = csrf_of(&shared, &headers);
    with_cookie(form(next, &csrf, Said::Nothing).into_response(), set_csrf)
}

pub(crate) async fn sign_in(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    if !shared.access.needs_token() {
        return Redirect::to("/").into_response();
    }
    let peer = peer_of(&request);
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    if !same_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "refused: the sign-in comes from a page of another site (its Origin is not this console)\n",
        )
            .into_response();
    }
    let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the sign-in form is larger than it can be (64 KiB)\n",
        )
            .into_response();
    };
    let Ok(given) = serde_urlencoded::from_bytes::<SignIn>(&bytes) else {
        return (
            StatusCode::BAD_REQUEST,
            "the sign-in form needs its token field\n",
        )
            .into_response();
    };
    let next = local(given.next.as_deref()).to_owned();
    let (csrf, set_csrf) = csrf_of(&shared, &headers);
    if !csrf_matches(&headers, given.csrf.as_deref()) {
        let page = (StatusCode::FORBIDDEN, form(&next, &csrf, Said::Expired)).into_response();
        return with_cookie(page, set_csrf);
    }
    let now = shared.clock.now();
    if let Some(wait) = shared.throttle.wait(peer, now) {
        return too_many(false, wait);
    }
    let Some(role) = shared.access.role_of(given.token.trim()) else {
        shared.throttle.failed(peer, now);
        let page = (StatusCode::UNAUTHORIZED, form(&next, &csrf, Said::Refused)).into_response();
        return with_cookie(page, set_csrf);
    };
    let id = shared.sessions.open(role, now);
    let lasts = shared.sessions.limits().absolute.as_secs();
    with_cookie(
        Redirect::to(&next).into_response(),
        set_cookie(&shared, SESSION_COOKIE, &id, Some(lasts)),
    )
}

pub(crate) async fn sign_out(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        shared.sessions.close(id);
    }
    with_cookie(
        Redirect::to("/login").into_response(),
        set_cookie(&shared, SESSION_COOKIE, "", Some(0)),
    )
}
