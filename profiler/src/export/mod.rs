//! Everything a session turns into for people and scripts: the report model
//! and its text, markdown and JSON forms.

mod gpu_report;
mod ranks;
mod recommend;
pub mod report;
mod summary;
pub mod units;

use std::io::{self, Write};

pub use report::{build as build_report, Report, SCHEMA};
pub use summary::Style;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Markdown,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Text => "txt",
            Format::Json => "json",
            Format::Markdown => "md",
        }
    }
}

pub fn write_report(report: &Report, format: Format, mut out: impl Write) -> io::Result<()> {
    match format {
        Format::Text => summary::write_summary(report, Style::Text, out),
        Format::Markdown => summary::write_summary(report, Style::Markdown, out),
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, report)?;
            writeln!(out)
        }
    }
}

/// Writes report.txt, report.json and report.md beside the session.
pub fn write_bundle(dir: &std::path::Path, report: &Report) -> io::Result<()> {
    for format in [Format::Text, Format::Json, Format::Markdown] {
        let path = dir.join(format!("report.{}", format.extension()));
        let file = crate::output::create_file(&path)?;
        let mut w = io::BufWriter::new(file);
        write_report(report, format, &mut w)?;
        w.flush()?;
    }
    Ok(())
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
