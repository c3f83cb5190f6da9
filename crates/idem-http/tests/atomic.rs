//! Atomic routes over real sockets, on every store: the debit and the stored
//! response commit together, once per key. The bank and its scenarios are
//! written once (`common::bank`); each store runs all of them, PostgreSQL in a
//! database of its own per test.

mod common;

/// One test per scenario, on the bank `open` returns.
macro_rules! scenarios {
    ($store:ident, $open:expr) => {
        mod $store {
            use super::common::bank::{self, Bank};

            scenarios!(@each $open;
                duplicates_debit_once,
                a_declined_debit_is_stored_and_replayed,
                concurrent_duplicates_debit_once,
                a_failed_handler_leaves_nothing_and_the_retry_runs,
                refusals_follow_the_table,
                keyless_requests_run_each_time_where_allowed,
            );
        }
    };
    (@each $open:expr; $($scenario:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let Some(bank) = $open.await else { return };
                bank::$scenario(&bank).await;
            }
        )*
    };
}

scenarios!(sqlite, Bank::sqlite());
scenarios!(any_sqlite, Bank::any_sqlite());
#[cfg(feature = "postgres")]
scenarios!(postgres, Bank::postgres());
