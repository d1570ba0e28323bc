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
use crate::collect::node::Node;
use crate::collect::windows::Windows;
use crate::collect::{self, procfs, RecordError, RecordOptions, Recording};
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
    #[error("starting the node's recording: {0}")]
    Recording(#[from] RecordError),
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

/// A job being recorded: the windows its recording hands over (the
/// channel ends with its last).
struct Followed {
    job: Job,
    windows: Receiver<Result<Recording, RecordError>>,
}

/// What the agent records: no samples or off-CPU stacks, no syscall hooks
/// (its cost on a busy node stays that of the scheduler tracepoints).
fn tracer_config() -> TracerConfig {
    TracerConfig {
        sample_hz: 0,
        offcpu_stacks: false,
        syscall_hooks: false,
        ..TracerConfig::default()
    }
}

/// How often the node is looked at for new jobs.
const DISCOVER_EVERY: Duration = Duration::from_secs(1);

/// Runs until SIGINT/SIGTERM (or `stop_after`), serving metrics as it goes.
pub fn run(opts: &AgentOptions) -> Result<(), AgentError> {
    collect::preflight::check()?;
    let own = own_dir(&opts.dir)?;
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
        http::serve(listener, metrics.clone()).map_err(io(format!("serving {addr}")))?;
    }
    // SIGUSR1: keep the flight recorder's windows.
    let dump_now = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump_now.clone())
        .map_err(io("installing signal handlers"))?;
    // Set when the agent stops: every recording closes its window short.
    let stop_recording = Arc::new(AtomicBool::new(false));
    // One set of programs for every job on the node.
    let node = Node::start(&tracer_config())?;
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
            for pid in job_pids(opts) {
                if !followed.contains_key(&pid) && !refused.contains_key(&pid) {
                    followed.insert(pid, follow(&node, opts, job_of(pid), &stop_recording));
                }
            }
        }
        let mut ended = Vec::new();
        for (&pid, f) in &followed {
            loop {
                match f.windows.try_recv() {
                    Ok(w) => {
                        if !take_window(&f.job, w, &metrics) {
                            refused.insert(pid, Instant::now());
                        }
                        analysed += 1;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        ended.push(pid);
                        break;
                    }
                }
            }
        }
        for pid in ended {
            followed.remove(&pid);
        }
        if pruned.elapsed() >= DISCOVER_EVERY {
            pruned = Instant::now();
            if let Ok(mut m) = metrics.lock() {
                m.forget_ended();
            }
            prune(&own, opts.keep);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every recording closes its window now; what they hand over still
    // counts.
    stop_recording.store(true, Ordering::SeqCst);
    node.stop();
    for (_, f) in followed {
        while let Ok(w) = f.windows.try_recv() {
            take_window(&f.job, w, &metrics);
        }
    }
    Ok(())
}

/// Starts recording `job` in windows, with the node's other jobs, until
/// it exits or `stop` is set.
fn follow(node: &Node, opts: &AgentOptions, job: Job, stop: &Arc<AtomicBool>) -> Followed {
    let (done, windows) = std::sync::mpsc::channel();
    let rec = RecordOptions {
        out_dir: Some(opts.dir.join(file_name(&job.key))),
        tracer: tracer_config(),
        duration: None,
        status_line: false,
        env: Vec::new(),
        gpu: true,
        nvml_hz: 1,
        libcuda: None,
        cupti: None,
        any_user: true,
        inject: opts.inject,
        windows: Some(Windows {
            every: opts.window,
            done: done.clone(),
            stop: stop.clone(),
        }),
        python_frames: false,
    };
    if let Err(e) = node.follow(job.pid, rec) {
        // Why the recording could not start, and the channel's end.
        let _ = done.send(Err(e));
    }
    Followed { job, windows }
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

/// The processes of the jobs on the node now (or the ones named).
fn job_pids(opts: &AgentOptions) -> BTreeSet<u32> {
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
    pids
}

/// A job found: its labels, read once, when it is first followed.
fn job_of(pid: u32) -> Job {
    let labels = labels::of(pid);
    // One folder per process: the workload's name, and its pid where the
    // name does not end with it already (ranks of a job).
    let name = &labels["workload"];
    let key = if name.ends_with(&format!("-{pid}")) {
        name.clone()
    } else {
        format!("{name}-{pid}")
    };
    Job { pid, key, labels }
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
        let job_out = out.join(&name);
        for recording in crate::session::recordings(&windows) {
            let first = &recording[0];
            let first_name = first
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let to = job_out.join(&first_name);
            let parent = crate::output::OutDir::named(&job_out)
                .map_err(io(format!("creating {}", job_out.display())))?;
            let to_dir = parent
                .subdir(&first_name)
                .map_err(io(format!("creating {}", to.display())))?;
            let merged = match crate::session::merge(
                &recording,
                &to_dir.held_path(crate::session::FILE_NAME),
            ) {
                Ok(m) => m,
                // A window just opened: nothing of it to write yet.
                Err(crate::session::SessionError::NoHeader { .. }) => {
                    let _ = parent.remove_tree(&first_name);
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

/// Marks a folder as the agent's: only a folder holding it (or a new or
/// empty one, which gets it) is ever written in or pruned.
const MARKER: &str = ".gapscope-agent";

/// Takes `--dir` as the agent's own: made if missing; an existing one must
/// be a directory (not a link), root's, and empty or marked as the agent's
/// — anything else could hold files that pruning would delete. It is made
/// private (0700), and marked.
fn own_dir(path: &Path) -> Result<crate::output::OutDir, AgentError> {
    use std::os::unix::fs::MetadataExt;
    let what = || format!("using {} as the agent's folder", path.display());
    let refuse = |why: &str| AgentError::Io {
        what: what(),
        err: std::io::Error::other(why.to_string()),
    };
    let dir = crate::output::OutDir::named(path).map_err(io(what()))?;
    let entries = dir.entries().map_err(io(what()))?;
    let meta = std::fs::File::from(dir.as_fd().try_clone_to_owned().map_err(io(what()))?)
        .metadata()
        .map_err(io(what()))?;
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err(refuse(&format!(
            "it belongs to uid {}; the agent keeps its windows in a folder of its own",
            meta.uid()
        )));
    }
    if !entries.is_empty() && !entries.iter().any(|e| e == MARKER) {
        return Err(refuse(
            "it is not empty and was not made by the agent (no .gapscope-agent in it); \
             name a new or empty folder",
        ));
    }
    // SAFETY: fchmod of our own fd.
    if unsafe { libc::fchmod(std::os::fd::AsRawFd::as_raw_fd(&dir.as_fd()), 0o700) } != 0 {
        return Err(io(what())(std::io::Error::last_os_error()));
    }
    if !entries.iter().any(|e| e == MARKER) {
        dir.write_file(MARKER, |w| {
            std::io::Write::write_all(w, b"gapscope agent: windows and dumps\n")
        })
        .map_err(io(what()))?;
    }
    Ok(dir)
}

/// Whether `name` is a window's folder as `collect::windows` names them
/// (`<unix ms>` or `<unix ms>-<n>`).
fn window_name(name: &str) -> bool {
    let mut parts = name.splitn(2, '-');
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    parts.next().is_some_and(digits) && parts.next().is_none_or(digits)
}

/// Removes windows older than `keep` (and jobs' folders left empty): only
/// folders named as the agent names them, from the folder's fd down, never
/// through a link.
fn prune(dir: &crate::output::OutDir, keep: Duration) {
    let Ok(jobs) = dir.entries() else {
        return;
    };
    for job in jobs {
        if job == DUMPS || job == MARKER || file_name(&job) != job {
            continue;
        }
        let Ok(job_dir) = dir.subdir_existing(&job) else {
            continue;
        };
        let Ok(windows) = job_dir.entries() else {
            continue;
        };
        let mut left = 0;
        for w in windows {
            let old = window_name(&w) && job_dir.age_of(&w).is_some_and(|age| age > keep);
            if old && job_dir.remove_tree(&w).is_ok() {
                continue;
            }
            left += 1;
        }
        if left == 0 {
            let _ = dir.remove_empty(&job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Makes the entry at `path` itself (a link too, not what it names)
    /// an hour old.
    fn old(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let an_hour_ago = libc::timespec {
            tv_sec: (crate::clock::realtime_ns() / 1_000_000_000) as i64 - 3600,
            tv_nsec: 0,
        };
        let times = [an_hour_ago, an_hour_ago];
        // SAFETY: utimensat with a valid C string and two timespecs.
        let r = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(r, 0);
    }

    /// `--dir` of someone's files is refused, whatever their age; a new or
    /// empty folder is taken (and marked, 0700), and a marked one again.
    #[test]
    fn the_agent_takes_only_a_folder_of_its_own() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir_all(shared.join("projectX/results")).unwrap();
        std::fs::write(shared.join("projectX/results/model.bin"), "weights").unwrap();
        let e = own_dir(&shared).unwrap_err().to_string();
        assert!(
            e.contains("not empty") && e.contains(".gapscope-agent"),
            "{e}"
        );
        assert!(shared.join("projectX/results/model.bin").exists());

        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
        own_dir(&empty).unwrap();
        assert!(empty.join(MARKER).exists());
        let mode = std::fs::metadata(&empty).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::create_dir(empty.join("simtrain-42")).unwrap();
        own_dir(&empty).unwrap();
        own_dir(&t.path().join("new/agent")).unwrap();
        assert!(t.path().join("new/agent").join(MARKER).exists());
    }

    /// Pruning removes old window folders of the agent's naming and nothing
    /// else: not a folder of another name, not through a link.
    #[test]
    fn pruning_removes_only_old_windows() {
        let t = tempfile::tempdir().unwrap();
        let keep = t.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("precious"), "x").unwrap();
        let root = t.path().join("agent");
        let dir = own_dir(&root).unwrap();
        let job = root.join("simtrain-42");
        for w in ["1700000000000", "1700000000001-1", "1700000000002", "notes"] {
            std::fs::create_dir_all(job.join(w)).unwrap();
            std::fs::write(job.join(w).join("session.gsz"), "s").unwrap();
        }
        symlink(&keep, job.join("1700000000003")).unwrap();
        for w in ["1700000000000", "1700000000001-1", "notes", "1700000000003"] {
            old(&job.join(w));
        }
        prune(&dir, Duration::from_secs(600));
        let mut left: Vec<String> = std::fs::read_dir(&job)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // The link itself went (a window's name, old); what it pointed at
        // did not.
        assert_eq!(left, ["1700000000002", "notes"]);
        assert!(keep.join("precious").exists());
        // A job left with no windows is removed; one with anything else is not.
        let empty_job = root.join("other-7");
        std::fs::create_dir_all(empty_job.join("1700000000000")).unwrap();
        old(&empty_job.join("1700000000000"));
        prune(&dir, Duration::from_secs(600));
        assert!(!empty_job.exists());
        assert!(job.exists());
    }
}
