//! An inference server on a simulated GPU, loaded by a client over TCP
//! (examples/python/serve_requests.py: socketserver on loopback, 4 ms of
//! kernels a request). Ground truth is the server's own clock: of its GPU's
//! idle between its first and last work, the time it spent blocked reading
//! the next request; its requests and the time from each one's arrival to
//! its answer.

use gapscope_tests::*;
use serde_json::Value;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/python/serve_requests.py"
);

/// The server recorded under `gapscope run` with the client's requests
/// `interval_ms` apart at most (0: back to back), with socketserver or
/// (`--plain`) a loop of its own: its report and truth.
fn serve(interval_ms: &str, extra: &[&str]) -> Option<(Value, Value)> {
    let py = venv_python("socketserver")?;
    let _lock = recording_lock();
    let mut args = vec!["--interval-ms", interval_ms];
    args.extend_from_slice(extra);
    let name = format!("serve-{interval_ms}{}", extra.join(""));
    Some(record_python_workload(&name, &py, SCRIPT, &args))
}

/// Of the GPU's idle between its first and last work: the percent the
/// server waited for requests by its own clock, and the percent `demand`
/// took; printed after `label`.
fn demand_shares(label: &str, g: &Value, truth: &Value) -> (f64, f64) {
    let want = u64_of(truth, "idle_waiting_for_requests_ns") as f64 * 100.0
        / u64_of(truth, "idle_between_ns") as f64;
    let got = idle_share(g, |c| c == "demand");
    eprintln!(
        "{label}truth waiting for requests {want:.1}%, demand {got:.1}% ({})",
        g["idle_by_cause_ns"]
    );
    (want, got)
}

/// The request figures against the server's clock: every request counted
/// (the wakeup for the connection, which gave the GPU no work, is none),
/// the median time from arrival to answer, and the GPU's busy time a
/// request (its 4 ms of kernels).
fn requests_match(g: &Value, truth: &Value) {
    let q = &g["requests"];
    eprintln!("requests: {q}; truth {truth}");
    let (count, want) = (u64_of(q, "count"), u64_of(truth, "requests"));
    // Seen to move by one or two in a run: the last request is lost where
    // the server's last wait (for the client to hang up, woken by its
    // exit) does not read as one for a request.
    assert!(
        count.abs_diff(want) <= 2,
        "{count} requests counted, {want} answered: {q:#}"
    );
    let (p50, want) = (
        u64_of(q, "latency_p50_ns") as f64,
        u64_of(truth, "latency_p50_ns") as f64,
    );
    assert!(
        (p50 - want).abs() <= (0.1 * want).max(500e3),
        "p50 {p50} ns, the server's clock {want} ns: {q:#}"
    );
    let (busy, want) = (
        u64_of(q, "gpu_busy_per_request_ns") as f64,
        u64_of(truth, "kernel_ns") as f64,
    );
    assert!(
        (busy - want).abs() <= 0.1 * want,
        "GPU busy {busy} ns a request, its kernels {want} ns: {q:#}"
    );
    assert!(q["energy_per_request_j"].is_null(), "no NVML here: {q:#}");
}

/// Requests 10-50 ms apart: the server waits for them nearly all its idle
/// time. That is `demand` (it blocked in socketserver's request loop),
/// within 5 points of its clock, not `input.network`; no recommendation
/// promises a speed-up from it, and the verdict says the GPU has capacity
/// to spare at this load.
#[test]
fn a_server_waiting_for_requests_is_demand_not_input() {
    let Some((report, truth)) = serve("50", &[]) else {
        return;
    };
    let g = &report["gpus"][0];
    assert_eq!(g["source"], "simulated");
    let (want, got) = demand_shares("", g, &truth);
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
    requests_match(g, &truth);
}

/// The same server flooded (the client sends each request as soon as the
/// last answer is in): its GPU is busy nearly all the time, and the verdict
/// no longer calls it spare capacity.
#[test]
fn a_flooded_server_has_no_demand_to_wait_for() {
    let Some((report, truth)) = serve("0", &[]) else {
        return;
    };
    let g = &report["gpus"][0];
    let (want, got) = demand_shares("flooded: ", g, &truth);
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
    // A flooded server often finds the next request already there and
    // never waits for it: the two read as one, longer request (as the
    // figures' definition says). Never more requests than it answered, and
    // as many requests as waits that ended in GPU work.
    let q = &g["requests"];
    eprintln!("flooded requests: {q}; truth {truth}");
    assert!(u64_of(q, "count") <= u64_of(&truth, "requests"), "{q:#}");
}

/// A server of its own making (a socket it accepted, read in a loop, no
/// framework gapscope has a rule for): still `demand`, told by the
/// connection — the kernel made it by accepting, so the peer is a client,
/// not a data source. Before, the loop read as `input.network`.
#[test]
fn a_server_of_its_own_waits_on_a_connection_it_accepted() {
    let Some((report, truth)) = serve("50", &["--plain"]) else {
        return;
    };
    let g = &report["gpus"][0];
    let (want, got) = demand_shares("plain: ", g, &truth);
    assert!(
        (got - want).abs() <= 5.0,
        "demand {got:.1}% of the idle, waiting for requests {want:.1}%: {}",
        g["idle_by_cause_ns"]
    );
    for r in report["recommendations"].as_array().unwrap() {
        assert!(!r["cause"].as_str().unwrap().starts_with("input."), "{r:#}");
    }
    requests_match(g, &truth);
}
