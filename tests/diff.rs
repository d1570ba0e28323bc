//! `gapscope diff BASE NEW`: did the fix work? Checked on real pairs — a
//! simtrain run with its bottleneck and the same job with the bottleneck
//! fixed (the diff must name the cause that went away, as big as the two
//! reports say), two runs of one job (unchanged), a session against itself,
//! and the real PyTorch traces against themselves and against a copy made
//! slower — and its gate's exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gapscope_tests::*;
use serde_json::Value;

const STEPS: &str = "60";

fn diff(args: &[&str]) -> Output {
    Command::new(gapscope())
        .arg("diff")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running gapscope diff")
}

/// `gapscope diff BASE NEW --format json ARGS`: its exit code and its
/// output, checked against docs/diff.schema.json.
fn diff_json(base: &Path, new: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = vec![
        base.to_str().unwrap(),
        new.to_str().unwrap(),
        "--format",
        "json",
    ];
    all.extend_from_slice(args);
    let out = diff(&all);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_diff_schema(&v);
    (out.status.code().unwrap_or(-1), v)
}

/// simtrain recorded; its run directory.
fn record(dir: &Path, name: &str, simtrain_args: &[&str]) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let (run, _) = run_simtrain(&d, &["-q", "--no-exports"], simtrain_args);
    run.dir
}

fn pct(report: &Value, cause: &str) -> f64 {
    let g = &report["gpus"][0];
    u64_of(&g["idle_by_cause_ns"], cause) as f64 * 100.0 / u64_of(g, "allocated_ns") as f64
}

fn cause<'a>(d: &'a Value, name: &str) -> &'a Value {
    d["causes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cause"] == name)
        .unwrap_or_else(|| panic!("no {name} in {:#}", d["causes"]))
}

#[test]
fn a_fixed_bottleneck_is_named_with_its_size() {
    simtrain_data();
    let dir = scratch("diff-fixed");
    let (base, fixed) = {
        let _lock = recording_lock();
        let args = ["--bottleneck", "input-io", "--steps", STEPS];
        let base = record(dir.path(), "base", &args);
        let mut f = args.to_vec();
        f.extend(["--fix", "input.io"]);
        (base, record(dir.path(), "fixed", &f))
    };
    let (rb, rf) = (report_json(&base), report_json(&fixed));

    let (code, d) = diff_json(&base, &fixed, &["--gate", "1"]);
    assert_eq!(code, 0, "{d:#}");
    let v = &d["verdict"];
    assert_eq!(v["outcome"], "improved", "{v:#}");
    assert_eq!(v["basis"], "steps");
    assert!(v["confidence"].as_f64().unwrap() > 0.99, "{v:#}");
    assert_eq!(d["steps"]["matched"], 60);
    // The cause that went away, as big as the two reports' own figures.
    assert_eq!(v["largest_change"]["cause"], "input.io", "{v:#}");
    let own = pct(&rf, "input.io") - pct(&rb, "input.io");
    let said = cause(&d, "input.io")["change_points"].as_f64().unwrap();
    assert!(
        (said - own).abs() <= 5.0,
        "the diff says input.io moved {said:.1} points, the reports {own:.1}"
    );
    assert!(
        own < -30.0,
        "input.io went from {:.1}%",
        pct(&rb, "input.io")
    );
    // Step time as the runs' walls say: the fixed one's steps are its GPU
    // work's (4 × 1.5 ms); the bottleneck's longer by the stall the fix
    // took out — the base's own input.io idle a step, however fast this
    // machine's storage is today (O_DIRECT reads of a disk the host may
    // have cached: 10 ms steps one run, 25 the next).
    let (sb, sn) = (
        u64_of(&d["steps"]["base"], "mean_ns"),
        u64_of(&d["steps"]["new"], "mean_ns"),
    );
    assert!((5_500_000..7_500_000).contains(&sn), "{:#}", d["steps"]);
    let stall =
        u64_of(&rb["gpus"][0]["idle_by_cause_ns"], "input.io") / STEPS.parse::<u64>().unwrap();
    assert!(
        sb > sn && (sb - sn) as f64 >= 0.5 * stall as f64,
        "steps {sb} ns against {sn} ns, the base's input.io stall {stall} ns a step\n{:#}",
        d["steps"]
    );
    assert_eq!(d["gate"]["passed"], true);

    // The other way round: a regression, and the gate fails with exit 3
    // (the comparison still written).
    let (code, back) = diff_json(&fixed, &base, &["--gate", "5"]);
    assert_eq!(code, 3, "{:#}", back["verdict"]);
    assert_eq!(back["verdict"]["outcome"], "regressed");
    assert_eq!(back["gate"]["passed"], false);
    // Within the gate: exit 0.
    let (code, _) = diff_json(&fixed, &base, &["--gate", "99"]);
    assert_eq!(code, 0);

    // The differential idle-gap stacks: input.io's were BASE's input.io
    // idle time, and NEW has none.
    let folded = diff(&[
        base.to_str().unwrap(),
        fixed.to_str().unwrap(),
        "--format",
        "folded",
    ]);
    assert!(folded.status.success());
    let (mut was, mut now) = (0u64, 0u64);
    for line in String::from_utf8(folded.stdout).unwrap().lines() {
        let mut parts = line.rsplitn(3, ' ');
        let (n, b, stack) = (
            parts.next().unwrap().parse::<u64>().unwrap(),
            parts.next().unwrap().parse::<u64>().unwrap(),
            parts.next().unwrap(),
        );
        if stack.split(';').next() == Some("input.io") {
            was += b;
            now += n;
        }
    }
    assert_eq!(was, u64_of(&rb["gpus"][0]["idle_by_cause_ns"], "input.io"));
    assert_eq!(now, 0);
    assert!(d["idle_stacks"]["shrank"][0]["frames"][0] == "input.io");

    // Markdown for a pull request: the same figures.
    let md = diff(&[base.to_str().unwrap(), fixed.to_str().unwrap(), "-f", "md"]);
    let md = String::from_utf8(md.stdout).unwrap();
    let row = md
        .lines()
        .find(|l| l.starts_with("| input.io |"))
        .unwrap_or_else(|| panic!("{md}"));
    assert!(
        row.contains(&format!(
            "{:.1}%",
            cause(&d, "input.io")["base_pct"].as_f64().unwrap()
        )),
        "{row}"
    );
    assert!(md.contains("Improved: step time"), "{md}");

    // HTML: one self-contained page, the verdict and both flamegraphs.
    let page = dir.path().join("diff.html");
    let out = diff(&[
        base.to_str().unwrap(),
        fixed.to_str().unwrap(),
        "-f",
        "html",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(r#"data-outcome="improved""#));
    assert!(html.contains(r#"id="simulated""#));
    for id in ["flame-new", "flame-base"] {
        assert!(html.contains(&format!(r#"id="{id}""#)), "{id}");
    }
    for attr in ["src=\"http", "href=\"http", "<link", "<script src"] {
        assert!(!html.contains(attr), "not self-contained: {attr}");
    }
    if let Some(browser) = browser("a_fixed_bottleneck_is_named_with_its_size") {
        let (dom, console) = chromium(&browser, &page, &["--dump-dom".into()]);
        assert!(console.is_empty(), "console output: {console:#?}");
        assert!(dom.contains(&*esc(d["verdict"]["text"].as_str().unwrap())));
    }
}

/// Text as HTML writes it.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[test]
fn two_runs_of_one_job_are_unchanged() {
    simtrain_data();
    let dir = scratch("diff-same");
    // The network scenario: its pace is its server's, not this machine's
    // load (its steps alternate ~0 and ~30 ms: the blocks' means are what
    // keep that spread from hiding a change or inventing one).
    let args = ["--bottleneck", "input-network", "--steps", STEPS];
    let (a, b) = {
        let _lock = recording_lock();
        (
            record(dir.path(), "a", &args),
            record(dir.path(), "b", &args),
        )
    };
    let (code, d) = diff_json(&a, &b, &["--gate", "3"]);
    assert_eq!(code, 0, "{:#}", d["verdict"]);
    assert_eq!(d["verdict"]["outcome"], "unchanged", "{:#}", d["verdict"]);
    assert!(
        d["verdict"]["change"].as_f64().unwrap().abs() < 5.0,
        "{:#}",
        d["verdict"]
    );
    // A margin small enough that a real change would show: a 20% slower
    // step is outside it.
    assert!(
        d["verdict"]["margin99"].as_f64().unwrap() < 20.0,
        "{:#}",
        d["verdict"]
    );

    // A session against itself: nothing moved, and nothing is claimed.
    let (code, same) = diff_json(&a, &a, &["--gate", "0"]);
    assert_eq!(code, 0);
    let v = &same["verdict"];
    assert_eq!(v["outcome"], "unchanged");
    assert_eq!(v["change"].as_f64(), Some(0.0));
    assert_eq!(v["p_value"].as_f64(), Some(1.0));
    assert!(v["largest_change"].is_null(), "{v:#}");
    assert!(same["idle_stacks"]["grew"].as_array().unwrap().is_empty());
    assert!(same["idle_stacks"]["shrank"].as_array().unwrap().is_empty());
}

/// A trace made slower the way a new `.item()` and `delay` µs of host work
/// in each ProfilerStep would: 1 µs into each step the host stops until its
/// GPU has run everything issued so far, then works `delay` µs; everything
/// it does and issues after moves later by that, what spans the moment
/// gets longer, and work issued before keeps its place.
fn slowed(trace: &Value, delay: f64) -> Value {
    let events = trace["traceEvents"].as_array().unwrap();
    let f = |e: &Value, k: &str| e[k].as_f64();
    let gpu = |e: &Value| {
        e["ph"] == "X"
            && matches!(
                e["cat"].as_str(),
                Some("kernel" | "gpu_memcpy" | "gpu_memset")
            )
    };
    let correlation = |e: &Value| e["args"]["correlation"].as_u64();
    let launched: std::collections::HashMap<u64, f64> = events
        .iter()
        .filter(|e| matches!(e["cat"].as_str(), Some("cuda_runtime" | "cuda_driver")))
        .filter_map(|e| Some((correlation(e)?, f(e, "ts")?)))
        .collect();
    let issued = |e: &Value| {
        let ts = f(e, "ts").unwrap();
        correlation(e)
            .and_then(|c| launched.get(&c).copied())
            .map_or(ts, |l| l.min(ts))
    };
    // (issued, end) of each piece of GPU work.
    let work: Vec<(f64, f64)> = events
        .iter()
        .filter(|e| gpu(e))
        .map(|e| (issued(e), f(e, "ts").unwrap() + f(e, "dur").unwrap()))
        .collect();
    let mut steps: Vec<f64> = events
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("ProfilerStep#"))
        })
        .filter_map(|e| f(e, "ts"))
        .collect();
    steps.sort_by(f64::total_cmp);
    // (the moment, how long the host stops there).
    let pauses: Vec<(f64, f64)> = steps
        .iter()
        .map(|&s| {
            let t = s + 1.0;
            let drained = work
                .iter()
                .filter(|w| w.0 < t)
                .map(|w| w.1)
                .fold(t, f64::max);
            (t, drained - t + delay)
        })
        .collect();
    let shift = |x: f64| -> f64 { pauses.iter().filter(|p| p.0 <= x).map(|p| p.1).sum() };
    let mut out = trace.clone();
    for e in out["traceEvents"].as_array_mut().unwrap() {
        let Some(ts) = f(e, "ts") else {
            continue;
        };
        if gpu(e) {
            e["ts"] = (ts + shift(issued(e))).into();
            continue;
        }
        let moved = shift(ts);
        e["ts"] = (ts + moved).into();
        if let Some(d) = f(e, "dur") {
            e["dur"] = (d + shift(ts + d) - moved).into();
        }
    }
    out
}

#[test]
fn real_traces_against_themselves_and_a_slower_copy() {
    let v100 = kineto_traces().join("v100_ns_rank0.json.gz");
    let (code, same) = diff_json(&v100, &v100, &["--gate", "0"]);
    assert_eq!(code, 0);
    assert_eq!(same["verdict"]["outcome"], "unchanged");
    assert_eq!(same["verdict"]["basis"], "steps");
    assert_eq!(same["steps"]["matched"], 5);
    assert_eq!(same["steps"]["source"][0], "ProfilerStep#N");

    // The same trace with a synchronize and 20 ms of host work in each of
    // its 5 steps: every step at least 20 ms slower, the GPU idle the
    // more, its work the same.
    let dir = scratch("diff-kineto");
    let trace: Value = serde_json::from_slice(&gunzip(&v100)).unwrap();
    let slow_path = dir.path().join("v100_slower.json");
    std::fs::write(
        &slow_path,
        serde_json::to_vec(&slowed(&trace, 20_000.0)).unwrap(),
    )
    .unwrap();
    let (code, d) = diff_json(&v100, &slow_path, &["--gate", "5"]);
    assert_eq!(code, 3, "{:#}", d["verdict"]);
    let v = &d["verdict"];
    assert_eq!(v["outcome"], "regressed", "{v:#}");
    assert!(v["confidence"].as_f64().unwrap() > 0.99, "{v:#}");
    let mean = |s: &str| u64_of(&d["steps"][s], "mean_ns");
    assert!(mean("new") >= mean("base") + 20_000_000, "{:#}", d["steps"]);
    // What was added is idle time, and the diff's idle grew by as much as
    // the GPU's span did.
    let g = &d["gpus"][0];
    let fig = |s: &str, k: &str| u64_of(&g[s], k) as i64;
    assert_eq!(fig("new", "busy_ns"), fig("base", "busy_ns"));
    let grew = fig("new", "idle_ns") - fig("base", "idle_ns");
    let longer = fig("new", "allocated_ns") - fig("base", "allocated_ns");
    assert!(grew >= 100_000_000, "{g:#}");
    assert!((grew - longer).abs() < 1_000_000, "{g:#}");
    assert!(d["idle_share"]["change_points"].as_f64().unwrap() > 5.0);
}

#[test]
fn mistakes_are_one_line_and_exit_codes_say_what_happened() {
    let v100 = kineto_traces().join("v100_ns_rank0.json.gz");
    let v = v100.to_str().unwrap();
    // A missing input: error (1), one line.
    let out = diff(&[v, "/nonexistent/trace.json"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/trace.json"), "{err}");
    // Not a trace nor a session: named once.
    let dir = scratch("diff-garbage");
    let junk = dir.path().join("junk.json");
    std::fs::write(&junk, "garbage\n").unwrap();
    let out = diff(&[v, junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches(junk.to_str().unwrap()).count(), 1, "{err}");
    // Command-line mistakes: 2.
    for args in [
        vec![v],
        vec![v, v, "--gate", "-1"],
        vec![v, v, "--gate", "x"],
        vec![v, v, "--format", "pdf"],
    ] {
        let out = diff(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

/// Directories of per-rank traces are compared rank with rank, whatever
/// their files are called: the same two ranks under swapped names are
/// unchanged, each GPU matched with its own (by file order they would be
/// two GPUs gone and two new ones).
#[test]
fn per_rank_traces_are_matched_by_rank_not_by_file_name() {
    let dir = scratch("diff-ranks");
    let (a100, v100) = (
        kineto_traces().join("a100_8rank_rank3.json.gz"),
        kineto_traces().join("v100_ns_rank0.json.gz"),
    );
    let side = |name: &str, first: &Path, second: &Path| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::copy(first, d.join("a.json.gz")).unwrap();
        std::fs::copy(second, d.join("b.json.gz")).unwrap();
        d
    };
    let base = side("base", &a100, &v100);
    let new = side("new", &v100, &a100);
    let (code, d) = diff_json(&base, &new, &["--gate", "0"]);
    assert_eq!(code, 0, "{:#}", d["verdict"]);
    assert_eq!(d["verdict"]["outcome"], "unchanged");
    let gpus = d["gpus"].as_array().unwrap();
    let keys: Vec<&str> = gpus.iter().map(|g| g["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["rank 3 · GPU 3", "rank 0 · GPU 0"]);
    for g in gpus {
        assert_eq!(g["base"], g["new"], "{g:#}");
    }
    assert_eq!(d["idle_share"]["change_points"].as_f64().unwrap(), 0.0);
}
