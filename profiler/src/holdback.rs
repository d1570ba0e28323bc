//! Items held back to be handed out in the order of a key, then in the
//! order they came: a recording's events, and the GPU's work and calls read
//! back from their spools. Most come in order (a ring is written in time
//! order, bar the few a CPU hands in late; the GPU's records nearly so):
//! those wait in a queue as they came, and only the late ones in a heap —
//! a heap for all of them was a pop and a push of log n for every item.

use std::collections::{BinaryHeap, VecDeque};

pub struct Holdback<K, T> {
    in_order: VecDeque<Held<K, T>>,
    late: BinaryHeap<Held<K, T>>,
    /// Items taken in so far: the tie-break between equal keys.
    seq: u64,
}

impl<K, T> Default for Holdback<K, T> {
    fn default() -> Self {
        Holdback {
            in_order: VecDeque::new(),
            late: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<K: Ord + Copy, T> Holdback<K, T> {
    pub fn push(&mut self, key: K, item: T) {
        let held = Held {
            key,
            seq: self.seq,
            item,
        };
        self.seq += 1;
        // An equal key goes behind the queue's last: it came after it.
        match self.in_order.back() {
            Some(last) if key < last.key => self.late.push(held),
            _ => self.in_order.push_back(held),
        }
    }

    /// Whether the earliest item held is the heap's, if any is held.
    fn earliest_is_late(&self) -> Option<bool> {
        match (self.in_order.front(), self.late.peek()) {
            // The heap's order is reversed: greater is earlier.
            (Some(q), Some(l)) => Some(l > q),
            (Some(_), None) => Some(false),
            (None, Some(_)) => Some(true),
            (None, None) => None,
        }
    }

    /// The key of the earliest item held.
    pub fn first(&self) -> Option<K> {
        match self.earliest_is_late()? {
            true => self.late.peek().map(|h| h.key),
            false => self.in_order.front().map(|h| h.key),
        }
    }

    /// The earliest item held, taken out if its key is before `bound`.
    pub fn pop_before(&mut self, bound: K) -> Option<T> {
        self.first().filter(|k| *k < bound)?;
        self.pop()
    }

    /// The earliest item held, taken out.
    pub fn pop(&mut self) -> Option<T> {
        match self.earliest_is_late()? {
            true => self.late.pop().map(|h| h.item),
            false => self.in_order.pop_front().map(|h| h.item),
        }
    }
}

struct Held<K, T> {
    key: K,
    seq: u64,
    item: T,
}

impl<K: Ord, T> PartialEq for Held<K, T> {
    fn eq(&self, o: &Self) -> bool {
        (&self.key, self.seq) == (&o.key, o.seq)
    }
}
impl<K: Ord, T> Eq for Held<K, T> {}
impl<K: Ord, T> PartialOrd for Held<K, T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<K: Ord, T> Ord for Held<K, T> {
    // Reversed: BinaryHeap pops its greatest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (&o.key, o.seq).cmp(&(&self.key, self.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_come_out_by_key_then_in_the_order_they_went_in() {
        let mut rng = crate::testing::Rng::new(0x6a09_e667_f3bc_c908);
        let mut rand = |n: u64| rng.below(n);
        let mut h = Holdback::default();
        let mut all = Vec::new();
        let mut at = 100;
        for i in 0..5_000u32 {
            // Mostly in order, with ties, some late.
            let key = match rand(8) {
                0 => at - rand(100),
                _ => at,
            };
            at += rand(3);
            h.push(key, i);
            all.push((key, i));
            // Now and then take out what is due, as the readers do.
            if rand(4) == 0 {
                let due = at.saturating_sub(120);
                while let Some(k) = h.first().filter(|&k| k < due) {
                    let i = h.pop_before(due).unwrap();
                    let want = all.iter().min().copied().unwrap();
                    all.retain(|&x| x != want);
                    assert_eq!((k, i), want);
                }
            }
        }
        all.sort();
        let mut rest = Vec::new();
        while let Some(k) = h.first() {
            rest.push((k, h.pop().unwrap()));
        }
        assert_eq!(rest, all);
    }
}
