//! The DynamoDB store for Idem: leased mode on conditional writes, and
//! atomic mode for effects that are DynamoDB writes, where the effect's
//! items and the record commit in one `TransactWriteItems`.
//!
//! # Modules
//!
//! - `store`: [`DynamoStore`] and [`DynamoStoreBuilder`]: the URL, the SDK
//!   client (rustls with ring; the URL's endpoint, region and credentials or
//!   the standard AWS chain's), settings and clock;
//! - `location`: the URL forms (`dynamodb:///TABLE`, `dynamodb://HOST/TABLE`,
//!   `dynamodb+http://KEY:SECRET@HOST:PORT/TABLE`);
//! - `table`: the table created when missing (on demand, time to live on) or
//!   its key shape checked;
//! - `item`: the one key shape, the partition key of each kind of item, and
//!   the size DynamoDB counts for an item;
//! - `record`: a record as one item, both ways;
//! - `leased`: [`LeaseStore`](idem_core::LeaseStore) on conditional writes;
//! - `transaction`: [`Transaction`], what an atomic effect writes with, and
//!   DynamoDB's transaction limits;
//! - `atomic`: [`AtomicStore`](idem_core::AtomicStore) on `TransactWriteItems`;
//! - `inspect`: [`RecordStore`](idem_core::RecordStore) and
//!   [`RecordScan`](idem_core::RecordScan) by scanning the table;
//! - `attempts`: [`AttemptStore`](idem_core::AttemptStore), a message's failed
//!   attempts, counted beside its record;
//! - `dead_letters`: [`DeadLetterStore`](idem_core::DeadLetterStore), the
//!   messages a consumer gave up on;
//! - `admin`: [`AdminStore`](idem_core::AdminStore), what operators change by
//!   hand, each change and its audit entry in one transaction;
//! - `error`: the one mapping of the SDK's failures to
//!   [`ErrorKind`](idem_core::ErrorKind), and DynamoDB's size limits.
//!
//! # One table
//!
//! Everything the store keeps is an item of one table whose only key is a
//! string partition key, `pk`; its prefix says what the item is:
//!
//! | `pk` | item |
//! | --- | --- |
//! | `r#LEN#SCOPE#KEY` | the record of `(SCOPE, KEY)`, `LEN` the scope's length |
//! | `a#LEN#SCOPE#KEY` | the failed attempts of a message |
//! | `d#ID` | dead letter `ID` |
//! | `l#ID` | audit entry `ID` |
//! | `n#dead_letters`, `n#audit` | the counters the ids are taken from |
//!
//! The table is created on first open when it is missing, with on-demand
//! capacity (`PAY_PER_REQUEST`) and DynamoDB's time to live on the `ttl`
//! attribute. A table that exists with another key shape is refused, saying
//! what it has and what Idem needs. An atomic effect may keep its own items
//! in this table under partition keys of its own, or in tables of its own.
//!
//! # How concurrent callers are kept apart
//!
//! A claim reads the record with a strongly consistent read, decides with
//! [`idem_core::decide`], and writes on the condition that the item is
//! still the one it read. Of two callers racing for one key, one write
//! meets its condition; the other reads again and finds the winner's claim,
//! and is answered `InFlight` at once. A completion, renewal or release is
//! an update on the condition that the record is in flight with the claim's
//! token, so a worker whose claim was taken over is refused as `Fenced`.
//! Times are the application's [`Clock`](idem_core::Clock).
//!
//! # Retention
//!
//! Each record carries `ttl`: the end of its window (plus the tombstone
//! grace period, when tombstones are kept), in seconds. DynamoDB deletes it
//! after that, at its own pace (often days later); until then every read
//! that answers for the protocol treats it as absent. The sweeper deletes
//! such items at once, in bounded batches.
//!
//! # Limits
//!
//! DynamoDB keeps at most 400 KB in one item: an answer whose record would
//! be larger is refused, naming the limit and the `--max-answer` setting,
//! and never cut. One `TransactWriteItems` takes at most 100 items and
//! 4 MB; an atomic effect (or batch) whose writes and records would exceed
//! either is refused before anything is sent.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod atomic;
mod attempts;
mod dead_letters;
mod error;
mod inspect;
mod item;
mod leased;
mod location;
mod record;
mod store;
mod table;
mod transaction;

pub use error::{MAX_ITEM_BYTES, MAX_TRANSACTION_BYTES, MAX_TRANSACTION_ITEMS, map_error};
pub use item::{PARTITION_KEY, TTL_ATTRIBUTE};
pub use store::{DynamoStore, DynamoStoreBuilder};
pub use transaction::Transaction;

/// The README's example, compiled with the crate's doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The AWS SDK for DynamoDB this store is built on, for the items an atomic
/// effect writes (`types::Put`, `types::Update`, ...) and the caller's own
/// requests on [`DynamoStore::client`].
pub use aws_sdk_dynamodb;
