//! Several ranks side by side (the table `analyze::ranks` builds), and the
//! HTA-style table.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::{units, Labelled};
use crate::analyze::cause::Cause;
use crate::analyze::hta::{Bucket, StreamIdle};
use crate::analyze::ranks::{meet_in_collectives, rows, RankRow};

/// The contract of what `report --format json` writes for several inputs
/// (docs/ranks.schema.json).
pub const SCHEMA: &str = "gapscope.ranks/1";

pub fn write_table(inputs: &[Labelled], out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "\nAcross ranks")?;
    let rows = rows(inputs);
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
