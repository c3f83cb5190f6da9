//! The overview (figures and the last hour's charts), the outbox, the audit
//! log, and the live auditor's panel.

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
            p.muted #no-outbox { "The outbox is not available on this store: a Redis or DynamoDB store holds records, attempts and dead letters but no outbox, which lives in the SQL database of the service's transactions (SQLite or PostgreSQL)." }
        } @else {
            div.tiles {
                div.tile { div.figure #pending { (outbox.pending) } "pending" }
                div.tile { div.figure { (span(outbox.lag_ms)) } "lag (the oldest pending message's wait)" }
                div.tile { div.figure { (outbox.sent) } "sent, kept until the retention ends" }
            }
            @if let Some(oldest) = outbox.oldest_pending_ms { p.muted { "The oldest pending message was enqueued at " (time(oldest)) "." } }
            h2 { "Recent sends" }
            p.muted { "The last " (read::OUTBOX_RECENT) " messages the relay published, newest first (sent messages are kept until the relay's retention sweeps them)." }
            @if outbox.recent_sends.is_empty() { p.muted { "None kept." } } @else {
                table.sends #recent-sends {
                    thead { tr {
                        th.num { "id" } th { "destination" } th { "key" } th.num { "attempts" }
                        th { "enqueued" } th { "sent" } th { "waited" }
                    } }
                    tbody { @for m in &outbox.recent_sends { tr {
                        td.num { (m.id) }
                        td.mono { (m.destination.as_deref().unwrap_or("(the relay's default)")) }
                        td.mono { (m.key) }
                        td.num { (m.attempts) }
                        td { (time(m.created_at_ms)) }
                        td { (time(m.sent_at_ms)) }
                        td { (span(m.waited_ms)) }
                    } } }
                }
            }
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

/// The live auditor's panel, or how to run one.
pub(crate) async fn auditor(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> PageResult {
    let panel = shared.auditor.view(&shared.store);
    let content = html! {
        h1 { "Auditor" }
        @if let Some(config) = &panel.config {
            p.muted {
                "Every " (span(i64::try_from(config.interval_ms).unwrap_or(i64::MAX)))
                " this console reads the effect log past its cursor (" (config.batch) " rows per query, "
                (config.pause_ms) " ms apart) and the records of "
                span.mono { (config.scopes.join(", ")) }
                ", and reports what must never happen."
            }
            div.tiles {
                @for (kind, count) in &panel.findings_by_kind {
                    div.tile { div.figure id=(format!("count-{kind}")) { (count) } (kind.replace('_', " ")) }
                }
            }
            dl.fields {
                dt { "effects query" } dd.mono { (config.effects_query) }
                dt { "cursor column" } dd.mono { (config.cursor_column) }
                dt { "cursor" } dd #cursor { @if let Some(cursor) = panel.cursor { (cursor) } @else { "none read yet" } }
                dt { "last pass" } dd #last-pass { @if let Some(at) = panel.last_pass_ms { (time(at)) } @else { "none yet" } }
                dt { "caught up at" } dd { @if let Some(at) = panel.caught_up_ms { (time(at)) } @else { "not yet" } }
                dt { "passes" } dd { (panel.passes) " (" (panel.errors) " failed)" }
                dt { "read" } dd { (panel.rows_read) " effect rows, " (panel.records_read) " records, in " (panel.queries) " queries" }
                dt { "window, grace" } dd { (span(i64::try_from(config.window_ms).unwrap_or(i64::MAX))) ", " (span(i64::try_from(config.grace_ms).unwrap_or(i64::MAX))) }
            }
            @if let Some(error) = &panel.last_error { div.error #last-error { "The last pass failed: " (error) } }
            h2 { "Latest findings (newest first)" }
            @if panel.latest.is_empty() { p.muted #no-findings { "Nothing found." } } @else {
                table.findings {
                    thead { tr { th { "kind" } th { "scope" } th { "key" } th { "effect rows" } th { "record" } th { "found at" } th { "what" } } }
                    tbody { @for f in &panel.latest { tr {
                        td { (f.kind) }
                        td.mono { (f.scope.as_deref().unwrap_or("-")) }
                        td.mono { (f.key) }
                        td.mono { (f.effects.iter().map(|e| e.cursor.to_string()).collect::<Vec<_>>().join(", ")) }
                        td { @if let Some(r) = &f.record { (r.state) ", token " (r.token) } @else { "none" } }
                        td { (time(f.found_at_ms)) }
                        td { (f.text) }
                    } } }
                }
            }
        } @else if !panel.available {
            p #not-available {
                "The auditor is not available on this store: it reads the service's effect log with SQL on the store's database, and a Redis or DynamoDB store has no SQL. "
                "Run it against the SQLite or PostgreSQL database the service writes its effects to."
            }
        } @else {
            p #not-configured {
                "No auditor runs in this console. Start the console with the service's effect log to run one beside it:"
            }
            pre { "idem console --store URL \\\n  --audit-effects-query 'SELECT id, key, at_ms FROM payments_applied' \\\n  --audit-scope payments" }
            p.muted {
                "The query is the one " span.mono { "idem audit --effects-query" } " takes, run on the store's database; "
                span.mono { "--audit-cursor-column" } ", " span.mono { "--audit-batch" } ", " span.mono { "--audit-pause" } ", "
                span.mono { "--audit-interval" } ", " span.mono { "--audit-grace" } " and " span.mono { "--audit-window" }
                " bound its work as for " span.mono { "idem audit" } "."
            }
        }
    };
    Ok(page("Auditor", "/auditor", &caller, content))
}
