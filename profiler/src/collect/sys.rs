//! The few system calls the recorder makes itself, each behind a safe
//! function: the rest of collect/ holds no `unsafe` for them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A process pinned by a pidfd: its number cannot be taken over while held.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned by us.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process a pidfd holds is still alive (signal 0 through it).
pub fn alive(pidfd: &OwnedFd) -> bool {
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

/// Sends `signo` to our own child `pid` (`run` passes a signal on).
pub fn signal_child(pid: u32, signo: i32) {
    // SAFETY: signalling a process; no memory is involved.
    unsafe { libc::kill(pid as i32, signo) };
}

/// Reaps our own exited child `pid`: its wait status, if it was ours.
pub fn reap(pid: u32) -> Option<i32> {
    let mut st = 0;
    // SAFETY: waitpid writes the status into a local.
    (unsafe { libc::waitpid(pid as i32, &mut st, 0) } == pid as i32).then_some(st)
}

/// This machine's name and kernel release, empty if unknown.
pub fn uname() -> (String, String) {
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

/// This process's CPU time (ns) and peak RSS (bytes) so far, children
/// excluded.
pub fn rusage_self() -> (u64, u64) {
    // SAFETY: getrusage fills a struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    (
        ns(ru.ru_utime) + ns(ru.ru_stime),
        ru.ru_maxrss as u64 * 1024,
    )
}

/// An fd borrowed for readiness only (the ring buffer's, owned by the
/// tracer).
pub struct Readable(pub RawFd);

impl AsRawFd for Readable {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}
