//! Flamegraphs, folded or drawn with inferno: on-CPU samples, off-CPU time
//! by blocking stack, and — the one nobody else draws — what the machine was
//! doing while the GPU was idle, rooted at the cause, so the widest tower is
//! the thing to fix.

use std::io::{self, Write};

use super::{Format, Options, View};
use crate::analyze::{stacks, Analysis};

/// The flamegraph `opts.format` names, drawn or folded.
pub fn write(v: &View, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let (kind, draw) = match opts.format {
        Format::Flamegraph(kind) => (kind, true),
        Format::Folded(kind) => (kind, false),
        other => return Err(io::Error::other(format!("{other:?} is not a flamegraph"))),
    };
    let lines = folded(v.analysis, kind);
    if draw {
        write_svg(v.analysis.facts.simulated(), kind, &lines, out)
    } else {
        write_folded(&lines, out)
    }
}

pub use crate::analyze::stacks::StackKind as FlameKind;

/// The file a picture of `kind` is written to, without its extension.
pub fn file_stem(kind: FlameKind) -> &'static str {
    match kind {
        FlameKind::Cpu => "flame-cpu",
        FlameKind::OffCpu => "flame-offcpu",
        FlameKind::Idle => "flame-idle",
    }
}

fn title(kind: FlameKind) -> &'static str {
    match kind {
        FlameKind::Cpu => "On-CPU time (cpu-clock samples)",
        FlameKind::OffCpu => "Off-CPU time, by where threads blocked",
        FlameKind::Idle => "What the host was doing while the GPU sat idle, by cause",
    }
}

fn count_name(kind: FlameKind) -> &'static str {
    match kind {
        FlameKind::Cpu => "samples",
        _ => "ns",
    }
}

/// Folded stacks: (root;...;leaf, weight), in the stacks' order.
pub fn folded(a: &Analysis, kind: FlameKind) -> Vec<(String, u64)> {
    stacks::stacks(a, kind)
        .into_iter()
        .map(|(s, w)| (s.folded(), w))
        .collect()
}

fn write_folded(lines: &[(String, u64)], out: &mut dyn Write) -> io::Result<()> {
    for (stack, w) in lines {
        writeln!(out, "{stack} {w}")?;
    }
    Ok(())
}

/// An SVG flamegraph (interactive, self-contained).
/// `simulated`: the GPU was gapscope's own simulated device.
fn write_svg(
    simulated: bool,
    kind: FlameKind,
    lines: &[(String, u64)],
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title(kind).to_string();
    if simulated {
        opts.subtitle = Some("SIMULATED GPU: gapscope's test and demo workload".into());
    }
    opts.count_name = count_name(kind).to_string();
    opts.deterministic = true;
    opts.hash = true;
    if lines.is_empty() {
        // inferno refuses empty input; an empty picture says more.
        return writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="600" height="60"><text x="10" y="35" font-family="sans-serif" font-size="14">{}: nothing recorded</text></svg>"#,
            title(kind)
        );
    }
    // inferno sums weights in a usize; keep the total well inside it (only
    // a damaged session gets near: real totals are nanoseconds of a run).
    let total: u128 = lines.iter().map(|(_, w)| *w as u128).sum();
    let scale = (total >> 52) as u64 + 1;
    let text: Vec<String> = lines
        .iter()
        .filter(|(_, w)| w / scale > 0)
        .map(|(s, w)| format!("{s} {}", w / scale))
        .collect();
    if text.is_empty() {
        return write_svg(simulated, kind, &[], out);
    }
    inferno::flamegraph::from_lines(&mut opts, text.iter().map(String::as_str), out)
        .map_err(|e| io::Error::other(e.to_string()))
}
