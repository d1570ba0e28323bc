//! One job across nodes: three `simranks` processes, each recorded by its
//! own `gapscope run` (one session per node, as the agent or a Slurm
//! prolog would leave them), meet in all-reduces on simulated GPUs; rank
//! 2's host is 3 ms slower each step, so the others wait for it most.
//! `gapscope report rank0/ rank1/ rank2/` must put the sessions on one
//! clock by the all-reduces' ends and name the rank the others waited for
//! most, with their waits for each as the ranks themselves counted them.

use std::process::{Command, Stdio};

use gapscope_tests::*;
use serde_json::Value;

const STEPS: u64 = 40;

#[test]
fn sessions_of_several_nodes_name_the_rank_the_others_wait_for() {
    if !bpf_ready("ranks") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("ranks");
    let meet = dir.path().join("meet");
    std::fs::create_dir(&meet).unwrap();
    let rec = |r: u32| dir.path().join(format!("rank{r}"));
    let truth = dir.path().join("truth.json");
    let children: Vec<_> = (0..3u32)
        .map(|r| {
            let steps = STEPS.to_string();
            let mut args = vec![
                "--rank".to_string(),
                r.to_string(),
                "--world".into(),
                "3".into(),
                "--dir".into(),
                meet.to_str().unwrap().into(),
                "--steps".into(),
                steps,
                "--late-ms".into(),
                if r == 2 { "3" } else { "0" }.into(),
            ];
            if r == 0 {
                args.extend(["--truth".to_string(), truth.to_str().unwrap().into()]);
            }
            Command::new(gapscope())
                .args(["run", "-q", "--no-exports", "-o"])
                .arg(rec(r))
                .arg("--")
                .arg(bin("simranks"))
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("gapscope run")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let truth: Value = serde_json::from_slice(&std::fs::read(&truth).unwrap()).unwrap();
    let out = succeed(
        Command::new(gapscope())
            .args(["report", "--format", "json"])
            .args((0..3).map(rec)),
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "gapscope.ranks/1");
    assert_reports_schema(&v);
    let rows = v["cross_rank"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let waits: Vec<u64> = (0..3)
        .map(|r| u64_of(&truth["ranks"][r], "waited_for_ns"))
        .collect();
    eprintln!("truth: the others waited {waits:?} ns for each rank");
    // Rank 2 is late by design, but on a loaded machine a preempted rank
    // is late too: the one named is the one the ranks waited for most.
    let most = (0..3).max_by_key(|&r| waits[r]).unwrap();
    for (r, row) in rows.iter().enumerate() {
        eprintln!("{row}");
        assert_eq!(row["label"], format!("rank{r}"));
        // Every all-reduce of each rank matched with the others'.
        assert_eq!(u64_of(row, "collectives_matched"), STEPS, "{row}");
        // One machine, one clock: the headers' wall clocks already agree
        // to microseconds; a correction means the wrong ends were matched.
        assert!(
            row["clock_refined_ns"].as_i64().unwrap().abs() < 200_000,
            "{row}"
        );
        assert_eq!(
            u64_of(row, "last_at"),
            u64_of(&truth["ranks"][r], "last_at"),
            "{row}"
        );
        // The kernels' starts are the ranks' own: their sums agree.
        let got = u64_of(row, "waited_for_ns");
        assert!(
            got.abs_diff(waits[r]) <= waits[r] / 20 + 100_000,
            "rank {r}: {got} ns waited for it, the ranks counted {}",
            waits[r]
        );
        assert_eq!(row["slowest"], r == most, "{row}");
    }
}
