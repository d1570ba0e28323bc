//! Recording: start or attach to the target tree, stream kernel records into
//! the session until the target exits, the duration passes or the user
//! interrupts, then symbolize what is left and close the session (stacks of
//! processes that exited are symbolized along the way, see `sink`).

pub mod bpf;
mod elf;
pub mod gpu;
pub mod inject;
pub mod launch;
pub mod nvml;
pub mod pidns;
pub mod preflight;
pub mod procfs;
pub mod python;
mod signals;
mod sink;
mod status;
pub mod symbolize;
pub mod windows;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::clock;
use crate::output::OutDir;
use crate::session::{
    Drops, Footer, Mode, Record, SessionError, SessionHeader, SessionWriter, StopReason, FILE_NAME,
};
use bpf::{BpfError, Tracer, TracerConfig};
use launch::LaunchError;
use preflight::PreflightError;
use signals::{Signal, SignalSource};
use sink::Sink;

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

/// The ring buffer's fd, borrowed for readiness only.
struct Readable(RawFd);
impl AsRawFd for Readable {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Whether the process a pidfd holds is still alive (signal 0 through it).
fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 through our own pidfd only checks.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned by us.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn header(mode: Mode, pid: u32, command: Vec<String>, sample_hz: u64) -> SessionHeader {
    let uname = nix_uname();
    let (start_ns, start_unix_ns) = clock::pair();
    SessionHeader {
        gapscope_version: env!("CARGO_PKG_VERSION").to_string(),
        mode,
        target_pid: pid,
        command,
        hostname: uname.0,
        kernel: uname.1,
        nr_cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        start_ns,
        start_unix_ns,
        sample_hz,
    }
}

fn nix_uname() -> (String, String) {
    // SAFETY: uname fills a zeroed struct.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.nodename), field(&u.release))
}

/// Records `target` into `opts.out_dir/session.gsz`.
pub fn record(target: Target, opts: &RecordOptions) -> Result<Recording, RecordError> {
    preflight::check()?;
    // Under sudo, gapscope watches only the invoking user's processes
    // (attach) unless told otherwise: that user, then.
    let you = crate::output::invoking_uid();
    let guard = (you != 0 && !opts.any_user).then_some(you);
    // Refuse a bad target before anything is created. A running one is
    // pinned first: its owner is checked of the process the pidfd holds,
    // never of another that took its number meanwhile.
    let mut pinned = None;
    match &target {
        Target::Command(argv) => {
            launch::resolve(argv.first().ok_or(LaunchError::Empty)?)?;
        }
        Target::Pid(pid) => {
            let pidfd = pidfd_open(*pid).map_err(|_| RecordError::NoSuchProcess(*pid))?;
            if let Some(you) = guard {
                match procfs::owner_uid(*pid) {
                    Some(owner) if owner != you => {
                        return Err(RecordError::NotYours {
                            pid: *pid,
                            owner,
                            you,
                        })
                    }
                    None => return Err(RecordError::NoSuchProcess(*pid)),
                    _ => {}
                }
            }
            if !alive(&pidfd) {
                return Err(RecordError::NoSuchProcess(*pid));
            }
            pinned = Some(pidfd);
        }
    }
    // Started first: it reads the kernel's symbol table while the programs
    // load, not beside the job.
    let mut symbolizer = Some(symbolize::Worker::start());
    let mut tracer = Tracer::load(&opts.tracer)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting the event loop"))?;
    let signals = SignalSource::install().map_err(io_err("installing signal handlers"))?;

    let mut notes = Vec::new();
    if !opts.tracer.syscall_hooks {
        notes.push(
            "recorded with --syscalls blocking (the default): no per-syscall counts or times; \
             bytes as the kernel's I/O accounting counts them, not split by kind of descriptor; \
             of reads, the files and sizes of those that blocked; time on a CPU inside file and \
             socket calls is told from computing by where cpu-clock samples found each thread; \
             what each thread blocked in was read from its \
             registers as it blocked (--syscalls all records every call)"
                .to_string(),
        );
    }
    let mut gpu_listener = None;
    let mut env = opts.env.clone();
    if opts.gpu {
        if let Target::Command(_) = &target {
            match gpu_environment(&mut env) {
                Ok(listener) => gpu_listener = Some(listener),
                Err(note) => notes.push(note),
            }
        }
    }

    let (mut sink, pidfd, child) = match target {
        Target::Command(argv) => {
            let paused = launch::spawn_paused(&argv, &env)?;
            let pid = paused.pid();
            let started = open_session(opts, pid).and_then(|(writer, folder)| {
                tracer.track(pid)?;
                tracer.attach()?;
                let pidfd = pidfd_open(pid).map_err(io_err("watching the target"))?;
                Ok((writer, folder, pidfd))
            });
            let (writer, folder, pidfd) = match started {
                Ok(x) => x,
                Err(e) => {
                    paused.abort();
                    return Err(e);
                }
            };
            if opts.gpu {
                // Before the command runs: a uprobe set on the library's
                // file is in place in every mapping of it from the first.
                let libs = opts
                    .libcuda
                    .iter()
                    .map(|p| (p.clone(), p.display().to_string()))
                    .collect();
                watch_libcuda(&mut tracer, libs, &mut notes);
            }
            let mut sink = Sink::new(writer, pid);
            sink.symbolize_with(symbolizer.take());
            sink.python_frames = opts.python_frames;
            sink.cutting = folder.map(windows::Cutting::new);
            sink.push(Record::Header(header(
                Mode::Run,
                pid,
                argv.clone(),
                opts.tracer.sample_hz,
            )));
            // The child is blocked reading the release pipe until now.
            sink.push(Record::Thread(crate::session::ThreadSeed {
                pid,
                tid: pid,
                comm: procfs::process_info(pid)
                    .map(|p| p.comm)
                    .unwrap_or_default(),
                state: 'S',
                syscall: Some(0),
                fd_kind: crate::session::FdKind::Pipe,
            }));
            push_thread_io(&mut sink, pid, pid, true);
            sink.live.insert(pid);
            paused.release()?;
            (sink, pidfd, Some(pid))
        }
        Target::Pid(pid) => {
            let pidfd = pinned.take().expect("pinned above");
            let (writer, folder) = open_session(opts, pid)?;
            tracer.attach()?;
            // Still the process checked, now that the programs are loaded.
            if !alive(&pidfd) {
                return Err(RecordError::NoSuchProcess(pid));
            }
            let mut sink = Sink::new(writer, pid);
            sink.symbolize_with(symbolizer.take());
            sink.guard = guard;
            sink.python_frames = opts.python_frames;
            sink.cutting = folder.map(windows::Cutting::new);
            let command = procfs::process_info(pid)
                .map(|p| p.argv)
                .unwrap_or_default();
            let mode = if opts.windows.is_some() {
                Mode::Window
            } else {
                Mode::Attach
            };
            sink.push(Record::Header(header(
                mode,
                pid,
                command,
                opts.tracer.sample_hz,
            )));
            // Seed the filter, then look again: a process forked by an
            // untracked parent between the scan and the insert would be missed
            // by the kernel, which only follows tracked parents.
            for _ in 0..2 {
                for p in procfs::descendants(pid) {
                    if sink.live.insert(p) {
                        tracer.track(p)?;
                        let whole = sink.judge(p);
                        seed_process(&mut sink, p, whole);
                    }
                }
            }
            if opts.gpu && opts.inject {
                let limits = inject::Limits {
                    // The agent follows every user's jobs; it never enters
                    // one running with more rights than its user.
                    privileged: opts.any_user && opts.windows.is_none(),
                    cupti: opts
                        .cupti
                        .as_ref()
                        .map(|p| p.to_string_lossy().into_owned()),
                    ..inject::Limits::default()
                };
                inject_shims(&mut sink, &mut notes, &limits);
            }
            (sink, pidfd, None)
        }
    };

    if opts.gpu && child.is_none() {
        // A running tree: the libcuda its processes have mapped, and any
        // named.
        let mut libs = libcuda_in_use(&sink);
        libs.extend(
            opts.libcuda
                .iter()
                .map(|p| (p.clone(), p.display().to_string())),
        );
        watch_libcuda(&mut tracer, libs, &mut notes);
    }
    for note in notes {
        sink.push(Record::Note(note));
    }
    let gpu = opts.gpu.then_some(GpuSetup {
        listener: gpu_listener,
        nvml_hz: opts.nvml_hz,
    });
    runtime.block_on(event_loop(
        &mut tracer,
        sink,
        pidfd,
        child,
        signals,
        gpu,
        opts,
    ))
}

/// Sets the libcuda uprobes on each of `libs` (the file to attach to, and
/// its name for the user), saying what came of it in `notes`.
fn watch_libcuda(tracer: &mut Tracer, mut libs: Vec<(PathBuf, String)>, notes: &mut Vec<String>) {
    libs.sort();
    libs.dedup_by(|a, b| a.0 == b.0);
    for (lib, shown) in libs {
        match tracer.attach_libcuda(&lib) {
            Ok(0) => notes.push(format!(
                "{shown}: none of the watched CUDA driver functions found"
            )),
            Ok(n) => notes.push(format!(
                "watching {n} CUDA driver functions in {shown} with uprobes: processes without the shim get an approximate GPU timeline (API calls, no kernel times)"
            )),
            Err(e) => notes.push(format!("cannot watch {shown}: {e}")),
        }
    }
}

/// Largest libcuda read to find its functions (a real one is ~50–100 MiB).
const LIBCUDA_MAX: u64 = 1 << 30;

/// libcuda files mapped by the tree's processes (from the maps snapshots),
/// once per file: each is named by a mapping of it
/// (`/proc/PID/map_files/…`), the inode the process mapped, never by the
/// path its maps show (in its mount namespace another file than in ours,
/// or by now a FIFO or a file of any size).
fn libcuda_in_use(sink: &Sink) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (pid, r) in sink.mapped() {
        let named = std::path::Path::new(&r.path)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libcuda.so"));
        if !named {
            continue;
        }
        let Ok(m) = crate::safe_fs::open_mapping(pid, r.start, r.end).and_then(|f| f.metadata())
        else {
            continue;
        };
        if m.len() > LIBCUDA_MAX || !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        out.push((
            PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", r.start, r.end)),
            r.path.clone(),
        ));
    }
    out
}

/// This process's CPU time and peak RSS so far (children excluded: the
/// target is not counted).
pub fn own_cost() -> crate::session::CollectorCost {
    // SAFETY: getrusage fills a struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    crate::session::CollectorCost {
        cpu_ns: ns(ru.ru_utime) + ns(ru.ru_stime),
        peak_rss_bytes: ru.ru_maxrss as u64 * 1024,
    }
}

/// What the event loop needs to collect GPU activity.
struct GpuSetup {
    /// `run`: where the target's shims connect; `attach`: none (we connect).
    listener: Option<gpu::GpuListener>,
    nvml_hz: u64,
}

/// Adds the shim to a started command's environment; returns the socket it
/// will connect to, or a note saying why the GPU timeline is off.
fn gpu_environment(env: &mut Vec<(OsString, OsString)>) -> Result<gpu::GpuListener, String> {
    const INJECT: &str = "CUDA_INJECTION64_PATH";
    if let Some((_, v)) = env.iter().find(|(k, _)| k == INJECT) {
        return Err(format!(
            "{INJECT} is already set ({}): another CUDA tool is injected, so gapscope's GPU timeline is off",
            v.to_string_lossy()
        ));
    }
    let Some(shim) = gpu::shim_path() else {
        return Err(format!(
            "the GPU shim ({}) is not installed beside gapscope: no CUPTI timeline",
            gapscope_wire::LIBRARY_NAME
        ));
    };
    let listener = gpu::GpuListener::bind()
        .map_err(|e| format!("cannot open the GPU socket ({e}): no CUPTI timeline"))?;
    env.retain(|(k, _)| k != "GAPSCOPE_SOCKET");
    // NVTX ranges through NVTX's own injection, unless another tool already
    // takes them: NVTX has one injection per process.
    const NVTX: &str = "NVTX_INJECTION64_PATH";
    if !env.iter().any(|(k, _)| k == NVTX) {
        env.push((NVTX.into(), shim.clone().into_os_string()));
    }
    env.push((INJECT.into(), shim.into_os_string()));
    env.push(("GAPSCOPE_SOCKET".into(), listener.env_value.clone().into()));
    Ok(listener)
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

/// The session of a run: in `-o DIR`, or in a directory made fresh here
/// (never one that exists already: it could be planted).
/// The session's file in its directory; cut into windows, the first
/// window's, and the folder they go in (the directory).
fn open_session(
    opts: &RecordOptions,
    pid: u32,
) -> Result<(SessionWriter, Option<Arc<OutDir>>), RecordError> {
    let dir = Arc::new(match &opts.out_dir {
        Some(d) => OutDir::named(d).map_err(io_err(format!("creating {}", d.display())))?,
        None => {
            let name = default_out_name(pid);
            OutDir::fresh(std::path::Path::new("."), &name)
                .map_err(io_err(format!("creating {name}")))?
        }
    });
    Ok(match opts.windows {
        Some(_) => (windows::create(&dir)?, Some(dir)),
        None => (SessionWriter::create_in(dir, FILE_NAME)?, None),
    })
}

/// Brings the CUPTI shim into the tree's GPU processes that run without
/// one (and notes those an earlier attach brought it into); where it
/// cannot, says why (they are then watched with uprobes).
/// GPU activity of an injected process exists only from when its shim
/// records: the time before is marked unseen (by its stream), never idle.
fn inject_shims(sink: &mut Sink, notes: &mut Vec<String>, limits: &inject::Limits) {
    let mut pids: Vec<u32> = sink
        .live
        .iter()
        .copied()
        .filter(|&p| !sink.withheld.contains(&p) && inject::gpu_process(p))
        .collect();
    if pids.is_empty() {
        return;
    }
    let Some(shim) = gpu::shim_path() else {
        notes.push(format!(
            "the GPU shim ({}) is not installed beside gapscope: not injected",
            gapscope_wire::LIBRARY_NAME
        ));
        return;
    };
    pids.sort_unstable();
    for pid in pids {
        match inject::inject(pid, &shim, limits.clone()) {
            Ok(inject::Outcome::Injected(i)) => {
                sink.push(Record::ShimInjected(crate::session::ShimInjected {
                    pid,
                    tid: i.tid,
                    loaded_at: i.loaded_at,
                    longest_stop_ns: i.longest_stop.as_nanos() as u64,
                    took_ns: i.took.as_nanos() as u64,
                    earlier: false,
                }));
                notes.push(format!(
                    "process {pid}: the CUPTI shim was injected with ptrace in {} (thread {} \
                     held at most {}); it stays loaded and dormant after the recording",
                    crate::units::duration(i.took.as_nanos() as u64),
                    i.tid,
                    crate::units::duration(i.longest_stop.as_nanos() as u64),
                ));
            }
            Ok(inject::Outcome::AlreadyLoaded { injected_before }) => {
                if injected_before {
                    sink.push(Record::ShimInjected(crate::session::ShimInjected {
                        pid,
                        tid: 0,
                        loaded_at: 0,
                        longest_stop_ns: 0,
                        took_ns: 0,
                        earlier: true,
                    }));
                }
            }
            Err(why) => notes.push(format!(
                "process {pid}: the CUPTI shim was not injected ({why}); its GPU side comes \
                 from libcuda uprobes, without GPU times"
            )),
        }
    }
}

/// One reading of a thread's I/O counters, if /proc still has the thread.
fn push_thread_io(sink: &mut Sink, pid: u32, tid: u32, start: bool) {
    if let Some(io) = procfs::thread_io(pid, tid) {
        sink.push(Record::ThreadIo(crate::session::ThreadIo {
            pid,
            tid,
            ts: clock::monotonic_ns(),
            start,
            io,
        }));
    }
}

/// Writes what is known of a process that existed before recording; its
/// open files and memory maps only if `whole` (see `Sink::judge`).
fn seed_process(sink: &mut Sink, pid: u32, whole: bool) {
    if let Some(info) = procfs::process_info(pid) {
        sink.push(Record::Process(info));
    }
    if let Some(rank) = procfs::rank_of(&procfs::environ(pid)) {
        sink.push(Record::ProcessRank { pid, rank });
    }
    for tid in procfs::threads(pid) {
        if let Some(seed) = procfs::thread_seed(pid, tid) {
            sink.push(Record::Thread(seed));
        }
        push_thread_io(sink, pid, tid, true);
    }
    if !whole {
        return;
    }
    for fd in procfs::fd_paths(pid) {
        sink.push(Record::FdPath(fd));
    }
    sink.snapshot_maps(pid);
}

async fn event_loop(
    tracer: &mut Tracer,
    mut sink: Sink,
    pidfd: OwnedFd,
    child: Option<u32>,
    mut signals: SignalSource,
    gpu_setup: Option<GpuSetup>,
    opts: &RecordOptions,
) -> Result<Recording, RecordError> {
    let (gpu_tx, mut gpu_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut streams = gpu::GpuStreams::new(gpu_tx.clone());
    let tree = std::sync::Arc::new(std::sync::RwLock::new(sink.live.clone()));
    let mut sampler = None;
    if let Some(setup) = gpu_setup {
        match setup.listener {
            Some(listener) => {
                if let Err(e) = streams.accept(listener, sink.target_pid) {
                    sink.push(Record::Note(format!(
                        "GPU socket unusable ({e}): no CUPTI timeline"
                    )));
                }
            }
            None => {
                streams.attached_at(sink.window_start);
                streams.connect(sink.live.iter().copied())
            }
        }
        sampler = Some(nvml::Sampler::start(
            setup.nvml_hz,
            tree.clone(),
            gpu_tx.clone(),
        ));
    }
    drop(gpu_tx);
    // SAFETY: the ring buffer fd belongs to `tracer`, which outlives this
    // function; the pidfd is owned by the AsyncFd itself.
    let ring =
        unsafe { AsyncFd::register_with_interest(Readable(tracer.ring_fd()), Interest::READABLE) }
            .map_err(|e| io_err("polling the ring buffer")(e.into()))?;
    let exited = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
        .map_err(|e| io_err("watching the target")(e.into()))?;
    let started = Instant::now();
    let cpu_at_start = own_cost().cpu_ns;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    // The kernel wakes us only for large batches; this bounds the latency of
    // small ones and paces flushes, drop counters and the status line.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut status = status::StatusLine::new(opts.status_line);
    read_machine(tracer, &mut sink);
    install_python(tracer, &mut sink);
    // The header and seeds go to disk now: a crash from here on still leaves
    // a readable session.
    sink.writer.flush()?;
    let mut last_flush = Instant::now();
    let mut interrupts = 0;
    let mut target_left_running = false;
    // Windows: when the next cut is due, and the window cut last while it
    // still takes its late GPU records.
    let windows = opts.windows.as_ref();
    let mut next_cut = windows.map(|w| tokio::time::Instant::now() + w.every);
    let mut closing: Option<windows::Closing> = None;
    let mut window_cpu_from = cpu_at_start;

    let reason = loop {
        tokio::select! {
            guard = ring.readable() => {
                if let Ok(mut g) = guard {
                    g.clear_ready();
                }
                tracer.drain(|b| sink.handle(b));
            }
            _ = tick.tick() => {
                if windows.is_some_and(|w| w.stop.load(std::sync::atomic::Ordering::SeqCst)) {
                    break StopReason::Interrupted;
                }
                tracer.drain(|b| sink.handle(b));
                if last_flush.elapsed() >= Duration::from_secs(1) {
                    last_flush = Instant::now();
                    if let Ok(mut t) = tree.write() {
                        t.clone_from(&sink.live);
                    }
                    if child.is_none() && sampler.is_some() {
                        // Processes that started with the shim after we attached.
                        streams.connect(sink.live.iter().copied());
                    }
                    if let Ok(d) = tracer.drops() {
                        sink.drops_record(&d);
                    }
                    read_machine(tracer, &mut sink);
                    sink.maintain();
                    if let Err(e) = sink.writer.flush() {
                        sink.error.get_or_insert(e);
                    }
                }
                if status.enabled() {
                    let drops = tracer.drops().map(|d| d.iter().sum()).unwrap_or(0);
                    status.update(started.elapsed(), sink.events, drops, sink.live.len());
                }
            }
            _ = tokio::time::sleep(PYTHON_POLL), if sink.watching_python() => sink.poll_python(),
            Some(record) = gpu_rx.recv() => route(&mut sink, closing.as_mut(), record),
            _ = exited.readable() => break StopReason::TargetExited,
            _ = sleep_until(deadline) => break StopReason::Duration,
            _ = sleep_until(next_cut) => {
                let w = windows.expect("cuts only with windows");
                if let Some(c) = closing.take() {
                    c.close(&w.done);
                }
                match cut(tracer, &mut sink, window_cpu_from) {
                    Ok(c) => closing = Some(c),
                    Err(e) => {
                        let _ = w.done.send(Err(e));
                        break StopReason::Interrupted;
                    }
                }
                window_cpu_from = own_cost().cpu_ns;
                next_cut = Some(tokio::time::Instant::now() + w.every);
            }
            _ = sleep_until(closing.as_ref().map(|c| c.until.into())) => {
                if let (Some(c), Some(w)) = (closing.take(), windows) {
                    c.close(&w.done);
                }
            }
            sig = signals.recv() => {
                match (sig, child) {
                    // `run`: the child gets the signal; we finish when it exits.
                    (Some(s), Some(pid)) => {
                        if !s.from_terminal {
                            // SAFETY: signalling our own child.
                            unsafe { libc::kill(pid as i32, s.signo) };
                        }
                        if s.signo == libc::SIGINT {
                            interrupts += 1;
                            if interrupts >= 2 {
                                target_left_running = true;
                                break StopReason::Interrupted;
                            }
                            status.message("interrupt sent to the target; Ctrl-C again to stop recording now");
                        }
                    }
                    // `attach`: stop recording, leave the target alone.
                    (Some(Signal { .. }), None) => break StopReason::Interrupted,
                    (None, _) => {}
                }
            }
        }
        install_python(tracer, &mut sink);
        if sink.error.is_some() {
            break StopReason::Interrupted;
        }
    };
    status.clear();
    // Another signal from here on gives up on the symbols still being read.
    sink.give_up = Some(signals.arm());
    // The window ends now, not after the GPU streams have drained below;
    // a target that exited ended it when the kernel saw it leave, however
    // late a busy loop got to its pidfd (under load, tens of ms: a longer
    // job than the one recorded).
    let now_ns = clock::monotonic_ns();
    let end_ns = match reason {
        StopReason::TargetExited => {
            tracer.drain(|b| sink.handle(b));
            sink.target_exited_ns
                .filter(|&t| t >= sink.window_start && t <= now_ns)
                .unwrap_or(now_ns)
        }
        _ => now_ns,
    };
    read_machine(tracer, &mut sink);
    sink.cpu_while_recording = own_cost().cpu_ns.saturating_sub(window_cpu_from);

    // GPU processes flush at exit; give their streams a moment to arrive.
    streams.finish(Duration::from_secs(3)).await;
    if let Some(s) = sampler {
        s.stop();
    }
    while let Ok(record) = gpu_rx.try_recv() {
        route(&mut sink, closing.as_mut(), record);
    }
    if let (Some(c), Some(w)) = (closing.take(), windows) {
        c.close(&w.done);
    }

    let mut exit_code = None;
    if let Some(pid) = child {
        if reason == StopReason::TargetExited {
            let mut st = 0;
            // SAFETY: reaping our own exited child.
            if unsafe { libc::waitpid(pid as i32, &mut st, 0) } == pid as i32 {
                exit_code = Some(launch::exit_code_of(st));
            }
        }
    }
    finish(tracer, sink, end_ns, reason, exit_code, target_left_running)
}

/// How often a python just exec'd is looked at until its libpython is
/// mapped.
const PYTHON_POLL: Duration = Duration::from_millis(2);

/// Tells the kernel side where the frames of the CPython processes the sink
/// found since the last call are.
fn install_python(tracer: &mut Tracer, sink: &mut Sink) {
    for (pid, py) in sink.take_python() {
        if let Err(e) = tracer.set_python(pid, &py) {
            sink.push(Record::Note(format!(
                "process {pid}: its Python frames cannot be walked ({e})"
            )));
        }
    }
}

/// A GPU-side record to the window it belongs in: while the window cut last
/// still takes late records, by its time ([`windows::split_at`]).
fn route(sink: &mut Sink, closing: Option<&mut windows::Closing>, record: Record) {
    let Some(c) = closing else {
        return sink.push(record);
    };
    let (before, after) = windows::split_at(record, c.end_ns);
    if let Some(r) = before {
        c.push(&r);
    }
    if let Some(r) = after {
        sink.push(r);
    }
}

/// Cuts the recording: the window being written is closed to the kernel's
/// events (its stacks symbolized, its threads' I/O counters read, its cost
/// and drops written) and a new one opened in `dir`, beginning as a
/// session of its own would. Returns the old one, still open to late GPU
/// records.
fn cut(
    tracer: &mut Tracer,
    sink: &mut Sink,
    cpu_from: u64,
) -> Result<windows::Closing, RecordError> {
    // The next window starts where this one ends: none of the job's time
    // falls between two windows (the new one's seeds are read a fraction
    // of a millisecond later).
    let (end_ns, end_unix_ns) = clock::pair();
    read_machine(tracer, sink);
    let drops = seal(tracer, sink, own_cost().cpu_ns.saturating_sub(cpu_from));
    let live = sorted(&sink.live);
    // Stacks the kernel side has sent are in the old window only: it sends
    // them again when seen again.
    tracer.forget_stacks();
    let events = sink.events;
    let folder = &sink.cutting.as_ref().expect("cut only with windows").folder;
    let writer = windows::create(folder)?;
    let old = sink.next_window(writer);
    let mut header = sink
        .header
        .clone()
        .expect("a recording begins with its header");
    (header.start_ns, header.start_unix_ns) = (end_ns, end_unix_ns);
    header.mode = Mode::Window;
    sink.push(Record::Header(header));
    for &pid in &live {
        let whole = !sink.withheld.contains(&pid);
        seed_process(sink, pid, whole);
    }
    let alive: std::collections::HashSet<u32> = live.iter().copied().collect();
    let sticky = sink
        .cutting
        .as_mut()
        .map(|c| c.sticky.replay(|pid| alive.contains(&pid)));
    for r in sticky.into_iter().flatten() {
        sink.push(r);
    }
    read_machine(tracer, sink);
    sink.writer.flush()?;
    Ok(windows::Closing::new(
        old,
        end_ns,
        events,
        drops.cpu_events(),
    ))
}

/// What a session gets before its footer, the last window of a recording
/// or one cut from it: the kernel's records still in the ring, its drop
/// counters, the stacks still waiting symbolized, the living threads' I/O
/// counters (those that exited were read by the kernel as they left), and
/// gapscope's own cost, `cpu_ns` of CPU. Returns the drops.
fn seal(tracer: &mut Tracer, sink: &mut Sink, cpu_ns: u64) -> Drops {
    tracer.drain(|b| sink.handle(b));
    let drops = tracer
        .drops()
        .map(|d| sink.drops_record(&d))
        .unwrap_or_default();
    // The counters at the window's end, before the symbols (which take
    // long under load, while a process that outlives the recording reads
    // on: a test's target was counted a 4 MiB pass past the window).
    for pid in sorted(&sink.live) {
        for tid in procfs::threads(pid) {
            push_thread_io(sink, pid, tid, false);
        }
    }
    sink.finish_symbols();
    sink.push(Record::Cost(crate::session::CollectorCost {
        cpu_ns,
        peak_rss_bytes: own_cost().peak_rss_bytes,
    }));
    drops
}

fn sorted(pids: &std::collections::HashSet<u32>) -> Vec<u32> {
    let mut v: Vec<u32> = pids.iter().copied().collect();
    v.sort_unstable();
    v
}

/// The machine's idle CPU time now, and what unrecorded tasks have run:
/// how many CPUs the job could have had beyond what it used, and from whom
/// more threads of it would win some (the replay's bounds on more loader
/// workers).
fn read_machine(tracer: &Tracer, sink: &mut Sink) {
    let ts = clock::monotonic_ns();
    if let Some(idle_ns) = procfs::machine_idle_ns() {
        sink.push(Record::CpuIdle(crate::session::CpuIdle { ts, idle_ns }));
    }
    if let Ok((same_group_ns, elsewhere_ns)) = tracer.neighbours() {
        sink.push(Record::Neighbours(crate::session::Neighbours {
            ts,
            same_group_ns,
            elsewhere_ns,
        }));
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Drains what is left, detaches, symbolizes the stacks still waiting and
/// closes the session.
fn finish(
    tracer: &mut Tracer,
    mut sink: Sink,
    end_ns: u64,
    reason: StopReason,
    exit_code: Option<i32>,
    target_left_running: bool,
) -> Result<Recording, RecordError> {
    let cpu_ns = sink.cpu_while_recording;
    let drops = seal(tracer, &mut sink, cpu_ns);
    let exit_code = exit_code.or(sink.target_exit);
    sink.push(Record::End(Footer {
        end_ns,
        reason,
        exit_code,
        events: sink.events,
    }));
    if let Some(e) = sink.error.take() {
        return Err(e.into());
    }
    let session = sink.writer.path().to_path_buf();
    let dir = sink.writer.dir().clone();
    let events = sink.events;
    sink.writer.finish()?;
    Ok(Recording {
        session,
        dir,
        reason,
        exit_code,
        events,
        drops: drops.cpu_events(),
        target_left_running,
        windows: sink.cutting.map(|c| c.folder),
    })
}
