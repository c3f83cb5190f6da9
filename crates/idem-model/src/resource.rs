//! The resource the effect writes to, outside the store: it keeps the last
//! fencing token it accepted and refuses a write carrying an older one (a
//! guarded write with `Guard::fence`, tokens compared with `>=`).

use idem_core::FencingToken;

/// What the resource has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Resource {
    /// The token of the last accepted write.
    pub last: Option<FencingToken>,
    /// How many writes it accepted.
    pub writes: u8,
}

impl Resource {
    /// A write carrying `token`: accepted (and the token kept) unless the
    /// resource has already accepted a greater one.
    pub fn write(&mut self, token: FencingToken) -> bool {
        if self.last.is_some_and(|last| token < last) {
            return false;
        }
        self.last = Some(token);
        self.writes += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_tokens_are_refused_and_equal_ones_accepted() {
        let (one, two) = (FencingToken::FIRST, FencingToken::FIRST.next());
        let mut resource = Resource::default();
        assert!(resource.write(two));
        assert!(!resource.write(one));
        assert!(resource.write(two));
        assert_eq!((resource.last, resource.writes), (Some(two), 2));
    }
}
