//! An inference server on a simulated GPU, loaded by a client over TCP
//! (examples/python/serve_requests.py: socketserver on loopback, 4 ms of
//! kernels a request). Ground truth is the server's own clock: of its GPU's
//! idle between its first and last work, the time it spent blocked reading
//! the next request.

use gapscope_tests::*;
use serde_json::Value;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/python/serve_requests.py"
);

/// The server recorded under `gapscope run` with the client's requests
/// `interval_ms` apart at most (0: back to back): its report and truth.
fn serve(interval_ms: &str) -> Option<(Value, Value)> {
    let py = venv_python("socketserver")?;
    let dir = scratch(&format!("serve-{interval_ms}"));
    let truth = dir.path().join("truth.json");
    let lib = target_dir().join("libgs_simgpu.so");
    let _lock = recording_lock();
    let r = run(
        &dir.path().join("rec"),
        &["-q", "--no-exports"],
        &[
            py.to_str().unwrap(),
            SCRIPT,
            "--lib",
            lib.to_str().unwrap(),
            "--truth",
            truth.to_str().unwrap(),
            "--interval-ms",
            interval_ms,
        ],
    );
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let truth: Value = serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    Some((r.report(), truth))
}

/// Of the GPU's idle between its first and last work, the percent
/// `demand` took.
fn demand_share(g: &Value) -> f64 {
    let causes = g["idle_by_cause_ns"].as_object().unwrap();
    let between: u64 = causes
        .iter()
        .filter(|(c, _)| !matches!(c.as_str(), "startup" | "teardown"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    u64_of(&g["idle_by_cause_ns"], "demand") as f64 * 100.0 / between.max(1) as f64
}

/// Requests 10-50 ms apart: the server waits for them nearly all its idle
/// time. That is `demand` (it blocked in socketserver's request loop),
/// within 5 points of its clock, not `input.network`; no recommendation
/// promises a speed-up from it, and the verdict says the GPU has capacity
/// to spare at this load.
#[test]
fn a_server_waiting_for_requests_is_demand_not_input() {
    let Some((report, truth)) = serve("50") else {
        return;
    };
    let g = &report["gpus"][0];
    assert_eq!(g["source"], "simulated");
    let want = u64_of(&truth, "idle_waiting_for_requests_ns") as f64 * 100.0
        / u64_of(&truth, "idle_between_ns") as f64;
    let got = demand_share(g);
    eprintln!(
        "truth waiting for requests {want:.1}%, demand {got:.1}% ({})",
        g["idle_by_cause_ns"]
    );
    assert!(want >= 90.0, "the workload's own premise: {want:.1}%");
    assert!(
        (got - want).abs() <= 5.0,
        "demand {got:.1}% of the idle, waiting for requests {want:.1}%: {}",
        g["idle_by_cause_ns"]
    );
    for r in report["recommendations"].as_array().unwrap() {
        let cause = r["cause"].as_str().unwrap();
        assert!(!cause.starts_with("input."), "{r:#}");
    }
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("waited for requests") && verdict.contains("spare capacity"),
        "{verdict}"
    );
}

/// The same server flooded (the client sends each request as soon as the
/// last answer is in): its GPU is busy nearly all the time, and the verdict
/// no longer calls it spare capacity.
#[test]
fn a_flooded_server_has_no_demand_to_wait_for() {
    let Some((report, truth)) = serve("0") else {
        return;
    };
    let g = &report["gpus"][0];
    let want = u64_of(&truth, "idle_waiting_for_requests_ns") as f64 * 100.0
        / u64_of(&truth, "idle_between_ns") as f64;
    let got = demand_share(g);
    eprintln!(
        "flooded: truth waiting for requests {want:.1}%, demand {got:.1}% ({})",
        g["idle_by_cause_ns"]
    );
    // What idle is left is a few hundred µs a request, read at the
    // resolution of the switches around it: demand never claims more of it
    // than the server spent waiting.
    assert!(
        got <= want + 5.0,
        "demand {got:.1}% of the idle, waiting for requests {want:.1}%: {}",
        g["idle_by_cause_ns"]
    );
    assert!(
        !report["verdict"]
            .as_str()
            .unwrap()
            .contains("waited for requests"),
        "{}",
        report["verdict"]
    );
}
