//! One connected publisher per destination, opened on first use and kept for
//! the relay's life; dropped after a failure that says the connection is gone,
//! so the next use reconnects.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::publish::{self, Destination, PublishError, PublishErrorKind, Publisher};

#[derive(Debug, Default)]
pub(super) struct Publishers {
    open: Mutex<HashMap<Destination, Arc<Publisher>>>,
}

impl Publishers {
    /// The publisher for `destination`, connecting if there is none.
    pub(super) async fn get(
        &self,
        destination: &Destination,
    ) -> Result<Arc<Publisher>, PublishError> {
        let mut open = self.open.lock().await;
        if let Some(publisher) = open.get(destination) {
            return Ok(Arc::clone(publisher));
        }
        let publisher = Arc::new(publish::connect(destination).await?);
        open.insert(destination.clone(), Arc::clone(&publisher));
        Ok(publisher)
    }

    /// Forgets the publisher of `destination` after `error`, if the error
    /// means its connection is unusable.
    pub(super) async fn forget_after(&self, destination: &Destination, error: &PublishError) {
        if error.kind() == PublishErrorKind::Unavailable {
            self.open.lock().await.remove(destination);
        }
    }
}
