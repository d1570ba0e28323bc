//! A comparison (`gapscope diff`, built in `analyze::compare`) as text,
//! markdown, JSON, HTML, or its differential idle-gap flamegraph (inferno's
//! differential mode: red grew, blue shrank).

use std::io::{self, Write};

use base64::Engine;

pub use crate::analyze::compare::{
    build, Compared, Diff, DiffOptions, Side, DEFAULT_MIN_CHANGE_PCT, SCHEMA,
};
use crate::analyze::compare::{pct, signed_pct, signed_points, GpuFigures, SideInfo};
use crate::export::document::{self, html_escape as esc, Block, Style, Table};
use crate::export::units;
use crate::export::{FlameKind, Format, Options};

/// Idle stacks the text shows of each list (the JSON has more).
const STACKS_SHOWN: usize = 5;

/// A comparison as `opts` asks: text, markdown, JSON, HTML, or its
/// idle-gap stacks drawn (differential flamegraph) or folded
/// (`stack BASE_ns NEW_ns`); other formats are refused.
pub fn write(c: &Compared, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    match opts.format {
        Format::Text => write_blocks(&blocks(&c.diff), Style::Text, out),
        Format::Markdown => {
            writeln!(out, "## gapscope diff")?;
            write_blocks(&blocks(&c.diff), Style::Markdown, out)
        }
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, &c.diff)?;
            writeln!(out)
        }
        Format::Html => write_html(c, out),
        Format::Flamegraph(FlameKind::Idle) => {
            let shape = if c.new_stacks.values().any(|&w| w > 0) {
                Shape::New
            } else {
                Shape::Base
            };
            out.write_all(&flamegraph(c, shape)?)
        }
        Format::Folded(FlameKind::Idle) => {
            for (stack, b, n) in c.stacks() {
                writeln!(out, "{} {b} {n}", stack.folded())?;
            }
            Ok(())
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a comparison is written as text, md, json, html, or its idle-gap flamegraph (drawn or folded), not {other:?}"
            ),
        )),
    }
}

fn write_blocks(blocks: &[Block], style: Style, out: &mut dyn Write) -> io::Result<()> {
    for b in blocks {
        document::write_block(b, style, &mut *out)?;
    }
    Ok(())
}

fn side_line(name: &str, d: &SideInfo) -> String {
    let cmd = if d.command.is_empty() {
        String::new()
    } else {
        format!(" — {}", document::command_line(&d.command))
    };
    format!("{name}: {}{cmd}", d.path)
}

fn figures_rows(b: Option<&GpuFigures>, n: Option<&GpuFigures>) -> Vec<Vec<String>> {
    type Pick<'a> = &'a dyn Fn(&GpuFigures) -> u64;
    let get = |f: Option<&GpuFigures>, pick: Pick| f.map(pick);
    let rows: [(&str, Pick); 7] = [
        ("allocated", &|f| f.allocated_ns),
        ("busy", &|f| f.busy_ns),
        ("  computing", &|f| f.busy_by_kind_ns.compute),
        ("  communicating", &|f| f.busy_by_kind_ns.communication),
        ("    waiting for peers", &|f| {
            f.busy_by_kind_ns.communication_waiting
        }),
        ("  copying", &|f| f.busy_by_kind_ns.memory),
        ("idle", &|f| f.idle_ns),
    ];
    let share = |f: Option<&GpuFigures>, ns: Option<u64>| match (f, ns) {
        (Some(f), Some(ns)) if f.allocated_ns > 0 => {
            format!(
                "{} ({})",
                units::duration(ns),
                units::percent(ns, f.allocated_ns)
            )
        }
        (_, Some(ns)) => units::duration(ns),
        _ => "-".into(),
    };
    let mut out: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, pick)| {
            let (x, y) = (get(b, pick), get(n, pick));
            let change = match (x, y) {
                (Some(x), Some(y)) => {
                    let d = y as i128 - x as i128;
                    let sign = if d < 0 { "−" } else { "+" };
                    let points = match (b, n) {
                        (Some(b), Some(n)) if *label != "allocated" => format!(
                            " ({})",
                            signed_points(pct(y, n.allocated_ns) - pct(x, b.allocated_ns))
                        ),
                        _ => String::new(),
                    };
                    format!("{sign}{}{points}", units::duration(d.unsigned_abs() as u64))
                }
                _ => "-".into(),
            };
            vec![label.to_string(), share(b, x), share(n, y), change]
        })
        .collect();
    out.extend(request_rows(b, n));
    out
}

/// A server's request figures side by side, where either side served.
fn request_rows(b: Option<&GpuFigures>, n: Option<&GpuFigures>) -> Vec<Vec<String>> {
    use crate::export::gpu_report::RequestsReport;
    let (x, y) = (
        b.and_then(|f| f.requests.as_ref()),
        n.and_then(|f| f.requests.as_ref()),
    );
    if x.is_none() && y.is_none() {
        return Vec::new();
    }
    let rate =
        |q: Option<&RequestsReport>| q.map_or("-".into(), |q| format!("{:.1}/s", q.rate_per_s));
    let mut rows = vec![vec![
        "requests".to_string(),
        rate(x),
        rate(y),
        match (x, y) {
            (Some(x), Some(y)) => format!("{:+.1}/s", y.rate_per_s - x.rate_per_s),
            _ => "-".into(),
        },
    ]];
    type Pick = fn(&RequestsReport) -> u64;
    let times: [(&str, Pick); 3] = [
        ("  p50 a request", |q| q.latency_p50_ns),
        ("  p99 a request", |q| q.latency_p99_ns),
        ("  GPU busy a request", |q| q.gpu_busy_per_request_ns),
    ];
    for (label, pick) in times {
        let at = |q: Option<&RequestsReport>| q.map_or("-".into(), |q| units::duration(pick(q)));
        let change = match (x, y) {
            (Some(x), Some(y)) => {
                let d = pick(y) as i128 - pick(x) as i128;
                let sign = if d < 0 { "−" } else { "+" };
                format!("{sign}{}", units::duration(d.unsigned_abs() as u64))
            }
            _ => "-".into(),
        };
        rows.push(vec![label.to_string(), at(x), at(y), change]);
    }
    rows
}

fn blocks(d: &Diff) -> Vec<Block> {
    let mut b = vec![
        Block::Line(side_line("BASE", &d.base)),
        Block::Line(side_line("NEW ", &d.new)),
    ];
    if d.simulated {
        b.push(Block::Line(
            "SIMULATED GPU: gapscope's test and demo workload on one side or both".into(),
        ));
    }
    b.push(Block::Heading("Verdict".into()));
    b.push(Block::Line(d.verdict.text.clone()));
    if let Some(g) = d.gate {
        b.push(Block::Line(format!(
            "Gate: idle share {} (allowed: +{:.1} points): {}",
            signed_points(d.idle_share.change_points),
            g.points,
            if g.passed { "passed" } else { "FAILED" }
        )));
    }
    b.push(Block::Heading(
        "Idle by cause (share of each run's allocated GPU time)".into(),
    ));
    b.push(Block::Table(Table {
        header: vec!["CAUSE", "BASE", "NEW", "CHANGE"],
        right: vec![false, true, true, true],
        rows: d
            .causes
            .iter()
            .map(|c| {
                vec![
                    c.cause.name().to_string(),
                    format!("{:.1}% ({})", c.share.base_pct, units::duration(c.base_ns)),
                    format!("{:.1}% ({})", c.share.new_pct, units::duration(c.new_ns)),
                    signed_points(c.share.change_points),
                ]
            })
            .collect(),
        note: None,
    }));
    for g in &d.gpus {
        b.push(Block::Heading(format!("{} · {}", g.key, g.name)));
        let mut rows = figures_rows(g.base.as_ref(), g.new.as_ref());
        // With several GPUs, each one's causes too (the table above has
        // them all together).
        if d.gpus.len() > 1 {
            rows.extend(g.causes.iter().map(|c| {
                vec![
                    format!("  {}", c.cause.name()),
                    format!("{:.1}%", c.share.base_pct),
                    format!("{:.1}%", c.share.new_pct),
                    signed_points(c.share.change_points),
                ]
            }));
        }
        b.push(Block::Table(Table {
            header: vec!["", "BASE", "NEW", "CHANGE"],
            right: vec![false, true, true, true],
            rows,
            note: None,
        }));
    }
    if let Some(s) = &d.steps {
        let source = if s.source[0] == s.source[1] {
            s.source[0].clone()
        } else {
            format!("{} / {}", s.source[0], s.source[1])
        };
        let matched = if s.matched > 0 {
            format!("{} matched by number", s.matched)
        } else {
            "numbers do not overlap: all steps of each".into()
        };
        b.push(Block::Heading(format!("Steps ({source}; {matched})")));
        let row = |label: &str, x: u64, y: u64| {
            vec![
                label.to_string(),
                units::duration(x),
                units::duration(y),
                if x > 0 {
                    signed_pct((y as f64 / x as f64 - 1.0) * 100.0)
                } else {
                    "-".into()
                },
            ]
        };
        b.push(Block::Table(Table {
            header: vec!["", "BASE", "NEW", "CHANGE"],
            right: vec![false, true, true, true],
            rows: vec![
                vec![
                    "steps".into(),
                    s.base.count.to_string(),
                    s.new.count.to_string(),
                    String::new(),
                ],
                row("mean", s.base.mean_ns, s.new.mean_ns),
                row("median", s.base.median_ns, s.new.median_ns),
                row("p90", s.base.p90_ns, s.new.p90_ns),
                row("spread (sd)", s.base.sd_ns, s.new.sd_ns),
            ],
            note: None,
        }));
    }
    if let Some(r) = &d.rates {
        b.push(Block::Heading(format!(
            "Idle share per {} of the GPUs' busy span (no training steps marked)",
            units::duration(r.bucket_ns)
        )));
        b.push(Block::Table(Table {
            header: vec!["", "BASE", "NEW", "CHANGE"],
            right: vec![false, true, true, true],
            rows: vec![
                vec![
                    "stretches".into(),
                    r.base.count.to_string(),
                    r.new.count.to_string(),
                    String::new(),
                ],
                vec![
                    "idle, mean".into(),
                    format!("{:.1}%", r.base.mean_pct),
                    format!("{:.1}%", r.new.mean_pct),
                    signed_points(r.new.mean_pct - r.base.mean_pct),
                ],
                vec![
                    "spread (sd)".into(),
                    format!("{:.1}", r.base.sd_pct),
                    format!("{:.1}", r.new.sd_pct),
                    String::new(),
                ],
            ],
            note: None,
        }));
    }
    b.push(Block::Heading("Top recommendations".into()));
    for (name, recs) in [
        ("BASE", &d.recommendations.base),
        ("NEW", &d.recommendations.new),
    ] {
        if recs.is_empty() {
            b.push(Block::Line(format!("{name}: none")));
        }
        for (i, r) in recs.iter().enumerate() {
            let title = r.title.split(". ").next().unwrap_or(&r.title);
            b.push(Block::Line(format!(
                "{name} {}. [{}] {:.2}x — {title}",
                i + 1,
                r.cause,
                r.speedup
            )));
        }
    }
    for (heading, list) in [
        (
            "Idle-gap stacks that grew (GPU idle, by what the host was doing)",
            &d.idle_stacks.grew,
        ),
        ("Idle-gap stacks that shrank", &d.idle_stacks.shrank),
    ] {
        if list.is_empty() {
            continue;
        }
        b.push(Block::Heading(heading.into()));
        b.push(Block::Bullets(
            list.iter()
                .take(STACKS_SHOWN)
                .map(|c| {
                    let delta = c.new_ns as i128 - c.base_ns as i128;
                    format!(
                        "{}{} ({} → {})  {}",
                        if delta < 0 { "−" } else { "+" },
                        units::duration(delta.unsigned_abs() as u64),
                        units::duration(c.base_ns),
                        units::duration(c.new_ns),
                        short_stack(&c.frames)
                    )
                })
                .collect(),
        ));
    }
    if !d.notes.is_empty() {
        b.push(Block::Heading("Notes".into()));
        for n in &d.notes {
            b.push(Block::Line(n.clone()));
        }
    }
    b
}

/// A stack as the report writes one: its cause and thread, then what the
/// thread was doing (blocked, waiting for a CPU), its innermost user frames
/// leaf first without the runtime's entry frames, and the kernel frame that
/// says what it did — not the scheduler's frames every blocked stack ends in.
fn short_stack(frames: &[String]) -> String {
    const KEEP: usize = 4;
    let (root, rest) = frames.split_at(frames.len().min(2));
    let (marker, rest) = match rest.split_last() {
        Some((m, rest)) if m.starts_with('[') => (Some(m.as_str()), rest),
        _ => (None, rest),
    };
    let (kernel, user): (Vec<&str>, Vec<&str>) = rest
        .iter()
        .map(String::as_str)
        .partition(|f| f.ends_with("_[k]"));
    let useful = crate::export::summary::readable_frames(user.iter().rev().copied());
    let mut inner: Vec<&str> = marker
        .into_iter()
        .chain(useful.iter().copied().take(KEEP))
        .collect();
    if useful.len() > KEEP {
        inner.push("…");
    }
    let kernel =
        crate::export::summary::kernel_note(kernel.iter().map(|f| f.trim_end_matches("_[k]")));
    if inner.is_empty() {
        format!("{}{kernel}", root.join(" · "))
    } else {
        format!("{}: {}{kernel}", root.join(" · "), inner.join(" ← "))
    }
}

/// Which side's idle time gives the frames their widths.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    New,
    /// Stacks that went away still show.
    Base,
}

fn flamegraph(c: &Compared, shape: Shape) -> io::Result<Vec<u8>> {
    let lines: Vec<(String, u64, u64)> = c
        .stacks()
        .into_iter()
        .map(|(s, b, n)| (s.folded(), b, n))
        .collect();
    let mut svg = Vec::new();
    if lines.is_empty() {
        writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="600" height="60"><text x="10" y="35" font-family="sans-serif" font-size="14">no idle time on either side</text></svg>"#
        )?;
        return Ok(svg);
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = match shape {
        Shape::New => "GPU idle-gap stacks, NEW against BASE (sized by NEW)".into(),
        Shape::Base => "GPU idle-gap stacks, NEW against BASE (sized by BASE)".into(),
    };
    opts.subtitle = Some(if c.diff.simulated {
        "red: grew, blue: shrank · SIMULATED GPU: gapscope's test and demo workload".into()
    } else {
        "red: grew, blue: shrank".into()
    });
    opts.count_name = "ns".into();
    opts.deterministic = true;
    // Widths are the second count; the hue is second − first (negated for
    // BASE's shape, whose counts come swapped).
    opts.negate_differentials = shape == Shape::Base;
    let text: Vec<String> = lines
        .iter()
        .map(|(s, b, n)| match shape {
            Shape::New => format!("{s} {b} {n}"),
            Shape::Base => format!("{s} {n} {b}"),
        })
        .collect();
    inferno::flamegraph::from_lines(&mut opts, text.iter().map(String::as_str), &mut svg)
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(svg)
}

/// A bar of one run's allocated time: busy, then idle by cause.
fn share_bar(
    out: &mut dyn Write,
    who: &str,
    busy_ns: u64,
    causes: &[(crate::analyze::cause::Cause, u64)],
    allocated: u64,
) -> io::Result<()> {
    let total = allocated.max(1) as f64;
    write!(
        out,
        r#"<div class="row"><span class="who">{who}</span><svg class="bar" id="bar-{}" viewBox="0 0 1000 24" preserveAspectRatio="none">"#,
        who.to_lowercase()
    )?;
    let mut x = 0.0;
    let mut rect = |out: &mut dyn Write, ns: u64, color: &str, title: &str| -> io::Result<()> {
        let w = ns as f64 / total * 1000.0;
        if w > 0.0 {
            write!(
                out,
                r#"<rect x="{x:.2}" width="{w:.2}" height="24" fill="{color}"><title>{}</title></rect>"#,
                esc(title)
            )?;
        }
        x += w;
        Ok(())
    };
    rect(
        out,
        busy_ns,
        "#2e9e44",
        &format!("busy {}", units::percent(busy_ns, allocated)),
    )?;
    for &(c, ns) in causes {
        rect(
            out,
            ns,
            c.color(),
            &format!("{} {}", c.name(), units::percent(ns, allocated)),
        )?;
    }
    writeln!(out, "</svg></div>")
}

fn write_html(c: &Compared, out: &mut dyn Write) -> io::Result<()> {
    let d = &c.diff;
    document::write_page_start(
        &format!("gapscope diff — {}", d.verdict.outcome.name()),
        None,
        out,
    )?;
    writeln!(out, "<h1>gapscope diff</h1>")?;
    writeln!(
        out,
        r#"<div class="mono">{}<br>{}</div>"#,
        esc(&side_line("BASE", &d.base)),
        esc(&side_line("NEW", &d.new))
    )?;
    if d.simulated {
        writeln!(
            out,
            r#"<div class="banner sim" id="simulated">SIMULATED GPU: gapscope's test and demo workload on one side or both. The host side is real; the GPU and its timings are simulated.</div>"#
        )?;
    }
    writeln!(
        out,
        r#"<p class="verdict {0}" id="verdict" data-outcome="{0}">{1}</p>"#,
        d.verdict.outcome.name(),
        esc(&d.verdict.text)
    )?;
    if let Some(g) = d.gate {
        writeln!(
            out,
            r#"<p id="gate" data-passed="{}">Gate: idle share {} (allowed: +{:.1} points): {}</p>"#,
            g.passed,
            esc(&signed_points(d.idle_share.change_points)),
            g.points,
            if g.passed { "passed" } else { "FAILED" }
        )?;
    }
    writeln!(
        out,
        r#"<section class="card bars"><h3>Allocated GPU time: busy, then idle by cause</h3>"#
    )?;
    for (who, info, new) in [("BASE", &d.base, false), ("NEW", &d.new, true)] {
        let causes: Vec<_> = d
            .causes
            .iter()
            .map(|x| (x.cause, if new { x.new_ns } else { x.base_ns }))
            .collect();
        share_bar(out, who, info.busy_ns, &causes, info.allocated_ns)?;
    }
    writeln!(out, "</section>")?;
    writeln!(out, r#"<section class="card">"#)?;
    let all = blocks(d);
    // The sides and the verdict are above already.
    let skip = all
        .iter()
        .position(|b| matches!(b, Block::Heading(h) if h.starts_with("Idle by cause")))
        .unwrap_or(0);
    write_blocks(&all[skip..], Style::Html, out)?;
    writeln!(out, "</section>")?;
    for (id, shape, what) in [
        (
            "flame-new",
            Shape::New,
            "sized by NEW: where the idle time is now",
        ),
        (
            "flame-base",
            Shape::Base,
            "sized by BASE: what went away shows too",
        ),
    ] {
        let svg = flamegraph(c, shape)?;
        let height = crate::export::html::svg_height(&svg).unwrap_or(400) + 20;
        writeln!(
            out,
            r#"<section class="card"><h3>Idle-gap stacks, differential ({what})</h3>
<iframe class="flame" id="{id}" title="differential idle-gap flamegraph" style="height:{height}px" src="data:image/svg+xml;base64,{}"></iframe></section>"#,
            base64::engine::general_purpose::STANDARD.encode(&svg)
        )?;
    }
    writeln!(
        out,
        r#"<footer class="mono">schema {}</footer></main></body></html>"#,
        d.schema
    )
}

#[cfg(test)]
mod tests {
    use super::{request_rows, short_stack, GpuFigures};
    use crate::export::gpu_report::{BusyByKindReport, RequestsReport};

    fn serving(p50_ms: u64, rate_per_s: f64) -> GpuFigures {
        GpuFigures {
            allocated_ns: 1_000_000_000,
            busy_ns: 0,
            busy_by_kind_ns: BusyByKindReport {
                compute: 0,
                communication: 0,
                communication_waiting: 0,
                memory: 0,
            },
            idle_ns: 1_000_000_000,
            idle_pct: 100.0,
            idle_by_cause_ns: Default::default(),
            requests: Some(RequestsReport {
                count: 80,
                span_ns: 1_000_000_000,
                rate_per_s,
                latency_p50_ns: p50_ms * 1_000_000,
                latency_p99_ns: 2 * p50_ms * 1_000_000,
                latency_max_ns: 3 * p50_ms * 1_000_000,
                gpu_busy_per_request_ns: 4_000_000,
                energy_per_request_j: None,
            }),
        }
    }

    #[test]
    fn a_servers_requests_are_compared_side_by_side() {
        let (b, n) = (serving(6, 20.0), serving(4, 30.5));
        let rows = request_rows(Some(&b), Some(&n));
        assert_eq!(rows[0], ["requests", "20.0/s", "30.5/s", "+10.5/s"]);
        assert_eq!(rows[1], ["  p50 a request", "6.0ms", "4.0ms", "−2.0ms"]);
        assert_eq!(rows[2], ["  p99 a request", "12.0ms", "8.0ms", "−4.0ms"]);
        let mut training = serving(1, 1.0);
        training.requests = None;
        assert!(request_rows(Some(&training), Some(&training)).is_empty());
        assert_eq!(request_rows(Some(&training), Some(&n))[0][1], "-");
    }

    fn folded(s: &str) -> Vec<String> {
        s.split(';').map(str::to_string).collect()
    }

    #[test]
    fn a_stack_reads_as_what_the_thread_did_not_the_schedulers_frames() {
        let blocked = folded(
            "input.io;loader 12/12;__libc_start_call_main;main;load;load;__libc_pread64;\
             entry_SYSCALL_64_[k];do_syscall_64_[k];__x64_sys_pread64_[k];vfs_read_[k];\
             schedule_[k];__schedule_[k];[blocked: file]",
        );
        assert_eq!(
            short_stack(&blocked),
            "input.io · loader 12/12: [blocked: file] ← __libc_pread64 ← load ← main  [kernel: __x64_sys_pread64]"
        );
        let deep = folded("cpu.host;t 1/1;main;a;b;c;d;e");
        assert_eq!(short_stack(&deep), "cpu.host · t 1/1: e ← d ← c ← b ← …");
        assert_eq!(short_stack(&folded("startup")), "startup");
        assert_eq!(
            short_stack(&folded("sync;t 1/1;[waiting for a CPU]")),
            "sync · t 1/1: [waiting for a CPU]"
        );
    }
}
