//! Bringing the shim into running processes with ptrace: real processes,
//! no GPU needed for the injection itself. Each target is checked to carry
//! on exactly as it would have: its output, its exit status, no tracer left.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use gapscope::collect::inject::{self, Limits, Outcome};
use gapscope_cupti::{Decoder, Frame};
use gapscope_tests::*;

fn tracer_of(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

fn shim_mapped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains(gapscope_cupti::LIBRARY_NAME)
}

/// Starts `cmd` and waits for its first line, which must start with `ready`.
fn started(cmd: &mut Command) -> (Child, BufReader<ChildStdout>) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready"), "{line:?}");
    (child, out)
}

fn injected(pid: u32) -> inject::Injected {
    match inject::inject(pid, &shim(), Limits::default()) {
        Ok(Outcome::Injected(i)) => {
            eprintln!("injected: {i:?}");
            i
        }
        other => panic!("not injected: {other:?}"),
    }
}

/// The injected shim listens, dormant, like one from the environment: a
/// profiler that connects and leaves gets a hello and a goodbye.
fn shim_answers(pid: u32) {
    let name = gapscope_cupti::transport::local_control_socket_name(pid);
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut conn = UnixStream::connect_addr(&addr).expect("the shim listens");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    let mut d = Decoder::new();
    d.push(&bytes);
    let mut frames = Vec::new();
    while let Some(f) = d.next_frame().unwrap() {
        frames.push(f);
    }
    assert!(
        matches!(frames.first(), Some(Frame::Hello(_))),
        "{frames:?}"
    );
    assert!(matches!(frames.last(), Some(Frame::Goodbye)), "{frames:?}");
}

fn python() -> Option<String> {
    Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

const PY_BLOCKED: &str = r#"
import ctypes, sys
ctypes.CDLL(sys.argv[1])  # what makes it a GPU process: a libcupti mapped
print("ready", flush=True)
line = sys.stdin.readline()
print("got " + line.strip(), flush=True)
"#;

#[test]
fn a_python_process_blocked_in_read_is_injected_and_reads_on() {
    let Some(python) = python() else {
        eprintln!("skipping: no python3");
        return;
    };
    let standin = bin("libcupti_standin.so");
    let (mut child, mut out) = started(
        Command::new(python)
            .args(["-c", PY_BLOCKED])
            .arg(&standin)
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
    );
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(100)); // in its read by now
    assert!(inject::wants_shim(pid));
    let i = injected(pid);
    assert_eq!(i.pid, pid);
    assert!(i.longest_stop < Duration::from_millis(200), "{i:?}");
    assert!(shim_mapped(pid) && !inject::wants_shim(pid));
    assert_eq!(tracer_of(pid), 0);
    // Loaded once: a second attach finds it.
    assert_eq!(
        inject::inject(pid, &shim(), Limits::default()),
        Ok(Outcome::AlreadyLoaded)
    );
    shim_answers(pid);
    // Its read was restarted, not failed: it gets the line.
    child.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "got hello\n");
    assert!(child.wait().unwrap().success());
}

/// A multithreaded Rust program busy in syscalls, with a 1 ms timer signal
/// and its own handler: injected while it runs, it prints what a bare run
/// prints and exits 0 (any syscall error, EINTR included, would kill it).
#[test]
fn a_busy_multithreaded_process_is_injected_without_noticing() {
    let args = ["busy", "--messages", "3000", "--pace-us", "300"];
    let bare = Command::new(workload()).args(args).output().unwrap();
    assert!(bare.status.success());
    let (mut child, mut out) = started(
        Command::new(workload())
            .args(args)
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
    );
    std::thread::sleep(Duration::from_millis(100));
    let i = injected(child.id());
    assert!(shim_mapped(child.id()));
    assert_eq!(tracer_of(child.id()), 0);
    assert!(i.longest_stop < Duration::from_millis(200), "{i:?}");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let bare_last = String::from_utf8_lossy(&bare.stdout)
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert_eq!(rest.trim_end(), bare_last);
}

/// Where injection is not allowed it says why, and touches nothing.
#[test]
fn a_traced_process_is_refused_with_the_reason() {
    let mut child = Command::new("sleep").arg("5").spawn().unwrap();
    let pid = child.id();
    // SAFETY: seizing our own child, detached below.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid as i32, 0, 0) };
    assert_eq!(r, 0);
    let err = inject::inject(pid, &shim(), Limits::default()).unwrap_err();
    assert!(err.contains("already traced"), "{err}");
    assert!(!shim_mapped(pid));
    child.kill().unwrap();
    child.wait().unwrap();
}
