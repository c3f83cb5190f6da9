//! A worker as the model sees it: what it remembers between steps. A crash
//! forgets everything; a stall is simply the clock moving while a worker holds
//! a claim and takes no step.

use idem_core::FencingToken;

/// One worker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Worker {
    /// Has a copy of the message and no claim: its next step is a claim.
    Idle,
    /// Holds a claim, and may run the effect, complete, renew or release.
    Holding(Held),
    /// Recorded the key first (`apply_at_most_once`) and has still to run the
    /// effect.
    Recorded(Held),
    /// Finished: its claim completed, or the store replayed the outcome.
    Done,
    /// Refused by the store or the resource with a newer token: it stops.
    Fenced,
}

/// What a worker knows of the claim it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// The claim's fencing token, carried on every write.
    pub token: FencingToken,
    /// Which claim this is, counting from one (a ghost the store never sees:
    /// with a correct store it is the token, with a token bug it is not).
    pub claim: u8,
    /// Whether the effect's write was accepted by the resource.
    pub wrote: bool,
}
