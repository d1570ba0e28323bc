//! Interval arithmetic on one clock: the union of possibly overlapping spans
//! (GPU work across streams) and the holes between them.

/// Merges `spans` (any order, any overlap) into sorted, disjoint spans.
/// Touching spans merge; empty spans contribute nothing.
pub fn union(mut spans: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    spans.retain(|&(s, e)| e > s);
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Total length of disjoint spans.
pub fn total(spans: &[(u64, u64)]) -> u64 {
    spans.iter().map(|(s, e)| e - s).sum()
}

/// The holes between consecutive disjoint spans.
pub fn holes(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    spans.windows(2).map(|w| (w[0].1, w[1].0)).collect()
}

/// Clips disjoint spans to `[lo, hi)`.
pub fn clip(spans: &[(u64, u64)], lo: u64, hi: u64) -> Vec<(u64, u64)> {
    spans
        .iter()
        .map(|&(s, e)| (s.max(lo), e.min(hi)))
        .filter(|(s, e)| e > s)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_nested_adjacent_empty_and_out_of_order() {
        let spans = vec![
            (50, 60), // out of order
            (0, 10),  //
            (5, 20),  // overlaps the first
            (8, 9),   // nested
            (20, 30), // adjacent: merges
            (40, 40), // empty
            (45, 55), // overlaps (50, 60) from the left
            (100, 100),
        ];
        let u = union(spans);
        assert_eq!(u, vec![(0, 30), (45, 60)]);
        assert_eq!(total(&u), 45);
        assert_eq!(holes(&u), vec![(30, 45)]);
        assert_eq!(clip(&u, 10, 50), vec![(10, 30), (45, 50)]);
        assert!(union(vec![]).is_empty());
        assert!(holes(&[(0, 1)]).is_empty());
    }

    #[test]
    fn two_streams_busy_is_the_union_not_the_sum() {
        // Stream A: 0-100, 200-300; stream B: 50-250.
        let u = union(vec![(0, 100), (200, 300), (50, 250)]);
        assert_eq!(u, vec![(0, 300)]);
        assert_eq!(total(&u), 300);
    }
}
