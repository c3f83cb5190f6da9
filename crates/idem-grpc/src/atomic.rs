//! Atomic tonic handlers: a unary method whose effect is SQL on the store's
//! own database (SQLite or PostgreSQL) runs inside the store's transaction,
//! and its reply commits **with** its writes and the key's record.
//!
//! The [layer](crate::GrpcIdempotencyLayer) cannot join the service's effect
//! to the record: it sees an opaque service, so a process that dies between
//! the effect and the record leaves the key claimed, and the retry after the
//! lease runs the call again. [`apply`] closes that gap for effects in the
//! store's database, the way the HTTP crate's atomic axum handlers do:
//!
//! 1. the key is read from the request's metadata (none: the effect runs in a
//!    plain transaction of the store, or the call is refused with
//!    `INVALID_ARGUMENT` where the config requires a key);
//! 2. the store's atomic `apply` claims the key inside its transaction; a
//!    duplicate gets the stored reply (or the stored error status) with
//!    `idempotent-replayed: true`, a reused key `FAILED_PRECONDITION`, a
//!    concurrent duplicate `ABORTED` with a pushback: the effect does not run;
//! 3. otherwise the effect runs with the store's connection and returns the
//!    reply or a status. A reply, or a status the layer would store (the
//!    client errors), commits with the writes; any other status rolls the
//!    writes and the claim back, and the client gets that status.
//!
//! A crash anywhere leaves the writes and the record, or neither.
//!
//! ```
//! use idem::SqliteStore;
//! use idem_grpc::GrpcIdempotencyConfig;
//! use idem_grpc::atomic;
//! use tonic::{Request, Status};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("app.db")).await?;
//! store
//!     .with_connection(|conn| conn.execute("CREATE TABLE charges (cents INTEGER)", []))
//!     .await??;
//! let config = GrpcIdempotencyConfig::default();
//!
//! // In a tonic handler: `request` is the `tonic::Request` the method received.
//! for replayed in [false, true] {
//!     let mut request = Request::new(1250_i64);
//!     request.metadata_mut().insert("idempotency-key", "order-7".parse()?);
//!     let reply = atomic::apply(&store, &config, "/shop.Payments/Charge", request, |cents: i64| {
//!         async move |tx: &mut idem::rusqlite::Connection| -> Result<i64, Status> {
//!             tx.execute("INSERT INTO charges VALUES (?1)", [cents])
//!                 .map_err(|e| Status::internal(e.to_string()))?;
//!             Ok(cents)
//!         }
//!     })
//!     .await?;
//!     assert_eq!(reply.metadata().contains_key("idempotent-replayed"), replayed);
//!     assert_eq!(*reply.get_ref(), 1250);
//! }
//! let charges: i64 = store
//!     .with_connection(|conn| conn.query_row("SELECT count(*) FROM charges", [], |row| row.get(0)))
//!     .await??;
//! assert_eq!(charges, 1);
//! # Ok(()) }
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderValue;
use idem_core::TxCall;
use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, Fingerprint, IdempotencyKey, Outcome,
};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::status::Refusal;
use crate::stored::StoredCall;
use crate::{GrpcIdempotencyConfig, GrpcStatusPolicy};

/// Why the effect's transaction was rolled back: a status that is not stored.
#[derive(Debug)]
pub struct NotStored(Status);

/// Runs `effect` once per idempotency key of `request`, inside the store's
/// transaction, for the unary method at `method` (`/package.Service/Method`,
/// the record's scope). `effect` gets the request message and returns the
/// function the store calls with its connection.
pub async fn apply<St, Req, Res, F, Eff>(
    store: &St,
    config: &GrpcIdempotencyConfig,
    method: &str,
    request: tonic::Request<Req>,
    effect: F,
) -> Result<tonic::Response<Res>, Status>
where
    St: AtomicStore,
    Req: prost::Message,
    Res: prost::Message + Default + Send + 'static,
    F: FnOnce(Req) -> Eff,
    Eff: AtomicEffect<St::Tx, Res, Status>,
{
    let key = match read_key(request.metadata(), config) {
        Ok(key) => key,
        Err(refusal) => return Err(refusal.to_status()),
    };
    let (metadata, _, message) = request.into_parts();
    let keyed = match key {
        Some(key) => {
            let scope = config.scope(&metadata.into_headers(), method);
            let fingerprint = Fingerprint::of_parts([
                b"grpc".as_slice(),
                method.as_bytes(),
                &message.encode_to_vec(),
            ]);
            Some((scope, key, fingerprint))
        }
        None if config.require_key => {
            return Err(Refusal::MissingKey(config.key_metadata.to_string()).to_status());
        }
        None => None,
    };
    let run = effect(message);
    let policy = config.status_policy().clone();
    let wrapped = async move |tx: &mut St::Tx| -> Result<Outcome, NotStored> {
        let answer: Result<Res, Status> = TxCall::call(run, tx).await;
        settle(answer, &policy)
    };
    let applied = match &keyed {
        Some((scope, key, fingerprint)) => store.apply(scope, key, *fingerprint, wrapped).await,
        None => store.transaction(wrapped).await.map(Applied::Fresh),
    };
    match applied {
        Ok(Applied::Fresh(outcome)) => answer(outcome, false),
        Ok(Applied::Replayed(outcome)) => answer(outcome, true),
        Err(ApplyError::Effect(NotStored(status))) => Err(status),
        Err(ApplyError::Protocol(error)) => Err(Refusal::from_store(error).to_status()),
    }
}

fn read_key(
    metadata: &MetadataMap,
    config: &GrpcIdempotencyConfig,
) -> Result<Option<IdempotencyKey>, Refusal> {
    let mut values = metadata.get_all(config.key_metadata.as_str()).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Refusal::MalformedKey(format!(
            "the `{}` metadata entry appears more than once",
            config.key_metadata
        )));
    }
    let text = value
        .to_str()
        .map_err(|_| Refusal::MalformedKey("it is not visible ASCII".to_owned()))?;
    IdempotencyKey::new(text.trim())
        .map(Some)
        .map_err(|e| Refusal::MalformedKey(e.to_string()))
}

/// The reply or status as the outcome to commit, or the reason to roll back.
fn settle<Res: prost::Message>(
    answer: Result<Res, Status>,
    policy: &GrpcStatusPolicy,
) -> Result<Outcome, NotStored> {
    match answer {
        Ok(reply) => {
            let encoded = reply.encode_to_vec();
            let mut frame = BytesMut::with_capacity(encoded.len() + 5);
            frame.put_u8(0);
            frame.put_u32(u32::try_from(encoded.len()).expect("a message under 4 GiB"));
            frame.put_slice(&encoded);
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            Ok(StoredCall::new(headers, frame.freeze(), Some(trailers)).to_outcome())
        }
        Err(status) if policy.stores(status.code()) => {
            let response: http::Response<()> = status.into_http();
            Ok(StoredCall::new(response.into_parts().0.headers, Bytes::new(), None).to_outcome())
        }
        Err(status) => Err(NotStored(status)),
    }
}

/// The reply or status an outcome stands for.
fn answer<Res: prost::Message + Default>(
    outcome: Outcome,
    replayed: bool,
) -> Result<tonic::Response<Res>, Status> {
    let stored = StoredCall::from_outcome(outcome)
        .map_err(|damaged| Refusal::Corrupt(damaged.to_string()).to_status())?;
    let mut metadata = MetadataMap::from_headers(stored.headers().clone());
    if replayed {
        metadata.insert(
            "idempotent-replayed",
            "true".parse().expect("valid metadata"),
        );
    }
    if stored.code() != Some(Code::Ok) {
        let mut status = Status::from_header_map(stored.headers())
            .unwrap_or_else(|| Status::internal("the stored answer has no status"));
        if replayed {
            status.metadata_mut().insert(
                "idempotent-replayed",
                "true".parse().expect("valid metadata"),
            );
        }
        return Err(status);
    }
    let frame = stored.message();
    let reply = frame
        .get(5..)
        .ok_or(())
        .and_then(|bytes| Res::decode(bytes).map_err(|_| ()))
        .map_err(|()| {
            Refusal::Corrupt("the stored reply does not decode".to_owned()).to_status()
        })?;
    metadata.remove("content-type");
    let mut response = tonic::Response::new(reply);
    *response.metadata_mut() = metadata;
    Ok(response)
}
