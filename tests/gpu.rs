//! The GPU half under `gapscope run`, without a GPU: the shim injected into a
//! process that has no CUDA, and a simulated GPU speaking the same protocol
//! with exactly known kernels.

use gapscope_tests::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

#[test]
fn a_simulated_gpus_kernels_give_exact_busy_idle_and_gaps() {
    if !bpf_ready("a_simulated_gpus_kernels_give_exact_busy_idle_and_gaps") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("fakegpu");
    let (run, lines) = run_workload(
        dir.path(),
        &["-q"],
        &[
            "fake-gpu",
            "--kernels",
            "40",
            "--kernel-us",
            "500",
            "--gap-us",
            "150",
        ],
    );
    let t = &lines[0];
    let report = run.report();
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{report}");
    let g = &gpus[0];
    assert_eq!(g["source"], "simulated");
    assert_eq!(g["name"], "Simulated GPU 0");
    assert_eq!(u64_of(g, "busy_ns"), u64_of(t, "busy_ns"));
    assert_gpu_partitions(g);
    assert_eq!(
        u64_of(g, "span_ns"),
        u64_of(t, "last_ns") - u64_of(t, "first_ns")
    );
    // 39 gaps of 150 µs: all above 10 µs and 100 µs, none above 1 ms.
    assert_eq!(u64_of(&g["gaps"]["gt_10us"], "count"), u64_of(t, "gaps"));
    assert_eq!(
        u64_of(&g["gaps"]["gt_10us"], "total_ns"),
        u64_of(t, "gaps") * u64_of(t, "gap_ns")
    );
    assert_eq!(u64_of(&g["gaps"]["gt_100us"], "count"), u64_of(t, "gaps"));
    assert_eq!(u64_of(&g["gaps"]["gt_1ms"], "count"), 0);
    assert_eq!(u64_of(&g["kernels"], "count"), 40);
    let window = u64_of(&report["window_ns"], "end") - u64_of(&report["window_ns"], "start");
    assert_eq!(u64_of(g, "allocated_ns"), window);
    // Each kernel starts after its launch call, and each launch call was
    // made while eBPF saw its thread on a CPU.
    let cc = &g["clock_check"];
    assert_eq!(u64_of(cc, "kernels_checked"), 40);
    assert_eq!(u64_of(cc, "kernels_before_launch"), 0);
    assert_eq!(u64_of(cc, "launches_checked"), 40);
    assert_eq!(u64_of(cc, "launches_while_off_cpu"), 0);
    let api = &report["cuda_api"][0];
    assert_eq!(api["tid"], t["tid"]);
    assert_eq!(api["calls"][0]["name"], "cudaLaunchKernel");
    assert_eq!(api["calls"][0]["count"], 40);
}

#[test]
fn a_process_without_cuda_gets_the_shim_and_runs_unaffected() {
    if !bpf_ready("a_process_without_cuda_gets_the_shim_and_runs_unaffected") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("noncuda");
    let run = run(
        &dir.path().join("rec"),
        &[],
        &[bin("gs-inject-host").to_str().unwrap()],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let host: Value = serde_json::from_slice(&run.output.stdout).unwrap();
    // gapscope put the shim in its environment and the "driver" loaded it.
    assert_eq!(host["init_rc"], 1);
    assert!(
        run.stderr().contains("GPUs: no GPU activity recorded"),
        "{}",
        run.stderr()
    );
    let report = run.report();
    assert!(report["gpus"].as_array().unwrap().is_empty());
    let src = &report["gpu_sources"][0];
    assert_eq!(src["pid"], host["pid"]);
    assert_eq!(src["kind"], "cupti");
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("libcupti not found") || notes.contains("error 15"),
        "{notes}"
    );

    let bare = run_no_gpu(&dir);
    assert_eq!(
        bare["init_rc"],
        Value::Null,
        "--no-gpu must not inject the shim"
    );
}

fn run_no_gpu(dir: &Scratch) -> Value {
    let r = run(
        &dir.path().join("rec2"),
        &["-q", "--no-gpu"],
        &[bin("gs-inject-host").to_str().unwrap()],
    );
    assert_eq!(r.code(), Some(0));
    assert!(r.report()["gpu_sources"].as_array().unwrap().is_empty());
    serde_json::from_slice(&r.output.stdout).unwrap()
}

#[test]
fn libcuda_uprobes_time_driver_calls_within_10_percent() {
    if !bpf_ready("libcuda_uprobes_time_driver_calls_within_10_percent") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("uprobe");
    let lib = bin("libfakecuda.so");
    let (run, lines) = run_workload(
        dir.path(),
        &["-q", "--libcuda", lib.to_str().unwrap()],
        &[
            "fake-cuda",
            "--lib",
            lib.to_str().unwrap(),
            // Calls right after dlopen: the uprobes are set on the library's
            // file before the command runs, so none may be missed.
            "--delay-ms",
            "0",
        ],
    );
    let t = &lines[0];
    let report = run.report();
    let src = &report["gpu_sources"][0];
    assert_eq!(src["kind"], "uprobe");
    let thread = report["cuda_api"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["tid"] == t["tid"])
        .unwrap_or_else(|| panic!("no CUDA API record for the calling thread: {report}"));
    for (name, expected) in t["calls"].as_object().unwrap() {
        let got = thread["calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == *name)
            .unwrap_or_else(|| panic!("{name} not recorded: {thread}"));
        // Exact counts: cuLaunchKernelEx calls cuLaunchKernel inside, and
        // that nested call must not count again.
        assert_eq!(got["count"], expected["count"], "{name}");
        assert_close(
            name,
            u64_of(got, "total_ns"),
            u64_of(expected, "total_ns"),
            0.10,
        );
    }
}

/// simtrain started on its own keeps its simulated GPU dormant on the
/// control socket a CUPTI shim would listen on; `gapscope attach` finds it
/// there as it finds a dormant shim, and gets its records from then on.
#[test]
fn a_running_simulated_gpu_is_attached_to_like_a_dormant_shim() {
    if !bpf_ready("a_running_simulated_gpu_is_attached_to_like_a_dormant_shim") {
        return;
    }
    simtrain_data();
    let _lock = recording_lock();
    let dir = scratch("dormant-sim");
    let mut sim = dormant_simtrain(
        &["--bottleneck", "sync", "--steps", "300"],
        &dir.path().join("truth.json"),
    );
    let rec = dir.path().join("rec");
    let out = attach(&rec, sim.id(), "1.5", &["--no-exports"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(sim.wait().unwrap().success());
    let report = report_json(&rec);
    let g = &report["gpus"][0];
    assert_eq!(g["source"], "simulated", "{report:#}");
    assert_eq!(report["gpu_sources"][0]["loaded_by"], "simulated");
    // The kernels seen are whole and exact: 1.5 ms each, 4 a step, ~400 of
    // them in 1.5 s of steps of 6 ms of work and 9 ms of host time.
    let k = &g["kernels"];
    let n = u64_of(k, "count");
    assert!((200..=500).contains(&n), "{k}");
    assert_eq!(u64_of(k, "total_ns"), n * 1_500_000);
    assert_gpu_partitions(g);
    // Seen from its first work after the attach: what ran before is not
    // counted as idle.
    assert!(u64_of(g, "unseen_ns") < 100_000_000, "{g:#}");
    assert!(u64_of(&g["idle_by_cause_ns"], "sync") > 0, "{g:#}");
}

/// The GPU bundle's check of `attach` to a training loop mid-flight (run on
/// a GPU machine): its judgements on known figures, and its runner — start
/// the loop, attach once it is warm, collect both — against the real
/// `gapscope attach` on a CPU-only stand-in loop.
#[test]
fn the_gpu_bundles_attach_check_judges_and_runs() {
    if !bpf_ready("the_gpu_bundles_attach_check_judges_and_runs") {
        return;
    }
    let _lock = recording_lock();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/gpu-bundle/selftest/test_attach.py");
    let out = succeed(
        Command::new("python3")
            .arg(&script)
            .env("GAPSCOPE", gapscope()),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    // unittest: every test ran (a skip would mean the runner went untested).
    assert!(
        said.contains("Ran 6 tests") && !said.contains("skipped"),
        "{said}"
    );
}

/// Two processes that each call their GPU device 0: different GPUs when
/// their UUIDs differ (CUDA_VISIBLE_DEVICES set per rank), one GPU when
/// they agree (processes sharing a GPU) — each simulated device reports 50
/// kernels of 2 ms.
#[test]
fn gpus_of_different_processes_are_told_apart_by_uuid() {
    if !bpf_ready("gpus_of_different_processes_are_told_apart_by_uuid") {
        return;
    }
    let _lock = recording_lock();
    let fake = |uuid: &str| {
        format!(
            "{} fake-gpu --kernels 50 --kernel-us 2000 --gap-us 2000 --uuid {uuid}",
            bin("gs-workload").display()
        )
    };
    for (a, b, gpus) in [("GPU-1111", "GPU-2222", 2), ("GPU-1111", "GPU-1111", 1)] {
        let dir = scratch("gpu-uuid");
        let script = format!("{} & {}; wait", fake(a), fake(b));
        let report = record_script(&dir.path().join("rec"), &script);
        assert_partitions(&report);
        let got = report["gpus"].as_array().unwrap();
        assert_eq!(got.len(), gpus, "{a} and {b}: {:#}", report["gpus"]);
        let ids: Vec<u64> = got.iter().map(|g| u64_of(g, "id")).collect();
        assert_eq!(ids, (0..gpus as u64).collect::<Vec<_>>());
        let mut uuids: Vec<&str> = got.iter().map(|g| g["uuid"].as_str().unwrap()).collect();
        uuids.sort();
        let mut want = vec![a, b];
        want.dedup();
        assert_eq!(uuids, want);
        for g in got {
            let per_gpu = 100 / gpus as u64;
            assert_eq!(u64_of(&g["kernels"], "count"), per_gpu, "{g:#}");
            assert_eq!(g["pids"].as_array().unwrap().len(), 2 / gpus, "{g:#}");
            if gpus == 2 {
                // Its own 50 kernels, exactly: nothing of the other's.
                assert_eq!(u64_of(g, "busy_ns"), 50 * 2_000_000, "{g:#}");
            }
        }
    }
}
