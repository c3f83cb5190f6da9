//! Dead letters: the filtered listing with its groups by cause, one letter
//! in full, and the redrive of one letter or of a filtered set, each asked
//! first on a page that says how many letters go where. Discard and archive
//! are in [`super::set_aside`].

use std::sync::Arc;

use axum::extract::{Extension, Form, Path, Query, State};
use idem::{AnyStore, DeadLetterStore, OutboxStore};
use idem_broker::dead_letter::group_by_cause;
use maud::{Markup, html};

use super::{PageResult, csrf_field, done, page, time};
use crate::Shared;
use crate::access::Caller;
use crate::actions::{self, LetterFilter, RedrivePlan, RedriveReport};
use crate::problem::Problem;
use crate::view::{DETAIL_BODY, GroupView, LIST_TEXT, LetterView, shorten};

pub(crate) fn now(store: &AnyStore) -> idem::Timestamp {
    store.outbox_clock().now()
}

/// A filter's query string with `cause` set to `cause`.
fn with_cause(filter: &LetterFilter, cause: &str) -> String {
    let mut narrowed = filter.clone();
    narrowed.cause = Some(cause.to_owned());
    narrowed.query()
}

/// A table of letters.
pub(crate) fn table(letters: &[LetterView]) -> Markup {
    html! {
        table.letters {
            thead { tr {
                th.num { "id" } th { "origin" } th { "key" } th { "destination" } th.num { "attempts" }
                th { "dead at" } th { "state" } th { "last error" }
            } }
            tbody {
                @for l in letters {
                    tr {
                        td.num { a href=(format!("/dead-letters/{}", l.id)) { (l.id) } }
                        td { (l.origin) }
                        td.mono { (l.key) }
                        td.mono { (l.destination) }
                        td.num { (l.attempts) }
                        td { (time(l.dead_at_ms)) }
                        td { (letter_state(l)) }
                        td { (shorten(&l.last_error, LIST_TEXT)) }
                    }
                }
            }
        }
    }
}

fn letter_state(letter: &LetterView) -> Markup {
    html! {
        @if let Some(at) = letter.archived_at_ms { "archived " (time(at)) }
        @else if let Some(at) = letter.redriven_at_ms { "redriven " (time(at)) }
        @else { "waiting" }
    }
}

/// The most letters the listing shows.
const SHOWN: usize = 500;

pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(filter): Query<LetterFilter>,
) -> PageResult {
    let store = &shared.store;
    let letters = actions::letters(store, &filter, now(store)).await?;
    let groups: Vec<GroupView> = group_by_cause(&letters)
        .iter()
        .map(GroupView::from)
        .collect();
    let stats = store.dead_letter_stats().await?;
    let shown: Vec<LetterView> = letters
        .iter()
        .take(SHOWN)
        .map(|l| LetterView::of(l, LIST_TEXT))
        .collect();
    let waiting = letters.iter().filter(|l| l.is_waiting()).count();
    let content = html! {
        h1 { "Dead letters" }
        p.muted {
            (stats.waiting) " waiting, " (stats.redriven) " redriven, " (stats.archived) " archived"
            @if let Some(oldest) = stats.oldest_waiting { "; the oldest waiting died at " (time(oldest.0)) }
        }
        form.filters method="get" action="/dead-letters" {
            label { "origin" input type="text" name="origin" value=[filter.origin.as_deref()]; }
            label { "error contains" input type="text" name="error" id="error" value=[filter.error.as_deref()]; }
            label { "cause" input type="text" name="cause" value=[filter.cause.as_deref()]; }
            label { "dead at least (s)" input type="number" min="0" name="min_age_s" value=[filter.min_age_s]; }
            label { "dead at most (s)" input type="number" min="0" name="max_age_s" value=[filter.max_age_s]; }
            label { "redriven and archived too" input type="checkbox" name="all" value="true" checked[filter.all == Some(true)]; }
            button type="submit" { "filter" }
        }
        h2 { "By failure" }
        @if groups.is_empty() { p.muted { "No dead letter matches." } } @else {
            table.groups {
                thead { tr { th { "cause (first line of the last error)" } th.num { "letters" } th.num { "waiting" } th { "origins" } th { "oldest" } th { "newest" } th {} } }
                tbody {
                    @for g in &groups {
                        tr {
                            td { a href=(format!("/dead-letters?{}", with_cause(&filter, &g.cause))) { (g.cause) } }
                            td.num { (g.letters) }
                            td.num { (g.waiting) }
                            td { (g.origins.join(", ")) }
                            td { (time(g.oldest_dead_at_ms)) }
                            td { (time(g.newest_dead_at_ms)) }
                            td { @if caller.may_act() && g.waiting > 0 {
                                @let chosen = with_cause(&filter, &g.cause);
                                a.button href=(format!("/dead-letters/redrive?{chosen}")) { "redrive " (g.waiting) "…" }
                                " " a.button href=(format!("/dead-letters/archive?{chosen}")) { "archive…" }
                                " " a.button.danger href=(format!("/dead-letters/discard?{chosen}")) { "discard…" }
                            } }
                        }
                    }
                }
            }
        }
        h2 { "Letters (" (letters.len()) ", oldest first)" }
        @if caller.may_act() && waiting > 0 {
            p {
                a.button href=(format!("/dead-letters/redrive?{}", filter.query())) id="redrive-set" { "redrive these " (waiting) " waiting letters…" }
                " " a.button href=(format!("/dead-letters/archive?{}", filter.query())) id="archive-set" { "archive them…" }
                " " a.button.danger href=(format!("/dead-letters/discard?{}", filter.query())) id="discard-set" { "discard them…" }
            }
        }
        @if !shown.is_empty() { (table(&shown)) }
        @if letters.len() > SHOWN { p.muted { "The first " (SHOWN) " are shown; narrow the filter for the rest." } }
    };
    Ok(page("Dead letters", "/dead-letters", &caller, content))
}

pub(crate) async fn show(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> PageResult {
    let letter = shared
        .store
        .get_dead_letter(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no dead letter with id {id}")))?;
    let view = LetterView::of(&letter, DETAIL_BODY);
    let content = html! {
        h1 { "Dead letter " (view.id) }
        dl.fields {
            dt { "origin" } dd { (view.origin) }
            dt { "key" } dd.mono { (view.key) }
            dt { "destination" } dd.mono { (view.destination) }
            dt { "attempts" } dd { (view.attempts) }
            dt { "first seen" } dd { (time(view.first_seen_at_ms)) }
            dt { "dead at" } dd { (time(view.dead_at_ms)) }
            dt { "state" } dd #state { (letter_state(&view)) }
            @for (name, value) in &view.headers { dt { "header " (name) } dd.mono { (value) } }
        }
        h2 { "Last error" }
        pre #last-error { (view.last_error) }
        h2 { "Payload (" (view.payload_bytes) " bytes" @if view.truncated { ", the first " (DETAIL_BODY) " characters shown" } ")" }
        pre #payload { (view.payload) }
        @if caller.may_act() {
            h2 { "Actions" }
            p {
                a.button href=(format!("/dead-letters/{id}/redrive")) id="redrive" { "redrive…" }
                @if letter.archived_at.is_none() {
                    " " a.button href=(format!("/dead-letters/{id}/archive")) id="archive" { "archive…" }
                }
                " " a.button.danger href=(format!("/dead-letters/{id}/discard")) id="discard" { "discard…" }
            }
        }
    };
    Ok(page(
        &format!("Dead letter {id}"),
        "/dead-letters",
        &caller,
        content,
    ))
}

fn plan_text(plan: &RedrivePlan) -> Markup {
    html! {
        p #consequence {
            (plan.letters) " letter" @if plan.letters != 1 { "s" } " will be published again to "
            @if plan.destinations.is_empty() { "-" } @else { span.mono { (plan.destinations.join(", ")) } }
            ": " (plan.effect) "."
        }
    }
}

pub(crate) async fn confirm_one(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> PageResult {
    let letter = shared
        .store
        .get_dead_letter(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no dead letter with id {id}")))?;
    let view = LetterView::of(&letter, LIST_TEXT);
    let mut plan = RedrivePlan::of(std::slice::from_ref(&letter));
    if !letter.is_waiting() {
        // The operator may publish a letter again on purpose.
        plan = RedrivePlan {
            letters: 1,
            ids: vec![id],
            destinations: vec![view.destination.clone()],
            ..plan
        };
    }
    let content = html! {
        h1 { "Redrive dead letter " (id) }
        (table(std::slice::from_ref(&view)))
        div.confirm {
            (plan_text(&plan))
            @if !letter.is_waiting() { p { strong { "It was redriven or archived already;" } " it will be published again all the same." } }
            form method="post" action=(format!("/dead-letters/{id}/redrive")) {
                (csrf_field(&caller))
                button type="submit" id="confirm" { "redrive it" }
                " " a href=(format!("/dead-letters/{id}")) { "cancel" }
            }
        }
    };
    Ok(page("Redrive", "/dead-letters", &caller, content))
}

fn report(caller: &Caller, report: &RedriveReport) -> axum::response::Response {
    done(
        caller,
        "Redrive done",
        html! {
            p #redriven { (report.redriven.len()) " redriven, " (report.failed.len()) " failed." }
            @if !report.failed.is_empty() {
                ul { @for f in &report.failed { li { "letter " (f.id) ": " (f.error) " (it stays waiting)" } } }
            }
            p { a href="/dead-letters" { "back to the dead letters" } }
        },
    )
}

pub(crate) async fn redrive_one(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> PageResult {
    let done = actions::redrive_one(&shared.store, id).await?;
    Ok(report(&caller, &done))
}

pub(crate) async fn confirm_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(filter): Query<LetterFilter>,
) -> PageResult {
    let store = &shared.store;
    let letters = actions::letters(store, &filter, now(store)).await?;
    let plan = RedrivePlan::of(&letters);
    let shown: Vec<LetterView> = letters
        .iter()
        .filter(|l| l.is_waiting())
        .take(SHOWN)
        .map(|l| LetterView::of(l, LIST_TEXT))
        .collect();
    let content = html! {
        h1 { "Redrive dead letters" }
        p.muted { "Chosen by: " @if filter.is_empty() { "every waiting letter" } @else { span.mono { (filter.query()) } } }
        div.confirm {
            (plan_text(&plan))
            @if plan.letters > 0 {
                form method="post" action="/dead-letters/redrive" {
                    (csrf_field(&caller))
                    @for id in &plan.ids { input type="hidden" name="id" value=(id); }
                    button type="submit" id="confirm" { "redrive " (plan.letters) }
                    " " a href=(format!("/dead-letters?{}", filter.query())) { "cancel" }
                }
            }
        }
        @if !shown.is_empty() { (table(&shown)) }
    };
    Ok(page("Redrive", "/dead-letters", &caller, content))
}

/// Redrives exactly the letters the confirmation listed (those still waiting).
pub(crate) async fn redrive_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Form(fields): Form<Vec<(String, String)>>,
) -> PageResult {
    let store = &shared.store;
    let mut letters = Vec::new();
    for (_, id) in fields.iter().filter(|(name, _)| name == "id") {
        let id: i64 = id
            .parse()
            .map_err(|_| Problem::bad_request(format!("letter id {id:?} is not a number")))?;
        if let Some(letter) = store.get_dead_letter(id).await?
            && letter.is_waiting()
        {
            letters.push(letter);
        }
    }
    let done = actions::redrive(store, &letters).await;
    Ok(report(&caller, &done))
}
