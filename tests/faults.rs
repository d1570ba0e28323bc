//! Faults around a recording: the target crashing or forking wildly,
//! gapscope itself signalled, the ring buffer overflowing, the target
//! vanishing while `attach` starts, pids reused. In each case the target's
//! exit status is what it would have been without gapscope, the session
//! reads back, and losses are counted rather than hidden.

use std::process::{Command, Stdio};

use gapscope_tests::*;
use serde_json::Value;

#[test]
fn a_crashing_target_exits_as_it_would_and_its_session_reads() {
    if !bpf_ready("a_crashing_target_exits_as_it_would_and_its_session_reads") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("crash");
    for (how, signo) in [("segv", libc::SIGSEGV), ("abort", libc::SIGABRT)] {
        // Bare, for what "as it would" means on this machine.
        let bare = Command::new(workload())
            .args(["crash", "--how", how, "--ms", "100"])
            .status()
            .unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&bare),
            Some(signo)
        );
        let r = run(
            &dir.path().join(how),
            &["-q"],
            &[
                workload().to_str().unwrap(),
                "crash",
                "--how",
                how,
                "--ms",
                "300",
            ],
        );
        assert_eq!(r.code(), Some(128 + signo), "{how}: {}", r.stderr());
        let report = r.report();
        assert_partitions(&report);
        assert_eq!(report["target"]["exit_code"], 128 + signo);
        assert_eq!(report["session"]["stop_reason"], "target exited");
        assert!(report["session"]["truncated"].is_null());
        // It computed for its 300 ms before crashing, and that is in.
        let t = &report["threads"][0];
        assert!(u64_of(t, "on_cpu_ns") >= 250_000_000, "{t}");
    }
}

#[test]
fn two_hundred_short_lived_children_are_all_followed() {
    if !bpf_ready("two_hundred_short_lived_children_are_all_followed") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("forks");
    let (r, lines) = run_workload(
        dir.path(),
        &["-q"],
        &[
            "forks",
            "--children",
            "200",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let report = r.report();
    assert_partitions(&report);
    assert_eq!(report["drops"]["cpu_events"], 0);
    let children: Vec<u64> = truth_of(&lines, "parent")[0]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(children.len(), 200);
    let processes = report["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 201);
    for c in &children {
        let p = processes
            .iter()
            .find(|p| p["pid"].as_u64() == Some(*c))
            .unwrap_or_else(|| panic!("child {c} not followed"));
        assert_eq!(p["exit_code"], 0, "{p}");
        // Each read its 4 KiB, and the kernel's accounting of it, read as
        // the child exited, is in its thread's account.
        let t = thread(&report, *c);
        assert_eq!(u64_of(&t["io"], "read_chars"), 4096, "{t}");
        assert_eq!(u64_of(&t["io"], "read_calls"), 1, "{t}");
    }
}

#[test]
fn a_terminate_sent_to_gapscope_reaches_the_target_and_the_recording_completes() {
    if !bpf_ready("a_terminate_sent_to_gapscope_reaches_the_target_and_the_recording_completes") {
        return;
    }
    a_signal_to_gapscope_reaches_the_target(libc::SIGTERM);
}

#[test]
fn a_target_that_exits_while_attach_starts_is_handled() {
    if !bpf_ready("a_target_that_exits_while_attach_starts_is_handled") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("attach-race");
    // From gone before attach looks, through gone while the programs load,
    // to gone after recording started: a one-line error or a complete
    // session, never a hang or a panic.
    for (i, life) in ["0", "0.05", "0.15", "0.3", "0.6"].iter().enumerate() {
        let mut target = Command::new("sleep").arg(life).spawn().unwrap();
        let rec = dir.path().join(format!("rec{i}"));
        let out = Command::new(gapscope())
            .args(["attach", "-q", "--duration", "20", "-p"])
            .arg(target.id().to_string())
            .arg("-o")
            .arg(&rec)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        target.wait().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        match out.status.code() {
            Some(0) => {
                let report = report_json(&rec);
                assert_eq!(
                    report["session"]["stop_reason"], "target exited",
                    "life {life}"
                );
                assert!(report["session"]["truncated"].is_null());
            }
            Some(1) => {
                assert_eq!(err.trim_end().lines().count(), 1, "{err}");
                assert!(err.contains(&target.id().to_string()), "{err}");
            }
            other => panic!("life {life}: exit {other:?}: {err}"),
        }
    }
}

#[test]
fn an_overflowing_ring_buffer_counts_its_drops_and_marks_where() {
    if !bpf_ready("an_overflowing_ring_buffer_counts_its_drops_and_marks_where") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("overflow");
    let rec = dir.path().join("rec");
    // A 1 MiB ring, and event generators at a higher priority on the
    // recorder's own CPU: its reader cannot keep up.
    let out = Command::new("taskset")
        .args(["-c", "0"])
        .arg(gapscope())
        // Every syscall hooked: the flood is of syscall records.
        .args([
            "run",
            "-q",
            "--no-exports",
            "--syscalls",
            "all",
            "--buffer-mb",
            "1",
            "-o",
        ])
        .arg(&rec)
        .arg("--")
        .arg(bin("gs-bench"))
        .args([
            "events",
            "--threads",
            "2",
            "--secs",
            "2",
            "--cpu",
            "0",
            "--nice",
            "-20",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = report_json(&rec);
    let drops = &report["drops"];
    assert!(u64_of(drops, "cpu_events") > 1000, "{drops}");
    // Counted per kind, and the kinds add up.
    let by_kind: u64 = drops["cpu_by_kind"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(by_kind, u64_of(drops, "cpu_events"));
    assert!(
        drops["cpu_by_kind"]["syscall"].as_u64().unwrap() > 0,
        "{drops}"
    );
    // Where they were lost is marked, inside the recording.
    let window = &report["window_ns"];
    let lossy = drops["lossy_windows_ns"].as_array().unwrap();
    assert!(!lossy.is_empty(), "{drops}");
    for w in lossy {
        assert!(u64_of(w, "start") >= u64_of(window, "start"), "{w}");
        assert!(
            u64_of(w, "end") <= u64_of(window, "end") + 1_000_000_000,
            "{w}"
        );
        assert!(u64_of(w, "end") > u64_of(w, "start"));
    }
    let notes: Vec<&str> = report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("events were lost")),
        "{notes:?}"
    );
    // The text report's header says it too.
    let text = String::from_utf8(gapscope_stdout(&["report", rec.to_str().unwrap()])).unwrap();
    assert!(
        text.lines().nth(3).unwrap_or("").starts_with("drops: "),
        "{text}"
    );
    assert!(text.contains("syscall"), "{text}");
    // The timeline shows the same windows on the recording's own track, so
    // that nobody reads a gap inside one as the job's.
    let trace: Value = serde_json::from_slice(&gapscope_stdout(&[
        "export",
        rec.to_str().unwrap(),
        "--timeline",
    ]))
    .unwrap();
    let lost: Vec<(f64, f64)> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "lossy")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (ts, ts + e["dur"].as_f64().unwrap())
        })
        .collect();
    let t0 = u64_of(window, "start");
    let t1 = u64_of(window, "end");
    let expected: Vec<(f64, f64)> = lossy
        .iter()
        .map(|w| (u64_of(w, "start").max(t0), u64_of(w, "end").min(t1)))
        .filter(|(s, e)| e > s)
        .map(|(s, e)| ((s - t0) as f64 / 1e3, (e - t0) as f64 / 1e3))
        .collect();
    assert!(!expected.is_empty(), "{lossy:?}");
    assert_eq!(lost.len(), expected.len(), "{lost:?} vs {expected:?}");
    for (a, b) in lost.iter().zip(&expected) {
        assert!(
            (a.0 - b.0).abs() < 0.01 && (a.1 - b.1).abs() < 0.01,
            "{lost:?} vs {expected:?}"
        );
    }
}

#[test]
fn a_reused_pid_is_two_processes_not_one() {
    if !bpf_ready("a_reused_pid_is_two_processes_not_one") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("reuse");
    let (r, lines) = run_workload(dir.path(), &["-q"], &["reuse"]);
    let t = truth_of(&lines, "parent")[0];
    let (first, second) = (u64_of(t, "first"), u64_of(t, "second"));
    if first != second {
        // Another process took the pid first (ns_last_pid is a hint).
        eprintln!("skipping a_reused_pid_is_two_processes_not_one: the pid was not reused");
        return;
    }
    let report = r.report();
    assert_partitions(&report);
    let lives: Vec<&Value> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tid"].as_u64() == Some(first))
        .collect();
    assert_eq!(lives.len(), 2, "two threads with tid {first}: {lives:?}");
    // In time order: the spinner (100 ms on a CPU), then the sleeper.
    assert!(u64_of(lives[0], "on_cpu_ns") >= 80_000_000, "{}", lives[0]);
    assert!(
        u64_of(&lives[1]["off_cpu_ns"], "sleep") >= 180_000_000,
        "{}",
        lives[1]
    );
    assert!(u64_of(lives[1], "on_cpu_ns") < 50_000_000, "{}", lives[1]);
    let processes: Vec<&Value> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(first))
        .collect();
    assert_eq!(processes.len(), 2);
    assert!(processes
        .iter()
        .all(|p| p["exit_code"] == 0 && p["threads"] == 1));
}

#[test]
fn gpu_records_the_shim_drops_mark_their_span_instead_of_reading_as_idle() {
    // The simulated device drops one step's records the way the shim's
    // transport does when its queue is full, and says which span they
    // covered. Without that, the step would read as GPU idle with a cause.
    if !bpf_ready("gpu_records_the_shim_drops_mark_their_span_instead_of_reading_as_idle") {
        return;
    }
    simtrain_data(); // made before taking the lock
    let _lock = recording_lock();
    let dir = scratch("gpu-lost");
    let (run, truth) = run_simtrain(
        dir.path(),
        &["-q", "--no-exports"],
        &[
            "--bottleneck",
            "sync",
            "--steps",
            "12",
            "--lose-gpu-step",
            "5",
        ],
    );
    let lost = &truth["lost_gpu"];
    let (start, end) = (u64_of(lost, "start"), u64_of(lost, "end"));
    assert!(end - start > 5_000_000, "a step is several ms: {lost}");
    let report = run.report();
    let drops = &report["drops"];
    assert_eq!(drops["gpu_records"], lost["records"], "{drops}");
    let windows = drops["lossy_windows_ns"].as_array().unwrap();
    assert!(
        windows
            .iter()
            .any(|w| u64_of(w, "start") <= start && end <= u64_of(w, "end")),
        "no lossy window covers {lost}: {drops}"
    );
    // Every step syncs, so no delivered kernel runs inside the lost step:
    // all of its span reads as idle, and all of that is unattributed.
    let g = &report["gpus"][0];
    assert!(
        u64_of(&g["idle_by_cause_ns"], "unattributed") >= end - start,
        "{g}"
    );
    assert!(u64_of(g, "busy_ns") < u64_of(&truth, "busy_ns"));
}
