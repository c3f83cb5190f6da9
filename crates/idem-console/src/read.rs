//! What the console reads, for the pages and the API alike: a page of
//! records, the in-flight claims by where their lease stands, the figures of
//! the overview and the outbox.

use idem::{
    AnyStore, DeadLetterStore, OutboxStore, RecordCursor, RecordFilter, RecordState, RecordStore,
    Timestamp,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::actions::{self, LetterFilter, scope_and_key};
use crate::problem::Problem;
use crate::view::{LIST_TEXT, LeaseState, LetterView, RecordView, SentView};

/// The most records one page lists.
pub const MAX_PAGE: usize = 500;
/// The records a page lists when not told.
pub const DEFAULT_PAGE: usize = 50;

/// Which records, and which page of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RecordQuery {
    /// Only this scope (exactly, as stored).
    pub scope: Option<String>,
    /// Only this state: `in_flight`, `completed` or `failed`.
    pub state: Option<String>,
    /// Only keys starting with this text.
    pub key_prefix: Option<String>,
    /// At most this many (1 to 500; 50 when not given).
    pub limit: Option<usize>,
    /// The next page: records after the one created at this time ...
    pub after_created_ms: Option<i64>,
    /// ... in this scope ...
    pub after_scope: Option<String>,
    /// ... with this key (the `next` of the page before).
    pub after_key: Option<String>,
}

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct NextPage {
    /// `after_created_ms` of the next page's query.
    pub after_created_ms: i64,
    /// `after_scope` of the next page's query.
    pub after_scope: String,
    /// `after_key` of the next page's query.
    pub after_key: String,
}

/// A page of records, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RecordPage {
    /// The records.
    pub records: Vec<RecordView>,
    /// Where the next page starts; absent on the last page.
    pub next: Option<NextPage>,
}

fn given(text: &Option<String>) -> Option<&str> {
    text.as_deref().map(str::trim).filter(|t| !t.is_empty())
}

impl RecordQuery {
    /// The store's filter for this query, or what is wrong with it.
    pub fn filter(&self) -> Result<(RecordFilter, usize), Problem> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(Problem::bad_request(format!(
                "limit {limit} is out of range: a page lists 1 to {MAX_PAGE} records"
            )));
        }
        let scope = given(&self.scope)
            .map(idem::Scope::new)
            .transpose()
            .map_err(|e| Problem::bad_request(format!("scope: {e}")))?;
        let state = given(&self.state)
            .map(str::parse::<RecordState>)
            .transpose()
            .map_err(|e| {
                Problem::bad_request(format!("state: {e}; use in_flight, completed or failed"))
            })?;
        let key_prefix = given(&self.key_prefix)
            .map(|prefix| {
                // A key's prefix is itself a valid key: this checks its characters.
                idem::IdempotencyKey::new(prefix)
                    .map(|_| prefix.to_owned())
                    .map_err(|e| Problem::bad_request(format!("key_prefix: {e}")))
            })
            .transpose()?;
        let after = match (
            self.after_created_ms,
            given(&self.after_scope),
            given(&self.after_key),
        ) {
            (None, None, None) => None,
            (Some(created), Some(scope), Some(key)) => {
                let (scope, key) = scope_and_key(scope, key)?;
                Some(RecordCursor {
                    created_at: Timestamp(created),
                    scope,
                    key,
                })
            }
            _ => {
                return Err(Problem::bad_request(
                    "after_created_ms, after_scope and after_key go together: copy all three from the `next` of the page before",
                ));
            }
        };
        Ok((
            RecordFilter {
                scope,
                state,
                key_prefix,
                after,
                // One more than the page, to know whether another follows.
                limit: Some(limit + 1),
            },
            limit,
        ))
    }
}

/// The page of records `query` asks for, at `now`.
pub async fn records(
    store: &AnyStore,
    query: &RecordQuery,
    now: Timestamp,
) -> Result<RecordPage, Problem> {
    let (filter, limit) = query.filter()?;
    let mut found = store.list(&filter).await?;
    let more = found.len() > limit;
    found.truncate(limit);
    let next = more.then(|| found.last()).flatten().map(|last| NextPage {
        after_created_ms: last.created_at.0,
        after_scope: last.scope.as_str().to_owned(),
        after_key: last.key.as_str().to_owned(),
    });
    Ok(RecordPage {
        records: found
            .iter()
            .map(|r| RecordView::of(r, now, LIST_TEXT))
            .collect(),
        next,
    })
}

/// The in-flight claims, by where their lease stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct InFlight {
    /// Claims whose holder's lease still runs, the one ending first first.
    pub alive: Vec<RecordView>,
    /// Claims whose lease ended: the next retry of each takes it over.
    pub expired: Vec<RecordView>,
    /// Claims released by their holder: the next claim runs at once.
    pub released: Vec<RecordView>,
    /// Whether more claims are in flight than were read.
    pub more: bool,
}

/// The most in-flight claims the in-flight view reads.
pub const IN_FLIGHT_READ: usize = 1000;

/// The in-flight claims at `now`.
pub async fn in_flight(store: &AnyStore, now: Timestamp) -> Result<InFlight, Problem> {
    let claims = store
        .list(&RecordFilter {
            state: Some(RecordState::InFlight),
            limit: Some(IN_FLIGHT_READ + 1),
            ..RecordFilter::default()
        })
        .await?;
    let more = claims.len() > IN_FLIGHT_READ;
    let mut view = InFlight {
        alive: Vec::new(),
        expired: Vec::new(),
        released: Vec::new(),
        more,
    };
    for claim in claims.iter().take(IN_FLIGHT_READ) {
        let record = RecordView::of(claim, now, LIST_TEXT);
        match record.lease {
            LeaseState::Alive => view.alive.push(record),
            LeaseState::Expired => view.expired.push(record),
            LeaseState::Released | LeaseState::None => view.released.push(record),
        }
    }
    view.alive.sort_by_key(|r| r.lease_until_ms);
    view.expired.sort_by_key(|r| r.lease_until_ms);
    Ok(view)
}

/// How the outbox keeps up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutboxView {
    /// Whether this store has an outbox (Redis and DynamoDB have none).
    pub available: bool,
    /// Messages waiting to be published.
    pub pending: u64,
    /// Messages published and kept until the retention ends.
    pub sent: u64,
    /// How long the oldest waiting message has waited, in milliseconds.
    pub lag_ms: i64,
    /// When the oldest waiting message was enqueued.
    pub oldest_pending_ms: Option<i64>,
    /// The messages sent last (kept until the retention ends), newest first.
    pub recent_sends: Vec<SentView>,
    /// The relay's latest failures: messages it gave up on, newest first.
    pub recent_failures: Vec<LetterView>,
}

/// How many recent sends and failures the outbox view shows.
pub const OUTBOX_RECENT: usize = 20;

/// Whether `store` keeps an outbox: the SQL stores do; Redis (records only)
/// and DynamoDB (no SQL transaction for an effect to enqueue in) do not.
fn has_outbox(store: &AnyStore) -> bool {
    store.offers_atomic_mode()
}

/// Dead letters whose origin names the relay are the outbox's failures.
fn from_relay(origin: &str) -> bool {
    origin.starts_with("relay")
}

/// The outbox at `now`.
pub async fn outbox(store: &AnyStore, now: Timestamp) -> Result<OutboxView, Problem> {
    let (stats, sends) = if has_outbox(store) {
        (
            store.outbox_stats().await?,
            store.recent_sends(OUTBOX_RECENT).await?,
        )
    } else {
        Default::default()
    };
    let mut failures = actions::letters(
        store,
        &LetterFilter {
            all: Some(true),
            ..LetterFilter::default()
        },
        now,
    )
    .await?;
    failures.retain(|letter| from_relay(&letter.origin));
    failures.reverse();
    failures.truncate(OUTBOX_RECENT);
    Ok(OutboxView {
        available: has_outbox(store),
        pending: stats.pending,
        sent: stats.sent,
        lag_ms: stats.oldest_pending.map_or(0, |oldest| {
            i64::try_from(oldest.until(now).as_millis()).unwrap_or(i64::MAX)
        }),
        oldest_pending_ms: stats.oldest_pending.map(|t| t.0),
        recent_sends: sends.iter().map(SentView::from).collect(),
        recent_failures: failures
            .iter()
            .map(|l| LetterView::of(l, LIST_TEXT))
            .collect(),
    })
}

/// The figures at the top of the overview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Overview {
    /// Records stored.
    pub records: u64,
    /// Of them, past the dedupe window and waiting for the sweeper.
    pub expired_records: u64,
    /// In-flight claims whose lease still runs.
    pub in_flight_alive: usize,
    /// In-flight claims whose lease ended, waiting for a takeover.
    pub in_flight_expired: usize,
    /// Dead letters waiting for a redrive.
    pub dead_letters_waiting: u64,
    /// When the oldest waiting dead letter was recorded.
    pub oldest_dead_letter_ms: Option<i64>,
    /// The outbox.
    pub outbox: OutboxView,
}

/// The overview at `now`.
pub async fn overview(store: &AnyStore, now: Timestamp) -> Result<Overview, Problem> {
    let count = store.count().await?;
    let claims = in_flight(store, now).await?;
    let letters = store.dead_letter_stats().await?;
    Ok(Overview {
        records: count.total,
        expired_records: count.expired,
        in_flight_alive: claims.alive.len(),
        in_flight_expired: claims.expired.len(),
        dead_letters_waiting: letters.waiting,
        oldest_dead_letter_ms: letters.oldest_waiting.map(|t| t.0),
        outbox: outbox(store, now).await?,
    })
}
