//! The CUPTI shim inside a process without CUDA, driven the way the CUDA
//! driver drives it (`gs-inject-host` dlopens it and calls
//! InitializeInjection), speaking to a listener written here with the
//! protocol's own decoder. No GPU, no BPF needed.

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::process::Command;
use std::time::Duration;

use gapscope_tests::*;
use gapscope_wire::protocol::{ClockMethod, Frame};
use serde_json::Value;

/// Runs the host with the shim, connected to a fresh listener; returns the
/// host's JSON line and every frame the shim sent.
fn host_with_listener(extra_env: &[(&str, &str)]) -> (Value, Vec<Frame>) {
    let name = format!(
        "gapscope-test.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    );
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    let mut cmd = Command::new(bin("gs-inject-host"));
    cmd.env("CUDA_INJECTION64_PATH", shim())
        .env("GAPSCOPE_SOCKET", format!("@{name}"));
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "host failed: {:?}", out.status);
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    let frames = frames_of(&bytes);
    (line, frames)
}

#[test]
fn without_cupti_the_shim_says_so_and_the_process_runs_on() {
    let (line, frames) = host_with_listener(&[("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so")]);
    assert_eq!(line["init_rc"], 1);
    // It must not hold the process up: no waiting on a GPU or the profiler.
    assert!(line["init_ns"].as_u64().unwrap() < 500_000_000, "{line}");
    let Frame::Hello(hello) = &frames[0] else {
        panic!("first frame is not Hello: {frames:?}")
    };
    assert_eq!(hello.pid as u64, line["pid"].as_u64().unwrap());
    assert_eq!(hello.cupti_version, 0);
    assert!(hello.source.starts_with("gapscope-cupti"));
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, Frame::Info(s) if s.contains("libcupti not found"))),
        "{frames:?}"
    );
    // At exit it flushes and says goodbye.
    assert!(matches!(frames.last(), Some(Frame::Goodbye)), "{frames:?}");
    assert!(frames
        .iter()
        .any(|f| matches!(f, Frame::Dropped { cupti: 0, shim: 0 })));
}

#[test]
fn with_a_real_cupti_but_no_driver_the_not_initialized_path_is_handled() {
    let Some(cupti) = wheel_cupti() else {
        eprintln!("skipping: no libcupti from the nvidia-cuda-cupti-cu12 wheel (cargo xtask setup fetches it)");
        return;
    };
    let (line, frames) = host_with_listener(&[("GAPSCOPE_CUPTI", cupti.to_str().unwrap())]);
    assert_eq!(line["init_rc"], 1);
    let Frame::Hello(hello) = &frames[0] else {
        panic!("first frame is not Hello")
    };
    assert!(
        hello.cupti_version >= 18,
        "CUPTI 12.x reports API version 18+: {hello:?}"
    );
    assert!(matches!(
        hello.clock,
        ClockMethod::TimestampCallback | ClockMethod::MeasuredOffset
    ));
    // CUPTI 12.9 without a driver refuses to enable activity with
    // CUPTI_ERROR_NOT_INITIALIZED (15); the shim reports it and carries on.
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, Frame::Info(s) if s.contains("error 15"))),
        "{frames:?}"
    );
    assert!(matches!(frames.last(), Some(Frame::Goodbye)));
}

#[test]
fn with_no_profiler_listening_the_shim_stays_dormant() {
    let out = Command::new(bin("gs-inject-host"))
        .env("CUDA_INJECTION64_PATH", shim())
        .env("GAPSCOPE_SOCKET", "@gapscope-test-nobody-listens")
        .output()
        .unwrap();
    assert!(out.status.success());
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["init_rc"], 1);
    assert!(line["init_ns"].as_u64().unwrap() < 500_000_000, "{line}");
}

#[test]
fn attach_switches_a_dormant_shim_on_and_leaving_switches_it_off() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let mut child = Command::new(bin("gs-inject-host"))
        .env("CUDA_INJECTION64_PATH", shim())
        .env_remove("GAPSCOPE_SOCKET")
        .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let name = gapscope_wire::transport::local_control_socket_name(child.id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut conn = None;
    for _ in 0..200 {
        if let Ok(c) = UnixStream::connect_addr(&addr) {
            conn = Some(c);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut conn = conn.expect("the shim listens on its control socket");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.flush().unwrap();
    // Leave at once: the shim must flush, say goodbye and close.
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    let frames = frames_of(&bytes);
    assert!(
        matches!(frames.first(), Some(Frame::Hello(_))),
        "{frames:?}"
    );
    assert!(matches!(frames.last(), Some(Frame::Goodbye)), "{frames:?}");
    assert!(child.wait().unwrap().success());
}

/// The host's measured work time without any shim: the baseline.
/// The host's work without the shim: its CPU time, median of three.
fn bare_host_work_cpu_ns() -> u64 {
    let mut v: Vec<u64> = (0..3)
        .map(|_| {
            let out = Command::new(bin("gs-inject-host"))
                .env_remove("CUDA_INJECTION64_PATH")
                .output()
                .unwrap();
            let line: Value = serde_json::from_slice(&out.stdout).unwrap();
            line["work_cpu_ns"].as_u64().unwrap()
        })
        .collect();
    v.sort_unstable();
    v[1]
}

/// The shim cost the host's work nothing: the work never blocked (a stalled
/// shim puts the thread to sleep), its CPU time is the bare one's (within
/// 1.5×: caches, frequency), and the shim's threads took little CPU beside
/// it. Its wall time is not asked: the rest of the suite shares the CPUs.
#[track_caller]
fn cost_nothing(line: &Value, bare_cpu: u64) {
    let cpu = u64_of(line, "work_cpu_ns");
    assert_eq!(line["work_blocked"], 0, "the work blocked: {line}");
    assert!(
        cpu * 2 < bare_cpu * 3,
        "work {cpu} ns of CPU vs {bare_cpu} ns bare: {line}"
    );
    assert!(
        u64_of(line, "others_cpu_ns") * 10 < cpu,
        "the shim's threads: {line}"
    );
}

/// Starts the host with the shim speaking to a listener of ours; returns
/// the child and our end of its connection.
fn host_connected() -> (std::process::Child, std::os::unix::net::UnixStream) {
    let name = format!("gapscope-test-fault.{}", std::process::id());
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    let child = Command::new(bin("gs-inject-host"))
        .env("CUDA_INJECTION64_PATH", shim())
        .env("GAPSCOPE_SOCKET", format!("@{name}"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    (child, conn)
}

fn finished(child: std::process::Child) -> (Value, Duration) {
    let t = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the host failed: {:?}", out.status);
    (serde_json::from_slice(&out.stdout).unwrap(), t.elapsed())
}

// The two faults below must not stall the process.

#[test]
fn a_profiler_that_dies_mid_run_costs_the_process_nothing() {
    let bare = bare_host_work_cpu_ns();
    let _serial = shim_fault_lock();
    let (child, mut conn) = host_connected();
    let mut hello = [0u8; 16];
    conn.read_exact(&mut hello).unwrap();
    drop(conn); // the profiler is gone: killed, crashed, or stopped
    let (line, _) = finished(child);
    cost_nothing(&line, bare);
}

#[test]
fn a_profiler_that_never_reads_costs_the_process_nothing() {
    let bare = bare_host_work_cpu_ns();
    let _serial = shim_fault_lock();
    let (child, conn) = host_connected();
    // Connected, never read from, open until the host has exited.
    let (line, exit_wait) = finished(child);
    drop(conn);
    cost_nothing(&line, bare);
    let work = u64_of(&line, "work_ns");
    assert!(
        exit_wait < Duration::from_secs(2) + Duration::from_nanos(work),
        "{exit_wait:?}"
    );
}

/// The two fault tests share a socket name: one at a time.
fn shim_fault_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_forked_child_does_not_hold_the_profilers_stream_open() {
    // The child outlives the process by 20 s; the stream must end when the
    // process does, not when the child does.
    let started = std::time::Instant::now();
    let (line, frames) = host_with_listener(&[
        ("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
        ("GS_FORK_CHILD_MS", "20000"),
    ]);
    assert_eq!(line["init_rc"], 1);
    assert!(matches!(frames.last(), Some(Frame::Goodbye)), "{frames:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the stream stayed open {:?}, as long as the forked child lived",
        started.elapsed()
    );
}
