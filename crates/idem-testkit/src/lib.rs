//! Test tools for Idem and for applications built on it.
//!
//! Modules:
//! - [`harness`]: the seam a store implements to run the conformance suite;
//! - [`conformance`]: the suite itself, one async function per case;
//! - [`leased`]: the rows of leased mode alone, for stores without an atomic mode;
//! - [`crash`]: crash tests with real processes that abort at `idem_core::crash`'s points;
//! - [`faultproxy`]: a TCP proxy that cuts, holds or slows a client's connections;
//! - [`migrations`]: rows of earlier outbox, dead-letter and attempt tables read back after migrating;
//! - [`fencing`]: fencing-token and guarded-write cases (pauses, reordering);
//! - [`errors`]: an application's error wrapping a driver's, for error classification tests;
//! - [`deliveries`]: at-least-once delivery simulated (duplicates, shuffles);
//! - [`postgres`]: a fresh PostgreSQL database per test;
//! - [`pgbouncer`]: a private PgBouncer in transaction pooling mode in front of it;
//! - `http` (feature `http`): a loopback server and a client for HTTP tests;
//! - [`redis`]: the machine's Redis, a private `redis-server` a test restarts, a Redis Cluster;
//! - [`dynamodb`]: moto's DynamoDB on loopback and a table of the test's own;
//! - [`services`]: whether a missing database fails or skips a test;
//! - [`tls_postgres`]: a throwaway PostgreSQL that requires TLS and a password;
//! - [`pg_cluster`]: a private PostgreSQL primary and its synchronous standby, to crash and promote;
//! - [`tls`]: a throwaway CA and the certificates it signs;
//! - [`tlsproxy`]: a TLS-terminating proxy in front of a server without TLS;
//! - [`nats`]: a `nats-server` of a test's own, also in operator mode (JWTs and `.creds` files);
//! - [`nats_cluster`]: three routed `nats-server`s with JetStream, to kill and restart one by one;
//! - [`rabbitmq_cluster`]: three clustered `rabbitmq-server` nodes, shared by a test binary, to kill and restart one by one;
//! - `spans` (feature `spans`): the spans a test process finished, collected
//!   in memory, to check trace context across hops.
//!
//! A store's test file implements [`Harness`] and invokes
//! [`conformance_suite!`] once; that expands to one test per case.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod conformance;
pub mod crash;
pub mod deliveries;
pub mod dynamodb;
pub mod errors;
pub mod faultproxy;
pub mod fencing;
pub mod harness;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod leased;
pub mod migrations;
pub mod nats;
pub mod nats_cluster;
pub mod pg_cluster;
pub mod pgbouncer;
pub mod postgres;
pub mod rabbitmq;
pub mod rabbitmq_cluster;
pub mod redis;
mod server_process;
pub mod services;
#[cfg(feature = "spans")]
#[cfg_attr(docsrs, doc(cfg(feature = "spans")))]
pub mod spans;
pub mod tls;
pub mod tls_postgres;
pub mod tlsproxy;

pub use harness::{Effect, Gate, GateControl, Harness, TxOf};
pub use leased::LeasedHarness;

/// Expands to one test per leased-mode conformance case for the given
/// [`LeasedHarness`] type: the rows a store without an atomic mode runs.
#[macro_export]
macro_rules! leased_conformance_suite {
    ($harness:ty) => {
        $crate::leased_conformance_suite!(@cases $harness; leased;
            fresh_key_runs_once_and_duplicates_replay,
            scopes_are_separate_leased,
            key_reuse_is_refused_in_every_state,
            concurrent_duplicate_is_answered_in_flight,
            sixty_four_concurrent_claims_have_one_winner,
            retryable_failure_releases_the_key,
            terminal_failure_is_stored_and_replayed_leased,
            takeover_fences_the_zombie,
            the_window_counts_from_the_first_claim_leased,
            retention_is_enforced_by_bounded_sweeps_leased,
            records_can_be_listed_and_shown_leased,
            records_can_be_filtered_by_prefix_and_paged_leased,
            tokens_never_go_back_across_sweeps,
        );
        $crate::leased_conformance_suite!(@cases $harness; conformance;
            leased_claim_complete_replay,
            renewal_extends_the_lease,
            release_lets_the_next_retry_run_at_once,
            an_ended_lease_is_taken_over_at_once,
            a_worker_stalled_past_a_swept_window_stays_fenced,
        );
    };
    (@cases $harness:ty; $module:ident; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            if let Some(h) = <$harness as $crate::LeasedHarness>::fresh().await {
                $crate::$module::$case(h).await;
            }
        }
    )*};
}

/// Expands to one test per conformance case for the given [`Harness`] type,
/// plus the crash tests and the child they spawn. Use it at the top level of
/// an integration test file or in a module of one.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:ty) => {
        $crate::conformance_suite!(@cases $harness;
            fresh_key_applies_once_and_duplicates_replay,
            scopes_are_separate,
            key_reuse_is_refused_and_changes_nothing,
            concurrent_duplicate_is_answered_not_queued,
            sixty_four_concurrent_callers_apply_once,
            retryable_failure_rolls_back_and_releases,
            terminal_failure_is_stored_and_replayed,
            leased_claim_complete_replay,
            zombie_is_fenced,
            atomic_apply_takes_over_an_expired_claim,
            renewal_extends_the_lease,
            release_lets_the_next_retry_run_at_once,
            an_ended_lease_is_taken_over_at_once,
            retention_is_enforced_by_bounded_sweeps,
            the_sweeper_keeps_the_table_bounded_under_steady_load,
            expired_records_are_replaced_with_a_greater_token,
            a_worker_stalled_past_a_swept_window_stays_fenced,
            the_window_counts_from_the_first_claim,
            batch_apply_dedupes_and_commits_once,
            late_applies_meet_the_tombstone_until_the_grace_ends,
            set_apply_runs_one_effect_for_the_new_operations,
            batch_answers_a_busy_key_in_flight,
            records_can_be_listed_and_shown,
        );
        $crate::conformance_suite!(@fencing $harness;
            fencing_tokens_grow_and_are_never_reused,
            a_paused_worker_cannot_overwrite_its_successor,
            reordered_versions_keep_the_newest_and_apply_once,
        );
        $crate::conformance_suite!(@crashes $harness;
            crash_after_claim => AfterClaim,
            crash_inside_effect => InsideEffect,
            crash_after_commit => AfterCommit,
            crash_after_leased_claim => LeasedAfterClaim,
            crash_between_effect_and_record_repeats_the_effect => LeasedEffectBeforeRecord,
            crash_between_record_and_effect_loses_the_effect => LeasedRecordBeforeEffect,
        );

        #[test]
        fn duplicated_and_shuffled_deliveries_reach_the_same_state() {
            $crate::conformance::duplicated_and_shuffled_deliveries_reach_the_same_state::<$harness>();
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "child process of the crash tests, which start it themselves"]
        async fn crash_child() {
            $crate::crash::child::<$harness>().await;
        }
    };
    (@cases $harness:ty; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            if let Some(h) = <$harness as $crate::Harness>::fresh().await {
                $crate::conformance::$case(h).await;
            }
        }
    )*};
    (@fencing $harness:ty; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Some(h) = <$harness as $crate::Harness>::fresh().await {
                $crate::fencing::$case(h).await;
            }
        }
    )*};
    (@crashes $harness:ty; $($name:ident => $case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            if let Some(h) = <$harness as $crate::Harness>::fresh().await {
                let child = match module_path!().split_once("::") {
                    Some((_, module)) => format!("{module}::crash_child"),
                    None => "crash_child".to_owned(),
                };
                $crate::crash::crash_and_recover(h, $crate::crash::CrashCase::$case, &child).await;
            }
        }
    )*};
}
