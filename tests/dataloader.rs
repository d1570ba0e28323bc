//! A real PyTorch DataLoader (torch from PyPI, CPU only): worker processes
//! open and decode PNG files and hand batches to the trainer through
//! torch's queues; the trainer feeds gapscope's simulated GPU and
//! synchronizes every step. Ground truth is the trainer's own clock and the
//! kernel's schedstat: the share of the GPU's idle time it spent inside
//! `next(DataLoader)`, and its waits for a CPU there and outside it. The
//! report's input causes must give that share within 4 points — with two
//! workers on two CPUs too, where the trainer waits for CPUs its own
//! loaders hold and spends CPU time receiving each batch, both input
//! costs. Beside busy neighbours a wait for a CPU is the loaders' only
//! while they held one: which did, moment by moment, no counter says, so
//! there the truth is a range — all the waits at most, and at least those
//! no neighbour can have held (neighbours hold every CPU for at most their
//! CPU time over the CPUs, by /proc/stat); on a quiet machine the range is
//! a few points wide. And each recording says what more workers would give:
//! the one-worker recording's answer for a second worker is held to the
//! faster of two two-worker runs within 10% (quiet -1..-4%; beside two busy
//! loops and an I/O neighbour, -2% and +9%).
//!
//! torch comes from `cargo xtask setup` (a venv in target/torch-venv);
//! without it these tests skip, unless GAPSCOPE_REQUIRE_TORCH=1.

use std::path::{Path, PathBuf};
use std::process::Command;

use gapscope_tests::*;
use serde_json::Value;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/python/dataloader_train.py"
);

/// The venv's python, if torch imports there.
fn torch_python() -> Option<PathBuf> {
    venv_python("torch, PIL, numpy")
}

/// The PNG dataset, made once (outside any recording) by whichever test
/// comes first; the others wait for it rather than write the same files.
fn dataset(py: &Path) -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        let d = target_dir().join("png-data");
        succeed(Command::new(py).arg(SCRIPT).arg("--prepare").arg(&d));
        d
    })
    .clone()
}

/// Reads every file of the dataset, so that each recording meets it in
/// the page cache: the tests compare recordings with each other, and the
/// kernel drops cached files between them when it likes (under `cargo
/// xtask stress` a one-worker recording's worker spent 1.28 s blocked
/// reading the PNGs, the runs after it 0.11 s, and the prediction it made
/// for a second worker held that slow storage: 14% slower than the
/// two-worker run).
fn warm(data: &Path) {
    for f in std::fs::read_dir(data).unwrap() {
        std::fs::read(f.unwrap().path()).unwrap();
    }
}

/// Records the loop with `workers` (and `more` of the script's options);
/// its report and ground truth.
fn record(py: &Path, data: &Path, workers: u32, more: &[&str]) -> (Value, Value) {
    warm(data);
    let n = workers.to_string();
    let mut args = vec!["--data", data.to_str().unwrap(), "--workers", &n];
    args.extend_from_slice(more);
    record_python_workload(&format!("dataloader-{workers}"), py, SCRIPT, &args)
}

/// What the truth says of input, in percent of the GPU's idle between its
/// first and last work.
struct Input {
    /// Surely input: the trainer inside next(DataLoader) with a CPU, or
    /// blocked for its loaders' batch — the time there it had no CPU to
    /// load with taken out (the hypervisor's steal, and with no workers its
    /// waits for a CPU, which are contention).
    sure: f64,
    /// With workers, its waits for a CPU (inside next() and out): the
    /// loaders' where they held the CPUs, a busy neighbour's where it did.
    waits: f64,
    /// The most of `waits` a neighbour can have held: the trainer waited
    /// on a neighbour only while no loader had a CPU, so while neighbours
    /// held every CPU — at most their CPU time over the CPUs (with its
    /// /proc/stat reading of the rest of the machine over the loop).
    others_at_most: f64,
}

impl Input {
    fn of(truth: &Value) -> Input {
        let idle = u64_of(truth, "idle_between_ns").max(1) as f64;
        let pct = |k: &str| u64_of(truth, k) as f64 * 100.0 / idle;
        let sure = pct("idle_in_next_ns")
            - pct("idle_in_next_without_a_cpu_ns")
            - pct("idle_in_next_waiting_for_cpu_ns");
        let waits = if u64_of(truth, "workers") == 0 {
            0.0
        } else {
            pct("idle_in_next_waiting_for_cpu_ns") + pct("idle_waiting_for_cpu_ns")
        };
        let others = truth["others_cpus"].as_f64().unwrap() / truth["nr_cpus"].as_f64().unwrap();
        let others_at_most = (others * u64_of(truth, "loop_ns") as f64 * 100.0 / idle).min(waits);
        Input {
            sure,
            waits,
            others_at_most,
        }
    }

    /// The report's input share `got` holds to it within `tolerance`
    /// points: all of the surely-input time, and as much of the waits as
    /// no neighbour can have held; not more than all of it.
    fn check(&self, got: f64, tolerance: f64) -> Result<(), String> {
        let (low, high) = (
            self.sure + self.waits - self.others_at_most,
            self.sure + self.waits,
        );
        if got < low - tolerance || got > high + tolerance {
            return Err(format!(
                "the truth {low:.1}–{high:.1}% ({:.1}% surely input, {:.1}% waiting for a CPU, at most {:.1}% of it a neighbour's), the report says input {got:.1}%",
                self.sure, self.waits, self.others_at_most
            ));
        }
        Ok(())
    }
}

/// The truth's input and the report's input causes, in percent of the
/// GPU's idle between its first and last work; and the report's table of
/// every cause, for messages.
fn shares(report: &Value, truth: &Value) -> (Input, f64, String) {
    let input = Input::of(truth);
    let (_, got, table) = shares_of(report, truth, 0, |c| c.starts_with("input."));
    (input, got, table)
}

/// As [`shares`], for the truth's `truth_ns` and the report's causes that
/// `cause` picks.
fn shares_of(
    report: &Value,
    truth: &Value,
    truth_ns: u64,
    cause: impl Fn(&str) -> bool,
) -> (f64, f64, String) {
    let g = &report["gpus"][0];
    assert_eq!(g["source"], "simulated");
    assert_eq!(u64_of(g, "busy_ns"), u64_of(truth, "busy_ns"));
    let table = g["idle_by_cause_ns"]
        .as_object()
        .unwrap()
        .keys()
        .map(|c| format!("{c} {:.1}%", idle_share(g, |x| x == c)))
        .collect::<Vec<_>>()
        .join(", ");
    (
        truth_ns as f64 * 100.0 / u64_of(truth, "idle_between_ns").max(1) as f64,
        idle_share(g, cause),
        table,
    )
}

/// The workers' main threads, by the code their samples were in (their
/// Python frames read by the regions' table): about all of it loading
/// input, most of that decoding the PNGs (PIL and zlib), then collating
/// and the dataset's own `__getitem__`.
fn workers_run_input_code(report: &Value) {
    let mut seen = 0;
    for t in report["threads"].as_array().unwrap() {
        let samples = u64_of(t, "samples");
        if t["comm"] != "pt_data_worker" || t["pid"] != t["tid"] || samples < 50 {
            continue;
        }
        seen += 1;
        let code = t["code"]
            .as_array()
            .unwrap_or_else(|| panic!("no code regions: {t:#}"));
        let input: u64 = code
            .iter()
            .filter(|c| c["region"].as_str().unwrap().starts_with("input."))
            .map(|c| u64_of(c, "samples"))
            .sum();
        assert!(
            input as f64 >= 0.8 * samples as f64,
            "worker {}: {input} of {samples} samples in input code: {code:#?}",
            t["pid"]
        );
        assert_eq!(code[0]["region"], "input.decode", "{code:#?}");
    }
    assert!(seen >= 1, "no worker with 50 samples");
}

#[test]
fn dataloader_workers_are_the_input_pipeline() {
    let Some(py) = torch_python() else { return };
    let data = dataset(&py);
    let _lock = recording_lock();
    let runs: Vec<(u32, Value, Value)> = [1, 2]
        .into_iter()
        .map(|w| {
            let (report, truth) = record(&py, &data, w, &[]);
            (w, report, truth)
        })
        .collect();
    for (workers, report, truth) in &runs {
        let (want, got, table) = shares(report, truth);
        eprintln!(
            "{workers} worker(s): truth {:.1}% + {:.1}% waiting for a CPU (at most {:.1}% a neighbour's), input {got:.1}% ({table})",
            want.sure, want.waits, want.others_at_most
        );
        if let Err(e) = want.check(got, 4.0) {
            panic!(
                "{workers} worker(s): {e}\n  {table}\n  drops: {}\n  notes: {:#}",
                report["drops"], report["notes"]
            );
        }
        assert_eq!(
            report["recommendations"][0]["cause"], "input.cpu",
            "{report:#}"
        );
        workers_run_input_code(report);
    }
    // What more workers would give, as each recording says: two workers
    // already hold both CPUs, and more compute faster only with CPUs that
    // sat idle or that others held (tasks of the job's own scheduling
    // group share theirs thread by thread) — never faster than the CPUs the
    // loaders used plus those, by the loop's own reading of /proc/stat and
    // the kernel's count for the joined workers. One worker on two CPUs
    // leaves the other to a second: with half a CPU or more idle the loop
    // gets at least a fifth faster.
    let more = |r: &Value, add: u64| with_more_workers(&r["recommendations"][0], add);
    let speedup = |r: &Value, add: u64| gpu_span(r) as f64 / predicted_span(&more(r, add)) as f64;
    let cpus = |truth: &Value, what: &str| truth[what].as_f64().unwrap();
    let most = |truth: &Value| {
        let used = cpus(truth, "loader_cpus");
        (used + cpus(truth, "idle_cpus") + cpus(truth, "others_cpus")) / used
    };
    let (one, two) = (&runs[0], &runs[1]);
    let (a, b) = (speedup(&one.1, 1), speedup(&two.1, 2));
    let idle = cpus(&one.2, "idle_cpus");
    eprintln!(
        "one worker + 1: {a:.2}x (the loader used {:.2} CPUs, {idle:.2} idle, others {:.2}); two workers + 2: {b:.2}x (the loaders used {:.2}, {:.2} idle, others {:.2})",
        cpus(&one.2, "loader_cpus"),
        cpus(&one.2, "others_cpus"),
        cpus(&two.2, "loader_cpus"),
        cpus(&two.2, "idle_cpus"),
        cpus(&two.2, "others_cpus"),
    );
    assert!(
        a <= 0.15 + most(&one.2),
        "{a:.2}x, at most {:.2}x: {:#}",
        most(&one.2),
        one.1["recommendations"][0]
    );
    if idle >= 0.5 {
        assert!(
            a >= 1.25,
            "{a:.2}x, {idle:.2} CPUs idle: {:#}",
            one.1["recommendations"][0]
        );
    }
    assert!(
        b <= 0.05 + most(&two.2),
        "{b:.2}x, at most {:.2}x: {:#}",
        most(&two.2),
        two.1["recommendations"][0]
    );
    // And the one-worker recording's answer for a second worker is the
    // two-worker run's GPU span, measured (both spans first work to last:
    // start-up — importing torch, the workers' first batches — moves with
    // the machine by more than the loop does). Of two two-worker runs, the
    // faster: whatever else the machine runs only slows one (under the
    // whole suite a two-worker run took 2.41 s where quiet ones took
    // 2.09-2.18 s, its neighbours' CPU 0.14 on average). And of two
    // one-worker recordings, the faster's answer, for the same reason: the
    // prediction holds what the recording's CPUs did, and under the whole
    // suite a one-worker recording whose worker had a CPU to itself (1.02
    // CPUs, 0.82 more idle) made its batches at 1.24 times the CPU time a
    // batch took in the two-worker runs (likely a host slowed under the
    // VM, which no counter in it shows) and predicted +19.7%.
    let (again, _) = record(&py, &data, 2, &[]);
    let measured = gpu_span(&two.1).min(gpu_span(&again));
    let (once_more, _) = record(&py, &data, 1, &[]);
    let base = [&one.1, &once_more]
        .into_iter()
        .min_by_key(|r| gpu_span(r))
        .unwrap();
    // Beside busy tasks of the job's own group the report gives a range:
    // from the second worker winning a worker's share of their CPUs to it
    // winning none.
    let m = more(base, 1);
    let predicted = predicted_span(&m);
    let none_won = &m["if_group_keeps_cpus"];
    let slowest = match none_won.is_object() {
        true => predicted_span(none_won),
        false => predicted,
    };
    let off = |p: u64| p as f64 / measured as f64 - 1.0;
    eprintln!(
        "one worker + 1: predicted {:.0} ms (to {:.0} ms winning no CPU from the job's group), two workers measured {:.0} ms ({:+.1}%)",
        predicted as f64 / 1e6,
        slowest as f64 / 1e6,
        measured as f64 / 1e6,
        off(predicted) * 100.0
    );
    assert!(
        off(predicted) <= 0.10 && off(slowest) >= -0.10,
        "one worker + 1 predicted a span of {predicted} to {slowest} ns, two workers ran {measured} ns ({:+.1}%): {:#}",
        off(predicted) * 100.0,
        base["recommendations"][0]
    );
}

/// The trainer pinned to a CPU beside a busy loop there, its one worker
/// pinned to another, and 20 ms of the trainer's own work a step: every wait
/// of the trainer's for a CPU is the loop's (no loader can run where it
/// waits), though the worker is busy decoding on the other CPU throughout.
/// So the truth is sharp: input is the time in next(DataLoader) with a CPU
/// or blocked for the batch, within 4 points, and the waits for a CPU are
/// contention, within 5 — not input because a loader was busy somewhere.
/// (Charging a wait to any loader on any CPU read this run as input 64%,
/// contention 6%, against a truth of 28% and 44%.) The trainer's own work
/// stays `cpu.host`, within 5 points.
#[test]
fn a_neighbour_on_the_trainers_cpu_is_contention_though_its_loader_is_busy_elsewhere() {
    let Some(py) = torch_python() else { return };
    let cpus = allowed_cpus();
    let [trainer, loader, ..] = cpus[..] else {
        eprintln!("skipped: two CPUs needed, this test may run on {cpus:?}");
        return;
    };
    let data = dataset(&py);
    let _lock = recording_lock();
    let neighbour = BusyLoops::on_cpu(trainer);
    let (trainer, loader) = (trainer.to_string(), loader.to_string());
    let (report, truth) = record(
        &py,
        &data,
        1,
        &[
            "--host-ms",
            "20",
            "--trainer-cpu",
            &trainer,
            "--loader-cpu",
            &loader,
        ],
    );
    drop(neighbour);
    let input = Input::of(&truth);
    let (_, got, table) = shares(&report, &truth);
    let (_, contention, _) = shares_of(&report, &truth, 0, |c| c == "cpu.contention");
    let stolen_in_next = u64_of(&truth, "idle_in_next_without_a_cpu_ns") as f64 * 100.0
        / u64_of(&truth, "idle_between_ns").max(1) as f64;
    let host = u64_of(&truth, "idle_in_host_work_ns");
    let (want_host, got_host, _) = shares_of(&report, &truth, host, |c| c == "cpu.host");
    eprintln!(
        "pinned beside a neighbour: truth input {:.1}%, waiting for a CPU {:.1}% (+{stolen_in_next:.1}% stolen in next()), host {want_host:.1}%; \
         report input {got:.1}%, cpu.contention {contention:.1}%, cpu.host {got_host:.1}% ({table})",
        input.sure, input.waits
    );
    // Not vacuous: the waits are several times the tolerance, so charging
    // them to the busy loader fails.
    assert!(
        input.waits >= 15.0,
        "waits for a CPU {:.1}% of the idle",
        input.waits
    );
    assert!(
        (got - input.sure).abs() <= 4.0,
        "input: the truth {:.1}%, the report {got:.1}%\n  {table}",
        input.sure
    );
    assert!(
        contention >= input.waits - 5.0 && contention <= input.waits + stolen_in_next + 5.0,
        "cpu.contention: the truth {:.1}% (+{stolen_in_next:.1}% stolen), the report {contention:.1}%\n  {table}",
        input.waits
    );
    assert!(
        (got_host - want_host).abs() <= 5.0,
        "cpu.host: the truth {want_host:.1}%, the report {got_host:.1}%\n  {table}"
    );
}

/// num_workers=0, how most training scripts start: the trainer decodes the
/// PNGs itself inside next(DataLoader), right after each synchronize. Its
/// samples say what code it ran there (PIL, zlib, the fetcher and collate),
/// so that time is input, not `sync`: the input share is within 5 points
/// of the time the trainer spent inside next(), and the first
/// recommendation is input's.
#[test]
fn the_trainer_loading_its_own_batches_is_input() {
    let Some(py) = torch_python() else { return };
    let data = dataset(&py);
    let _lock = recording_lock();
    let (report, truth) = record(&py, &data, 0, &[]);
    let (want, got, table) = shares(&report, &truth);
    eprintln!(
        "0 workers: truth {:.1}%, input {got:.1}% ({table})",
        want.sure
    );
    if let Err(e) = want.check(got, 5.0) {
        panic!("0 workers: {e}\n  {table}");
    }
    let want = want.sure;
    // Input's advice first — or, beside neighbours busy enough that the
    // trainer's waits for a CPU (none of them its loading: it has no
    // loaders) are as large by its own clock, contention's.
    let recs = report["recommendations"].as_array().unwrap();
    let waiting =
        u64_of(&truth, "idle_in_next_without_a_cpu_ns") + u64_of(&truth, "idle_waiting_for_cpu_ns");
    let waiting = waiting as f64 * 100.0 / u64_of(&truth, "idle_between_ns").max(1) as f64;
    if recs[0]["cause"] != "input.cpu" {
        assert!(
            recs[0]["cause"] == "cpu.contention" && waiting >= want - 5.0,
            "first: {:#}; the trainer waited for a CPU {waiting:.1}% of the idle",
            recs[0]
        );
    }
    let first = recs
        .iter()
        .find(|r| r["cause"] == "input.cpu")
        .unwrap_or_else(|| panic!("no input.cpu advice: {recs:#?}"));
    let title = first["title"].as_str().unwrap();
    assert!(
        title.starts_with("The trainer loads its own batches") && title.contains("num_workers"),
        "{title}"
    );
    stages_match_the_loaders_clock(&report, &truth);
}

/// The report's input stages against the loading's own CPU clock of them
/// (decode, the rest of `__getitem__`, collate): each stage's share of the
/// three within 10 points, the slowest the same, and named by the first
/// recommendation.
fn stages_match_the_loaders_clock(report: &Value, truth: &Value) {
    let clock = &truth["stage_cpu_ns"];
    let stages = report["input_stages"]["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("no input stages: {:#}", report["input_stages"]));
    let ns = |name: &str| {
        stages
            .iter()
            .find(|s| s["stage"] == name)
            .map_or(0, |s| u64_of(s, "ns"))
    };
    let names = ["decode", "fetch", "collate"];
    let theirs: Vec<u64> = names.iter().map(|n| u64_of(clock, n)).collect();
    let ours: Vec<u64> = names.iter().map(|n| ns(&format!("input.{n}"))).collect();
    let pct = |v: &[u64], i: usize| v[i] as f64 * 100.0 / v.iter().sum::<u64>().max(1) as f64;
    for (i, name) in names.iter().enumerate() {
        eprintln!(
            "{name}: the loader's clock {:.1}%, the report {:.1}%",
            pct(&theirs, i),
            pct(&ours, i)
        );
        assert!(
            (pct(&theirs, i) - pct(&ours, i)).abs() <= 10.0,
            "{name}: the loader's clock {:.1}%, the report {:.1}%: {stages:#?}",
            pct(&theirs, i),
            pct(&ours, i)
        );
    }
    let slowest = names[(0..3).max_by_key(|&i| theirs[i]).unwrap()];
    let first_cpu = stages.iter().find(|s| s["stage"] != "read").unwrap();
    assert_eq!(
        first_cpu["stage"],
        format!("input.{slowest}"),
        "{stages:#?}"
    );
    let title = report["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cause"] == "input.cpu")
        .and_then(|r| r["title"].as_str())
        .unwrap_or_else(|| panic!("no input.cpu advice: {:#}", report["recommendations"]));
    assert!(
        title.contains(&format!("The slowest stage is {slowest}")),
        "{title}"
    );
}

/// Two workers, and the trainer's own Python work (20 ms of CPU a step)
/// between each batch's arrival and its launches, with 2 ms of GPU work a
/// step: that work is the trainer's, `cpu.host`, though it follows a
/// batch's arrival — all but the part the synchronize before it kept from
/// overlapping the GPU's work (as long as it waited), which is `sync`;
/// input is only the time in next(DataLoader) and the CPUs the loaders
/// held (the truth's range, see the module's doc). Each within 5 points of
/// the truth's.
#[test]
fn the_trainers_own_work_between_batches_is_host_work() {
    let Some(py) = torch_python() else { return };
    let data = dataset(&py);
    let _lock = recording_lock();
    let (report, truth) = record(
        &py,
        &data,
        2,
        &["--host-ms", "20", "--kernels", "2", "--kernel-us", "1000"],
    );
    let (input, got, table) = shares(&report, &truth);
    let host = u64_of(&truth, "idle_in_host_work_ns");
    let (want_host, got_host, _) = shares_of(&report, &truth, host, |c| c == "cpu.host");
    let behind = u64_of(&truth, "idle_host_work_behind_sync_ns");
    let (want_sync, got_sync, _) = shares_of(&report, &truth, behind, |c| c == "sync");
    eprintln!(
        "2 workers, 20 ms host work: truth input {:.1}% + {:.1}% waiting for a CPU (at most {:.1}% a neighbour's), host {want_host:.1}%, sync {want_sync:.1}%; \
         report input {got:.1}%, cpu.host {got_host:.1}%, sync {got_sync:.1}% ({table})",
        input.sure, input.waits, input.others_at_most
    );
    // Not vacuous: the host work is twice the tolerance at least, so a
    // report that charged none of it to cpu.host fails. On a 2-CPU machine
    // it waits for CPUs the loaders hold (input's) about as long as it
    // runs: 25% of the idle quiet, 13% beside two busy loops (with 10 ms a
    // step those were 12% and 5%, too near the tolerance to tell).
    assert!(want_host >= 10.0, "host work {want_host:.1}% of the idle");
    if let Err(e) = input.check(got, 5.0) {
        panic!("input: {e}\n  {table}");
    }
    for (what, want, got) in [
        ("cpu.host", want_host, got_host),
        ("sync", want_sync, got_sync),
    ] {
        assert!(
            (want - got).abs() <= 5.0,
            "{what}: the truth {want:.1}%, the report {got:.1}%\n  {table}"
        );
    }
}
