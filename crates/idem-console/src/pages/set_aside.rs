//! Discarding and archiving dead letters: one letter, or the waiting letters
//! a filter (or a cause group) chooses, each asked first on a page that says
//! what will happen, and each letter set aside logged in the audit log with
//! who did it.

use std::sync::Arc;

use axum::extract::{Extension, Form, Path, Query, State};
use idem::DeadLetterStore;
use maud::{Markup, html};
use serde::Deserialize;

use super::letters::{now, table};
use super::{PageError, PageResult, actor_field, csrf_field, done, page};
use crate::Shared;
use crate::access::Caller;
use crate::actions::{self, LetterFilter, SetAside, SetAsidePlan, SetAsideReport};
use crate::problem::Problem;
use crate::view::{LIST_TEXT, LetterView};

/// The most letters a confirmation lists.
const SHOWN: usize = 500;

fn action_of(verb: &str) -> Result<SetAside, PageError> {
    match verb {
        "discard" => Ok(SetAside::Discard),
        "archive" => Ok(SetAside::Archive),
        _ => Err(Problem::not_found(format!(
            "no action {verb:?} on a dead letter: redrive, discard or archive"
        ))
        .into()),
    }
}

fn title(action: SetAside) -> &'static str {
    match action {
        SetAside::Discard => "Discard",
        SetAside::Archive => "Archive",
    }
}

/// The words of a confirmation: how many letters, and what happens to them.
fn consequence(action: SetAside, letters: usize) -> Markup {
    html! {
        p #consequence {
            (letters) " letter" @if letters != 1 { "s" } " will be " (action.done()) ": "
            (action.effect()) "."
        }
    }
}

/// The confirmation of a discard or archive of one letter.
pub(crate) async fn confirm_one(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path((id, verb)): Path<(i64, String)>,
) -> PageResult {
    let action = action_of(&verb)?;
    let letter = shared
        .store
        .get_dead_letter(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no dead letter with id {id}")))?;
    let view = LetterView::of(&letter, LIST_TEXT);
    let archived = action == SetAside::Archive && letter.archived_at.is_some();
    let content = html! {
        h1 { (title(action)) " dead letter " (id) }
        (table(std::slice::from_ref(&view)))
        div.confirm {
            @if archived {
                p #consequence { "It was archived already; there is nothing to do." }
            } @else {
                (consequence(action, 1))
                @if caller.may_act() {
                    form method="post" action=(format!("/dead-letters/{id}/{}", action.as_str())) {
                        (csrf_field(&caller))
                        p { (actor_field()) }
                        button.danger type="submit" id="confirm" { (action.as_str()) " it" }
                        " " a href=(format!("/dead-letters/{id}")) { "cancel" }
                    }
                } @else {
                    p.muted { "A read-only token cannot do this." }
                }
            }
        }
    };
    Ok(page(title(action), "/dead-letters", &caller, content))
}

/// Who acts, as the form sends it.
#[derive(Debug, Deserialize)]
pub(crate) struct ActorForm {
    actor: String,
}

/// Discards or archives one letter, once confirmed.
pub(crate) async fn set_aside_one(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path((id, verb)): Path<(i64, String)>,
    Form(form): Form<ActorForm>,
) -> PageResult {
    let action = action_of(&verb)?;
    let actor = caller.actor(&form.actor)?;
    let entry = actions::set_aside_one(&shared.store, action, id, &actor).await?;
    Ok(done(
        &caller,
        &format!("Dead letter {}", action.done()),
        html! {
            p #set-aside { "Dead letter " (id) " " (action.done()) "." }
            p { "Audit entry " (entry.id) " by " (entry.actor) ". " a href="/audit" { "see the audit log" } }
            p { a href="/dead-letters" { "back to the dead letters" } }
        },
    ))
}

/// The confirmation of a discard or archive of the waiting letters `filter`
/// chooses.
async fn confirm_set(
    shared: &Shared,
    caller: &Caller,
    action: SetAside,
    filter: &LetterFilter,
) -> PageResult {
    let store = &shared.store;
    let letters = actions::letters(store, filter, now(store)).await?;
    let plan = SetAsidePlan::of(action, &letters);
    let shown: Vec<LetterView> = letters
        .iter()
        .filter(|l| l.is_waiting())
        .take(SHOWN)
        .map(|l| LetterView::of(l, LIST_TEXT))
        .collect();
    let content = html! {
        h1 { (title(action)) " dead letters" }
        p.muted { "Chosen by: " @if filter.is_empty() { "every waiting letter" } @else { span.mono { (filter.query()) } } }
        div.confirm {
            (consequence(action, plan.letters))
            @if plan.letters > 0 && caller.may_act() {
                form method="post" action=(format!("/dead-letters/{}", action.as_str())) {
                    (csrf_field(caller))
                    @for id in &plan.ids { input type="hidden" name="id" value=(id); }
                    p { (actor_field()) }
                    button.danger type="submit" id="confirm" { (action.as_str()) " " (plan.letters) }
                    " " a href=(format!("/dead-letters?{}", filter.query())) { "cancel" }
                }
            } @else if !caller.may_act() {
                p.muted { "A read-only token cannot do this." }
            }
        }
        @if !shown.is_empty() { (table(&shown)) }
        @if plan.letters > SHOWN { p.muted { "The first " (SHOWN) " are shown." } }
    };
    Ok(page(title(action), "/dead-letters", caller, content))
}

/// Discards or archives exactly the letters the confirmation listed (those
/// still waiting).
async fn set_aside_set(
    shared: &Shared,
    caller: &Caller,
    action: SetAside,
    fields: &[(String, String)],
) -> PageResult {
    let mut ids = Vec::new();
    let mut actor = "";
    for (name, value) in fields {
        match name.as_str() {
            "id" => ids.push(value.parse::<i64>().map_err(|_| {
                Problem::bad_request(format!("letter id {value:?} is not a number"))
            })?),
            "actor" => actor = value.as_str(),
            _ => {}
        }
    }
    let actor = caller.actor(actor)?;
    let report = actions::set_aside(&shared.store, action, &ids, &actor).await?;
    Ok(report_page(caller, &report))
}

fn report_page(caller: &Caller, report: &SetAsideReport) -> axum::response::Response {
    let action = report.action;
    done(
        caller,
        &format!("{} done", title(action)),
        html! {
            p #set-aside { (report.done.len()) " " (action.done()) ", " (report.skipped.len()) " left as they were." }
            @if !report.skipped.is_empty() {
                ul { @for s in &report.skipped { li { "letter " (s.id) ": " (s.reason) } } }
            }
            @if let (Some(first), Some(last)) = (report.done.first(), report.done.last()) {
                p { "Audit entries " (first.id) " to " (last.id) " by " (first.actor) ". " a href="/audit" { "see the audit log" } }
            }
            p { a href="/dead-letters" { "back to the dead letters" } }
        },
    )
}

pub(crate) async fn confirm_discard_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(filter): Query<LetterFilter>,
) -> PageResult {
    confirm_set(&shared, &caller, SetAside::Discard, &filter).await
}

pub(crate) async fn confirm_archive_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(filter): Query<LetterFilter>,
) -> PageResult {
    confirm_set(&shared, &caller, SetAside::Archive, &filter).await
}

pub(crate) async fn discard_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Form(fields): Form<Vec<(String, String)>>,
) -> PageResult {
    set_aside_set(&shared, &caller, SetAside::Discard, &fields).await
}

pub(crate) async fn archive_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Form(fields): Form<Vec<(String, String)>>,
) -> PageResult {
    set_aside_set(&shared, &caller, SetAside::Archive, &fields).await
}
