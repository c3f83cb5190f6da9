//! The overview (figures and the last hour's charts), the outbox, and the
//! audit log.

use std::sync::Arc;

use axum::extract::{Extension, State};
use idem::{AdminStore, OutboxStore};
use maud::html;

use super::{PageResult, page, time};
use crate::Shared;
use crate::access::Caller;
use crate::charts::chart;
use crate::read;
use crate::view::{AuditView, span};

pub(crate) async fn overview(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> PageResult {
    let store = &shared.store;
    let figures = read::overview(store, store.outbox_clock().now()).await?;
    let content = html! {
        h1 { "Overview" }
        div.tiles {
            div.tile { div.figure { (figures.records) } a href="/records" { "records" } div.muted { (figures.expired_records) " past the window" } }
            div.tile { div.figure { (figures.in_flight_alive) } a href="/in-flight" { "claims in flight" } }
            div.tile { div.figure { (figures.in_flight_expired) } a href="/in-flight" { "leases ended, awaiting a takeover" } }
            div.tile { div.figure { (figures.dead_letters_waiting) } a href="/dead-letters" { "dead letters waiting" }
                @if let Some(oldest) = figures.oldest_dead_letter_ms { div.muted { "oldest " (time(oldest)) } } }
            div.tile { div.figure { (figures.outbox.pending) } a href="/outbox" { "outbox messages pending" }
                div.muted { "lag " (span(figures.outbox.lag_ms)) } }
        }
        h2 { "The last hour" }
        div.charts { @for series in shared.charts.series() { (chart(&series)) } }
    };
    Ok(page("Overview", "/", &caller, content))
}

pub(crate) async fn outbox(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> PageResult {
    let store = &shared.store;
    let outbox = read::outbox(store, store.outbox_clock().now()).await?;
    let content = html! {
        h1 { "Outbox" }
        @if !outbox.available {
            p.muted { "This store keeps no outbox (Redis holds records only)." }
        } @else {
            div.tiles {
                div.tile { div.figure #pending { (outbox.pending) } "pending" }
                div.tile { div.figure { (span(outbox.lag_ms)) } "lag (the oldest pending message's wait)" }
                div.tile { div.figure { (outbox.sent) } "sent, kept until the retention ends" }
            }
            @if let Some(oldest) = outbox.oldest_pending_ms { p.muted { "The oldest pending message was enqueued at " (time(oldest)) "." } }
        }
        h2 { "Recent failures" }
        p.muted { "Messages the relay gave up on (dead letters from the relay), newest first." }
        @if outbox.recent_failures.is_empty() { p.muted { "None." } } @else { (super::letters::table(&outbox.recent_failures)) }
    };
    Ok(page("Outbox", "/outbox", &caller, content))
}

/// How many audit entries the page shows.
const AUDIT_SHOWN: usize = 200;

pub(crate) async fn audit(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> PageResult {
    let entries: Vec<AuditView> = shared
        .store
        .audit_log(AUDIT_SHOWN)
        .await?
        .iter()
        .map(AuditView::from)
        .collect();
    let content = html! {
        h1 { "Audit log" }
        p.muted { "What operators changed by hand, newest first, each with the record or letter as it was." }
        @if entries.is_empty() { p.muted { "Nothing yet." } } @else {
            table.audit {
                thead { tr { th.num { "#" } th { "when" } th { "who" } th { "action" } th { "scope" } th { "key" } th { "before" } } }
                tbody {
                    @for e in &entries {
                        tr {
                            td.num { (e.id) }
                            td { (time(e.at_ms)) }
                            td { (e.actor) }
                            td { (e.action) }
                            td.mono { @if let Some(scope) = &e.scope { (scope) } @else if let Some(id) = e.dead_letter { "dead letter " (id) } }
                            td.mono { (e.key) }
                            td { details { summary { "as it was" } pre { (e.before) } } }
                        }
                    }
                }
            }
        }
    };
    Ok(page("Audit log", "/audit", &caller, content))
}
