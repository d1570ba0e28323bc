//! Renderers: each turns an analysis into one output and reads nothing
//! else. Every output is written by [`write`]`(Subject, &Options, out)`,
//! the subject a run, a comparison or ranks; a run's renderers have the
//! signature `write(&View, &Options, out)`, so a new format is a module
//! here, a [`Format`] variant and an arm in `write_run`.

pub mod diff;
mod document;
pub mod flame;
mod gpu_report;
pub mod html;
mod json;
pub mod ranks;
pub mod report;
mod summary;
pub mod trace;
pub use crate::units;

use std::io::{self, Write};

use crate::analyze::Analysis;
pub use flame::FlameKind;
pub use report::{Report, SCHEMA};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Markdown,
    /// One self-contained page: the report, the idle-gap flamegraph, the
    /// busy/idle strip.
    Html,
    /// An interactive SVG flamegraph.
    Flamegraph(FlameKind),
    /// The same stacks in folded text (`frame;frame;leaf weight`).
    Folded(FlameKind),
    /// Chrome trace event JSON for Perfetto UI.
    Timeline,
}

impl Format {
    /// Every output, for whoever must try them all.
    pub const ALL: [Format; 11] = [
        Format::Text,
        Format::Json,
        Format::Markdown,
        Format::Html,
        Format::Flamegraph(FlameKind::Cpu),
        Format::Flamegraph(FlameKind::OffCpu),
        Format::Flamegraph(FlameKind::Idle),
        Format::Folded(FlameKind::Cpu),
        Format::Folded(FlameKind::OffCpu),
        Format::Folded(FlameKind::Idle),
        Format::Timeline,
    ];

    pub fn extension(self) -> &'static str {
        match self {
            Format::Text => "txt",
            Format::Json => "json",
            Format::Markdown => "md",
            Format::Html => "html",
            Format::Flamegraph(_) => "svg",
            Format::Folded(_) => "folded",
            Format::Timeline => "json",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub format: Format,
    /// The part of the recording the timeline shows (absolute ns); all of
    /// it when None.
    pub window: Option<(u64, u64)>,
}

impl Options {
    pub fn new(format: Format) -> Options {
        Options {
            format,
            window: None,
        }
    }
}

/// An analysis with its report model, built once for every renderer.
pub struct View<'a> {
    pub analysis: &'a Analysis,
    pub report: Report,
}

impl<'a> View<'a> {
    pub fn new(analysis: &'a Analysis) -> View<'a> {
        View {
            analysis,
            report: report::build(analysis),
        }
    }
}

/// What an output is about: one run, two runs compared (`gapscope diff`,
/// see `analyze::compare`), or several ranks of a job side by side (one
/// input alone is written as its run).
#[derive(Clone, Copy)]
pub enum Subject<'a> {
    Run(&'a View<'a>),
    Comparison(&'a diff::Compared),
    Ranks(&'a [Labelled]),
}

/// Renders `subject` as `opts` asks: every output is written through here.
/// A format the subject has no form in is refused (`InvalidInput`).
pub fn write(subject: Subject, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    match subject {
        Subject::Run(v) => write_run(v, opts, out),
        Subject::Comparison(c) => diff::write(c, opts, out),
        Subject::Ranks(inputs) => write_ranks(inputs, opts.format, out),
    }
}

fn write_run(v: &View, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    match opts.format {
        Format::Text | Format::Markdown => summary::write(v, opts, out),
        Format::Json => json::write(v, opts, out),
        Format::Html => html::write(v, opts, out),
        Format::Flamegraph(_) | Format::Folded(_) => flame::write(v, opts, out),
        Format::Timeline => trace::write(v, opts, out),
    }
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
    dir: &crate::output::OutDir,
    v: &View,
    exports: bool,
) -> io::Result<Option<String>> {
    let a = v.analysis;
    let mut outputs = vec![
        ("report.txt".to_string(), Options::new(Format::Text)),
        ("report.json".to_string(), Options::new(Format::Json)),
        ("report.md".to_string(), Options::new(Format::Markdown)),
    ];
    let (start, end) = (a.timeline.start, a.timeline.end);
    let window = bundle_timeline_window(start, end);
    if exports {
        for kind in [FlameKind::Cpu, FlameKind::OffCpu, FlameKind::Idle] {
            outputs.push((
                format!("{}.svg", flame::file_stem(kind)),
                Options::new(Format::Flamegraph(kind)),
            ));
        }
        outputs.push(("report.html".into(), Options::new(Format::Html)));
        outputs.push((
            "trace.json".into(),
            Options {
                format: Format::Timeline,
                window,
            },
        ));
    }
    for (name, opts) in &outputs {
        dir.write_file(name, |mut w| write_run(v, opts, &mut w))?;
    }
    if !exports {
        return Ok(None);
    }
    Ok(window.map(|(s, e)| {
        let secs = |t: u64| (t - start) as f64 / 1e9;
        format!(
            "trace.json shows seconds {:.0}..{:.0} of {:.0}; for another part: gapscope export {} --timeline --window START..END -o part.json",
            secs(s),
            secs(e),
            secs(end),
            dir.path().display()
        )
    }))
}

pub use crate::analyze::Labelled;

/// Reports for one or more analyses; with several (one per rank), a
/// cross-rank table follows. Where the analyses carry HTA's per-stream
/// idle breakdown, it is shown too.
fn write_ranks(inputs: &[Labelled], format: Format, out: &mut dyn Write) -> io::Result<()> {
    let hta = inputs.iter().any(|l| l.analysis.hta.is_some());
    match format {
        Format::Text | Format::Markdown | Format::Json => {}
        Format::Html if hta => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--hta is not part of the HTML report; use --format text, md or json",
            ))
        }
        Format::Html if inputs.len() != 1 => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the HTML report takes one session or trace, not {} (write one per rank)",
                    inputs.len()
                ),
            ))
        }
        _ if inputs.len() != 1 => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{format:?} takes one session or trace"),
            ))
        }
        _ => {}
    }
    let views: Vec<View> = inputs.iter().map(|l| View::new(&l.analysis)).collect();
    if views.len() == 1 {
        return write_run(&views[0], &Options::new(format), out);
    }
    if format == Format::Json {
        let v = serde_json::json!({
            "schema": ranks::SCHEMA,
            "ranks": views.iter().zip(inputs).map(|(v, l)| {
                serde_json::json!({"label": l.label, "report": json::value(v)})
            }).collect::<Vec<_>>(),
            "cross_rank": crate::analyze::ranks::rows(inputs),
        });
        serde_json::to_writer_pretty(&mut *out, &v)?;
        return writeln!(out);
    }
    for (v, l) in views.iter().zip(inputs) {
        writeln!(out, "\n=== {} ===", l.label)?;
        write_run(v, &Options::new(format), out)?;
    }
    ranks::write_table(inputs, out)
}
