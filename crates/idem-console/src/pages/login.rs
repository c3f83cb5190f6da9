//! Signing in and out: a browser shows its token once, and keeps it in an
//! `HttpOnly`, `SameSite=Strict` cookie for the console's own requests.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::layout;
use crate::Shared;
use crate::access::TOKEN_COOKIE;

#[derive(Debug, Deserialize)]
pub(crate) struct Next {
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct SignIn {
    token: String,
    next: Option<String>,
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

fn form(next: &str, refused: bool) -> Response {
    let content = html! {
        h1 { "Sign in" }
        @if refused {
            div.error { "That is not one of this console's tokens." }
        }
        p.muted { "This console needs a token: the operator token to act, or the read-only token to look." }
        form method="post" action="/login" {
            input type="hidden" name="next" value=(next);
            label { "token " input type="password" name="token" required autocomplete="current-password" id="token"; }
            " "
            button type="submit" { "sign in" }
        }
    };
    Html(layout("Sign in", "", None, content).into_string()).into_response()
}

pub(crate) async fn show(Query(query): Query<Next>) -> Response {
    form(local(query.next.as_deref()), false)
}

pub(crate) async fn sign_in(
    State(shared): State<Arc<Shared>>,
    Form(given): Form<SignIn>,
) -> Response {
    let next = local(given.next.as_deref()).to_owned();
    let token = given.token.trim();
    if !shared.access.knows(token) {
        return (axum::http::StatusCode::UNAUTHORIZED, form(&next, true)).into_response();
    }
    let mut response = Redirect::to(&next).into_response();
    if let Ok(cookie) = HeaderValue::from_str(&format!(
        "{TOKEN_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        crate::access::encode(token)
    )) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

pub(crate) async fn sign_out() -> Response {
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "idem_console_token=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}
