//! `gapscope agent`: a node daemon. It finds the GPU jobs on the node (or
//! follows the ones it is given) and records each for as long as it runs —
//! one recording per job in the cheap mode (no cpu-clock samples, no
//! off-CPU stacks, no syscall hooks), its BPF programs, GPU streams and NVML
//! sampler loaded once — cut into back-to-back windows
//! (`collect::windows`). Every window is analysed as `report` would, added
//! to per-job counters, and served to Prometheus on `/metrics`. Each window
//! stays on disk as a normal session for `--keep` (the flight recorder: a
//! slow hour can be read after the fact with `gapscope report`), then goes,
//! unless `gapscope agent dump` or SIGUSR1 kept it ([`dump`]).
//!
//! Memory stays bounded: a window is analysed from its file, streamed, and
//! only the counters are kept.

mod discover;
mod http;
pub mod labels;
pub mod metrics;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::analyze::{analyze, AnalyzeOptions};
use crate::collect::bpf::TracerConfig;
use crate::collect::windows::Windows;
use crate::collect::{self, procfs, RecordError, RecordOptions, Recording, Target};
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
    /// Stop once this many windows have been analysed (tests); None: until
    /// a signal.
    pub stop_after: Option<u64>,
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

/// A job being recorded: its recording's thread and the windows it hands
/// over.
struct Followed {
    job: Job,
    windows: Receiver<Result<Recording, RecordError>>,
    thread: std::thread::JoinHandle<()>,
}

/// How often the node is looked at for new jobs.
const DISCOVER_EVERY: Duration = Duration::from_secs(1);

/// Runs until SIGINT/SIGTERM (or `stop_after`), serving metrics as it goes.
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
    // SIGUSR1: keep the flight recorder's windows.
    let dump_now = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump_now.clone())
        .map_err(io("installing signal handlers"))?;
    // Set when the agent stops: every recording closes its window short.
    let stop_recording = Arc::new(AtomicBool::new(false));
    let mut followed: HashMap<u32, Followed> = HashMap::new();
    // Jobs whose recording could not start, and when: tried again a window
    // later, not every second.
    let mut refused: HashMap<u32, Instant> = HashMap::new();
    let mut looked: Option<Instant> = None;
    let mut pruned = Instant::now();
    let mut analysed = 0u64;
    while !stop.load(Ordering::SeqCst) && opts.stop_after.is_none_or(|n| analysed < n) {
        if dump_now.swap(false, Ordering::SeqCst) {
            match dump(&opts.dir, None, None) {
                Ok(d) => eprintln!("gapscope agent: {}", d.said()),
                Err(e) => eprintln!("gapscope agent: {e}"),
            }
        }
        if looked.is_none_or(|t| t.elapsed() >= DISCOVER_EVERY) {
            looked = Some(Instant::now());
            refused.retain(|_, at| at.elapsed() < opts.window);
            for job in jobs(opts) {
                if !followed.contains_key(&job.pid) && !refused.contains_key(&job.pid) {
                    followed.insert(job.pid, follow(opts, job, &stop_recording));
                }
            }
        }
        let mut ended = Vec::new();
        for (&pid, f) in &followed {
            // Finished before looking: its last window is in the channel.
            let finished = f.thread.is_finished();
            loop {
                match f.windows.try_recv() {
                    Ok(w) => {
                        if !take_window(&f.job, w, &metrics) {
                            refused.insert(pid, Instant::now());
                        }
                        analysed += 1;
                    }
                    Err(TryRecvError::Empty) if !finished => break,
                    Err(_) => {
                        ended.push(pid);
                        break;
                    }
                }
            }
        }
        for pid in ended {
            if let Some(f) = followed.remove(&pid) {
                let _ = f.thread.join();
            }
        }
        if pruned.elapsed() >= DISCOVER_EVERY {
            pruned = Instant::now();
            if let Ok(mut m) = metrics.lock() {
                m.forget_ended();
            }
            prune(&opts.dir, opts.keep);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every recording closes its window now; what they hand over still
    // counts.
    stop_recording.store(true, Ordering::SeqCst);
    for (_, f) in followed {
        let _ = f.thread.join();
        while let Ok(w) = f.windows.try_recv() {
            take_window(&f.job, w, &metrics);
        }
    }
    Ok(())
}

/// Starts recording `job` in windows, on a thread of its own, until it
/// exits or `stop` is set.
fn follow(opts: &AgentOptions, job: Job, stop: &Arc<AtomicBool>) -> Followed {
    let (done, windows) = std::sync::mpsc::channel();
    let rec = RecordOptions {
        out_dir: Some(opts.dir.join(file_name(&job.key))),
        tracer: TracerConfig {
            sample_hz: 0,
            offcpu_stacks: false,
            syscall_hooks: false,
            ..TracerConfig::default()
        },
        duration: None,
        status_line: false,
        env: Vec::new(),
        gpu: true,
        nvml_hz: 1,
        libcuda: None,
        any_user: true,
        inject: opts.inject,
        windows: Some(Windows {
            every: opts.window,
            done: done.clone(),
            stop: stop.clone(),
        }),
        python_frames: false,
    };
    let pid = job.pid;
    let thread = std::thread::Builder::new()
        .name(format!("gapscope-{pid}"))
        .spawn(move || {
            // The last window (or why the recording could not start).
            let _ = done.send(collect::record(Target::Pid(pid), &rec));
        })
        .expect("starting a thread");
    Followed {
        job,
        windows,
        thread,
    }
}

/// Analyses one window of `job` and adds it to the counters; false when
/// there was none (the recording failed).
fn take_window(
    job: &Job,
    window: Result<Recording, RecordError>,
    metrics: &Mutex<Metrics>,
) -> bool {
    let done = window.map_err(|e| e.to_string()).and_then(|r| {
        let a =
            analyze(r.session.clone(), &AnalyzeOptions::default()).map_err(|e| e.to_string())?;
        Ok((View::new(&a).report, r.drops))
    });
    let mut m = metrics.lock().unwrap_or_else(|e| e.into_inner());
    match done {
        Ok((report, drops)) => {
            m.add_window(&job.key, &job.labels, &report, drops);
            true
        }
        Err(e) => {
            m.failed_windows += 1;
            // A job that ended as its recording began is no failure worth a
            // line.
            if procfs::exists(job.pid) {
                eprintln!("gapscope agent: {}: {e}", job.key);
            }
            false
        }
    }
}

/// The jobs on the node now (or the ones named).
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

/// What a dump wrote.
#[derive(Debug)]
pub struct Dumped {
    pub out: PathBuf,
    /// Sessions written (one per job, one more for each other recording of
    /// the same job still on disk) and the windows in them.
    pub sessions: usize,
    pub windows: usize,
}

/// The flight recorder written out: each job's windows now in `dir` (those
/// of workloads starting with `workload`, when given) as one session — a
/// run directory `gapscope report` reads, `out/<job>/<first window>/`, by
/// default under `dir/dumps/<UTC time>/`. The window being recorded is in
/// it up to its last second; windows of another recording of the same job
/// (an agent restarted) make a session of their own.
pub fn dump(dir: &Path, out: Option<&Path>, workload: Option<&str>) -> Result<Dumped, AgentError> {
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| {
        dir.join(DUMPS)
            .join(crate::clock::utc(crate::clock::realtime_ns()).replace([' ', ':'], "-"))
    });
    let mut dumped = Dumped {
        out: out.clone(),
        sessions: 0,
        windows: 0,
    };
    let jobs = std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    for job in jobs.flatten() {
        let name = job.file_name().to_string_lossy().into_owned();
        if name == DUMPS || !job.path().is_dir() || workload.is_some_and(|w| !name.starts_with(w)) {
            continue;
        }
        let windows = crate::session::windows_in(&job.path());
        let mut rest = &windows[..];
        while let Some(first) = rest.first() {
            let to = out.join(&name).join(first.file_name().unwrap_or_default());
            crate::output::create_dir(&to).map_err(io(format!("creating {}", to.display())))?;
            let merged = match crate::session::merge(rest, &to.join(crate::session::FILE_NAME)) {
                Ok(m) => m,
                // A window just opened: nothing of it to write yet.
                Err(crate::session::SessionError::NoHeader { .. }) => {
                    let _ = std::fs::remove_dir_all(&to);
                    break;
                }
                Err(e) => {
                    return Err(AgentError::Io {
                        what: format!("writing out {name}"),
                        err: std::io::Error::other(e),
                    })
                }
            };
            dumped.sessions += 1;
            dumped.windows += merged.windows;
            rest = &rest[merged.windows.max(1)..];
        }
    }
    Ok(dumped)
}

impl Dumped {
    /// What was written, in a line.
    pub fn said(&self) -> String {
        format!(
            "wrote {} window(s) as {} session(s) in {}",
            self.windows,
            self.sessions,
            self.out.display()
        )
    }
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
