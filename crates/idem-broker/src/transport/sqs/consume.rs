//! Amazon SQS through the official SDK: long polling, the visibility timeout
//! as the lease, and a message deleted only after its commit.
//!
//! A received message is hidden from other consumers for the visibility
//! timeout only. While a delivery is in hand (applied, waiting for its
//! turn, or waiting to be settled) its visibility is extended every half
//! timeout (`ChangeMessageVisibility`); an extension that fails stops the
//! consumer, since SQS will hand the message to another one, whose copy the
//! record then answers. The message is deleted (`DeleteMessage`, or
//! `DeleteMessageBatch` for a batch's deliveries) only after its effect and
//! record committed; a crash between the two leaves it in the queue and its
//! redelivery is answered from the store. A failed message is given back by
//! setting its visibility to the redelivery delay.
//!
//! FIFO queues: SQS hands out nothing more of a `MessageGroupId` while one of
//! its messages is in flight, but one receive may return several messages of
//! a group. They are handed to the runtime one at a time, each after the one
//! before it was settled; other groups go on in parallel. A message of a
//! group given back returns the messages of its group held behind it, so SQS
//! delivers the group again in its order.
//!
//! What the runtime sees: the `idempotency-key` message attribute as the
//! message id (else a FIFO message's `MessageDeduplicationId`), every string
//! attribute as a header (with `MessageDeduplicationId` and `MessageGroupId`
//! on FIFO queues), `ApproximateReceiveCount` as the delivery count,
//! `SentTimestamp` as the publish time, and `QUEUE/MESSAGE-ID` as the
//! coordinates (stable across redeliveries of one send; two sends of the
//! same intent get two message ids).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use idem_core::redact_url;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::connect::{self, Failure, FailureKind};
use super::{KEY_ATTRIBUTE, SqsUrl};
use crate::consume::{
    BrokerHorizon, Delivery, DeliveryLimit, Message, Route, Settle, Transport, TransportError,
    TransportErrorKind,
};

/// The longest visibility timeout SQS accepts (12 hours).
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// How the queue is consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqsOptions {
    /// How long a received message stays hidden (default 30 s; whole
    /// seconds, at least 1). Asked for on every receive, whatever the queue's
    /// own default.
    pub visibility: Duration,
    /// Whether a delivery still in hand has its visibility extended before
    /// it lapses (default on). Off, a message whose effect outlasts the
    /// visibility is handed to another consumer, and its copy is answered
    /// from the record or waits for the first one's commit.
    pub extend: bool,
    /// How long a receive waits for messages (long polling; default and
    /// at most 20 s).
    pub wait: Duration,
    /// Messages asked for per receive, 1 to 10 (default 10).
    pub max_messages: u8,
}

impl Default for SqsOptions {
    fn default() -> Self {
        Self {
            visibility: Duration::from_secs(30),
            extend: true,
            wait: connect::MAX_WAIT,
            max_messages: 10,
        }
    }
}

impl SqsOptions {
    fn visibility_secs(&self) -> i32 {
        secs(
            self.visibility
                .clamp(Duration::from_secs(1), MAX_VISIBILITY),
        )
    }

    /// These options with the URL's query over them: `visibility=30s`,
    /// `wait=20s`, `extend=false`, `max_messages=10`.
    fn with_query(mut self, query: &[(String, String)]) -> Result<Self, String> {
        let duration = |name: &str, value: &str| {
            humantime::parse_duration(value)
                .map_err(|e| format!("{name}={value:?} is not a duration (30s, 2m): {e}"))
        };
        for (name, value) in query {
            match name.as_str() {
                "visibility" => self.visibility = duration(name, value)?,
                "wait" => self.wait = duration(name, value)?,
                "extend" => {
                    self.extend = value.parse().map_err(|_| {
                        format!("extend={value:?}: write extend=true or extend=false")
                    })?;
                }
                "max_messages" => {
                    self.max_messages = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=10).contains(n))
                        .ok_or_else(|| format!("max_messages={value:?}: 1 to 10"))?;
                }
                other => {
                    return Err(format!(
                        "unknown option {other:?}: an SQS source takes region=, visibility=, wait=, extend= and max_messages="
                    ));
                }
            }
        }
        Ok(self)
    }
}

/// Checks an SQS source's URL and options, for parsing a source whatever the
/// features.
pub(crate) fn check_source(url: &str) -> Result<(), String> {
    let parsed = SqsUrl::parse(url)?;
    SqsOptions::default().with_query(&parsed.query).map(|_| ())
}

/// A queue's consumer.
pub struct SqsTransport {
    queue: Arc<Queue>,
    options: SqsOptions,
    /// Received, not handed out yet (on a FIFO queue, behind an earlier
    /// message of their group).
    held: VecDeque<Delivery<SqsSettle>>,
    /// The receive under way: kept across calls, so a receive the runtime
    /// abandons loses nothing.
    polling: Option<JoinHandle<Result<Vec<aws_sdk_sqs::types::Message>, Failure>>>,
    route: Route,
    horizon: Option<BrokerHorizon>,
    limit: Option<DeliveryLimit>,
}

impl fmt::Debug for SqsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsTransport")
            .field("route", &self.route)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the transport and its settle handles share.
struct Queue {
    client: connect::Client,
    name: String,
    fifo: bool,
    visibility: i32,
    /// FIFO groups with a delivery handed out and not settled.
    busy: Mutex<HashSet<String>>,
    /// FIFO groups whose held messages must go back (one was given back).
    returned: Mutex<HashSet<String>>,
    /// Why the consumer must stop (a visibility extension failed).
    lost: Mutex<Option<String>>,
    /// A group freed or the consumer lost.
    changed: Notify,
}

impl Queue {
    fn lose(&self, why: String) {
        let mut lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        if lost.is_none() {
            *lost = Some(why);
        }
        drop(lost);
        self.changed.notify_one();
    }

    fn free(&self, group: &str, returned: bool) {
        if returned {
            self.returned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(group.to_owned());
        }
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(group);
        self.changed.notify_one();
    }

    async fn change_visibility(&self, receipt: &str, seconds: i32) -> Result<(), Failure> {
        self.client
            .sdk
            .change_message_visibility()
            .queue_url(&self.client.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(seconds)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| connect::sort(&e, "change a message's visibility"))
    }
}

/// Settles one SQS message: deletes it, or sets its visibility so it comes
/// back after the delay.
pub struct SqsSettle {
    queue: Arc<Queue>,
    receipt: String,
    group: Option<String>,
    /// Set once settled or handed back: the keeper stops, a failure of its
    /// last extension is not reported.
    settled: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
    handed_out: AtomicBool,
}

impl fmt::Debug for SqsSettle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSettle")
            .field("queue", &self.queue.name)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl SqsSettle {
    fn stop_keeping(&self) {
        self.settled.store(true, Ordering::Release);
        if let Some(keeper) = &self.keeper {
            keeper.abort();
        }
    }

    fn free_group(&self, returned: bool) {
        if let Some(group) = &self.group
            && self.handed_out.swap(false, Ordering::AcqRel)
        {
            self.queue.free(group, returned);
        }
    }
}

impl Drop for SqsSettle {
    fn drop(&mut self) {
        let unsettled = !self.settled.swap(true, Ordering::AcqRel);
        if let Some(keeper) = &self.keeper {
            keeper.abort();
        }
        // A delivery dropped unsettled (the consumer stopped, a watchdog
        // restart) comes back when its visibility lapses; its group's later
        // messages must not overtake it.
        self.free_group(unsettled);
    }
}

impl Settle for SqsSettle {
    async fn ack(&self) -> Result<(), TransportError> {
        self.stop_keeping();
        let deleted = self
            .queue
            .client
            .sdk
            .delete_message()
            .queue_url(&self.queue.client.queue_url)
            .receipt_handle(&self.receipt)
            .send()
            .await
            .map_err(|e| connect::sort(&e, "delete the message (DeleteMessage)"));
        let result = match deleted {
            Ok(_) => Ok(()),
            Err(failure) if failure.kind == FailureKind::Unavailable => {
                Err(transport_error(failure, "delete the message"))
            }
            Err(failure) => {
                // An expired receipt handle: the message is visible again or
                // with another consumer, and its record answers that copy.
                tracing::warn!(%failure, "the message could not be deleted; its redelivery will be answered from the record");
                Ok(())
            }
        };
        self.free_group(false);
        result
    }

    async fn requeue(&self, delay: Duration) -> Result<(), TransportError> {
        self.stop_keeping();
        let seconds = secs(delay.min(MAX_VISIBILITY));
        let result = self
            .queue
            .change_visibility(&self.receipt, seconds)
            .await
            .map_err(|failure| transport_error(failure, "give the message back"));
        self.free_group(true);
        result
    }

    /// Deletes with `DeleteMessageBatch`, ten at a time.
    async fn ack_all(settles: Vec<Self>) -> Result<(), TransportError> {
        for chunk in settles.chunks(10) {
            let Some(first) = chunk.first() else { continue };
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, settle)| {
                    settle.stop_keeping();
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&settle.receipt)
                        .build()
                        .expect("id and receipt handle are set")
                })
                .collect::<Vec<_>>();
            let answer = first
                .queue
                .client
                .sdk
                .delete_message_batch()
                .queue_url(&first.queue.client.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| {
                    transport_error(
                        connect::sort(&e, "delete the messages (DeleteMessageBatch)"),
                        "delete the batch's messages",
                    )
                })?;
            for failed in answer.failed() {
                tracing::warn!(
                    code = failed.code(),
                    message = failed.message().unwrap_or_default(),
                    "a message could not be deleted; its redelivery will be answered from the record"
                );
            }
            for settle in chunk {
                settle.free_group(false);
            }
        }
        Ok(())
    }
}

impl SqsTransport {
    /// Connects to the queue `url` names
    /// (`sqs://[KEY:SECRET@][HOST[:PORT]]/[ACCOUNT/]QUEUE[?region=REGION]`,
    /// `sqs+http://` for an emulator over plain HTTP; the query may set
    /// `visibility=`, `wait=`, `extend=` and `max_messages=` over `options`)
    /// and reads its settings:
    /// its retention (a term of the window check), its redrive policy (a
    /// `maxReceiveCount` below the consumer's attempts is warned about), and
    /// whether it is a FIFO queue.
    pub async fn connect(url: &str, options: SqsOptions) -> Result<Self, TransportError> {
        let parsed = SqsUrl::parse(url)
            .and_then(|parsed| {
                let options = options.with_query(&parsed.query)?;
                Ok((parsed, options))
            })
            .map_err(|why| {
                TransportError::of(
                    TransportErrorKind::Config,
                    format!("read the SQS URL {}", redact_url(url)),
                    why,
                )
            });
        let (parsed, options) = parsed?;
        let wait = options.wait.min(connect::MAX_WAIT);
        let client = parsed
            .client(wait + Duration::from_secs(10))
            .await
            .map_err(|failure| transport_error(failure, "connect to SQS"))?;
        let attributes = client
            .sdk
            .get_queue_attributes()
            .queue_url(&client.queue_url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| {
                transport_error(
                    connect::sort(&e, &format!("read queue {:?}'s attributes", parsed.queue)),
                    "connect to SQS",
                )
            })?;
        let attributes = attributes.attributes.unwrap_or_default();
        let fifo = attributes
            .get(&QueueAttributeName::FifoQueue)
            .is_some_and(|v| v == "true")
            || parsed.fifo();
        let horizon = attributes
            .get(&QueueAttributeName::MessageRetentionPeriod)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|seconds| BrokerHorizon {
                keeps: Some(Duration::from_secs(seconds)),
                origin: format!("queue {} (MessageRetentionPeriod)", parsed.queue),
            });
        let limit = attributes
            .get(&QueueAttributeName::RedrivePolicy)
            .and_then(|policy| serde_json::from_str::<serde_json::Value>(policy).ok())
            .and_then(|policy| {
                let count = &policy["maxReceiveCount"];
                count
                    .as_u64()
                    .or_else(|| count.as_str().and_then(|s| s.parse().ok()))
            })
            .map(|count| DeliveryLimit {
                deliveries: u32::try_from(count).unwrap_or(u32::MAX),
                origin: format!(
                    "queue {}'s redrive policy (maxReceiveCount; then SQS moves the message to its dead-letter queue)",
                    parsed.queue
                ),
            });
        let origin = redact_url(url);
        let queue = Arc::new(Queue {
            client,
            name: parsed.queue.clone(),
            fifo,
            visibility: options.visibility_secs(),
            busy: Mutex::default(),
            returned: Mutex::default(),
            lost: Mutex::default(),
            changed: Notify::new(),
        });
        Ok(Self {
            queue,
            options: SqsOptions { wait, ..options },
            held: VecDeque::new(),
            polling: None,
            route: Route::fixed(origin, sqs_destination(url)),
            horizon,
            limit,
        })
    }

    /// Whether the queue is a FIFO queue.
    pub fn fifo(&self) -> bool {
        self.queue.fifo
    }

    fn start_polling(&self) -> JoinHandle<Result<Vec<aws_sdk_sqs::types::Message>, Failure>> {
        let queue = Arc::clone(&self.queue);
        let options = self.options;
        tokio::spawn(async move {
            queue
                .client
                .sdk
                .receive_message()
                .queue_url(&queue.client.queue_url)
                .max_number_of_messages(i32::from(options.max_messages.clamp(1, 10)))
                .wait_time_seconds(secs(options.wait))
                .visibility_timeout(queue.visibility)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map(|answer| answer.messages.unwrap_or_default())
                .map_err(|e| connect::sort(&e, "receive messages (ReceiveMessage)"))
        })
    }

    /// The first held delivery whose group is free, marked busy.
    fn next_ready(&mut self) -> Option<Delivery<SqsSettle>> {
        let returned: HashSet<String> = std::mem::take(
            &mut *self
                .queue
                .returned
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        if !returned.is_empty() {
            // Held behind a message given back: back to the queue, so SQS
            // hands the group out again in its order.
            let (back, keep): (Vec<_>, Vec<_>) = self.held.drain(..).partition(|d| {
                d.settle
                    .group
                    .as_ref()
                    .is_some_and(|g| returned.contains(g))
            });
            self.held = keep.into();
            for delivery in back {
                let settle = delivery.settle;
                settle.stop_keeping();
                tokio::spawn(async move {
                    if let Err(failure) = settle.queue.change_visibility(&settle.receipt, 0).await {
                        tracing::debug!(%failure, "a held message could not be made visible again; it returns when its visibility lapses");
                    }
                });
            }
        }
        let mut busy = self.queue.busy.lock().unwrap_or_else(|p| p.into_inner());
        let index = self.held.iter().position(|d| match &d.settle.group {
            Some(group) => !busy.contains(group),
            None => true,
        })?;
        let delivery = self.held.remove(index)?;
        if let Some(group) = &delivery.settle.group {
            busy.insert(group.clone());
            delivery.settle.handed_out.store(true, Ordering::Release);
        }
        Some(delivery)
    }

    fn convert(&self, message: aws_sdk_sqs::types::Message) -> Option<Delivery<SqsSettle>> {
        let receipt = message.receipt_handle?;
        let system = message.attributes.unwrap_or_default();
        let mut headers = BTreeMap::new();
        for (name, value) in message.message_attributes.unwrap_or_default() {
            if let Some(text) = value.string_value {
                headers.insert(name, text);
            }
        }
        let dedup = system
            .get(&MessageSystemAttributeName::MessageDeduplicationId)
            .cloned();
        let group = system
            .get(&MessageSystemAttributeName::MessageGroupId)
            .cloned();
        if let Some(dedup) = &dedup {
            headers.insert("MessageDeduplicationId".into(), dedup.clone());
        }
        if let Some(group) = &group {
            headers.insert("MessageGroupId".into(), group.clone());
        }
        let message_id = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(KEY_ATTRIBUTE))
            .map(|(_, value)| value.clone())
            .or(dedup);
        let content_type = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
            .map(|(_, value)| value.clone());
        let delivery_count = system
            .get(&MessageSystemAttributeName::ApproximateReceiveCount)
            .and_then(|n| n.parse().ok());
        let published_at = system
            .get(&MessageSystemAttributeName::SentTimestamp)
            .and_then(|t| t.parse().ok())
            .map(idem_core::Timestamp);
        let settled = Arc::new(AtomicBool::new(false));
        let keeper = self.options.extend.then(|| {
            tokio::spawn(keep_visible(
                Arc::clone(&self.queue),
                receipt.clone(),
                Arc::clone(&settled),
            ))
        });
        Some(Delivery {
            message: Message {
                payload: message.body.unwrap_or_default().into(),
                headers,
                message_id,
                content_type,
                record_key: None,
                subject: self.queue.name.clone(),
                coordinates: message
                    .message_id
                    .map(|id| format!("{}/{id}", self.queue.name)),
                delivery_count,
                published_at,
            },
            settle: SqsSettle {
                queue: Arc::clone(&self.queue),
                receipt,
                group: if self.queue.fifo { group } else { None },
                settled,
                keeper,
                handed_out: AtomicBool::new(false),
            },
        })
    }
}

/// Extends a delivery's visibility every half timeout until it is settled;
/// a failed extension stops the consumer.
async fn keep_visible(queue: Arc<Queue>, receipt: String, settled: Arc<AtomicBool>) {
    let every = Duration::from_millis(u64::try_from(queue.visibility).unwrap_or(1) * 500);
    loop {
        tokio::time::sleep(every).await;
        if settled.load(Ordering::Acquire) {
            return;
        }
        if let Err(failure) = queue.change_visibility(&receipt, queue.visibility).await {
            if !settled.load(Ordering::Acquire) {
                queue.lose(format!(
                    "{failure}; the message's visibility could not be extended, so SQS may hand it to another consumer: stopping (the record answers its redelivery)"
                ));
            }
            return;
        }
    }
}

impl Transport for SqsTransport {
    type Settle = SqsSettle;

    async fn receive(&mut self) -> Result<Option<Delivery<SqsSettle>>, TransportError> {
        loop {
            if let Some(why) = self
                .queue
                .lost
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            {
                return Err(TransportError::new("extend a message's visibility", why));
            }
            if let Some(delivery) = self.next_ready() {
                return Ok(Some(delivery));
            }
            if self.polling.is_none() {
                self.polling = Some(self.start_polling());
            }
            let Some(polling) = self.polling.as_mut() else {
                continue;
            };
            tokio::select! {
                joined = polling => {
                    self.polling = None;
                    let messages = joined
                        .map_err(|e| TransportError::new("receive messages", e))?
                        .map_err(|failure| transport_error(failure, "receive from SQS"))?;
                    for message in messages {
                        if let Some(delivery) = self.convert(message) {
                            self.held.push_back(delivery);
                        }
                    }
                }
                () = self.queue.changed.notified() => {}
            }
        }
    }

    fn route(&self) -> Route {
        self.route.clone()
    }

    fn replay_horizon(&self) -> Option<BrokerHorizon> {
        self.horizon.clone()
    }

    fn delivery_limit(&self) -> Option<DeliveryLimit> {
        self.limit.clone()
    }

    async fn close(mut self) {
        if let Some(polling) = self.polling.take() {
            polling.abort();
        }
        // Held deliveries were never handed out: back to the queue at once.
        for delivery in self.held.drain(..) {
            delivery.settle.stop_keeping();
            let _ = delivery
                .settle
                .queue
                .change_visibility(&delivery.settle.receipt, 0)
                .await;
        }
    }
}

impl Drop for SqsTransport {
    fn drop(&mut self) {
        if let Some(polling) = self.polling.take() {
            polling.abort();
        }
    }
}

/// Where a redrive of the queue's messages publishes them: the queue itself.
fn sqs_destination(url: &str) -> crate::publish::Destination {
    crate::publish::Destination::Sqs {
        url: url.to_owned(),
        group: crate::publish::SqsGroup::default(),
    }
}

fn transport_error(failure: Failure, context: &str) -> TransportError {
    let kind = match failure.kind {
        FailureKind::Unavailable => TransportErrorKind::Connection,
        FailureKind::Refused => TransportErrorKind::Refused,
        FailureKind::Missing => TransportErrorKind::Missing,
        FailureKind::Config => TransportErrorKind::Config,
    };
    TransportError::of(kind, context.to_owned(), failure)
}

/// Whole seconds, as SQS takes them.
fn secs(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)
}
