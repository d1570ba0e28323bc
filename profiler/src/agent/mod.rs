//! `gapscope agent`: a node daemon. It finds the GPU jobs on the node (or
//! follows the ones it is given), records each in back-to-back windows in
//! the cheap mode (no cpu-clock samples, no off-CPU stacks, no syscall
//! hooks), analyses every window as `report` would, adds it to per-job
//! counters, and serves them to Prometheus on `/metrics`. Each window stays
//! on disk as a normal session for `--keep` (the flight recorder: a slow
//! hour can be read after the fact with `gapscope report`), then goes,
//! unless `gapscope agent dump` or SIGUSR1 kept it ([`dump`]).
//!
//! Memory stays bounded: a window is analysed from its file, streamed, and
//! only the counters are kept. The price of windows is their seams: a
//! fraction of a second between two windows is not recorded
//! (`gapscope_recorded_seconds_total` says how much was).

mod discover;
mod http;
pub mod labels;
pub mod metrics;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::analyze::{analyze, AnalyzeOptions};
use crate::collect::bpf::TracerConfig;
use crate::collect::{self, procfs, RecordOptions, Target};
use crate::export::View;
use metrics::Metrics;

#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Follow these processes (and their descendants) only.
    pub pids: Vec<u32>,
    /// Follow the processes of these cgroups (v2 paths under
    /// /sys/fs/cgroup, or absolute).
    pub cgroups: Vec<PathBuf>,
    /// Serve /metrics here.
    pub listen: Option<std::net::SocketAddr>,
    pub window: Duration,
    /// How long recorded windows stay on disk.
    pub keep: Duration,
    pub dir: PathBuf,
    /// Bring the CUPTI shim into GPU processes without it (ptrace).
    pub inject: bool,
    /// Stop after this many rounds of windows (tests); None: until a signal.
    pub rounds: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{what}: {err}")]
    Io { what: String, err: std::io::Error },
    #[error(transparent)]
    Preflight(#[from] collect::preflight::PreflightError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |err| AgentError::Io { what, err }
}

/// A job as the agent follows it.
#[derive(Clone, Debug)]
struct Job {
    pid: u32,
    key: String,
    labels: labels::Labels,
}

/// Runs until SIGINT/SIGTERM (or `rounds`), serving metrics as it goes.
pub fn run(opts: &AgentOptions) -> Result<(), AgentError> {
    collect::preflight::check()?;
    crate::output::create_dir(&opts.dir).map_err(io(format!("creating {}", opts.dir.display())))?;
    let metrics = Arc::new(Mutex::new(Metrics::default()));
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(io("installing signal handlers"))?;
    }
    if let Some(addr) = opts.listen {
        let listener =
            std::net::TcpListener::bind(addr).map_err(io(format!("listening on {addr}")))?;
        eprintln!(
            "gapscope agent: metrics on http://{}/metrics",
            listener.local_addr().map_or(addr, |a| a)
        );
        http::serve(listener, metrics.clone());
    }
    // SIGUSR1: keep the flight recorder's windows (between two rounds).
    let dump_now = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump_now.clone())
        .map_err(io("installing signal handlers"))?;
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) && opts.rounds.is_none_or(|n| round < n) {
        if dump_now.swap(false, Ordering::SeqCst) {
            match dump(&opts.dir, None) {
                Ok((out, n)) => {
                    eprintln!("gapscope agent: kept {n} window(s) in {}", out.display())
                }
                Err(e) => eprintln!("gapscope agent: {e}"),
            }
        }
        let jobs = jobs(opts);
        if jobs.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        // One window of every job at once: each its own recording.
        std::thread::scope(|s| {
            for job in &jobs {
                let metrics = metrics.clone();
                s.spawn(move || window(opts, job, &metrics));
            }
        });
        if let Ok(mut m) = metrics.lock() {
            m.forget_ended();
        }
        prune(&opts.dir, opts.keep);
        round += 1;
    }
    Ok(())
}

/// The jobs to record this round.
fn jobs(opts: &AgentOptions) -> Vec<Job> {
    let mut pids: BTreeSet<u32> = opts
        .pids
        .iter()
        .copied()
        .filter(|&p| procfs::exists(p))
        .collect();
    for cg in &opts.cgroups {
        let path = if cg.is_absolute() {
            cg.clone()
        } else {
            Path::new("/sys/fs/cgroup").join(cg)
        };
        if let Ok(text) = std::fs::read_to_string(path.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    if opts.pids.is_empty() && opts.cgroups.is_empty() {
        pids.extend(discover::gpu_jobs());
    }
    pids.into_iter()
        .map(|pid| {
            let labels = labels::of(pid);
            // One folder per process: the workload's name, and its pid
            // where the name does not end with it already (ranks of a job).
            let name = &labels["workload"];
            let key = if name.ends_with(&format!("-{pid}")) {
                name.clone()
            } else {
                format!("{name}-{pid}")
            };
            Job { pid, key, labels }
        })
        .collect()
}

/// Records one window of `job`, adds it to the counters, keeps its session.
fn window(opts: &AgentOptions, job: &Job, metrics: &Mutex<Metrics>) {
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let dir = opts.dir.join(file_name(&job.key)).join(stamp.to_string());
    let rec = RecordOptions {
        out_dir: Some(dir.clone()),
        tracer: TracerConfig {
            sample_hz: 0,
            offcpu_stacks: false,
            syscall_hooks: false,
            ..TracerConfig::default()
        },
        duration: Some(opts.window),
        status_line: false,
        env: Vec::new(),
        gpu: true,
        nvml_hz: 1,
        libcuda: None,
        any_user: true,
        inject: opts.inject,
    };
    let done = collect::record(Target::Pid(job.pid), &rec)
        .map_err(|e| e.to_string())
        .and_then(|r| {
            let a = analyze(r.session.clone(), &AnalyzeOptions::default())
                .map_err(|e| e.to_string())?;
            Ok((View::new(&a).report, r.drops))
        });
    let mut m = metrics.lock().unwrap_or_else(|e| e.into_inner());
    match done {
        Ok((report, drops)) => m.add_window(&job.key, &job.labels, &report, drops),
        Err(e) => {
            m.failed_windows += 1;
            // A job that ended between the discovery and its window is no
            // failure worth a line.
            if procfs::exists(job.pid) {
                eprintln!("gapscope agent: {}: {e}", job.key);
            }
        }
    }
}

/// A job key as a directory name.
fn file_name(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Where kept windows go, inside the agent's folder (never pruned).
const DUMPS: &str = "dumps";

/// The flight recorder written out: every window now in `dir`, hard-linked
/// (so nothing is copied and pruning leaves them) into `out`, by default
/// `dir/dumps/<UTC time>/`, as `<workload>/<window>/` run directories that
/// `gapscope report` reads. Returns where, and how many windows.
pub fn dump(dir: &Path, out: Option<&Path>) -> Result<(PathBuf, usize), AgentError> {
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| {
        dir.join(DUMPS)
            .join(crate::clock::utc(crate::clock::realtime_ns()).replace([' ', ':'], "-"))
    });
    let mut kept = 0;
    let jobs = std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    for job in jobs.flatten() {
        if job.file_name() == DUMPS || !job.path().is_dir() {
            continue;
        }
        for w in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let to = out.join(job.file_name()).join(w.file_name());
            crate::output::create_dir(&to).map_err(io(format!("creating {}", to.display())))?;
            for f in std::fs::read_dir(w.path()).into_iter().flatten().flatten() {
                let target = to.join(f.file_name());
                if std::fs::hard_link(f.path(), &target).is_err() {
                    std::fs::copy(f.path(), &target)
                        .map_err(io(format!("keeping {}", f.path().display())))?;
                }
            }
            kept += 1;
        }
    }
    Ok((out, kept))
}

/// Removes windows older than `keep` (and jobs' folders left empty).
fn prune(dir: &Path, keep: Duration) {
    let Ok(jobs) = std::fs::read_dir(dir) else {
        return;
    };
    let jobs = jobs.flatten().filter(|e| e.file_name() != DUMPS);
    for job in jobs.filter(|e| e.path().is_dir()) {
        let Ok(windows) = std::fs::read_dir(job.path()) else {
            continue;
        };
        let mut left = 0;
        for w in windows.flatten() {
            let old = w
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > keep);
            if old {
                let _ = std::fs::remove_dir_all(w.path());
            } else {
                left += 1;
            }
        }
        if left == 0 {
            let _ = std::fs::remove_dir(job.path());
        }
    }
}
