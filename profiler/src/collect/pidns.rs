//! Processes in other pid and network namespaces (containers).
//!
//! A dormant shim listens on an abstract socket named after its pid in its
//! own pid namespace and that namespace's inode. Abstract sockets belong to
//! a network namespace, so attach connects from inside the target's: a
//! short-lived thread enters it (`setns` changes only the calling thread,
//! and a socket keeps the namespace it was created in).
//!
//! A shim in a child pid namespace also reports its threads by the ids that
//! namespace gives them, while eBPF sees host ids; [`HostIds`] translates.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use gapscope_wire::transport::{control_socket_name, namespace_inode};
use gapscope_wire::GpuRecord;

/// The ids of a process or thread from the `NSpid:` line of its
/// `/proc/<id>/status`: outermost namespace (the one /proc was mounted
/// for) first, its own namespace last. None without such a line (kernels
/// before 4.1) or when it does not parse.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids = line
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<Vec<u32>>>()?;
    (!ids.is_empty()).then_some(ids)
}

/// The id its own pid namespace gives process `pid` (in a container, what
/// the process itself sees as its pid).
pub fn own_pid(pid: u32) -> Option<u32> {
    innermost_id(Path::new(&format!("/proc/{pid}/status")))
}

/// The id its own pid namespace gives the process or thread whose status
/// file is `status` (the last `NSpid:` field).
fn innermost_id(status: &Path) -> Option<u32> {
    parse_nspid(&std::fs::read_to_string(status).ok()?)?
        .last()
        .copied()
}

/// Inode of the namespace of `kind` ("pid", "net") that `pid` lives in.
pub fn namespace_of(pid: u32, kind: &str) -> Option<u64> {
    namespace_inode(Path::new(&format!("/proc/{pid}/ns/{kind}")))
}

/// Inode of the calling thread's namespace of `kind`.
fn own_namespace(kind: &str) -> Option<u64> {
    namespace_inode(Path::new(&format!("/proc/thread-self/ns/{kind}")))
}

/// The control socket name of the shim in process `pid` (as we number it).
pub fn control_socket_of(pid: u32) -> Option<String> {
    let nspid = own_pid(pid)?;
    Some(control_socket_name(nspid, namespace_of(pid, "pid")?))
}

/// Connects to the control socket of the shim in process `pid`, from
/// inside its network namespace when that is not ours. The caller still has
/// to check who answered (the peer's pid).
pub fn connect_control(pid: u32) -> io::Result<UnixStream> {
    let not_found = || io::Error::new(io::ErrorKind::NotFound, format!("no such process {pid}"));
    let name = control_socket_of(pid).ok_or_else(not_found)?;
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let theirs = namespace_of(pid, "net").ok_or_else(not_found)?;
    if own_namespace("net") == Some(theirs) {
        return UnixStream::connect_addr(&addr);
    }
    // Opened here, so that the thread enters the namespace of the process
    // that was looked up above, not of one that replaced it since.
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    if namespace_inode(Path::new(&format!("/proc/self/fd/{}", netns.as_raw_fd()))) != Some(theirs) {
        return Err(not_found());
    }
    std::thread::Builder::new()
        .name("gapscope-netns".into())
        .spawn(move || {
            // SAFETY: setns on an fd we hold; it moves only this thread,
            // which ends right after connecting.
            if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            UnixStream::connect_addr(&addr)
        })?
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
}

/// How often the thread map of a process may be reread at most.
const REREAD: Duration = Duration::from_secs(1);

/// How long the ids of a thread that has ended are kept, from the first
/// reread that finds it gone. Its last API records can come after it ended:
/// the shim sends what it has every 250 ms and when its process exits, so a
/// minute is far more than any of them takes; keeping ended threads for
/// good would keep every thread a long-lived process ever had.
const ENDED_THREAD_KEPT: Duration = Duration::from_secs(60);

/// Turns the namespace-local pid and tids in a shim's CUDA API records
/// into the ids we (and eBPF) use, for a process in another pid namespace;
/// does nothing for one in ours.
pub struct HostIds {
    /// The process as we number it.
    pid: u32,
    /// Its pid in its own namespace; None when that namespace is ours.
    nspid: Option<u32>,
    /// Namespace-local tid -> ours, and since when the thread has been
    /// found gone (None while alive).
    tids: HashMap<u32, (u32, Option<Instant>)>,
    read_at: Option<Instant>,
}

impl HostIds {
    pub fn new(pid: u32) -> HostIds {
        let theirs = namespace_of(pid, "pid");
        let nspid = if theirs.is_some() && theirs != own_namespace("pid") {
            innermost_id(Path::new(&format!("/proc/{pid}/status")))
        } else {
            None
        };
        HostIds {
            pid,
            nspid,
            tids: HashMap::new(),
            read_at: None,
        }
    }

    /// Rereads the process's threads, unless that was done less than
    /// [`REREAD`] ago.
    fn reread(&mut self) {
        if self.read_at.is_some_and(|t| t.elapsed() < REREAD) {
            return;
        }
        let now = Instant::now();
        self.read_at = Some(now);
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        let alive: Vec<(u32, u32)> = dir
            .flatten()
            .filter_map(|task| {
                let ours = task.file_name().to_str()?.parse().ok()?;
                Some((innermost_id(&task.path().join("status"))?, ours))
            })
            .collect();
        self.saw(alive, now);
    }

    /// Takes in the threads alive at `now` (namespace-local tid, ours) and
    /// forgets those found gone [`ENDED_THREAD_KEPT`] ago or more.
    fn saw(&mut self, alive: impl IntoIterator<Item = (u32, u32)>, now: Instant) {
        let alive: HashMap<u32, u32> = alive.into_iter().collect();
        self.tids.retain(|theirs, (_, gone)| {
            if alive.contains_key(theirs) {
                return true;
            }
            let since = *gone.get_or_insert(now);
            now.duration_since(since) < ENDED_THREAD_KEPT
        });
        for (theirs, ours) in alive {
            self.tids.insert(theirs, (ours, None));
        }
    }

    fn host_tid(&mut self, tid: u32) -> Option<u32> {
        if !self.tids.contains_key(&tid) {
            self.reread();
        }
        self.tids.get(&tid).map(|&(ours, _)| ours)
    }

    /// Rewrites the pid and tid of API records. A thread that ended before
    /// its records could be matched keeps its namespace-local id.
    pub fn translate(&mut self, records: &mut [GpuRecord]) {
        let Some(nspid) = self.nspid else { return };
        for r in records {
            if let GpuRecord::Api { pid, tid, .. } = r {
                if *pid == nspid {
                    *pid = self.pid;
                }
                if let Some(host) = self.host_tid(*tid) {
                    *tid = host;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lists_every_level_outermost_first() {
        let status = "Name:\tpython\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\t1\nNSpgid:\t1\n";
        assert_eq!(parse_nspid(status), Some(vec![4242, 17, 1]));
        assert_eq!(parse_nspid("Pid:\t9\nNSpid:\t9\n"), Some(vec![9]));
        // No line (old kernels), an empty one, or garbage: nothing.
        assert_eq!(parse_nspid("Name:\tx\nPid:\t9\n"), None);
        assert_eq!(parse_nspid("NSpid:\t\n"), None);
        assert_eq!(parse_nspid("NSpid:\t12\tx\n"), None);
        // NSpgid and NSsid are other lines.
        assert_eq!(parse_nspid("NSpgid:\t3\nNSsid:\t3\n"), None);
    }

    #[test]
    fn our_own_process_is_in_our_namespaces() {
        let me = std::process::id();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let ids = parse_nspid(&status).expect("an NSpid line");
        assert_eq!(ids[0], me);
        assert_eq!(namespace_of(me, "pid"), own_namespace("pid"));
        assert!(namespace_of(me, "net").is_some());
        assert_eq!(
            control_socket_of(me),
            Some(gapscope_wire::transport::local_control_socket_name(
                *ids.last().unwrap()
            ))
        );
        // Nothing to translate for a process of our own namespace.
        let mut ids = HostIds::new(me);
        let mut records = vec![GpuRecord::Api {
            domain: gapscope_wire::ApiDomain::Runtime,
            cbid: 1,
            start: 1,
            end: 2,
            pid: 1,
            tid: 1,
            correlation: 1,
        }];
        let before = records.clone();
        ids.translate(&mut records);
        assert_eq!(records, before);
    }

    /// A long-lived process whose threads come and go: the ids of ended
    /// threads are kept for a while, for their last records, then
    /// forgotten, so the map holds what is alive, not every thread ever.
    #[test]
    fn ended_threads_are_forgotten_after_a_while() {
        let mut ids = HostIds {
            pid: 4242,
            nspid: Some(1),
            tids: HashMap::new(),
            read_at: None,
        };
        let t0 = Instant::now();
        let main = (1, 4242);
        // One short-lived thread per second for three hours.
        const THREADS: u32 = 3 * 3600;
        for i in 0..THREADS {
            let now = t0 + Duration::from_secs(i as u64);
            ids.saw([main, (i + 2, 100_000 + i)], now);
            assert!(ids.tids.len() <= 2 + 2 * ENDED_THREAD_KEPT.as_secs() as usize);
            // The one before last ended a second ago: still translated.
            if i > 0 {
                assert_eq!(ids.tids[&(i + 1)].0, 100_000 + i - 1);
            }
        }
        assert!(ids.tids.len() < THREADS as usize / 100);
        assert_eq!(ids.tids[&1].0, 4242);
        // Found gone a minute ago or more: forgotten.
        let later = t0 + Duration::from_secs(THREADS as u64) + ENDED_THREAD_KEPT;
        ids.saw([main], later);
        ids.saw([main], later + ENDED_THREAD_KEPT);
        assert_eq!(ids.tids.len(), 1);
    }
}
