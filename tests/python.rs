//! Interpreted and JIT-compiled code in the stacks. CPython 3.12+ names its
//! functions through a perf map when its perf trampoline is on, which
//! `gapscope run` turns on; older CPython cannot, and the report says so.
//! No CPython 3.12+ can be installed from the registries this project
//! builds from, so the perf-map path is checked with another real JIT that
//! writes one: node's V8 (`--perf-basic-prof`).

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
    let rec = dir.path().join("rec");
    let r = run(
        &rec,
        &["-q", "--freq", "499", "--no-exports"],
        &["node", "--perf-basic-prof", script.to_str().unwrap()],
    );
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let pid: u32 = String::from_utf8_lossy(&r.output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let folded = dir.path().join("cpu.folded");
    succeed(
        Command::new(gapscope())
            .arg("export")
            .arg(&rec)
            .args(["--flamegraph", "cpu", "--folded", "-o"])
            .arg(&folded),
    );
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let (mut hot, mut all) = (0u64, 0u64);
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        if !stack.starts_with("node;") {
            continue;
        }
        let n: u64 = n.parse().unwrap();
        all += n;
        if stack.split(';').any(|f| f.contains("hotLoop")) {
            hot += n;
        }
    }
    // 1.5 s in hotLoop; node's start-up and exit are the rest.
    assert!(all >= 200, "{all} samples of node");
    assert!(
        hot as f64 >= 0.6 * all as f64,
        "{hot} of node's {all} samples name hotLoop"
    );
}
