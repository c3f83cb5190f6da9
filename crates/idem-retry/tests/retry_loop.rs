//! The retry loop with its pieces put together: the key stays the same, the
//! server's hint raises the delay, a hint past the deadline stops at once, an
//! exhausted budget fails fast and is counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{IdempotencyKey, ManualClock};
use idem_retry::{
    Attempt, Backoff, BudgetSettings, DeadlineReached, ProtocolErrorPolicy, Retrier, RetryBudget,
    RetryConfig, StopReason, Verdict, VirtualTimer, observe, retry,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Ok,
    Unavailable { retry_after: Option<Duration> },
    Invalid,
}

fn classify(call: &Call) -> Verdict {
    match call {
        Call::Ok | Call::Invalid => Verdict::DontRetry,
        Call::Unavailable { retry_after: None } => Verdict::Retry,
        Call::Unavailable {
            retry_after: Some(hint),
        } => Verdict::RetryAfter(*hint),
    }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).unwrap()
}

fn seeded() -> RetryConfig {
    RetryConfig::default().with_backoff(Backoff::default().with_seed(9))
}

type TestRetrier = Retrier<fn(&Call) -> Verdict, VirtualTimer>;

fn retrier(config: RetryConfig, budget: RetryBudget) -> (TestRetrier, VirtualTimer) {
    let timer = VirtualTimer::new();
    let retrier = Retrier::new(config, Arc::new(budget), classify as fn(&Call) -> Verdict)
        .with_timer(timer.clone());
    (retrier, timer)
}

fn no_budget_at_all() -> RetryBudget {
    RetryBudget::with_clock(
        BudgetSettings {
            retry_ratio: 0.0,
            min_retries_per_second: 0,
            ..BudgetSettings::default()
        },
        Arc::new(ManualClock::new(0)),
    )
    .unwrap()
}

#[tokio::test]
async fn every_attempt_gets_the_key_given_once() {
    let (retrier, timer) = retrier(seeded(), RetryBudget::default());
    let mut keys = Vec::new();
    let outcome = retrier
        .run(key("k-1"), |key: IdempotencyKey, attempt: Attempt| {
            keys.push((attempt.number(), key));
            async move {
                if attempt.number() < 4 {
                    Call::Unavailable { retry_after: None }
                } else {
                    Call::Ok
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome, Call::Ok);
    assert_eq!(keys, (1..=4).map(|n| (n, key("k-1"))).collect::<Vec<_>>());
    let expected: Vec<Duration> = seeded().backoff.delays().take(3).collect();
    assert_eq!(timer.slept(), expected);
}

#[tokio::test]
async fn the_next_delay_is_at_least_the_servers_hint() {
    let (retrier, timer) = retrier(seeded(), RetryBudget::default());
    let hint = Duration::from_secs(5);
    let outcome = retrier
        .run(
            key("k-2"),
            |_: IdempotencyKey, attempt: Attempt| async move {
                if attempt.is_retry() {
                    Call::Ok
                } else {
                    Call::Unavailable {
                        retry_after: Some(hint),
                    }
                }
            },
        )
        .await;
    assert_eq!(outcome.unwrap(), Call::Ok);
    assert_eq!(timer.slept(), [hint]);
}

#[tokio::test]
async fn a_hint_past_the_deadline_ends_retrying_without_sleeping() {
    let config = seeded().with_deadline(Duration::from_secs(10));
    let (retrier, timer) = retrier(config, RetryBudget::default());
    let gave_up = retrier
        .run(
            key("k-3"),
            |_: IdempotencyKey, attempt: Attempt| async move {
                if attempt.is_retry() {
                    Call::Unavailable {
                        retry_after: Some(Duration::from_secs(60)),
                    }
                } else {
                    Call::Unavailable { retry_after: None }
                }
            },
        )
        .await
        .unwrap_err();
    // First attempt: jittered retry. Second: the server wants 60 s while
    // less than 10 s of the deadline is left.
    let first_delay = seeded().backoff.delays().next().unwrap();
    assert_eq!(timer.slept(), [first_delay]);
    assert_eq!(gave_up.attempts, 2);
    assert_eq!(
        gave_up.reason,
        StopReason::Deadline(DeadlineReached::HintBeyondDeadline {
            hint: Duration::from_secs(60),
            remaining: Duration::from_secs(10) - first_delay,
        })
    );
    let text = gave_up.to_string();
    assert!(text.contains("60s") && text.contains("left"), "{text}");
}

#[tokio::test]
async fn a_non_retryable_outcome_is_returned_after_one_attempt() {
    let (retrier, timer) = retrier(seeded(), RetryBudget::default());
    let outcome = retrier
        .run(key("k-4"), |_: IdempotencyKey, _| async { Call::Invalid })
        .await;
    assert_eq!(outcome.unwrap(), Call::Invalid);
    assert!(timer.slept().is_empty());
}

#[test]
fn an_exhausted_budget_fails_fast_and_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let attempts = AtomicU32::new(0);

    let gave_up = metrics::with_local_recorder(&recorder, || {
        let (retrier, timer) = retrier(seeded(), no_budget_at_all());
        let outcome =
            futures::executor::block_on(retrier.run(key("k-5"), |_: IdempotencyKey, _| {
                attempts.fetch_add(1, Ordering::Relaxed);
                async { Call::Unavailable { retry_after: None } }
            }));
        assert!(timer.slept().is_empty(), "failed fast: no sleep");
        outcome.unwrap_err()
    });

    assert_eq!(attempts.load(Ordering::Relaxed), 1);
    assert_eq!(gave_up.attempts, 1);
    assert!(matches!(gave_up.reason, StopReason::BudgetExhausted(_)));
    assert_eq!(gave_up.last, Call::Unavailable { retry_after: None });

    let counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .collect();
    let count = |name: &str| {
        counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    };
    assert_eq!(count(observe::RETRY_BUDGET_EXHAUSTED_TOTAL), 1);
    assert_eq!(count(observe::REQUESTS_TOTAL), 1);
    assert_eq!(count(observe::RETRIES_TOTAL), 0);
}

#[test]
fn retries_and_requests_are_counted_for_the_retry_ratio() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let (retrier, _) = retrier(seeded(), RetryBudget::default());
        for n in 0..3 {
            let outcome = futures::executor::block_on(retrier.run(
                key(&format!("k-6-{n}")),
                |_: IdempotencyKey, attempt: Attempt| async move {
                    if attempt.number() < 3 {
                        Call::Unavailable { retry_after: None }
                    } else {
                        Call::Ok
                    }
                },
            ));
            assert_eq!(outcome.unwrap(), Call::Ok);
        }
    });
    let mut counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .collect();
    counters.sort();
    assert_eq!(
        counters,
        [
            ("requests_total".to_owned(), 3),
            ("retries_total".to_owned(), 6)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_fallible_helper_retries_protocol_errors_and_keeps_the_last_one() {
    use idem_core::{Error, ErrorKind, Scope, StoreError};

    let config = RetryConfig::default().with_backoff(Backoff::default().with_max_attempts(3));
    let budget = RetryBudget::default();
    let started = tokio::time::Instant::now();

    // Busy twice, then in flight: all retryable; three attempts allowed.
    let error = retry::<(), _, _, _, _>(
        &config,
        &budget,
        &ProtocolErrorPolicy,
        key("k-7"),
        |key: IdempotencyKey, attempt: Attempt| async move {
            if attempt.number() < 3 {
                Err(Error::Store(StoreError::new(ErrorKind::Busy, "locked")))
            } else {
                Err(Error::InFlight {
                    scope: Scope::new("payments").unwrap(),
                    key,
                    retry_after: Duration::from_secs(1),
                })
            }
        },
    )
    .await
    .unwrap_err();

    assert_eq!(error.attempts, 3);
    assert_eq!(
        error.reason,
        StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert!(matches!(error.last, Error::InFlight { .. }));
    // Two jittered waits, at most 200 ms + 400 ms, on tokio's (paused) clock.
    assert!(started.elapsed() <= Duration::from_millis(602));

    // A key reused with another payload is not retried.
    let error = retry::<(), _, _, _, _>(
        &config,
        &budget,
        &ProtocolErrorPolicy,
        key("k-8"),
        |key: IdempotencyKey, _| async move {
            Err(Error::KeyReuse {
                scope: Scope::new("payments").unwrap(),
                key,
            })
        },
    )
    .await
    .unwrap_err();
    assert_eq!(
        (error.attempts, error.reason),
        (1, StopReason::NotRetryable)
    );
}

#[tokio::test]
async fn a_call_can_run_in_a_spawned_task() {
    let (retrier, timer) = retrier(seeded(), RetryBudget::default());
    let task = tokio::spawn(async move {
        let mut failures_left = 2u32;
        retrier
            .run(key("k-9"), |_: IdempotencyKey, _| {
                let fail = failures_left > 0;
                failures_left -= u32::from(fail);
                async move {
                    tokio::task::yield_now().await;
                    if fail {
                        Call::Unavailable { retry_after: None }
                    } else {
                        Call::Ok
                    }
                }
            })
            .await
    });
    assert_eq!(task.await.unwrap().unwrap(), Call::Ok);
    assert_eq!(timer.slept().len(), 2);
}
