//! Everything a session turns into for people and scripts: the report model
//! and its text, markdown, JSON and HTML forms, flamegraphs and the timeline.

pub mod flame;
mod gpu_report;
pub mod html;
mod ranks;
pub mod report;
mod summary;
pub mod trace;
pub use crate::units;

use std::io::{self, Write};

pub use report::{build as build_report, Report, SCHEMA};
pub use summary::Style;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Markdown,
    /// Needs the analysis, not only the report: see [`write_html_report`].
    Html,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Text => "txt",
            Format::Json => "json",
            Format::Markdown => "md",
            Format::Html => "html",
        }
    }
}

/// The text, markdown and JSON reports.
pub fn write_report(report: &Report, format: Format, mut out: impl Write) -> io::Result<()> {
    match format {
        Format::Text => summary::write_summary(report, Style::Text, out),
        Format::Markdown => summary::write_summary(report, Style::Markdown, out),
        Format::Html => Err(io::Error::other(
            "the HTML report is written from the analysis (write_html_report)",
        )),
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, report)?;
            writeln!(out)
        }
    }
}

/// A session analysed once, for the report and every export.
pub struct Analysis {
    pub tl: crate::timeline::Timeline,
    pub diagnosis: crate::analyze::diagnose::Diagnosis,
    pub report: Report,
}

pub fn analyze(session: &crate::session::Session) -> Analysis {
    let tl = crate::timeline::Timeline::build(
        session,
        crate::timeline::BuildOptions { intervals: true },
    );
    let diagnosis = crate::analyze::diagnose::diagnose(session, &tl);
    let report = report::build_with(session, &tl, &diagnosis);
    Analysis {
        tl,
        diagnosis,
        report,
    }
}

/// The idle-gap flamegraph as SVG bytes.
pub fn idle_flamegraph_svg(session: &crate::session::Session, a: &Analysis) -> io::Result<Vec<u8>> {
    let lines = flame::folded(session, &a.tl, &a.diagnosis, flame::FlameKind::Idle);
    let mut svg = Vec::new();
    flame::write_svg(session, flame::FlameKind::Idle, &lines, &mut svg)?;
    Ok(svg)
}

pub fn write_html_report(
    session: &crate::session::Session,
    a: &Analysis,
    out: impl Write,
) -> io::Result<()> {
    let svg = idle_flamegraph_svg(session, a)?;
    html::write_html(
        &a.report,
        &a.diagnosis,
        (a.tl.start, a.tl.end),
        Some(&svg),
        out,
    )
}

/// Recordings longer than this get a timeline of their middle only in the
/// bundle: a timeline of hours opens in no viewer.
const BUNDLE_TIMELINE_MAX_NS: u64 = 60_000_000_000;
const BUNDLE_TIMELINE_WINDOW_NS: u64 = 30_000_000_000;

/// The part of a recording the bundle's trace.json shows: all of it, or
/// for long recordings its middle.
pub fn bundle_timeline_window(start: u64, end: u64) -> Option<(u64, u64)> {
    (end - start > BUNDLE_TIMELINE_MAX_NS).then(|| {
        let mid = start + (end - start) / 2;
        let half = BUNDLE_TIMELINE_WINDOW_NS / 2;
        (mid - half, mid + half)
    })
}

/// Writes the report in every format, the three flamegraphs and the
/// timeline beside the session; `exports: false` writes the text, markdown
/// and JSON reports only. Returns a line for the user when the timeline
/// covers part of the recording only.
pub fn write_bundle(
    dir: &std::path::Path,
    session: &crate::session::Session,
    a: &Analysis,
    exports: bool,
) -> io::Result<Option<String>> {
    use crate::output::write_file;
    for format in [Format::Text, Format::Json, Format::Markdown] {
        write_file(&dir.join(format!("report.{}", format.extension())), |w| {
            write_report(&a.report, format, w)
        })?;
    }
    if !exports {
        return Ok(None);
    }
    for kind in [flame::FlameKind::Cpu, flame::FlameKind::OffCpu] {
        let lines = flame::folded(session, &a.tl, &a.diagnosis, kind);
        write_file(&dir.join(format!("{}.svg", kind.file_stem())), |w| {
            flame::write_svg(session, kind, &lines, w)
        })?;
    }
    let idle = idle_flamegraph_svg(session, a)?;
    write_file(
        &dir.join(format!("{}.svg", flame::FlameKind::Idle.file_stem())),
        |w| w.write_all(&idle),
    )?;
    write_file(&dir.join("report.html"), |w| {
        html::write_html(
            &a.report,
            &a.diagnosis,
            (a.tl.start, a.tl.end),
            Some(&idle),
            w,
        )
    })?;
    let window = bundle_timeline_window(a.tl.start, a.tl.end);
    write_file(&dir.join("trace.json"), |w| {
        trace::write_timeline(session, &a.tl, &a.diagnosis, window, w)
    })?;
    Ok(window.map(|(s, e)| {
        let secs = |t: u64| (t - a.tl.start) as f64 / 1e9;
        format!(
            "trace.json shows seconds {:.0}..{:.0} of {:.0}; for another part: gapscope export {} --timeline --window START..END -o part.json",
            secs(s),
            secs(e),
            secs(a.tl.end),
            dir.display()
        )
    }))
}

/// What `gapscope export` writes.
#[derive(Clone, Debug)]
pub enum Export {
    Flamegraph {
        kind: flame::FlameKind,
        folded: bool,
    },
    /// `window`: `START..END` in seconds from the start, as typed.
    Timeline { window: Option<String> },
}

pub fn write_export(
    session: &crate::session::Session,
    what: &Export,
    out: impl Write,
) -> io::Result<()> {
    let a = analyze(session);
    match what {
        Export::Flamegraph { kind, folded } => {
            let lines = flame::folded(session, &a.tl, &a.diagnosis, *kind);
            if *folded {
                flame::write_folded(&lines, out)
            } else {
                flame::write_svg(session, *kind, &lines, out)
            }
        }
        Export::Timeline { window } => {
            let window = window
                .as_deref()
                .map(|w| trace::parse_window(w, a.tl.start, a.tl.end))
                .transpose()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            trace::write_timeline(session, &a.tl, &a.diagnosis, window, out)
        }
    }
}

/// Reports for one or more loaded sessions or traces; with several (one per
/// rank), a cross-rank table follows. `hta` adds HTA's per-stream idle
/// breakdown.
pub fn write_reports(
    loaded: &[crate::inputs::Loaded],
    format: Format,
    hta: bool,
    mut out: impl Write,
) -> io::Result<()> {
    if format == Format::Html {
        if hta {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--hta is not part of the HTML report; use --format text, md or json",
            ));
        }
        let [one] = loaded else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the HTML report takes one session or trace, not {} (write one per rank)",
                    loaded.len()
                ),
            ));
        };
        return write_html_report(&one.session, &analyze(&one.session), out);
    }
    let reports: Vec<Report> = loaded.iter().map(|l| build_report(&l.session)).collect();
    let htas: Vec<_> = loaded
        .iter()
        .map(|l| hta.then(|| crate::kineto::hta::per_stream_idle(&l.session)))
        .collect();
    if format == Format::Json {
        let with_hta = |r: &Report, h: &Option<_>| {
            let mut v = serde_json::to_value(r).expect("report serializes");
            if let Some(h) = h {
                v["hta_per_stream"] = serde_json::to_value(h).expect("table serializes");
            }
            v
        };
        let v = if reports.len() == 1 {
            with_hta(&reports[0], &htas[0])
        } else {
            serde_json::json!({
                "schema": "gapscope.ranks/1",
                "ranks": reports.iter().zip(&htas).zip(loaded).map(|((r, h), l)| {
                    serde_json::json!({"label": l.label, "report": with_hta(r, h)})
                }).collect::<Vec<_>>(),
                "cross_rank": ranks::rows(loaded, &reports),
            })
        };
        serde_json::to_writer_pretty(&mut out, &v)?;
        return writeln!(out);
    }
    for ((r, h), l) in reports.iter().zip(&htas).zip(loaded) {
        if reports.len() > 1 {
            writeln!(out, "\n=== {} ===", l.label)?;
        }
        write_report(r, format, &mut out)?;
        if let Some(h) = h {
            ranks::write_hta(h, &mut out)?;
        }
    }
    if reports.len() > 1 {
        ranks::write_table(loaded, &reports, &mut out)?;
    }
    Ok(())
}
