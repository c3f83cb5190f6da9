//! The clients of a trial: each takes the next operation, sends it through
//! the gateway with its key, retries under the same key until it gets an
//! answer that settles it (bounded in attempts and time), and writes every
//! attempt and its outcome to the history. After an `ok`, an operation is
//! sometimes sent once more on purpose: that copy should be a replay.

use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::Fingerprint;
use idem_check::history::{Answer, Event, Request, Writer};
use rand::Rng;

use super::gateway_process::Address;
use super::now_ms;

/// Attempts per operation, at most.
const ATTEMPTS: u32 = 20;
/// How long one attempt may take before its outcome is unknown.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one operation may take over all its attempts.
const OPERATION_DEADLINE: Duration = Duration::from_secs(25);
/// The share of acknowledged operations sent once more on purpose.
const DUPLICATE_SHARE: f64 = 0.25;

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// 2xx.
    Ok,
    /// 4xx, or nothing sent.
    Fail,
    /// 5xx, timeout, reset after sending.
    Unknown,
}

/// One attempt, for the plots.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// When it was sent, ms since the Unix epoch.
    pub start_ms: i64,
    /// When it ended.
    pub end_ms: i64,
    /// How.
    pub outcome: Outcome,
}

/// What the clients of one trial share.
pub(super) struct Load {
    /// The key prefix, unique to the trial.
    pub tag: String,
    /// Operations to run.
    pub ops: u64,
    /// The gateway's current address.
    pub addr: Address,
    /// Operations finished so far (copies not counted).
    pub done: AtomicUsize,
    /// The next operation number; copies take numbers after `ops`.
    next: AtomicU64,
    next_copy: AtomicU64,
    history: Mutex<Writer<File>>,
    samples: Mutex<Vec<Sample>>,
    http: Client<HttpConnector, Full<Bytes>>,
    deadline: Instant,
}

impl Load {
    /// A load of `ops` operations writing its history to `history`, that
    /// starts no operation after `deadline`.
    pub(super) fn new(
        tag: String,
        ops: u64,
        addr: Address,
        history: File,
        deadline: Instant,
    ) -> Arc<Self> {
        // No pooled connections: each attempt connects anew, so a gateway
        // that is down refuses the connection (nothing sent) instead of a
        // stale connection failing after the request was written.
        let http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
        Arc::new(Self {
            tag,
            ops,
            addr,
            done: AtomicUsize::new(0),
            next: AtomicU64::new(1),
            next_copy: AtomicU64::new(ops + 1),
            history: Mutex::new(Writer::new(history)),
            samples: Mutex::new(Vec::new()),
            http,
            deadline,
        })
    }

    /// The attempts made so far.
    pub(super) fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn record(&self, event: &Event) {
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        // A history that cannot be written fails the trial when it is read.
        let _ = history.write(event);
    }

    /// Runs one client until the operations run out.
    pub(super) async fn client(self: Arc<Self>, process: String) {
        loop {
            let op = self.next.fetch_add(1, Ordering::SeqCst);
            if op > self.ops || Instant::now() > self.deadline {
                return;
            }
            let acked = self.operation(&process, op, op, None).await;
            if acked && rand::rng().random_bool(DUPLICATE_SHARE) {
                let copy = self.next_copy.fetch_add(1, Ordering::SeqCst);
                self.operation(&process, copy, op, Some(op)).await;
            }
            self.done.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Sends operation `op` (the payload of operation `payload`) until it is
    /// settled; whether it was acknowledged.
    async fn operation(
        &self,
        process: &str,
        op: u64,
        payload: u64,
        duplicate_of: Option<u64>,
    ) -> bool {
        let key = format!("{}-{payload}", self.tag);
        let body = Bytes::from(format!("{{\"amount\":{payload}}}"));
        let fingerprint = Fingerprint::of_bytes(&body).to_hex();
        let started = Instant::now();
        for attempt in 0..ATTEMPTS {
            self.record(&Event::Invoke {
                op,
                process: process.to_owned(),
                at_ms: now_ms(),
                scope: None,
                key: Some(key.clone()),
                fingerprint: Some(fingerprint.clone()),
                request: Some(Request {
                    method: "POST".into(),
                    path: "/pay".into(),
                }),
                duplicate_of,
            });
            let start_ms = now_ms();
            let (event, outcome, wait) = self.attempt(process, op, &key, body.clone()).await;
            self.record(&event);
            self.samples
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Sample {
                    start_ms,
                    end_ms: now_ms(),
                    outcome,
                });
            let settled = match &event {
                Event::Ok { .. } => return true,
                // A 409 means the key is in flight or leased: try again.
                Event::Fail {
                    answer: Some(answer),
                    ..
                } => answer.status != 409,
                _ => false,
            };
            if settled || started.elapsed() > OPERATION_DEADLINE {
                return false;
            }
            let backoff = Duration::from_millis(50 * 2u64.pow(attempt.min(4)));
            let jitter = rand::rng().random_range(0.5..1.5);
            let pause = wait
                .unwrap_or(backoff)
                .min(Duration::from_secs(1))
                .mul_f64(jitter);
            tokio::time::sleep(pause).await;
        }
        false
    }

    /// One attempt: the event that records its outcome, the outcome, and the
    /// pause the answer asked for (`Retry-After`).
    async fn attempt(
        &self,
        process: &str,
        op: u64,
        key: &str,
        body: Bytes,
    ) -> (Event, Outcome, Option<Duration>) {
        let addr = *self.addr.lock().unwrap_or_else(|p| p.into_inner());
        let request = http::Request::post(format!("http://{addr}/pay"))
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .expect("a valid request");
        let process = process.to_owned();
        let sent = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
            let response = self.http.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            anyhow::Ok((parts, body))
        })
        .await;
        let at_ms = now_ms();
        let (parts, body) = match sent {
            Err(_) => {
                let error = "timed out".to_owned();
                return (
                    Event::Unknown {
                        op,
                        process,
                        at_ms,
                        error,
                    },
                    Outcome::Unknown,
                    None,
                );
            }
            Ok(Err(error)) => {
                let connect = error
                    .downcast_ref::<hyper_util::client::legacy::Error>()
                    .is_some_and(|error| error.is_connect());
                return if connect {
                    let error = "connection refused: nothing sent".to_owned();
                    let event = Event::Fail {
                        op,
                        process,
                        at_ms,
                        answer: None,
                        error,
                    };
                    (event, Outcome::Fail, None)
                } else {
                    let error = format!("no answer: {error:#}");
                    (
                        Event::Unknown {
                            op,
                            process,
                            at_ms,
                            error,
                        },
                        Outcome::Unknown,
                        None,
                    )
                };
            }
            Ok(Ok(answer)) => answer,
        };
        let status = parts.status.as_u16();
        let answer = Answer {
            status,
            body_hash: Some(Fingerprint::of_bytes(&body).to_hex()),
            replayed: parts
                .headers
                .get("idempotent-replayed")
                .is_some_and(|value| value == "true"),
        };
        let retry_after = parts
            .headers
            .get("retry-after")
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
            .map(Duration::from_secs);
        match status {
            200..=299 => (
                Event::Ok {
                    op,
                    process,
                    at_ms,
                    answer,
                },
                Outcome::Ok,
                None,
            ),
            400..=499 => {
                let error = format!("answered {status}");
                let event = Event::Fail {
                    op,
                    process,
                    at_ms,
                    answer: Some(answer),
                    error,
                };
                (event, Outcome::Fail, retry_after)
            }
            _ => {
                let error = format!("answered {status}");
                (
                    Event::Unknown {
                        op,
                        process,
                        at_ms,
                        error,
                    },
                    Outcome::Unknown,
                    retry_after,
                )
            }
        }
    }
}
