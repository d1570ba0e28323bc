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

use gapscope_cupti::transport::{control_socket_name, namespace_inode};
use gapscope_cupti::GpuRecord;

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
    let nspid = innermost_id(Path::new(&format!("/proc/{pid}/status")))?;
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

/// Turns the namespace-local pid and tids in a shim's CUDA API records
/// into the ids we (and eBPF) use, for a process in another pid namespace;
/// does nothing for one in ours.
pub struct HostIds {
    /// The process as we number it.
    pid: u32,
    /// Its pid in its own namespace; None when that namespace is ours.
    nspid: Option<u32>,
    /// Namespace-local tid -> ours.
    tids: HashMap<u32, u32>,
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
        self.read_at = Some(Instant::now());
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        for task in dir.flatten() {
            let Some(ours) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some(theirs) = innermost_id(&task.path().join("status")) {
                self.tids.insert(theirs, ours);
            }
        }
    }

    fn host_tid(&mut self, tid: u32) -> Option<u32> {
        if !self.tids.contains_key(&tid) {
            self.reread();
        }
        self.tids.get(&tid).copied()
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
            Some(gapscope_cupti::transport::local_control_socket_name(
                *ids.last().unwrap()
            ))
        );
        // Nothing to translate for a process of our own namespace.
        let mut ids = HostIds::new(me);
        let mut records = vec![GpuRecord::Api {
            domain: gapscope_cupti::ApiDomain::Runtime,
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
}
