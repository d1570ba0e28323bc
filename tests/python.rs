//! Interpreted and JIT-compiled code in the stacks. The kernel side walks
//! the frames of every CPython process of the tree itself (3.9–3.14,
//! shared or static libpython, with or without frame pointers, found by
//! itself: no variable, no restart), so `run` and `attach` name Python
//! functions in every stack. Tested on every CPython the machine has —
//! pyenv's, the distribution's — and on those `cargo xtask setup` builds
//! from Debian's copies of the upstream sources (3.13 with frame pointers,
//! 3.14 without; no registry here installs them). Another real JIT that
//! writes a perf map, node's V8 (`--perf-basic-prof`), checks that path.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gapscope_tests::*;

/// A CPython to test on: where it is, and the name its process goes by.
struct Python {
    path: PathBuf,
    comm: String,
    /// "3.11 (pyenv)", for messages.
    label: String,
}

/// Every CPython 3.9+ on the machine: pyenv's versions, the distribution's
/// /usr/bin/python3.X, and those `cargo xtask setup` builds (which
/// GAPSCOPE_REQUIRE_PYTHON=1 requires).
fn pythons(test: &str) -> Vec<Python> {
    let mut found = Vec::new();
    let mut add = |path: PathBuf, label: String| {
        if path.exists() {
            let comm: String = path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .chars()
                .take(15)
                .collect();
            found.push(Python { path, comm, label });
        }
    };
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    if let Ok(dir) = std::fs::read_dir(pyenv.join("versions")) {
        let mut versions: Vec<String> = dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|v| minor_of(v).is_some_and(|m| (9..=14).contains(&m)))
            .collect();
        versions.sort();
        for v in versions {
            let m = minor_of(&v).unwrap();
            add(
                pyenv
                    .join("versions")
                    .join(&v)
                    .join(format!("bin/python3.{m}")),
                format!("{v} (pyenv, shared libpython)"),
            );
        }
    }
    for m in 9..=14 {
        add(
            PathBuf::from(format!("/usr/bin/python3.{m}")),
            format!("3.{m} (the distribution's)"),
        );
    }
    let built = target_dir().parent().unwrap().to_path_buf();
    for (m, how) in [(13, "with frame pointers"), (14, "without frame pointers")] {
        let p = built.join(format!("python3.{m}/bin/python3.{m}"));
        if !p.exists() {
            assert!(
                std::env::var("GAPSCOPE_REQUIRE_PYTHON").as_deref() != Ok("1"),
                "{test}: {} is not built (cargo xtask setup builds it)",
                p.display()
            );
        }
        add(p, format!("3.{m} (built {how}, static)"));
    }
    if found.is_empty() {
        eprintln!("skipping {test}: no CPython 3.9+ on this machine");
    }
    found
}

/// For a test that needs one CPython: the first here, with the recording
/// lock held; None (the test skips) without BPF or any CPython.
fn one_python(test: &str) -> Option<(Python, RecordingLock)> {
    if !bpf_ready(test) {
        return None;
    }
    let py = pythons(test).into_iter().next()?;
    Some((py, recording_lock()))
}

/// 11 of "3.11.7".
fn minor_of(version: &str) -> Option<u32> {
    version.strip_prefix("3.")?.split('.').next()?.parse().ok()
}

/// Pure Python: `inner` called by `outer` for `argv[1]` seconds.
const NESTED: &str = "import os, sys, time\n\
    def inner():\n\
    \x20   x = 0\n\
    \x20   for i in range(20000):\n\
    \x20       x = (x * 31 + i) % 1000003\n\
    \x20   return x\n\
    def outer(secs):\n\
    \x20   t = time.time()\n\
    \x20   while time.time() - t < secs:\n\
    \x20       inner()\n\
    print(os.getpid(), os.environ.get('PYTHONPERFSUPPORT'), flush=True)\n\
    outer(float(sys.argv[1]))\n";

/// Its cpu flamegraph, folded.
fn cpu_folded(rec: &Path) -> PathBuf {
    folded(rec, "cpu")
}

/// Its flamegraph `which` (cpu, offcpu), folded.
fn folded(rec: &Path, which: &str) -> PathBuf {
    let folded = rec.join(format!("{which}.folded"));
    succeed(
        Command::new(gapscope())
            .arg("export")
            .arg(rec)
            .args(["--flamegraph", which, "--folded", "-o"])
            .arg(&folded),
    );
    folded
}

/// `gapscope attach` to `pid` for 1.2 s with cpu-clock samples at 499 Hz:
/// its cpu flamegraph, folded.
fn attach_folded(pid: u32, rec: &Path) -> PathBuf {
    let out = Command::new(gapscope())
        .args([
            "attach",
            "-q",
            "--duration",
            "1.2",
            "--freq",
            "499",
            "--no-exports",
        ])
        .arg("--pid")
        .arg(pid.to_string())
        .arg("-o")
        .arg(rec)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cpu_folded(rec)
}

/// On every CPython here, under `run` and under `attach` to a process
/// started without gapscope, `inner` is named under `outer` in at least
/// 80% of the process's samples (start-up and exit are the rest), and the
/// report says nothing is missing. `run` no longer turns on CPython's perf
/// trampoline: the command sees no PYTHONPERFSUPPORT.
#[test]
fn every_cpython_names_its_functions_under_run_and_attach() {
    let test = "every_cpython_names_its_functions_under_run_and_attach";
    if !bpf_ready(test) {
        return;
    }
    let pythons = pythons(test);
    let _lock = recording_lock();
    let dir = scratch("pythons");
    let script = dir.path().join("nested.py");
    std::fs::write(&script, NESTED).unwrap();
    let mut failed = Vec::new();
    for (i, py) in pythons.iter().enumerate() {
        let rec = dir.path().join(format!("run-{i}"));
        let (r, pid, folded) = record_jit(
            &rec,
            &[],
            &[py.path.to_str().unwrap(), script.to_str().unwrap(), "1.0"],
        );
        let said = String::from_utf8_lossy(&r.output.stdout).to_string();
        assert_eq!(said.split_whitespace().nth(1), Some("None"), "{said}");
        let (named, all) = samples_with(&folded, &py.comm, &["py::outer", "py::inner"]);
        eprintln!("{} under run: {named} of {all} samples", py.label);
        if all < 200 || (named as f64) < 0.8 * all as f64 {
            failed.push(format!(
                "{} under run: {named} of {all} samples (pid {pid})",
                py.label
            ));
        }
        let notes = r.report()["notes"].to_string();
        if notes.contains("no Python function was named") {
            failed.push(format!("{} under run: {notes}", py.label));
        }

        // Started without gapscope, attached to.
        let mut child = Command::new(&py.path)
            .arg(&script)
            .arg("6")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let folded = attach_folded(child.id(), &dir.path().join(format!("attach-{i}")));
        let _ = child.kill();
        let _ = child.wait();
        let (named, all) = samples_with(&folded, &py.comm, &["py::outer", "py::inner"]);
        eprintln!("{} under attach: {named} of {all} samples", py.label);
        if all < 200 || (named as f64) < 0.8 * all as f64 {
            failed.push(format!(
                "{} under attach: {named} of {all} samples",
                py.label
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// With --no-python-frames no Python function is named, and the report
/// says so and why.
#[test]
fn without_python_frames_the_report_says_why_none_is_named() {
    let test = "without_python_frames_the_report_says_why_none_is_named";
    let Some((py, _lock)) = one_python(test) else {
        return;
    };
    let dir = scratch("python-off");
    let script = dir.path().join("nested.py");
    std::fs::write(&script, NESTED).unwrap();
    let rec = dir.path().join("rec");
    let (r, pid, folded) = record_jit(
        &rec,
        &["--no-python-frames"],
        &[py.path.to_str().unwrap(), script.to_str().unwrap(), "0.5"],
    );
    let (named, all) = samples_with(&folded, &py.comm, &["py::"]);
    assert!(all >= 100 && named == 0, "{named} of {all}");
    let notes = r.report()["notes"].to_string();
    assert!(
        notes.contains(&format!("(pid {pid}): no Python function was named"))
            && notes.contains("--no-python-frames"),
        "{notes}"
    );
}

/// A thread blocked in `time.sleep` and another in a socket read: the
/// off-CPU flamegraph has their Python functions above the call they
/// blocked in, for nearly all the time they waited.
#[test]
fn blocked_python_threads_show_their_functions_off_cpu() {
    let test = "blocked_python_threads_show_their_functions_off_cpu";
    let Some((py, _lock)) = one_python(test) else {
        return;
    };
    let dir = scratch("python-offcpu");
    let script = dir.path().join("blocked.py");
    std::fs::write(
        &script,
        "import socket, threading, time\n\
         def wait_socket(s):\n\
         \x20   s.recv(1)\n\
         def sleeper():\n\
         \x20   time.sleep(1.0)\n\
         a, b = socket.socketpair()\n\
         t = threading.Thread(target=wait_socket, args=(a,))\n\
         t.start()\n\
         sleeper()\n\
         b.send(b'x')\n\
         t.join()\n",
    )
    .unwrap();
    let rec = dir.path().join("rec");
    let r = run(
        &rec,
        &["-q", "--no-exports"],
        &[py.path.to_str().unwrap(), script.to_str().unwrap()],
    );
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let folded = folded(&rec, "offcpu");
    // Off-CPU weights are nanoseconds; each waited about a second.
    for (function, blocked_in) in [("py::sleeper", "select"), ("py::wait_socket", "recv")] {
        let (with, _) = samples_with(&folded, &py.comm, &[function, blocked_in]);
        assert!(
            with >= 800_000_000,
            "{}: {with} ns off-CPU with {function} above {blocked_in}",
            py.label
        );
    }
}

/// One blocking read reached from two Python functions through the same
/// helper, so the native stack is the interpreter's either way and the
/// two paths differ only in the Python frame above the helper: every
/// 100th read from `slow_site`, whose writer sleeps 1 ms first, the rest
/// from `fast_site`. On every CPython here each wait keeps its own
/// stack: the slow site's blocked time is at least its writer's sleeps.
/// (It guards the reuse of the last user walk on the Python side: a
/// fingerprint that left out the caller's code gave most slow waits the
/// fast site's stack.)
#[test]
fn python_waits_from_two_call_paths_keep_their_own_stacks() {
    let test = "python_waits_from_two_call_paths_keep_their_own_stacks";
    if !bpf_ready(test) {
        return;
    }
    let dir = scratch("python-sites");
    let script = dir.path().join("sites.py");
    let (rounds, every, slow_ms) = (10_000u64, 100u64, 1u64);
    std::fs::write(
        &script,
        format!(
            "import os, time\n\
             os.sched_setaffinity(0, {{1}})\n\
             def wait_on(fd):\n\
             \x20   if len(os.read(fd, 1)) != 1:\n\
             \x20       raise SystemExit(1)\n\
             def slow_site(fd):\n\
             \x20   wait_on(fd)\n\
             def fast_site(fd):\n\
             \x20   wait_on(fd)\n\
             down, up = os.pipe(), os.pipe()\n\
             if os.fork() == 0:\n\
             \x20   for i in range({rounds}):\n\
             \x20       (slow_site if i % {every} == 0 else fast_site)(down[0])\n\
             \x20       os.write(up[1], b'x')\n\
             \x20   os._exit(0)\n\
             for i in range({rounds}):\n\
             \x20   if i % {every} == 0:\n\
             \x20       time.sleep({slow_ms} / 1000)\n\
             \x20   os.write(down[1], b'x')\n\
             \x20   os.read(up[0], 1)\n\
             os.wait()\n"
        ),
    )
    .unwrap();
    let floor = rounds.div_ceil(every) * slow_ms * 1_000_000;
    for py in pythons(test) {
        let _lock = recording_lock();
        let rec = dir.path().join(format!("rec-{}", py.comm));
        let r = run(
            &rec,
            &["-q", "--no-exports"],
            &[py.path.to_str().unwrap(), script.to_str().unwrap()],
        );
        assert_eq!(r.code(), Some(0), "{}: {}", py.label, r.stderr());
        let folded = folded(&rec, "offcpu");
        let (slow, _) = samples_with(&folded, &py.comm, &["py::slow_site", "py::wait_on"]);
        let (fast, _) = samples_with(&folded, &py.comm, &["py::fast_site", "py::wait_on"]);
        assert!(
            slow >= floor * 9 / 10,
            "{}: the slow site {slow} ns blocked, its writer slept {floor} ns (the fast site {fast} ns)",
            py.label
        );
        assert!(
            fast > 0,
            "{}: the fast site's waits were not seen",
            py.label
        );
    }
}

/// A JIT's functions named from its perf map: node spends its time in one
/// JavaScript function, which exists in no file — only its perf map
/// (/tmp/perf-PID.map) can name it.
#[test]
fn jit_functions_are_named_from_their_perf_map() {
    let test = "jit_functions_are_named_from_their_perf_map";
    if !bpf_ready(test) {
        return;
    }
    if Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!("skipping {test}: no node");
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("jit");
    let script = dir.path().join("hot.js");
    std::fs::write(
        &script,
        "function hotLoop(ms) {\n\
           const end = Date.now() + ms;\n\
           let x = 0;\n\
           while (Date.now() < end) {\n\
             for (let i = 0; i < 100000; i++) x = (x * 31 + i) % 1000003;\n\
           }\n\
           return x;\n\
         }\n\
         console.log(process.pid, hotLoop(1500));\n",
    )
    .unwrap();
    // V8 also logs code events under this flag, to ./isolate-*.log unless
    // told where.
    let log = format!("--logfile={}", dir.path().join("v8.log").display());
    let (_, pid, folded) = record_jit(
        &dir.path().join("rec"),
        &[],
        &[
            "node",
            "--perf-basic-prof",
            &log,
            "--no-logfile-per-isolate",
            script.to_str().unwrap(),
        ],
    );
    // A map the user asked for (not CPython's) stays: it is the test's.
    let map = format!("/tmp/perf-{pid}.map");
    assert!(Path::new(&map).exists());
    let _ = std::fs::remove_file(map);
    // V8 names it "JS:*hotLoop …" (or "LazyCompile:…" in older nodes).
    let (hot, all) = samples_with(&folded, "node", &["hotLoop"]);
    // 1.5 s in hotLoop; node's start-up and exit are the rest.
    assert!(all >= 200, "{all} samples of node");
    assert!(
        hot as f64 >= 0.6 * all as f64,
        "{hot} of node's {all} samples name hotLoop"
    );
}

/// `gapscope run` of `cmd`, which prints its pid first, with cpu-clock
/// samples at 499 Hz: the run, the pid, and its cpu flamegraph folded.
fn record_jit(rec: &Path, args: &[&str], cmd: &[&str]) -> (Run, u32, PathBuf) {
    let r = run(
        rec,
        &[&["-q", "--freq", "499", "--no-exports"], args].concat(),
        cmd,
    );
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let pid: u32 = String::from_utf8_lossy(&r.output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let folded = rec.join("cpu.folded");
    succeed(
        Command::new(gapscope())
            .arg("export")
            .arg(rec)
            .args(["--flamegraph", "cpu", "--folded", "-o"])
            .arg(&folded),
    );
    (r, pid, folded)
}

/// Samples of the process `comm` in a folded cpu flamegraph: those whose
/// stack has frames naming each of `frames`, outermost first, and all.
fn samples_with(folded: &std::path::Path, comm: &str, frames: &[&str]) -> (u64, u64) {
    let (mut with, mut all) = (0u64, 0u64);
    for line in std::fs::read_to_string(folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        if stack.split(';').next() != Some(comm) {
            continue;
        }
        let n: u64 = n.parse().unwrap();
        all += n;
        let mut want = frames.iter().peekable();
        for f in stack.split(';') {
            if want.peek().is_some_and(|w| f.contains(**w)) {
                want.next();
            }
        }
        if want.peek().is_none() {
            with += n;
        }
    }
    (with, all)
}

/// Python stacks deeper than the unwinder walks (64 frames) are cut, and
/// the cut is marked where the outer frames would be, so a flamegraph never
/// shows a deep call as if it were called from the top; a shallow one
/// carries no mark.
#[test]
fn a_deep_python_stack_is_cut_and_marked() {
    let test = "a_deep_python_stack_is_cut_and_marked";
    if !bpf_ready(test) {
        return;
    }
    // The oldest, one with frame pointers (whose native stack reaches
    // the eval loop) and the newest.
    let all = pythons(test);
    let mut some: Vec<&Python> = all.first().into_iter().collect();
    some.extend(all.iter().find(|p| p.label.contains("with frame pointers")));
    some.extend(all.last());
    some.dedup_by_key(|p| p.path.clone());
    let _lock = recording_lock();
    for py in some {
        deep_stack_is_cut(py);
    }
}

fn deep_stack_is_cut(py: &Python) {
    let dir = scratch("python-deep");
    let script = dir.path().join("deep.py");
    std::fs::write(
        &script,
        "import os, sys, time\n\
         def spin(secs):\n\
         \x20   t = time.time()\n\
         \x20   while time.time() - t < secs:\n\
         \x20       sum(range(1000))\n\
         def down(n, secs):\n\
         \x20   return spin(secs) if n == 0 else down(n - 1, secs)\n\
         print(os.getpid(), flush=True)\n\
         down(int(sys.argv[1]), 0.6)\n\
         down(5, 0.6)\n",
    )
    .unwrap();
    let rec = dir.path().join("rec");
    let (_r, _pid, folded) = record_jit(
        &rec,
        &[],
        &[py.path.to_str().unwrap(), script.to_str().unwrap(), "100"],
    );
    let (mut deep, mut shallow) = (0u64, 0u64);
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        if frames[0] != py.comm || !frames.iter().any(|f| f.starts_with("py::spin")) {
            continue;
        }
        let n: u64 = n.parse().unwrap();
        let downs = frames.iter().filter(|f| f.starts_with("py::down")).count();
        let marked = frames.iter().filter(|f| f.starts_with("py::[more")).count();
        if downs > 6 {
            // spin + 63 down frames are walked; the 38 outer ones and
            // <module> are not, and the mark says so, outermost.
            assert_eq!(downs, 63, "{}: {line}", py.label);
            assert_eq!(marked, 1, "{}: {line}", py.label);
            let first_py = frames.iter().position(|f| f.starts_with("py::")).unwrap();
            assert!(
                frames[first_py].starts_with("py::[more"),
                "{}: {line}",
                py.label
            );
            deep += n;
        } else {
            assert_eq!(marked, 0, "{}: {line}", py.label);
            assert!(stack.contains("py::<module>"), "{}: {line}", py.label);
            shallow += n;
        }
    }
    // 0.6 s each at 499 Hz; start-up and a loaded machine take some.
    assert!(
        deep >= 100 && shallow >= 100,
        "{}: {deep} deep, {shallow} shallow samples",
        py.label
    );
}

/// Workers forked by the trainer (a DataLoader's, here multiprocessing's)
/// are the same interpreter at the same addresses: the kernel side walks
/// their frames from the fork on, and their Python functions are named in
/// about all the CPU time the kernel gave them.
#[test]
fn forked_workers_are_named() {
    let test = "forked_workers_are_named";
    let Some((py, _lock)) = one_python(test) else {
        return;
    };
    let dir = scratch("python-fork");
    let script = dir.path().join("workers.py");
    std::fs::write(
        &script,
        "import multiprocessing as mp, os, resource, time\n\
         def worker_decode(secs):\n\
         \x20   t = time.time()\n\
         \x20   x = 0\n\
         \x20   while time.time() - t < secs:\n\
         \x20       for i in range(20000):\n\
         \x20           x = (x * 31 + i) % 1000003\n\
         if __name__ == '__main__':\n\
         \x20   mp.set_start_method('fork')\n\
         \x20   ps = [mp.Process(target=worker_decode, args=(0.5,)) for _ in range(3)]\n\
         \x20   for p in ps: p.start()\n\
         \x20   for p in ps: p.join()\n\
         \x20   ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n\
         \x20   print(os.getpid(), ru.ru_utime + ru.ru_stime, *[p.pid for p in ps])\n",
    )
    .unwrap();
    let rec = dir.path().join("rec");
    let (r, _pid, folded) = record_jit(
        &rec,
        &[],
        &[py.path.to_str().unwrap(), script.to_str().unwrap()],
    );
    let out = String::from_utf8_lossy(&r.output.stdout).into_owned();
    let fields: Vec<&str> = out.split_whitespace().collect();
    let workers_cpu: f64 = fields[1].parse().unwrap();
    assert_eq!(fields.len(), 5, "{out}");
    // The workers' CPU time as the kernel counted it, in 499 Hz samples.
    let (named, _) = samples_with(&folded, &py.comm, &["py::worker_decode"]);
    let expected = workers_cpu * 499.0;
    assert!(
        named as f64 >= 0.7 * expected,
        "{}: {named} samples name worker_decode; the workers ran {workers_cpu:.2} CPU-s ({expected:.0} samples)",
        py.label
    );
}

/// An interpreter with frame pointers whose perf trampoline the user turned
/// on (PYTHONPERFSUPPORT=1) has each Python function on its native stack
/// too: it is named once, where the unwinder put it, not twice.
#[test]
fn a_trampolines_frames_are_not_counted_twice() {
    let test = "a_trampolines_frames_are_not_counted_twice";
    if !bpf_ready(test) {
        return;
    }
    let Some(py) = pythons(test)
        .into_iter()
        .find(|p| p.label.contains("with frame pointers"))
    else {
        return;
    };
    let _lock = recording_lock();
    let dir = scratch("python-trampoline");
    let script = dir.path().join("nested.py");
    std::fs::write(&script, NESTED).unwrap();
    let rec = dir.path().join("rec");
    let out = Command::new(gapscope())
        .args(["run", "-q", "--freq", "499", "--no-exports", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(&py.path)
        .arg(&script)
        .arg("1.0")
        .env("PYTHONPERFSUPPORT", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let folded = cpu_folded(&rec);
    let (named, all) = samples_with(&folded, &py.comm, &["py::outer", "py::inner"]);
    assert!(named as f64 >= 0.8 * all as f64, "{named} of {all}");
    let (twice, _) = samples_with(&folded, &py.comm, &["py::inner", "py::inner"]);
    assert_eq!(twice, 0, "py::inner named twice in {twice} samples");
}

/// A Python process in a container (its own pid and mount namespaces, its
/// own /tmp), attached to from outside: its functions are named.
#[test]
fn a_containers_python_is_named() {
    let test = "a_containers_python_is_named";
    if !bpf_ready(test) {
        return;
    }
    // Its own /tmp hides ours: an interpreter outside /tmp.
    let Some(py) = pythons(test)
        .into_iter()
        .find(|p| !p.path.starts_with("/tmp"))
    else {
        return;
    };
    let _lock = recording_lock();
    let dir = scratch("python-ns");
    let script = dir.path().join("nested.py");
    std::fs::write(&script, NESTED).unwrap();
    let build = target_dir().parent().unwrap().to_path_buf();
    let mut container = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount",
            "--propagation",
            "private",
            "--",
        ])
        .arg("sh")
        .arg("-c")
        // The script is reached through the build folder bound at /mnt
        // first, in case the checkout is under /tmp.
        .arg(format!(
            "mount --bind {} /mnt && mount -t tmpfs tmpfs /tmp && exec {} /mnt/{} 6",
            build.display(),
            py.path.display(),
            script.strip_prefix(&build).unwrap().display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(container.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    // It is pid 1 in its own namespace.
    assert!(ready.starts_with("1 "), "{ready}");
    let folded = attach_folded(container.id(), &dir.path().join("rec"));
    let _ = container.kill();
    let _ = container.wait();
    let (named, all) = samples_with(&folded, &py.comm, &["py::outer", "py::inner"]);
    assert!(all >= 200, "{all} samples of {}", py.comm);
    assert!(
        named as f64 >= 0.8 * all as f64,
        "{}: {named} of {all} samples name inner under outer",
        py.label
    );
}
