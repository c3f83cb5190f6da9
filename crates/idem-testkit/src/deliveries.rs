//! At-least-once delivery, simulated: every item delivered one or more times,
//! in shuffled order. The property tests use it to show that a handler
//! reaches the same state on `S` as on `S` with duplicates.

use proptest::prelude::*;
use rand::Rng;
use rand::seq::SliceRandom;

/// Each item copied 1 to `max_copies` times, then the whole list shuffled.
pub fn duplicate_and_shuffle<T: Clone>(
    items: &[T],
    max_copies: usize,
    rng: &mut impl Rng,
) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len() * (max_copies + 1) / 2);
    for item in items {
        for _ in 0..rng.random_range(1..=max_copies.max(1)) {
            out.push(item.clone());
        }
    }
    out.shuffle(rng);
    out
}

/// A proptest strategy: `items` delivered 1–3 times each, in a random order.
pub fn redelivered<T: Clone + std::fmt::Debug>(items: Vec<T>) -> impl Strategy<Value = Vec<T>> {
    let n = items.len();
    (proptest::collection::vec(1usize..=3, n), any::<u64>()).prop_map(move |(copies, seed)| {
        let mut out: Vec<T> = items
            .iter()
            .zip(&copies)
            .flat_map(|(item, &k)| std::iter::repeat_n(item.clone(), k))
            .collect();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        out.shuffle(&mut rng);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn every_item_arrives_at_least_once_and_at_most_max_copies() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let items: Vec<u32> = (0..200).collect();
        let delivered = duplicate_and_shuffle(&items, 3, &mut rng);
        for item in &items {
            let n = delivered.iter().filter(|d| *d == item).count();
            assert!((1..=3).contains(&n), "{item} delivered {n} times");
        }
        assert!(delivered.len() > items.len(), "some duplicates expected");
        assert_ne!(&delivered[..items.len()], &items[..], "order shuffled");
    }
}
