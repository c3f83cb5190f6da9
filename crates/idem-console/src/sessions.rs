//! Signed-in browsers: a session is a random id the browser keeps in its
//! cookie, mapped here to the role of the token it signed in with. The
//! token itself never leaves the sign-in request, so a copied cookie is
//! worth no more than its session, which ends on sign-out, after
//! [`SessionLimits::idle`] without a request, and at the latest
//! [`SessionLimits::absolute`] after the sign-in, whichever comes first.
//!
//! Sessions live in the console's memory: a restart signs every browser out.
//! Ids are 256 random bits in hex; the table is keyed by their BLAKE3 hash,
//! so neither a lookup's timing nor a dump of the table gives an id away.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem::Timestamp;

use crate::access::Role;

/// How long a session lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session not used for this long ends.
    pub idle: Duration,
    /// A session ends this long after its sign-in, however much it is used.
    pub absolute: Duration,
}

impl Default for SessionLimits {
    /// Two hours idle, twelve hours in all.
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(2 * 3600),
            absolute: Duration::from_secs(12 * 3600),
        }
    }
}

/// The most sessions kept at once; past it the least recently used ends.
const MOST_SESSIONS: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Session {
    role: Role,
    opened: Timestamp,
    used: Timestamp,
}

/// The sessions of one console.
#[derive(Debug)]
pub(crate) struct Sessions {
    limits: SessionLimits,
    open: Mutex<HashMap<[u8; 32], Session>>,
}

fn key(id: &str) -> [u8; 32] {
    *blake3::hash(id.as_bytes()).as_bytes()
}

impl Sessions {
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Self {
            limits,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn limits(&self) -> SessionLimits {
        self.limits
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn live(&self, session: &Session, now: Timestamp) -> bool {
        now < session.used.plus(self.limits.idle) && now < session.opened.plus(self.limits.absolute)
    }

    /// A new session for `role`: its id, for the cookie.
    pub(crate) fn open(&self, role: Role, now: Timestamp) -> String {
        let bytes: [u8; 32] = rand::random();
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut table = self.table();
        if table.len() >= MOST_SESSIONS {
            table.retain(|_, session| self.live(session, now));
        }
        if table.len() >= MOST_SESSIONS
            && let Some(oldest) = table
                .iter()
                .min_by_key(|(_, session)| session.used)
                .map(|(key, _)| *key)
        {
            table.remove(&oldest);
        }
        table.insert(
            key(&id),
            Session {
                role,
                opened: now,
                used: now,
            },
        );
        id
    }

    /// The role of session `id` when it is still open; using it counts as
    /// activity. An ended session is forgotten.
    pub(crate) fn find(&self, id: &str, now: Timestamp) -> Option<Role> {
        let key = key(id);
        let mut table = self.table();
        let session = table.get_mut(&key)?;
        if self.live(session, now) {
            session.used = now;
            Some(session.role)
        } else {
            table.remove(&key);
            None
        }
    }

    /// Ends session `id`.
    pub(crate) fn close(&self, id: &str) {
        self.table().remove(&key(id));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idem::Timestamp;

    use super::{SessionLimits, Sessions};
    use crate::access::Role;

    #[test]
    fn a_session_ends_when_idle_at_its_bound_or_on_sign_out() {
        let sessions = Sessions::new(SessionLimits {
            idle: Duration::from_secs(60),
            absolute: Duration::from_secs(150),
        });
        let start = Timestamp(1_000_000);
        let id = sessions.open(Role::Viewer, start);
        assert_eq!(id.len(), 64);
        assert_ne!(sessions.open(Role::Viewer, start), id);
        let at = |secs| start.plus(Duration::from_secs(secs));
        assert_eq!(sessions.find(&id, at(50)), Some(Role::Viewer));
        assert_eq!(
            sessions.find(&id, at(100)),
            Some(Role::Viewer),
            "kept alive"
        );
        assert_eq!(sessions.find(&id, at(149)), Some(Role::Viewer));
        assert_eq!(sessions.find(&id, at(150)), None, "the absolute bound");
        assert_eq!(sessions.find(&id, at(0)), None, "forgotten");

        let idle = sessions.open(Role::Operator, start);
        assert_eq!(sessions.find(&idle, at(60)), None, "idle too long");
        let closed = sessions.open(Role::Operator, start);
        sessions.close(&closed);
        assert_eq!(sessions.find(&closed, start), None);
        assert_eq!(sessions.find("not-an-id", start), None);
    }
}
