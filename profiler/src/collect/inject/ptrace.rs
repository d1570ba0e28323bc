//! The ptrace calls injection makes, and reading and writing the target's
//! memory. Every stop of the thread is timed: the longest is reported.

use std::io;
use std::time::{Duration, Instant};

const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;
const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;
const NT_X86_XSTATE: usize = 0x202;
const PTRACE_EVENT_STOP: i32 = 128;
const SYSCALL_STOP: i32 = libc::SIGTRAP | 0x80;
const INFO_ENTRY: u8 = 1;

/// `struct ptrace_syscall_info`, as much as entry and exit stops use.
#[repr(C)]
#[derive(Default)]
struct SyscallInfo {
    op: u8,
    _pad: [u8; 3],
    arch: u32,
    ip: u64,
    sp: u64,
    /// Entry: the syscall number; exit: its return value.
    nr_or_rval: u64,
    args: [u64; 6],
    _rest: u64,
}

/// A syscall-entry stop: what the thread was about to call, from where, and
/// its registers then.
pub struct Entry {
    pub nr: u64,
    /// Just after the `syscall` instruction.
    pub ip: u64,
    pub regs: libc::user_regs_struct,
}

pub enum SyscallStop {
    Entry(Box<Entry>),
    Exit,
}

/// One thread under PTRACE_SEIZE, released when dropped.
pub struct Tracee {
    tid: u32,
    stopped_since: Option<Instant>,
    longest: Duration,
    /// A signal that stopped the thread, to hand back when it resumes.
    pending: i32,
    attached: bool,
    /// The thread's own signal mask while gapscope holds its signals back.
    held_mask: Option<u64>,
}

fn ptrace(req: libc::c_uint, tid: u32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: ptrace with integer arguments; `data` is a pointer only for
    // the requests that take one, and then points at a live value.
    let r = unsafe { libc::ptrace(req, tid as libc::pid_t, addr, data) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Tracee {
    /// Seizes the thread and asks it to stop.
    pub fn seize(tid: u32) -> io::Result<Tracee> {
        ptrace(
            libc::PTRACE_SEIZE,
            tid,
            0,
            libc::PTRACE_O_TRACESYSGOOD as usize,
        )?;
        let t = Tracee {
            tid,
            stopped_since: None,
            longest: Duration::ZERO,
            pending: 0,
            attached: true,
            held_mask: None,
        };
        ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0)?;
        Ok(t)
    }

    fn wait(&mut self, deadline: Instant) -> Result<i32, String> {
        // The thread is stopped at every syscall and signal while gapscope
        // looks for its moment: answered within a yield, not a sleep, it
        // keeps running at near its own pace (on a quiet machine, a program taking
        // a signal every 100 us made no progress against 50 us sleeps).
        let spin_until = Instant::now() + Duration::from_micros(500);
        loop {
            let mut st = 0;
            // SAFETY: waiting for a thread we trace.
            let r =
                unsafe { libc::waitpid(self.tid as i32, &mut st, libc::__WALL | libc::WNOHANG) };
            if r == self.tid as i32 {
                if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                    self.attached = false;
                    return Err("the process exited".into());
                }
                self.stopped_since = Some(Instant::now());
                return Ok(st);
            }
            if r < 0 {
                self.attached = false;
                return Err(format!("lost the thread ({})", io::Error::last_os_error()));
            }
            if Instant::now() >= deadline {
                return Err(String::new());
            }
            if Instant::now() < spin_until {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn resume(&mut self, req: libc::c_uint) -> io::Result<()> {
        if let Some(since) = self.stopped_since.take() {
            self.longest = self.longest.max(since.elapsed());
        }
        let sig = std::mem::take(&mut self.pending);
        ptrace(req, self.tid, 0, sig as usize).map(|_| ())
    }

    /// Runs the thread to its next syscall stop, handing back any signal
    /// it gets on the way. None when the deadline passed first.
    pub fn next_syscall(&mut self, deadline: Instant) -> Result<Option<SyscallStop>, String> {
        loop {
            if self.stopped_since.is_some() {
                self.resume(libc::PTRACE_SYSCALL)
                    .map_err(|e| format!("cannot resume it ({e})"))?;
            }
            let st = match self.wait(deadline) {
                Ok(st) => st,
                Err(e) if e.is_empty() => return Ok(None),
                Err(e) => return Err(e),
            };
            let sig = libc::WSTOPSIG(st);
            if st >> 16 == PTRACE_EVENT_STOP {
                if sig != libc::SIGTRAP {
                    // A group stop: someone stopped the process.
                    return Err(format!("the process was stopped (signal {sig})"));
                }
                continue;
            }
            if sig != SYSCALL_STOP {
                // A signal on its way to the thread: it gets it on resuming.
                self.pending = sig;
                continue;
            }
            let mut info = SyscallInfo::default();
            ptrace(
                PTRACE_GET_SYSCALL_INFO,
                self.tid,
                std::mem::size_of::<SyscallInfo>(),
                &mut info as *mut SyscallInfo as usize,
            )
            .map_err(|e| format!("cannot read its syscall ({e})"))?;
            if info.op != INFO_ENTRY {
                return Ok(Some(SyscallStop::Exit));
            }
            let regs = self
                .regs()
                .map_err(|e| format!("cannot read its registers ({e})"))?;
            return Ok(Some(SyscallStop::Entry(Box::new(Entry {
                nr: info.nr_or_rval,
                ip: info.ip,
                regs,
            }))));
        }
    }

    fn regs(&self) -> io::Result<libc::user_regs_struct> {
        // SAFETY: user_regs_struct is plain data.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        ptrace(libc::PTRACE_GETREGS, self.tid, 0, &mut r as *mut _ as usize)?;
        Ok(r)
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> io::Result<()> {
        ptrace(libc::PTRACE_SETREGS, self.tid, 0, r as *const _ as usize).map(|_| ())
    }

    /// Whether the two bytes before `ip` are a `syscall` instruction (the
    /// stub returns there to run the call again).
    pub fn syscall_insn_before(&self, ip: u64) -> bool {
        let mut b = [0u8; 2];
        read_memory(self.tid, ip.wrapping_sub(2), &mut b).is_ok() && b == [0x0f, 0x05]
    }

    /// The thread's blocked signals.
    pub fn sigmask(&self) -> io::Result<u64> {
        let mut m = 0u64;
        ptrace(PTRACE_GETSIGMASK, self.tid, 8, &mut m as *mut u64 as usize)?;
        Ok(m)
    }

    /// Blocks every signal on the thread until it is let go of, when its own
    /// mask comes back. A signal arriving while it makes gapscope's syscalls
    /// would otherwise run the program's handler on gapscope's registers,
    /// mid-sequence; blocked, it stays pending (or goes to another thread)
    /// and is handled once the thread is the program's again. Should gapscope
    /// die meanwhile, the sigreturn frame restores the mask with the rest.
    pub fn hold_signals(&mut self) -> io::Result<()> {
        let own = self.sigmask()?;
        let all = u64::MAX;
        ptrace(PTRACE_SETSIGMASK, self.tid, 8, &all as *const u64 as usize)?;
        self.held_mask.get_or_insert(own);
        Ok(())
    }

    fn let_signals_through(&mut self) {
        if let Some(own) = self.held_mask.take() {
            let _ = ptrace(PTRACE_SETSIGMASK, self.tid, 8, &own as *const u64 as usize);
        }
    }

    /// The thread's XSAVE area (NT_X86_XSTATE), as the kernel gives it.
    pub fn xstate(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; 64 << 10];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        ptrace(
            libc::PTRACE_GETREGSET,
            self.tid,
            NT_X86_XSTATE,
            &mut iov as *mut libc::iovec as usize,
        )?;
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    /// At the syscall-entry stop `entry`, makes the call syscall `nr` with
    /// `args` instead, returning to `ip` with stack pointer `sp`; returns
    /// its result at the exit stop.
    pub fn run_syscall_in_place(
        &mut self,
        entry: &Entry,
        nr: u64,
        args: [u64; 6],
        (ip, sp): (u64, u64),
    ) -> Result<u64, String> {
        self.set_regs(&call_regs(&entry.regs, nr, nr, args, (ip, sp)))
            .map_err(|e| format!("cannot set its registers ({e})"))?;
        self.until_exit(nr)
    }

    /// From a stop at a syscall's exit, has the thread make syscall `nr`
    /// with `args` from the `syscall` instruction at `ip` (in the stub's
    /// page), with stack pointer `sp` and otherwise the registers of
    /// `base`; returns its result, at its exit stop.
    pub fn run_syscall_at(
        &mut self,
        base: &Entry,
        nr: u64,
        args: [u64; 6],
        (ip, sp): (u64, u64),
    ) -> Result<u64, String> {
        // No call in progress: nothing for the kernel to restart.
        self.set_regs(&call_regs(&base.regs, nr, u64::MAX, args, (ip, sp)))
            .map_err(|e| format!("cannot set its registers ({e})"))?;
        match self.next_syscall(Instant::now() + Duration::from_secs(1))? {
            Some(SyscallStop::Entry(e)) if e.nr == nr => {}
            Some(_) => return Err("lost track of its syscall".into()),
            None => return Err(format!("its injected syscall {nr} did not start")),
        }
        self.until_exit(nr)
    }

    /// Runs the thread to the exit stop of the syscall `nr` it is in and
    /// returns the call's result.
    fn until_exit(&mut self, nr: u64) -> Result<u64, String> {
        match self.next_syscall(Instant::now() + Duration::from_secs(1))? {
            Some(SyscallStop::Exit) => {}
            Some(SyscallStop::Entry(_)) => return Err("lost track of its syscall".into()),
            None => return Err(format!("its injected syscall {nr} did not return")),
        }
        self.regs()
            .map(|r| r.rax)
            .map_err(|e| format!("cannot read its registers ({e})"))
    }

    /// Releases the thread into the code at `at`, with the registers it
    /// had at `entry` (the stub restores them and runs the call again).
    pub fn start_at(mut self, entry: &Entry, at: u64) -> io::Result<Duration> {
        let mut r = entry.regs;
        r.rax = entry.regs.orig_rax;
        r.rip = at;
        // No syscall in progress: the kernel must not restart anything.
        r.orig_rax = u64::MAX;
        self.set_regs(&r)?;
        self.detach()?;
        Ok(self.longest)
    }

    /// Lets go of the thread with the registers it has now, as gapscope's
    /// death would (tests of the recovery frame).
    pub fn abandon(mut self) {
        // As gapscope's death would: the mask stays held, for the frame to
        // give back.
        self.held_mask = None;
        let _ = self.detach();
    }

    /// Gives the thread back as it was at `entry`: about to make its call.
    pub fn restore_and_release(mut self, entry: &Entry) {
        let mut r = entry.regs;
        r.rax = entry.regs.orig_rax;
        r.rip = entry.ip - 2;
        r.orig_rax = u64::MAX;
        let _ = self.set_regs(&r);
        let _ = self.detach();
    }

    fn detach(&mut self) -> io::Result<()> {
        self.let_signals_through();
        self.attached = false;
        self.resume(libc::PTRACE_DETACH)
    }

    /// Lets go, leaving the thread as it is: if it is running, it is
    /// stopped first, since only a stopped thread can be detached.
    pub fn release(mut self) {
        self.release_now();
    }

    fn release_now(&mut self) {
        if !self.attached {
            return;
        }
        if self.stopped_since.is_none() {
            let _ = ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0);
            let deadline = Instant::now() + Duration::from_secs(1);
            // A signal met on the way is passed on by the detach.
            if let Ok(st) = self.wait(deadline) {
                let sig = libc::WSTOPSIG(st);
                if st >> 16 != PTRACE_EVENT_STOP && sig != SYSCALL_STOP {
                    self.pending = sig;
                }
            }
        }
        let _ = self.detach();
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        self.release_now();
    }
}

/// `base` with syscall `nr` and `args` to make at `ip` on stack `sp`.
fn call_regs(
    base: &libc::user_regs_struct,
    nr: u64,
    orig_rax: u64,
    args: [u64; 6],
    (ip, sp): (u64, u64),
) -> libc::user_regs_struct {
    let mut r = *base;
    r.orig_rax = orig_rax;
    r.rax = nr;
    r.rip = ip;
    r.rsp = sp;
    (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) =
        (args[0], args[1], args[2], args[3], args[4], args[5]);
    r
}

fn iov(addr: u64, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    }
}

pub use crate::collect::procfs::read_memory;

pub fn write_memory(pid: u32, addr: u64, bytes: &[u8]) -> io::Result<()> {
    let local = iov(bytes.as_ptr() as u64, bytes.len());
    let remote = iov(addr, bytes.len());
    // SAFETY: the local iovec covers `bytes`, only read.
    let n = unsafe { libc::process_vm_writev(pid as i32, &local, 1, &remote, 1, 0) };
    match n {
        n if n as usize == bytes.len() => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::from(io::ErrorKind::WriteZero)),
    }
}

pub fn read_u64(pid: u32, addr: u64) -> io::Result<u64> {
    let mut b = [0u8; 8];
    read_memory(pid, addr, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// A NUL-terminated string in the target, at most `max` bytes.
pub fn read_cstr(pid: u32, addr: u64, max: usize) -> io::Result<String> {
    let mut out = Vec::new();
    for i in 0..max as u64 {
        let mut b = [0u8];
        read_memory(pid, addr + i, &mut b)?;
        if b[0] == 0 {
            break;
        }
        out.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}
