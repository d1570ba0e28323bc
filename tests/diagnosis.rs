//! The diagnosis against ground truth: simtrain produces a known bottleneck
//! with real data loading on the host and a simulated GPU, and writes the
//! idle time each cause produced by its own accounting. The report must
//! name the same dominant cause and each cause's share of idle within 5
//! percentage points.

use gapscope_tests::*;
use serde_json::Value;
use std::process::{Command, Stdio};

const STEADY_CAUSES: [&str; 8] = [
    "input.io",
    "input.cpu",
    "input.network",
    "cpu.host",
    "cpu.launch",
    "cpu.contention",
    "sync",
    "memory",
];

fn share(v: &Value, cause: &str, total: u64) -> f64 {
    v[cause].as_u64().unwrap_or(0) as f64 * 100.0 / total.max(1) as f64
}

/// The largest cause outside start-up and tear-down.
fn dominant(causes: &Value) -> String {
    STEADY_CAUSES
        .iter()
        .max_by_key(|c| causes[**c].as_u64().unwrap_or(0))
        .unwrap()
        .to_string()
}

fn scenario(bottleneck: &str, gapscope_args: &[&str]) -> (Value, Value, Value) {
    simtrain_data(); // made before taking the lock
    let _lock = recording_lock();
    let dir = scratch(&format!("simtrain-{bottleneck}"));
    let mut args = vec!["-q"];
    args.extend_from_slice(gapscope_args);
    let (run, truth) = run_simtrain(dir.path(), &args, &["--bottleneck", bottleneck]);
    let report = run.report();
    assert_partitions(&report);
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{report}");
    let g = gpus[0].clone();
    // The JSON invariants, exactly.
    assert_eq!(g["source"], "simulated");
    assert_gpu_partitions(&g);
    assert_eq!(u64_of(&g, "busy_ns"), u64_of(&truth, "busy_ns"));
    (g, truth, report)
}

fn check(bottleneck: &str, gapscope_args: &[&str], expected: &[&str]) {
    let (g, truth, report) = scenario(bottleneck, gapscope_args);
    let idle = u64_of(&g, "idle_ns");
    let truth_idle: u64 = truth["idle_by_cause_ns"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let (got, want) = (&g["idle_by_cause_ns"], &truth["idle_by_cause_ns"]);
    let table: Vec<String> = STEADY_CAUSES
        .iter()
        .chain(["startup", "teardown", "unattributed"].iter())
        .map(|c| {
            format!(
                "{c}: report {:.1}% truth {:.1}%",
                share(got, c, idle),
                share(want, c, truth_idle)
            )
        })
        .collect();
    // What the recording saw of the feeder's CPU and of its own losses,
    // to tell a wrong rule from a recording that missed something.
    let feeder = &g["pids"][0];
    let threads: Vec<String> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["pid"] == *feeder)
        .map(|t| {
            format!(
                "thread {} {}: on CPU {} runnable {} stolen {} off CPU {} (ns), {} page faults",
                t["tid"],
                t["comm"],
                t["on_cpu_ns"],
                t["runnable_ns"],
                t["stolen_ns"],
                t["off_cpu_ns"],
                t["page_faults"]
            )
        })
        .collect();
    // The truth in ns beside the report's, and the feeder's time blocked
    // inside launch calls (neither side's contention).
    let table = format!(
        "{}\n  {}\n  drops {}\n  report idle {} ns by cause {}\n  truth by cause {}, blocked in launches {} ns",
        table.join("\n  "),
        threads.join("\n  "),
        report["drops"],
        idle,
        got,
        want,
        truth["blocked_in_launches_ns"]
    );
    eprintln!("{bottleneck}:\n  {table}");
    // Which of a mixed scenario's causes dominates depends on this machine's
    // storage: it must be one the scenario makes, and ground truth's own
    // when that leads by more than the 5-point tolerance below.
    let top = dominant(got);
    let mut truth_shares: Vec<f64> = STEADY_CAUSES
        .iter()
        .map(|c| share(want, c, truth_idle))
        .collect();
    truth_shares.sort_by(|a, b| b.total_cmp(a));
    if truth_shares[0] - truth_shares[1] > 5.0 {
        assert_eq!(top, dominant(want), "dominant cause\n  {table}");
    }
    // On a machine busy enough that waiting for a CPU outgrew the
    // scenario's own cause by the truth's count, that is the one to name;
    // one the truth puts within the tolerance of its first may lead too
    // (beside two busy loops the launch scenario's truth had cpu.launch at
    // 52.2% and cpu.contention at 47.5%, the report 48.6% and 49.0%).
    assert!(
        expected.contains(&top.as_str())
            || top == dominant(want)
            || share(want, &top, truth_idle) >= truth_shares[0] - 5.0,
        "{top}\n  {table}"
    );
    for c in STEADY_CAUSES.iter().chain(["startup", "teardown"].iter()) {
        let (a, b) = (share(got, c, idle), share(want, c, truth_idle));
        assert!(
            (a - b).abs() <= 5.0,
            "{c}: report {a:.1}% vs truth {b:.1}%\n  {table}"
        );
    }
    assert!(
        share(got, "unattributed", idle) <= 5.0,
        "unattributed\n  {table}"
    );
    for c in expected {
        // A major cause: a tenth of the idle, or, where this machine made
        // the scenario's other cause so large that the truth's own share of
        // this one fell under a fifth (slow storage under load: input.io
        // 86%, sync 8.9% of the truth's idle), half the truth's share and
        // at least 5% — it is named, and the check above holds it to the
        // truth. (A floor that jumped from 5 to 10 as the truth passed 10%
        // asked a report of 8.7% against a truth of 10.2% for more than the
        // 5-point tolerance: mixed, beside two busy loops and a disk-heavy
        // neighbour.)
        let floor = (share(want, c, truth_idle) / 2.0).clamp(5.0, 10.0);
        assert!(
            share(got, c, idle) >= floor,
            "{c} should be a major cause\n  {table}"
        );
        let rec = report["recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cause"] == *c)
            .unwrap_or_else(|| panic!("no recommendation for {c}: {}", report["recommendations"]));
        assert!(rec["est_speedup"].as_f64().unwrap() > 1.0);
        assert!(!rec["evidence"].as_array().unwrap().is_empty());
    }
    // The top recommendation is the one whose fix gives back most, as
    // replayed (the dominant idle cause may hide behind another: mixed), and
    // the verdict names it.
    let recs = report["recommendations"].as_array().unwrap();
    let gain = |r: &Value| r["what_if"]["speedup"].as_f64().unwrap();
    let best = recs
        .iter()
        .max_by(|a, b| gain(a).total_cmp(&gain(b)))
        .unwrap();
    assert_eq!(gain(&recs[0]), gain(best), "{recs:#?}");
    // One the scenario makes, or (on a machine loaded enough that another
    // cause is as large by the truth's own count, within the tolerance) that
    // cause — counting with its own share the waits for a CPU inside its
    // own work, which its fix takes away with it (beside busy neighbours,
    // or under a hypervisor's heavy steal, host work behind a synchronize
    // and the waits inside it outweigh the synchronize).
    let first = recs[0]["cause"].as_str().unwrap();
    let within = share(&truth["contention_within_ns"], first, truth_idle);
    let as_large = share(want, first, truth_idle) + within >= truth_shares[0] - 5.0;
    assert!(
        expected.contains(&first) || as_large,
        "{first} (with {within:.1}% waiting for a CPU inside its own work)\n  {table}"
    );
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("More GPUs would not help until") && verdict.contains(first),
        "{verdict}"
    );
}

macro_rules! scenario_test {
    ($name:ident, $bottleneck:literal, $($cause:literal),+) => {
        scenario_test!($name, [], $bottleneck, $($cause),+);
    };
    ($name:ident, [$($arg:literal),*], $bottleneck:literal, $($cause:literal),+) => {
        #[test]
        fn $name() {
            if !bpf_ready(stringify!($name)) {
                return;
            }
            check($bottleneck, &[$($arg),*], &[$($cause),+]);
        }
    };
}

scenario_test!(input_io_is_named, "input-io", "input.io");
scenario_test!(input_cpu_is_named, "input-cpu", "input.cpu");
scenario_test!(input_network_is_named, "input-network", "input.network");
scenario_test!(host_cpu_is_named, "host-cpu", "cpu.host");
scenario_test!(launch_is_named, "launch", "cpu.launch");
scenario_test!(sync_is_named, "sync", "sync");
scenario_test!(memory_is_named, "memory", "memory");
scenario_test!(mixed_yields_both_causes, "mixed", "input.io", "sync");
// With every syscall hooked (not the default): the same attribution, the
// loaders' on-CPU time inside their reads as input.io exactly (by default,
// as their samples found them inside reads).
scenario_test!(
    input_network_is_named_with_every_syscall_hooked,
    ["--syscalls", "all"],
    "input-network",
    "input.network"
);
scenario_test!(
    mixed_yields_both_causes_with_every_syscall_hooked,
    ["--syscalls", "all"],
    "mixed",
    "input.io",
    "sync"
);

#[test]
fn a_busy_gpu_has_little_steady_idle() {
    if !bpf_ready("a_busy_gpu_has_little_steady_idle") {
        return;
    }
    let (g, _, report) = scenario("none", &[]);
    let verdict = report["verdict"].as_str().unwrap();
    assert!(verdict.ends_with("scale out."), "{verdict}");
    assert!(report["recommendations"].as_array().unwrap().is_empty());
    let steady: u64 = STEADY_CAUSES
        .iter()
        .map(|c| g["idle_by_cause_ns"][*c].as_u64().unwrap_or(0))
        .sum();
    // Only start-up and tear-down: under 2% of the time the job held the GPU.
    assert!(
        steady * 50 < u64_of(&g, "allocated_ns"),
        "steady idle {steady} of {}",
        g["allocated_ns"]
    );
}

#[test]
fn advice_quotes_the_recorded_machines_cpus_not_the_readers() {
    if !bpf_ready("advice_quotes_the_recorded_machines_cpus_not_the_readers") {
        return;
    }
    simtrain_data();
    let _lock = recording_lock();
    let dir = scratch("simtrain-cpus");
    let (run, _) = run_simtrain(dir.path(), &["-q"], &["--bottleneck", "input-cpu"]);
    let title = |report: &Value| -> String {
        report["recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cause"] == "input.cpu")
            .unwrap_or_else(|| panic!("no input.cpu advice: {report}"))["title"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mut session = gapscope::session::read_session(&run.dir).unwrap();
    let recorded = session.header().nr_cpus;
    assert!(title(&run.report()).contains(&format!("{recorded} CPUs")));
    // The same session read as if recorded on a 96-CPU machine: the advice
    // follows the session, whatever machine reads it.
    session.header.as_mut().unwrap().nr_cpus = 96;
    let a = gapscope::analyze::analyze(session, &Default::default()).unwrap();
    let report = serde_json::to_value(gapscope::export::report::build(&a)).unwrap();
    assert_report_schema(&report);
    let t = title(&report);
    assert!(t.contains("96 CPUs"), "{t}");
}

/// Not every process of the job is the trainer's loader: CPUs held by a
/// sibling of the trainer (another rank under one launcher, a metrics
/// exporter, here two spinning processes the launching shell started) are
/// contention, as a stranger's are — not the input pipeline's, which is the
/// trainer's own descendants'. simtrain's host-bound loop counts its waits
/// for a CPU as contention.
#[test]
fn cpus_held_by_a_sibling_of_the_trainer_are_contention_not_input() {
    if !bpf_ready("cpus_held_by_a_sibling_of_the_trainer_are_contention_not_input") {
        return;
    }
    let data = simtrain_data();
    let _lock = recording_lock();
    let dir = scratch("simtrain-sibling");
    let truth_path = dir.path().join("truth.json");
    let spin = bin("gs-workload");
    let script = format!(
        "{spin} spin --ms 60000 & a=$!; {spin} spin --ms 60000 & b=$!; \
         {simtrain} --bottleneck host-cpu --steps 60 --data {data} --ground-truth {truth}; \
         s=$?; kill $a $b; exit $s",
        spin = spin.display(),
        simtrain = bin("simtrain").display(),
        data = data.display(),
        truth = truth_path.display(),
    );
    let report = record_script(&dir.path().join("rec"), &script);
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    let g = &report["gpus"][0];
    assert_eq!(u64_of(g, "busy_ns"), u64_of(&truth, "busy_ns"));
    // The spinners take a CPU each: the trainer waits for one a good part
    // of its host work, or the test shows nothing.
    host_and_contention_match_the_truth(g, &truth);
}

// The same job recorded as windows of a second, read back as one session.
scenario_test!(
    input_io_is_named_from_windows,
    ["--window", "1"],
    "input-io",
    "input.io"
);

/// The feeder waits for the CPU it is queued on, not for any CPU: its
/// loader busy on another CPU keeps it from nothing. simtrain's host-bound
/// trainer on CPU 0 beside a busy loop nobody records, its loader (busy
/// while ahead, as workers decoding ahead are) on CPU 1:
/// the trainer's waits for CPU 0 in its host work are contention in its own
/// account and must be in the report. Counting the loader's time on CPU 1
/// made them input.cpu.
#[test]
fn a_loader_busy_on_another_cpu_does_not_make_the_feeders_wait_input() {
    if !bpf_ready("a_loader_busy_on_another_cpu_does_not_make_the_feeders_wait_input") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    let data = simtrain_data();
    let _lock = recording_lock();
    let dir = scratch("simtrain-other-cpu");
    let (truth_path, rec) = (dir.path().join("truth.json"), dir.path().join("rec"));
    let spin = Command::new("taskset")
        .args(["-c", "0", "sh", "-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .spawn()
        .expect("taskset");
    let spin = BusyLoops(vec![spin]);
    let out = Command::new(gapscope())
        .args(["run", "-q", "--no-exports", "-o"])
        .arg(&rec)
        .args(["--", "taskset", "-c", "0"])
        .arg(bin("simtrain"))
        .args([
            "--bottleneck",
            "host-cpu",
            "--workers",
            "1",
            "--steps",
            "30",
        ])
        .args(["--busy-loaders", "--loader-cpu", "1"])
        .arg("--data")
        .arg(&data)
        .arg("--ground-truth")
        .arg(&truth_path)
        .stdin(Stdio::null())
        .output()
        .expect("gapscope");
    drop(spin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = report_json(&rec);
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    let g = &report["gpus"][0];
    // The trainer waits for CPU 0 a good part of its host work, or the
    // test shows nothing.
    host_and_contention_match_the_truth(g, &truth);
}

/// A host-bound trainer that waited for CPUs: the report's shares of the
/// GPU's idle time for `cpu.contention`, `cpu.host` and `input.cpu` within
/// 5 points of simtrain's own account, which has at least 10% contention
/// (or the test shows nothing).
#[track_caller]
fn host_and_contention_match_the_truth(g: &Value, truth: &Value) {
    let (got, want) = (&g["idle_by_cause_ns"], &truth["idle_by_cause_ns"]);
    let idle = u64_of(g, "idle_ns");
    let truth_idle: u64 = want
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let table = STEADY_CAUSES
        .iter()
        .map(|c| {
            format!(
                "{c}: report {:.1}% truth {:.1}%",
                share(got, c, idle),
                share(want, c, truth_idle)
            )
        })
        .collect::<Vec<_>>()
        .join("\n  ");
    eprintln!("  {table}");
    assert!(share(want, "cpu.contention", truth_idle) >= 10.0, "{table}");
    for c in ["cpu.contention", "cpu.host", "input.cpu"] {
        let (a, b) = (share(got, c, idle), share(want, c, truth_idle));
        assert!(
            (a - b).abs() <= 5.0,
            "{c}: report {a:.1}% vs truth {b:.1}%\n  {table}"
        );
    }
}
