//! What a fix would buy, checked against applying it: each scenario's
//! recording predicts, for each cause it recommends fixing, the wall time
//! of the run without that cause's stalls (`what_if`); simtrain then runs
//! the same job with the fix applied (`--fix CAUSE`) or with more loader
//! workers (`--workers N`), recorded the same way, and its wall time must be
//! within 10% of the prediction (a fixed run whose loaders the scheduler
//! favoured far beyond the recording's share is taken again: [`fixed_run`]).
//!
//! Both sides are the GPU's span, from its first work to its last: the
//! replay keeps a recording's start-up and tear-down as they were (the
//! process starting and its loaders' first batch; its exit, which waits
//! for gapscope to take the simulated device's last records — a fixed job
//! that makes records many times faster, a launch-bound step as one graph,
//! outruns a recorder that a busy machine gives a third of a CPU — and
//! simtrain reckoning its ground truth), and a fixed run has its own,
//! which move with the machine's load by more than any fix does: beside
//! two busy loops, the memory scenario's fixed runs took 471 to 682 ms
//! before and after a span that stayed within 3 ms of 1324 ms. The
//! prediction is of the work the fix changes.

use gapscope_tests::*;
use serde_json::Value;

const TOLERANCE: f64 = 0.10;
/// Steps per run: long enough that start-up's jitter from one run to the
/// next (process start, the first batch: tens of ms) is small beside it.
const STEPS: &str = "120";

fn wall(report: &Value) -> u64 {
    let w = &report["window_ns"];
    u64_of(w, "end") - u64_of(w, "start")
}

/// `simtrain ARGS` recorded; its report.
fn record(name: &str, simtrain_args: &[&str]) -> Value {
    let dir = scratch(&format!("whatif-{name}"));
    let (run, _) = run_simtrain(dir.path(), &["-q", "--no-exports"], simtrain_args);
    run.report()
}

fn recommendation<'a>(report: &'a Value, cause: &str) -> &'a Value {
    report["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cause"] == cause)
        .unwrap_or_else(|| panic!("no recommendation for {cause}: {report:#}"))
}

fn close(what: &str, predicted: u64, measured: u64, detail: &str) {
    let off = predicted as f64 / measured as f64 - 1.0;
    eprintln!(
        "{what}: predicted {:.0} ms, measured {:.0} ms ({:+.1}%)",
        predicted as f64 / 1e6,
        measured as f64 / 1e6,
        off * 100.0
    );
    assert!(
        near(predicted, measured),
        "{what}: predicted a span of {predicted} ns, the fixed run's GPU span was {measured} ns ({:+.1}%)\n{detail}",
        off * 100.0
    );
}

/// [`close`] for a range whose ends are the predictions `fast` and
/// `slow`: `measured` between their spans, each end's tolerance kept.
/// `fast` must end no later than `slow`; their spans (the wall time less
/// start-up and tear-down, each replayed on its own) may not keep that
/// order to the nanosecond where both are the GPU's own work: 719997410
/// against 719997409 ns, the walls 723916076 and 724207291.
fn within(what: &str, fast: &Value, slow: &Value, measured: u64, detail: &str) {
    assert!(
        u64_of(fast, "wall_ns") <= u64_of(slow, "wall_ns"),
        "{what}: the range's ends are the wrong way round\n{detail}"
    );
    let (low, high) = spans(fast, slow);
    let ms = |ns: u64| ns as f64 / 1e6;
    eprintln!(
        "{what}: predicted {:.0} to {:.0} ms, measured {:.0} ms",
        ms(low),
        ms(high),
        ms(measured)
    );
    assert!(
        between((low, high), measured),
        "{what}: predicted a span of {low} to {high} ns, the fixed run's GPU span was {measured} ns\n{detail}"
    );
}

/// `measured` within the tolerance of `predicted`: [`close`]'s check.
fn near(predicted: u64, measured: u64) -> bool {
    (predicted as f64 / measured as f64 - 1.0).abs() <= TOLERANCE
}

/// A range's predicted spans, the lower first.
fn spans(fast: &Value, slow: &Value) -> (u64, u64) {
    let (a, b) = (predicted_span(fast), predicted_span(slow));
    (a.min(b), a.max(b))
}

/// `measured` between `low` and `high`, each end's tolerance kept:
/// [`within`]'s check.
fn between((low, high): (u64, u64), measured: u64) -> bool {
    let m = measured as f64;
    m >= low as f64 * (1.0 - TOLERANCE) && m <= high as f64 * (1.0 + TOLERANCE)
}

/// Whether `measured` passes the check [`close`] or [`within`] makes of
/// the what-if `w`.
fn holds(w: &Value, measured: u64) -> bool {
    let alone = &w["given_a_cpu"];
    match alone.is_object() {
        true => between(spans(alone, w), measured),
        false => near(predicted_span(w), measured),
    }
}

/// The loader processes' share of a CPU while they wanted one (their time
/// on a CPU over that and their time waiting for one); None without
/// loaders.
fn pool_share(report: &Value) -> Option<f64> {
    let target = report["target"]["pid"].as_u64()?;
    let ns = |t: &Value, k: &str| t[k].as_u64().unwrap_or(0);
    let (on, asked) = report["threads"]
        .as_array()?
        .iter()
        .filter(|t| t["pid"].as_u64() != Some(target))
        .fold((0, 0), |(on, asked), t| {
            let c = ns(t, "on_cpu_ns");
            (on + c, asked + c + ns(t, "runnable_ns"))
        });
    (asked > 0).then(|| on as f64 / asked as f64)
}

/// How far a fixed run's loaders' share of a CPU may stray from the
/// recording's before the run is taken for another.
const SHARE_MOVED: f64 = 0.10;

/// The fixed job recorded, to hold the what-if `w` of `base` to. The
/// prediction keeps the share of a CPU the loaders got in the recording,
/// and beside busy neighbours the scheduler can give a fixed run's loaders
/// far more by chance: simtrain's input-cpu beside a busy loop and a disk
/// writer, fixed of its reads, took 3708 ms with its loaders at 0.49 of a
/// CPU, as recorded, and 3294 ms at 0.54 and 0.65 (one ran out of work
/// first, and the other had the CPUs), predicted 3529. A run that falls
/// outside with its loaders' share moved by more than [`SHARE_MOVED`] does
/// not test the prediction: the job is run again, twice at most, and the
/// last run is the one held to it.
fn fixed_run(base: &Value, w: &Value, name: &str, args: &[&str]) -> Value {
    let mut fixed = record(name, args);
    let Some(recorded) = pool_share(base) else {
        return fixed;
    };
    for again in 1..=2 {
        let Some(got) = pool_share(&fixed) else {
            break;
        };
        if holds(w, gpu_span(&fixed)) || (got - recorded).abs() <= SHARE_MOVED * recorded {
            break;
        }
        eprintln!(
            "{name}: the fixed run's loaders had {got:.2} of a CPU, the recording's {recorded:.2}: run again"
        );
        fixed = record(&format!("{name}-again{again}"), args);
    }
    fixed
}

/// The cause a run's GPU idled most for, start-up and tear-down aside.
fn leading_cause(report: &Value) -> Option<String> {
    report["gpus"][0]["idle_by_cause_ns"]
        .as_object()?
        .iter()
        .filter(|(c, _)| !matches!(c.as_str(), "startup" | "teardown" | "unattributed"))
        .max_by_key(|(_, v)| v.as_u64().unwrap_or(0))
        .map(|(c, _)| c.clone())
}

/// The cause a fix is predicted to leave leading.
#[derive(Clone, Copy)]
enum Next {
    /// None: what is left is below a recommendation's share.
    None,
    Cause(&'static str),
    /// Not a property of the workload (see the scenario).
    Unasserted,
}

/// Records `bottleneck`, then for each cause the fixed run; each cause in
/// `fixes` must be recommended with a prediction within the tolerance, and
/// `next` is the cause each is predicted to leave leading (None: none).
/// Any other cause the recording recommends is checked the same way (its
/// `next` aside): a cause near the threshold of a recommendation comes and
/// goes with the machine's load, and none goes unchecked when it comes.
fn scenario(bottleneck: &str, extra: &[&str], fixes: &[(&str, Next)]) {
    simtrain_data(); // made before taking the lock
    let _lock = recording_lock();
    let mut args = vec!["--bottleneck", bottleneck];
    if !extra.contains(&"--steps") {
        args.extend(["--steps", STEPS]);
    }
    args.extend_from_slice(extra);
    let base = record(bottleneck, &args);
    let recommended: Vec<&str> = base["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["cause"].as_str())
        .collect();
    eprintln!("{bottleneck}: recommended {recommended:?}");
    // cpu.contention is the machine's (other processes holding the CPUs:
    // the rest of the suite, under CI), not the job's: no fix simtrain
    // makes takes it away.
    let others = recommended
        .iter()
        .filter(|c| !fixes.iter().any(|(f, _)| f == *c) && **c != "cpu.contention")
        .map(|c| (*c, Next::Unasserted));
    for (cause, next) in fixes.iter().copied().chain(others) {
        let rec = recommendation(&base, cause);
        let w = &rec["what_if"];
        assert!(w.is_object(), "{rec:#}");
        let mut fixed_args = args.clone();
        fixed_args.extend(["--fix", cause]);
        let fixed = fixed_run(&base, w, &format!("{bottleneck}-{cause}"), &fixed_args);
        let detail = format!(
            "recommendation: {rec:#}\nfixed run's idle: {:#}",
            fixed["gpus"][0]["idle_by_cause_ns"]
        );
        // What the fixed job still spends on the cause, for the record: a
        // fix simtrain makes can leave some (the launch loop's own host time
        // between launches, the kernel's time inside a loader's reads) that
        // the replay takes out with the rest.
        let left = fixed["gpus"][0]["idle_by_cause_ns"][cause]
            .as_u64()
            .unwrap_or(0);
        let what = format!(
            "{bottleneck} without {cause} (the fixed run still charges {:.0} ms to it)",
            left as f64 / 1e6
        );
        // On a busy machine: between keeping the recorded share of the
        // CPUs and a CPU of its own, as the scheduler places the fixed run.
        let alone = &w["given_a_cpu"];
        match alone.is_object() {
            true => within(&what, alone, w, gpu_span(&fixed), &detail),
            false => close(&what, predicted_span(w), gpu_span(&fixed), &detail),
        }
        match next {
            Next::None => assert_eq!(w["next_cause"].as_str(), None, "{detail}"),
            // The workload's, or what the fixed run itself idled most for:
            // beside busy neighbours, waiting for a CPU outgrows the
            // workload's own cause there (sync's fixed run: contention
            // first, as predicted).
            Next::Cause(c) => {
                let predicted = w["next_cause"].as_str();
                let measured = leading_cause(&fixed);
                let alone = alone["next_cause"].as_str();
                assert!(
                    predicted == Some(c)
                        || predicted == measured.as_deref()
                        || (alone.is_some() && alone == measured.as_deref()),
                    "predicted to lead next: {predicted:?}; the workload's {c}, the fixed run's {measured:?}\n{detail}"
                );
            }
            Next::Unasserted => {}
        }
        // The speedup is the prediction's, against the recorded wall.
        let speedup = wall(&base) as f64 / u64_of(w, "wall_ns") as f64;
        assert!(
            (w["speedup"].as_f64().unwrap() - speedup).abs() < 0.01,
            "{rec:#}"
        );
    }
}

#[test]
fn input_io() {
    scenario("input-io", &[], &[("input.io", Next::None)]);
}

#[test]
fn input_cpu() {
    scenario("input-cpu", &[], &[("input.cpu", Next::None)]);
}

#[test]
fn input_network() {
    scenario("input-network", &[], &[("input.network", Next::None)]);
}

#[test]
fn host_cpu() {
    scenario("host-cpu", &[], &[("cpu.host", Next::None)]);
}

/// What leads once launches are free is not asserted: what is left of
/// the loaders' start (their first batches, taking the trainer's CPU) is
/// a few percent of the fixed run, about the 3% a cause needs to be named
/// (unbounded loaders made every batch in the first ~50 ms: 0.1 to 16 ms
/// of ~420 ms; they now stay two batches ahead, as a DataLoader's do).
#[test]
fn launch() {
    // Its fixed run is short: longer, so that start-up's jitter stays small.
    scenario(
        "launch",
        &["--steps", "300"],
        &[("cpu.launch", Next::Unasserted)],
    );
}

/// Taking the synchronize out does not take out the host work behind it:
/// it now runs beside the GPU's, and what is left of the idle is host time.
#[test]
fn sync() {
    scenario("sync", &[], &[("sync", Next::Cause("cpu.host"))]);
}

#[test]
fn memory() {
    scenario("memory", &[], &[("memory", Next::None)]);
}

/// Two causes that hide each other: without the slow loader the sync per
/// step leads; without the sync, the loader still sets the pace and the
/// job is hardly faster — where subtracting idle time promises much. (With
/// a network loader: a storage loader's pace moves with this machine's
/// disk from one run to the next, the server's does not.)
#[test]
fn mixed() {
    scenario(
        "mixed-network",
        &[],
        &[
            ("input.network", Next::Cause("sync")),
            ("sync", Next::Cause("input.network")),
        ],
    );
}

/// More loader workers instead of a fix: the recording of `workers`
/// predicts the run with `add` more.
fn more_workers(bottleneck: &str, cause: &str, workers: u32, add: u32) {
    simtrain_data();
    let _lock = recording_lock();
    let n = workers.to_string();
    let base = record(
        &format!("{bottleneck}-{n}"),
        &[
            "--bottleneck",
            bottleneck,
            "--workers",
            &n,
            "--steps",
            STEPS,
        ],
    );
    let rec = recommendation(&base, cause);
    let m = with_more_workers(rec, add.into());
    assert_eq!(m["workers"], workers + add, "{rec:#}");
    let total = (workers + add).to_string();
    // With more workers the CPUs are busier, so anything else the machine
    // runs slows the job: of two runs, the faster is the least disturbed.
    let args = [
        "--bottleneck",
        bottleneck,
        "--workers",
        &total,
        "--steps",
        STEPS,
    ];
    let more = [1, 2]
        .map(|i| record(&format!("{bottleneck}-{total}-{i}"), &args))
        .into_iter()
        .map(|report| gpu_span(&report))
        .min()
        .unwrap();
    let what = format!("{bottleneck} with {add} more workers than {workers}");
    let detail = format!("recommendation: {rec:#}");
    // Beside busy tasks of the job's own group: between winning a
    // worker's share of their CPUs and none.
    let none_won = &m["if_group_keeps_cpus"];
    match none_won.is_object() {
        true => within(&what, &m, none_won, more, &detail),
        false => close(&what, predicted_span(&m), more, &detail),
    }
}

/// One decoding worker on two CPUs: a second halves the wait.
#[test]
fn input_cpu_one_more_worker() {
    more_workers("input-cpu", "input.cpu", 1, 1);
}

/// Two decoding workers on two CPUs: more cannot compute faster.
#[test]
fn input_cpu_two_more_workers() {
    more_workers("input-cpu", "input.cpu", 2, 2);
}

/// Waiting on a server: more requests in flight, more batches.
#[test]
fn input_network_two_more_workers() {
    more_workers("input-network", "input.network", 2, 2);
}

/// On a busy machine the what-ifs say what they assume. Beside two busy
/// loops the sync-bound trainer waits for a CPU about half the time it
/// wants one; the replay keeps that share, but the trainer without its
/// synchronize no longer sleeps, and the scheduler shares the CPUs with it
/// otherwise (its fixed run took 0.6 to 1.05 times the prediction from one
/// run to the next) — so the report says so, with the share the feeder's
/// own thread shows in the report's threads table (its runnable time
/// against its time on a CPU; contention aside from its own loaders, which
/// the sync scenario's fast ones hardly hold). The demo's golden report,
/// recorded quiet, has no such note.
#[test]
fn a_busy_machine_makes_the_what_ifs_say_so() {
    simtrain_data();
    let _lock = recording_lock();
    let loops = BusyLoops::start(2);
    let report = record("sync-busy", &["--bottleneck", "sync", "--steps", "60"]);
    drop(loops);
    let notes: Vec<&str> = report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    let note = notes
        .iter()
        .find(|n| n.starts_with("what-if replays on a busy machine"))
        .unwrap_or_else(|| panic!("no busy-machine note: {notes:#?}"));
    assert!(note.contains("(sync"), "{note}");
    // And the what-if gives the other end: the feeder on a CPU of its own,
    // none of its waits for the loops' CPUs left (the job's own loaders'
    // may stay: the sync scenario's hardly hold one).
    let w = &recommendation(&report, "sync")["what_if"];
    let alone = &w["given_a_cpu"];
    assert!(alone.is_object(), "{w:#}");
    let contention = |w: &Value| {
        w["idle_by_cause_ns"]["cpu.contention"]
            .as_u64()
            .unwrap_or(0)
    };
    eprintln!(
        "busy machine: without sync {:.0} ms sharing as recorded ({:.0} ms cpu.contention), {:.0} ms on a CPU of its own ({:.0} ms)",
        u64_of(w, "wall_ns") as f64 / 1e6,
        contention(w) as f64 / 1e6,
        u64_of(alone, "wall_ns") as f64 / 1e6,
        contention(alone) as f64 / 1e6
    );
    assert!(u64_of(alone, "wall_ns") < u64_of(w, "wall_ns"), "{w:#}");
    assert!(contention(alone) * 10 <= contention(w), "{w:#}");
    let share: f64 = note
        .split(" held ")
        .nth(1)
        .and_then(|r| r.split('%').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no share in {note}"));
    // The feeder: the thread the note names, in the threads table.
    let tid: u64 = note
        .split("(thread ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|r| r.split('/').nth(1))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no thread in {note}"));
    let t = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("no thread {tid}"));
    let (runnable, on_cpu) = (u64_of(t, "runnable_ns"), u64_of(t, "on_cpu_ns"));
    let table = runnable as f64 * 100.0 / (runnable + on_cpu) as f64;
    eprintln!("busy machine: the note says {share:.1}%, the threads table {table:.1}%");
    assert!(share >= 10.0, "{note}");
    assert!(
        (share - table).abs() <= 5.0,
        "{note}: the threads table says {table:.1}%"
    );
}
