//! Errors as an application wraps them, for tests of how a store classifies
//! an effect's failure through its causes.

use std::fmt;

/// An application's error that carries another (a driver's) as its source,
/// and says nothing of it in its own message.
#[derive(Debug)]
pub struct Wrapped<E>(pub E);

impl<E: std::error::Error + 'static> fmt::Display for Wrapped<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the handler failed")
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Wrapped<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}
