//! Bringing the CUPTI shim into a process that is already running: one of
//! its threads is stopped with ptrace at a syscall boundary, made to map a
//! page, and released into a stub there that loads the shim and returns to
//! the syscall it was about to make (see `stub`). The process's other
//! threads never stop.
//!
//! Never hurting the target comes first:
//! - the moment is a syscall entry that is neither the dynamic loader's nor
//!   a memory call malloc could be making under its lock, nor one that
//!   creates, replaces or ends a task; other syscalls are let through and
//!   the next one is tried, for a bounded time;
//! - a thread blocked in a syscall is interrupted and, on resuming, the
//!   kernel restarts the call (no EINTR); the taken-over call is run again
//!   by the stub, from the same registers;
//! - every register, and the FPU/SSE/AVX state, is restored by the stub
//!   itself, so gapscope is not needed once the stub runs; while the thread
//!   runs the injected mmap, a signal frame on its stack holds its own
//!   state and the mmap returns into libc's sigreturn trampoline, so a
//!   gapscope killed at any moment leaves a thread that carries on as if
//!   untouched (`sigframe`);
//! - signals that arrive while the thread is stopped are handed back to it;
//!   its mask and pending set are never touched.

mod elf;
mod ptrace;
mod sigframe;
mod stub;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ptrace::{SyscallStop, Tracee};

/// How long to wait for a safe moment, and for the shim to load.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub safe_moment: Duration,
    pub load: Duration,
    /// Tests only: let go of the thread right after the injected mmap, as
    /// a gapscope killed then would.
    #[doc(hidden)]
    pub abandon_after_mmap: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            safe_moment: Duration::from_secs(2),
            load: Duration::from_secs(10),
            abandon_after_mmap: false,
        }
    }
}

/// A shim brought in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injected {
    pub pid: u32,
    /// The thread that ran the loading.
    pub tid: u32,
    /// CLOCK_MONOTONIC ns when the shim's InitializeInjection returned
    /// (as gapscope saw it).
    pub loaded_at: u64,
    /// The longest the thread was held stopped.
    pub longest_stop: Duration,
    /// From the first stop to the shim loaded.
    pub took: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Injected(Injected),
    /// The shim is already in the process, nothing to do: from its
    /// environment, or (`injected_before`) brought in by an earlier attach
    /// and dormant since.
    AlreadyLoaded {
        injected_before: bool,
    },
}

/// Whether `pid` was started with the shim in its environment (as the CUDA
/// or NVTX injection library).
fn shim_from_environment(pid: u32) -> bool {
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    env.split(|&b| b == 0).any(|kv| {
        let kv = String::from_utf8_lossy(kv);
        ["CUDA_INJECTION64_PATH=", "NVTX_INJECTION64_PATH="]
            .iter()
            .filter_map(|k| kv.strip_prefix(k))
            .any(|v| v.rsplit('/').next().is_some_and(is_shim))
    })
}

/// Why a process was not injected: one line, for the report.
pub type Refusal = String;

/// The file names `pid` maps.
fn mapped_names(pid: u32) -> Vec<String> {
    fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|maps| {
            maps.lines()
                .filter_map(map_name)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn gpu_library(name: &str) -> bool {
    name.starts_with("libcuda.so") || name.starts_with("libcupti")
}

/// Whether `pid` is a GPU process: it maps libcuda or libcupti.
pub fn gpu_process(pid: u32) -> bool {
    mapped_names(pid).iter().any(|n| gpu_library(n))
}

/// Whether `pid` is a GPU process without the shim.
pub fn wants_shim(pid: u32) -> bool {
    let names = mapped_names(pid);
    names.iter().any(|n| gpu_library(n)) && !names.iter().any(|n| is_shim(n))
}

fn is_shim(file_name: &str) -> bool {
    file_name.starts_with(gapscope_cupti::LIBRARY_NAME)
}

/// The file name of a mapping line's path, if it has one.
fn map_name(line: &str) -> Option<&str> {
    let path = line.split_whitespace().nth(5)?;
    path.starts_with('/').then(|| path.rsplit('/').next())?
}

struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    exec: bool,
    path: String,
}

fn mappings(pid: u32) -> Result<Vec<Mapping>, Refusal> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("cannot read its memory map ({e})"))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (s, e) = f.first()?.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                offset: u64::from_str_radix(f.get(2)?, 16).ok()?,
                exec: f.get(1)?.contains('x'),
                path: f.get(5).map_or(String::new(), |p| p.to_string()),
            })
        })
        .collect())
}

/// What would stop an injection before anything is touched.
fn preflight(pid: u32) -> Result<(), Refusal> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| "the process is gone".to_string())?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':').map(str::trim))
    };
    match field("TracerPid") {
        Some("0") | None => {}
        Some(t) => return Err(format!("it is already traced by process {t}")),
    }
    if field("Seccomp") == Some("2") {
        return Err(
            "it runs under a seccomp filter, which could kill it for the injected mmap".into(),
        );
    }
    if fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").is_ok_and(|s| s.trim() == "3") {
        return Err("ptrace is disabled on this machine (kernel.yama.ptrace_scope = 3)".into());
    }
    if !stub::xsave_supported() {
        return Err("this CPU has no XSAVE, which the loader stub needs".into());
    }
    Ok(())
}

/// What injection calls in the process's libc: dlopen, dlsym and dlerror
/// (glibc 2.34+ exports them from libc, older ones from libdl when the
/// process has it loaded), and the sigreturn trampoline.
struct LibcParts {
    dlopen: u64,
    dlsym: u64,
    dlerror: u64,
    restorer: u64,
}

/// A library of the process as it sees it, whatever its mount namespace.
fn library_file(pid: u32, m: &Mapping) -> Result<Vec<u8>, Refusal> {
    fs::read(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
        .or_else(|_| fs::read(format!("/proc/{pid}/root{}", m.path)))
        .map_err(|e| format!("cannot read its {} ({e})", m.path))
}

fn named(m: &Mapping, prefix: &str) -> bool {
    Path::new(&m.path)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(prefix))
}

fn libc_parts(pid: u32, maps: &[Mapping]) -> Result<LibcParts, Refusal> {
    let names = ["dlopen", "dlsym", "dlerror"];
    let mut restorer = None;
    let mut functions = None;
    for lib in ["libc.so", "libc-", "libdl.so", "libdl-"] {
        let Some(m) = maps.iter().find(|m| m.offset == 0 && named(m, lib)) else {
            continue;
        };
        let data = library_file(pid, m)?;
        let elf = elf::Elf::parse(&data).ok_or_else(|| format!("{} is not ELF64", m.path))?;
        let bias = m.start.wrapping_sub(elf.base_vaddr().unwrap_or(0));
        if lib.starts_with("libc") && restorer.is_none() {
            let exec: Vec<(u64, u64, u64)> = maps
                .iter()
                .filter(|x| x.exec && x.path == m.path)
                .map(|x| (x.start, x.end, x.offset))
                .collect();
            restorer = sigframe::find_restorer(&data, &exec);
        }
        if functions.is_none() {
            if let Some([Some(a), Some(b), Some(c)]) = elf.functions(&names).as_deref() {
                functions = Some([a + bias, b + bias, c + bias]);
            }
        }
    }
    let [dlopen, dlsym, dlerror] =
        functions.ok_or("no dlopen in its libc (glibc before 2.34 without libdl loaded)")?;
    let restorer = restorer.ok_or("no signal-return trampoline found in its libc")?;
    Ok(LibcParts {
        dlopen,
        dlsym,
        dlerror,
        restorer,
    })
}

/// Syscalls not to take over: the memory calls malloc makes holding its
/// arena lock, and those that create, replace or end a task.
fn unsafe_moment(nr: u64) -> bool {
    const MMAP: u64 = 9;
    const MPROTECT: u64 = 10;
    const MUNMAP: u64 = 11;
    const BRK: u64 = 12;
    const RT_SIGRETURN: u64 = 15;
    const MREMAP: u64 = 25;
    const MADVISE: u64 = 28;
    const CLONE: u64 = 56;
    const FORK: u64 = 57;
    const VFORK: u64 = 58;
    const EXECVE: u64 = 59;
    const EXIT: u64 = 60;
    const EXIT_GROUP: u64 = 231;
    const EXECVEAT: u64 = 322;
    const CLONE3: u64 = 435;
    matches!(
        nr,
        MMAP | MPROTECT
            | MUNMAP
            | BRK
            | RT_SIGRETURN
            | MREMAP
            | MADVISE
            | CLONE
            | FORK
            | VFORK
            | EXECVE
            | EXIT
            | EXIT_GROUP
            | EXECVEAT
            | CLONE3
    )
}

/// The path the target can open the shim at: ours when it shares our mount
/// namespace, else a copy placed in its own /tmp (removed once loaded).
fn shim_for(pid: u32, shim: &Path) -> Result<(String, Option<PathBuf>), Refusal> {
    let ns = |p: &str| fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    if ns("self") == ns(&pid.to_string()) {
        return Ok((shim.to_string_lossy().into_owned(), None));
    }
    let inside = format!("/tmp/.gapscope-{}", std::process::id());
    let dir = PathBuf::from(format!("/proc/{pid}/root{inside}"));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot place the shim in its /tmp ({e})"))?;
    let name = gapscope_cupti::LIBRARY_NAME;
    fs::copy(shim, dir.join(name)).map_err(|e| format!("cannot copy the shim in ({e})"))?;
    Ok((format!("{inside}/{name}"), Some(dir)))
}

/// Loads `shim` into `pid` and calls its InitializeInjection.
pub fn inject(pid: u32, shim: &Path, limits: Limits) -> Result<Outcome, Refusal> {
    let maps = mappings(pid)?;
    if maps.is_empty() {
        // A zombie: its memory is gone.
        return Err("the process is exiting".into());
    }
    if maps.iter().any(|m| {
        Path::new(&m.path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_shim)
    }) {
        return Ok(Outcome::AlreadyLoaded {
            injected_before: !shim_from_environment(pid),
        });
    }
    preflight(pid)?;
    let parts = libc_parts(pid, &maps)?;
    let ld_so: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| {
            Path::new(&m.path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ld-linux") || n.starts_with("ld-"))
        })
        .map(|m| (m.start, m.end))
        .collect();
    let (path, copied) = shim_for(pid, shim)?;
    let result = run(pid, &path, &parts, &ld_so, limits);
    if let Some(dir) = copied {
        // Loaded (or given up on): the mapping keeps the file alive.
        if !matches!(&result, Err(e) if e.contains("still loading")) {
            let _ = fs::remove_dir_all(dir);
        }
    }
    result.map(Outcome::Injected)
}

fn run(
    pid: u32,
    path: &str,
    parts: &LibcParts,
    ld_so: &[(u64, u64)],
    limits: Limits,
) -> Result<Injected, Refusal> {
    let started = Instant::now();
    // The main thread: it exists as long as the process does.
    let tid = pid;
    let mut t = Tracee::seize(tid).map_err(|e| format!("ptrace refused ({e})"))?;
    let deadline = Instant::now() + limits.safe_moment;
    let entry = loop {
        match t.next_syscall(deadline) {
            Ok(Some(SyscallStop::Entry(e))) => {
                let in_loader = ld_so.iter().any(|&(s, end)| s <= e.ip && e.ip < end);
                if !unsafe_moment(e.nr) && !in_loader && t.syscall_insn_before(e.ip) {
                    break e;
                }
            }
            Ok(Some(SyscallStop::Exit)) => {}
            Ok(None) => {
                t.release();
                return Err(format!(
                    "no safe moment within {:?}: its main thread made no syscall that could be \
                     taken over",
                    limits.safe_moment
                ));
            }
            Err(e) => {
                t.release();
                return Err(e);
            }
        }
    };
    // Taken over. First the way back, should gapscope die from here on: a
    // signal frame with the thread's own state, on its stack.
    let frame = t
        .sigmask()
        .and_then(|m| Ok((m, t.xstate()?)))
        .map_err(|e| format!("cannot read its signal mask or XSAVE state ({e})"))
        .and_then(|(sigmask, xstate)| {
            sigframe::build(
                &entry.regs,
                entry.ip - 2,
                entry.regs.orig_rax,
                sigmask,
                &xstate,
            )
            .ok_or_else(|| {
                format!(
                    "its XSAVE state ({} bytes) is not one this kernel can restore",
                    xstate.len()
                )
            })
        });
    let frame = match frame {
        Ok(f) => f,
        Err(e) => {
            t.restore_and_release(&entry);
            return Err(e);
        }
    };
    if let Err(e) = ptrace::write_memory(pid, frame.at, &frame.bytes) {
        t.restore_and_release(&entry);
        return Err(format!("cannot write to its stack ({e})"));
    }
    // Then the call becomes an mmap of the stub's page, returning into
    // sigreturn on that frame.
    let l = stub::layout();
    let size = (l.len as u64).next_multiple_of(4096);
    let page = match t.run_syscall_in_place(
        &entry,
        9, // mmap
        [
            0,
            size,
            (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
        (parts.restorer, frame.sp),
    ) {
        Ok(addr) if (addr as i64) > 0 => addr,
        Ok(err) => {
            t.restore_and_release(&entry);
            return Err(format!(
                "its mmap of an executable page failed ({})",
                std::io::Error::from_raw_os_error(-(err as i64) as i32)
            ));
        }
        Err(e) => {
            t.restore_and_release(&entry);
            return Err(e);
        }
    };
    if limits.abandon_after_mmap {
        t.abandon();
        return Err("let go of after the injected mmap (as if gapscope had died)".into());
    }
    let bytes = stub::bytes(&stub::Fill {
        dlopen: parts.dlopen,
        dlsym: parts.dlsym,
        dlerror: parts.dlerror,
        resume: entry.ip - 2,
        xsave_size: stub::xsave_size(),
        path: path.as_bytes(),
    })
    .ok_or("the shim's path is too long")?;
    if let Err(e) = ptrace::write_memory(pid, page, &bytes) {
        t.restore_and_release(&entry);
        return Err(format!("cannot write into it ({e})"));
    }
    let longest_stop = t
        .start_at(&entry, page)
        .map_err(|e| format!("cannot start the loader ({e})"))?;

    // The thread now loads the shim on its own; wait for its word.
    let load_deadline = Instant::now() + limits.load;
    loop {
        let word = ptrace::read_u64(pid, page + l.status as u64)
            .map_err(|_| "the process exited while loading the shim".to_string())?;
        match stub::Status::from_word(word) {
            stub::Status::Loaded => {
                return Ok(Injected {
                    pid,
                    tid,
                    loaded_at: crate::clock::monotonic_ns(),
                    longest_stop,
                    took: started.elapsed(),
                })
            }
            stub::Status::NoLibrary => {
                let text = ptrace::read_u64(pid, page + l.error as u64)
                    .ok()
                    .and_then(|p| ptrace::read_cstr(pid, p, 300).ok())
                    .unwrap_or_default();
                return Err(format!("dlopen of the shim failed: {text}"));
            }
            stub::Status::NoSymbol => {
                return Err("the shim has no InitializeInjection".into());
            }
            stub::Status::Running if Instant::now() >= load_deadline => {
                return Err(format!(
                    "the shim is still loading after {:?}; left to finish on its own",
                    limits.load
                ));
            }
            stub::Status::Running => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}
