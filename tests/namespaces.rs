//! Attach across namespaces: dormant shims in processes with their own pid
//! and network namespaces (containers), started under `unshare`, found and
//! told apart the way `gapscope attach` finds them. Needs root (unshare,
//! setns); without it the tests skip, unless GAPSCOPE_REQUIRE_BPF=1.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gapscope::collect::pidns::{self, HostIds};
use gapscope::collect::procfs;
use gapscope_tests::*;
use gapscope_wire::protocol::Frame;
use gapscope_wire::{ApiDomain, GpuRecord};

/// Generous: the machine may be a loaded 2-core one.
const DEADLINE: Duration = Duration::from_secs(60);

/// Returns false (after saying so) when namespaces cannot be made here;
/// panics instead when `GAPSCOPE_REQUIRE_BPF=1`.
fn namespaces_ready(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("not running as root")
    } else if Command::new("unshare")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        Some("no unshare(1)")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var("GAPSCOPE_REQUIRE_BPF").as_deref() == Ok("1") => {
            panic!("{test}: root is required (GAPSCOPE_REQUIRE_BPF=1) but {why}")
        }
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// gs-inject-host processes with a dormant shim, in namespaces of their
/// own, as we number them; all killed when dropped.
struct Contained {
    launcher: Child,
    hosts: Vec<u32>,
}

impl Contained {
    /// `shell` runs with $0 = gs-inject-host and starts `count` of them.
    fn start(unshare: &[&str], shell: &str, count: usize) -> Contained {
        let mut launcher = Command::new("unshare")
            .args(unshare)
            .args(["sh", "-c", shell])
            .arg(bin("gs-inject-host"))
            .env("CUDA_INJECTION64_PATH", shim())
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so")
            .env_remove("GAPSCOPE_SOCKET")
            .env("GS_HOLD_MS", "300000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("running unshare");
        let deadline = Instant::now() + DEADLINE;
        let hosts = loop {
            let found = hosts_under(launcher.id());
            if found.len() == count {
                break found;
            }
            if let Ok(Some(status)) = launcher.try_wait() {
                panic!("unshare ended ({status}) before starting {count} hosts");
            }
            assert!(
                Instant::now() < deadline,
                "{count} hosts did not start under unshare: {found:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let c = Contained { launcher, hosts };
        for &h in &c.hosts {
            wait_listening(h);
        }
        c
    }

    /// One host, pid 1 of its own pid and network namespaces.
    fn alone() -> Contained {
        Contained::start(
            &["--net", "--pid", "--fork", "--mount-proc"],
            r#"exec "$0""#,
            1,
        )
    }

    /// Two hosts, each pid 1 of its own pid namespace, sharing one network
    /// namespace (two containers of one pod).
    fn two_sharing_a_network() -> Contained {
        Contained::start(
            &["--net"],
            r#"unshare --pid --fork --mount-proc "$0" &
               unshare --pid --fork --mount-proc "$0" &
               wait"#,
            2,
        )
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        for &h in &self.hosts {
            // SAFETY: kill on pids we started (SIGKILL reaches a namespace's
            // pid 1 from its parent namespace).
            unsafe { libc::kill(h as i32, libc::SIGKILL) };
        }
        let deadline = Instant::now() + DEADLINE;
        while matches!(self.launcher.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

/// The gs-inject-host processes descending from `root`, sorted.
fn hosts_under(root: u32) -> Vec<u32> {
    let mut found: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| {
            procfs::process_info(pid).is_some_and(|i| i.comm == "gs-inject-host")
                && descends_from(pid, root)
        })
        .collect();
    found.sort_unstable();
    found
}

fn descends_from(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..16 {
        match procfs::process_info(p) {
            Some(i) if i.ppid == root => return true,
            Some(i) if i.ppid > 1 => p = i.ppid,
            _ => return false,
        }
    }
    false
}

/// Waits until the shim of `pid` listens on its control socket, read from
/// the socket table of its network namespace (no connection made).
fn wait_listening(pid: u32) {
    let name = pidns::control_socket_of(pid).expect("the host's namespaces are readable");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
        if table
            .lines()
            .any(|l| l.split_whitespace().last() == Some(&format!("@{name}")))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} never listened on @{name}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid (as we number it) of the process at the other end.
fn peer_pid(s: &UnixStream) -> i32 {
    gapscope_wire::transport::peer_cred(s)
        .expect("SO_PEERCRED")
        .pid
}

/// Connects to the shim of `pid` as attach does, checks who answered, and
/// leaves at once; returns every frame the shim sent.
fn attach_and_leave(pid: u32) -> Vec<Frame> {
    let conn = pidns::connect_control(pid)
        .unwrap_or_else(|e| panic!("connecting to the shim of {pid}: {e}"));
    assert_eq!(peer_pid(&conn), pid as i32, "answered by another process");
    conn.set_read_timeout(Some(DEADLINE)).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut bytes = Vec::new();
    (&conn).read_to_end(&mut bytes).unwrap();
    let frames = frames_of(&bytes);
    assert!(matches!(frames.last(), Some(Frame::Goodbye)), "{frames:?}");
    frames
}

fn hello_pid(frames: &[Frame]) -> u32 {
    match frames.first() {
        Some(Frame::Hello(h)) => h.pid,
        _ => panic!("first frame is not Hello: {frames:?}"),
    }
}

fn own(kind: &str) -> u64 {
    pidns::namespace_of(std::process::id(), kind).unwrap()
}

#[test]
fn a_shim_in_its_own_pid_and_network_namespaces_is_reached() {
    if !namespaces_ready("a_shim_in_its_own_pid_and_network_namespaces_is_reached") {
        return;
    }
    let c = Contained::alone();
    let host = c.hosts[0];
    assert_ne!(pidns::namespace_of(host, "net"), Some(own("net")));
    assert_ne!(pidns::namespace_of(host, "pid"), Some(own("pid")));
    let frames = attach_and_leave(host);
    // The shim numbers itself as its namespace does.
    assert_eq!(hello_pid(&frames), 1);
    // It can be reached again: the shim listens on after a profiler leaves.
    assert_eq!(hello_pid(&attach_and_leave(host)), 1);

    // Its API records' ids become ours.
    let main_thread = GpuRecord::Api {
        domain: ApiDomain::Runtime,
        cbid: 1,
        start: 1,
        end: 2,
        pid: 1,
        tid: 1,
        correlation: 1,
    };
    let mut records = vec![main_thread.clone()];
    HostIds::new(host).translate(&mut records);
    match &records[0] {
        GpuRecord::Api { pid, tid, .. } => assert_eq!((*pid, *tid), (host, host)),
        other => panic!("{other:?}"),
    }
    // And those of a process in our namespace stay as they are.
    let mut records = vec![main_thread.clone()];
    HostIds::new(std::process::id()).translate(&mut records);
    assert_eq!(records, vec![main_thread]);
}

#[test]
fn two_pid_1s_sharing_a_network_namespace_are_told_apart() {
    if !namespaces_ready("two_pid_1s_sharing_a_network_namespace_are_told_apart") {
        return;
    }
    let c = Contained::two_sharing_a_network();
    let (a, b) = (c.hosts[0], c.hosts[1]);
    assert_eq!(pidns::namespace_of(a, "net"), pidns::namespace_of(b, "net"));
    assert_ne!(pidns::namespace_of(a, "net"), Some(own("net")));
    assert_ne!(pidns::namespace_of(a, "pid"), pidns::namespace_of(b, "pid"));
    // Both are pid 1 where they live, yet their names differ, and both are
    // bound (Contained waited for each in the shared socket table).
    assert_ne!(pidns::control_socket_of(a), pidns::control_socket_of(b));
    for host in [a, b] {
        // connect_control checks nothing itself; attach_and_leave asserts
        // the answer came from `host`.
        assert_eq!(hello_pid(&attach_and_leave(host)), 1, "pid {host}");
    }
}

#[test]
fn gapscope_attach_reaches_a_shim_in_a_container() {
    if !bpf_ready("gapscope_attach_reaches_a_shim_in_a_container") {
        return;
    }
    let _lock = recording_lock();
    let c = Contained::alone();
    let host = c.hosts[0];
    let dir = scratch("attach-container");
    let rec = dir.path().join("rec");
    let out = attach(&rec, host, "1", &[]);
    assert!(
        out.status.success(),
        "attach failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = report_json(Path::new(&rec));
    let sources = report["gpu_sources"].as_array().expect("gpu_sources");
    assert!(
        sources
            .iter()
            .any(|s| s["pid"].as_u64() == Some(host as u64)
                && s["source"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("gapscope-cupti"))),
        "no GPU source from pid {host}: {sources:?}"
    );
}
