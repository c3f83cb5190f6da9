//! etcd as the fencing-token authority: [`EtcdFences`], a
//! [`FenceStore`](idem_core::FenceStore) whose leases live in an etcd
//! cluster.
//!
//! A lease on a resource is the key `PREFIX/fences/RESOURCE`, bound to an
//! etcd lease with the requested time to live. Its fencing token is the key's
//! *creation revision*: etcd's revision counter is one number for the whole
//! cluster, replicated by Raft, and only ever grows, so a holder that takes
//! the resource after another gets a greater token, across restarts of every
//! member, without a counter of Idem's own. The key outlives renewals (a
//! renewal rebinds it to a fresh etcd lease; its creation revision stays), and
//! goes when its etcd lease runs out or is released; the next holder creates
//! it again, at a later revision.
//!
//! Every step is one etcd transaction that compares the key's creation
//! revision with the token:
//!
//! | call | compare | then | else |
//! |---|---|---|---|
//! | [`acquire`](idem_core::FenceStore::acquire) | the key does not exist | create it on a new etcd lease: the token is the transaction's revision | `LeaseHeld`, with the holder's time left |
//! | [`renew`](idem_core::FenceStore::renew) | creation revision = token | rebind it to a new etcd lease of the new time to live | `Stale`: another holder (or nobody) has it |
//! | [`release`](idem_core::FenceStore::release) | creation revision = token | delete it, revoke its etcd lease | `Stale` |
//!
//! A holder learns that its lease lapsed before its next write by asking
//! [`EtcdFences::check`]; the guarded write in the database refuses its old
//! token anyway once a newer holder has written.
//!
//! etcd rounds a time to live up to whole seconds and to its own minimum
//! (with default settings, two seconds); [`Lease::until`] says what was
//! granted.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use idem_core::{
    Clock, Error, ErrorKind, FenceStore, FencingToken, Lease, Resource, StoreError, SystemClock,
};

/// How long connecting to etcd, and each request, may take before the call
/// fails as unavailable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Leases with fencing tokens on named resources, kept in etcd. Cheap to
/// clone: clones share the connection.
#[derive(Clone)]
pub struct EtcdFences {
    client: Client,
    prefix: String,
}

impl std::fmt::Debug for EtcdFences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdFences")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdFences {
    /// Connects to the etcd cluster at `endpoints` (`127.0.0.1:2379`,
    /// `http://etcd-0:2379`); the leases' keys go under `prefix` (`idem`,
    /// `payments/idem`), so several applications can share a cluster.
    ///
    /// Errors, as unavailable, when no endpoint answers within 5 s.
    pub async fn connect<E: AsRef<str>>(endpoints: &[E], prefix: &str) -> Result<Self, Error> {
        let options = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| etcd_error("connect", e))?;
        Ok(Self {
            client,
            prefix: prefix.trim_end_matches('/').to_owned(),
        })
    }

    /// The key that holds `resource`'s lease.
    fn key(&self, resource: &Resource) -> Vec<u8> {
        format!("{}/fences/{resource}", self.prefix).into_bytes()
    }

    /// How long `lease` has left, in whole seconds as etcd counts them, if it
    /// is still its holder's: call it before a write that must not happen
    /// after the lease lapsed (zero means less than a second: renew first).
    /// `Stale` when the etcd lease ran out (or was released) or another
    /// holder has the resource.
    pub async fn check(&self, lease: &Lease) -> Result<Duration, Error> {
        let mut client = self.client.clone();
        let found = client
            .get(self.key(&lease.resource), None)
            .await
            .map_err(|e| etcd_error("read a lease", e))?;
        match found.kvs().first() {
            Some(kv) if kv.create_revision() == lease.token.get() => {
                match time_left(&mut client, kv).await? {
                    Some(left) => Ok(left),
                    None => Err(stale(lease, Some(kv.create_revision()))),
                }
            }
            other => Err(stale(lease, other.map(KeyValue::create_revision))),
        }
    }

    /// A new etcd lease of (at least) `ttl`: its id and the seconds granted.
    async fn grant(&self, ttl: Duration) -> Result<(i64, Duration), Error> {
        let seconds = i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .unwrap_or(i64::MAX)
            .max(1);
        let granted = self
            .client
            .clone()
            .lease_grant(seconds, None)
            .await
            .map_err(|e| etcd_error("grant a lease", e))?;
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        Ok((granted.id(), granted_ttl))
    }

    /// Revokes an etcd lease that is no longer needed; a failure only means
    /// it runs out by itself.
    async fn revoke(&self, id: i64) {
        if let Err(error) = self.client.clone().lease_revoke(id).await {
            tracing::debug!(%error, id, "could not revoke an etcd lease; it runs out by itself");
        }
    }

    /// Runs `txn`; on an error, revokes the etcd lease `granted` made for it.
    async fn run(&self, txn: Txn, granted: Option<i64>, what: &str) -> Result<TxnResponse, Error> {
        match self.client.clone().txn(txn).await {
            Ok(response) => Ok(response),
            Err(error) => {
                if let Some(id) = granted {
                    self.revoke(id).await;
                }
                Err(etcd_error(what, error))
            }
        }
    }
}

impl FenceStore for EtcdFences {
    async fn acquire(&self, resource: &Resource, ttl: Duration) -> Result<Lease, Error> {
        let key = self.key(resource);
        let (id, granted) = self.grant(ttl).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                resource.as_str(),
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let response = self.run(txn, Some(id), "take a lease").await?;
        if response.succeeded() {
            let revision = response.header().map_or(0, |h| h.revision());
            let token = FencingToken::new(revision).ok_or_else(|| {
                Error::Store(StoreError::new(
                    ErrorKind::Corrupt,
                    format!("etcd answered a lease with revision {revision}, which is no token"),
                ))
            })?;
            return Ok(Lease {
                resource: resource.clone(),
                token,
                until: SystemClock.now().plus(granted),
            });
        }
        self.revoke(id).await;
        let retry_after = match first_kv(&response) {
            Some(holder) => time_left(&mut self.client.clone(), &holder)
                .await?
                .unwrap_or_default(),
            None => Duration::ZERO,
        };
        Err(Error::LeaseHeld {
            resource: resource.clone(),
            retry_after: retry_after.max(Duration::from_millis(100)),
        })
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, Error> {
        let key = self.key(&lease.resource);
        let (id, granted) = self.grant(ttl).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                lease.token.get(),
            )])
            .and_then([
                TxnOp::get(key.clone(), None),
                TxnOp::put(
                    key.clone(),
                    lease.resource.as_str(),
                    Some(PutOptions::new().with_lease(id)),
                ),
            ])
            .or_else([TxnOp::get(key, None)]);
        let response = self.run(txn, Some(id), "renew a lease").await?;
        let held = first_kv(&response);
        if !response.succeeded() {
            self.revoke(id).await;
            return Err(stale(lease, held.map(|kv| kv.create_revision())));
        }
        if let Some(old) = held
            .map(|kv| kv.lease())
            .filter(|old| *old != 0 && *old != id)
        {
            self.revoke(old).await;
        }
        Ok(Lease {
            until: SystemClock.now().plus(granted),
            ..lease.clone()
        })
    }

    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        let key = self.key(&lease.resource);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                lease.token.get(),
            )])
            .and_then([
                TxnOp::get(key.clone(), None),
                TxnOp::delete(key.clone(), None),
            ])
            .or_else([TxnOp::get(key, None)]);
        let response = self.run(txn, None, "release a lease").await?;
        let held = first_kv(&response);
        if !response.succeeded() {
            return Err(stale(lease, held.map(|kv| kv.create_revision())));
        }
        if let Some(id) = held.map(|kv| kv.lease()).filter(|id| *id != 0) {
            self.revoke(id).await;
        }
        Ok(())
    }
}

/// The key-value the transaction's first operation (a get) read, if any.
fn first_kv(response: &TxnResponse) -> Option<KeyValue> {
    response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(mut got) => Some(got.take_kvs()),
            _ => None,
        })
        .and_then(|kvs| kvs.into_iter().next())
}

/// How long the etcd lease `kv` is bound to has left, in whole seconds;
/// `None` when it has no lease or its lease ran out.
async fn time_left(client: &mut Client, kv: &KeyValue) -> Result<Option<Duration>, Error> {
    if kv.lease() == 0 {
        return Ok(None);
    }
    let alive = client
        .lease_time_to_live(kv.lease(), None)
        .await
        .map_err(|e| etcd_error("read a lease's time left", e))?;
    // etcd answers -1 for a lease that ran out.
    Ok(u64::try_from(alive.ttl()).ok().map(Duration::from_secs))
}

fn stale(lease: &Lease, stored: Option<i64>) -> Error {
    let error = Error::Stale {
        target: format!("etcd lease on {}", lease.resource),
        carried: lease.token.get(),
        stored,
    };
    idem_core::observe::refused(&error);
    error
}

/// An etcd client error as a store error: unavailable (and so retryable)
/// when etcd could not be reached or did not answer in time.
fn etcd_error(doing: &str, error: etcd_client::Error) -> Error {
    let kind = match &error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            ErrorKind::Unavailable
        }
        etcd_client::Error::GRpcStatus(status)
            if matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
            ) =>
        {
            ErrorKind::Unavailable
        }
        _ => ErrorKind::Other,
    };
    Error::Store(StoreError::with_source(
        kind,
        format!("etcd: cannot {doing}; check that etcd answers at the configured endpoints"),
        error,
    ))
}
