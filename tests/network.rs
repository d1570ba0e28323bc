//! A network that loses segments: examples/python/net_fetch.py (a training
//! loop on a simulated GPU fetching each batch over TCP from a data service)
//! run in a network namespace of its own, where an nftables rule drops one
//! in five of the service's data segments. The reference is the kernel's own
//! count of segments sent again in that namespace (RetransSegs), which the
//! workload reads before and after its loop: nothing else runs there.

use std::process::Command;

use gapscope_tests::*;
use serde_json::Value;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/python/net_fetch.py"
);

/// The service's port, in a namespace that has no other.
const PORT: u16 = 40123;

/// A network namespace and nftables, or None to skip (a panic where BPF
/// tests are required: `cargo xtask setup` installs nftables).
fn lossy_network_ready(test: &str) -> bool {
    let works = Command::new("unshare")
        .args(["-n", "sh", "-c", "ip link set lo up && nft list tables"])
        .output()
        .is_ok_and(|o| o.status.success());
    match works {
        true => true,
        false if std::env::var("GAPSCOPE_REQUIRE_BPF").as_deref() == Ok("1") => {
            panic!("{test}: a network namespace with nftables is required (GAPSCOPE_REQUIRE_BPF=1); cargo xtask setup installs nftables")
        }
        false => {
            eprintln!("skipping {test}: no network namespace with nftables here");
            false
        }
    }
}

/// Every segment TCP sent again on the job's connections is counted
/// against the kernel's count (a lost data segment also takes the ACK of
/// the request it answers: the trainer's loss probes send the request
/// again), and the input.network advice says the network lost segments,
/// with the peer.
#[test]
fn retransmissions_on_the_jobs_connections_are_counted_and_named() {
    let test = "retransmissions_on_the_jobs_connections_are_counted_and_named";
    if !bpf_ready(test) || !lossy_network_ready(test) {
        return;
    }
    let Some(py) = venv_python("socket") else {
        return;
    };
    let dir = scratch("netloss");
    let truth = dir.path().join("truth.json");
    let rec = dir.path().join("rec");
    let lib = target_dir().join("libgs_simgpu.so");
    let _lock = recording_lock();
    // The rule drops data from the service (its segments carry 16 KiB),
    // never a handshake, a bare ACK or a request.
    let setup = format!(
        "ip link set lo up && nft add table inet gs && \
         nft add chain inet gs out '{{ type filter hook output priority 0; }}' && \
         nft add rule inet gs out tcp sport {PORT} meta length gt 1000 numgen random mod 5 0 drop && \
         exec \"$@\""
    );
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", &setup, "sh"])
        .arg(gapscope())
        .args(["run", "-q", "--no-exports", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(&py)
        .arg(SCRIPT)
        .arg("--lib")
        .arg(&lib)
        .arg("--truth")
        .arg(&truth)
        .args(["--port", &PORT.to_string(), "--batches", "150"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let truth: Value = serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    let report: Value = serde_json::from_slice(&gapscope_stdout(&[
        "report",
        rec.to_str().unwrap(),
        "--format",
        "json",
    ]))
    .unwrap();
    let want = u64_of(&truth, "retrans_segs");
    assert!(
        want >= 2,
        "the premise, segments lost and sent again: {truth}"
    );
    let processes = report["processes"].as_array().unwrap();
    let counted: u64 = processes.iter().map(|p| u64_of(p, "tcp_retransmits")).sum();
    eprintln!("retransmissions: the kernel {want}, gapscope {counted}; {truth}");
    assert_eq!(counted, want, "{processes:#?}");
    // The advice: waiting on the network, and the network lost segments.
    let advice = report["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cause"] == "input.network")
        .unwrap_or_else(|| panic!("no input.network advice: {:#}", report["recommendations"]));
    let said = format!("{want} TCP retransmissions on the job's connections (to 127.0.0.1:");
    assert!(
        advice["evidence"].to_string().contains(&said),
        "no '{said}': {advice:#}"
    );
}
