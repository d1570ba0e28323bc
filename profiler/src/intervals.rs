//! Interval arithmetic on one clock: the union of possibly overlapping spans
//! (GPU work across streams) and the holes between them.

/// Disjoint spans `(start, end)`, sorted.
pub type Spans = Vec<(u64, u64)>;

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

/// How much of `[a, b)` disjoint sorted spans cover.
pub fn within(spans: &[(u64, u64)], a: u64, b: u64) -> u64 {
    let i = spans.partition_point(|x| x.1 <= a);
    spans[i..]
        .iter()
        .take_while(|x| x.0 < b)
        .map(|x| x.1.min(b) - x.0.max(a))
        .sum()
}

/// The parts of disjoint sorted spans `a` that disjoint sorted spans `b`
/// also cover.
pub fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if e > s {
            out.push((s, e));
        }
        // The span that ends first can meet nothing further on.
        if a[i].1 <= b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The parts of disjoint sorted spans `a` that `b` does not cover.
pub fn minus(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > s {
                out.push((s, b[k].0));
            }
            s = s.max(b[k].1);
            k += 1;
        }
        if e > s {
            out.push((s, e));
        }
    }
    out
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
    fn intersect_and_minus_split_a_span_by_another_set() {
        let a = [(0, 10), (20, 30), (40, 50)];
        let b = [(5, 25), (28, 29), (45, 60)];
        assert_eq!(
            intersect(&a, &b),
            vec![(5, 10), (20, 25), (28, 29), (45, 50)]
        );
        assert_eq!(minus(&a, &b), vec![(0, 5), (25, 28), (29, 30), (40, 45)]);
        // What is taken and what is left make the whole.
        assert_eq!(total(&intersect(&a, &b)) + total(&minus(&a, &b)), total(&a));
        assert_eq!(minus(&a, &[]), a.to_vec());
        assert!(intersect(&a, &[]).is_empty());
        assert!(minus(&[(0, 10)], &[(0, 10)]).is_empty());
    }

    #[test]
    fn two_streams_busy_is_the_union_not_the_sum() {
        // Stream A: 0-100, 200-300; stream B: 50-250.
        let u = union(vec![(0, 100), (200, 300), (50, 250)]);
        assert_eq!(u, vec![(0, 300)]);
        assert_eq!(total(&u), 300);
    }
}
