//! The outbox against the real brokers: a message commits or rolls back with
//! the business transaction, and the relay publishes a committed one once,
//! with its own key as AMQP `message_id` / `Nats-Msg-Id`.

mod outbox_support;

use idem::{AnyConnection, AtomicStore, Fingerprint, IdempotencyKey, ManualClock, Outcome, Scope};
use idem_broker::outbox::{self, Outbox, Route, derive_key};
use idem_broker::publish::Message;
use idem_broker::relay::{Relay, RelayConfig};
use outbox_support::{Nats, PgDb, Rabbit, sqlite};

fn message(key: &str, body: &str) -> Message {
    Message::new(IdempotencyKey::new(key).unwrap(), body.as_bytes().to_vec())
}

#[tokio::test]
async fn sqlite_rolled_back_business_transaction_publishes_nothing() {
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let to = Nats::destination(&subject);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let outbox = Outbox::of(&store);

    // Rolled back: the business row and the message go together.
    let (rolled, kept) = (
        message("order-1/created", "1"),
        message("order-2/created", "2"),
    );
    let to_in = to.clone();
    let rolled_back = store
        .transaction(async move |tx| -> Result<(), String> {
            tx.execute_batch("CREATE TABLE orders (id INTEGER); INSERT INTO orders VALUES (1);")
                .map_err(|e| e.to_string())?;
            outbox
                .enqueue(tx, &to_in, &rolled)
                .await
                .map_err(|e| e.to_string())?;
            Err("changed my mind".to_owned())
        })
        .await;
    assert!(rolled_back.is_err());
    let to_in = to.clone();
    store
        .transaction(async move |tx| -> Result<(), String> {
            tx.execute_batch("CREATE TABLE orders (id INTEGER); INSERT INTO orders VALUES (2);")
                .map_err(|e| e.to_string())?;
            outbox
                .enqueue(tx, &to_in, &kept)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
        .await
        .unwrap();

    // An effect that fails inside `apply` rolls its enqueue back too.
    let to_in = to.clone();
    let failed = store
        .apply(
            &Scope::new("orders").unwrap(),
            &IdempotencyKey::new("order-3").unwrap(),
            Fingerprint::of_bytes(b"3"),
            async move |tx| -> Result<Outcome, String> {
                outbox
                    .enqueue(tx, &to_in, &message("order-3/created", "3"))
                    .await
                    .map_err(|e| e.to_string())?;
                Err("payment declined".to_owned())
            },
        )
        .await;
    assert!(failed.is_err());

    let relay = Relay::new(store.clone(), RelayConfig::default());
    let pass = relay.drain().await.unwrap();
    assert_eq!((pass.claimed, pass.sent), (1, 1), "{pass:?}");
    let stored = nats.messages(&stream).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].msg_id.as_deref(), Some("order-2/created"));
    assert_eq!(stored[0].payload, b"2");
}

#[tokio::test]
async fn postgres_rolled_back_business_transaction_publishes_nothing() {
    let Some(db) = PgDb::new().await else { return };
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let to = Rabbit::destination(&queue);
    let clock = ManualClock::starting_now();
    let store = db.store(&clock).await;
    let outbox = Outbox::of(&store);

    // A transaction of the application's own, on the store's pool.
    let mut tx = store.begin_transaction().await.unwrap();
    outbox
        .enqueue(&mut tx, &to, &message("refund-1/issued", "1"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    // Through apply: an effect error rolls back the enqueue with the record.
    let to_in = to.clone();
    let failed = store
        .apply(
            &Scope::new("refunds").unwrap(),
            &IdempotencyKey::new("refund-2").unwrap(),
            Fingerprint::of_bytes(b"2"),
            async move |conn| -> Result<Outcome, String> {
                outbox
                    .enqueue(conn, &to_in, &message("refund-2/issued", "2"))
                    .await
                    .map_err(|e| e.to_string())?;
                Err("ledger closed".to_owned())
            },
        )
        .await;
    assert!(failed.is_err());

    let relay = Relay::new(store.clone(), RelayConfig::default());
    let pass = relay.drain().await.unwrap();
    assert_eq!(pass.claimed, 0, "{pass:?}");
    assert!(rabbit.drain(&queue).await.is_empty());
}

#[tokio::test]
async fn sqlite_apply_enqueue_and_relay_publish_once_with_message_id_equal_to_key() {
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let to = Rabbit::destination(&queue);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let outbox = Outbox::of(&store);

    // The HTTP request's key; the message key is derived from it, so every
    // retry of the request makes the same message.
    let request = IdempotencyKey::new("req-7f3a").unwrap();
    let scope = Scope::new("checkout").unwrap();
    for _delivery in 0..3 {
        let to_in = to.clone();
        let request_in = request.clone();
        store
            .apply(
                &scope,
                &request,
                Fingerprint::of_bytes(b"cart-9"),
                async move |tx| -> Result<Outcome, String> {
                    tx.execute_batch(
                        "CREATE TABLE IF NOT EXISTS orders (id INTEGER); INSERT INTO orders VALUES (9);",
                    )
                    .map_err(|e| e.to_string())?;
                    let key = derive_key(&request_in, "order-created").unwrap();
                    outbox
                        .enqueue(tx, &to_in, &Message::new(key, b"order 9".to_vec()))
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(Outcome::success("ordered"))
                },
            )
            .await
            .unwrap();
    }

    let relay = Relay::new(store.clone(), RelayConfig::default());
    let pass = relay.drain().await.unwrap();
    assert_eq!(pass.sent, 1, "{pass:?}");
    // A second relay pass finds nothing: the row is marked sent.
    assert_eq!(relay.drain().await.unwrap().claimed, 0);

    let received = rabbit.drain(&queue).await;
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].message_id.as_deref(),
        Some("req-7f3a/order-created")
    );
    assert_eq!(received[0].payload, b"order 9");
}

#[tokio::test]
async fn postgres_enqueue_and_relay_publish_once_with_nats_msg_id_equal_to_key() {
    let Some(db) = PgDb::new().await else { return };
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let to = Nats::destination(&subject);
    let clock = ManualClock::starting_now();
    let store = db.store(&clock).await;
    outbox::migrate(&store).await.unwrap();
    let outbox = Outbox::of(&store);

    let scope = Scope::new("signup").unwrap();
    let request = IdempotencyKey::new("signup-42").unwrap();
    for _delivery in 0..2 {
        let to_in = to.clone();
        let key = derive_key(&request, "welcome").unwrap();
        store
            .apply(
                &scope,
                &request,
                Fingerprint::of_bytes(b"u42"),
                async move |conn| -> Result<Outcome, String> {
                    outbox
                        .enqueue(conn, &to_in, &Message::new(key, b"hi".to_vec()))
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(Outcome::success("ok"))
                },
            )
            .await
            .unwrap();
    }

    let relay = Relay::new(store.clone(), RelayConfig::default());
    assert_eq!(relay.drain().await.unwrap().sent, 1);
    let stored = nats.messages(&stream).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].msg_id.as_deref(), Some("signup-42/welcome"));
}

#[tokio::test]
async fn an_any_store_enqueues_on_whichever_connection_it_has() {
    let Some(db) = PgDb::new().await else { return };
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let to = Nats::destination(&subject);
    let clock = ManualClock::starting_now();
    let (_dir, sqlite_store) = sqlite(&clock).await;
    let stores = [
        idem::AnyStore::Sqlite(sqlite_store),
        idem::AnyStore::Postgres(db.store(&clock).await),
    ];
    for (i, store) in stores.iter().enumerate() {
        let outbox = Outbox::of(store);
        let to_in = to.clone();
        store
            .transaction(async move |tx| -> Result<(), String> {
                // The application's SQL per database, the enqueue once.
                match tx.connection() {
                    AnyConnection::Sqlite(conn) => conn
                        .execute_batch("CREATE TABLE notes (n INTEGER)")
                        .map_err(|e| e.to_string())?,
                    AnyConnection::Postgres(conn) => {
                        idem::sqlx::raw_sql("CREATE TABLE notes (n INTEGER)")
                            .execute(conn)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
                outbox
                    .enqueue(tx, &to_in, &message(&format!("note-{i}"), "n"))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            })
            .await
            .unwrap();
        let relay = Relay::new(store.clone(), RelayConfig::default());
        assert_eq!(relay.drain().await.unwrap().sent, 1);
    }
    let ids: Vec<_> = nats
        .messages(&stream)
        .await
        .into_iter()
        .filter_map(|m| m.msg_id)
        .collect();
    assert_eq!(ids, ["note-0", "note-1"]);
}

#[tokio::test]
async fn rows_without_a_destination_wait_for_a_relay_with_a_default() {
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = idem::AnyStore::Sqlite(store.clone());
    outbox::enqueue_now(&any, Route::Default, &message("m-1", "1"))
        .await
        .unwrap();

    let without = Relay::new(any.clone(), RelayConfig::default());
    assert_eq!(without.drain().await.unwrap().claimed, 0);

    let with = Relay::new(
        any,
        RelayConfig::default().with_default_destination(Nats::destination(&subject)),
    );
    assert_eq!(with.drain().await.unwrap().sent, 1);
    assert_eq!(nats.messages(&stream).await.len(), 1);
}
