//! Sessions of one job, recorded on several machines, on one clock. Each
//! session's header pairs its CLOCK_MONOTONIC start with the wall clock's,
//! which puts it on the wall clock as far as the machines' clocks agree
//! (NTP: within milliseconds, often worse). Where the ranks meet in
//! collectives, the collectives refine that: ranks issue a communicator's
//! collectives in the same order, and each one ends on every rank at once
//! (it completes when the last rank's data is in), so the ends of the same
//! collective on two ranks are the same moment. Then the starts say who
//! came last: the rank the others waited for.

use crate::timeline::totals::{DeviceTotals, GpuTotals};

/// The collectives' ends are matched only when, after the shift, they
/// agree this closely (median distance from the median offset); clocks
/// agreeing worse than this with no such evidence are left as they are.
const AGREE_NS: u64 = 1_000_000;
/// Fewer matched collectives than this are not evidence.
const MIN_MATCHED: usize = 3;

/// One rank as the alignment reads it.
pub struct RankClock {
    /// The session's start: CLOCK_MONOTONIC and wall clock, ns.
    pub start_ns: u64,
    pub start_unix_ns: u64,
    /// Its collectives' kernels, `(start, end)` on its monotonic clock, in
    /// issue order.
    pub collectives: Vec<(u64, u64)>,
}

/// Where a rank's session sits on the job's clock, and what the others
/// waited for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Added to the session's monotonic times: wall-clock ns.
    pub offset_ns: i128,
    /// The part of that offset the collectives set (0 when the header's
    /// clocks stood, or nothing refined them).
    pub refined_ns: i64,
    /// Its collectives matched with the reference rank's (the one with
    /// most); 0 when not matched.
    pub matched: usize,
    /// At matched collectives where this rank started last: the others'
    /// waits for it, summed.
    pub waited_for_ns: u64,
    /// Collectives it started last.
    pub last_at: usize,
    /// At matched collectives: the time its own kernel ran before the last
    /// rank's had started, on its own monotonic clock — waiting for peers,
    /// no data moved (a collective cannot progress until every rank is in).
    pub waiting: Vec<(u64, u64)>,
    /// Its matched collectives: `(start, n)`, its own kernel's start and
    /// the reference's index of the collective, the same on every rank.
    pub met: Vec<(u64, usize)>,
}

/// The GPU of a session whose collectives stand for the session's: the
/// one that ran most of them (a node's GPUs run the same ones).
pub fn busiest(totals: &GpuTotals) -> Option<(u32, &DeviceTotals)> {
    totals
        .devices
        .iter()
        .max_by_key(|(_, d)| d.collectives.len())
        .map(|(&id, d)| (id, d))
}

/// The GPUs of one recording that meet in collectives (several ranks'
/// GPUs on one node, or one process driving several), on their one clock,
/// for the devices `ids`, in order. Nothing for any GPU when fewer than two
/// ran any.
pub fn waits_within(ids: impl Iterator<Item = u32>, totals: &GpuTotals) -> Vec<Placement> {
    let ids: Vec<u32> = ids.collect();
    let mut out = vec![Placement::default(); ids.len()];
    // One clock: no header offsets to start from.
    let (meeting, ranks): (Vec<usize>, Vec<RankClock>) = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let collectives = totals
                .devices
                .get(id)
                .map(|d| d.collectives.clone())
                .unwrap_or_default();
            let clock = RankClock {
                start_ns: 0,
                start_unix_ns: 0,
                collectives,
            };
            (i, clock)
        })
        .filter(|(_, r)| !r.collectives.is_empty())
        .unzip();
    if ranks.len() < 2 {
        return out;
    }
    for (i, p) in meeting.into_iter().zip(align(&ranks)) {
        out[i] = p;
    }
    out
}

/// Places every rank on the job's clock.
pub fn align(ranks: &[RankClock]) -> Vec<Placement> {
    let mut out: Vec<Placement> = ranks
        .iter()
        .map(|r| Placement {
            offset_ns: r.start_unix_ns as i128 - r.start_ns as i128,
            ..Placement::default()
        })
        .collect();
    // The first of those with most collectives: the others move to its clock.
    let Some(reference) =
        (0..ranks.len()).max_by_key(|&i| (ranks[i].collectives.len(), std::cmp::Reverse(i)))
    else {
        return out;
    };
    let wall = |i: usize, t: u64, out: &[Placement]| t as i128 + out[i].offset_ns;
    // The index into the reference's collectives of each rank's first.
    let mut shift: Vec<Option<i64>> = vec![None; ranks.len()];
    let r_ends: Vec<i128> = ranks[reference]
        .collectives
        .iter()
        .map(|c| wall(reference, c.1, &out))
        .collect();
    for (i, r) in ranks.iter().enumerate() {
        if i == reference {
            shift[i] = Some(0);
            continue;
        }
        let ends: Vec<i128> = r.collectives.iter().map(|c| wall(i, c.1, &out)).collect();
        let Some(&first) = ends.first() else { continue };
        // The reference's collectives around this rank's first on the
        // header clocks: the shift whose ends agree best, and of equals
        // (collectives at a steady pace agree at every shift) the one
        // nearest what the clocks say. Clocks off by more than half the
        // time between collectives cannot be told from the next shift.
        let near = r_ends.partition_point(|&e| e < first) as i64;
        let best = (near - 2..=near + 2)
            .filter_map(|s| {
                let d = differences(&r_ends, &ends, s);
                (d.len() >= MIN_MATCHED).then(|| (s, spread(&d), median(&d), d.len()))
            })
            .min_by_key(|x| (x.1 / 1000, x.2.unsigned_abs()));
        if let Some((s, spread, d, n)) = best {
            if spread <= AGREE_NS {
                shift[i] = Some(s);
                out[i].offset_ns += d;
                out[i].refined_ns = d as i64;
                out[i].matched = n;
            }
        }
    }
    // A rank whose collectives could not be placed might be the one the
    // others waited for: nobody is named rather than the wrong one.
    let Some(shift) = shift.into_iter().collect::<Option<Vec<i64>>>() else {
        return out;
    };
    if ranks.len() < 2 {
        return out;
    }
    out[reference].matched = r_ends.len();
    // Each of the reference's collectives that every rank ran too: who
    // started it last, and how long the others waited.
    for n in 0..r_ends.len() as i64 {
        let starts: Option<Vec<Arrival>> = shift
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let own = *ranks[i].collectives.get(usize::try_from(n - s).ok()?)?;
                Some(Arrival {
                    rank: i,
                    own,
                    at: wall(i, own.0, &out),
                })
            })
            .collect();
        let Some(starts) = starts else { continue };
        let Some(&Arrival { rank: last, at, .. }) = starts.iter().max_by_key(|x| x.at) else {
            continue;
        };
        out[last].last_at += 1;
        out[last].waited_for_ns += starts.iter().map(|x| (at - x.at) as u64).sum::<u64>();
        for &Arrival {
            rank: i,
            own: (from, to),
            at: start,
        } in &starts
        {
            out[i].met.push((from, n as usize));
            let until = from.saturating_add((at - start) as u64).min(to);
            if until > from {
                out[i].waiting.push((from, until));
            }
        }
    }
    out
}

/// A rank at one collective: its kernel on its own clock, and its start
/// on the aligned clock.
struct Arrival {
    rank: usize,
    own: (u64, u64),
    at: i128,
}

/// The reference's end less the rank's, for each of the rank's
/// collectives matched with the reference's `k + s`-th.
fn differences(reference: &[i128], ends: &[i128], s: i64) -> Vec<i128> {
    ends.iter()
        .enumerate()
        .filter_map(|(k, &e)| {
            let j = usize::try_from(k as i64 + s).ok()?;
            reference.get(j).map(|&r| r - e)
        })
        .collect()
}

fn median(v: &[i128]) -> i128 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Median distance from the median.
fn spread(v: &[i128]) -> u64 {
    let m = median(v);
    let d: Vec<i128> = v.iter().map(|x| (x - m).abs()).collect();
    median(&d) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Three ranks, 20 all-reduces 10 ms apart; rank 2 starts each 2 ms
    /// after the others, rank 1 a little before them. Each machine's
    /// wall clock is off: rank 1's by +3.5 ms, rank 2's by −1.2 ms.
    fn job(skew: [i64; 3], recorded_from: [usize; 3]) -> Vec<RankClock> {
        (0..3)
            .map(|r| {
                // Monotonic clocks with their own zero.
                let zero = 1_000_000 * MS * (r as u64 + 1);
                let early = [0, 300_000, 0][r];
                let late = [0, 0, 2 * MS][r];
                let collectives = (recorded_from[r]..20)
                    .map(|n| {
                        let end = 100 * MS + n as u64 * 10 * MS + 3 * MS;
                        let start = end - 3 * MS + late - early;
                        (zero + start, zero + end)
                    })
                    .collect();
                RankClock {
                    start_ns: zero,
                    start_unix_ns: (1_700_000_000_000 * MS as i64 + skew[r]) as u64,
                    collectives,
                }
            })
            .collect()
    }

    #[test]
    fn collectives_ends_correct_the_wall_clocks() {
        let ranks = job([0, 3_500_000, -1_200_000], [0, 0, 0]);
        let p = align(&ranks);
        assert_eq!(p[0].refined_ns, 0);
        assert_eq!(p[1].refined_ns, -3_500_000);
        assert_eq!(p[2].refined_ns, 1_200_000);
        // On the corrected clocks the same moment is the same number.
        for (r, x) in ranks.iter().zip(&p) {
            assert_eq!(
                r.collectives[0].1 as i128 + x.offset_ns,
                p_end(&ranks[0], &p[0])
            );
            assert_eq!(x.matched, 20);
        }
        // Rank 2 came last at every one: rank 0 waited 2 ms, rank 1 2.3.
        assert_eq!(p[2].last_at, 20);
        assert_eq!(p[2].waited_for_ns, 20 * (2 * MS + 2 * MS + 300_000));
        assert_eq!((p[0].waited_for_ns, p[1].waited_for_ns), (0, 0));
        // Each rank's own kernels waited for rank 2's start: rank 0's 2 ms,
        // rank 1's 2.3 ms, rank 2's not at all; on their own clocks.
        let waited = |r: usize| crate::intervals::total(&p[r].waiting);
        assert_eq!(
            (waited(0), waited(1), waited(2)),
            (20 * 2 * MS, 20 * (2 * MS + 300_000), 0)
        );
        assert_eq!(
            p[1].waiting[0],
            (
                ranks[1].collectives[0].0,
                ranks[1].collectives[0].0 + 2 * MS + 300_000
            )
        );
    }

    fn p_end(r: &RankClock, p: &Placement) -> i128 {
        r.collectives[0].1 as i128 + p.offset_ns
    }

    /// A rank whose recording began five collectives later, with its clock
    /// off by 4 ms (less than half the 10 ms between collectives: more
    /// could not be told from the next collective).
    #[test]
    fn a_rank_recorded_later_is_matched_by_its_collectives() {
        let ranks = job([0, 4 * MS as i64, 0], [0, 5, 0]);
        let p = align(&ranks);
        assert_eq!(p[1].refined_ns, -4 * MS as i64);
        assert_eq!(p[1].matched, 15);
        assert_eq!(p[2].last_at, 15, "only collectives every rank ran");
    }

    /// A rank whose collectives cannot be placed (its ends agree with no
    /// shift): the others keep their correction, nobody is named.
    #[test]
    fn an_unplaced_rank_names_nobody() {
        let mut ranks = job([0, 3_500_000, 0], [0, 0, 0]);
        for (n, c) in ranks[1].collectives.iter_mut().enumerate() {
            c.1 += (n as u64 % 4) * 3 * MS;
        }
        let p = align(&ranks);
        assert_eq!(p[1].matched, 0);
        assert_eq!(p[2].matched, 20);
        assert!(
            p.iter().all(|x| x.waited_for_ns == 0 && x.last_at == 0),
            "{p:?}"
        );
    }

    /// Ranks that never meet keep their header clocks and nobody waited.
    #[test]
    fn without_collectives_the_header_clocks_stand() {
        let mut ranks = job([0, 2 * MS as i64, 0], [0, 0, 0]);
        for r in &mut ranks {
            r.collectives.clear();
        }
        let p = align(&ranks);
        assert!(p
            .iter()
            .all(|x| x.refined_ns == 0 && x.matched == 0 && x.last_at == 0));
        assert_eq!(
            p[1].offset_ns - p[0].offset_ns,
            2 * MS as i128 + 1_000_000 * MS as i128 - 2_000_000 * MS as i128
        );
    }
}
