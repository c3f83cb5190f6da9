//! Records: the filtered listing, one record in full, the in-flight claims
//! with their lease counting down, and the confirmation and result of an
//! eviction or a claim's end.

use std::sync::Arc;

use axum::extract::{Extension, Form, Query, State};
use idem::{AnyStore, OutboxStore, Record};
use maud::{Markup, html};
use serde::Deserialize;

use super::{PageResult, actor_field, csrf_field, done, page, time};
use crate::Shared;
use crate::access::{Caller, encode};
use crate::actions::{self, RecordChange, RecordVerb};
use crate::read::{self, RecordQuery};
use crate::view::{DETAIL_BODY, LeaseState, RecordView};

fn now(store: &AnyStore) -> idem::Timestamp {
    store.outbox_clock().now()
}

/// The link to one record.
pub(crate) fn record_href(scope: &str, key: &str) -> String {
    format!("/records/show?scope={}&key={}", encode(scope), encode(key))
}

/// The lease of a record, counting down in the browser while it runs.
pub(crate) fn lease(record: &RecordView) -> Markup {
    match (record.lease, record.lease_until_ms) {
        (LeaseState::Alive | LeaseState::Expired, Some(_)) => html! {
            span data-lease-left-ms=[record.lease_remaining_ms] class=[(record.lease == LeaseState::Expired).then_some("lease-expired")] {
                @match record.lease_remaining_ms {
                    Some(left) if left > 0 => { (crate::view::span(left)) " left" }
                    Some(left) => { "ended " (crate::view::span(-left)) " ago: a retry takes it over" }
                    None => "",
                }
            }
        },
        (LeaseState::Released, _) => html! { "released: the next claim runs at once" },
        _ => html! { span.muted { "-" } },
    }
}

fn state(state: &str) -> Markup {
    html! { span class=(format!("state-{state}")) { (state) } }
}

/// A table of records.
pub(crate) fn table(records: &[RecordView], with_lease: bool) -> Markup {
    html! {
        table.records {
            thead { tr {
                th { "scope" } th { "key" } th { "state" } th.num { "token" } th { "created" }
                @if with_lease { th { "lease" } } @else { th { "expires" } th { "outcome" } }
            } }
            tbody {
                @for r in records {
                    tr {
                        td.mono { (r.scope) }
                        td.mono { a href=(record_href(&r.scope, &r.key)) { (r.key) } }
                        td { (state(&r.state)) }
                        td.num { (r.token) }
                        td { (time(r.created_at_ms)) }
                        @if with_lease {
                            td { (lease(r)) }
                        } @else {
                            td { (time(r.expires_at_ms)) }
                            td.mono { @if let Some(o) = &r.outcome { (o.body) } @else { span.muted { "-" } } }
                        }
                    }
                }
            }
        }
    }
}

pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<RecordQuery>,
) -> PageResult {
    let store = &shared.store;
    let found = read::records(store, &query, now(store)).await?;
    let chosen = query.state.as_deref().unwrap_or("");
    let next = found.next.as_ref().map(|next| {
        let mut later = query.clone();
        later.after_created_ms = Some(next.after_created_ms);
        later.after_scope = Some(next.after_scope.clone());
        later.after_key = Some(next.after_key.clone());
        format!(
            "/records?{}",
            serde_urlencoded::to_string(&later).unwrap_or_default()
        )
    });
    let content = html! {
        h1 { "Records" }
        form.filters method="get" action="/records" {
            label { "scope" input type="text" name="scope" value=[query.scope.as_deref()] placeholder="exactly, as stored"; }
            label { "state" select name="state" {
                option value="" selected[chosen.is_empty()] { "any" }
                @for s in ["in_flight", "completed", "failed"] {
                    option value=(s) selected[chosen == s] { (s) }
                }
            } }
            label { "key starts with" input type="text" name="key_prefix" id="key_prefix" value=[query.key_prefix.as_deref()]; }
            label { "per page" input type="number" name="limit" min="1" max="500" value=(query.limit.unwrap_or(read::DEFAULT_PAGE)); }
            button type="submit" { "find" }
        }
        @if found.records.is_empty() {
            p.muted { "No record matches." }
        } @else {
            p.muted { "Newest first." }
            (table(&found.records, false))
        }
        div.pager {
            @if query.after_key.is_some() { a href="/records" { "first page" } " " }
            @if let Some(next) = next { a.button href=(next) { "next page" } }
        }
    };
    Ok(page("Records", "/records", &caller, content))
}

#[derive(Debug, Deserialize)]
pub(crate) struct Which {
    scope: String,
    key: String,
}

fn fields(record: &RecordView) -> Markup {
    html! {
        dl.fields {
            dt { "scope" } dd.mono { (record.scope) }
            dt { "key" } dd.mono { (record.key) }
            dt { "state" } dd { (state(&record.state)) }
            dt { "token" } dd { (record.token) }
            dt { "lease" } dd { (lease(record)) }
            dt { "created" } dd { (time(record.created_at_ms)) }
            dt { "last change" } dd { (time(record.updated_at_ms)) }
            dt { "expires" } dd { (time(record.expires_at_ms)) " " span.muted { "(leaves the dedupe window)" } }
            dt { "fingerprint" } dd.mono { (record.fingerprint) }
        }
    }
}

pub(crate) async fn show(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(which): Query<Which>,
) -> PageResult {
    let store = &shared.store;
    let record = actions::stored(store, &which.scope, &which.key).await?;
    let view = RecordView::of(&record, now(store), DETAIL_BODY);
    let change = |verb: &str| {
        format!(
            "/records/{verb}?scope={}&key={}",
            encode(&view.scope),
            encode(&view.key)
        )
    };
    let content = html! {
        h1 { "Record " span.mono { (view.key) } }
        (fields(&view))
        h2 { "Stored outcome" }
        @match &view.outcome {
            None => p.muted { "None yet: the record is in flight." },
            Some(outcome) => {
                dl.fields {
                    dt { "kind" } dd { (outcome.kind) }
                    @for (name, value) in &outcome.meta { dt { (name) } dd.mono { (value) } }
                    dt { "body" } dd { (outcome.body_bytes) " bytes" @if outcome.truncated { ", the first " (DETAIL_BODY) " characters shown" } }
                }
                pre #body { (outcome.body) }
            }
        }
        @if caller.may_act() {
            h2 { "Actions" }
            p {
                a.button.danger href=(change("evict")) id="evict" { "evict this key…" }
                @if idem::is_held(&record) {
                    " "
                    a.button.danger href=(change("release")) id="release" { "end this claim…" }
                }
            }
        }
    };
    Ok(page(
        &format!("Record {}", view.key),
        "/records",
        &caller,
        content,
    ))
}

fn verb_of(path_verb: &str) -> RecordVerb {
    if path_verb == "release" {
        RecordVerb::Release
    } else {
        RecordVerb::Evict
    }
}

/// What an action on `record` will do, in words.
fn consequence(verb: RecordVerb, record: &Record) -> String {
    match verb {
        RecordVerb::Evict => {
            let mut text = format!(
                "The record of key {} in scope {} will be removed. The key's next use is a new key: its effect runs again. The record as it is now is kept in the audit log.",
                record.key, record.scope
            );
            if idem::is_held(record) {
                text.push_str(
                    " The claim's holder, if still running, has its completion refused (fenced).",
                );
            }
            text
        }
        RecordVerb::Release => format!(
            "The claim on key {} in scope {} will end: token {} is fenced (its holder's completion is refused) and the next claim runs at once with a greater token. The record as it is now is kept in the audit log.",
            record.key, record.scope, record.token
        ),
    }
}

/// The confirmation of an eviction or a claim's end.
pub(crate) async fn confirm(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    axum::extract::Path(verb): axum::extract::Path<String>,
    Query(which): Query<Which>,
) -> PageResult {
    let store = &shared.store;
    let verb = verb_of(&verb);
    let record = actions::stored(store, &which.scope, &which.key).await?;
    let view = RecordView::of(&record, now(store), DETAIL_BODY);
    let (title, action, button) = match verb {
        RecordVerb::Evict => ("Evict a key", "/records/evict", "evict it"),
        RecordVerb::Release => ("End a claim", "/records/release", "end the claim"),
    };
    let content = html! {
        h1 { (title) }
        (fields(&view))
        div.confirm {
            p #consequence { (consequence(verb, &record)) }
            @if caller.may_act() {
                form method="post" action=(action) {
                    (csrf_field(&caller))
                    input type="hidden" name="scope" value=(view.scope);
                    input type="hidden" name="key" value=(view.key);
                    input type="hidden" name="token" value=(view.token);
                    input type="hidden" name="updated_at_ms" value=(view.updated_at_ms);
                    p { (actor_field()) }
                    button.danger type="submit" id="confirm" { (button) }
                    " "
                    a href=(record_href(&view.scope, &view.key)) { "cancel" }
                }
            } @else {
                p.muted { "A read-only token cannot do this." }
            }
        }
    };
    Ok(page(title, "/records", &caller, content))
}

/// Evicts or ends the claim, once confirmed.
pub(crate) async fn change(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    axum::extract::Path(verb): axum::extract::Path<String>,
    Form(change): Form<RecordChange>,
) -> PageResult {
    let verb = verb_of(&verb);
    let actor = caller.actor(&change.actor)?;
    let entry = actions::change_record(&shared.store, verb, &change, &actor).await?;
    let title = match verb {
        RecordVerb::Evict => "Key evicted",
        RecordVerb::Release => "Claim ended",
    };
    Ok(done(
        &caller,
        title,
        html! {
            p {
                @match verb {
                    RecordVerb::Evict => { "Removed the record of key " },
                    RecordVerb::Release => { "Ended the claim on key " },
                }
                span.mono { (change.key) } " in scope " span.mono { (change.scope) } "."
            }
            p { "Audit entry " (entry.id) " by " (entry.actor) ". " a href="/audit" { "see the audit log" } }
        },
    ))
}

pub(crate) async fn in_flight(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> PageResult {
    let store = &shared.store;
    let claims = read::in_flight(store, now(store)).await?;
    let content = html! {
        h1 { "In flight" }
        h2 { "Lease running (" (claims.alive.len()) ")" }
        p.muted { "A holder is working on each; a retry meanwhile is answered 409 with Retry-After." }
        @if claims.alive.is_empty() { p.muted { "None." } } @else { (table(&claims.alive, true)) }
        h2 { "Lease ended, awaiting a takeover (" (claims.expired.len()) ")" }
        p.muted { "The holder stopped renewing; the next retry of each key takes it over with a greater token." }
        @if claims.expired.is_empty() { p.muted { "None." } } @else { (table(&claims.expired, true)) }
        @if !claims.released.is_empty() {
            h2 { "Released by their holder (" (claims.released.len()) ")" }
            (table(&claims.released, true))
        }
        @if claims.more { p.muted { "Only the newest " (read::IN_FLIGHT_READ) " claims are shown." } }
    };
    Ok(page("In flight", "/in-flight", &caller, content))
}
