//! The HTML report: one self-contained file (no network, no CDN) that shows
//! what to fix first — the allocated / utilization / busy header, the idle
//! time by cause, the recommendations with their evidence, the idle-gap
//! flamegraph and a busy/idle strip over time — with the full text report
//! below.

use std::io::{self, Write};

use base64::Engine;

use super::document::{self, html_escape as esc, Style};
use super::report::Report;
use super::summary;
use super::units;
use super::{Options, View};
use crate::analyze::attribute::Cause;
use crate::analyze::diagnose::Diagnosis;

/// Columns of the busy/idle strip.
const STRIP_BINS: usize = 400;
const BUSY_COLOR: &str = "#2e9e44";
/// Busy but not computing: lighter greens.
const COMMUNICATION_COLOR: &str = "#8fd19e";
/// Lighter: the part of it that only waited for the other GPUs.
const COMMUNICATION_WAIT_COLOR: &str = "#c9ebd1";
const COPIES_COLOR: &str = "#5fb573";

/// Time the GPU could not be seen: pale, as no claim about it is made.
const UNSEEN_COLOR: &str = "#f0f0f0";

/// Busy and idle-by-cause time of one column of the strip.
#[derive(Clone, Default)]
struct Bin {
    busy: u64,
    idle: [u64; Cause::ALL.len()],
}

fn cause_index(c: Cause) -> usize {
    Cause::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

/// Spreads `[s, e)` over the bins of `[a, b)`, `add` getting each overlap.
fn spread(a: u64, b: u64, n: usize, s: u64, e: u64, mut add: impl FnMut(usize, u64)) {
    let (s, e) = (s.max(a), e.min(b));
    if e <= s || b <= a {
        return;
    }
    let width = (b - a) as f64 / n as f64;
    let mut i = (((s - a) as f64 / width) as usize).min(n - 1);
    let mut at = s;
    while at < e && i < n {
        let bin_end = if i + 1 == n {
            b
        } else {
            a + ((i + 1) as f64 * width) as u64
        };
        let upto = e.min(bin_end);
        if upto > at {
            add(i, upto - at);
            at = upto;
        }
        i += 1;
    }
}

fn strip_bins(d: &crate::analyze::diagnose::GpuDiagnosis, window: (u64, u64)) -> Vec<Bin> {
    let (a, b) = window;
    let mut bins = vec![Bin::default(); STRIP_BINS];
    for &(s, e) in &d.gpu.busy {
        spread(a, b, STRIP_BINS, s, e, |i, ns| bins[i].busy += ns);
    }
    for p in &d.attribution.pieces {
        let c = cause_index(p.cause);
        spread(a, b, STRIP_BINS, p.start, p.end, |i, ns| {
            bins[i].idle[c] += ns
        });
    }
    bins
}

/// The strip: one column per bin, busy at the bottom, idle causes above.
fn write_strip(bins: &[Bin], duration_ns: u64, out: &mut impl Write) -> io::Result<()> {
    const H: f64 = 48.0;
    writeln!(
        out,
        r#"<svg class="strip" viewBox="0 0 {} {}" preserveAspectRatio="none" role="img" aria-label="GPU busy and idle over time">"#,
        bins.len(),
        H
    )?;
    for (x, bin) in bins.iter().enumerate() {
        let total = bin.busy + bin.idle.iter().sum::<u64>();
        if total == 0 {
            continue;
        }
        let mut y = H;
        let mut bar = |ns: u64, color: &str, out: &mut dyn Write| -> io::Result<()> {
            if ns == 0 {
                return Ok(());
            }
            let h = H * ns as f64 / total as f64;
            y -= h;
            writeln!(
                out,
                r#"<rect x="{x}" y="{y:.2}" width="1.02" height="{h:.2}" fill="{color}"/>"#
            )
        };
        bar(bin.busy, BUSY_COLOR, out)?;
        for (i, c) in Cause::ALL.iter().enumerate() {
            bar(bin.idle[i], c.color(), out)?;
        }
    }
    writeln!(out, "</svg>")?;
    write!(out, r#"<div class="axis">"#)?;
    for q in 0..=4u64 {
        write!(
            out,
            "<span>{}</span>",
            units::duration((duration_ns as u128 * q as u128 / 4) as u64)
        )?;
    }
    writeln!(out, "</div>")
}

/// Allocated time as one bar: busy, then idle by cause.
fn write_breakdown(g: &super::report::GpuReport, out: &mut impl Write) -> io::Result<()> {
    let whole = g.allocated_ns.max(1) as f64;
    writeln!(
        out,
        r#"<svg class="bar" viewBox="0 0 1000 28" preserveAspectRatio="none" role="img" aria-label="allocated time: busy and idle by cause">"#
    )?;
    let mut x = 0.0;
    // Busy split by what ran, when something other than compute kept the
    // GPU busy (exposed collectives, copies alone).
    let k = &g.busy_by_kind_ns;
    // (label, colour, ns) of each slice, left to right.
    let busy: Vec<(&str, &str, u64)> = if k.communication + k.memory > 0 {
        vec![
            ("busy: compute", BUSY_COLOR, k.compute),
            (
                "busy: communication alone",
                COMMUNICATION_COLOR,
                k.communication - k.communication_waiting,
            ),
            (
                "busy: communication alone, waiting for the other GPUs to reach it",
                COMMUNICATION_WAIT_COLOR,
                k.communication_waiting,
            ),
            ("busy: copies alone", COPIES_COLOR, k.memory),
        ]
    } else {
        vec![("busy", BUSY_COLOR, g.busy_ns)]
    };
    let entries = busy
        .into_iter()
        .chain(
            g.idle_by_cause_ns
                .entries()
                .map(|(c, ns)| (c.name(), c.color(), ns)),
        )
        .chain([("not seen", UNSEEN_COLOR, g.unseen_ns)])
        .filter(|(_, _, ns)| *ns > 0);
    for (name, color, ns) in entries {
        let w = 1000.0 * ns as f64 / whole;
        writeln!(
            out,
            r#"<rect x="{x:.3}" y="0" width="{w:.3}" height="28" fill="{color}"><title>{name}: {} ({})</title></rect>"#,
            units::duration(ns),
            units::percent(ns, g.allocated_ns)
        )?;
        x += w;
    }
    writeln!(out, "</svg>")?;
    writeln!(
        out,
        r#"<table class="causes"><thead><tr><th></th><th>cause</th><th class="num">time</th><th class="num">of idle</th><th class="num">of allocated</th></tr></thead><tbody>"#
    )?;
    let mut rows: Vec<(Cause, u64)> = g
        .idle_by_cause_ns
        .entries()
        .filter(|(_, ns)| *ns > 0)
        .collect();
    rows.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
    for (cause, ns) in rows {
        let name = cause.name();
        writeln!(
            out,
            r#"<tr><td><span class="sw" style="background:{}"></span></td><td>{name}</td><td class="num" id="gpu{}-idle-{name}" data-ns="{ns}">{}</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
            cause.color(),
            g.id,
            units::duration(ns),
            units::percent(ns, g.idle_ns),
            units::percent(ns, g.allocated_ns)
        )?;
    }
    writeln!(out, "</tbody></table>")
}

fn kpi(
    out: &mut impl Write,
    id: &str,
    label: &str,
    value: &str,
    ns: Option<u64>,
) -> io::Result<()> {
    let data = ns.map(|n| format!(r#" data-ns="{n}""#)).unwrap_or_default();
    writeln!(
        out,
        r#"<div class="kpi"><div class="label">{label}</div><div class="value" id="{id}"{data}>{}</div></div>"#,
        esc(value)
    )
}

/// The height an inferno SVG asks for, to size its frame.
pub(super) fn svg_height(svg: &[u8]) -> Option<u32> {
    let head = std::str::from_utf8(&svg[..svg.len().min(4096)]).ok()?;
    let tag = &head[head.find("<svg")?..];
    let h = &tag[tag.find(" height=\"")? + 9..];
    h[..h.find('"')?].parse().ok()
}

/// The report as one HTML page, the idle-gap flamegraph embedded.
pub fn write(v: &View, _: &Options, out: &mut dyn Write) -> io::Result<()> {
    let mut svg = Vec::new();
    super::flame::write(
        v,
        &Options::new(super::Format::Flamegraph(super::FlameKind::Idle)),
        &mut svg,
    )?;
    let tl = &v.analysis.timeline;
    write_html(
        &v.report,
        &v.analysis.diagnosis,
        (tl.start, tl.end),
        Some(&svg),
        out,
    )
}

/// Writes the report as one HTML page. `idle_svg` is the idle-gap
/// flamegraph, embedded as a data: frame so its own script runs isolated.
fn write_html(
    r: &Report,
    d: &Diagnosis,
    window: (u64, u64),
    idle_svg: Option<&[u8]>,
    mut out: impl Write,
) -> io::Result<()> {
    let o = &mut out;
    let heading = document::heading(r);
    let s = &r.session;
    document::write_page_start(
        &format!("gapscope — {}", heading.command),
        Some(&s.gapscope_version),
        o,
    )?;
    heading.write_html("gapscope report", o)?;

    // GPUs: the header numbers, the breakdown, the strip.
    if r.gpus.is_empty() {
        writeln!(
            o,
            r#"<div class="card"><p>No GPU activity was recorded (no CUDA process in the tree, or <code>--no-gpu</code>). The host side is in the full report below.</p></div>"#
        )?;
    }
    for g in &r.gpus {
        writeln!(
            o,
            r#"<section class="card" id="gpu{}"><h2>GPU {} · {} <span class="sub">({})</span></h2><div class="kpis">"#,
            g.id,
            g.id,
            esc(&g.name),
            esc(g.source.name())
        )?;
        let id = |k: &str| format!("gpu{}-{k}", g.id);
        kpi(
            o,
            &id("allocated"),
            "allocated",
            &units::duration(g.allocated_ns),
            Some(g.allocated_ns),
        )?;
        let util = g
            .nvml_util_pct
            .map(|u| format!("{u:.0}%"))
            .unwrap_or_else(|| "n/a".into());
        kpi(o, &id("util"), "NVML utilization", &util, None)?;
        kpi(
            o,
            &id("busy"),
            "busy",
            &format!(
                "{} ({})",
                units::duration(g.busy_ns),
                units::percent(g.busy_ns, g.allocated_ns)
            ),
            Some(g.busy_ns),
        )?;
        kpi(
            o,
            &id("idle"),
            "idle",
            &format!(
                "{} ({})",
                units::duration(g.idle_ns),
                units::percent(g.idle_ns, g.allocated_ns)
            ),
            Some(g.idle_ns),
        )?;
        if g.unseen_ns > 0 {
            kpi(
                o,
                &id("unseen"),
                "not seen",
                &format!(
                    "{} ({})",
                    units::duration(g.unseen_ns),
                    units::percent(g.unseen_ns, g.allocated_ns)
                ),
                Some(g.unseen_ns),
            )?;
        }
        if let Some(j) = g.idle_energy_j {
            kpi(
                o,
                &id("idle-energy"),
                "energy while idle",
                &format!("{j:.0} J"),
                None,
            )?;
        }
        if let Some(q) = &g.requests {
            kpi(
                o,
                &id("requests"),
                "requests",
                &format!(
                    "{} at {:.1}/s, {} p50, {} p99",
                    units::count(q.count),
                    q.rate_per_s,
                    units::duration(q.latency_p50_ns),
                    units::duration(q.latency_p99_ns)
                ),
                None,
            )?;
        }
        writeln!(o, "</div><h3>Where the allocated time went</h3>")?;
        write_breakdown(g, o)?;
        if let Some(gd) = d.gpus.iter().find(|x| x.gpu.device == g.id) {
            writeln!(o, "<h3>Busy and idle over time</h3>")?;
            write_strip(&strip_bins(gd, window), window.1 - window.0, o)?;
        }
        writeln!(o, "</section>")?;
    }

    // What to do.
    if let Some(verdict) = &r.verdict {
        writeln!(
            o,
            r#"<section id="diagnosis"><h2>Diagnosis</h2><p class="verdict">{}</p>"#,
            esc(verdict)
        )?;
        if let Some(c) = &r.idle_cost {
            writeln!(o, "<p>{}</p>", esc(&summary::idle_cost_line(c)))?;
        }
        writeln!(o, r#"<ol class="recs">"#)?;
        let before = r.window_ns.end.saturating_sub(r.window_ns.start);
        for rec in &r.recommendations {
            writeln!(
                o,
                r#"<li><span class="chip" style="background:{}">{}</span><span class="speedup" data-speedup="{}">{}</span> — {}"#,
                rec.cause.color(),
                esc(rec.cause.name()),
                rec.est_speedup,
                esc(&rec.gain()),
                esc(&rec.title)
            )?;
            if let Some(w) = &rec.what_if {
                // Before and after, to scale.
                let pct = w.wall_ns as f64 * 100.0 / before.max(1) as f64;
                writeln!(
                    o,
                    r#"<div class="whatif" data-before="{before}" data-after="{}"><div class="bar was" style="width:100%">now {}</div><div class="bar fixed" style="width:{:.1}%;background:{}">fixed {} ({:.2}×)</div></div>"#,
                    w.wall_ns,
                    units::duration(before),
                    pct.min(100.0),
                    rec.cause.color(),
                    units::duration(w.wall_ns),
                    w.speedup
                )?;
            }
            writeln!(o, r#"<ul class="mono">"#)?;
            for e in rec
                .what_if_lines(before, r.gpus.len())
                .iter()
                .chain(&rec.evidence)
            {
                writeln!(o, "<li>{}</li>", esc(e))?;
            }
            writeln!(o, "</ul></li>")?;
        }
        writeln!(o, "</ol></section>")?;
    }

    if let Some(svg) = idle_svg.filter(|_| !r.gpus.is_empty()) {
        let height = svg_height(svg).unwrap_or(400).clamp(80, 2400);
        writeln!(
            o,
            r#"<section id="idle-flame"><h2>What the host was doing while the GPU sat idle</h2>
<p class="sub">Idle time by cause, then the thread that decided it and its stack. The widest tower is the thing to fix. Click to zoom; Ctrl-F to search.</p>
<iframe class="flame" title="idle-gap flamegraph" style="height:{height}px" src="data:image/svg+xml;base64,{}"></iframe></section>"#,
            base64::engine::general_purpose::STANDARD.encode(svg)
        )?;
    }

    writeln!(o, "<details><summary>Full report</summary>")?;
    summary::write_summary(r, Style::Html, &mut *o)?;
    writeln!(o, "</details>")?;
    writeln!(
        o,
        r#"<footer>gapscope {} · schema {} · all times from CLOCK_MONOTONIC</footer>
</main></body></html>"#,
        esc(&s.gapscope_version),
        r.schema
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreading_conserves_time() {
        let mut bins = [0u64; 7];
        spread(1000, 2000, 7, 900, 1500, |i, ns| bins[i] += ns);
        spread(1000, 2000, 7, 1500, 2100, |i, ns| bins[i] += ns);
        assert_eq!(bins.iter().sum::<u64>(), 1000);
        let mut one = [0u64; 7];
        spread(1000, 2000, 7, 1400, 1401, |i, ns| one[i] += ns);
        assert_eq!(one.iter().sum::<u64>(), 1);
        spread(1000, 2000, 7, 2000, 2500, |_, _| panic!("outside"));
    }

    #[test]
    fn inferno_svg_height_is_read() {
        let svg = br#"<?xml version="1.0"?><svg version="1.1" width="1200" height="358" onload="init(evt)">"#;
        assert_eq!(svg_height(svg), Some(358));
        assert_eq!(svg_height(b"<svg>"), None);
    }
}
