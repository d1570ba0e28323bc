//! Recording for real: the built `gapscope` loads and attaches its BPF
//! programs and records example workloads whose behaviour is known. Each
//! figure is checked against an independent reference: the kernel's own
//! schedstat, the bytes the workload read, the waits it arranged.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gapscope_tests::*;
use serde_json::Value;

#[test]
fn o_direct_reads_are_file_time_with_exact_bytes() {
    if !bpf_ready("o_direct_reads_are_file_time_with_exact_bytes") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("oread");
    let (run, lines) = run_workload(
        dir.path(),
        &["-q", "--syscalls", "all"],
        &[
            "oread",
            "--mib",
            "64",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let t = truth_of(&lines, "oread")[0];
    let report = run.report();
    assert_partitions(&report);
    let th = thread(&report, u64_of(t, "tid"));

    assert_eq!(u64_of(&th["read_bytes"], "file"), u64_of(t, "bytes"));
    assert_eq!(u64_of(t, "bytes"), 64 << 20);
    // The kernel's accounting, as the thread itself read it, is the
    // report's: every byte came from the disk (and any block the file
    // system read for it besides, such as its extent tree).
    assert_storage_reads(th, t);
    let off = off_cpu_total(th);
    let file = u64_of(&th["off_cpu_ns"], "file");
    assert!(off > 0, "the O_DIRECT reader never blocked: {th}");
    assert!(
        file as f64 >= 0.7 * off as f64,
        "file is {file} of {off} ns off-CPU: {th}"
    );
}

#[test]
fn spinner_on_cpu_matches_schedstat() {
    if !bpf_ready("spinner_on_cpu_matches_schedstat") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("spin");
    let (run, lines) = run_workload(dir.path(), &["-q"], &["spin", "--ms", "400"]);
    let t = truth_of(&lines, "spin")[0];
    let report = run.report();
    let th = thread(&report, u64_of(t, "tid"));
    assert_close(
        "spinner on-CPU vs schedstat",
        u64_of(th, "on_cpu_ns"),
        u64_of(t, "schedstat_ns"),
        0.05,
    );
    // The account partitions the thread's lifetime exactly.
    assert_partitions(&report);
    assert!(u64_of(th, "samples") > 0, "no cpu-clock samples: {th}");
}

#[test]
fn waits_are_classified_by_what_they_wait_on() {
    if !bpf_ready("waits_are_classified_by_what_they_wait_on") {
        return;
    }
    let report = check_waits(&["-q", "--syscalls", "all"]);
    assert!(
        report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|th| !th["syscalls"].as_array().unwrap().is_empty()),
        "every syscall hooked, yet none recorded"
    );
}

/// By default no syscall is hooked: what each thread blocked in is read
/// from its registers as it blocks. The same kinds, and no syscall records.
#[test]
fn waits_are_classified_without_syscall_hooks() {
    if !bpf_ready("waits_are_classified_without_syscall_hooks") {
        return;
    }
    let report = check_waits(&["-q"]);
    for th in report["threads"].as_array().unwrap() {
        assert!(th["syscalls"].as_array().unwrap().is_empty(), "{th}");
    }
    assert!(
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("--syscalls blocking")),
        "the report says how it was recorded"
    );
}

fn check_waits(gapscope_args: &[&str]) -> Value {
    let _lock = recording_lock();
    let dir = scratch("waits");
    let (run, lines) = run_workload(dir.path(), gapscope_args, &["waits", "--ms", "300"]);
    let report = run.report();
    assert_partitions(&report);
    let waits = truth_of(&lines, "wait");
    assert_eq!(waits.len(), 5);
    for w in waits {
        let kind = w["kind"].as_str().unwrap();
        let field = match kind {
            // A socket's wait is its family's, whatever the call: accept on
            // a Unix socket is ipc, never net.
            "ipc-futex" | "ipc-pipe" | "ipc-accept" => "ipc",
            "net" => "net",
            "sleep" => "sleep",
            other => panic!("unexpected wait kind {other}"),
        };
        let th = thread(&report, u64_of(w, "tid"));
        assert_close(
            &format!("{kind} wait as off-CPU {field}"),
            u64_of(&th["off_cpu_ns"], field),
            u64_of(w, "arranged_ns"),
            0.20,
        );
    }
    report
}

#[test]
fn forked_workers_and_an_execd_grandchild_are_followed() {
    if !bpf_ready("forked_workers_and_an_execd_grandchild_are_followed") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("tree");
    let (run, lines) = run_workload(
        dir.path(),
        &["-q"],
        &[
            "tree",
            "--workers",
            "4",
            "--mib",
            "16",
            "--ms",
            "300",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let report = run.report();
    assert_partitions(&report);
    let workers = truth_of(&lines, "worker");
    assert_eq!(workers.len(), 4);
    for w in workers {
        let th = thread(&report, u64_of(w, "tid"));
        assert_close(
            &format!("worker {} on-CPU vs schedstat", w["index"]),
            u64_of(th, "on_cpu_ns"),
            u64_of(w, "schedstat_ns"),
            0.10,
        );
        // Bytes by the kernel's accounting, read as each worker exited:
        // its file, and at most the few bytes of its own schedstat.
        let read = u64_of(&th["io"], "read_chars");
        assert!(
            (u64_of(w, "bytes")..u64_of(w, "bytes") + 4096).contains(&read),
            "worker {} read {read}: {th}",
            w["index"]
        );
    }
    let grandchild = truth_of(&lines, "grandchild")[0];
    let gpid = u64_of(grandchild, "pid");
    let th = thread(&report, u64_of(grandchild, "tid"));
    assert_close(
        "exec'd grandchild on-CPU vs schedstat",
        u64_of(th, "on_cpu_ns"),
        u64_of(grandchild, "schedstat_ns"),
        0.10,
    );
    let process = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(gpid))
        .expect("grandchild process in the report");
    assert!(
        process["execs"][0]
            .as_str()
            .is_some_and(|e| e.ends_with("gs-workload")),
        "grandchild exec not recorded: {process}"
    );
}

#[test]
fn attach_follows_a_running_process_and_its_existing_child() {
    if !bpf_ready("attach_follows_a_running_process_and_its_existing_child") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("attach");
    let truth_path = dir.path().join("truth.jsonl");
    let mut target = Command::new(workload())
        .args(["hold", "--secs", "6", "--dir"])
        .arg(dir.path())
        .arg("--truth")
        .arg(&truth_path)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !truth_path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300)); // mid-flight
    let rec = dir.path().join("rec");
    let out = attach(&rec, target.id(), "1.5", &[]);
    let status = target.wait().unwrap();
    assert!(
        out.status.success(),
        "attach failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(status.success());
    let lines = truth(&truth_path);
    let hold = truth_of(&lines, "hold")[0];
    let (parent, child) = (u64_of(hold, "pid"), u64_of(hold, "child"));
    let report = report_json(&rec);
    assert_partitions(&report);
    assert_eq!(report["target"]["pid"].as_u64(), Some(parent));
    assert!(
        report["target"]["exit_code"].is_null(),
        "target outlived the recording"
    );
    let window = u64_of(&report["window_ns"], "end") - u64_of(&report["window_ns"], "start");
    assert_close("recording window", window, 1_500_000_000, 0.10);
    for pid in [parent, child] {
        let th = thread(&report, pid);
        assert_eq!(th["pid"].as_u64(), Some(pid));
        // Alive through the whole window, and doing its work in it.
        assert_close(
            &format!("{pid} lifetime"),
            u64_of(th, "lifetime_ns"),
            window,
            0.02,
        );
        assert!(u64_of(th, "on_cpu_ns") > 0, "{th}");
        // Counted from its reading at attach, not since the process began:
        // at most one 4 MiB pass per 20 ms sleep of the window.
        let read = u64_of(&th["io"], "read_chars");
        let most = (window / 20_000_000 + 2) * (4 << 20);
        assert!((4 << 20..most).contains(&read), "{th}");
        assert!(u64_of(&th["off_cpu_ns"], "sleep") > 0, "{th}");
    }
}

#[test]
fn a_process_outside_the_tree_never_appears() {
    if !bpf_ready("a_process_outside_the_tree_never_appears") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("sibling");
    let args = |truth: &Path| {
        vec![
            "oread".to_string(),
            "--mib".into(),
            "32".into(),
            "--dir".into(),
            dir.path().to_str().unwrap().into(),
            "--truth".into(),
            truth.to_str().unwrap().into(),
        ]
    };
    let sibling_truth = dir.path().join("sibling.jsonl");
    let mut sibling = Command::new(workload())
        .args(args(&sibling_truth))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let target_truth = dir.path().join("target.jsonl");
    let mut cmd = vec![workload().to_str().unwrap().to_string()];
    cmd.extend(args(&target_truth));
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let run = run(&dir.path().join("rec"), &["-q"], &cmd);
    assert!(sibling.wait().unwrap().success());
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let report = run.report();
    assert_partitions(&report);
    let sibling_pid = u64_of(&truth(&sibling_truth)[0], "pid");
    let target_pid = u64_of(&truth(&target_truth)[0], "pid");
    let pids: Vec<u64> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["pid"].as_u64().unwrap())
        .collect();
    assert!(pids.contains(&target_pid), "target missing: {pids:?}");
    assert!(
        !pids.contains(&sibling_pid),
        "sibling {sibling_pid} recorded: {pids:?}"
    );
    assert!(
        report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["pid"].as_u64() != Some(sibling_pid)),
        "sibling in processes"
    );
}

#[test]
fn offline_report_equals_the_one_printed_at_the_end_of_the_run() {
    if !bpf_ready("offline_report_equals_the_one_printed_at_the_end_of_the_run") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("offline");
    let rec = dir.path().join("rec");
    let run = run(
        &rec,
        &[],
        &[workload().to_str().unwrap(), "waits", "--ms", "50"],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let printed = run.stderr();
    let printed = printed
        .rsplit_once("\ngapscope: ")
        .map(|(report, _)| report.to_string())
        .expect("run printed its report and output directory");
    let offline = Command::new(gapscope())
        .arg("report")
        .arg(&rec)
        .output()
        .unwrap();
    assert!(offline.status.success());
    assert_eq!(
        String::from_utf8_lossy(&offline.stdout).trim_end(),
        printed.trim_end()
    );
    // And the files written beside the session are that same report.
    let json_file: Value =
        serde_json::from_str(&std::fs::read_to_string(rec.join("report.json")).unwrap()).unwrap();
    assert_eq!(json_file, report_json(&rec));
    assert_eq!(json_file["schema"], "gapscope.report/1");
    assert_eq!(json_file["gpus"], serde_json::json!([]));
    // gapscope says what it cost: some CPU while recording, and at least
    // the ring buffer it maps in its peak memory.
    let session = &json_file["session"];
    assert!(session["collector_cpu_ns"].as_u64().unwrap() > 0);
    assert!(session["collector_peak_rss_bytes"].as_u64().unwrap() > 32 << 20);
}

#[test]
fn run_exits_with_the_targets_exit_code() {
    if !bpf_ready("run_exits_with_the_targets_exit_code") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("exit");
    let r = run(&dir.path().join("a"), &["-q"], &["sh", "-c", "exit 7"]);
    assert_eq!(r.code(), Some(7), "{}", r.stderr());
    assert_eq!(r.report()["target"]["exit_code"], 7);
    let r = run(
        &dir.path().join("b"),
        &["-q"],
        &["sh", "-c", "kill -TERM $$"],
    );
    assert_eq!(r.code(), Some(128 + 15), "{}", r.stderr());
    let r = run(
        &dir.path().join("c"),
        &["-q"],
        &["gapscope-no-such-command"],
    );
    assert_eq!(r.code(), Some(127));
    assert_eq!(
        r.stderr().trim(),
        "gapscope: gapscope-no-such-command: command not found"
    );
}

#[test]
fn an_interrupt_sent_to_gapscope_reaches_the_target_and_the_recording_completes() {
    if !bpf_ready("an_interrupt_sent_to_gapscope_reaches_the_target_and_the_recording_completes") {
        return;
    }
    a_signal_to_gapscope_reaches_the_target(libc::SIGINT);
}

#[test]
fn a_second_interrupt_stops_recording_and_leaves_the_target_running() {
    if !bpf_ready("a_second_interrupt_stops_recording_and_leaves_the_target_running") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("sigint2");
    let rec = dir.path().join("rec");
    let child = Command::new(gapscope())
        .args(["run", "-q", "-o"])
        .arg(&rec)
        .args(["--", "sh", "-c", "trap '' INT; sleep 60"])
        .spawn()
        .unwrap();
    let target = target_of(child.id(), "sh");
    std::thread::sleep(Duration::from_millis(200));
    signal(child.id(), libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    signal(child.id(), libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let alive = Path::new(&format!("/proc/{target}")).exists();
    signal(target, libc::SIGKILL);
    assert!(alive, "the target should outlive the recording");
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT));
    let report = report_json(&rec);
    assert_partitions(&report);
    assert!(report["target"]["exit_code"].is_null());
    assert_eq!(report["session"]["stop_reason"], "interrupted");
    assert!(report["session"]["truncated"].is_null());
}

#[test]
fn a_killed_recorder_leaves_a_readable_truncated_session() {
    if !bpf_ready("a_killed_recorder_leaves_a_readable_truncated_session") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("sigkill");
    let rec = dir.path().join("rec");
    let mut child = Command::new(gapscope())
        .args(["run", "-q", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(workload())
        .args(["waits", "--ms", "3000"])
        .spawn()
        .unwrap();
    let target = target_of(child.id(), "gs-workload");
    std::thread::sleep(Duration::from_millis(1600));
    child.kill().unwrap(); // SIGKILL: no chance to finish the file
    child.wait().unwrap();
    signal(target, libc::SIGKILL); // orphaned now; not needed any more
                                   // What was flushed before the kill is there: the waiting threads, a
                                   // second or more into their waits.
    assert_cut_off_with_sleepers(&rec, 900_000_000);
}

/// `rec` reads as a recording that did not finish, partitioned, with a
/// thread asleep for at least `sleep_ns` in it.
fn assert_cut_off_with_sleepers(rec: &Path, sleep_ns: u64) {
    let report = report_json(rec);
    assert_partitions(&report);
    let truncated = report["session"]["truncated"]
        .as_str()
        .expect("marked truncated");
    assert!(truncated.contains("did not finish"), "{truncated}");
    let sleeping = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| u64_of(&t["off_cpu_ns"], "sleep") >= sleep_ns)
        .count();
    assert!(sleeping > 0, "{report}");
}

const PYTHON_WORKLOAD: &str = r#"
import json, os, sys, threading, time
def spin(secs):
    end = time.thread_time() + secs
    x = 0
    while time.thread_time() < end:
        x += 1
def read_all(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return n
            n += len(b)
def on_cpu():
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[0])
out = []
def sleeper():
    time.sleep(0.25)
    out.append({"role": "sleeper", "tid": threading.get_native_id(), "schedstat_ns": on_cpu()})
t = threading.Thread(target=sleeper)
t.start()
t.join()
spin(0.4)
n = read_all(sys.argv[2])
out.append({"role": "main", "tid": threading.get_native_id(), "bytes": n, "schedstat_ns": on_cpu()})
with open(sys.argv[1], "w") as f:
    f.write("".join(json.dumps(o) + "\n" for o in out))
# No interpreter teardown after the measurement: on a loaded machine it took
# 30+ ms of the main thread's CPU that the schedstat read above cannot see.
os._exit(0)
"#;

#[test]
fn a_python_program_agrees_with_the_kernels_accounting() {
    if !bpf_ready("a_python_program_agrees_with_the_kernels_accounting") {
        return;
    }
    let Some(python) = python() else {
        eprintln!("skipping a_python_program_agrees_with_the_kernels_accounting: no python3");
        return;
    };
    let _lock = recording_lock();
    let dir = scratch("python");
    let data = dir.path().join("data.bin");
    std::fs::write(&data, vec![7u8; 8 << 20]).unwrap();
    let truth_path = dir.path().join("truth.jsonl");
    let run = run(
        &dir.path().join("rec"),
        &["-q"],
        &[
            &python,
            "-c",
            PYTHON_WORKLOAD,
            truth_path.to_str().unwrap(),
            data.to_str().unwrap(),
        ],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let report = run.report();
    assert_partitions(&report);
    let lines = truth(&truth_path);
    let main = truth_of(&lines, "main")[0];
    let th = thread(&report, u64_of(main, "tid"));
    assert_close(
        "python main thread on-CPU vs schedstat",
        u64_of(th, "on_cpu_ns"),
        u64_of(main, "schedstat_ns"),
        0.05,
    );
    // The data file, plus whatever modules Python read on the way.
    let read = u64_of(&th["io"], "read_chars");
    assert!(
        read >= u64_of(main, "bytes") && read < u64_of(main, "bytes") + (8 << 20),
        "{read}"
    );
    // It waited for its thread in join(): a futex wait for the whole sleep.
    assert_close(
        "python join() as ipc",
        u64_of(&th["off_cpu_ns"], "ipc"),
        250_000_000,
        0.20,
    );
    let sleeper = thread(&report, u64_of(truth_of(&lines, "sleeper")[0], "tid"));
    assert_close(
        "python sleeper thread's sleep",
        u64_of(&sleeper["off_cpu_ns"], "sleep"),
        250_000_000,
        0.20,
    );
}

/// A busy loop's CPU time so far, by the kernel's schedstat.
fn schedstat_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no schedstat for {pid}"))
}

/// The scheduling group the kernel puts `pid` in, as /proc tells it: its
/// cpu cgroup and, where autogroups apply (on, and the task in the root
/// cpu cgroup), its autogroup.
fn sched_group(pid: u32) -> String {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let cpu = cgroup
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (controllers, path) = rest.split_once(':')?;
            controllers
                .split(',')
                .any(|c| c == "cpu")
                .then(|| path.to_string())
        })
        .or_else(|| {
            cgroup
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .unwrap_or_default();
    let autogroups = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|s| s.trim() == "1");
    if autogroups && cpu == "/" {
        let ag = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).unwrap_or_default();
        format!("/ {}", ag.split_whitespace().next().unwrap_or(""))
    } else {
        cpu
    }
}

/// What unrecorded tasks ran goes to the job's own scheduling group or
/// elsewhere, as the kernel groups them: a busy loop started from the same
/// session shares the job's autogroup, one in a session of its own does not
/// (unless cgroups put them together). Each loop's CPU time by its
/// schedstat is the reference; everything else the machine ran only adds.
#[test]
fn neighbours_cpu_goes_to_the_jobs_scheduling_group_or_elsewhere() {
    if !bpf_ready("neighbours_cpu_goes_to_the_jobs_scheduling_group_or_elsewhere") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("neighbours");
    let mut loops = [busy_loop(false), busy_loop(true)];
    let pids = loops.each_ref().map(|c| c.id());
    // Each loop's CPU time, read every 10 ms on the recording's clock: the
    // reference is what each ran between the recording's first and last
    // readings, not over a longer stretch (a loop gets less of the CPUs
    // while the job and the recorder run than before and after).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                samples.push((gapscope::clock::monotonic_ns(), pids.map(schedstat_ns)));
                std::thread::sleep(Duration::from_millis(10));
            }
            samples.push((gapscope::clock::monotonic_ns(), pids.map(schedstat_ns)));
            samples
        })
    };
    let (run, _) = run_workload(dir.path(), &["-q"], &["spin", "--ms", "1500"]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let samples = sampler.join().unwrap();
    let groups = pids.map(sched_group);
    let job = sched_group(std::process::id());
    for c in &mut loops {
        let _ = c.kill();
        let _ = c.wait();
    }
    let s = gapscope::session::read_session(&run.dir).unwrap();
    let (first, last) = (s.neighbours.first().unwrap(), s.neighbours.last().unwrap());
    let span = (last.ts - first.ts) as f64;
    assert!(span > 1e9, "{} readings over {span} ns", s.neighbours.len());
    let same = (last.same_group_ns - first.same_group_ns) as f64 / span;
    let elsewhere = (last.elsewhere_ns - first.elsewhere_ns) as f64 / span;
    // Loop `i`'s CPU time at `t`, between the samples around it.
    let at = |t: u64, i: usize| -> f64 {
        let k = samples
            .partition_point(|s| s.0 <= t)
            .clamp(1, samples.len() - 1);
        let ((t0, c0), (t1, c1)) = (&samples[k - 1], &samples[k]);
        let f = (t.clamp(*t0, *t1) - t0) as f64 / (t1 - t0).max(1) as f64;
        c0[i] as f64 + f * (c1[i] - c0[i]) as f64
    };
    assert!(samples[0].0 <= first.ts && samples.last().unwrap().0 >= last.ts);
    let rates: [f64; 2] = std::array::from_fn(|i| (at(last.ts, i) - at(first.ts, i)) / span);
    eprintln!(
        "loops {rates:.2?} CPUs in {groups:?} (the job's: {job}); recorded: {same:.2} CPUs in the job's group, {elsewhere:.2} elsewhere"
    );
    let (mut want_same, mut want_elsewhere) = (0.0, 0.0);
    for (rate, group) in rates.iter().zip(&groups) {
        if *group == job {
            want_same += rate;
        } else {
            want_elsewhere += rate;
        }
    }
    assert!(
        same >= 0.9 * want_same,
        "the job's group: {same:.3} CPUs recorded, its loop alone had {want_same:.3}"
    );
    assert!(
        elsewhere >= 0.9 * want_elsewhere,
        "elsewhere: {elsewhere:.3} CPUs recorded, the other loop alone had {want_elsewhere:.3}"
    );
}

/// A pipeline blocking 100 k times a second, whose decoder alternates
/// between reading one pipe and writing another: each wait must keep its
/// own kernel path — every blocked read through the kernel's read, every
/// blocked write through its write. (It guards any saving on the
/// blocked-time stacks: a reuse of the last kernel walk that ignored the
/// syscall failed it.)
#[test]
fn blocked_reads_and_writes_keep_their_own_kernel_paths() {
    if !bpf_ready("blocked_reads_and_writes_keep_their_own_kernel_paths") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("kstacks");
    let rec = dir.path().join("rec");
    let dir_arg = dir.path().to_str().unwrap();
    let (mut reads, mut writes) = (0u64, 0u64);
    for (line, chain, ns) in gs_bench_offcpu(
        &rec,
        &[
            "relay",
            "--chunks",
            "20000",
            "--read-kib",
            "4",
            "--decode-passes",
            "1",
            "--cpu",
            "1",
            "--dir",
            dir_arg,
        ],
    ) {
        let line = line.as_str();
        let frames: Vec<&str> = chain.split(';').collect();
        let user = |f: &str| {
            frames
                .iter()
                .any(|x| x.ends_with(f) && !x.ends_with("_[k]"))
        };
        let kernel = |f: &str| frames.contains(&format!("{f}_[k]").as_str());
        if user("libc_read") {
            assert!(kernel("ksys_read") && !kernel("ksys_write"), "{line}");
            reads += ns;
        }
        if user("libc_write") {
            assert!(kernel("ksys_write") && !kernel("ksys_read"), "{line}");
            writes += ns;
        }
    }
    // Both kinds of wait were seen, at length (the three stages each block
    // 20 000 times).
    assert!(
        reads > 10_000_000 && writes > 10_000_000,
        "{reads} {writes}"
    );
}

/// `gs-bench ARGS` recorded into `rec`: its off-CPU flamegraph, folded, as
/// (line, stack, nanoseconds).
fn gs_bench_offcpu(rec: &Path, args: &[&str]) -> Vec<(String, String, u64)> {
    succeed(
        Command::new(gapscope())
            .args(["run", "-q", "--no-exports", "-o"])
            .arg(rec)
            .arg("--")
            .arg(bin("gs-bench"))
            .args(args),
    );
    let out = succeed(
        Command::new(gapscope())
            .args(["export", "--flamegraph", "offcpu", "--folded"])
            .arg(rec),
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (chain, ns) = line.rsplit_once(' ').unwrap();
            (line.to_string(), chain.to_string(), ns.parse().unwrap())
        })
        .collect()
}

/// One wait reached from two call paths that differ two frames above the
/// read: every 100th read is made from `wait_slow` and blocks for the 1 ms
/// its writer sleeps first, the rest from `wait_fast` and block for a
/// hand-over. Each wait must keep its own user stack — the slow site's
/// time is at least its reads' sleeps. (It guards the reuse of the last
/// user walk: a fingerprint that stopped one return address short gave
/// the slow waits the fast site's stack, and the slow site a small part
/// of its time.)
#[test]
fn waits_from_two_call_paths_keep_their_own_user_stacks() {
    if !bpf_ready("waits_from_two_call_paths_keep_their_own_user_stacks") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("ustacks");
    let rec = dir.path().join("rec");
    let (rounds, every, slow_us) = (20_000u64, 100u64, 1000u64);
    let (rounds_arg, every_arg, slow_arg) =
        (rounds.to_string(), every.to_string(), slow_us.to_string());
    let (mut slow, mut fast) = (0u64, 0u64);
    for (line, chain, ns) in gs_bench_offcpu(
        &rec,
        &[
            "sites",
            "--cpu",
            "1",
            "--rounds",
            &rounds_arg,
            "--slow-every",
            &every_arg,
            "--slow-us",
            &slow_arg,
        ],
    ) {
        let (in_slow, in_fast) = (chain.contains("wait_slow"), chain.contains("wait_fast"));
        assert!(!(in_slow && in_fast), "{line}");
        if in_slow {
            slow += ns;
        }
        if in_fast {
            fast += ns;
        }
    }
    // Each slow read waits at least through its writer's sleep.
    let floor = rounds.div_ceil(every) * slow_us * 1000;
    assert!(
        slow >= floor * 9 / 10,
        "the slow site: {slow} ns blocked, its writer slept {floor} ns (the fast site {fast} ns)"
    );
    assert!(fast > 0, "the fast site's waits were not seen");
}

/// The windows `run --window` wrote in `rec`, in time order.
fn windows_of(rec: &Path) -> Vec<std::path::PathBuf> {
    let windows = gapscope::session::windows_in(rec);
    assert!(
        !rec.join(gapscope::session::FILE_NAME).exists(),
        "no session file beside the windows"
    );
    windows
}

/// The events a session file holds, counted from its records.
fn events_in(window: &Path) -> u64 {
    let reader = gapscope::session::SessionReader::open(&window.join(gapscope::session::FILE_NAME))
        .expect("a window's session");
    reader
        .filter(|r| matches!(r, gapscope::session::Record::Event(_)))
        .count() as u64
}

/// `run --window`: the recording is on disk as windows while it goes, and
/// reads back as one session — every kernel once (the GPU's busy time is
/// simtrain's own to the nanosecond, though kernels ran across the cuts and
/// each window next to a cut holds them), every event of every window, one
/// job from its start to its exit.
#[test]
fn a_run_cut_into_windows_reads_as_one_session() {
    if !bpf_ready("a_run_cut_into_windows_reads_as_one_session") {
        return;
    }
    simtrain_data();
    let _lock = recording_lock();
    let dir = scratch("windows");
    let (run, truth) = run_simtrain(
        dir.path(),
        &["-q", "--window", "1"],
        &["--bottleneck", "input-io", "--steps", "300"],
    );
    let rec = dir.path().join("rec");
    let windows = windows_of(&rec);
    assert!(windows.len() >= 3, "{windows:?}");
    let report = run.report();
    assert_partitions(&report);
    assert_eq!(report["session"]["mode"], "run");
    assert_eq!(report["session"]["stop_reason"], "target exited");
    assert!(
        report["session"]["truncated"].is_null(),
        "{}",
        report["session"]
    );
    let gpu = &report["gpus"][0];
    assert_eq!(u64_of(gpu, "busy_ns"), u64_of(&truth, "busy_ns"));
    let events: u64 = windows.iter().map(|w| events_in(w)).sum();
    assert_eq!(u64_of(&report["session"], "events"), events);
    // Each window also reads alone, as the part of the job it saw.
    let second = report_json(&windows[1]);
    assert_eq!(second["session"]["mode"], "window");
    assert!(u64_of(&second["session"], "duration_ns") < u64_of(&report["session"], "duration_ns"));
}

/// A recorder killed mid-run with `--window` loses at most the window it
/// was writing: the windows closed before are whole, and the folder reads
/// as one session to where the recording stopped.
#[test]
fn a_killed_recorder_loses_at_most_the_window_being_written() {
    if !bpf_ready("a_killed_recorder_loses_at_most_the_window_being_written") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("sigkill-windows");
    let rec = dir.path().join("rec");
    let mut child = Command::new(gapscope())
        .args(["run", "-q", "--window", "1", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(workload())
        .args(["waits", "--ms", "5000"])
        .spawn()
        .unwrap();
    let target = target_of(child.id(), "gs-workload");
    // Until two windows are closed (a third being written).
    let deadline = Instant::now() + Duration::from_secs(20);
    while windows_of(&rec).len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL: no chance to close the window
    child.wait().unwrap();
    signal(target, libc::SIGKILL);
    let windows = windows_of(&rec);
    assert!(windows.len() >= 3, "{windows:?}");
    let (last, closed) = windows.split_last().unwrap();
    for w in closed {
        let footer =
            gapscope::session::SessionReader::footer(&w.join(gapscope::session::FILE_NAME));
        assert!(footer.is_some(), "{} has its end", w.display());
    }
    assert!(
        gapscope::session::SessionReader::footer(&last.join(gapscope::session::FILE_NAME))
            .is_none()
    );
    // The closed windows' second and more of the waiting threads' sleep.
    assert_cut_off_with_sleepers(&rec, 1_900_000_000);
}
