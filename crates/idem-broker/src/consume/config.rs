//! [`ConsumerConfig`]: everything the runtime decides by, and its defaults
//! (dead-letter after 5 attempts).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{FingerprintRule, Scope};
use idem_retry::{Backoff, RetryBudget};
use idem_trace::KeyInSpans;

use super::key::KeyRule;

/// The default number of attempts before a message is dead-lettered: 5.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The default number of messages worked on at once in single mode: 8.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The default batch size in batch mode: 100.
pub const DEFAULT_BATCH: usize = 100;
/// The default number of batches applied at once in batch mode: 4.
pub const DEFAULT_BATCHES_AT_ONCE: usize = 4;

/// A named point in the runtime where a fault-injection test may stop the
/// process, to show that a crash there neither loses a message nor applies it
/// twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Checkpoint {
    /// The effect and its record committed; the ack has not been sent.
    AfterCommit,
}

type CheckpointHook = Arc<dyn Fn(Checkpoint) + Send + Sync>;

/// How a consumer runs.
///
/// ```
/// use std::time::Duration;
/// use idem::Scope;
/// use idem_broker::consume::{ConsumerConfig, KeyRule, KeySource};
///
/// let config = ConsumerConfig::new(Scope::new("billing").unwrap())
///     .key(KeyRule::new(KeySource::Header("x-event-id".into())))
///     .max_attempts(3)
///     .concurrency(16)
///     .batch(200, Duration::from_millis(20));
/// assert_eq!(config.max_attempts_value(), 3);
/// ```
#[derive(Clone)]
pub struct ConsumerConfig {
    pub(crate) scope: Scope,
    pub(crate) key: KeyRule,
    pub(crate) max_attempts: u32,
    pub(crate) concurrency: usize,
    pub(crate) batch: usize,
    pub(crate) batch_linger: Duration,
    pub(crate) batches_at_once: usize,
    pub(crate) redelivery: Backoff,
    pub(crate) in_flight_patience: Duration,
    pub(crate) dead_letter_terminal_failures: bool,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    pub(crate) checkpoint: Option<CheckpointHook>,
    pub(crate) producer_horizon: Option<Duration>,
    pub(crate) replays_beyond_window: bool,
    pub(crate) manual_replay_allowance: Option<Duration>,
    pub(crate) key_in_spans: KeyInSpans,
    pub(crate) watchdog: Option<Duration>,
    pub(crate) fingerprint: FingerprintRule,
}

impl fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("max_attempts", &self.max_attempts)
            .field("concurrency", &self.concurrency)
            .field("batch", &self.batch)
            .field("batch_linger", &self.batch_linger)
            .field("batches_at_once", &self.batches_at_once)
            .field("redelivery", &self.redelivery)
            .field("in_flight_patience", &self.in_flight_patience)
            .field(
                "dead_letter_terminal_failures",
                &self.dead_letter_terminal_failures,
            )
            .field("budget", &self.budget.is_some())
            .field("checkpoint", &self.checkpoint.is_some())
            .field("producer_horizon", &self.producer_horizon)
            .field("replays_beyond_window", &self.replays_beyond_window)
            .field("manual_replay_allowance", &self.manual_replay_allowance)
            .field("key_in_spans", &self.key_in_spans)
            .field("watchdog", &self.watchdog)
            .field("fingerprint", &self.fingerprint.to_string())
            .finish()
    }
}

impl ConsumerConfig {
    /// The defaults, applying in `scope`: keys from the message id (keyless
    /// messages dead-lettered), dead letter after 5 attempts, 8 messages at
    /// once, batches of 100 closed after 10 ms of quiet (4 applied at once),
    /// redelivery delays
    /// with full jitter from 200 ms up to 20 s.
    pub fn new(scope: Scope) -> Self {
        Self {
            scope,
            key: KeyRule::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            concurrency: DEFAULT_CONCURRENCY,
            batch: DEFAULT_BATCH,
            batch_linger: Duration::from_millis(10),
            batches_at_once: DEFAULT_BATCHES_AT_ONCE,
            redelivery: Backoff::default(),
            in_flight_patience: Duration::from_secs(30),
            dead_letter_terminal_failures: false,
            budget: None,
            checkpoint: None,
            producer_horizon: None,
            replays_beyond_window: false,
            manual_replay_allowance: None,
            key_in_spans: KeyInSpans::Raw,
            watchdog: None,
            fingerprint: FingerprintRule::default(),
        }
    }

    /// Where keys come from.
    pub fn key(mut self, rule: KeyRule) -> Self {
        self.key = rule;
        self
    }

    /// Attempts before a message is dead-lettered (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The attempt limit.
    pub fn max_attempts_value(&self) -> u32 {
        self.max_attempts
    }

    /// Messages worked on at once in single mode (at least 1). The broker's
    /// prefetch should be at least this.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Batch mode: at most `size` messages per transaction; a batch is closed
    /// early when no message arrives for `linger`.
    pub fn batch(mut self, size: usize, linger: Duration) -> Self {
        self.batch = size.max(1);
        self.batch_linger = linger;
        self
    }

    /// Batch mode: how many batches are applied at once (at least 1; default
    /// 4). Their acks still go out in the order the batches were received, so
    /// a cumulative ack never covers a delivery that is not settled yet.
    pub fn batches_at_once(mut self, batches: usize) -> Self {
        self.batches_at_once = batches.max(1);
        self
    }

    /// The delays before a failed message is redelivered: retry `k` waits a
    /// full-jitter draw from `[0, min(cap, base·2^k)]`. Only base and cap are
    /// used; the attempt limit is [`max_attempts`](Self::max_attempts).
    pub fn redelivery(mut self, backoff: Backoff) -> Self {
        self.redelivery = backoff;
        self
    }

    /// How long a message whose key another consumer holds right now (a
    /// duplicate being applied concurrently) is retried locally before it is
    /// given back to the broker. Such waits are not failed attempts.
    pub fn in_flight_patience(mut self, patience: Duration) -> Self {
        self.in_flight_patience = patience;
        self
    }

    /// Whether a stored terminal failure (an effect that returned
    /// [`Outcome::terminal_failure`](idem_core::Outcome::terminal_failure), a
    /// 4xx from the sidecar's endpoint) is also recorded as a dead letter
    /// before the ack. Off by default: the failure is the message's answer.
    pub fn dead_letter_terminal_failures(mut self, yes: bool) -> Self {
        self.dead_letter_terminal_failures = yes;
        self
    }

    /// A retry budget shared with the rest of the process: each message
    /// counts as a request and each redelivery of a failure as a retry. When
    /// the budget is spent, failed messages are still given back (nothing is
    /// dropped) but with the backoff's longest delay.
    pub fn retry_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The longest a producer may send a message again after it first sent
    /// it: a relay's [`RelayConfig::retry_horizon`](crate::relay::RelayConfig::retry_horizon),
    /// a publisher's retry deadline. At start-up the consumer refuses to run
    /// ([`ConsumeError::WindowTooShort`](super::ConsumeError::WindowTooShort))
    /// if its dedupe window, the store's retention, is shorter: a copy sent
    /// after the window closed would be applied again. Not checked unless
    /// given. The check is necessary, not sufficient: a copy is applied when
    /// it is consumed, so add the longest backlog the queue may hold to the
    /// producer's own horizon.
    pub fn producer_horizon(mut self, horizon: Duration) -> Self {
        self.producer_horizon = Some(horizon);
        self
    }

    /// Runs even when the broker keeps records longer than the dedupe window
    /// (a Kafka topic's retention): the caller's promise that nobody replays
    /// records older than the window (an offset reset to the earliest, a new
    /// consumer group with this scope). Without it the consumer refuses to
    /// start ([`ConsumeError::ReplayBeyondWindow`](super::ConsumeError::ReplayBeyondWindow)).
    pub fn allow_replays_beyond_window(mut self, allow: bool) -> Self {
        self.replays_beyond_window = allow;
        self
    }

    /// How far back an operator may re-publish or rewind messages during an
    /// incident (a replay from a backup, an offset reset by a few days). The
    /// dedupe window must cover it, like the producer's horizon: at start-up
    /// the consumer refuses to run
    /// ([`ConsumeError::WindowTooShort`](super::ConsumeError::WindowTooShort))
    /// if the store's retention is shorter. Not checked unless given.
    pub fn manual_replay_allowance(mut self, allowance: Duration) -> Self {
        self.manual_replay_allowance = Some(allowance);
        self
    }

    /// How the key appears in the `consume` span: as it is (the default) or
    /// hashed.
    pub fn key_in_spans(mut self, shown: KeyInSpans) -> Self {
        self.key_in_spans = shown;
        self
    }

    /// Restarts the consumer when it holds deliveries and none was settled
    /// (nor a new one received) for `after`: an effect that hangs, a broker
    /// that stopped answering acks. The deliveries in hand are dropped
    /// unsettled, the transport's connection is replaced
    /// ([`Transport::restart`](super::Transport::restart)), and the broker
    /// delivers them again; the store answers those whose effects committed.
    /// A transport that cannot restart stops the consumer with
    /// [`ConsumeError::Stalled`](super::ConsumeError::Stalled). Off by
    /// default; choose `after` well above the longest an effect may take.
    pub fn watchdog(mut self, after: Duration) -> Self {
        self.watchdog = Some(after);
        self
    }

    /// What a message's fingerprint covers: the whole payload (the default),
    /// selected JSON fields or the payload less some, and chosen headers
    /// (looked up without regard to case). A copy whose covered parts differ
    /// from the first one's is key reuse (dead-lettered); a record
    /// fingerprinted under another rule (the rule changed since) is answered
    /// as a duplicate, logged and counted. The same text as `idem serve`'s
    /// `--fingerprint`, `--fingerprint-ignore` and `--fingerprint-header`:
    ///
    /// ```
    /// use idem::{FingerprintRule, Scope};
    /// use idem_broker::consume::ConsumerConfig;
    ///
    /// let config = ConsumerConfig::new(Scope::new("billing").unwrap())
    ///     .fingerprint(FingerprintRule::default().ignore("json:/sent_at,/trace_id")?);
    /// assert_eq!(config.fingerprint_rule().to_string(), "ignore json:/sent_at,/trace_id");
    /// # Ok::<(), idem::FingerprintRuleError>(())
    /// ```
    pub fn fingerprint(mut self, rule: FingerprintRule) -> Self {
        self.fingerprint = rule;
        self
    }

    /// What a message's fingerprint covers.
    pub fn fingerprint_rule(&self) -> &FingerprintRule {
        &self.fingerprint
    }

    /// Calls `hook` at each [`Checkpoint`]. For fault-injection tests.
    pub fn checkpoint(mut self, hook: impl Fn(Checkpoint) + Send + Sync + 'static) -> Self {
        self.checkpoint = Some(Arc::new(hook));
        self
    }

    /// The scope messages are applied in.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}
