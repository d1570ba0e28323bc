//! Process and thread metadata from /proc, for the target tree only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::io::Read;
use std::path::Path;

use crate::session::{FdKind, FdPath, IoCounters, MapRange, ProcessInfo, Rank, ThreadSeed};

/// The most of a process's environment read: it is the process's to make
/// as large as its stack allows, and what is wanted of it is a few names.
const ENVIRON_CAP: u64 = 1 << 20;

/// The environment process `pid` was started with (as exec gave it),
/// names to values, at most [`ENVIRON_CAP`] bytes of it. Only ever read
/// for processes of the target tree; values are theirs, so callers parse
/// them, never follow them.
pub fn environ(pid: u32) -> BTreeMap<String, String> {
    let mut raw = Vec::new();
    let read = fs::File::open(format!("/proc/{pid}/environ"))
        .and_then(|f| f.take(ENVIRON_CAP).read_to_end(&mut raw));
    if read.is_err() {
        return BTreeMap::new();
    }
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Which rank of a multi-process job a process is, as its launcher told it
/// (torchrun and torch.distributed's `RANK`/`WORLD_SIZE`, Open MPI's,
/// PMI's (MPICH, Intel MPI), Slurm's tasks), when the job has more than one.
pub fn rank_of(env: &BTreeMap<String, String>) -> Option<Rank> {
    const NAMES: [(&str, &str); 4] = [
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ];
    NAMES.iter().find_map(|(rank, world)| {
        let rank: u32 = env.get(*rank)?.trim().parse().ok()?;
        let world: u32 = env.get(*world)?.trim().parse().ok()?;
        (world > 1 && rank < world).then_some(Rank { rank, world })
    })
}

/// `(comm, state, ppid)` from /proc/<pid>[/task/<tid>]/stat. The comm may
/// hold spaces and parentheses, so it is cut at the last ')'.
pub fn parse_stat(stat: &str) -> Option<(String, char, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((comm, state, ppid))
}

fn stat_of(path: &Path) -> Option<(String, char, u32)> {
    parse_stat(&fs::read_to_string(path).ok()?)
}

pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Owner uid of a process.
pub fn owner_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// `buf.len()` bytes of process `pid`'s memory at `addr`.
pub fn read_memory(pid: u32, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`; the remote one is only read.
    let n = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    match n {
        n if n as usize == buf.len() => Ok(()),
        -1 => Err(std::io::Error::last_os_error()),
        _ => Err(std::io::ErrorKind::UnexpectedEof.into()),
    }
}

/// Who a process runs as: its user and group ids as the kernel lists them
/// (real, effective, saved, file system) and the owner of its /proc entry
/// (root when the kernel marks it not dumpable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
    pub owner: u32,
}

impl Credentials {
    /// Whether it runs as `uid` and nothing more: every user id that, one
    /// group throughout (not setgid), and dumpable.
    pub fn all_of(&self, uid: u32) -> bool {
        !self.uids.is_empty()
            && self.uids.iter().all(|&u| u == uid)
            && self.gids.windows(2).all(|w| w[0] == w[1])
            && self.owner == uid
    }
}

pub fn credentials(pid: u32) -> Option<Credentials> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    Some(Credentials {
        uids: ids("Uid:"),
        gids: ids("Gid:"),
        owner: owner_uid(pid)?,
    })
}

/// `root` and every process below it, breadth first.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((_, _, ppid)) = stat_of(&entry.path().join("stat")) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = vec![root];
    let mut queue = VecDeque::from([root]);
    while let Some(pid) = queue.pop_front() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(child);
            queue.push_back(child);
        }
    }
    out
}

pub fn threads(pid: u32) -> Vec<u32> {
    let mut tids: Vec<u32> = fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// The process's command line; only ever read for processes of the target tree.
pub fn process_info(pid: u32) -> Option<ProcessInfo> {
    let (comm, _, ppid) = stat_of(Path::new(&format!("/proc/{pid}/stat")))?;
    let argv = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default();
    Some(ProcessInfo {
        pid,
        ppid,
        comm,
        argv,
    })
}

/// A thread's state now, and what it is blocked in, for attach.
pub fn thread_seed(pid: u32, tid: u32) -> Option<ThreadSeed> {
    let base = format!("/proc/{pid}/task/{tid}");
    let (comm, state, _) = stat_of(Path::new(&format!("{base}/stat")))?;
    // A zombie (a worker that finished and waits to be reaped) runs no code
    // and holds no CPU: seeded, it would read as a thread running for the
    // whole recording, one that kept the CPU from the threads waiting.
    if matches!(state, 'Z' | 'X' | 'x') {
        return None;
    }
    // "<nr> <arg0> ..." while in a syscall, "running" or "-1 ..." otherwise.
    let syscall_line = fs::read_to_string(format!("{base}/syscall")).unwrap_or_default();
    let mut fields = syscall_line.split_whitespace();
    let syscall = fields
        .next()
        .and_then(|s| s.parse::<i32>().ok())
        .filter(|&n| n >= 0);
    let arg0 = fields
        .next()
        .and_then(|s| i64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let fd_kind = match (syscall, arg0) {
        (Some(_), Some(fd)) if (0..1 << 20).contains(&fd) => fd_kind_of(pid, fd as i32),
        _ => FdKind::None,
    };
    Some(ThreadSeed {
        pid,
        tid,
        comm,
        state,
        syscall,
        fd_kind,
    })
}

/// The same classification the kernel side makes, from /proc's view.
pub fn fd_kind_of(pid: u32, fd: i32) -> FdKind {
    let Ok(target) = fs::read_link(format!("/proc/{pid}/fd/{fd}")) else {
        return FdKind::None;
    };
    let target = target.to_string_lossy();
    if let Some(inode) = target
        .strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
    {
        let unix = fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
        let is_unix = unix
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(6) == Some(inode));
        return if is_unix {
            FdKind::SockUnix
        } else {
            FdKind::SockInet
        };
    }
    if target.starts_with("pipe:") {
        return FdKind::Pipe;
    }
    if target.starts_with("anon_inode:") {
        return FdKind::Anon;
    }
    if target.starts_with("/dev/nvidia") {
        return FdKind::Gpu;
    }
    if target.starts_with("/proc/") || target.starts_with("/sys/") {
        return FdKind::Pseudo;
    }
    use std::os::unix::fs::FileTypeExt;
    match fs::metadata(format!("/proc/{pid}/fd/{fd}")) {
        Ok(m) if m.file_type().is_block_device() => FdKind::Block,
        Ok(m) if m.file_type().is_char_device() => FdKind::Char,
        Ok(m) if m.file_type().is_fifo() => FdKind::Pipe,
        Ok(_) => FdKind::File,
        Err(_) => FdKind::None,
    }
}

/// A thread's I/O counters (`/proc/PID/task/TID/io`).
pub fn thread_io(pid: u32, tid: u32) -> Option<IoCounters> {
    parse_io(&fs::read_to_string(format!("/proc/{pid}/task/{tid}/io")).ok()?)
}

pub fn parse_io(text: &str) -> Option<IoCounters> {
    let mut io = IoCounters::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let Ok(value) = value.trim().parse() else {
            continue;
        };
        let field = match key {
            "rchar" => &mut io.rchar,
            "wchar" => &mut io.wchar,
            "syscr" => &mut io.syscr,
            "syscw" => &mut io.syscw,
            "read_bytes" => &mut io.read_bytes,
            "write_bytes" => &mut io.write_bytes,
            _ => continue,
        };
        *field = value;
        seen += 1;
    }
    (seen == 6).then_some(io)
}

/// The machine's idle CPU time since boot, summed over its CPUs, in ns.
pub fn machine_idle_ns() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    parse_idle(
        &fs::read_to_string("/proc/stat").ok()?,
        u64::try_from(hz).ok()?,
    )
}

/// `idle` + `iowait` of /proc/stat's `cpu` line (ticks of `hz`), in ns: a
/// CPU waiting for I/O runs nothing and could run a thread.
pub fn parse_idle(stat: &str, hz: u64) -> Option<u64> {
    let mut f = stat.lines().next()?.split_whitespace();
    if f.next()? != "cpu" || hz == 0 {
        return None;
    }
    let ticks: Vec<u64> = f.take(5).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some(idle.saturating_mul(1_000_000_000 / hz))
}

/// Paths of a process's open fds.
pub fn fd_paths(pid: u32) -> Vec<FdPath> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut out: Vec<FdPath> = dir
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            let path = fs::read_link(e.path()).ok()?.to_string_lossy().into_owned();
            Some(FdPath { pid, fd, path })
        })
        .collect();
    out.sort_by_key(|f| f.fd);
    out
}

/// Executable mappings of a process, as symbolization needs them.
pub fn exec_maps(pid: u32) -> Option<Vec<MapRange>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(parse_maps(&text))
}

pub fn parse_maps(text: &str) -> Vec<MapRange> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            if !perms.contains('x') {
                return None;
            }
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.collect::<Vec<_>>().join(" ");
            let (start, end) = range.split_once('-')?;
            Some(MapRange {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                path,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that exited and was not reaped yet is no thread to record.
    #[test]
    fn a_zombie_is_not_seeded() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let zombie =
            || stat_of(Path::new(&format!("/proc/{pid}/stat"))).is_some_and(|s| s.1 == 'Z');
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !zombie() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(zombie());
        assert_eq!(thread_seed(pid, pid), None);
        child.wait().unwrap();
        let me = std::process::id();
        assert!(thread_seed(me, me).is_some());
    }

    #[test]
    fn io_counters_of_this_thread_follow_its_reads() {
        let me = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let before = thread_io(me, tid).expect("own io readable");
        let bytes = std::fs::read("/proc/self/stat").unwrap().len() as u64;
        let after = thread_io(me, tid).unwrap();
        // The read of the io file itself counts too; the stat read at least.
        assert!(after.since(&before).rchar >= bytes, "{before:?} {after:?}");
        assert!(after.syscr > before.syscr);
        assert_eq!(parse_io("rchar: 1\nwchar: 2\n"), None);
    }

    #[test]
    fn idle_is_idle_plus_iowait() {
        let stat = "cpu  100 2 50 4000 30 0 5 0 0 0\ncpu0 50 1 25 2000 15 0 2 0 0 0\n";
        assert_eq!(parse_idle(stat, 100), Some(4030 * 10_000_000));
        assert_eq!(parse_idle("cpu0 1 2 3 4 5\n", 100), None);
        assert_eq!(parse_idle("cpu  1 2 3\n", 100), None);
        // The machine's own counter moves forward between two readings.
        let a = machine_idle_ns().expect("/proc/stat readable");
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(machine_idle_ns().unwrap() >= a);
    }

    #[test]
    fn stat_with_odd_comm() {
        let (comm, state, ppid) =
            parse_stat("42 (a (weird) name) S 7 42 42 0 -1 4194560 0 0").unwrap();
        assert_eq!((comm.as_str(), state, ppid), ("a (weird) name", 'S', 7));
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn maps_keep_executable_ranges_only() {
        let text = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 123 /usr/bin/python3.11
55d0c0001000-55d0c0200000 r-xp 00001000 08:01 123 /usr/bin/python3.11
7f0000000000-7f0000001000 rwxp 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].start, 0x55d0c0001000);
        assert_eq!(maps[0].offset, 0x1000);
        assert_eq!(maps[0].path, "/usr/bin/python3.11");
        assert_eq!(maps[1].path, "");
        assert_eq!(maps[2].path, "[vdso]");
    }

    #[test]
    fn descendants_of_self_include_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let tree = descendants(me);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(tree[0], me);
        assert!(tree.contains(&child.id()), "{tree:?} lacks {}", child.id());
    }

    #[test]
    fn seed_of_a_thread_blocked_on_a_pipe() {
        let mut child = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until cat is blocked in read(0) on the pipe.
        let mut seed = None;
        for _ in 0..200 {
            let s = thread_seed(pid, pid).unwrap();
            if s.state == 'S' && s.syscall == Some(0) {
                seed = Some(s);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let seed = seed.expect("cat never blocked in read");
        assert_eq!(seed.fd_kind, FdKind::Pipe);
        assert_eq!(seed.comm, "cat");
    }
}
