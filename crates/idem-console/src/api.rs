//! The JSON API under `/api/v1`, and its OpenAPI document
//! (`/api/v1/openapi.json`), derived from the handlers and types below so
//! the two cannot drift apart. Errors are problem documents
//! ([`Problem`]); actions are POSTs that take JSON.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, FromRequest, Path, Query, Request, State};
use axum::routing::{get, post};
use axum::{Router, middleware};
use idem::{AdminStore, AnyStore, DeadLetterStore, OutboxStore};
use idem_broker::dead_letter::group_by_cause;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use crate::Shared;
use crate::access::Caller;
use crate::actions::{
    self, LetterFilter, RecordChange, RecordVerb, RedriveFailure, RedrivePlan, RedriveReport,
    SetAside, SetAsidePlan, SetAsideReport, SetAsideSkip,
};
use crate::auditor::{AuditorConfig, AuditorView, EffectRowView, FindingView, RecordSeenView};
use crate::charts::{Point, Series};
use crate::problem::{self, Problem};
use crate::read::{self, InFlight, NextPage, OutboxView, Overview, RecordPage, RecordQuery};
use crate::view::{
    AuditView, DETAIL_BODY, GroupView, LIST_TEXT, LeaseState, LetterView, OutcomeView, RecordView,
    SentView,
};

/// The API's routes, under `/api/v1`.
pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/records", get(records))
        .route("/api/v1/records/one", get(record))
        .route("/api/v1/records/evict", post(evict))
        .route("/api/v1/records/release", post(release))
        .route("/api/v1/in-flight", get(in_flight))
        .route("/api/v1/dead-letters", get(letters))
        .route("/api/v1/dead-letters/groups", get(groups))
        .route("/api/v1/dead-letters/redrive-plan", get(redrive_plan))
        .route("/api/v1/dead-letters/redrive", post(redrive_set))
        .route("/api/v1/dead-letters/{id}", get(letter))
        .route("/api/v1/dead-letters/{id}/redrive", post(redrive_one))
        .route("/api/v1/dead-letters/set-aside-plan", get(set_aside_plan))
        .route("/api/v1/dead-letters/discard", post(discard_set))
        .route("/api/v1/dead-letters/archive", post(archive_set))
        .route("/api/v1/dead-letters/{id}/discard", post(discard_one))
        .route("/api/v1/dead-letters/{id}/archive", post(archive_one))
        .route("/api/v1/outbox", get(outbox))
        .route("/api/v1/charts", get(charts))
        .route("/api/v1/audit", get(audit))
        .route("/api/v1/auditor", get(auditor))
        .fallback(|| async {
            Problem::not_found("no such API path; /api/v1/openapi.json lists them")
        })
        .layer(middleware::from_fn(problem::problems_only))
}

/// A JSON body whose rejection is a problem document.
#[derive(Debug)]
pub(crate) struct Body<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Problem> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(Problem::new(rejection.status(), rejection.body_text())),
        }
    }
}

fn now(store: &AnyStore) -> idem::Timestamp {
    store.outbox_clock().now()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "idem console API",
        description = "Records, in-flight claims, dead letters, the outbox and the audit log of an Idem store. Errors are application/problem+json (RFC 9457). Actions are POSTs with JSON bodies; with tokens set, send Authorization: Bearer <token> (the read-only token may only read)."
    ),
    paths(
        overview, records, record, evict, release, in_flight, letters, groups, letter,
        redrive_plan, redrive_set, redrive_one, set_aside_plan, discard_set, archive_set,
        discard_one, archive_one, outbox, charts, audit, auditor
    ),
    components(schemas(
        Problem, RecordView, OutcomeView, LeaseState, RecordPage, NextPage, InFlight, LetterView,
        GroupView, AuditView, OutboxView, SentView, Overview, RecordChange, AuditDone, RedrivePlan,
        RedriveReport, RedriveFailure, RedriveSet, Series, Point, LetterPage, SetAside,
        SetAsidePlan, SetAsideReport, SetAsideSkip, SetAsideSet, Actor, AuditorView,
        AuditorConfig, FindingView, EffectRowView, RecordSeenView
    )),
    modifiers(&Bearer),
    security(("bearer" = [])),
)]
struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document of this API.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// Figures at a glance: records, claims, dead letters, outbox.
#[utoipa::path(get, path = "/api/v1/overview", tag = "overview",
    responses(
        (status = 200, body = Overview),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ))]
async fn overview(State(shared): State<Arc<Shared>>) -> Result<Json<Overview>, Problem> {
    Ok(Json(
        read::overview(&shared.store, now(&shared.store)).await?,
    ))
}

/// Records, newest first, filtered and paged.
#[utoipa::path(get, path = "/api/v1/records", tag = "records", params(RecordQuery),
    responses(
        (status = 200, body = RecordPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ))]
async fn records(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<RecordQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RecordPage>, Problem> {
    let Query(query) = query.map_err(|e| Problem::bad_request(e.body_text()))?;
    Ok(Json(
        read::records(&shared.store, &query, now(&shared.store)).await?,
    ))
}

/// Which record.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct Which {
    /// Its scope, as stored.
    scope: String,
    /// Its key.
    key: String,
}

/// One record in full (its body cut at 4096 characters).
#[utoipa::path(get, path = "/api/v1/records/one", tag = "records", params(Which),
    responses(
        (status = 200, body = RecordView),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ))]
async fn record(
    State(shared): State<Arc<Shared>>,
    which: Result<Query<Which>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RecordView>, Problem> {
    let Query(which) = which.map_err(|e| Problem::bad_request(e.body_text()))?;
    let record = actions::stored(&shared.store, &which.scope, &which.key).await?;
    Ok(Json(RecordView::of(
        &record,
        now(&shared.store),
        DETAIL_BODY,
    )))
}

/// An action done, and its line in the audit log.
#[derive(Debug, Serialize, ToSchema)]
struct AuditDone {
    /// The audit entry the action wrote.
    audit: AuditView,
}

/// Evicts a record, if it is still as shown (token and last change): the
/// key's next use applies its effect again. Logged in the audit log.
#[utoipa::path(post, path = "/api/v1/records/evict", tag = "records", request_body = RecordChange,
    responses(
        (status = 200, body = AuditDone),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn evict(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Body(change): Body<RecordChange>,
) -> Result<Json<AuditDone>, Problem> {
    change_record(&shared, &caller, RecordVerb::Evict, &change).await
}

/// Ends an in-flight claim, if it is still as shown: its token is fenced
/// and the next claim runs at once. Logged in the audit log.
#[utoipa::path(post, path = "/api/v1/records/release", tag = "records", request_body = RecordChange,
    responses(
        (status = 200, body = AuditDone),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn release(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Body(change): Body<RecordChange>,
) -> Result<Json<AuditDone>, Problem> {
    change_record(&shared, &caller, RecordVerb::Release, &change).await
}

async fn change_record(
    shared: &Shared,
    caller: &Caller,
    verb: RecordVerb,
    change: &RecordChange,
) -> Result<Json<AuditDone>, Problem> {
    let actor = caller.actor(&change.actor)?;
    let entry = actions::change_record(&shared.store, verb, change, &actor).await?;
    Ok(Json(AuditDone {
        audit: AuditView::from(&entry),
    }))
}

/// The in-flight claims: lease running, lease ended (awaiting a takeover), released.
#[utoipa::path(get, path = "/api/v1/in-flight", tag = "records",
    responses(
        (status = 200, body = InFlight),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn in_flight(State(shared): State<Arc<Shared>>) -> Result<Json<InFlight>, Problem> {
    Ok(Json(
        read::in_flight(&shared.store, now(&shared.store)).await?,
    ))
}

/// A page of dead letters.
#[derive(Debug, Serialize, ToSchema)]
struct LetterPage {
    /// How many letters match.
    total: usize,
    /// The page, oldest first.
    letters: Vec<LetterView>,
}

/// Which page of the dead letters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct LetterPaging {
    /// At most this many (1 to 500; 100 when not given).
    limit: Option<usize>,
    /// Leave out this many first.
    offset: Option<usize>,
}

fn letter_query<T: DeserializeOwned>(
    query: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, Problem> {
    query
        .map(|Query(q)| q)
        .map_err(|e| Problem::bad_request(e.body_text()))
}

/// Dead letters matching the filter, oldest first.
#[utoipa::path(get, path = "/api/v1/dead-letters", tag = "dead letters", params(LetterFilter, LetterPaging),
    responses(
        (status = 200, body = LetterPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn letters(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<LetterFilter>, axum::extract::rejection::QueryRejection>,
    paging: Result<Query<LetterPaging>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<LetterPage>, Problem> {
    let filter = letter_query(filter)?;
    let paging = letter_query(paging)?;
    let limit = paging.limit.unwrap_or(100);
    if !(1..=read::MAX_PAGE).contains(&limit) {
        return Err(Problem::bad_request(format!(
            "limit {limit} is out of range: a page lists 1 to {} letters",
            read::MAX_PAGE
        )));
    }
    let found = actions::letters(&shared.store, &filter, now(&shared.store)).await?;
    Ok(Json(LetterPage {
        total: found.len(),
        letters: found
            .iter()
            .skip(paging.offset.unwrap_or(0))
            .take(limit)
            .map(|l| LetterView::of(l, LIST_TEXT))
            .collect(),
    }))
}

/// Dead letters matching the filter, grouped by cause (the first line of
/// the last error), the largest group first.
#[utoipa::path(get, path = "/api/v1/dead-letters/groups", tag = "dead letters", params(LetterFilter),
    responses(
        (status = 200, body = Vec<GroupView>),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn groups(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<LetterFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<GroupView>>, Problem> {
    let filter = letter_query(filter)?;
    let found = actions::letters(&shared.store, &filter, now(&shared.store)).await?;
    Ok(Json(
        group_by_cause(&found).iter().map(GroupView::from).collect(),
    ))
}

/// One dead letter in full (its payload cut at 4096 characters).
#[utoipa::path(get, path = "/api/v1/dead-letters/{id}", tag = "dead letters",
    params(("id" = i64, Path, description = "The letter's id")),
    responses(
        (status = 200, body = LetterView),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ))]
async fn letter(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
) -> Result<Json<LetterView>, Problem> {
    let Path(id) = id.map_err(|e| Problem::bad_request(e.body_text()))?;
    let letter = shared
        .store
        .get_dead_letter(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no dead letter with id {id}")))?;
    Ok(Json(LetterView::of(&letter, DETAIL_BODY)))
}

/// What a redrive of the waiting letters matching the filter would do.
#[utoipa::path(get, path = "/api/v1/dead-letters/redrive-plan", tag = "dead letters", params(LetterFilter),
    responses(
        (status = 200, body = RedrivePlan),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn redrive_plan(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<LetterFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RedrivePlan>, Problem> {
    let filter = letter_query(filter)?;
    let found = actions::letters(&shared.store, &filter, now(&shared.store)).await?;
    Ok(Json(RedrivePlan::of(&found)))
}

/// The letters to redrive: exactly these ids, as a plan listed them.
#[derive(Debug, Deserialize, ToSchema)]
struct RedriveSet {
    /// The letters (those no longer waiting are left alone).
    ids: Vec<i64>,
}

/// Redrives the waiting letters among `ids` (from a redrive plan): each is
/// published again to its stored destination with its original key.
#[utoipa::path(post, path = "/api/v1/dead-letters/redrive", tag = "dead letters", request_body = RedriveSet,
    responses(
        (status = 200, body = RedriveReport),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn redrive_set(
    State(shared): State<Arc<Shared>>,
    Body(set): Body<RedriveSet>,
) -> Result<Json<RedriveReport>, Problem> {
    if set.ids.len() > actions::LETTERS_READ {
        return Err(Problem::bad_request(format!(
            "at most {} letters at a time",
            actions::LETTERS_READ
        )));
    }
    let mut chosen = Vec::new();
    for id in set.ids {
        if let Some(letter) = shared.store.get_dead_letter(id).await?
            && letter.is_waiting()
        {
            chosen.push(letter);
        }
    }
    Ok(Json(actions::redrive(&shared.store, &chosen).await))
}

/// Redrives one letter, waiting or not: published again to its stored
/// destination with its original key.
#[utoipa::path(post, path = "/api/v1/dead-letters/{id}/redrive", tag = "dead letters",
    params(("id" = i64, Path, description = "The letter's id")),
    responses(
        (status = 200, body = RedriveReport),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ))]
async fn redrive_one(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
) -> Result<Json<RedriveReport>, Problem> {
    let Path(id) = id.map_err(|e| Problem::bad_request(e.body_text()))?;
    Ok(Json(actions::redrive_one(&shared.store, id).await?))
}

/// Which way to set letters aside.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SetAsideQuery {
    /// `discard` or `archive`.
    action: SetAside,
}

/// What discarding or archiving the waiting letters matching the filter would do.
#[utoipa::path(get, path = "/api/v1/dead-letters/set-aside-plan", tag = "dead letters",
    params(SetAsideQuery, LetterFilter),
    responses(
        (status = 200, body = SetAsidePlan),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn set_aside_plan(
    State(shared): State<Arc<Shared>>,
    action: Result<Query<SetAsideQuery>, axum::extract::rejection::QueryRejection>,
    filter: Result<Query<LetterFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<SetAsidePlan>, Problem> {
    let action = letter_query(action)?.action;
    let filter = letter_query(filter)?;
    let found = actions::letters(&shared.store, &filter, now(&shared.store)).await?;
    Ok(Json(SetAsidePlan::of(action, &found)))
}

/// The letters to discard or archive (as a plan listed them), and who acts.
#[derive(Debug, Deserialize, ToSchema)]
struct SetAsideSet {
    /// The letters (those no longer waiting are left alone).
    ids: Vec<i64>,
    /// Who acts, for the audit log.
    actor: String,
}

/// Who acts on one letter, for the audit log.
#[derive(Debug, Deserialize, ToSchema)]
struct Actor {
    /// Who acts.
    actor: String,
}

async fn set_aside_set(
    shared: &Shared,
    caller: &Caller,
    action: SetAside,
    set: &SetAsideSet,
) -> Result<Json<SetAsideReport>, Problem> {
    let actor = caller.actor(&set.actor)?;
    Ok(Json(
        actions::set_aside(&shared.store, action, &set.ids, &actor).await?,
    ))
}

async fn set_aside_one(
    shared: &Shared,
    caller: &Caller,
    action: SetAside,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
    who: &Actor,
) -> Result<Json<AuditDone>, Problem> {
    let Path(id) = id.map_err(|e| Problem::bad_request(e.body_text()))?;
    let actor = caller.actor(&who.actor)?;
    let entry = actions::set_aside_one(&shared.store, action, id, &actor).await?;
    Ok(Json(AuditDone {
        audit: AuditView::from(&entry),
    }))
}

/// Deletes the waiting letters among `ids` for good; each deletion is
/// logged in the audit log with the letter as it was.
#[utoipa::path(post, path = "/api/v1/dead-letters/discard", tag = "dead letters", request_body = SetAsideSet,
    responses(
        (status = 200, body = SetAsideReport),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn discard_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Body(set): Body<SetAsideSet>,
) -> Result<Json<SetAsideReport>, Problem> {
    set_aside_set(&shared, &caller, SetAside::Discard, &set).await
}

/// Archives the waiting letters among `ids`: kept, no longer waiting; each
/// is logged in the audit log.
#[utoipa::path(post, path = "/api/v1/dead-letters/archive", tag = "dead letters", request_body = SetAsideSet,
    responses(
        (status = 200, body = SetAsideReport),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn archive_set(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Body(set): Body<SetAsideSet>,
) -> Result<Json<SetAsideReport>, Problem> {
    set_aside_set(&shared, &caller, SetAside::Archive, &set).await
}

/// Deletes one letter for good (waiting or not), logged in the audit log
/// with the letter as it was.
#[utoipa::path(post, path = "/api/v1/dead-letters/{id}/discard", tag = "dead letters", request_body = Actor,
    params(("id" = i64, Path, description = "The letter's id")),
    responses(
        (status = 200, body = AuditDone),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn discard_one(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
    Body(who): Body<Actor>,
) -> Result<Json<AuditDone>, Problem> {
    set_aside_one(&shared, &caller, SetAside::Discard, id, &who).await
}

/// Archives one letter: kept, no longer waiting; logged in the audit log.
/// A letter archived already is 409.
#[utoipa::path(post, path = "/api/v1/dead-letters/{id}/archive", tag = "dead letters", request_body = Actor,
    params(("id" = i64, Path, description = "The letter's id")),
    responses(
        (status = 200, body = AuditDone),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
async fn archive_one(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
    Body(who): Body<Actor>,
) -> Result<Json<AuditDone>, Problem> {
    set_aside_one(&shared, &caller, SetAside::Archive, id, &who).await
}

/// The outbox: pending, lag, sent, the latest sends and the relay's latest failures.
#[utoipa::path(get, path = "/api/v1/outbox", tag = "outbox",
    responses(
        (status = 200, body = OutboxView),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn outbox(State(shared): State<Arc<Shared>>) -> Result<Json<OutboxView>, Problem> {
    Ok(Json(read::outbox(&shared.store, now(&shared.store)).await?))
}

/// The last hour's samples: duplicates suppressed and key conflicts (this
/// process's counters), dead letters waiting and outbox lag (the store's).
#[utoipa::path(get, path = "/api/v1/charts", tag = "overview",
    responses(
        (status = 200, body = Vec<Series>),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn charts(State(shared): State<Arc<Shared>>) -> Json<Vec<Series>> {
    Json(shared.charts.series())
}

/// How many audit entries.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// At most this many, newest first (1 to 500; 100 when not given).
    limit: Option<usize>,
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses(
        (status = 200, body = Vec<AuditView>),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn audit(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<AuditView>>, Problem> {
    let limit = letter_query(query)?.limit.unwrap_or(100);
    if !(1..=read::MAX_PAGE).contains(&limit) {
        return Err(Problem::bad_request(format!(
            "limit {limit} is out of range: 1 to {}",
            read::MAX_PAGE
        )));
    }
    let entries = shared.store.audit_log(limit).await?;
    Ok(Json(entries.iter().map(AuditView::from).collect()))
}

/// The live auditor this console runs: findings by kind, the cursor, the
/// last pass, and the latest findings, newest first. `configured` is false
/// when the console runs none.
#[utoipa::path(get, path = "/api/v1/auditor", tag = "audit",
    responses(
        (status = 200, body = AuditorView),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ))]
async fn auditor(State(shared): State<Arc<Shared>>) -> Json<AuditorView> {
    Json(shared.auditor.view(&shared.store))
}
