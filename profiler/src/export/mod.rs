//! Everything a session turns into for people and scripts: the report model
//! and its text, markdown and JSON forms.

mod gpu_report;
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
