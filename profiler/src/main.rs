//! The `gapscope` command line: clap arguments turned into library calls.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand, ValueEnum};

use gapscope::analyze::{analyze, AnalyzeOptions};
use gapscope::collect::{self, bpf::TracerConfig, RecordError, RecordOptions, Recording, Target};
use gapscope::export::diff::{DiffOptions, Side};
use gapscope::export::{self, FlameKind, Format, Labelled, Options, Subject, View};

#[derive(Parser, Debug)]
#[command(
    name = "gapscope",
    version,
    about = "Why do your GPUs sit idle? Records a process tree with eBPF and tells where its time went.",
    long_about = None,
    after_help = "Examples:\n  sudo gapscope run -- python3 train.py\n  sudo gapscope attach --pid 4242 --duration 30\n  gapscope report gapscope-4242-20261129-164012/ --format json\n  gapscope report gapscope-4242-20261129-164012/ --format html -o report.html\n  gapscope export gapscope-4242-20261129-164012/ --flamegraph idle -o idle.svg\n  gapscope export gapscope-4242-20261129-164012/ --timeline --window 10..12 -o trace.json\n  gapscope diff before/ after/ --gate 5"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a command and record it and all its descendants until it exits.
    Run {
        #[command(flatten)]
        rec: RecordArgs,
        /// Write the session as windows of SECS each (at least 1), a run
        /// directory per window inside the output directory: a crash or a
        /// full disk loses at most the window being written, and `gapscope
        /// report DIR` reads them as one session.
        #[arg(long, value_name = "SECS")]
        window: Option<f64>,
        /// The command to run and its arguments (put `--` before it if its
        /// first argument starts with a dash).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<String>,
    },
    /// Record a running process, its threads and all its descendants.
    Attach {
        /// Process to record.
        #[arg(long, short = 'p')]
        pid: u32,
        /// Stop after this many seconds (default: until Ctrl-C or the target exits).
        #[arg(long, short = 'd', value_name = "SECS", allow_negative_numbers = true)]
        duration: Option<f64>,
        /// Record a process of another user (under sudo, gapscope attaches
        /// only to the invoking user's processes by default).
        #[arg(long)]
        any_user: bool,
        /// Do not bring the CUPTI shim into GPU processes that run without
        /// it (by default it is loaded with ptrace, and stays dormant after);
        /// they are then watched through libcuda uprobes, without GPU times.
        #[arg(long)]
        no_inject: bool,
        #[command(flatten)]
        rec: RecordArgs,
    },
    /// Print the report of a recorded session (no privileges needed).
    Report {
        /// Session files or run directories, an agent's folder of one job's
        /// windows (read as one session), or PyTorch profiler (Kineto)
        /// traces (.json, .json.gz; several, or a directory = one per rank).
        /// Several (one per node or rank) are read as one job: aligned on
        /// one clock, with a cross-rank table.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, short = 'f', value_enum, default_value_t = FormatArg::Text)]
        format: FormatArg,
        /// Add Holistic Trace Analysis's per-stream idle breakdown (host_wait,
        /// kernel_wait, other), computed with HTA's rules, to compare with it.
        #[arg(long)]
        hta: bool,
        /// Name your own code as a region of the job (input.decode,
        /// input.transform, model.forward…): REGION=FIELD:GLOB, FIELD one
        /// of py (a Python function's qualified name), pyfile (its file),
        /// lib (a native frame's library), sym (its symbol), op (a trace's
        /// op: a record_function range); '*' at either end of GLOB. Tried
        /// before the built-in table; repeat for more.
        /// E.g. --code 'input.decode=py:ShardReader.decode'
        #[arg(long, value_name = "RULE")]
        code: Vec<String>,
        /// Write to FILE instead of stdout.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Did the fix work? Two runs compared: idle by cause side by side,
    /// steps matched, a verdict judged against the runs' own spread, and a
    /// gate for CI (exit 3).
    Diff {
        /// The run before: a session file, run directory, PyTorch profiler
        /// trace or directory of per-rank traces.
        base: PathBuf,
        /// The run after, of the same kinds.
        new: PathBuf,
        /// text, json (schema gapscope.diff/1), md (for pull requests), html
        /// (self-contained), or the differential idle-gap flamegraph as SVG
        /// (flamegraph) or folded stacks with both weights (folded).
        #[arg(long, short = 'f', value_enum, default_value_t = DiffFormatArg::Text)]
        format: DiffFormatArg,
        /// Exit with code 3 when NEW's GPU idle share of allocated time is
        /// worse than BASE's by more than PCT points.
        #[arg(long, value_name = "PCT")]
        gate: Option<f64>,
        /// The smallest change of step time, in percent, the verdict calls
        /// improved or regressed (runs of one job differ by a few percent
        /// from the machine's load alone).
        #[arg(long, value_name = "PCT", default_value_t = gapscope::export::diff::DEFAULT_MIN_CHANGE_PCT)]
        min_change: f64,
        /// Write to FILE instead of stdout.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Watch the node: follow its GPU jobs continuously in the cheap
    /// recording mode and serve GPU idle time by cause to Prometheus.
    #[command(args_conflicts_with_subcommands = true)]
    Agent {
        #[command(subcommand)]
        action: Option<AgentAction>,
        /// Follow this process (and its descendants) instead of finding the
        /// node's GPU jobs; repeat for several.
        #[arg(long, short = 'p', value_name = "PID")]
        pid: Vec<u32>,
        /// Follow the processes of this cgroup (a cgroup v2 path, relative
        /// to /sys/fs/cgroup or absolute); repeat for several.
        #[arg(long, value_name = "PATH")]
        cgroup: Vec<PathBuf>,
        /// Serve Prometheus metrics on http://ADDR/metrics.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9445")]
        listen: std::net::SocketAddr,
        /// Length of each recording window, seconds.
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        window: f64,
        /// Keep each window's session on disk this many minutes (the flight
        /// recorder), then delete it.
        #[arg(long, value_name = "MINUTES", default_value_t = 10.0)]
        keep: f64,
        /// Where the windows' sessions go.
        #[arg(long, value_name = "DIR", default_value = "/var/lib/gapscope")]
        dir: PathBuf,
        /// Bring the CUPTI shim into GPU processes that run without it
        /// (ptrace, as attach does); without, they are watched with libcuda
        /// uprobes, and shims already there are used.
        #[arg(long)]
        inject: bool,
        /// Stop once this many windows have been analysed (default: until
        /// SIGINT or SIGTERM).
        #[arg(long, value_name = "N", hide = true)]
        stop_after: Option<u64>,
    },
    /// Flamegraphs (SVG or folded stacks) and the timeline (Chrome trace JSON,
    /// for Perfetto UI and chrome://tracing) of a recorded session or trace.
    #[command(group(ArgGroup::new("what").required(true).args(["flamegraph", "timeline"])))]
    Export {
        /// A session file or run directory, or a PyTorch profiler trace.
        path: PathBuf,
        /// Draw a flamegraph: cpu = on-CPU samples; offcpu = blocked time by
        /// stack; idle = host stacks during GPU idle gaps, rooted at the cause.
        #[arg(long, value_enum, value_name = "KIND")]
        flamegraph: Option<FlameArg>,
        /// With --flamegraph: folded stacks (for speedscope, inferno,
        /// flamegraph.pl) instead of SVG.
        #[arg(long, requires = "flamegraph", conflicts_with = "timeline")]
        folded: bool,
        /// The timeline as Chrome trace event JSON: GPU streams, host threads,
        /// syscalls, CUDA calls, idle gaps by cause, launch→kernel arrows.
        #[arg(long)]
        timeline: bool,
        /// With --timeline: only START..END, in seconds from the start of the
        /// recording (e.g. 10..12.5, ..5, 30..).
        #[arg(
            long,
            requires = "timeline",
            conflicts_with = "flamegraph",
            value_name = "START..END"
        )]
        window: Option<String>,
        /// Write to FILE instead of stdout.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Convert other profilers' output into gapscope sessions.
    Import {
        #[command(subcommand)]
        what: ImportCommand,
    },
}

#[derive(Subcommand, Debug)]
enum AgentAction {
    /// Write the flight recorder out now (the running agent does the same
    /// on SIGUSR1): each job's windows on disk as one session, a run
    /// directory `gapscope report` reads, OUT/<workload>-<pid>/<first
    /// window>/ (OUT: DIR/dumps/<time>/ unless -o).
    Dump {
        /// The agent's folder.
        #[arg(long, value_name = "DIR", default_value = "/var/lib/gapscope")]
        dir: PathBuf,
        /// Where to put them.
        #[arg(long, short = 'o', value_name = "OUT")]
        output: Option<PathBuf>,
        /// Only workloads whose name starts with this (as in the metrics'
        /// workload label: slurm-4242, namespace_pod, train-1234).
        #[arg(long, value_name = "NAME")]
        workload: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ImportCommand {
    /// PyTorch profiler (Kineto) traces: one session per trace file.
    Kineto {
        /// Trace files (.json, .json.gz) or directories of them.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Output directory: DIR/session.gsz for one trace, DIR/<trace>/session.gsz for several.
        #[arg(long, short = 'o', value_name = "DIR")]
        output: PathBuf,
    },
}

#[derive(Args, Debug)]
struct RecordArgs {
    /// Leave CPython's frames out of the stacks: by default the kernel side
    /// walks them (CPython 3.9-3.14, found by itself in every process of the
    /// tree) and the stacks, flamegraphs and timeline name Python functions.
    #[arg(long)]
    no_python_frames: bool,
    /// Output directory [default: ./gapscope-<pid>-<time>/]
    #[arg(long, short = 'o', value_name = "DIR")]
    output: Option<PathBuf>,
    /// cpu-clock sampling frequency per CPU, Hz (0 turns sampling off).
    #[arg(long, default_value_t = 99, value_name = "HZ", value_parser = clap::value_parser!(u64).range(0..=10_000))]
    freq: u64,
    /// Kernel ring buffer size, MiB.
    #[arg(long, default_value_t = 32, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=1024))]
    buffer_mb: u32,
    /// Do not capture stacks when threads block (cheaper; no off-CPU stacks).
    #[arg(long)]
    no_offcpu_stacks: bool,
    /// Which syscalls to record: `blocking` hooks none and reads what a
    /// thread blocked in (the call, its file or socket, the size asked) from
    /// its registers when it blocks, with bytes from the kernel's I/O
    /// accounting; `all` hooks every syscall's entry and exit (per-syscall
    /// counts and times, bytes by kind of descriptor, every opened path),
    /// which puts every task on the machine on the slow syscall path.
    #[arg(long, value_enum, default_value_t = SyscallsArg::Blocking, value_name = "WHICH")]
    syscalls: SyscallsArg,
    /// No status line while recording, no report at the end.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Write the session and the reports only: no flamegraphs, no
    /// trace.json, no report.html.
    #[arg(long)]
    no_exports: bool,
    /// Record the CPU side only: no CUPTI shim, no NVML.
    #[arg(long)]
    no_gpu: bool,
    /// Use this libcupti where the process has none loaded (one it loaded
    /// always wins); default: the NVIDIA wheels beside its CUDA runtime,
    /// else the CUDA install's, matched to the driver.
    #[arg(long, value_name = "PATH")]
    cupti: Option<PathBuf>,
    /// Watch this libcuda with uprobes (for processes without the shim;
    /// attach finds the target's own libcuda by itself).
    #[arg(long, value_name = "PATH")]
    libcuda: Option<PathBuf>,
    /// NVML sampling rate, Hz.
    #[arg(long, default_value_t = 10, value_name = "HZ", value_parser = clap::value_parser!(u64).range(1..=1000))]
    nvml_hz: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SyscallsArg {
    All,
    Blocking,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FormatArg {
    Text,
    Json,
    Md,
    /// One self-contained page (use with -o).
    Html,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DiffFormatArg {
    Text,
    Json,
    Md,
    /// One self-contained page (use with -o).
    Html,
    /// The differential idle-gap flamegraph (SVG): red grew, blue shrank.
    Flamegraph,
    /// Its stacks, folded: `stack BASE_NS NEW_NS`.
    Folded,
}

impl From<DiffFormatArg> for Format {
    fn from(f: DiffFormatArg) -> Format {
        match f {
            DiffFormatArg::Text => Format::Text,
            DiffFormatArg::Json => Format::Json,
            DiffFormatArg::Md => Format::Markdown,
            DiffFormatArg::Html => Format::Html,
            DiffFormatArg::Flamegraph => Format::Flamegraph(FlameKind::Idle),
            DiffFormatArg::Folded => Format::Folded(FlameKind::Idle),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FlameArg {
    Cpu,
    Offcpu,
    Idle,
}

impl From<FlameArg> for FlameKind {
    fn from(f: FlameArg) -> FlameKind {
        match f {
            FlameArg::Cpu => FlameKind::Cpu,
            FlameArg::Offcpu => FlameKind::OffCpu,
            FlameArg::Idle => FlameKind::Idle,
        }
    }
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Text => Format::Text,
            FormatArg::Json => Format::Json,
            FormatArg::Md => Format::Markdown,
            FormatArg::Html => Format::Html,
        }
    }
}

impl RecordArgs {
    fn options(&self, duration: Option<Duration>) -> RecordOptions {
        RecordOptions {
            out_dir: self.output.clone(),
            tracer: TracerConfig {
                sample_hz: self.freq,
                ring_bytes: self.buffer_mb << 20,
                offcpu_stacks: !self.no_offcpu_stacks,
                syscall_hooks: self.syscalls == SyscallsArg::All,
            },
            duration,
            status_line: !self.quiet && std::io::stderr().is_terminal(),
            env: {
                let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
                if let Some(p) = &self.cupti {
                    env.push(("GAPSCOPE_CUPTI".into(), p.clone().into_os_string()));
                }
                env
            },
            gpu: !self.no_gpu,
            nvml_hz: self.nvml_hz,
            libcuda: self.libcuda.clone(),
            cupti: self.cupti.clone(),
            any_user: false,
            inject: false,
            windows: None,
            python_frames: !self.no_python_frames,
        }
    }
}

/// One line: the error and its causes, outermost first.
fn fail(err: impl Into<Box<dyn std::error::Error>>) -> ExitCode {
    fail_with_hint(err, None)
}

fn fail_with_hint(err: impl Into<Box<dyn std::error::Error>>, hint: Option<&str>) -> ExitCode {
    let err = err.into();
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line += &format!(": {text}");
        }
        source = cause.source();
    }
    if let Some(hint) = hint {
        line += &format!("; hint: {hint}");
    }
    eprintln!("gapscope: error: {line}");
    ExitCode::from(1)
}

/// `run --window`'s cuts: each window closed is on disk; one that could not
/// be written is said (the recording goes on in the next).
fn windows_written(every: Duration) -> gapscope::collect::windows::Windows {
    let (done, closed) = std::sync::mpsc::channel::<Result<Recording, RecordError>>();
    std::thread::spawn(move || {
        for window in closed {
            if let Err(e) = window {
                eprintln!("gapscope: warning: a window of the recording was lost: {e}");
            }
        }
    });
    gapscope::collect::windows::Windows {
        every,
        done,
        stop: Default::default(),
    }
}

/// Reads the session back from disk, writes the report files beside it and
/// prints the text report: what is printed is exactly what `report` shows.
fn after_recording(rec: &Recording, quiet: bool, exports: bool) -> Result<(), String> {
    // Cut into windows, the reports are of all of them, in their folder
    // (read back through the folder held open, as the session file is).
    let (out, source): (_, gapscope::session::Source) = match &rec.windows {
        Some(folder) => {
            let windows = gapscope::session::windows_in(&folder.held_path(""));
            let last = gapscope::session::recordings(&windows).pop();
            (
                folder,
                gapscope::session::Stored::Windows(last.unwrap_or_default()).into(),
            )
        }
        None => (
            &rec.dir,
            rec.dir.held_path(gapscope::session::FILE_NAME).into(),
        ),
    };
    let dir = out.path();
    let a = analyze(
        source,
        &AnalyzeOptions {
            pictures: exports,
            hta: false,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let v = View::new(&a);
    let partial_timeline =
        export::write_bundle(out, &v, exports).map_err(|e| format!("writing reports: {e}"))?;
    if !quiet {
        let mut err = std::io::stderr().lock();
        export::write(Subject::Run(&v), &Options::new(Format::Text), &mut err)
            .map_err(|e| e.to_string())?;
        let what = if exports {
            "session, reports (report.html), flamegraphs and timeline (trace.json)"
        } else {
            "session and reports"
        };
        if let Some(line) = partial_timeline {
            eprintln!("\ngapscope: {line}");
        }
        eprintln!("\ngapscope: {what} in {}/", dir.display());
    }
    if rec.target_left_running {
        eprintln!("gapscope: recording stopped; the target is still running");
    }
    Ok(())
}

/// Writes to FILE (whole or not at all) or to stdout (a closed pipe is not
/// an error: `| head` is a normal way to read).
fn write_out(
    file: Option<&std::path::Path>,
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> ExitCode {
    let result = match file {
        Some(p) if p != std::path::Path::new("-") => gapscope::output::write_file(p, |w| fill(w))
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    e.to_string()
                } else {
                    format!("{}: {e}", p.display())
                }
            }),
        _ => {
            let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
            match fill(&mut stdout).and_then(|()| std::io::Write::flush(&mut stdout)) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => r.map_err(|e| e.to_string()),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn record(target: Target, opts: RecordOptions, args: &RecordArgs) -> ExitCode {
    // `run` stands in for its command and exits as it did; `attach` reports
    // on its own success only.
    let is_run = matches!(target, Target::Command(_));
    match collect::record(target, &opts) {
        Ok(rec) => {
            if let Err(e) = after_recording(&rec, args.quiet, !args.no_exports) {
                return fail(e);
            }
            match rec.exit_code {
                Some(code) if is_run => ExitCode::from(code.clamp(0, 255) as u8),
                // `run` abandoned by a second Ctrl-C: interrupted, like a shell says.
                None if rec.target_left_running => ExitCode::from(128 + libc::SIGINT as u8),
                _ => ExitCode::SUCCESS,
            }
        }
        Err(RecordError::Launch(e)) => {
            eprintln!("gapscope: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
        Err(e) => {
            let hint = e.hint();
            fail_with_hint(e, hint)
        }
    }
}

/// Each path's analyses (one per trace of a directory of traces).
fn analyzed(
    paths: &[PathBuf],
    opts: &AnalyzeOptions,
) -> Result<Vec<Labelled>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for l in gapscope::inputs::load(paths)? {
        for w in l.warnings() {
            eprintln!("gapscope: warning: {w}");
        }
        out.push(Labelled {
            label: l.label,
            analysis: analyze(l.source, opts)?,
        });
    }
    Ok(out)
}

/// `diff`: exit 3 when the gate fails (the comparison is still written).
fn diff(
    base: &std::path::Path,
    new: &std::path::Path,
    format: Format,
    gate: Option<f64>,
    min_change: f64,
    output: Option<&std::path::Path>,
) -> ExitCode {
    if gate.is_some_and(|g| !g.is_finite() || g < 0.0)
        || !min_change.is_finite()
        || min_change < 0.0
    {
        eprintln!("gapscope: error: --gate and --min-change take a number of points or percent, 0 or more; hint: `gapscope diff --help` shows the usage");
        return ExitCode::from(2);
    }
    // The idle-gap stacks are read from thread states: keep them all.
    let opts = AnalyzeOptions {
        pictures: true,
        hta: false,
        ..Default::default()
    };
    let side = |p: &std::path::Path| {
        analyzed(std::slice::from_ref(&p.to_path_buf()), &opts).map_err(|e| {
            // Most of what reading says names the input already.
            let e = e.to_string();
            let path = p.display().to_string();
            if e.starts_with(&path) {
                e
            } else {
                format!("{path}: {e}")
            }
        })
    };
    let (b, n) = match (side(base), side(new)) {
        (Ok(b), Ok(n)) => (b, n),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let compared = gapscope::export::diff::build(
        &Side {
            name: base.display().to_string(),
            inputs: &b,
        },
        &Side {
            name: new.display().to_string(),
            inputs: &n,
        },
        &DiffOptions {
            gate_points: gate,
            min_change_pct: min_change,
        },
    );
    let code = write_out(output, |w| {
        export::write(Subject::Comparison(&compared), &Options::new(format), w)
    });
    match compared.diff.gate {
        Some(g) if !g.passed && code == ExitCode::SUCCESS => {
            eprintln!(
                "gapscope: gate failed: GPU idle share {:.1}% → {:.1}% of allocated time ({:+.1} points, allowed +{:.1})",
                compared.diff.idle_share.base_pct,
                compared.diff.idle_share.new_pct,
                compared.diff.idle_share.change_points,
                g.points
            );
            ExitCode::from(3)
        }
        _ => code,
    }
}

/// Parses the command line; a mistake is one line with a hint, exit 2
/// (help and version print as usual).
fn parse_cli() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            Err(ExitCode::from(2))
        }
        Err(e) => {
            // clap's first paragraph, on one line: the error and the lines
            // that belong to it (missing arguments, possible values).
            let rendered = e.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.trim_start_matches("error: ");
            let sub = std::env::args()
                .skip(1)
                .find(|a| !a.starts_with('-'))
                .filter(|a| Cli::command().find_subcommand(a).is_some());
            let help = match sub {
                Some(s) => format!("gapscope {s} --help"),
                None => "gapscope --help".into(),
            };
            eprintln!("gapscope: error: {message}; hint: `{help}` shows the usage");
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Run { rec, cmd, window } => {
            let mut opts = rec.options(None);
            if let Some(secs) = window {
                if !(secs >= 1.0 && secs.is_finite()) {
                    eprintln!(
                        "gapscope: error: --window must be a number of seconds, at least 1; \
                         hint: `gapscope run --help` shows the usage"
                    );
                    return ExitCode::from(2);
                }
                opts.windows = Some(windows_written(Duration::from_secs_f64(secs)));
            }
            record(Target::Command(cmd), opts, &rec)
        }
        Command::Attach {
            pid,
            duration,
            any_user,
            no_inject,
            rec,
        } => {
            let duration = match duration {
                Some(d) if !(d > 0.0 && d.is_finite()) => {
                    eprintln!(
                        "gapscope: error: --duration must be a positive number of seconds; \
                         hint: `gapscope attach --help` shows the usage"
                    );
                    return ExitCode::from(2);
                }
                d => d.map(Duration::from_secs_f64),
            };
            let opts = RecordOptions {
                any_user,
                inject: !no_inject,
                windows: None,
                ..rec.options(duration)
            };
            record(Target::Pid(pid), opts, &rec)
        }
        Command::Report {
            paths,
            format,
            hta,
            code,
            output,
        } => {
            let format: Format = format.into();
            let mut rules = gapscope::analyze::code::Rules::default();
            for spec in &code {
                if let Err(e) = rules.add(spec) {
                    eprintln!(
                        "gapscope: error: {e}; hint: `gapscope report --help` shows the form"
                    );
                    return ExitCode::from(2);
                }
            }
            let opts = AnalyzeOptions {
                pictures: format == Format::Html,
                hta,
                code: rules,
            };
            match analyzed(&paths, &opts) {
                Ok(inputs) => write_out(output.as_deref(), |w| {
                    export::write(Subject::Ranks(&inputs), &Options::new(format), w)
                }),
                Err(e) => fail(e),
            }
        }
        Command::Agent {
            action:
                Some(AgentAction::Dump {
                    dir,
                    output,
                    workload,
                }),
            ..
        } => match gapscope::agent::dump(&dir, output.as_deref(), workload.as_deref()) {
            Ok(d) => {
                eprintln!("gapscope: {}", d.said());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Agent {
            action: None,
            pid,
            cgroup,
            listen,
            window,
            keep,
            dir,
            inject,
            stop_after,
        } => {
            let positive = |x: f64| x.is_finite() && x > 0.0;
            if !positive(window) || !positive(keep) {
                eprintln!("gapscope: error: --window and --keep take a positive number; hint: `gapscope agent --help` shows the usage");
                return ExitCode::from(2);
            }
            let opts = gapscope::agent::AgentOptions {
                pids: pid,
                cgroups: cgroup,
                listen: Some(listen),
                window: Duration::from_secs_f64(window),
                keep: Duration::from_secs_f64(keep * 60.0),
                dir,
                inject,
                stop_after,
            };
            match gapscope::agent::run(&opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Diff {
            base,
            new,
            format,
            gate,
            min_change,
            output,
        } => diff(
            &base,
            &new,
            format.into(),
            gate,
            min_change,
            output.as_deref(),
        ),
        Command::Export {
            path,
            flamegraph,
            folded,
            timeline: _,
            window,
            output,
        } => {
            let format = match flamegraph {
                Some(kind) if folded => Format::Folded(kind.into()),
                Some(kind) => Format::Flamegraph(kind.into()),
                None => Format::Timeline,
            };
            match gapscope::inputs::load(std::slice::from_ref(&path)) {
                Ok(mut loaded) if loaded.len() == 1 => {
                    let source = loaded.pop().expect("one").source;
                    let opts = AnalyzeOptions {
                        pictures: true,
                        hta: false,
                        ..Default::default()
                    };
                    let a = match analyze(source, &opts) {
                        Ok(a) => a,
                        Err(e) => return fail(e),
                    };
                    let window = match window
                        .as_deref()
                        .map(|w| export::trace::parse_window(w, a.timeline.start, a.timeline.end))
                    {
                        Some(Err(e)) => return fail(e),
                        Some(Ok(w)) => Some(w),
                        None => None,
                    };
                    let v = View::new(&a);
                    write_out(output.as_deref(), |w| {
                        export::write(Subject::Run(&v), &Options { format, window }, w)
                    })
                }
                Ok(loaded) => fail(format!(
                    "{} holds {} traces; export takes one: name the file",
                    path.display(),
                    loaded.len()
                )),
                Err(e) => fail(e),
            }
        }
        Command::Import {
            what: ImportCommand::Kineto { traces, output },
        } => match gapscope::inputs::import_to(&traces, &output) {
            Ok(written) => {
                for i in written {
                    for w in &i.warnings {
                        eprintln!("gapscope: warning: {w}");
                    }
                    eprintln!("gapscope: wrote {}", i.path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_dashes() {
        let cli = Cli::try_parse_from(["gapscope", "run", "-o", "d", "--", "python3", "-c", "1"])
            .unwrap();
        let Command::Run { rec, cmd, .. } = cli.command else {
            panic!()
        };
        assert_eq!(cmd, ["python3", "-c", "1"]);
        assert_eq!(rec.output, Some(PathBuf::from("d")));
        assert_eq!(rec.freq, 99);
    }

    #[test]
    fn run_takes_the_command_without_dashes_too() {
        let cli =
            Cli::try_parse_from(["gapscope", "run", "-q", "python3", "-u", "train.py"]).unwrap();
        let Command::Run { rec, cmd, .. } = cli.command else {
            panic!()
        };
        assert!(rec.quiet);
        assert_eq!(cmd, ["python3", "-u", "train.py"]);
    }

    #[test]
    fn misuse_is_rejected() {
        assert!(Cli::try_parse_from(["gapscope", "run"]).is_err());
        assert!(Cli::try_parse_from(["gapscope", "attach"]).is_err());
        assert!(Cli::try_parse_from(["gapscope", "attach", "--pid", "x"]).is_err());
        assert!(
            Cli::try_parse_from(["gapscope", "run", "--freq", "100000", "--", "true"]).is_err()
        );
    }
}
