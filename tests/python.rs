//! Interpreted and JIT-compiled code in the stacks. CPython 3.12+ names its
//! functions through a perf map when its perf trampoline is on, which
//! `gapscope run` turns on; older CPython cannot, and the report says so.
//! The 3.13 here is built by `cargo xtask setup` from Debian's copy of the
//! upstream source (no registry here installs a 3.12+), with frame pointers;
//! the 3.11 is the machine's. Another real JIT that writes a perf map,
//! node's V8 (`--perf-basic-prof`), checks the same path independently of
//! Python.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gapscope_tests::*;

/// `gapscope run` gives the command PYTHONPERFSUPPORT=1 (3.12+ reads it)
/// unless told not to; a 3.11 interpreter is named in the report with why
/// its functions are not in the stacks.
#[test]
fn python_frames_are_asked_for_and_an_old_python_is_told_apart() {
    let test = "python_frames_are_asked_for_and_an_old_python_is_told_apart";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("python");
    let script = "import os, sys, time\n\
                  print(os.getpid(), os.environ.get('PYTHONPERFSUPPORT'), '%d.%d' % sys.version_info[:2])\n\
                  t = time.time()\n\
                  while time.time() - t < 0.3: pass\n";
    let said = |args: &[&str], rec: &str| {
        let r = run(
            &dir.path().join(rec),
            &[&["-q"], args].concat(),
            &["python3", "-c", script],
        );
        assert_eq!(r.code(), Some(0), "{}", r.stderr());
        let out = String::from_utf8(r.output.stdout.clone()).unwrap();
        let f: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        (r, f)
    };
    let (r, f) = said(&[], "rec");
    assert_eq!(f[1], "1", "PYTHONPERFSUPPORT as the command saw it");
    let (pid, version) = (&f[0], &f[2]);
    let (_, off) = said(&["--no-python-frames"], "rec-off");
    assert_eq!(off[1], "None");

    let report = r.report();
    let notes: Vec<&str> = report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .filter(|n| n.starts_with("Python "))
        .collect();
    let minor: u32 = version.split('.').nth(1).unwrap().parse().unwrap();
    if minor < 12 {
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with(&format!("Python {version} (pid {pid})"))
                && notes[0].contains("3.12 and later"),
            "{}",
            notes[0]
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

/// The CPython 3.13 `cargo xtask setup` builds, if it did.
fn python313(test: &str) -> Option<PathBuf> {
    let python = target_dir()
        .parent()
        .unwrap()
        .join("python3.13/bin/python3.13");
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var("GAPSCOPE_REQUIRE_PYTHON").as_deref() != Ok("1"),
        "{test}: {} is not built (cargo xtask setup builds it)",
        python.display()
    );
    eprintln!("skipping {test}: no CPython 3.13 built");
    None
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

/// CPython 3.13 under `gapscope run`: its Python functions are on the
/// stacks, caller under callee, where the time went; without the
/// trampoline, none is, and the report says why.
#[test]
fn python_functions_are_named_through_the_perf_trampoline() {
    let test = "python_functions_are_named_through_the_perf_trampoline";
    if !bpf_ready(test) {
        return;
    }
    let Some(python) = python313(test) else {
        return;
    };
    let _lock = recording_lock();
    let dir = scratch("py313");
    let script = dir.path().join("train.py");
    std::fs::write(
        &script,
        "import os, time\n\
         def decode_batch(n):\n\
         \x20   x = 0\n\
         \x20   for i in range(n):\n\
         \x20       x = (x * 31 + i) % 1000003\n\
         \x20   return x\n\
         def load_epoch(secs):\n\
         \x20   t = time.time()\n\
         \x20   while time.time() - t < secs:\n\
         \x20       decode_batch(20000)\n\
         print(os.getpid())\n\
         load_epoch(1.5)\n",
    )
    .unwrap();
    let record = |rec: &str, args: &[&str]| {
        record_jit(
            &dir.path().join(rec),
            args,
            &[python.to_str().unwrap(), script.to_str().unwrap()],
        )
    };
    let comm = "python3.13";
    let (r, pid, folded) = record("rec", &[]);
    // The map gapscope had it write went with it.
    assert!(!Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    let (named, all) = samples_with(&folded, comm, &["py::load_epoch", "py::decode_batch"]);
    // 1.5 s in decode_batch called from load_epoch; start-up and exit are
    // the rest.
    assert!(all >= 200, "{all} samples of {comm}");
    assert!(
        named as f64 >= 0.6 * all as f64,
        "{named} of {all} samples have load_epoch under decode_batch"
    );
    let notes = r.report()["notes"].to_string();
    assert!(!notes.contains("Python 3.13"), "{notes}");

    let (r, pid, folded) = record("rec-off", &["--no-python-frames"]);
    let (named, all) = samples_with(&folded, comm, &["py::"]);
    assert!(all >= 200 && named == 0, "{named} of {all}");
    let notes = r.report()["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "Python 3.13 (pid {pid}): no Python function was named"
        )),
        "{notes}"
    );
}

/// Workers forked by the trainer (a DataLoader's, here multiprocessing's)
/// write perf maps of their own: their Python functions are named too, in
/// about all the CPU time the kernel gave them. The maps gapscope made the
/// interpreter write are gone once the processes have exited and been
/// symbolized — a job forking workers every epoch would fill /tmp — while a
/// map the user asked for stays.
#[test]
fn forked_workers_are_named_and_leave_no_perf_maps_behind() {
    let test = "forked_workers_are_named_and_leave_no_perf_maps_behind";
    if !bpf_ready(test) {
        return;
    }
    let Some(python) = python313(test) else {
        return;
    };
    let _lock = recording_lock();
    let dir = scratch("py313-fork");
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
    let (r, pid, folded) = record_jit(
        &rec,
        &[],
        &[python.to_str().unwrap(), script.to_str().unwrap()],
    );
    let out = String::from_utf8_lossy(&r.output.stdout).into_owned();
    let fields: Vec<&str> = out.split_whitespace().collect();
    let workers_cpu: f64 = fields[1].parse().unwrap();
    let workers: Vec<u32> = fields[2..].iter().map(|p| p.parse().unwrap()).collect();
    assert_eq!(workers.len(), 3);
    for p in std::iter::once(pid).chain(workers.iter().copied()) {
        let map = format!("/tmp/perf-{p}.map");
        assert!(!Path::new(&map).exists(), "{map} left behind");
    }
    // The workers' CPU time as the kernel counted it, in 499 Hz samples.
    let (named, _) = samples_with(&folded, "python3.13", &["py::worker_decode"]);
    let expected = workers_cpu * 499.0;
    assert!(
        named as f64 >= 0.7 * expected,
        "{named} samples name worker_decode; the workers ran {workers_cpu:.2} CPU-s ({expected:.0} samples)"
    );

    // PYTHONPERFSUPPORT set by the user: the maps are theirs, and stay.
    let out = Command::new(gapscope())
        .args(["run", "-q", "--freq", "0", "--no-exports", "-o"])
        .arg(dir.path().join("rec-user"))
        .arg("--")
        .arg(&python)
        .args(["-c", "import os; print(os.getpid())"])
        .env("PYTHONPERFSUPPORT", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let map = format!("/tmp/perf-{pid}.map");
    let kept = Path::new(&map).exists();
    let _ = std::fs::remove_file(&map);
    assert!(kept, "{map}: the user's own perf map was removed");
}

/// A Python process in a container (its own pid and mount namespaces, its
/// own /tmp) writes its perf map where gapscope on the host does not look
/// by default — its /tmp, under the pid it sees (1) — and is attached to
/// from outside: its functions are named through /proc/PID/root.
#[test]
fn a_containers_python_is_named_from_its_own_tmp() {
    let test = "a_containers_python_is_named_from_its_own_tmp";
    if !bpf_ready(test) {
        return;
    }
    let Some(python) = python313(test) else {
        return;
    };
    let _lock = recording_lock();
    let dir = scratch("py313-ns");
    let script = dir.path().join("loop.py");
    std::fs::write(
        &script,
        "import time\n\
         def decode_batch(n):\n\
         \x20   x = 0\n\
         \x20   for i in range(n):\n\
         \x20       x = (x * 31 + i) % 1000003\n\
         t = time.time()\n\
         print('ready', flush=True)\n\
         while time.time() - t < 6:\n\
         \x20   decode_batch(20000)\n",
    )
    .unwrap();
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
        // Its own /tmp hides ours, and the build folder with it when the
        // checkout is under /tmp: the interpreter and the script are
        // reached through the build folder bound at /mnt first.
        .arg(format!(
            "mount --bind {} /mnt && mount -t tmpfs tmpfs /tmp && \
             exec env PYTHONPERFSUPPORT=1 /mnt/{} /mnt/{}",
            build.display(),
            python.strip_prefix(&build).unwrap().display(),
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
    assert_eq!(ready.trim(), "ready");
    let rec = dir.path().join("rec");
    let out = Command::new(gapscope())
        .args([
            "attach",
            "-q",
            "--duration",
            "1.5",
            "--freq",
            "499",
            "--no-exports",
        ])
        .arg("--pid")
        .arg(container.id().to_string())
        .arg("-o")
        .arg(&rec)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = container.kill();
    let _ = container.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folded = rec.join("cpu.folded");
    succeed(
        Command::new(gapscope())
            .arg("export")
            .arg(&rec)
            .args(["--flamegraph", "cpu", "--folded", "-o"])
            .arg(&folded),
    );
    let (named, all) = samples_with(&folded, "python3.13", &["py::decode_batch"]);
    assert!(all >= 200, "{all} samples of python3.13");
    assert!(
        named as f64 >= 0.6 * all as f64,
        "{named} of {all} samples name decode_batch"
    );
}
