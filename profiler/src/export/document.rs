//! The document model of the human reports: the page's heading and blocks
//! (headings, lines, tables, bullets) built once from the report, written
//! as text for terminals, markdown for issues and chats, or HTML elements
//! for the HTML pages, whose one stylesheet is `report.css`.

use std::io::{self, Write};

use super::report::Report;
use super::units;
use crate::session::{Mode, SourceKind};

/// Longest command line shown in the heading.
const MAX_COMMAND: usize = 100;

/// The stylesheet of every HTML page (the report, a comparison).
pub(super) const STYLESHEET: &str = include_str!("report.css");

/// An HTML page's start, through `<body><main>`: its `title` (escaped
/// here), the one stylesheet, and the gapscope version that recorded what
/// it shows where that is known (a report's; a diff has two).
pub(super) fn write_page_start<W: Write + ?Sized>(
    title: &str,
    generator: Option<&str>,
    out: &mut W,
) -> io::Result<()> {
    writeln!(
        out,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">"#
    )?;
    if let Some(version) = generator {
        writeln!(
            out,
            r#"<meta name="generator" content="gapscope {}">"#,
            html_escape(version)
        )?;
    }
    writeln!(
        out,
        r#"<title>{}</title>
<style>{STYLESHEET}</style></head>
<body><main>"#,
        html_escape(title)
    )
}

/// The command as one line: shell-quoted where needed, newlines folded, cut.
pub(super) fn command_line(argv: &[String]) -> String {
    if argv.is_empty() {
        return "?".into();
    }
    let quoted: Vec<String> = argv
        .iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect();
    let line: String = quoted
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if line.chars().count() > MAX_COMMAND {
        let cut: String = line.chars().take(MAX_COMMAND - 1).collect();
        format!("{cut}…")
    } else {
        line
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Text,
    Markdown,
    /// HTML elements, for the body of the HTML report.
    Html,
}

pub(super) struct Table {
    pub header: Vec<&'static str>,
    /// Right-aligned columns (numbers).
    pub right: Vec<bool>,
    pub rows: Vec<Vec<String>>,
    /// A line under the table.
    pub note: Option<String>,
}

pub(super) enum Block {
    Heading(String),
    Line(String),
    Table(Table),
    Bullets(Vec<String>),
}

/// The top of a report, whatever it is written as: what ran, when and
/// where, and what the reader must know before any number.
pub(super) struct Heading {
    /// `gapscope · <command> · pid N · exit C` (or the trace it came from).
    pub title: String,
    /// The command in full, for a page with room for it.
    pub command: String,
    /// `pid N · exit C`, or that it is a PyTorch profiler trace.
    pub target: String,
    /// When, for how long, how it ended, where, how much was recorded.
    pub when: String,
    /// The session was cut short: why, and that what came before is shown.
    pub truncated: Option<String>,
    /// The GPU is gapscope's simulated one (the demo and test workload).
    pub simulated: bool,
}

/// The heading of report `r`.
pub(super) fn heading(r: &Report) -> Heading {
    let cmd = command_line(&r.target.command);
    let exit = match r.target.exit_code {
        Some(c) => format!("exit {c}"),
        None => "still running".into(),
    };
    let s = &r.session;
    let target = if s.mode.is_trace() {
        "PyTorch profiler trace".to_string()
    } else {
        format!("pid {} · {exit}", r.target.pid)
    };
    let (title, when) = if s.mode.is_trace() {
        (
            format!("gapscope · {cmd} · {target}"),
            format!(
                "trace of {} starting {} (clock as in the trace)",
                units::duration(s.duration_ns),
                units::utc(s.start_unix_ns)
            ),
        )
    } else {
        (
            format!("gapscope · {cmd} · {target}"),
            format!(
                "{} {} · {} · {} on {} (Linux {}, {} CPUs) · {} events · {} Hz sampling",
                match s.mode {
                    Mode::Run => "ran",
                    // One window of the agent's continuous recording.
                    Mode::Window => "watched",
                    _ => "attached",
                },
                units::utc(s.start_unix_ns),
                units::duration(s.duration_ns),
                s.stop_reason.unwrap_or("recording cut short"),
                s.hostname,
                s.kernel,
                s.nr_cpus,
                units::count(s.events),
                s.sample_hz
            ),
        )
    };
    Heading {
        title,
        command: if r.target.command.is_empty() {
            "?".to_string()
        } else {
            r.target.command.join(" ")
        },
        target,
        when,
        truncated: s
            .truncated
            .as_ref()
            .map(|why| format!("TRUNCATED session: {why}; everything up to that point is shown")),
        simulated: r.gpus.iter().any(|g| g.source == SourceKind::Simulated),
    }
}

impl Heading {
    /// As blocks, for text and markdown (their GPU lines say a GPU is
    /// simulated).
    pub(super) fn blocks(&self) -> Vec<Block> {
        let mut b = vec![
            Block::Heading(self.title.clone()),
            Block::Line(self.when.clone()),
        ];
        b.extend(self.truncated.clone().map(Block::Line));
        b
    }

    /// As the top of an HTML page (`h1` is the page's own).
    pub(super) fn write_html(&self, h1: &str, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "<h1>{}</h1>", html_escape(h1))?;
        writeln!(
            out,
            r#"<div class="cmd">{}</div>"#,
            html_escape(&self.command)
        )?;
        writeln!(
            out,
            r#"<div class="sub">{} · {}</div>"#,
            html_escape(&self.target),
            html_escape(&self.when)
        )?;
        if self.simulated {
            writeln!(
                out,
                r#"<div class="banner sim" id="simulated">SIMULATED GPU: this recording comes from gapscope's test and demo workload. The host side (threads, files, syscalls) is real; the GPU and its timings are simulated.</div>"#
            )?;
        }
        if let Some(t) = &self.truncated {
            writeln!(out, r#"<div class="banner warn">{}</div>"#, html_escape(t))?;
        }
        Ok(())
    }
}

pub(super) fn write_block(block: &Block, style: Style, mut out: impl Write) -> io::Result<()> {
    match style {
        Style::Text => write_text(block, &mut out),
        Style::Markdown => write_markdown(block, &mut out),
        Style::Html => write_html(block, &mut out),
    }
}

fn write_text(block: &Block, out: &mut impl Write) -> io::Result<()> {
    match block {
        Block::Heading(h) => writeln!(out, "\n{h}"),
        Block::Line(l) => writeln!(out, "{l}"),
        Block::Bullets(items) => {
            for i in items {
                writeln!(out, "  {i}")?;
            }
            Ok(())
        }
        Block::Table(t) => {
            let widths: Vec<usize> = (0..t.header.len())
                .map(|c| {
                    t.rows
                        .iter()
                        .map(|r| r[c].chars().count())
                        .chain([t.header[c].len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |cells: Vec<&str>| {
                let mut s = String::from(" ");
                for (c, cell) in cells.iter().enumerate() {
                    let pad = widths[c].saturating_sub(cell.chars().count());
                    s.push(' ');
                    if t.right[c] {
                        s += &" ".repeat(pad);
                        s += cell;
                    } else {
                        s += cell;
                        s += &" ".repeat(pad);
                    }
                }
                s.trim_end().to_string()
            };
            writeln!(out, "{}", line(t.header.clone()))?;
            for r in &t.rows {
                writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
            }
            if let Some(note) = &t.note {
                writeln!(out, "  {note}")?;
            }
            Ok(())
        }
    }
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

fn write_markdown(block: &Block, out: &mut impl Write) -> io::Result<()> {
    match block {
        Block::Heading(h) => writeln!(out, "\n### {}\n", md_escape(h)),
        Block::Line(l) => writeln!(out, "{}  ", md_escape(l)),
        Block::Bullets(items) => {
            for i in items {
                writeln!(out, "- `{}`", i.replace('`', "'"))?;
            }
            Ok(())
        }
        Block::Table(t) => {
            writeln!(out, "| {} |", t.header.join(" | "))?;
            let align: Vec<&str> = t
                .right
                .iter()
                .map(|&r| if r { "---:" } else { "---" })
                .collect();
            writeln!(out, "|{}|", align.join("|"))?;
            for r in &t.rows {
                let cells: Vec<String> = r.iter().map(|c| md_escape(c)).collect();
                writeln!(out, "| {} |", cells.join(" | "))?;
            }
            if let Some(note) = &t.note {
                writeln!(out, "\n{}", md_escape(note))?;
            }
            Ok(())
        }
    }
}

pub(super) fn html_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o += "&amp;",
            '<' => o += "&lt;",
            '>' => o += "&gt;",
            '"' => o += "&quot;",
            '\'' => o += "&#39;",
            c => o.push(c),
        }
    }
    o
}

fn write_html(block: &Block, out: &mut impl Write) -> io::Result<()> {
    let e = html_escape;
    match block {
        Block::Heading(h) => writeln!(out, "<h3>{}</h3>", e(h)),
        Block::Line(l) => writeln!(out, "<p>{}</p>", e(l)),
        Block::Bullets(items) => {
            writeln!(out, "<ul class=\"mono\">")?;
            for i in items {
                writeln!(out, "<li>{}</li>", e(i))?;
            }
            writeln!(out, "</ul>")
        }
        Block::Table(t) => {
            let cell = |tag: &str, c: usize, text: &str| {
                let class = if t.right[c] { " class=\"num\"" } else { "" };
                format!("<{tag}{class}>{}</{tag}>", e(text))
            };
            write!(out, "<table><thead><tr>")?;
            for (c, h) in t.header.iter().enumerate() {
                write!(out, "{}", cell("th", c, h))?;
            }
            writeln!(out, "</tr></thead><tbody>")?;
            for r in &t.rows {
                write!(out, "<tr>")?;
                for (c, text) in r.iter().enumerate() {
                    write!(out, "{}", cell("td", c, text))?;
                }
                writeln!(out, "</tr>")?;
            }
            writeln!(out, "</tbody></table>")?;
            if let Some(note) = &t.note {
                writeln!(out, "<p class=\"note\">{}</p>", e(note))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_one_quoted_line() {
        let argv: Vec<String> = ["python3", "-c", "import x\nx.run()", "--lr=0.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            command_line(&argv),
            "python3 -c 'import x x.run()' --lr=0.1"
        );
        let long = vec!["a".repeat(300)];
        assert_eq!(command_line(&long).chars().count(), MAX_COMMAND);
        assert_eq!(command_line(&[]), "?");
    }
}
