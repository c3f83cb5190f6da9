//! In-batch dedupe: which operations of a batch share a key.
//!
//! A batch (`apply_batch`, `apply_set`) may carry the same `(scope, key)`
//! more than once, as a redelivered message does. Only a key's first
//! operation is decided against the record the store found; its later ones
//! are decided against the record that first one leaves (so they replay its
//! outcome, or are refused as `KeyReuse` for another payload). Which
//! operations those are is protocol, not storage: [`decide_batch`] says it
//! once, for every store.

use std::collections::HashMap;

use crate::key::{IdempotencyKey, Scope};
use crate::store::Operation;

/// The operations of a batch grouped by key.
///
/// Each distinct `(scope, key)` gets a *slot*, numbered in the order the keys
/// first occur in the batch. A store locks, reads and writes one record per
/// slot; an operation finds its key's record through [`slot_of`](Self::slot_of).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPlan {
    /// `slot_of[i]`: the slot of `ops[i]`.
    slot_of: Vec<usize>,
    /// `firsts[slot]`: the index of the first operation with that slot's key.
    firsts: Vec<usize>,
    /// Each key's slot.
    slots: HashMap<(Scope, IdempotencyKey), usize>,
}

/// Groups the operations of a batch by key (see [`BatchPlan`]).
///
/// ```
/// use idem_core::{decide_batch, Fingerprint, IdempotencyKey, Operation, Scope};
/// let op = |key: &str| Operation::new(
///     Scope::new("s").unwrap(),
///     IdempotencyKey::new(key).unwrap(),
///     Fingerprint::of_bytes(b"x"),
/// );
/// let ops = [op("a"), op("b"), op("a")];
/// let plan = decide_batch(&ops);
/// assert_eq!(plan.slots(), 2);
/// assert_eq!((plan.slot_of(0), plan.slot_of(1), plan.slot_of(2)), (0, 1, 0));
/// assert!(plan.is_first(0) && plan.is_first(1) && !plan.is_first(2));
/// ```
pub fn decide_batch(ops: &[Operation]) -> BatchPlan {
    let mut slots: HashMap<(Scope, IdempotencyKey), usize> = HashMap::new();
    let mut firsts = Vec::new();
    let slot_of = ops
        .iter()
        .enumerate()
        .map(|(index, op)| {
            *slots
                .entry((op.scope.clone(), op.key.clone()))
                .or_insert_with(|| {
                    firsts.push(index);
                    firsts.len() - 1
                })
        })
        .collect();
    BatchPlan {
        slot_of,
        firsts,
        slots,
    }
}

impl BatchPlan {
    /// How many distinct keys the batch has.
    pub fn slots(&self) -> usize {
        self.firsts.len()
    }

    /// How many operations the batch has.
    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// Whether the batch has no operations.
    pub fn is_empty(&self) -> bool {
        self.slot_of.is_empty()
    }

    /// The slot of the key of operation `index`.
    pub fn slot_of(&self, index: usize) -> usize {
        self.slot_of[index]
    }

    /// The slot of `(scope, key)`, if the batch has that key.
    pub fn slot_of_key(&self, scope: &Scope, key: &IdempotencyKey) -> Option<usize> {
        // A lookup by reference would need a borrowed key type; keys are short.
        self.slots.get(&(scope.clone(), key.clone())).copied()
    }

    /// Whether operation `index` is the first of its key: the one decided
    /// against the record the store found.
    pub fn is_first(&self, index: usize) -> bool {
        self.firsts[self.slot_of[index]] == index
    }

    /// The index of the first operation of each slot, in slot order.
    pub fn firsts(&self) -> &[usize] {
        &self.firsts
    }

    /// The batch's distinct keys, in slot order.
    pub fn keys<'a>(
        &'a self,
        ops: &'a [Operation],
    ) -> impl Iterator<Item = (&'a Scope, &'a IdempotencyKey)> + 'a {
        self.firsts
            .iter()
            .map(move |&index| (&ops[index].scope, &ops[index].key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;

    fn op(scope: &str, key: &str, payload: &[u8]) -> Operation {
        Operation::new(
            Scope::new(scope).unwrap(),
            IdempotencyKey::new(key).unwrap(),
            Fingerprint::of_bytes(payload),
        )
    }

    #[test]
    fn repeated_keys_share_the_slot_of_their_first_operation() {
        let ops = [
            op("s", "a", b"1"),
            op("s", "b", b"1"),
            op("s", "a", b"1"),
            op("s", "a", b"2"),
            op("s", "c", b"1"),
            op("s", "b", b"1"),
        ];
        let plan = decide_batch(&ops);
        assert_eq!((plan.len(), plan.slots()), (6, 3));
        let slots: Vec<usize> = (0..ops.len()).map(|i| plan.slot_of(i)).collect();
        assert_eq!(slots, [0, 1, 0, 0, 2, 1]);
        assert_eq!(plan.firsts(), [0, 1, 4]);
        let firsts: Vec<bool> = (0..ops.len()).map(|i| plan.is_first(i)).collect();
        assert_eq!(firsts, [true, true, false, false, true, false]);
        let keys: Vec<&str> = plan.keys(&ops).map(|(_, k)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }

    #[test]
    fn a_key_is_the_scope_and_the_key_together() {
        let ops = [op("s", "a", b"1"), op("t", "a", b"1")];
        let plan = decide_batch(&ops);
        assert_eq!(plan.slots(), 2);
        assert!(plan.is_first(1));
        let (t, a) = (Scope::new("t").unwrap(), IdempotencyKey::new("a").unwrap());
        assert_eq!(plan.slot_of_key(&t, &a), Some(1));
        let b = IdempotencyKey::new("b").unwrap();
        assert_eq!(plan.slot_of_key(&t, &b), None);
    }

    #[test]
    fn an_empty_batch_has_no_slots() {
        let plan = decide_batch(&[]);
        assert!(plan.is_empty());
        assert_eq!(plan.slots(), 0);
    }
}
