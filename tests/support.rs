//! Helpers for the end-to-end tests: find the built binaries, run gapscope,
//! read reports and workload ground truth, and decide whether BPF tests can
//! run here (with `GAPSCOPE_REQUIRE_BPF=1` they must).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod report_schema;
pub use report_schema::{
    assert_diff_schema, assert_report_schema, assert_reports_schema, diff_schema, ranks_schema,
    report_schema, schema_violation,
};

/// target/<profile>/ of this build (tests live in target/<profile>/deps/).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// A binary of the workspace, built before the tests run.
pub fn bin(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built; run the tests with `cargo xtask test` (or `cargo build --workspace` first)",
        path.display()
    );
    path
}

pub fn gapscope() -> PathBuf {
    bin("gapscope")
}

pub fn workload() -> PathBuf {
    bin("gs-workload")
}

/// Why recording cannot work here, if it cannot.
fn bpf_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("no kernel BTF at /sys/kernel/btf/vmlinux".into());
    }
    None
}

/// Returns false (after saying so) when a BPF test must be skipped; panics
/// instead when `GAPSCOPE_REQUIRE_BPF=1`, so CI cannot pass by skipping.
pub fn bpf_ready(test: &str) -> bool {
    match bpf_unavailable() {
        None => true,
        Some(why) if std::env::var("GAPSCOPE_REQUIRE_BPF").as_deref() == Ok("1") => {
            panic!("{test}: BPF is required (GAPSCOPE_REQUIRE_BPF=1) but {why}")
        }
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// Serializes recording tests across test binaries and processes: on two
/// cores, concurrent recordings would only make each other's timing noisy.
pub struct RecordingLock {
    _held: File,
}

pub fn recording_lock() -> RecordingLock {
    let path = target_dir().join("gapscope-recording-tests.lock");
    let f = File::create(&path).expect("lock file");
    // SAFETY: flock on an fd we own.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    RecordingLock { _held: f }
}

/// A scratch directory for one test, on a real filesystem (O_DIRECT needs
/// one; /tmp may be tmpfs), removed when dropped.
pub fn scratch(name: &str) -> Scratch {
    let base = target_dir().join("test-scratch");
    std::fs::create_dir_all(&base).unwrap();
    Scratch(Some(
        tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir_in(base)
            .unwrap(),
    ))
}

/// A test's scratch directory: removed when the test passes, kept (and its
/// path printed) when it fails, so that the recording that failed can be
/// read again.
pub struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    pub fn path(&self) -> &Path {
        self.0.as_ref().expect("until dropped").path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!("kept for the failure: {}", dir.keep().display());
            }
        }
    }
}

pub struct Run {
    pub output: Output,
    pub dir: PathBuf,
}

impl Run {
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    /// The report of the recorded session, re-read offline.
    pub fn report(&self) -> Value {
        report_json(&self.dir)
    }
}

/// `gapscope run -o DIR ARGS -- CMD`.
pub fn run(dir: &Path, args: &[&str], cmd: &[&str]) -> Run {
    let output = Command::new(gapscope())
        .arg("run")
        .arg("-o")
        .arg(dir)
        .args(args)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .output()
        .expect("running gapscope");
    Run {
        output,
        dir: dir.to_path_buf(),
    }
}

/// `gapscope report PATH --format json`, parsed, checked against the
/// contract (docs/report.schema.json).
/// `sh -c SCRIPT` recorded quietly into `dir`: it must succeed; its report.
#[track_caller]
pub fn record_script(dir: &Path, script: &str) -> Value {
    let r = run(dir, &["-q", "--no-exports"], &["sh", "-c", script]);
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    r.report()
}

pub fn report_json(path: &Path) -> Value {
    let out = Command::new(gapscope())
        .args(["report", "--format", "json"])
        .arg(path)
        .output()
        .expect("running gapscope report");
    assert!(
        out.status.success(),
        "gapscope report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&out.stdout).expect("report is JSON");
    assert_report_schema(&report);
    report
}

/// Ground-truth lines a workload appended to its --truth file.
pub fn truth(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("truth line is JSON"))
        .collect()
}

/// The ground-truth lines a workload process wrote in this role.
pub fn truth_of<'a>(lines: &'a [Value], role: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["role"] == role).collect()
}

/// `gapscope run -o DIR/rec ARGS -- gs-workload WORKLOAD_ARGS --truth
/// DIR/truth.jsonl`; checks that it exited 0 and returns the run and the
/// ground truth its processes wrote, a line each.
pub fn run_workload(dir: &Path, args: &[&str], workload_args: &[&str]) -> (Run, Vec<Value>) {
    let truth_path = dir.join("truth.jsonl");
    let workload = workload();
    let mut cmd = vec![workload.to_str().unwrap()];
    cmd.extend_from_slice(workload_args);
    cmd.extend(["--truth", truth_path.to_str().unwrap()]);
    let r = run(&dir.join("rec"), args, &cmd);
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let lines = truth(&truth_path);
    (r, lines)
}

pub fn u64_of(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

/// The report's entry for one thread.
pub fn thread(report: &Value, tid: u64) -> &Value {
    report["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .find(|t| t["tid"].as_u64() == Some(tid))
        .unwrap_or_else(|| panic!("thread {tid} is not in the report"))
}

pub fn off_cpu_total(t: &Value) -> u64 {
    t["off_cpu_ns"]
        .as_object()
        .expect("off_cpu_ns")
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// Asserts |actual - expected| <= tol * expected.
#[track_caller]
pub fn assert_close(what: &str, actual: u64, expected: u64, tol: f64) {
    let diff = (actual as f64 - expected as f64).abs();
    assert!(
        diff <= tol * expected as f64,
        "{what}: {actual} vs expected {expected} (off by {:.1}%, allowed {:.0}%)",
        diff * 100.0 / expected.max(1) as f64,
        tol * 100.0
    );
}

/// An O_DIRECT reader's storage reads in the report (`th`) are what the
/// kernel counted for it, as the thread read them at its end (`truth`):
/// its data, every byte from the disk, and nothing more than the kernel
/// says it read besides (a file system's metadata).
#[track_caller]
pub fn assert_storage_reads(th: &Value, truth: &Value) {
    let reported = u64_of(&th["io"], "storage_read_bytes");
    assert_eq!(reported, u64_of(truth, "storage_read_bytes"), "{th}");
    assert!(reported >= u64_of(truth, "bytes"), "{th}");
}

/// Every thread's account partitions its lifetime exactly (integer ns).
#[track_caller]
pub fn assert_partitions(report: &Value) {
    for t in report["threads"].as_array().expect("threads") {
        let sum = u64_of(t, "on_cpu_ns")
            + u64_of(t, "runnable_ns")
            + u64_of(t, "stolen_ns")
            + off_cpu_total(t);
        assert_eq!(sum, u64_of(t, "lifetime_ns"), "thread {}", t["tid"]);
    }
}

/// A GPU's account partitions exactly (integer ns): busy + idle + unseen
/// (where the GPU could not be seen) is the allocated time, the idle causes
/// sum to idle and the kinds of busy to busy.
#[track_caller]
pub fn assert_gpu_partitions(g: &Value) {
    let sum = |v: &Value| -> u64 {
        v.as_object()
            .expect("an object of ns")
            .values()
            .map(|x| x.as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        u64_of(g, "busy_ns") + u64_of(g, "idle_ns") + g["unseen_ns"].as_u64().unwrap_or(0),
        u64_of(g, "allocated_ns"),
        "GPU {}",
        g["id"]
    );
    assert_eq!(
        sum(&g["idle_by_cause_ns"]),
        u64_of(g, "idle_ns"),
        "GPU {}",
        g["id"]
    );
    assert_eq!(
        sum(&g["busy_by_kind_ns"]),
        u64_of(g, "busy_ns"),
        "GPU {}",
        g["id"]
    );
}

/// The injectable GPU shim as built in this target directory.
pub fn shim() -> PathBuf {
    bin("libgapscope_cupti.so")
}

/// A real libcupti (from the nvidia-cuda-cupti-cu12 wheel that
/// `cargo xtask setup` fetches), if present.
pub fn wheel_cupti() -> Option<PathBuf> {
    let p = target_dir()
        .parent()?
        .join("cupti-wheel/nvidia/cuda_cupti/lib/libcupti.so.12");
    p.exists().then_some(p)
}

/// A real recording kept in the repository (simtrain, mixed bottleneck, 12
/// steps), so exporters can be compared byte for byte across changes.
pub fn golden_session() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/simtrain-mixed.gsz")
}

/// Compares `actual` with the golden file `name`; `GAPSCOPE_BLESS=1`
/// rewrites the golden file instead.
pub fn check_golden(name: &str, actual: &[u8]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    if std::env::var("GAPSCOPE_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; create it with GAPSCOPE_BLESS=1 cargo test -p gapscope-tests",
            path.display()
        )
    });
    if expected != actual {
        let (e, a) = (
            String::from_utf8_lossy(&expected),
            String::from_utf8_lossy(actual),
        );
        let line = e
            .lines()
            .zip(a.lines())
            .position(|(x, y)| x != y)
            .unwrap_or_else(|| e.lines().count().min(a.lines().count()));
        panic!(
            "{name} differs from its golden file at line {}:\n  golden: {}\n  now:    {}\n\
             if the change is intended: GAPSCOPE_BLESS=1 cargo test -p gapscope-tests --test exports",
            line + 1,
            e.lines().nth(line).unwrap_or("<end of file>"),
            a.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}

/// A headless Chromium, or None (and why) when there is none;
/// `GAPSCOPE_REQUIRE_BROWSER=1` turns a missing one into a failure.
pub fn browser(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("GAPSCOPE_CHROMIUM")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            ["chromium", "chromium-browser", "google-chrome"]
                .iter()
                .flat_map(|n| {
                    std::env::var_os("PATH")
                        .map(|p| {
                            std::env::split_paths(&p)
                                .map(|d| d.join(n))
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default()
                }),
        )
        .find(|p| p.is_file());
    if found.is_none() {
        if std::env::var("GAPSCOPE_REQUIRE_BROWSER").as_deref() == Ok("1") {
            panic!("{test}: Chromium is required (GAPSCOPE_REQUIRE_BROWSER=1) but not installed; cargo xtask setup installs it");
        }
        eprintln!("skipping {test}: no chromium on PATH (cargo xtask setup installs it)");
    }
    found
}

/// Runs Chromium headless on `page` with `extra` flags, no network, and
/// returns (stdout, console lines). Killed after a minute.
pub fn chromium(browser: &Path, page: &Path, extra: &[String]) -> (String, Vec<String>) {
    let profile = scratch("chromium-profile");
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-extensions",
            "--disable-sync",
            "--mute-audio",
            "--hide-scrollbars",
            // Anything the page tried to fetch would fail and be logged.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        // Files, not pipes: a page's DOM is larger than a pipe holds.
        .stdout(std::fs::File::create(profile.path().join("stdout")).unwrap())
        .stderr(std::fs::File::create(profile.path().join("stderr")).unwrap())
        .spawn()
        .expect("starting chromium");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let read = |f: &str| {
        String::from_utf8_lossy(&std::fs::read(profile.path().join(f)).unwrap()).into_owned()
    };
    let stderr = read("stderr");
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("net::ERR_"))
        .map(str::to_string)
        .collect();
    (read("stdout"), console)
}

/// Prometheus and promtool (Debian's `prometheus`, which `cargo xtask
/// setup` installs), or None to skip — a panic under
/// GAPSCOPE_REQUIRE_PROMETHEUS=1.
pub fn prometheus(test: &str) -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
    };
    match (find("prometheus"), find("promtool")) {
        (Some(p), Some(t)) => Some((p, t)),
        _ if std::env::var("GAPSCOPE_REQUIRE_PROMETHEUS").as_deref() == Ok("1") => {
            panic!("{test}: Prometheus is required (GAPSCOPE_REQUIRE_PROMETHEUS=1) but not installed; cargo xtask setup installs it")
        }
        _ => {
            eprintln!(
                "skipping {test}: no prometheus/promtool on PATH (cargo xtask setup installs them)"
            );
            None
        }
    }
}

/// `GET path` from a local HTTP server: (status line, body).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// A local TCP port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `gapscope run -o DIR/rec ARGS -- simtrain SIMTRAIN_ARGS` on the shared
/// dataset, writing its ground truth to DIR/truth.json; checks that it
/// exited 0 and returns the run and that ground truth.
pub fn run_simtrain(dir: &Path, args: &[&str], simtrain_args: &[&str]) -> (Run, Value) {
    let data = simtrain_data();
    let truth_path = dir.join("truth.json");
    let simtrain = bin("simtrain");
    let mut cmd = vec![simtrain.to_str().unwrap()];
    cmd.extend_from_slice(simtrain_args);
    cmd.extend([
        "--data",
        data.to_str().unwrap(),
        "--ground-truth",
        truth_path.to_str().unwrap(),
    ]);
    let r = run(&dir.join("rec"), args, &cmd);
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let truth = serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    (r, truth)
}

/// Runs `cmd` to its end and requires success (its stderr otherwise).
#[track_caller]
pub fn succeed(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("running a workload");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// simtrain started on its own, not under gapscope (`ARGS` and the shared
/// dataset, its ground truth to `truth`): returned once it says its
/// simulated GPU waits dormant on its control socket.
pub fn dormant_simtrain(args: &[&str], truth: &Path) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    let data = simtrain_data();
    let mut sim = Command::new(bin("simtrain"))
        .args(args)
        .arg("--data")
        .arg(&data)
        .arg("--ground-truth")
        .arg(truth)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(sim.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("dormant"), "{line}");
    // The rest of its stderr read as it comes (a closed pipe would fail it).
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    sim
}

/// simtrain's dataset, made once (outside any recording).
pub fn simtrain_data() -> PathBuf {
    let d = target_dir().join("simtrain-data");
    succeed(
        Command::new(bin("simtrain"))
            .arg("--prepare")
            .arg("--data")
            .arg(&d),
    );
    d
}

/// The GPU's span (first work to last) of a recorded run's report.
pub fn gpu_span(report: &Value) -> u64 {
    u64_of(&report["gpus"][0], "span_ns")
}

/// The GPU's span of a predicted run (a what-if, one with more workers, or
/// either's other end): its wall less the start-up and tear-down it kept.
pub fn predicted_span(w: &Value) -> u64 {
    let idle = &w["idle_by_cause_ns"];
    u64_of(w, "wall_ns") - u64_of(idle, "startup") - u64_of(idle, "teardown")
}

/// A recommendation's what-if with `add` more loader workers.
#[track_caller]
pub fn with_more_workers(rec: &Value, add: u64) -> Value {
    rec["what_if"]["more_workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["add"] == add)
        .unwrap_or_else(|| panic!("no prediction for {add} more workers: {rec:#}"))
        .clone()
}

/// The real PyTorch profiler traces kept with the tests (tests/data/kineto,
/// from HTA's test data, MIT), with the reference numbers they reproduce.
pub fn kineto_traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/kineto")
}

/// `gapscope attach -q --duration SECS --pid PID -o REC EXTRA…`, to its end.
pub fn attach(rec: &Path, pid: u32, secs: &str, extra: &[&str]) -> Output {
    Command::new(gapscope())
        .args(["attach", "-q", "--duration", secs, "--pid"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(rec)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("running gapscope attach")
}

/// A gzipped trace's text.
pub fn gunzip(path: &Path) -> Vec<u8> {
    let out = Command::new("gzip").arg("-dc").arg(path).output().unwrap();
    assert!(out.status.success(), "gzip -dc {}", path.display());
    out.stdout
}

/// Runs `gapscope ARGS`, requires success, returns its stdout.
pub fn gapscope_stdout(args: &[&str]) -> Vec<u8> {
    let out = Command::new(gapscope())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running gapscope");
    assert!(
        out.status.success(),
        "gapscope {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The names of the files in `dir`, sorted.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Pid of the process gapscope started (its only child), once it has exec'd `comm`.
pub fn target_of(gapscope_pid: u32, comm: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let children =
            std::fs::read_to_string(format!("/proc/{gapscope_pid}/task/{gapscope_pid}/children"))
                .unwrap_or_default();
        for child in children.split_whitespace() {
            let c = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if c.trim() == comm {
                return child.parse().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("gapscope never started {comm}");
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: sending a signal to a process we started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// `gapscope run -- sleep 60` sent `sig` (Ctrl-C or a terminate): the
/// signal reaches the target, gapscope exits as the target did, and the
/// recording is complete, the target's sleep in it.
pub fn a_signal_to_gapscope_reaches_the_target(sig: i32) {
    let _lock = recording_lock();
    let dir = scratch(&format!("signal-{sig}"));
    let rec = dir.path().join("rec");
    let child = Command::new(gapscope())
        .args(["run", "-q", "-o"])
        .arg(&rec)
        .args(["--", "sleep", "60"])
        .spawn()
        .unwrap();
    let target = target_of(child.id(), "sleep");
    std::thread::sleep(Duration::from_millis(200));
    signal(child.id(), sig);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + sig));
    assert!(
        !Path::new(&format!("/proc/{target}")).exists(),
        "target still alive"
    );
    let report = report_json(&rec);
    assert_partitions(&report);
    assert_eq!(report["target"]["exit_code"], 128 + sig);
    assert!(
        report["session"]["truncated"].is_null(),
        "{}",
        report["session"]
    );
    let th = thread(&report, target as u64);
    assert!(u64_of(&th["off_cpu_ns"], "sleep") > 100_000_000, "{th}");
}

/// Every frame in bytes a shim sent, which must all be well formed.
pub fn frames_of(bytes: &[u8]) -> Vec<gapscope_wire::Frame> {
    let mut d = gapscope_wire::Decoder::new();
    d.push(bytes);
    let mut frames = Vec::new();
    while let Some(f) = d.next_frame().expect("well-formed frames") {
        frames.push(f);
    }
    frames
}

/// The Python interpreter itself (not a version-manager shim in front of
/// it, whose own waits would be part of the same process's account), if
/// there is one.
pub fn python() -> Option<String> {
    Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The test venv's python (`cargo xtask setup` makes it, in
/// target/torch-venv) if `modules` import there; None, and a line saying
/// why, where they do not — a panic under GAPSCOPE_REQUIRE_TORCH=1, as CI
/// sets it.
pub fn venv_python(modules: &str) -> Option<PathBuf> {
    // Beside the build profiles: cargo xtask setup makes it there.
    let py = target_dir().parent().unwrap().join("torch-venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    if std::env::var("GAPSCOPE_REQUIRE_TORCH").as_deref() == Ok("1") {
        panic!(
            "{modules} required (GAPSCOPE_REQUIRE_TORCH=1) but {} cannot import it; cargo xtask setup installs it",
            py.display()
        );
    }
    eprintln!(
        "skipping: {} cannot import {modules} (cargo xtask setup installs it)",
        py.display()
    );
    None
}

/// Of a GPU's idle between its first and last work (its idle less
/// start-up and tear-down), the percent its causes `pick` took: what a
/// workload's own clock of a wait is compared with.
pub fn idle_share(g: &Value, pick: impl Fn(&str) -> bool) -> f64 {
    let causes = g["idle_by_cause_ns"].as_object().unwrap();
    let between: u64 = causes
        .iter()
        .filter(|(c, _)| !matches!(c.as_str(), "startup" | "teardown"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    let picked: u64 = causes
        .iter()
        .filter(|(c, _)| pick(c))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    picked as f64 * 100.0 / between.max(1) as f64
}

/// A Python workload of examples/python on the simulated GPU, recorded
/// under `gapscope run` by `py`: `script --lib libgs_simgpu.so --truth T
/// ARGS`, where it writes its ground truth to T. Its report and its truth.
pub fn record_python_workload(
    name: &str,
    py: &Path,
    script: &str,
    args: &[&str],
) -> (Value, Value) {
    let dir = scratch(name);
    let truth = dir.path().join("truth.json");
    let lib = target_dir().join("libgs_simgpu.so");
    let mut cmd = vec![
        py.to_str().unwrap(),
        script,
        "--lib",
        lib.to_str().unwrap(),
        "--truth",
        truth.to_str().unwrap(),
    ];
    cmd.extend_from_slice(args);
    let r = run(&dir.path().join("rec"), &["-q", "--no-exports"], &cmd);
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let truth = serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    (r.report(), truth)
}

/// A busy loop, in this process's session or (`own_session`) in one of its
/// own, which the kernel puts in its own autogroup.
pub fn busy_loop(own_session: bool) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "while :; do :; done"])
        .stdin(std::process::Stdio::null());
    if own_session {
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn().expect("sh")
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: the set is zeroed, then filled by the kernel for this
    // thread; its size is passed.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) < 0 {
            return Vec::new();
        }
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: cpu is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Busy loops in this process's session, killed when dropped.
pub struct BusyLoops(pub Vec<std::process::Child>);

impl BusyLoops {
    pub fn start(n: usize) -> BusyLoops {
        BusyLoops((0..n).map(|_| busy_loop(false)).collect())
    }

    /// A busy loop on `cpu` alone, in a session (and autogroup) of its own:
    /// a neighbour that holds that CPU and no other.
    pub fn on_cpu(cpu: usize) -> BusyLoops {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "while :; do :; done"])
            .stdin(std::process::Stdio::null());
        // SAFETY: setsid and sched_setaffinity are async-signal-safe; the
        // set is built on this stack before either is called.
        unsafe {
            cmd.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::setsid() < 0
                    || libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        BusyLoops(vec![cmd.spawn().expect("sh")])
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
