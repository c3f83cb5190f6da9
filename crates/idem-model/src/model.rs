//! The model: the state of one key (the record, the workers, the resource,
//! the clock and a few ghost facts kept only to state properties), the steps
//! that change it, and the properties checked in every reachable state.

use idem_core::{RecordState, Timestamp};
use stateright::{Model, Property};

use crate::config::{Config, Order};
use crate::resource::Resource;
use crate::store::{Claimed, Store, Stored};
use crate::worker::{Held, Worker};

/// Everything the model tracks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The clock, in ticks.
    pub now: Timestamp,
    /// The key's record, if the store has one.
    pub record: Option<Stored>,
    /// The workers.
    pub workers: Vec<Worker>,
    /// The resource the effect writes to.
    pub resource: Resource,
    /// Facts about the run so far, which no participant sees.
    pub history: History,
}

/// Ghost facts: what has happened so far, kept to state the properties.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// Claims granted (new claims and takeovers), numbering them.
    pub claims: u8,
    /// Windows opened: a claim on no record or on one past retention.
    pub windows: u8,
    /// Completions the store accepted in the current window.
    pub completions: u8,
    /// Windows in which the key completed.
    pub settled_windows: u8,
    /// A claim took over an expired lease.
    pub took_over: bool,
    /// The store refused a complete, renew or release with a stale token.
    pub store_fenced: bool,
    /// The resource refused a write with a stale token.
    pub resource_fenced: bool,
    /// The resource refused a write from the newest claim.
    pub newest_refused: bool,
    /// The store accepted a completion from a claim that was not the newest.
    pub stale_completed: bool,
    /// A claim was granted on a completed record inside its window.
    pub reclaimed: bool,
    /// A worker ended its lease for an unknown outcome, and no claim has
    /// been granted since.
    pub lease_ended: bool,
    /// The claim after an ended lease was a takeover.
    pub ended_taken_over: bool,
}

/// One step of one participant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock moves one tick.
    Tick,
    /// The sweeper deletes the record, past retention.
    Sweep,
    /// Worker `i` claims the key.
    Claim(usize),
    /// Worker `i` runs its effect: a guarded write carrying its token.
    Write(usize),
    /// Worker `i` completes its claim.
    Complete(usize),
    /// Worker `i` renews its lease.
    Renew(usize),
    /// Worker `i` releases its claim after a retryable failure, before writing.
    Release(usize),
    /// Worker `i` crashes and forgets its claim; the message comes back to it.
    Crash(usize),
    /// Worker `i` got an answer whose outcome is unknown: it ends its lease
    /// now, leaving the record in flight, and the message comes back to it
    /// (the next claim is a takeover).
    EndLease(usize),
}

/// The claim / lease / fence protocol on one key, as a [`stateright::Model`].
#[derive(Debug, Clone)]
pub struct ProtocolModel {
    config: Config,
    store: Store,
}

impl ProtocolModel {
    /// The model of one run.
    pub fn new(config: Config) -> Self {
        let store = Store::new(config.settings(), config.bug);
        Self { config, store }
    }

    /// The run's bounds and settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn claim(&self, state: &mut State, i: usize) -> Option<()> {
        let found = state.record;
        let history = &mut state.history;
        match self.store.claim(found.as_ref(), state.now) {
            Claimed::InFlight => None,
            Claimed::Replayed => {
                state.workers[i] = Worker::Done;
                Some(())
            }
            Claimed::Fresh { record, took_over } => {
                if history.claims >= self.config.max_claims {
                    return None;
                }
                history.claims += 1;
                if found.is_none_or(|found| found.created_at != record.created_at) {
                    history.windows += 1;
                    history.completions = 0;
                }
                if found.is_some_and(|f| f.state.is_settled() && state.now < f.expires_at) {
                    history.reclaimed = true;
                }
                history.took_over |= took_over;
                history.ended_taken_over |= took_over && history.lease_ended;
                history.lease_ended = false;
                state.record = Some(record);
                state.workers[i] = Worker::Holding(Held {
                    token: record.token,
                    claim: history.claims,
                    wrote: false,
                });
                Some(())
            }
        }
    }

    fn write(state: &mut State, i: usize, held: Held, then: Worker) {
        if state.resource.write(held.token) {
            state.workers[i] = then;
        } else {
            state.history.resource_fenced = true;
            state.history.newest_refused |= held.claim == state.history.claims;
            state.workers[i] = Worker::Fenced;
        }
    }

    fn complete(&self, state: &mut State, i: usize, held: Held) {
        match self.store.complete(state.record.as_ref(), held.token) {
            Some(record) => {
                state.record = Some(record);
                state.history.completions += 1;
                if state.history.completions == 1 {
                    state.history.settled_windows += 1;
                }
                state.history.stale_completed |= held.claim != state.history.claims;
                state.workers[i] = match self.config.order {
                    Order::EffectFirst => Worker::Done,
                    Order::RecordFirst => Worker::Recorded(held),
                };
            }
            None => self.fenced(state, i),
        }
    }

    fn lease(&self, state: &mut State, i: usize, held: Held, until: Option<Timestamp>) {
        match self.store.lease(state.record.as_ref(), held.token, until) {
            Some(record) => {
                state.record = Some(record);
                if until.is_none() {
                    state.workers[i] = Worker::Idle;
                }
            }
            None => self.fenced(state, i),
        }
    }

    fn fenced(&self, state: &mut State, i: usize) {
        state.history.store_fenced = true;
        state.workers[i] = Worker::Fenced;
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: Timestamp(0),
            record: None,
            workers: vec![Worker::Idle; self.config.workers],
            resource: Resource::default(),
            history: History::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.config.end() {
            actions.push(Action::Tick);
        }
        if self.config.sweeps && self.store.sweeps(state.record.as_ref(), state.now) {
            actions.push(Action::Sweep);
        }
        for (i, worker) in state.workers.iter().enumerate() {
            match worker {
                Worker::Idle => actions.push(Action::Claim(i)),
                Worker::Holding(held) => {
                    match (self.config.order, held.wrote) {
                        (Order::EffectFirst, false) => actions.push(Action::Write(i)),
                        (Order::EffectFirst, true) | (Order::RecordFirst, _) => {
                            actions.push(Action::Complete(i))
                        }
                    }
                    actions.push(Action::Renew(i));
                    if !held.wrote {
                        actions.push(Action::Release(i));
                    }
                    actions.push(Action::Crash(i));
                    actions.push(Action::EndLease(i));
                }
                Worker::Recorded(_) => actions.extend([Action::Write(i), Action::Crash(i)]),
                Worker::Done | Worker::Fenced => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.now = Timestamp(state.now.0 + 1),
            Action::Sweep => state.record = None,
            Action::Claim(i) => self.claim(&mut state, i)?,
            Action::Crash(i) => state.workers[i] = Worker::Idle,
            Action::Write(i) => match state.workers[i] {
                Worker::Holding(held) => {
                    let wrote = Worker::Holding(Held {
                        wrote: true,
                        ..held
                    });
                    Self::write(&mut state, i, held, wrote)
                }
                Worker::Recorded(held) => Self::write(&mut state, i, held, Worker::Done),
                _ => return None,
            },
            Action::Complete(i) | Action::Renew(i) | Action::Release(i) | Action::EndLease(i) => {
                let Worker::Holding(held) = state.workers[i] else {
                    return None;
                };
                match action {
                    Action::Complete(_) => self.complete(&mut state, i, held),
                    Action::Renew(_) => {
                        let until = self.store.renewed(state.now);
                        self.lease(&mut state, i, held, Some(until))
                    }
                    Action::EndLease(_) => {
                        let now = state.now;
                        self.lease(&mut state, i, held, Some(now));
                        if matches!(state.workers[i], Worker::Holding(_)) {
                            state.workers[i] = Worker::Idle;
                            state.history.lease_ended = true;
                        }
                    }
                    _ => self.lease(&mut state, i, held, None),
                }
            }
        }
        (state != *last).then_some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONCE, |_, s: &State| s.history.completions <= 1),
            Property::always(STALE_NEVER_COMPLETES, |_, s: &State| {
                !s.history.stale_completed
            }),
            Property::always(NOT_CLAIMED_AGAIN, |_, s: &State| !s.history.reclaimed),
            Property::always(RESOURCE_MATCHES, |m: &Self, s: &State| match s.record {
                Some(r) if r.state == RecordState::Completed => {
                    m.config.order == Order::RecordFirst || s.resource.last == Some(r.token)
                }
                _ => true,
            }),
            Property::always(NEWEST_WRITES, |_, s: &State| !s.history.newest_refused),
            Property::always(WRITTEN_ONCE, |m: &Self, s: &State| {
                m.config.order == Order::EffectFirst
                    || s.history.windows > 1
                    || s.resource.writes <= 1
            }),
            Property::sometimes(TAKEOVER, |_, s: &State| s.history.took_over),
            Property::sometimes(ENDED_TAKEN_OVER, |_, s: &State| s.history.ended_taken_over),
            Property::sometimes(STORE_FENCES, |_, s: &State| s.history.store_fenced),
            Property::sometimes(RESOURCE_FENCES, |_, s: &State| s.history.resource_fenced),
            Property::sometimes(COMPLETES, |_, s: &State| s.history.completions >= 1),
            Property::sometimes(REPEATED, |_, s: &State| s.resource.writes >= 2),
            Property::sometimes(LOST, |_, s: &State| {
                s.record.is_some_and(|r| r.state == RecordState::Completed)
                    && s.resource.writes == 0
                    && !s.workers.iter().any(|w| matches!(w, Worker::Recorded(_)))
            }),
            Property::sometimes(SECOND_WINDOW, |_, s: &State| s.history.windows >= 2),
            Property::sometimes(SETTLED_TWICE, |_, s: &State| s.history.settled_windows >= 2),
        ]
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.now <= self.config.end()
    }
}

/// Always: the store accepts at most one completion per window.
pub const AT_MOST_ONCE: &str = "the effect is committed at most once in its window";
/// Always: a completion from a claim that is not the newest is refused.
pub const STALE_NEVER_COMPLETES: &str = "a stale claim never completes";
/// Always: a completed key is replayed, never claimed, inside its window.
pub const NOT_CLAIMED_AGAIN: &str = "a completed key is not claimed again inside its window";
/// Always (effect first): the completed record's token is the resource's last
/// accepted write.
pub const RESOURCE_MATCHES: &str = "a completed record's token is the resource's last write";
/// Always: the newest claim's write is never refused by the resource.
pub const NEWEST_WRITES: &str = "the newest claim's write is accepted";
/// Always (record first): within one window the resource is written at most once.
pub const WRITTEN_ONCE: &str = "recorded first, the effect is written at most once";
/// Sometimes: an expired lease is taken over.
pub const TAKEOVER: &str = "a lease is taken over";
/// Sometimes: the claim after a lease ended for an unknown outcome is a
/// takeover (at once, not after the lease).
pub const ENDED_TAKEN_OVER: &str = "an ended lease is taken over at once";
/// Sometimes: the store refuses a stale worker.
pub const STORE_FENCES: &str = "the store fences a stale worker";
/// Sometimes: the resource refuses a stale write.
pub const RESOURCE_FENCES: &str = "the resource fences a stale write";
/// Sometimes: the key completes.
pub const COMPLETES: &str = "the key completes";
/// Sometimes (effect first): a crash after the write makes the takeover write again.
pub const REPEATED: &str = "the effect is written twice";
/// Sometimes (record first): a crash after the record loses the effect.
pub const LOST: &str = "the key completes and the effect is lost";
/// Sometimes (short window): the key is claimed again in a new window.
pub const SECOND_WINDOW: &str = "the key is claimed in a second window";
/// Sometimes (short window): the key completes in two windows, its effect
/// applied once in each.
pub const SETTLED_TWICE: &str = "the key completes in two windows";

/// The properties that must hold in every reachable state.
pub const ALWAYS: [&str; 6] = [
    AT_MOST_ONCE,
    STALE_NEVER_COMPLETES,
    NOT_CLAIMED_AGAIN,
    RESOURCE_MATCHES,
    NEWEST_WRITES,
    WRITTEN_ONCE,
];
