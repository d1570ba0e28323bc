//! What a session begins with, a recording's first or a window's: its
//! header, and the processes and threads of the tree as they are now.

use super::sink::Sink;
use super::{procfs, sys};
use crate::clock;
use crate::session::{Mode, Record, SessionHeader};

/// The header of a session of `pid`'s tree beginning now.
pub(super) fn header(mode: Mode, pid: u32, command: Vec<String>, sample_hz: u64) -> SessionHeader {
    let uname = sys::uname();
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

/// One reading of a thread's I/O counters, if /proc still has the thread.
pub(super) fn push_thread_io(sink: &mut Sink, pid: u32, tid: u32, start: bool) {
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
pub(super) fn seed_process(sink: &mut Sink, pid: u32, whole: bool) {
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
