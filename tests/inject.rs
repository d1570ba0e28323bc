//! Bringing the shim into running processes with ptrace: real processes,
//! no GPU needed for the injection itself. Each target is checked to carry
//! on exactly as it would have: its output, its exit status, no tracer left.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use gapscope::collect::inject::{self, Limits, Outcome};
use gapscope::collect::pidns;
use gapscope_tests::*;
use gapscope_wire::Frame;

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
        .contains(gapscope_wire::LIBRARY_NAME)
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
/// profiler that connects and leaves, as attach does, gets a hello and a
/// goodbye.
fn shim_answers(pid: u32) {
    let mut conn = pidns::connect_control(pid).expect("the shim listens");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    let frames = frames_of(&bytes);
    assert!(
        matches!(frames.first(), Some(Frame::Hello(_))),
        "{frames:?}"
    );
    assert!(matches!(frames.last(), Some(Frame::Goodbye)), "{frames:?}");
}

/// What `gs-workload busy` printed last, "messages N sum S", holds every
/// message it passed, in order; returns N.
fn assert_all_messages(last: &str) -> u64 {
    let f: Vec<&str> = last.split_whitespace().collect();
    let n: u64 = f[1].parse().unwrap();
    let sum = (0..n).fold(0u64, |s, v| s.wrapping_add(v.wrapping_mul(2654435761)));
    assert_eq!(f[3], sum.to_string(), "{last}");
    n
}

/// tests/inject/regs.c, checked through three reads and its end: each
/// read finds every register as it left it.
fn regs_rounds_hold(mut child: Child, mut out: BufReader<ChildStdout>) {
    let stdin = child.stdin.as_mut().unwrap();
    let mut line = String::new();
    for round in 0..3 {
        stdin.write_all(b"x\n").unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, format!("round {round} ok\n"));
    }
    drop(child.stdin.take());
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "done\n");
    assert!(child.wait().unwrap().success());
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
    assert_left_clean(pid);
    assert_eq!(tracer_of(pid), 0);
    // Loaded once: a second attach finds it.
    assert_eq!(
        inject::inject(pid, &shim(), Limits::default()),
        Ok(Outcome::AlreadyLoaded {
            injected_before: true
        })
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

/// Signals aimed at the very thread gapscope takes over, one every half
/// millisecond into the program's own handler, wait until the thread is the
/// program's again: a handler run between gapscope's syscalls would run on
/// gapscope's registers (once seen as "lost track of its syscall" beside a
/// 1 ms timer). Each of 8 processes is injected, and each, which dies on any
/// syscall error, still checks every message it passed.
#[test]
fn signals_at_the_taken_over_thread_wait_until_it_is_the_programs_again() {
    for round in 0..8 {
        let (mut child, mut out) = started(
            Command::new(workload())
                .args(["busy", "--pace-us", "300", "--until", "stdin"])
                .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
        );
        let pid = child.id() as libc::pid_t;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_s = stop.clone();
        let sender = std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop_s.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: tgkill with plain integers, at a child we started
                // whose SIGALRM handler only counts.
                unsafe { libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGALRM) };
                sent += 1;
                std::thread::sleep(Duration::from_micros(400));
            }
            sent
        });
        std::thread::sleep(Duration::from_millis(20));
        let got = inject::inject(child.id(), &shim(), Limits::default());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent = sender.join().unwrap();
        assert!(
            matches!(got, Ok(Outcome::Injected(_))),
            "round {round}: {got:?} ({sent} signals sent)"
        );
        assert!(shim_mapped(child.id()));
        assert_eq!(tracer_of(child.id()), 0);
        child.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(child.wait().unwrap().success(), "round {round}: {rest}");
        assert!(assert_all_messages(&rest) > 0, "{rest}");
    }
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

/// `gapscope attach` to a GPU process started without the shim: the shim
/// is injected, the GPU is seen from the first work launched after the shim
/// began recording (the work queued before runs unrecorded, so the time
/// until then is unseen, not idle), and the process runs on as it would.
#[test]
fn attach_injects_a_running_gpu_process_and_sees_its_gpu_from_then_on() {
    if !bpf_ready("attach_injects_a_running_gpu_process_and_sees_its_gpu_from_then_on") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("inject-attach");
    let host = Command::new(bin("gs-cuda-host"))
        // About 3 s of steps: gapscope attaches 0.4 s in, and its start
        // (loading its programs, a slow verifier on a busy machine) and the
        // wait for a safe moment must not outlast the host's loop (300
        // steps, 0.9 s, did once: nothing launched was left to see).
        .args(["--steps", "1000", "--gap-us", "3000"])
        .env_remove("CUDA_INJECTION64_PATH")
        .env_remove("GAPSCOPE_SOCKET")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = host.id();
    std::thread::sleep(Duration::from_millis(400));
    let rec = dir.path().join("rec");
    let out = attach(&rec, pid, "1", &["--no-exports"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tracer_of(pid), 0);
    let done = host.wait_with_output().unwrap();
    assert!(done.status.success());
    let truth: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(truth["counts"]["launched"], 3000, "it ran all its steps");

    let report = report_json(&rec);
    assert_partitions(&report);
    let sources = report["gpu_sources"].as_array().unwrap();
    assert_eq!(sources.len(), 1, "{sources:?}");
    assert_eq!(sources[0]["pid"].as_u64(), Some(pid as u64));
    assert_eq!(sources[0]["loaded_by"], "ptrace");
    // What it cost the process: its thread held for microseconds.
    let cost = &sources[0]["injection"];
    assert!(u64_of(cost, "longest_stop_ns") > 0, "{cost}");
    assert!(u64_of(cost, "longest_stop_ns") < 200_000_000, "{cost}");
    assert!(
        u64_of(cost, "took_ns") >= u64_of(cost, "longest_stop_ns"),
        "{cost}"
    );
    let window = &report["window_ns"];
    let (w0, w1) = (u64_of(window, "start"), u64_of(window, "end"));
    let blind = report["drops"]["gpu_blind"].as_array().unwrap();
    assert_eq!(blind.len(), 1, "{blind:?}");
    assert_eq!(u64_of(&blind[0], "start_ns"), w0);
    let seen_from = u64_of(&blind[0], "end_ns");
    assert!(seen_from > w0 && seen_from < w1, "{blind:?}");
    let last_launch = truth["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| u64_of(k, "start_ns"))
        .max()
        .unwrap();
    assert!(
        seen_from < last_launch,
        "the shim began recording {} ms after the host's last kernel",
        (seen_from - last_launch) / 1_000_000
    );
    // Busy: the kernels the simulated GPU ran once seen, clipped to the
    // window; within one kernel.
    let busy_truth: u64 = truth["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                u64_of(k, "start_ns").max(seen_from),
                u64_of(k, "end_ns").min(w1),
            )
        })
        .filter(|(s, e)| e > s)
        .map(|(s, e)| e - s)
        .sum();
    let gpu = &report["gpus"][0];
    let busy = u64_of(gpu, "busy_ns");
    assert!(
        busy.abs_diff(busy_truth) <= 2_000_000,
        "busy {busy}, truth {busy_truth}"
    );
    assert!(u64_of(gpu, "unseen_ns") >= seen_from - w0, "{gpu}");
    assert!(
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("injected with ptrace")),
        "{}",
        report["notes"]
    );
}

/// gapscope killed at any moment of an attach — before, while or after it
/// injects — leaves the target running, untraced, and doing what it does.
#[test]
fn a_killed_attach_leaves_the_target_running_and_untraced() {
    if !bpf_ready("a_killed_attach_leaves_the_target_running_and_untraced") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("inject-kill");
    let standin = bin("libcupti_standin.so");
    let args = ["busy", "--messages", "1500", "--pace-us", "300"];
    let bare = Command::new(workload()).args(args).output().unwrap();
    let bare_last = String::from_utf8_lossy(&bare.stdout)
        .lines()
        .last()
        .unwrap()
        .to_string();
    let mut caught_tracing = 0;
    for k in 0..8u64 {
        let (mut child, mut out) = started(
            Command::new(workload())
                .args(args)
                .arg("--dlopen")
                .arg(&standin)
                .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
        );
        let pid = child.id();
        let mut g = Command::new(gapscope())
            .args(["attach", "-q", "--no-exports", "--duration", "5", "--pid"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(dir.path().join(format!("rec-{k}")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if k % 2 == 0 {
            // The moment it holds the thread.
            let t = std::time::Instant::now();
            while tracer_of(pid) == 0 && t.elapsed() < Duration::from_secs(3) {}
            if tracer_of(pid) != 0 {
                caught_tracing += 1;
            }
        } else {
            // Anywhere from start-up to just after loading.
            std::thread::sleep(Duration::from_millis(k * 40));
        }
        g.kill().unwrap();
        g.wait().unwrap();
        let t = std::time::Instant::now();
        while tracer_of(pid) != 0 && t.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(tracer_of(pid), 0, "kill {k}: a tracer was left behind");
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "kill {k}: the target failed: {status:?}");
        assert_eq!(rest.trim_end(), bare_last, "kill {k}");
    }
    eprintln!("killed while it held the thread: {caught_tracing} of 4");
}

/// A shim injected once stays, dormant: 100 profilers connecting and
/// leaving while the process runs change nothing it does.
#[test]
fn an_injected_shim_takes_a_hundred_attach_cycles() {
    let standin = bin("libcupti_standin.so");
    // It runs until told to stop on stdin, and checks every message.
    let (mut child, mut out) = started(
        Command::new(workload())
            .args(["busy", "--pace-us", "300", "--until", "stdin", "--dlopen"])
            .arg(&standin)
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
    );
    let pid = child.id();
    injected(pid);
    for _ in 0..100 {
        assert_eq!(
            inject::inject(pid, &shim(), Limits::default()),
            Ok(Outcome::AlreadyLoaded {
                injected_before: true
            })
        );
        shim_answers(pid);
    }
    assert_eq!(tracer_of(pid), 0);
    child.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    // "messages N sum S": every message arrived, in order.
    assert!(assert_all_messages(&rest) > 100, "{rest}");
}

const PY_FORKING: &str = r#"
import ctypes, os, sys
ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
failed = 0
for i in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 7:
        failed += 1
print("forked", sys.argv[2], "failed", failed, flush=True)
"#;

/// A process forking child after child while it is injected: the moment
/// is never a fork, its children exit as they should, and the ones forked
/// after carry the shim dormant.
#[test]
fn a_process_that_keeps_forking_is_injected_between_forks() {
    let Some(python) = python() else {
        eprintln!("skipping: no python3");
        return;
    };
    let (mut child, mut out) = started(
        Command::new(python)
            .args(["-c", PY_FORKING])
            .arg(bin("libcupti_standin.so"))
            .arg("1500")
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
    );
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(50));
    let i = injected(pid);
    assert!(i.longest_stop < Duration::from_millis(200), "{i:?}");
    assert_eq!(tracer_of(pid), 0);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    assert_eq!(rest.trim_end(), "forked 1500 failed 0");
}

/// A process in its own pid and mount namespaces (a container's view): it
/// is found by its pid here, and opens the shim at a path of its own.
#[test]
fn a_process_in_its_own_namespaces_is_injected() {
    let Some(python) = python() else {
        eprintln!("skipping: no python3");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: new namespaces need root");
        return;
    }
    let (mut child, mut out) = started(
        Command::new("unshare")
            .args(["--pid", "--mount", "--fork", "--kill-child", "--"])
            .arg(python)
            .args(["-c", PY_BLOCKED])
            .arg(bin("libcupti_standin.so"))
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
    );
    // The interpreter is unshare's child.
    let pid: u32 =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id()))
            .unwrap()
            .split_whitespace()
            .next()
            .expect("unshare's child")
            .parse()
            .unwrap();
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
        std::fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    std::thread::sleep(Duration::from_millis(100));
    let tmp_before = tmp_entries(pid);
    injected(pid);
    // It loaded the shim from a memfd of its own: nothing was placed in its
    // file system, no fd of it is left open, no page is writable and
    // executable.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|l| l.contains(gapscope_wire::LIBRARY_NAME))
        .expect("the shim is mapped");
    assert!(
        line.ends_with(&format!("/memfd:{} (deleted)", gapscope_wire::LIBRARY_NAME)),
        "{line}"
    );
    assert_eq!(tmp_entries(pid), tmp_before);
    assert_left_clean(pid);
    assert_eq!(tracer_of(pid), 0);
    child.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "got hello\n");
    assert!(child.wait().unwrap().success());
}

/// The names in a process's own /tmp.
fn tmp_entries(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root/tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// What an injection leaves in a process: no fd of the memfd the shim came
/// in, and no mapping both writable and executable (the stub's page is
/// read-only once done).
fn assert_left_clean(pid: u32) {
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let to = std::fs::read_link(e.unwrap().path()).unwrap_or_default();
        assert!(
            !to.to_string_lossy().contains("memfd:"),
            "fd left open: {}",
            to.display()
        );
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for l in maps.lines() {
        let perms = l.split_whitespace().nth(1).unwrap();
        assert!(!(perms.contains('w') && perms.contains('x')), "W^X: {l}");
    }
}

/// Builds tests/inject/regs.c into `dir`.
fn build_regs(dir: &std::path::Path) -> std::path::PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("inject/regs.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = dir.join("regs");
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-O1", "-Wall"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(
        out.status.success(),
        "compiling {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A single-threaded C program blocked in a raw read(2) with known values
/// in every general register the syscall keeps and in xmm0-xmm15: taken
/// over at that read, it gets every register back and its read completes
/// with the data, not an error.
#[test]
fn a_thread_taken_over_in_a_syscall_gets_every_register_back() {
    let dir = scratch("inject-regs");
    let exe = build_regs(dir.path());
    let (child, out) = started(&mut Command::new(&exe));
    std::thread::sleep(Duration::from_millis(50)); // in its read by now
    injected(child.id());
    regs_rounds_hold(child, out);
}

/// The way back, tested directly: let go of right after the injected mmap
/// (as a gapscope killed at that moment would), the thread returns through
/// the signal frame left on its stack — every general and xmm register and
/// its signal mask its own again — and makes its read as if untouched.
#[test]
fn a_thread_let_go_of_mid_injection_gets_its_own_state_back() {
    let dir = scratch("inject-abandon");
    let exe = build_regs(dir.path());
    let (child, out) = started(&mut Command::new(&exe));
    std::thread::sleep(Duration::from_millis(50));
    let limits = Limits {
        abandon_after_mmap: true,
        ..Limits::default()
    };
    let err = inject::inject(child.id(), &shim(), limits).unwrap_err();
    assert!(err.contains("let go of"), "{err}");
    assert_eq!(tracer_of(child.id()), 0);
    regs_rounds_hold(child, out);
}

/// `gapscope attach` itself, 100 times against one running multithreaded
/// process: the first attach injects the shim, the others find it dormant
/// and switch it on and off; every attach succeeds, and the process, which
/// checks every message it passes and dies on any syscall error, ends as it
/// would have.
#[test]
fn a_hundred_attaches_leave_the_process_as_it_was() {
    if !bpf_ready("a_hundred_attaches_leave_the_process_as_it_was") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("inject-cycles");
    let (mut child, mut out) = started(
        Command::new(workload())
            .args(["busy", "--pace-us", "300", "--until", "stdin", "--dlopen"])
            .arg(bin("libcupti_standin.so"))
            .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so"),
    );
    let pid = child.id();
    for cycle in 0..100 {
        let rec = dir.path().join(format!("rec-{cycle}"));
        let out = Command::new(gapscope())
            .args(["attach", "-q", "--no-exports", "--duration", "0.1", "--pid"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&rec)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "attach {cycle}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if cycle == 0 || cycle == 99 {
            let report = report_json(&rec);
            let sources = report["gpu_sources"].as_array().unwrap();
            assert!(
                sources.iter().any(|s| s["loaded_by"] == "ptrace"),
                "attach {cycle}: {sources:?}"
            );
        }
        std::fs::remove_dir_all(&rec).unwrap();
        assert_eq!(tracer_of(pid), 0, "attach {cycle} left a tracer");
    }
    child.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    assert_all_messages(&rest);
}
