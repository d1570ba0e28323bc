//! Several ranks side by side, and the HTA-style table.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use super::{units, Labelled, View};
use crate::analyze::cause::{Cause, IdleByCause};
use crate::analyze::hta::{Bucket, StreamIdle};
use crate::analyze::{align, gpu};

/// The contract of what `report --format json` writes for several inputs
/// (docs/ranks.schema.json).
pub const SCHEMA: &str = "gapscope.ranks/1";

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

pub fn rows(inputs: &[Labelled], views: &[View]) -> Vec<RankRow> {
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
        .zip(views)
        .zip(&placed)
        .zip(&busiest)
        .map(|(((l, v), at), busiest)| {
            let gpu = busiest.and_then(|(id, _)| {
                l.analysis
                    .diagnosis
                    .gpus
                    .iter()
                    .find(|g| g.gpu.device == id)
                    .map(|g| &g.gpu)
            });
            let r = &v.report;
            let span = r.gpus.iter().map(|g| g.span_ns).max().unwrap_or(0);
            let busy = r.gpus.iter().map(|g| g.busy_ns).sum::<u64>();
            let communication = r
                .gpus
                .iter()
                .map(|g| g.busy_by_kind_ns.communication)
                .sum::<u64>();
            let idle =
                IdleByCause::from_fn(|c| r.gpus.iter().map(|g| g.idle_by_cause_ns.get(c)).sum());
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
            let rank = r.session.rank.map(|k| format!("{} of {}", k.rank, k.world));
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
fn in_collectives(r: &RankRow) -> u64 {
    r.communication_ns + r.idle_by_cause_ns.get(Cause::Comm)
}

/// Every rank ran collectives, so they waited for one another.
fn meet_in_collectives(rows: &[RankRow]) -> bool {
    rows.iter().all(|r| in_collectives(r) > 0)
}

pub fn write_table(inputs: &[Labelled], views: &[View], out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "\nAcross ranks")?;
    let rows = rows(inputs, views);
    let collectives = meet_in_collectives(&rows);
    let waited = rows.iter().any(|r| r.waited_for_ns > 0);
    for r in &rows {
        let comm = if collectives {
            let waiting = r.idle_by_cause_ns.get(Cause::Comm);
            format!(
                " · collectives alone {:>9}{}",
                units::duration(r.communication_ns),
                if waiting > 0 {
                    format!(" · idle waiting in them {:>9}", units::duration(waiting))
                } else {
                    String::new()
                }
            )
        } else {
            String::new()
        };
        let late = if waited {
            format!(
                " · others waited {:>9} for it ({} last) · it waited {:>9}",
                units::duration(r.waited_for_ns),
                r.last_at,
                units::duration(r.waiting_ns)
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "  {:<32} {:>10} span · busy {:>5.1}%{comm}{late} · top idle cause {}{}",
            r.label,
            units::duration(r.span_ns),
            r.busy_pct,
            r.top_cause.map_or("-", Cause::name),
            match (r.slowest, waited, collectives) {
                (true, true, _) => "  ← the others wait for it (it starts collectives last)",
                (true, false, true) => "  ← the others wait for it (least time in collectives)",
                (true, false, false) => "  ← slowest (most GPU work)",
                _ => "",
            }
        )?;
    }
    let matched: Vec<&RankRow> = rows.iter().filter(|r| r.collectives_matched > 0).collect();
    if matched.len() >= 2 {
        let shifts = matched
            .iter()
            .filter(|r| r.clock_refined_ns.unsigned_abs() >= 1_000)
            .map(|r| format!("{} {:+.3} ms", r.label, r.clock_refined_ns as f64 / 1e6))
            .collect::<Vec<_>>();
        writeln!(
            out,
            "  clocks: the sessions' wall clocks, aligned by the ends of {} collectives{}",
            matched
                .iter()
                .map(|r| r.collectives_matched)
                .min()
                .unwrap_or(0),
            if shifts.is_empty() {
                " (no correction needed)".to_string()
            } else {
                format!(": {}", shifts.join(", "))
            }
        )?;
    }
    Ok(())
}

pub fn write_hta(table: &BTreeMap<u32, StreamIdle>, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nIdle per stream, by Holistic Trace Analysis's rules (µs)"
    )?;
    writeln!(
        out,
        "  {:>8} {:>22} {:>22} {:>22}",
        "STREAM", "HOST_WAIT (n)", "KERNEL_WAIT (n)", "OTHER (n)"
    )?;
    for (stream, s) in table {
        let cell = |b: &Bucket| format!("{} ({})", b.idle_us, b.n);
        writeln!(
            out,
            "  {:>8} {:>22} {:>22} {:>22}",
            stream,
            cell(&s.host_wait),
            cell(&s.kernel_wait),
            cell(&s.other)
        )?;
    }
    Ok(())
}
