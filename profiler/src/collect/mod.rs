//! Recording: start or attach to the target tree, stream kernel records into
//! the session until the target exits, the duration passes or the user
//! interrupts, then symbolize what is left and close the session (stacks of
//! processes that exited are symbolized along the way, see `sink`).
//!
//! This file is the API (`record` and its options and outcome). Below it:
//! `start` checks and starts or attaches to the target and seeds the
//! session, `event_loop` runs the recording (the kernel side behind its
//! `Probes` trait), `sink` turns the kernel's records into the session,
//! `windows` cuts it, and `sys` holds the few system calls made directly.

pub mod bpf;
mod elf;
mod event_loop;
pub mod gpu;
pub mod inject;
pub mod launch;
pub mod node;
pub mod nvml;
pub mod pidns;
pub mod preflight;
pub mod procfs;
pub mod python;
mod seed;
mod signals;
mod sink;
mod start;
mod status;
pub mod symbolize;
mod sys;
pub mod windows;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock;
use crate::output::OutDir;
use crate::session::{SessionError, StopReason};
use bpf::{BpfError, Tracer, TracerConfig};
use launch::LaunchError;
use preflight::PreflightError;
use signals::SignalSource;

/// What to record.
#[derive(Clone, Debug)]
pub enum Target {
    /// Start this command and record it and all its descendants.
    Command(Vec<String>),
    /// Record this running process and all its descendants.
    Pid(u32),
}

#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// Where to write; None for `gapscope-<pid>-<time>/` in the current directory.
    pub out_dir: Option<PathBuf>,
    pub tracer: TracerConfig,
    /// Stop after this long (attach).
    pub duration: Option<Duration>,
    /// Draw the live status line on stderr.
    pub status_line: bool,
    /// Environment for a started command.
    pub env: Vec<(OsString, OsString)>,
    /// Record GPU activity (inject the CUPTI shim, sample NVML).
    pub gpu: bool,
    /// NVML sampling rate, Hz.
    pub nvml_hz: u64,
    /// A libcuda to watch with uprobes (the fallback for processes without
    /// the shim); `attach` also finds the tree's own libcuda by itself.
    pub libcuda: Option<PathBuf>,
    /// The libcupti to use (`--cupti`): in `run`'s environment, and passed
    /// to shims `attach` injects (which read no environment).
    pub cupti: Option<PathBuf>,
    /// `attach` to a process of another user, or one running with more
    /// rights than its user (setuid): injected too.
    pub any_user: bool,
    /// `attach`: bring the CUPTI shim into GPU processes without it.
    pub inject: bool,
    /// Cut the recording into windows (the agent, `run --window`);
    /// `out_dir` is then the folder of windows.
    pub windows: Option<windows::Windows>,
    /// Walk the frames of the CPython processes of the tree (the kernel
    /// side's Python unwinder, see `python`).
    pub python_frames: bool,
}

/// How a recording ended.
#[derive(Clone, Debug)]
pub struct Recording {
    pub session: PathBuf,
    /// The session's directory, held open: the reports go beside it.
    pub dir: Arc<OutDir>,
    pub reason: StopReason,
    /// The target's exit code, shell style, when it exited during recording.
    pub exit_code: Option<i32>,
    pub events: u64,
    pub drops: u64,
    /// Target still running when recording stopped (second Ctrl-C).
    pub target_left_running: bool,
    /// Cut into windows: their folder (`session` is the last window's, and
    /// the reports of the whole recording go here, not in `dir`).
    pub windows: Option<Arc<OutDir>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error("writing the session: {0}")]
    Session(#[from] SessionError),
    #[error("no process with pid {0}; hint: check the pid with `ps -p {0}`")]
    NoSuchProcess(u32),
    #[error(
        "process {pid} belongs to uid {owner}, not to you (uid {you}); \
         hint: --any-user records it anyway, if you are allowed to watch it"
    )]
    NotYours { pid: u32, owner: u32, you: u32 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl RecordError {
    /// What the user can do about it, printed after the error and its causes.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            RecordError::Bpf(_) => Some(
                "gapscope needs Linux 5.18+ with BTF and root (or CAP_BPF and CAP_PERFMON); \
                 a verifier error on a supported kernel is a bug worth reporting",
            ),
            _ => None,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RecordError {
    let what = what.into();
    move |source| RecordError::Io { what, source }
}

/// Records `target` into `opts.out_dir/session.gsz` (or, cut into
/// windows, a session per window in it).
pub fn record(target: Target, opts: &RecordOptions) -> Result<Recording, RecordError> {
    preflight::check()?;
    let checked = start::check(target, opts)?;
    // Started first: it reads the kernel's symbol table while the programs
    // load, not beside the job.
    let symbolizer = symbolize::Worker::start();
    let mut tracer = Tracer::load(&opts.tracer)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting the event loop"))?;
    let signals = SignalSource::install().map_err(io_err("installing signal handlers"))?;
    let started = start::start(&mut tracer, checked, opts, symbolizer)?;
    runtime.block_on(event_loop::run(&mut tracer, started, signals, opts))
}

/// This process's CPU time and peak RSS so far (children excluded: the
/// target is not counted).
pub fn own_cost() -> crate::session::CollectorCost {
    let (cpu_ns, peak_rss_bytes) = sys::rusage_self();
    crate::session::CollectorCost {
        cpu_ns,
        peak_rss_bytes,
    }
}

/// The name of a run's directory when `-o` names none:
/// `gapscope-<pid>-<time>`.
pub fn default_out_name(pid: u32) -> String {
    let stamp = clock::utc(clock::realtime_ns())
        .trim_end_matches(" UTC")
        .replace(['-', ':'], "")
        .replace(' ', "-");
    format!("gapscope-{pid}-{stamp}")
}
