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
//!   its mask and pending set are never touched;
//! - a syscall made from inside a signal handler is never taken over (the
//!   handler may have interrupted malloc or the loader holding their
//!   locks, which dlopen would then wait for); blocking waits (read, poll,
//!   futex, sleep...) are preferred, where no lock of libc is held;
//! - a process that runs with more rights than its user (setuid, setgid,
//!   file capabilities, not dumpable) is not touched unless asked, and
//!   none under strict seccomp or a seccomp filter.
//!
//! Nothing is written into the target's file system: the shim travels in a
//! memfd the target itself creates (its mmap'ed page holds the call), which
//! gapscope fills through `/proc/PID/fd/N`, seals and checks, and which the
//! stub loads as `/proc/self/fd/N` and closes. No path another user could
//! replace, nothing to clean up. The stub's page is read-only and
//! executable once done (one page stays mapped).

mod ptrace;
mod sigframe;
mod stub;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ptrace::{SyscallStop, Tracee};

/// What an injection may do: how long to wait for a safe moment and for
/// the shim to load, and which processes it may enter.
#[derive(Clone, Debug)]
pub struct Limits {
    pub safe_moment: Duration,
    pub load: Duration,
    /// Enter a process that runs with more rights than its real user
    /// (setuid, setgid, file capabilities): `--any-user`.
    pub privileged: bool,
    /// The libcupti the shim is to load (`--cupti`); the injected shim
    /// takes no path from the target's environment.
    pub cupti: Option<String>,
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
            privileged: false,
            cupti: None,
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
    let env = super::procfs::environ(pid);
    ["CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH"]
        .iter()
        .filter_map(|k| env.get(*k))
        .any(|v| v.rsplit('/').next().is_some_and(is_shim))
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

/// Whether a mapped file is the shim: its own file, or the memfd an
/// injection loaded it from (`/memfd:libgapscope_cupti.so (deleted)`).
fn is_shim(file_name: &str) -> bool {
    file_name
        .strip_prefix("memfd:")
        .unwrap_or(file_name)
        .starts_with(gapscope_wire::LIBRARY_NAME)
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
fn preflight(pid: u32, privileged: bool) -> Result<(), Refusal> {
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
    match field("Seccomp") {
        Some("0") | None => {}
        Some("1") => {
            return Err(
                "it runs in strict seccomp mode, which kills it for the injected mmap".into(),
            )
        }
        Some(_) => {
            return Err(
                "it runs under a seccomp filter, which could kill it for the injected mmap".into(),
            )
        }
    }
    if !privileged {
        if let Some(why) = more_rights_than_its_user(pid, &field) {
            return Err(format!(
                "{why}: it runs with more rights than its user, whose environment and files \
                 it trusts less than its own (--any-user enters it anyway)"
            ));
        }
    }
    if fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").is_ok_and(|s| s.trim() == "3") {
        return Err("ptrace is disabled on this machine (kernel.yama.ptrace_scope = 3)".into());
    }
    if !stub::xsave_supported() {
        return Err("this CPU has no XSAVE, which the loader stub needs".into());
    }
    Ok(())
}

/// Why a process has rights its real user has not: ids that differ (a
/// setuid or setgid program), capabilities a non-root user holds (file
/// capabilities), or the kernel marking it not dumpable (its /proc files
/// then belong to root).
fn more_rights_than_its_user<'a>(
    pid: u32,
    field: &impl Fn(&str) -> Option<&'a str>,
) -> Option<&'static str> {
    let ids = |k: &str| -> Vec<u32> {
        field(k)
            .unwrap_or("")
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect()
    };
    let (uids, gids) = (ids("Uid"), ids("Gid"));
    if uids.windows(2).any(|w| w[0] != w[1]) {
        return Some("its user ids differ (setuid)");
    }
    if gids.windows(2).any(|w| w[0] != w[1]) {
        return Some("its group ids differ (setgid)");
    }
    let real = uids.first().copied()?;
    // Capabilities count in the process's own user namespace: root in a
    // rootless container holds all of them there and no more than its
    // user out here. Only in ours do they mean more rights.
    let ns = |p: &str| fs::read_link(format!("/proc/{p}/ns/user")).ok();
    let ours = ns(&pid.to_string()).is_some_and(|n| Some(n) == ns("self"));
    let caps = field("CapEff").and_then(|c| u64::from_str_radix(c, 16).ok());
    if real != 0 && ours && caps.is_some_and(|c| c != 0) {
        return Some("it holds capabilities (file capabilities)");
    }
    use std::os::unix::fs::MetadataExt;
    let owner = fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    (owner != real).then_some("it is not dumpable")
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

/// Largest library read to find functions in: glibc's libc is ~2 MiB.
const LIBRARY_MAX: u64 = 64 << 20;

/// A library of the process as it sees it, whatever its mount namespace:
/// the inode it mapped, if a regular file of a sane size.
fn library_file(pid: u32, m: &Mapping) -> Result<Vec<u8>, Refusal> {
    crate::safe_fs::open_mapping(pid, m.start, m.end)
        .and_then(|f| crate::safe_fs::read_capped(f, LIBRARY_MAX))
        .map_err(|e| format!("cannot read its {} ({e})", m.path))
}

fn named(m: &Mapping, prefix: &str) -> bool {
    Path::new(&m.path)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(prefix))
}

/// Finds dlopen, dlsym, dlerror and the signal-return trampoline. Any file
/// can be mapped under a libc-like name: each candidate is read within
/// bounds, and one that does not parse or lacks the functions is passed
/// over for the next.
fn libc_parts(pid: u32, maps: &[Mapping]) -> Result<LibcParts, Refusal> {
    let names = ["dlopen", "dlsym", "dlerror"];
    let mut restorer = None;
    let mut functions = None;
    let mut why = None;
    for lib in ["libc.so", "libc-", "libdl.so", "libdl-"] {
        for m in maps.iter().filter(|m| m.offset == 0 && named(m, lib)) {
            if functions.is_some() && (restorer.is_some() || !lib.starts_with("libc")) {
                break;
            }
            let data = match library_file(pid, m) {
                Ok(d) => d,
                Err(e) => {
                    why.get_or_insert(e);
                    continue;
                }
            };
            let Some(elf) = super::elf::Elf::parse(&data) else {
                why.get_or_insert(format!("{} is not ELF64", m.path));
                continue;
            };
            let bias = m.start.wrapping_sub(elf.base_vaddr().unwrap_or(0));
            let found = match elf.functions(&names).as_deref() {
                Some([Some(a), Some(b), Some(c)]) => Some([a + bias, b + bias, c + bias]),
                _ => None,
            };
            if lib.starts_with("libc") && restorer.is_none() {
                let exec: Vec<(u64, u64, u64)> = maps
                    .iter()
                    .filter(|x| x.exec && x.path == m.path)
                    .map(|x| (x.start, x.end, x.offset))
                    .collect();
                restorer = sigframe::find_restorer(&data, &exec);
            }
            if functions.is_none() {
                functions = found;
            }
        }
    }
    let [dlopen, dlsym, dlerror] = functions.ok_or_else(|| {
        why.unwrap_or_else(|| {
            "no dlopen in its libc (glibc before 2.34 without libdl loaded)".into()
        })
    })?;
    let restorer = restorer.ok_or("no signal-return trampoline found in its libc")?;
    Ok(LibcParts {
        dlopen,
        dlsym,
        dlerror,
        restorer,
    })
}

/// Syscalls where a thread waits for something outside it: made from a
/// program's own loop, not from inside malloc or the loader, so the best
/// moments to take over.
fn blocking_wait(nr: u64) -> bool {
    [
        libc::SYS_read,
        libc::SYS_poll,
        libc::SYS_select,
        libc::SYS_pause,
        libc::SYS_nanosleep,
        libc::SYS_accept,
        libc::SYS_recvfrom,
        libc::SYS_recvmsg,
        libc::SYS_wait4,
        libc::SYS_futex,
        libc::SYS_epoll_wait,
        libc::SYS_clock_nanosleep,
        libc::SYS_waitid,
        libc::SYS_pselect6,
        libc::SYS_ppoll,
        libc::SYS_epoll_pwait,
        libc::SYS_accept4,
        libc::SYS_epoll_pwait2,
        // The kernel's restart of an interrupted sleep or wait.
        libc::SYS_restart_syscall,
    ]
    .contains(&(nr as libc::c_long))
}

/// Largest stretch of stack looked through for a signal frame.
const SIGNAL_SCAN: u64 = 256 << 10;

/// Whether the thread, stopped with stack pointer `sp`, is running a signal
/// handler: a frame the kernel built for one (its return address the
/// libc trampoline `restorer`, then a ucontext whose saved registers are a
/// user stack pointer and instruction pointer) lies on the stack above.
/// A handler may have interrupted malloc or the loader holding a lock:
/// the loading would then wait on it for ever. Looked for from `sp` to the
/// end of its mapping (the thread's stack, or its alternate signal stack).
fn in_signal_handler(pid: u32, sp: u64, restorer: u64, maps: &[Mapping]) -> bool {
    let Some(stack) = maps.iter().find(|m| m.start <= sp && sp < m.end) else {
        return false;
    };
    let end = stack.end.min(sp.saturating_add(SIGNAL_SCAN));
    let from = sp & !7;
    let mut buf = vec![0u8; (end - from) as usize];
    if ptrace::read_memory(pid, from, &mut buf).is_err() {
        return false;
    }
    sigframe_at(&buf, from, restorer)
}

/// Whether `stack` (read from address `base`) holds a kernel signal frame
/// (`struct rt_sigframe`) whose return address is `restorer`.
fn sigframe_at(stack: &[u8], base: u64, restorer: u64) -> bool {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(stack.get(i..i + 8)?.try_into().ok()?))
    };
    const USER_TOP: u64 = 1 << 47;
    (0..stack.len().saturating_sub(240)).step_by(8).any(|i| {
        // pretcode, then ucontext: uc_flags +8, sigcontext +48 (rsp at
        // +168, rip at +176), fpstate +232.
        let at = base + i as u64;
        word(i) == Some(restorer)
            && word(i + 8).is_some_and(|f| f < 16)
            && word(i + 168).is_some_and(|sp| sp != 0 && sp < USER_TOP)
            && word(i + 176).is_some_and(|ip| ip != 0 && ip < USER_TOP)
            && word(i + 232).is_some_and(|fp| fp == 0 || (fp > at && fp < at + (64 << 10)))
    })
}

/// Syscalls not to take over: the memory calls malloc makes holding its
/// arena lock, and those that create, replace or end a task.
fn unsafe_moment(nr: u64) -> bool {
    [
        libc::SYS_mmap,
        libc::SYS_mprotect,
        libc::SYS_munmap,
        libc::SYS_brk,
        libc::SYS_rt_sigreturn,
        libc::SYS_mremap,
        libc::SYS_madvise,
        libc::SYS_clone,
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_execve,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_execveat,
        libc::SYS_clone3,
    ]
    .contains(&(nr as libc::c_long))
}

/// The process `pid`, pinned: its pidfd says whether the process that was
/// `pid` when it was opened is still alive, so that nothing read of `pid`
/// after that can have been read of another process given the same number.
struct Pinned(std::os::fd::OwnedFd);

impl Pinned {
    fn new(pid: u32) -> Result<Pinned, Refusal> {
        // SAFETY: plain syscall; the returned fd is ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err("the process is gone".into());
        }
        // SAFETY: a new fd owned by nobody else.
        Ok(Pinned(unsafe {
            std::os::fd::FromRawFd::from_raw_fd(fd as i32)
        }))
    }

    /// Still the same, living process.
    fn check(&self) -> Result<(), Refusal> {
        use std::os::fd::AsRawFd;
        // SAFETY: signal 0 through our pidfd: only checks.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err("the process exited".into())
        }
    }
}

/// Largest shim accepted (it is ~6 MiB).
const SHIM_MAX: u64 = 256 << 20;

/// Loads `shim` into `pid` and calls its `gapscope_injected`.
pub fn inject(pid: u32, shim: &Path, limits: Limits) -> Result<Outcome, Refusal> {
    let pin = Pinned::new(pid)?;
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
    preflight(pid, limits.privileged)?;
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
    let image = fs::File::open(shim)
        .and_then(|f| crate::safe_fs::read_capped(f, SHIM_MAX))
        .map_err(|e| format!("cannot read the shim {} ({e})", shim.display()))?;
    // Everything above was read of the process pinned.
    pin.check()?;
    let found = Found {
        parts: &parts,
        ld_so: &ld_so,
        maps: &maps,
    };
    run(pid, &pin, &image, &found, &limits).map(Outcome::Injected)
}

/// What was found of the process before it is touched.
struct Found<'a> {
    parts: &'a LibcParts,
    ld_so: &'a [(u64, u64)],
    maps: &'a [Mapping],
}

/// Whether the thread may be taken over at this syscall entry: not a call
/// malloc or task changes make, not from the loader, not from a signal
/// handler; early on, only a blocking wait.
fn safe_moment(pid: u32, e: &ptrace::Entry, found: &Found, waits_only: bool) -> bool {
    let in_loader = found.ld_so.iter().any(|&(s, end)| s <= e.ip && e.ip < end);
    !unsafe_moment(e.nr)
        && !in_loader
        && (!waits_only || blocking_wait(e.nr))
        && !in_signal_handler(pid, e.regs.rsp, found.parts.restorer, found.maps)
}

fn run(
    pid: u32,
    pin: &Pinned,
    image: &[u8],
    found: &Found,
    limits: &Limits,
) -> Result<Injected, Refusal> {
    let started = Instant::now();
    // The main thread: it exists as long as the process does.
    let tid = pid;
    let mut t = Tracee::seize(tid).map_err(|e| format!("ptrace refused ({e})"))?;
    // The thread seized is the pinned process's, not one of a process that
    // took its number.
    if let Err(e) = pin.check() {
        t.release();
        return Err(e);
    }
    let deadline = Instant::now() + limits.safe_moment;
    let waits_until = Instant::now() + limits.safe_moment / 2;
    let mut from_handlers = 0;
    let entry = loop {
        match t.next_syscall(deadline) {
            Ok(Some(SyscallStop::Entry(e))) => {
                let waits_only = Instant::now() < waits_until;
                if t.syscall_insn_before(e.ip) && safe_moment(pid, &e, found, waits_only) {
                    break e;
                }
                if in_signal_handler(pid, e.regs.rsp, found.parts.restorer, found.maps) {
                    from_handlers += 1;
                }
            }
            Ok(Some(SyscallStop::Exit)) => {}
            Ok(None) => {
                t.release();
                let why = if from_handlers > 0 {
                    format!(
                        "no safe moment within {:?}: its main thread's syscalls came from signal \
                         handlers ({from_handlers}), which may hold locks the loading needs",
                        limits.safe_moment
                    )
                } else {
                    format!(
                        "no safe moment within {:?}: its main thread made no syscall that could \
                         be taken over",
                        limits.safe_moment
                    )
                };
                return Err(why);
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
    // Signals wait until the thread is the program's again: a handler run
    // now would run on gapscope's registers, in the middle of its calls.
    if let Err(e) = t.hold_signals() {
        t.restore_and_release(&entry);
        return Err(format!("cannot hold its signals back ({e})"));
    }
    // Then the call becomes an mmap of the stub's page, returning into
    // sigreturn on that frame.
    let l = stub::layout();
    let size = (l.len as u64).next_multiple_of(4096);
    let page = match t.run_syscall_in_place(
        &entry,
        libc::SYS_mmap as u64,
        [
            0,
            size,
            (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
        (found.parts.restorer, frame.sp),
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
    let cupti = limits.cupti.as_deref().unwrap_or("");
    let fill = |fd: u64, path: &str| {
        stub::bytes(&stub::Fill {
            dlopen: found.parts.dlopen,
            dlsym: found.parts.dlsym,
            dlerror: found.parts.dlerror,
            resume: entry.ip - 2,
            xsave_size: stub::xsave_size(),
            fd,
            path: path.as_bytes(),
            cupti: cupti.as_bytes(),
            page_len: size,
        })
    };
    let Some(bytes) = fill(0, "") else {
        t.restore_and_release(&entry);
        return Err("the libcupti path given is too long".into());
    };
    if let Err(e) = ptrace::write_memory(pid, page, &bytes) {
        t.restore_and_release(&entry);
        return Err(format!("cannot write into it ({e})"));
    }
    // The target makes the memfd the shim travels in: nothing is placed in
    // its file system, and only its own user (and root) can reach it.
    let fd = match memfd_in(&mut t, &entry, page, frame.sp)
        .and_then(|fd| fill_memfd(pid, fd, image).map(|()| fd))
    {
        Ok(fd) => fd,
        Err(e) => {
            t.restore_and_release(&entry);
            return Err(e);
        }
    };
    let path = format!("/proc/self/fd/{fd}");
    let bytes = fill(fd, &path).expect("a path of /proc/self/fd fits");
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
                return Err("the shim has no gapscope_injected".into());
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

/// Has the stopped thread create the memfd (`memfd_create` from the stub
/// page's trampoline, which returns into sigreturn on the thread's own
/// frame should gapscope die meanwhile); returns its fd in the target.
fn memfd_in(t: &mut Tracee, entry: &ptrace::Entry, page: u64, sp: u64) -> Result<u64, Refusal> {
    const MEMFD_CREATE: u64 = libc::SYS_memfd_create as u64;
    const MFD_CLOEXEC: u64 = 1;
    const MFD_ALLOW_SEALING: u64 = 2;
    // Executable, also where vm.memfd_noexec = 1 makes memfds NOEXEC by
    // default; kernels before 6.3 know no such flag (EINVAL).
    const MFD_EXEC: u64 = 0x10;
    let l = stub::layout();
    let name = page + l.memfd_name as u64;
    let tramp = page + l.tramp as u64;
    let mut last = 0;
    for flags in [
        MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC,
        MFD_CLOEXEC | MFD_ALLOW_SEALING,
    ] {
        let r = t.run_syscall_at(entry, MEMFD_CREATE, [name, flags, 0, 0, 0, 0], (tramp, sp))?;
        if (r as i64) >= 0 {
            return Ok(r);
        }
        last = -(r as i64);
        if last != i64::from(libc::EINVAL) {
            break;
        }
    }
    Err(format!(
        "it could not make a memfd to load the shim from ({})",
        std::io::Error::from_raw_os_error(last as i32)
    ))
}

/// Writes the shim into the target's memfd `fd`, seals it against any
/// change, and reads it back: what the stub loads is the shim, byte for
/// byte, whatever another thread of the target did meanwhile.
fn fill_memfd(pid: u32, fd: u64, image: &[u8]) -> Result<(), Refusal> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let link = format!("/proc/{pid}/fd/{fd}");
    let target = fs::read_link(&link).map_err(|e| format!("cannot see its memfd ({e})"))?;
    let want = format!("/memfd:{} (deleted)", gapscope_wire::LIBRARY_NAME);
    if target.as_os_str() != want.as_str() {
        return Err(format!(
            "its fd {fd} is not the memfd made for the shim ({})",
            target.display()
        ));
    }
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&link)
        .map_err(|e| format!("cannot open its memfd ({e})"))?;
    let meta = crate::safe_fs::regular(&f).map_err(|e| format!("its memfd: {e}"))?;
    if meta.len() != 0 {
        return Err("its memfd was written by another hand".into());
    }
    f.write_all(image)
        .map_err(|e| format!("cannot fill its memfd ({e})"))?;
    const SEALS: i32 =
        libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on our own fd.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(format!(
            "cannot seal its memfd ({})",
            std::io::Error::last_os_error()
        ));
    }
    let mut back = Vec::with_capacity(image.len());
    f.rewind()
        .and_then(|()| {
            Read::by_ref(&mut f)
                .take(image.len() as u64 + 1)
                .read_to_end(&mut back)
        })
        .map_err(|e| format!("cannot read its memfd back ({e})"))?;
    if back != image {
        return Err("its memfd changed while being filled".into());
    }
    Ok(())
}
