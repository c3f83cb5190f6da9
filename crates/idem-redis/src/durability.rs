//! How many replicas must hold a write before it is acknowledged.
//!
//! Redis replicates asynchronously: a primary answers a write at once and
//! sends it to its replicas afterwards. A primary that dies in between takes
//! the write with it, and a replica promoted in its place has never seen it:
//! an acknowledged claim is gone (a duplicate then runs the effect a second
//! time), an acknowledged completion is gone (a duplicate runs it again too).
//! With [`Durability::replicas`], every write is followed by `WAIT`, and the
//! caller is answered only once that many replicas have the write, or told
//! that they did not in time.

use std::time::Duration;

/// Whether each write waits for replicas (`WAIT`), and for how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A write is acknowledged once the primary has it (Redis's default). A
    /// failover can lose the writes of the last moments before it.
    #[default]
    Primary,
    /// A write is acknowledged once `count` replicas have it; when fewer do
    /// within `timeout`, the call fails with
    /// [`ErrorKind::CommitUnknown`](idem_core::ErrorKind::CommitUnknown)
    /// (the primary has the write; whether it survives a failover is
    /// unknown). Retrying under the same key is safe.
    Replicas {
        /// How many replicas must acknowledge.
        count: u32,
        /// How long to wait for them.
        timeout: Duration,
    },
}

impl Durability {
    /// Waits for `count` replicas, at most `timeout`.
    pub fn replicas(count: u32, timeout: Duration) -> Self {
        if count == 0 {
            Self::Primary
        } else {
            Self::Replicas { count, timeout }
        }
    }
}
