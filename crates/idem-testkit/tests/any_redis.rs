//! `idem::AnyStore` over Redis, the store chosen at run time from a
//! `redis://` URL: the leased conformance rows through its dispatch, and the
//! calls only SQLite and PostgreSQL offer refused with what to use instead.

use std::sync::Arc;
use std::time::Duration;

use idem::{
    AnyStore, AtomicStore, ErrorKind, FenceStore, Fingerprint, IdempotencyKey, ManualClock,
    OutboxStore, Outcome, Resource, Scope, StoreLocation,
};
use idem_testkit::LeasedHarness;
use idem_testkit::redis::{machine_redis_answers, redis_url, test_prefix};

/// An `AnyStore` opened from the machine's Redis URL, under a key prefix of
/// its own given in the URL's query.
struct AnyRedis {
    store: AnyStore,
    clock: ManualClock,
}

impl LeasedHarness for AnyRedis {
    type Store = AnyStore;

    async fn fresh() -> Option<Self> {
        if !machine_redis_answers() {
            return None;
        }
        let url = format!("{}?prefix={}", redis_url(), test_prefix("any"));
        let location: StoreLocation = url.parse().expect("a Redis store URL");
        let clock = ManualClock::starting_now();
        let store = AnyStore::open_with(&location, Default::default(), Arc::new(clock.clone()))
            .await
            .expect("open the Redis store");
        Some(AnyRedis { store, clock })
    }

    async fn reopen(&self) -> Self {
        AnyRedis {
            store: self.store.clone(),
            clock: self.clock.clone(),
        }
    }

    fn store(&self) -> &AnyStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

idem_testkit::leased_conformance_suite!(AnyRedis);

/// Asserts that `error` is the refusal of a call that needs atomic mode.
fn refused(error: &dyn std::fmt::Display, kind: Option<ErrorKind>) {
    let text = error.to_string();
    assert_eq!(kind, Some(ErrorKind::Config), "{text}");
    assert!(text.contains("needs atomic mode"), "{text}");
    assert!(
        text.contains("use a sqlite:// or postgres:// store"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_calls_on_a_redis_store_are_refused_saying_what_to_use() {
    let Some(h) = AnyRedis::fresh().await else {
        return;
    };
    let s = &h.store;
    assert!(!s.offers_atomic_mode());
    let err = s.require_atomic_mode("idem relay").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("store configuration error: idem relay needs")
    );

    let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let in_effect = Arc::clone(&ran);
    let applied = s
        .apply(
            &scope,
            &key,
            Fingerprint::of_bytes(b"x"),
            async move |_tx| {
                in_effect.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, String>(Outcome::empty())
            },
        )
        .await
        .unwrap_err();
    let error = applied
        .protocol()
        .expect("a refusal, not the effect's error");
    refused(
        error,
        match error {
            idem::Error::Store(e) => Some(e.kind()),
            _ => None,
        },
    );
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the effect did not run"
    );
    assert!(
        idem::LeaseStore::claim(s, &scope, &key, Fingerprint::of_bytes(b"x"))
            .await
            .is_ok(),
        "the key was left free by the refused apply"
    );

    let message = idem::OutboxMessage {
        destination: Some("http://127.0.0.1:9/hook".into()),
        key: IdempotencyKey::new("m").unwrap(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
    };
    match s.enqueue_now(&message).await {
        Err(idem::Error::Store(e)) => refused(&e, Some(e.kind())),
        other => panic!("expected a refusal, got {other:?}"),
    }
    match s
        .acquire(&Resource::new("r").unwrap(), Duration::from_secs(1))
        .await
    {
        Err(idem::Error::Store(e)) => refused(&e, Some(e.kind())),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
