//! Two ranks of a real torch.distributed job (gloo over loopback, torch
//! from PyPI, CPU only), each feeding its own simulated GPU, one rank late
//! every step by its own host work or by its input, fetched over TCP from
//! a slow data service (examples/python/ddp_train.py). Ground truth is each
//! rank's own clock: of its GPU's idle between its first and last work, the
//! time it spent inside `all_reduce`, inside its own host work, fetching,
//! and inside the synchronize before its host work, each less its waits for a CPU there (in its host work, the time
//! its CPU clock did not advance: run delay and a VM's steal; in its waits,
//! the kernel's schedstat run delay), which are contention on a busy machine.
//!
//! torch comes from `cargo xtask setup` (a venv in target/torch-venv);
//! without it these tests skip, unless GAPSCOPE_REQUIRE_TORCH=1.

use gapscope_tests::*;
use serde_json::Value;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/python/ddp_train.py"
);

/// A duration as reports write it ("861.3ms", "1.61s", "450µs"), ns.
fn duration_ns(text: &str) -> Option<f64> {
    let unit = [("µs", 1e3), ("ms", 1e6), ("ns", 1.0), ("s", 1e9)]
        .into_iter()
        .find(|(u, _)| text.ends_with(u))?;
    let number: f64 = text.strip_suffix(unit.0)?.parse().ok()?;
    Some(number * unit.1)
}

/// How the late rank is late (`--late-by`), and the causes its own GPU
/// idles for by it.
#[derive(Clone, Copy)]
enum Late {
    /// 22 ms of its own host work a step: `cpu.host`, or on a busy machine
    /// its waits for a CPU to do it on (`cpu.contention`).
    Host,
    /// Its batch fetched over TCP from a data service that answers after
    /// 22 ms: `input.network`.
    Input,
}

impl Late {
    fn arg(self) -> &'static str {
        match self {
            Late::Host => "host",
            Late::Input => "input",
        }
    }

    fn causes(self) -> &'static [&'static str] {
        match self {
            Late::Host => &["cpu.host", "cpu.contention"],
            Late::Input => &["input.network"],
        }
    }
}

/// The rank waiting at every all-reduce for the late one: its GPU's idle
/// inside `all_reduce` is `comm` (by the code it blocked in: torch.distributed's
/// Python and c10d's frames), within 5 points of the time its own clock
/// says; the late rank's idle is its own host work (`cpu.host`, and `sync`
/// for the part the synchronize before it kept from overlapping the GPU's
/// work), not `comm` beyond its own short waits.
#[test]
fn waiting_for_another_rank_is_comm_and_the_late_rank_is_its_own_cause() {
    one_recording(Late::Host);
}

/// As above, the late rank late by its input: its GPU's idle while it
/// fetches is `input.network` within 5 points of its clock, and the
/// waiting rank's advice says it came late because of it.
#[test]
fn a_rank_late_by_its_input_is_named_with_its_input() {
    one_recording(Late::Input);
}

fn one_recording(late_by: Late) {
    let Some(py) = venv_python("torch") else {
        return;
    };
    let _lock = recording_lock();
    let (report, truth) = record_python_workload("ddp", &py, SCRIPT, &["--late-by", late_by.arg()]);
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "one GPU per rank: {gpus:#?}");
    for rank in truth["ranks"].as_array().unwrap() {
        let g = gpus
            .iter()
            .find(|g| g["id"] == rank["device"])
            .unwrap_or_else(|| panic!("no GPU {}: {gpus:#?}", rank["device"]));
        assert_eq!(g["source"], "simulated");
        assert_eq!(g["pids"], serde_json::json!([rank["pid"]]), "{g:#}");
        let idle = u64_of(rank, "idle_between_ns") as f64;
        let want_comm = u64_of(rank, "idle_in_all_reduce_ns") as f64 * 100.0 / idle;
        // Its host work, and its synchronize's own idle: the wake-up after
        // the GPU's last kernel, which a busy machine makes late (sync
        // 11.6% against host work 6.0% alone, under CI's load).
        let want_host =
            (u64_of(rank, "idle_in_host_work_ns") + u64_of(rank, "idle_in_sync_ns")) as f64 * 100.0
                / idle;
        let want_input = u64_of(rank, "idle_in_fetch_ns") as f64 * 100.0 / idle;
        let want_cpu = u64_of(rank, "idle_waiting_for_cpu_ns") as f64 * 100.0 / idle;
        let comm = idle_share(g, |c| c == "comm");
        let host = idle_share(g, |c| c == "cpu.host" || c == "sync");
        let input = idle_share(g, |c| c == "input.network");
        eprintln!(
            "rank {}: truth all_reduce {want_comm:.1}%, host work + synchronize {want_host:.1}%, fetch {want_input:.1}%, waiting for a CPU {want_cpu:.1}%; report comm {comm:.1}%, cpu.host + sync {host:.1}%, input.network {input:.1}% ({})",
            rank["rank"], g["idle_by_cause_ns"]
        );
        assert!(
            (input - want_input).abs() <= 5.0,
            "rank {}: input.network {input:.1}% of the idle, fetching {want_input:.1}%: {}",
            rank["rank"],
            g["idle_by_cause_ns"]
        );
        assert!(
            (comm - want_comm).abs() <= 5.0,
            "rank {}: comm {comm:.1}% of the idle, inside all_reduce {want_comm:.1}%: {}",
            rank["rank"],
            g["idle_by_cause_ns"]
        );
        assert!(
            (host - want_host).abs() <= 5.0,
            "rank {}: cpu.host + sync {host:.1}% of the idle, its own host work and synchronize {want_host:.1}%: {}",
            rank["rank"],
            g["idle_by_cause_ns"]
        );
    }
    // The comm advice names the rank waited for, by the wakeups that
    // ended the waits, and why it came late.
    let comm = report["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cause"] == "comm")
        .unwrap_or_else(|| panic!("no comm advice: {:#}", report["recommendations"]));
    let ranks = truth["ranks"].as_array().unwrap();
    let (waiting, late) = (&ranks[0], &ranks[1]);
    assert_eq!(late["late"], true);
    let said = format!(
        "GPU 0 (rank 0, pid {}) waited",
        waiting["pid"].as_u64().unwrap()
    );
    let line = comm["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|l| l.starts_with(&said))
        .unwrap_or_else(|| panic!("no '{said}': {comm:#}"));
    // Why it came late: the late rank's GPU's own top cause as the report
    // has it, one of those its lateness reads as — never comm.
    let g1 = gpus.iter().find(|g| g["id"] == 1).unwrap();
    let (own, _) = g1["idle_by_cause_ns"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(c, _)| !matches!(c.as_str(), "comm" | "startup" | "teardown" | "unattributed"))
        .map(|(c, v)| (c.as_str(), v.as_u64().unwrap()))
        .max_by_key(|x| x.1)
        .unwrap();
    assert!(late_by.causes().contains(&own), "{g1:#}");
    assert!(
        line.contains(&format!(
            "in collectives for rank 1 (pid {}, GPU 1)",
            late["pid"].as_u64().unwrap()
        )) && line.contains(&format!("it came late because of {own}")),
        "{line}"
    );
    // Most of the wait is traced to it: the duration said is within 5
    // points of the waiting GPU's comm.
    let g0 = gpus.iter().find(|g| g["id"] == 0).unwrap();
    let comm_ns = u64_of(&g0["idle_by_cause_ns"], "comm") as f64;
    let said = line
        .split(" waited ")
        .nth(1)
        .and_then(|x| x.split(" in collectives").next())
        .unwrap_or_else(|| panic!("{line}"));
    let ns = duration_ns(said).unwrap_or_else(|| panic!("{said:?} in {line}"));
    assert!(ns >= 0.95 * comm_ns, "{line}: of {comm_ns} ns in comm");
    // Only the waits that matter are said: the late rank's own short ones
    // are not.
    assert!(
        !comm["evidence"].to_string().contains("GPU 1 (rank 1"),
        "{comm:#}"
    );
}

/// The same job recorded as two sessions, one `gapscope run` per rank (as
/// on two nodes), read together: the cross-rank table names the late rank
/// as the one the others wait for (it spends least time in collectives),
/// with its own cause, and the waiting rank's top cause is `comm`.
#[test]
fn ranks_recorded_apart_name_the_late_one_and_its_cause() {
    recorded_apart(Late::Host);
}

/// As above, the late rank late by its input.
#[test]
fn ranks_recorded_apart_name_a_rank_late_by_its_input() {
    recorded_apart(Late::Input);
}

fn recorded_apart(late_by: Late) {
    let Some(py) = venv_python("torch") else {
        return;
    };
    let dir = scratch("ddp-apart");
    let lib = target_dir().join("libgs_simgpu.so");
    let truth = dir.path().join("truth.json");
    let port = free_port().to_string();
    let _lock = recording_lock();
    let recs: Vec<std::path::PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    let children: Vec<std::process::Child> = recs
        .iter()
        .enumerate()
        .map(|(rank, rec)| {
            std::process::Command::new(gapscope())
                .args(["run", "-q", "--no-exports", "-o"])
                .arg(rec)
                .arg("--")
                .arg(&py)
                .args([SCRIPT, "--rank", "--lib"])
                .arg(&lib)
                .arg("--truth")
                .arg(&truth)
                .args(["--late-by", late_by.arg()])
                .envs([
                    ("RANK", rank.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("GS_SIMGPU_DEVICE", rank.to_string()),
                ])
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // The late rank first: both GPUs did the same work, and a rule by GPU
    // work alone would pick the last of equals.
    let out = gapscope_stdout(&[
        "report",
        recs[1].to_str().unwrap(),
        recs[0].to_str().unwrap(),
        "--format",
        "json",
    ]);
    let r: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(r["schema"], "gapscope.ranks/1");
    let rows = r["cross_rank"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let row = |rank: usize| {
        rows.iter()
            .find(|x| {
                x["label"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("rank{rank}"))
            })
            .unwrap_or_else(|| panic!("no rank{rank}: {rows:#?}"))
    };
    assert_eq!(row(1)["slowest"], true, "{rows:#?}");
    assert_eq!(row(0)["slowest"], false, "{rows:#?}");
    assert_eq!(row(0)["top_cause"], "comm", "{rows:#?}");
    let late = row(1)["top_cause"].as_str().unwrap();
    assert!(late_by.causes().contains(&late), "{rows:#?}");
    // Each recording knows its rank from the launcher's environment.
    for rank in 0..2u64 {
        let label = format!("rank{rank}");
        let view = r["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["label"].as_str().is_some_and(|l| l.contains(&label)))
            .unwrap_or_else(|| panic!("no {label}: {:#}", r["ranks"]));
        assert_eq!(
            view["report"]["session"]["rank"]["rank"], rank,
            "{:#}",
            view["report"]["session"]
        );
    }
}
