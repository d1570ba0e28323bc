//! What a syscall is, and what a thread blocked in it was waiting for. The
//! one place these rules live.

use std::borrow::Cow;

use serde::Serialize;

use super::syscall_names::NAMES;
use crate::session::{FdKind, Frame};

pub fn syscall_name(nr: i32) -> Cow<'static, str> {
    match NAMES.get(nr as usize) {
        Some(name) if nr >= 0 && !name.is_empty() => Cow::Borrowed(name),
        _ => Cow::Owned(format!("syscall_{nr}")),
    }
}

/// Why a thread was off-CPU. Order and names are the report's contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OffKind {
    File,
    Net,
    Ipc,
    Sleep,
    Gpu,
    Fault,
    Other,
}

impl OffKind {
    pub const ALL: [OffKind; 7] = [
        OffKind::File,
        OffKind::Net,
        OffKind::Ipc,
        OffKind::Sleep,
        OffKind::Gpu,
        OffKind::Fault,
        OffKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OffKind::File => "file",
            OffKind::Net => "net",
            OffKind::Ipc => "ipc",
            OffKind::Sleep => "sleep",
            OffKind::Gpu => "gpu",
            OffKind::Fault => "fault",
            OffKind::Other => "other",
        }
    }
}

/// Where bytes moved, for the read/write totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ByteClass {
    File,
    Net,
    Ipc,
    Other,
}

pub fn byte_class(kind: FdKind) -> ByteClass {
    match kind {
        FdKind::File | FdKind::Block => ByteClass::File,
        FdKind::SockInet | FdKind::SockAccepted | FdKind::SockOther => ByteClass::Net,
        FdKind::SockUnix | FdKind::Pipe | FdKind::Anon => ByteClass::Ipc,
        FdKind::Gpu | FdKind::Char | FdKind::Pseudo | FdKind::None => ByteClass::Other,
    }
}

fn wait_on_fd(kind: FdKind) -> OffKind {
    match kind {
        FdKind::File | FdKind::Block => OffKind::File,
        FdKind::SockInet | FdKind::SockAccepted | FdKind::SockOther => OffKind::Net,
        FdKind::SockUnix | FdKind::Pipe | FdKind::Anon => OffKind::Ipc,
        FdKind::Gpu => OffKind::Gpu,
        FdKind::Char | FdKind::Pseudo | FdKind::None => OffKind::Other,
    }
}

/// Direction of a syscall's byte count (its return value when positive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDir {
    Read,
    Write,
    None,
}

pub fn io_dir(nr: i32) -> IoDir {
    io_dir_named(&syscall_name(nr))
}

fn io_dir_named(name: &str) -> IoDir {
    match name {
        "read" | "pread64" | "readv" | "preadv" | "preadv2" | "recvfrom" | "recvmsg" => IoDir::Read,
        "write" | "pwrite64" | "writev" | "pwritev" | "pwritev2" | "sendto" | "sendmsg" => {
            IoDir::Write
        }
        _ => IoDir::None,
    }
}

/// What a thread that blocked (not preempted) was waiting for.
///
/// A user thread can only block inside a syscall or an exception, so a
/// blocked thread with no syscall in flight was in a page fault.
pub fn offcpu_kind(syscall: Option<i32>, fd_kind: FdKind) -> OffKind {
    let Some(nr) = syscall else {
        return OffKind::Fault;
    };
    match syscall_name(nr).as_ref() {
        "nanosleep" | "clock_nanosleep" | "pause" | "rt_sigsuspend" | "rt_sigtimedwait" => {
            OffKind::Sleep
        }
        "futex" | "futex_waitv" | "futex_wait" | "wait4" | "waitid" | "msgrcv" | "msgsnd"
        | "semop" | "semtimedop" | "mq_timedreceive" | "mq_timedsend" => OffKind::Ipc,
        "mmap" | "munmap" | "mremap" | "mprotect" | "madvise" | "brk" | "mlock" | "mlock2"
        | "munlock" | "mlockall" | "msync" | "userfaultfd" => OffKind::Fault,
        "open" | "openat" | "openat2" | "creat" | "stat" | "lstat" | "newfstatat" | "statx"
        | "access" | "faccessat" | "faccessat2" | "unlink" | "unlinkat" | "rename" | "renameat"
        | "renameat2" | "mkdir" | "mkdirat" | "rmdir" | "readlink" | "readlinkat" | "sync"
        | "truncate" | "chdir" | "execve" | "execveat" => OffKind::File,
        // Waits on a set of fds we only know the first of (or none).
        "select" | "pselect6" | "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => match fd_kind {
            FdKind::Anon | FdKind::None => OffKind::Other,
            k => wait_on_fd(k),
        },
        _ => wait_on_fd(fd_kind),
    }
}

/// Where a cpu-clock sample's kernel stack (innermost first) found its
/// thread: inside a read or write of a file (`File`) or of a network socket
/// (`Net`); None in any other call or none. With syscalls not hooked, this
/// is what tells a loader's CPU time spent moving data (a page-cache copy,
/// setting up direct I/O) from its time computing. A pipe or Unix socket is
/// the job talking to itself, not input.
pub fn sampled_io(kernel_frames: &[Frame]) -> Option<OffKind> {
    let call = kernel_frames.iter().find_map(|f| {
        let n = f.function.as_str();
        ["__x64_sys_", "__se_sys_", "__do_sys_", "ksys_"]
            .iter()
            .find_map(|p| n.strip_prefix(p))
    })?;
    let has = |prefixes: &[&str]| {
        kernel_frames
            .iter()
            .any(|f| prefixes.iter().any(|p| f.function.starts_with(p)))
    };
    // The calls whose result is a byte count, and those that move data
    // but count otherwise (messages) or between two descriptors.
    let data = io_dir_named(call) != IoDir::None
        || matches!(
            call,
            "recvmmsg" | "sendmmsg" | "sendfile64" | "splice" | "copy_file_range"
        );
    if !data || has(&["unix_", "pipe_", "anon_pipe"]) {
        None
    } else if has(&["tcp_", "udp_", "inet_", "inet6_", "sock_", "__sock_", "sk_"]) {
        Some(OffKind::Net)
    } else {
        Some(OffKind::File)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_inside_reads_and_receives_are_io() {
        let stack = |names: &[&str]| -> Vec<Frame> {
            names
                .iter()
                .map(|n| Frame {
                    function: n.to_string(),
                    module: String::new(),
                })
                .collect()
        };
        let direct = stack(&[
            "iov_iter_extract_pages",
            "iomap_dio_bio_iter",
            "iomap_dio_rw",
            "ext4_file_read_iter",
            "vfs_read",
            "__x64_sys_pread64",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
        ]);
        assert_eq!(sampled_io(&direct), Some(OffKind::File));
        let cached = stack(&["copy_user_generic", "filemap_read", "vfs_read", "ksys_read"]);
        assert_eq!(sampled_io(&cached), Some(OffKind::File));
        let recv = stack(&[
            "tcp_recvmsg",
            "inet_recvmsg",
            "sock_recvmsg",
            "__x64_sys_recvfrom",
        ]);
        assert_eq!(sampled_io(&recv), Some(OffKind::Net));
        let socket_read = stack(&["tcp_recvmsg", "sock_read_iter", "vfs_read", "ksys_read"]);
        assert_eq!(sampled_io(&socket_read), Some(OffKind::Net));
        let pipe = stack(&["anon_pipe_read", "vfs_read", "ksys_read"]);
        assert_eq!(sampled_io(&pipe), None);
        let unix = stack(&[
            "unix_stream_read_generic",
            "sock_recvmsg",
            "__x64_sys_recvfrom",
        ]);
        assert_eq!(sampled_io(&unix), None);
        let futex = stack(&["futex_wake", "__x64_sys_futex"]);
        assert_eq!(sampled_io(&futex), None);
        // An interrupt while in user code, and a page fault: computing.
        assert_eq!(
            sampled_io(&stack(&["handle_softirqs", "asm_common_interrupt"])),
            None
        );
        assert_eq!(
            sampled_io(&stack(&["handle_mm_fault", "exc_page_fault"])),
            None
        );
        assert_eq!(sampled_io(&[]), None);
    }

    #[test]
    fn names() {
        assert_eq!(syscall_name(0), "read");
        assert_eq!(syscall_name(202), "futex");
        assert_eq!(syscall_name(230), "clock_nanosleep");
        assert_eq!(syscall_name(-1), "syscall_-1");
        assert_eq!(syscall_name(9999), "syscall_9999");
    }

    #[test]
    fn the_waits_the_tests_arrange() {
        assert_eq!(offcpu_kind(Some(0), FdKind::File), OffKind::File); // O_DIRECT read
        assert_eq!(offcpu_kind(Some(17), FdKind::Block), OffKind::File); // pread64
        assert_eq!(offcpu_kind(Some(202), FdKind::None), OffKind::Ipc); // futex
        assert_eq!(offcpu_kind(Some(0), FdKind::Pipe), OffKind::Ipc); // pipe read
        assert_eq!(offcpu_kind(Some(45), FdKind::SockInet), OffKind::Net); // recvfrom
        assert_eq!(offcpu_kind(Some(45), FdKind::SockUnix), OffKind::Ipc);
        assert_eq!(offcpu_kind(Some(230), FdKind::None), OffKind::Sleep); // clock_nanosleep
        assert_eq!(offcpu_kind(Some(35), FdKind::None), OffKind::Sleep); // nanosleep
        assert_eq!(offcpu_kind(Some(16), FdKind::Gpu), OffKind::Gpu); // ioctl /dev/nvidia*
        assert_eq!(offcpu_kind(None, FdKind::None), OffKind::Fault);
        assert_eq!(offcpu_kind(Some(7), FdKind::Pipe), OffKind::Ipc); // poll on a pipe
        assert_eq!(offcpu_kind(Some(232), FdKind::Anon), OffKind::Other); // epoll_wait
                                                                          // A socket is classified by its family whatever the call.
        assert_eq!(offcpu_kind(Some(288), FdKind::SockUnix), OffKind::Ipc); // accept4
        assert_eq!(offcpu_kind(Some(43), FdKind::SockInet), OffKind::Net); // accept
        assert_eq!(offcpu_kind(Some(42), FdKind::SockUnix), OffKind::Ipc); // connect
        assert_eq!(offcpu_kind(Some(42), FdKind::None), OffKind::Other);
    }

    #[test]
    fn byte_directions() {
        assert_eq!(io_dir(0), IoDir::Read);
        assert_eq!(io_dir(45), IoDir::Read);
        assert_eq!(io_dir(1), IoDir::Write);
        assert_eq!(io_dir(202), IoDir::None);
    }
}
