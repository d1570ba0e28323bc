//! Starting a recording: the target checked (a running one pinned by its
//! pidfd and, under sudo, owned by the invoking user), started paused or
//! attached to, its session opened and seeded with what its tree is now,
//! and its GPU sources set up (the shim in a started command's environment
//! or injected into an attached tree, libcuda uprobes). What comes out is
//! a [`Started`] recording for the event loop.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use super::bpf::Tracer;
use super::event_loop::{GpuSetup, Started};
use super::launch::{self, LaunchError};
use super::seed::{header, push_thread_io, seed_process};
use super::sink::Sink;
use super::{default_out_name, gpu, inject, io_err, procfs, symbolize, sys, windows};
use super::{RecordError, RecordOptions, Target};
use crate::output::OutDir;
use crate::session::{Mode, Record, SessionWriter, FILE_NAME};

/// A target that passed its checks: a running one pinned by its pidfd.
pub(super) struct Checked {
    target: Target,
    pinned: Option<OwnedFd>,
    /// Under sudo, the invoking user: only their processes are recorded
    /// whole.
    guard: Option<u32>,
}

/// Refuses a bad target before anything is created. A running one is
/// pinned first: its owner is checked of the process the pidfd holds,
/// never of another that took its number meanwhile.
pub(super) fn check(target: Target, opts: &RecordOptions) -> Result<Checked, RecordError> {
    // Under sudo, gapscope watches only the invoking user's processes
    // (attach) unless told otherwise: that user, then.
    let you = crate::output::invoking_uid();
    let guard = (you != 0 && !opts.any_user).then_some(you);
    let mut pinned = None;
    match &target {
        Target::Command(argv) => {
            launch::resolve(argv.first().ok_or(LaunchError::Empty)?)?;
        }
        Target::Pid(pid) => {
            let pidfd = sys::pidfd_open(*pid).map_err(|_| RecordError::NoSuchProcess(*pid))?;
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
            if !sys::alive(&pidfd) {
                return Err(RecordError::NoSuchProcess(*pid));
            }
            pinned = Some(pidfd);
        }
    }
    Ok(Checked {
        target,
        pinned,
        guard,
    })
}

/// Starts the command or attaches to the process `checked` names, with
/// `tracer`'s programs attached, the session opened and seeded.
pub(super) fn start(
    tracer: &mut Tracer,
    checked: Checked,
    opts: &RecordOptions,
    symbolizer: symbolize::Worker,
) -> Result<Started, RecordError> {
    begin(tracer, checked, opts, symbolizer, true)
}

/// Adds the running tree `checked` names to the recording of programs
/// attached already (a node's, which records several jobs).
pub(super) fn join(
    tracer: &mut Tracer,
    checked: Checked,
    opts: &RecordOptions,
    symbolizer: symbolize::Worker,
) -> Result<Started, RecordError> {
    begin(tracer, checked, opts, symbolizer, false)
}

fn begin(
    tracer: &mut Tracer,
    checked: Checked,
    opts: &RecordOptions,
    symbolizer: symbolize::Worker,
    attach: bool,
) -> Result<Started, RecordError> {
    let Checked {
        target,
        mut pinned,
        guard,
    } = checked;
    let mut symbolizer = Some(symbolizer);
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
                let pidfd = sys::pidfd_open(pid).map_err(io_err("watching the target"))?;
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
                watch_libcuda(tracer, libs, &mut notes);
            }
            let mut sink = Sink::new(writer, pid);
            sink.symbolize_with(symbolizer.take());
            sink.python_frames(opts.python_frames);
            sink.cut_into(folder);
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
            sink.add_live(pid);
            paused.release()?;
            (sink, pidfd, Some(pid))
        }
        Target::Pid(pid) => {
            let pidfd = pinned.take().expect("pinned by check");
            let (writer, folder) = open_session(opts, pid)?;
            if attach {
                tracer.attach()?;
            }
            let sink = seed_tree(
                tracer,
                pid,
                &pidfd,
                (writer, folder),
                opts,
                guard,
                symbolizer.take(),
                &mut notes,
            )?;
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
        watch_libcuda(tracer, libs, &mut notes);
    }
    for note in notes {
        sink.push(Record::Note(note));
    }
    let gpu = opts.gpu.then_some(GpuSetup {
        listener: gpu_listener,
        nvml_hz: opts.nvml_hz,
    });
    Ok(Started {
        sink,
        pidfd,
        child,
        gpu,
    })
}

/// The session of a running tree, the programs attached: checked once
/// more (still the process pinned), its header, every process of the tree
/// tracked and seeded, and the shim injected where asked.
#[allow(clippy::too_many_arguments)]
fn seed_tree(
    tracer: &mut Tracer,
    pid: u32,
    pidfd: &OwnedFd,
    (writer, folder): (SessionWriter, Option<Arc<OutDir>>),
    opts: &RecordOptions,
    guard: Option<u32>,
    symbolizer: Option<symbolize::Worker>,
    notes: &mut Vec<String>,
) -> Result<Sink, RecordError> {
    // Still the process checked, now that the programs are loaded.
    if !sys::alive(pidfd) {
        return Err(RecordError::NoSuchProcess(pid));
    }
    let mut sink = Sink::new(writer, pid);
    sink.symbolize_with(symbolizer);
    sink.guard(guard);
    sink.python_frames(opts.python_frames);
    sink.cut_into(folder);
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
            if sink.add_live(p) {
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
        inject_shims(&mut sink, notes, &limits);
    }
    Ok(sink)
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
        .live()
        .iter()
        .copied()
        .filter(|&p| !sink.withheld(p) && inject::gpu_process(p))
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
