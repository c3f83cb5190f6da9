//! Letting a caller on to the writer. [`SqliteStore::admit`] is the fast path
//! of `apply`: a read on a reader connection answers most duplicates (a
//! replay, a reused key, a live claim) without touching the writer, and the
//! in-process hold answers a concurrent duplicate `InFlight` at once. A leased
//! `claim` takes the hold and goes to the writer directly.

use idem_core::{Error, Operation, Replay};

use crate::decision::{Protocol, Step};
use crate::holds::Hold;
use crate::records;
use crate::store::SqliteStore;

impl SqliteStore {
    pub(crate) fn protocol(&self) -> Protocol<'_> {
        Protocol {
            settings: self.settings(),
            now: self.clock().now(),
        }
    }

    /// Answers from a reader connection when the record settles the matter
    /// (replay, key reuse, a live lease); `None` when the writer must decide.
    pub(crate) async fn answer_early(&self, op: &Operation) -> Result<Option<Replay>, Error> {
        let (scope, key) = (op.scope.to_string(), op.key.to_string());
        let Some(found) = self
            .connections()
            .read(move |conn| records::select(conn, &scope, &key))
            .await?
        else {
            return Ok(None);
        };
        match self.protocol().step(Some(&found), op) {
            Step::Answer(answer) => answer.map(Some),
            Step::Run(_) => Ok(None),
        }
    }

    /// Lets a caller on to the writer: the stored outcome when a reader already
    /// settles the matter, otherwise the in-process hold on the key (or
    /// `InFlight` when another caller has it).
    pub(crate) async fn admit(&self, op: &Operation) -> Result<Result<Hold, Replay>, Error> {
        if let Some(replay) = self.answer_early(op).await? {
            return Ok(Err(replay));
        }
        self.hold(op).map(Ok)
    }
}
