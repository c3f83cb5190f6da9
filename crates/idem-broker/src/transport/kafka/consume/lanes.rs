//! Which offsets a Kafka consumer may commit.
//!
//! Kafka has no per-message ack: a consumer commits one offset per partition,
//! "everything before this is done". Effects finish out of order (partitions
//! run in parallel, a failed record waits for its retry), so the offset to
//! commit is the lowest one whose effect has not committed yet, never past it.
//!
//! Each assigned partition is a lane: records fetched and not yet handed out
//! wait in order; records handed out are held until settled; a record given
//! back for redelivery stays held (the commit cannot pass it) and is handed
//! out again when its delay is over, before anything later in its lane. A
//! lane hands out at most `per_partition` unsettled records: one keeps each
//! partition strictly in order. In batch mode a lane with records in a
//! closed batch is sealed until they are all settled, so two batches applied
//! at once never hold parts of one partition; a lane is taken from until it
//! runs dry (or hits its limit), so a batch draws on few partitions.
//!
//! This module is plain data behind a mutex, shared by the thread that polls
//! librdkafka (it fills lanes, commits, and revokes them on a rebalance) and
//! the runtime's tasks (which take records and settle them).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::consume::Message;

/// A topic and partition.
pub(crate) type Partition = (Arc<str>, i32);

/// What a settle handle needs to find its record again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) partition: Partition,
    pub(crate) generation: u64,
    pub(crate) offset: i64,
}

/// A record handed out, or waiting to be handed out again.
#[derive(Debug)]
struct Held {
    message: Message,
    deliveries: u32,
    /// `None` while a task works on it; the time it may go out again after
    /// it was given back.
    retry_at: Option<Instant>,
}

#[derive(Debug)]
struct Lane {
    generation: u64,
    queued: VecDeque<(i64, Message)>,
    held: BTreeMap<i64, Held>,
    /// One past the last offset fetched.
    fetched_to: Option<i64>,
    /// The last offset the broker confirmed committed (the next to read).
    committed: Option<i64>,
    /// Once revoked: the first record dropped unsettled, which the commit
    /// must not pass.
    cap: Option<i64>,
    paused: bool,
    /// Records were handed out since the last batch closed.
    in_batch: bool,
    /// A closed batch holds records of this lane: nothing new goes out.
    sealed: bool,
}

impl Lane {
    /// The offset that may be committed: the lowest not yet settled, or one
    /// past the last fetched when everything fetched is settled.
    fn commit_point(&self) -> Option<i64> {
        let held = self.held.keys().next().copied();
        let queued = self.queued.front().map(|(offset, _)| *offset);
        let point = match (held, queued) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (Some(a), None) | (None, Some(a)) => Some(a),
            (None, None) => self.fetched_to,
        };
        match (point, self.cap) {
            (Some(point), Some(cap)) => Some(point.min(cap)),
            (point, cap) => point.or(cap),
        }
    }

    fn working(&self) -> usize {
        self.held.values().filter(|h| h.retry_at.is_none()).count()
    }
}

/// What [`Lanes::take`] found.
#[derive(Debug)]
pub(crate) enum Take {
    /// A record to work on.
    Record(Ticket, Box<Message>),
    /// Nothing now; look again when notified, or at this time at the latest.
    Wait(Option<Instant>),
    /// The consumer failed and stopped fetching.
    Failed(String),
}

#[derive(Debug, Default)]
struct State {
    lanes: HashMap<Partition, Lane>,
    order: Vec<Partition>,
    cursor: usize,
    generation: u64,
    failed: Option<String>,
}

/// The lanes of one consumer.
#[derive(Debug)]
pub(crate) struct Lanes {
    state: Mutex<State>,
    /// Signalled when a record is settled (a revocation waits on it).
    settled: Condvar,
    /// Notified when a record may be taken.
    pub(crate) ready: tokio::sync::Notify,
    per_partition: usize,
    buffer: usize,
}

impl Lanes {
    /// Lanes that hand out `per_partition` unsettled records per partition
    /// and ask for a partition to be paused once `buffer` records wait in it.
    pub(crate) fn new(per_partition: usize, buffer: usize) -> Self {
        Self {
            state: Mutex::default(),
            settled: Condvar::new(),
            ready: tokio::sync::Notify::new(),
            per_partition: per_partition.max(1),
            buffer: buffer.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Partitions newly assigned to this consumer.
    pub(crate) fn assign(&self, partitions: impl IntoIterator<Item = Partition>) {
        let mut state = self.lock();
        state.generation += 1;
        let generation = state.generation;
        for partition in partitions {
            state.lanes.insert(
                partition.clone(),
                Lane {
                    generation,
                    queued: VecDeque::new(),
                    held: BTreeMap::new(),
                    fetched_to: None,
                    committed: None,
                    cap: None,
                    paused: false,
                    in_batch: false,
                    sealed: false,
                },
            );
        }
        state.order = state.lanes.keys().cloned().collect();
        state.order.sort();
    }

    /// A fetched record. Records of partitions not (or no longer) assigned,
    /// and records already fetched, are dropped.
    pub(crate) fn push(&self, partition: &Partition, offset: i64, message: Message) {
        let mut state = self.lock();
        let Some(lane) = state.lanes.get_mut(partition) else {
            return;
        };
        if lane.fetched_to.is_some_and(|to| offset < to) {
            return;
        }
        lane.fetched_to = Some(offset + 1);
        lane.queued.push_back((offset, message));
        drop(state);
        self.ready.notify_one();
    }

    /// The consumer can fetch no more; waiting takers are told why.
    pub(crate) fn fail(&self, why: String) {
        self.lock().failed.get_or_insert(why);
        self.ready.notify_waiters();
        self.ready.notify_one();
    }

    /// The next record to work on, taking lanes in turn.
    pub(crate) fn take(&self, now: Instant) -> Take {
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return Take::Failed(why.clone());
        }
        let count = state.order.len();
        let mut soonest: Option<Instant> = None;
        for step in 0..count {
            let index = (state.cursor + step) % count;
            let partition = state.order[index].clone();
            let Some(lane) = state.lanes.get_mut(&partition) else {
                continue;
            };
            let due = lane
                .held
                .iter()
                .find(|(_, held)| held.retry_at.is_some())
                .map(|(offset, held)| (*offset, held.retry_at.unwrap_or(now)));
            let taken = match due {
                Some((offset, at)) if at <= now => {
                    let held = lane.held.get_mut(&offset).expect("found above");
                    held.retry_at = None;
                    held.deliveries += 1;
                    let mut message = held.message.clone();
                    message.delivery_count = Some(held.deliveries);
                    Some((offset, message))
                }
                Some((_, at)) if self.per_partition == 1 => {
                    soonest = Some(soonest.map_or(at, |s| s.min(at)));
                    None
                }
                due => {
                    if let Some((_, at)) = due {
                        soonest = Some(soonest.map_or(at, |s| s.min(at)));
                    }
                    if !lane.sealed
                        && lane.held.len() < self.per_partition
                        && let Some((offset, mut message)) = lane.queued.pop_front()
                    {
                        message.delivery_count = Some(1);
                        lane.held.insert(
                            offset,
                            Held {
                                message: message.clone(),
                                deliveries: 1,
                                retry_at: None,
                            },
                        );
                        Some((offset, message))
                    } else {
                        None
                    }
                }
            };
            if let Some((offset, message)) = taken {
                let generation = lane.generation;
                lane.in_batch = true;
                // The same lane again next time, while it has records to give.
                state.cursor = index;
                return Take::Record(
                    Ticket {
                        partition,
                        generation,
                        offset,
                    },
                    Box::new(message),
                );
            }
        }
        Take::Wait(soonest)
    }

    /// The record's effect (or its dead letter) committed.
    pub(crate) fn done(&self, ticket: &Ticket) {
        let mut state = self.lock();
        if let Some(lane) = state.lanes.get_mut(&ticket.partition)
            && lane.generation == ticket.generation
        {
            lane.held.remove(&ticket.offset);
            if lane.held.is_empty() {
                lane.sealed = false;
            }
        }
        drop(state);
        self.settled.notify_all();
        self.ready.notify_one();
    }

    /// The record goes out again after `delay`, before anything later in its
    /// partition is handed out (with one record per partition at a time).
    pub(crate) fn retry(&self, ticket: &Ticket, delay: Duration) {
        let mut state = self.lock();
        if let Some(lane) = state.lanes.get_mut(&ticket.partition)
            && lane.generation == ticket.generation
            && let Some(held) = lane.held.get_mut(&ticket.offset)
        {
            held.retry_at = Some(Instant::now() + delay);
        }
        drop(state);
        self.settled.notify_all();
        self.ready.notify_one();
    }

    /// The batch being collected is closed: lanes that gave it records are
    /// sealed until those are settled.
    pub(crate) fn end_batch(&self) {
        let mut state = self.lock();
        for lane in state.lanes.values_mut() {
            if std::mem::take(&mut lane.in_batch) && !lane.held.is_empty() {
                lane.sealed = true;
            }
        }
    }

    /// The offsets to commit: for each lane whose commit point moved past
    /// what the broker confirmed.
    pub(crate) fn to_commit(&self) -> Vec<(Partition, i64)> {
        let state = self.lock();
        state
            .lanes
            .iter()
            .filter_map(|(partition, lane)| {
                let point = lane.commit_point()?;
                (lane.committed.is_none_or(|c| point > c)).then(|| (partition.clone(), point))
            })
            .collect()
    }

    /// The broker confirmed `offset` committed for `partition`.
    pub(crate) fn committed(&self, partition: &Partition, offset: i64) {
        if let Some(lane) = self.lock().lanes.get_mut(partition) {
            lane.committed = Some(lane.committed.map_or(offset, |c| c.max(offset)));
        }
    }

    /// Partitions to pause (their buffer is full) and to resume (drained to
    /// half), marked as such.
    pub(crate) fn flow(&self) -> (Vec<Partition>, Vec<Partition>) {
        let mut state = self.lock();
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (partition, lane) in &mut state.lanes {
            if !lane.paused && lane.queued.len() >= self.buffer {
                lane.paused = true;
                pause.push(partition.clone());
            } else if lane.paused && lane.queued.len() <= self.buffer / 2 {
                lane.paused = false;
                resume.push(partition.clone());
            }
        }
        (pause, resume)
    }

    /// Partitions taken away by a rebalance: nothing more is handed out from
    /// them, records waiting in them are dropped (their next owner reads them
    /// again), and the records being worked on get up to `grace` to settle.
    /// Returns the offsets to commit for them before they go; a record still
    /// unsettled after the grace keeps the commit before it.
    pub(crate) fn revoke(
        &self,
        partitions: &[Partition],
        grace: Duration,
    ) -> Vec<(Partition, i64)> {
        let deadline = Instant::now() + grace;
        let mut state = self.lock();
        for partition in partitions {
            if let Some(lane) = state.lanes.get_mut(partition) {
                lane.cap = lane.commit_point();
                lane.queued.clear();
                lane.held.retain(|_, held| held.retry_at.is_none());
            }
        }
        state.order.retain(|p| !partitions.contains(p));
        state.cursor = 0;
        loop {
            let working: usize = partitions
                .iter()
                .filter_map(|p| state.lanes.get(p))
                .map(Lane::working)
                .sum();
            let now = Instant::now();
            if working == 0 || now >= deadline {
                if working > 0 {
                    tracing::warn!(
                        working,
                        "records of revoked partitions still unsettled after the grace; their offsets are not committed, and their next owner reads them again (the store answers the ones that commit meanwhile as duplicates)"
                    );
                }
                break;
            }
            state = self
                .settled
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        let mut commits = Vec::new();
        for partition in partitions {
            if let Some(lane) = state.lanes.remove(partition)
                && let Some(point) = lane.commit_point()
                && lane.committed.is_none_or(|c| point > c)
            {
                commits.push((partition.clone(), point));
            }
        }
        commits
    }

    /// Whether any record is being worked on or waits for a retry.
    pub(crate) fn unsettled(&self) -> usize {
        self.lock().lanes.values().map(|lane| lane.held.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(n: i32) -> Partition {
        (Arc::from("orders"), n)
    }

    fn take(lanes: &Lanes) -> Option<(Ticket, Message)> {
        match lanes.take(Instant::now()) {
            Take::Record(ticket, message) => Some((ticket, *message)),
            _ => None,
        }
    }

    fn filled(per_partition: usize, offsets: &[(i32, i64)]) -> Lanes {
        let lanes = Lanes::new(per_partition, 100);
        lanes.assign([partition(0), partition(1)]);
        for (p, offset) in offsets {
            lanes.push(
                &partition(*p),
                *offset,
                Message::new(format!("{p}/{offset}")),
            );
        }
        lanes
    }

    #[test]
    fn a_partition_is_handed_out_in_order_one_record_at_a_time() {
        let lanes = filled(1, &[(0, 10), (0, 11), (1, 5)]);
        let (a, _) = take(&lanes).unwrap();
        let (b, _) = take(&lanes).unwrap();
        assert_ne!(a.partition, b.partition, "the partitions run in parallel");
        assert!(take(&lanes).is_none(), "offset 11 waits for offset 10");
        let zero = if a.partition == partition(0) { a } else { b };
        lanes.done(&zero);
        let (next, _) = take(&lanes).unwrap();
        assert_eq!(next.offset, 11);
    }

    #[test]
    fn the_commit_never_passes_an_unsettled_record() {
        let lanes = filled(3, &[(0, 10), (0, 11), (0, 12)]);
        let tickets: Vec<_> = (0..3).map(|_| take(&lanes).unwrap().0).collect();
        assert!(lanes.to_commit().contains(&(partition(0), 10)));
        lanes.done(&tickets[1]);
        lanes.done(&tickets[2]);
        assert!(
            lanes.to_commit().contains(&(partition(0), 10)),
            "10 is unsettled"
        );
        lanes.done(&tickets[0]);
        assert!(lanes.to_commit().contains(&(partition(0), 13)));
        lanes.committed(&partition(0), 13);
        assert!(lanes.to_commit().iter().all(|(p, _)| *p != partition(0)));
    }

    #[test]
    fn a_record_given_back_goes_out_again_before_the_next_one() {
        let lanes = filled(1, &[(0, 10), (0, 11)]);
        let (first, message) = take(&lanes).unwrap();
        assert_eq!(message.delivery_count, Some(1));
        lanes.retry(&first, Duration::ZERO);
        let (again, message) = take(&lanes).unwrap();
        assert_eq!(again.offset, 10);
        assert_eq!(message.delivery_count, Some(2));
        lanes.retry(&again, Duration::from_secs(60));
        assert!(
            matches!(lanes.take(Instant::now()), Take::Wait(Some(_))),
            "11 waits behind the record given back"
        );
        assert!(lanes.to_commit().contains(&(partition(0), 10)));
    }

    #[test]
    fn a_revoked_partition_hands_out_nothing_and_settles_late_records_harmlessly() {
        let lanes = filled(1, &[(0, 10), (0, 11), (1, 5)]);
        let (a, _) = take(&lanes).unwrap();
        let (b, _) = take(&lanes).unwrap();
        let (zero, one) = if a.partition == partition(0) {
            (a, b)
        } else {
            (b, a)
        };
        lanes.done(&zero);
        let commits = lanes.revoke(&[partition(0), partition(1)], Duration::from_millis(20));
        assert!(commits.contains(&(partition(0), 11)), "{commits:?}");
        assert!(
            commits.contains(&(partition(1), 5)),
            "offset 5 was still being worked on: {commits:?}"
        );
        lanes.done(&one);
        assert!(matches!(lanes.take(Instant::now()), Take::Wait(None)));
        lanes.assign([partition(1)]);
        lanes.done(&one);
        assert!(
            lanes.to_commit().is_empty(),
            "a settle from the old assignment does not touch the new lane"
        );
    }

    #[test]
    fn a_revocation_never_commits_past_a_record_waiting_for_its_retry() {
        let lanes = filled(2, &[(0, 10), (0, 11), (0, 12)]);
        let (first, _) = take(&lanes).unwrap();
        let (second, _) = take(&lanes).unwrap();
        assert_eq!((first.offset, second.offset), (10, 11));
        lanes.retry(&first, Duration::from_secs(60));
        lanes.done(&second);
        let commits = lanes.revoke(&[partition(0)], Duration::ZERO);
        assert_eq!(commits, [(partition(0), 10)]);
    }

    #[test]
    fn a_partition_in_a_closed_batch_gives_the_next_batch_nothing() {
        let lanes = filled(10, &[(0, 1), (0, 2), (0, 3), (1, 7), (1, 8)]);
        let (first, _) = take(&lanes).unwrap();
        let (second, _) = take(&lanes).unwrap();
        assert_eq!(first.partition, second.partition, "a lane is drained first");
        lanes.end_batch();
        let (other, _) = take(&lanes).unwrap();
        assert_ne!(other.partition, first.partition, "the sealed lane waits");
        let _ = take(&lanes).unwrap();
        assert!(take(&lanes).is_none(), "both lanes wait for their batches");
        lanes.end_batch();
        lanes.done(&first);
        assert!(
            take(&lanes).is_none(),
            "sealed until the whole batch settles"
        );
        lanes.done(&second);
        let (next, _) = take(&lanes).unwrap();
        assert_eq!((next.partition.clone(), next.offset), (first.partition, 3));
    }
}
