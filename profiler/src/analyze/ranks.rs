//! Several ranks of one job side by side: each one's busy time, idle by
//! cause and collectives, their clocks aligned by the ends of the
//! collectives they share, and the rank the others wait for.

use serde::Serialize;

use super::cause::{Cause, IdleByCause};
use super::{align, figures, gpu, Labelled};

#[derive(Serialize)]
pub struct RankRow {
    pub label: String,
    pub rank: Option<String>,
    pub span_ns: u64,
    pub busy_ns: u64,
    pub busy_pct: f64,
    /// Busy running only collectives (NCCL), waiting for peers included.
    pub communication_ns: u64,
    pub idle_by_cause_ns: IdleByCause,
    pub top_cause: Option<Cause>,
    /// What the ends of collectives corrected of the session's wall clock
    /// (its header's; 0 when nothing did), and how many of its collectives
    /// were matched with the other ranks'.
    pub clock_refined_ns: i64,
    pub collectives_matched: usize,
    /// On the aligned clocks: at collectives this rank started last, the
    /// others' waits for it, summed; and how many it started last.
    pub waited_for_ns: u64,
    /// On the aligned clocks: its own collectives waiting for the last
    /// rank to start theirs, with no compute beside them.
    pub waiting_ns: u64,
    pub last_at: usize,
    /// The rank the others wait for: the one they waited for longest at
    /// matched collectives; else, where every rank ran collectives, the
    /// one that spent least time in them, on the GPU or waiting on the
    /// host (it arrives last, whatever made it late: its top cause says
    /// what); else the one with most GPU work.
    pub slowest: bool,
}

/// One row per input, and which of them the others wait for.
pub fn rows(inputs: &[Labelled]) -> Vec<RankRow> {
    let busiest: Vec<_> = inputs
        .iter()
        .map(|l| align::busiest(&l.analysis.timeline.gpu.totals))
        .collect();
    let clocks: Vec<align::RankClock> = inputs
        .iter()
        .zip(&busiest)
        .map(|(l, d)| align::RankClock {
            start_ns: l.analysis.facts.header.start_ns,
            start_unix_ns: l.analysis.facts.header.start_unix_ns,
            collectives: d.map(|(_, d)| d.collectives.clone()).unwrap_or_default(),
        })
        .collect();
    let placed = align::align(&clocks);
    let mut rows: Vec<RankRow> = inputs
        .iter()
        .zip(&placed)
        .zip(&busiest)
        .map(|((l, at), busiest)| {
            let a = &l.analysis;
            let gpu = busiest.and_then(|(id, _)| {
                a.diagnosis
                    .gpus
                    .iter()
                    .find(|g| g.gpu.device == id)
                    .map(|g| &g.gpu)
            });
            let each: Vec<(u64, figures::Gpu)> = a
                .diagnosis
                .gpus
                .iter()
                .map(|d| (d.gpu.span_ns(), figures::gpu(a, d)))
                .collect();
            let span = each.iter().map(|g| g.0).max().unwrap_or(0);
            let busy = each.iter().map(|g| g.1.busy_ns).sum::<u64>();
            let communication = each
                .iter()
                .map(|g| g.1.busy_by_kind_ns.communication)
                .sum::<u64>();
            let idle =
                IdleByCause::from_fn(|c| each.iter().map(|g| g.1.idle_by_cause_ns.get(c)).sum());
            // The largest removable cause; ties go to the first in contract
            // order.
            let top = idle
                .entries()
                .filter(|&(c, v)| v > 0 && c.removable())
                .fold(None, |best: Option<(Cause, u64)>, (c, v)| match best {
                    Some((_, bv)) if bv >= v => best,
                    _ => Some((c, v)),
                })
                .map(|(c, _)| c);
            let rank = a.facts.rank.map(|k| format!("{} of {}", k.rank, k.world));
            RankRow {
                label: l.label.clone(),
                rank,
                span_ns: span,
                busy_ns: busy,
                busy_pct: if span > 0 {
                    busy as f64 * 100.0 / span as f64
                } else {
                    0.0
                },
                communication_ns: communication,
                idle_by_cause_ns: idle,
                top_cause: top,
                clock_refined_ns: at.refined_ns,
                collectives_matched: at.matched,
                waited_for_ns: at.waited_for_ns,
                waiting_ns: gpu.map_or(0, |d| gpu::exposed_waiting(d, &at.waiting)),
                last_at: at.last_at,
                slowest: false,
            }
        })
        .collect();
    // Most busy is the wrong test where ranks meet in collectives: waiting
    // in one is busy time, so the ranks that wait most look busiest.
    let slowest = if rows.iter().any(|r| r.waited_for_ns > 0) {
        rows.iter()
            .enumerate()
            .max_by_key(|(_, r)| r.waited_for_ns)
            .map(|(i, _)| i)
    } else if meet_in_collectives(&rows) {
        rows.iter()
            .enumerate()
            .min_by_key(|(_, r)| in_collectives(r))
            .map(|(i, _)| i)
    } else {
        rows.iter()
            .enumerate()
            .max_by_key(|(_, r)| r.busy_ns)
            .map(|(i, _)| i)
    };
    if let Some(i) = slowest {
        rows[i].slowest = true;
    }
    rows
}

/// A rank's time in collectives: its GPU running only them (NCCL), and
/// its GPU idle while the host waited in one (`comm`: gloo, NCCL's host
/// side).
pub fn in_collectives(r: &RankRow) -> u64 {
    r.communication_ns + r.idle_by_cause_ns.get(Cause::Comm)
}

/// Every rank ran collectives, so they waited for one another.
pub fn meet_in_collectives(rows: &[RankRow]) -> bool {
    rows.iter().all(|r| in_collectives(r) > 0)
}
