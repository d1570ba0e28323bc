//! The exporters. Golden files pin each one's output on a real recording
//! kept in the repository; the timeline is checked structurally and against
//! the report (the idle track must add up to the report's idle, cause by
//! cause); the flamegraphs against the report's accounting; the HTML report
//! is opened in headless Chromium. One live recording checks that `run`
//! writes the whole bundle.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;

use gapscope_tests::*;
use serde_json::Value;

fn golden() -> String {
    golden_session().to_str().unwrap().to_string()
}

#[test]
fn exporters_match_their_golden_files() {
    let s = golden();
    let s = s.as_str();
    let cases: &[(&str, &[&str])] = &[
        ("report.txt", &["report", s]),
        ("report.md", &["report", "--format", "md", s]),
        ("report.json", &["report", "--format", "json", s]),
        ("report.html", &["report", "--format", "html", s]),
        (
            "flame-cpu.folded",
            &["export", s, "--flamegraph", "cpu", "--folded"],
        ),
        (
            "flame-offcpu.folded",
            &["export", s, "--flamegraph", "offcpu", "--folded"],
        ),
        (
            "flame-idle.folded",
            &["export", s, "--flamegraph", "idle", "--folded"],
        ),
        ("flame-idle.svg", &["export", s, "--flamegraph", "idle"]),
        (
            "trace-window.json",
            &["export", s, "--timeline", "--window", "0.10..0.13"],
        ),
    ];
    for (name, args) in cases {
        check_golden(name, &gapscope_stdout(args));
    }
}

/// `report` streams a session file's events and its GPU work and lets go of
/// the thread states, work and calls behind the attribution as it moves on;
/// the pictures read it whole and keep them all. Both must come to the same
/// report, number for number.
#[test]
fn streamed_and_whole_analyses_agree() {
    use gapscope::analyze::{analyze, AnalyzeOptions};
    use gapscope::export::{write, Format, Options, Subject, View};
    let path = golden_session();
    let json = |a: &gapscope::analyze::Analysis| {
        let mut out = Vec::new();
        write(
            Subject::Run(&View::new(a)),
            &Options::new(Format::Json),
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    };
    let whole = analyze(
        gapscope::session::read_session(&path).unwrap(),
        &AnalyzeOptions {
            pictures: true,
            hta: false,
            ..Default::default()
        },
    )
    .unwrap();
    let streamed = analyze(path.clone(), &AnalyzeOptions::default()).unwrap();
    // Trying to attribute after every single event, too.
    let eager =
        gapscope::analyze::analyze_settling_every(path.clone(), &AnalyzeOptions::default(), 1)
            .unwrap();
    // The lean analyses let go of thread states, otherwise this proves
    // nothing: the eager one of nearly all once attributed (the streamed
    // one, trying every 4096 events, holds most of this short recording's:
    // its GPU's first work comes after most of its events).
    let intervals = |a: &gapscope::analyze::Analysis| -> usize {
        a.timeline
            .all_threads()
            .iter()
            .map(|t| t.intervals.as_ref().map_or(0, Vec::len))
            .sum()
    };
    assert!(intervals(&streamed) <= intervals(&whole));
    assert!(intervals(&eager) * 20 < intervals(&whole));
    assert_eq!(json(&whole), json(&streamed));
    assert_eq!(json(&whole), json(&eager));
}

/// A timestamp or duration in µs, as written (3 decimals), back to ns.
fn ns(v: &Value) -> u64 {
    let us = v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    assert!(us >= 0.0, "negative time {us}");
    (us * 1000.0).round() as u64
}

struct TimelineTotals {
    /// Per GPU id: idle by cause, ns.
    idle: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Per GPU id: kernels, copies and memsets drawn.
    gpu_slices: BTreeMap<u64, u64>,
    flows: usize,
    events: usize,
}

/// What any Chrome-trace reader needs: known phases, durations on every
/// slice, slices on one track nested or disjoint, flows paired and forward
/// in time, every pid and tid named.
fn check_timeline(trace: &Value) -> TimelineTotals {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let mut processes: HashMap<u64, String> = HashMap::new();
    let mut threads: HashSet<(u64, u64)> = HashSet::new();
    for e in events.iter().filter(|e| e["ph"] == "M") {
        let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let name = e["args"]["name"]
            .as_str()
            .expect("metadata name")
            .to_string();
        assert!(!name.is_empty(), "empty name in {e}");
        match e["name"].as_str().unwrap() {
            "process_name" => {
                processes.insert(pid, name);
            }
            "thread_name" => {
                threads.insert((pid, tid));
            }
            other => panic!("unexpected metadata {other}"),
        }
    }
    let mut tracks: HashMap<(u64, u64), Vec<(u64, u64)>> = HashMap::new();
    let mut flows: HashMap<u64, (Vec<u64>, Vec<u64>)> = HashMap::new();
    let mut totals = TimelineTotals {
        idle: BTreeMap::new(),
        gpu_slices: BTreeMap::new(),
        flows: 0,
        events: events.len(),
    };
    let gpu_id = |pid: u64| -> Option<u64> {
        let name = processes.get(&pid)?;
        name.strip_prefix("GPU ")?.split(':').next()?.parse().ok()
    };
    for e in events.iter().filter(|e| e["ph"] != "M") {
        let (pid, tid) = (
            e["pid"].as_u64().expect("pid"),
            e["tid"].as_u64().expect("tid"),
        );
        assert!(pid < 1 << 31 && tid < 1 << 31, "ids must fit 32 bits: {e}");
        assert!(processes.contains_key(&pid), "unnamed process in {e}");
        assert!(threads.contains(&(pid, tid)), "unnamed thread in {e}");
        let ts = ns(&e["ts"]);
        match e["ph"].as_str().unwrap() {
            "X" => {
                let dur = ns(&e["dur"]);
                tracks.entry((pid, tid)).or_default().push((ts, ts + dur));
                let cat = e["cat"].as_str().expect("cat");
                if cat == "idle" {
                    let g = gpu_id(pid).expect("idle slice on a GPU");
                    let cause = e["name"].as_str().unwrap().strip_prefix("idle: ").unwrap();
                    *totals
                        .idle
                        .entry(g)
                        .or_default()
                        .entry(cause.to_string())
                        .or_default() += dur;
                } else if cat == "gpu" {
                    *totals
                        .gpu_slices
                        .entry(gpu_id(pid).expect("GPU work on a GPU"))
                        .or_default() += 1;
                }
            }
            ph @ ("s" | "f") => {
                let id = e["id"].as_u64().expect("flow id");
                let f = flows.entry(id).or_default();
                if ph == "s" { &mut f.0 } else { &mut f.1 }.push(ts);
            }
            other => panic!("unexpected phase {other} in {e}"),
        }
    }
    for (id, (s, f)) in &flows {
        assert!(s.len() == 1 && f.len() == 1, "flow {id}: {s:?} → {f:?}");
        assert!(f[0] >= s[0], "flow {id} goes back in time");
    }
    totals.flows = flows.len();
    for (track, slices) in &mut tracks {
        slices.sort_by_key(|&(s, e)| (s, std::cmp::Reverse(e)));
        let mut open: Vec<u64> = Vec::new();
        for &(s, e) in slices.iter() {
            while open.last().is_some_and(|&end| end <= s) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(
                    e <= end,
                    "track {track:?}: [{s}, {e}) overlaps a slice ending at {end}"
                );
            }
            open.push(e);
        }
    }
    totals
}

/// The timeline against the report: the idle track adds up to the report's
/// idle, cause by cause, to the nanosecond; every kernel, copy and memset
/// is drawn.
fn check_timeline_against(t: &TimelineTotals, report: &Value) {
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(t.idle.len(), gpus.len(), "one idle track per GPU");
    for g in gpus {
        let id = u64_of(g, "id");
        let drawn = &t.idle[&id];
        assert_eq!(
            drawn.values().sum::<u64>(),
            u64_of(g, "idle_ns"),
            "GPU {id} idle"
        );
        for (cause, ns) in g["idle_by_cause_ns"].as_object().unwrap() {
            assert_eq!(
                drawn.get(cause).copied().unwrap_or(0),
                ns.as_u64().unwrap(),
                "GPU {id} idle: {cause}"
            );
        }
        let work = u64_of(&g["kernels"], "count")
            + u64_of(&g["memsets"], "count")
            + g["copies"]
                .as_object()
                .unwrap()
                .values()
                .map(|c| u64_of(c, "count"))
                .sum::<u64>();
        assert_eq!(
            t.gpu_slices.get(&id).copied().unwrap_or(0),
            work,
            "GPU {id} work items"
        );
    }
}

fn folded(path: &str, kind: &str) -> Vec<(Vec<String>, u64)> {
    let out = gapscope_stdout(&["export", path, "--flamegraph", kind, "--folded"]);
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').expect("folded line: STACK COUNT");
            (
                stack.split(';').map(str::to_string).collect(),
                n.parse().expect("count"),
            )
        })
        .collect()
}

/// The idle flamegraph is rooted at the causes with exactly the report's
/// idle time under each, and its widest tower is the first recommendation.
fn check_idle_flamegraph(path: &str, report: &Value) {
    let mut roots: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in folded(path, "idle") {
        *roots.entry(stack[0].clone()).or_default() += n;
    }
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for g in report["gpus"].as_array().unwrap() {
        for (cause, ns) in g["idle_by_cause_ns"].as_object().unwrap() {
            if ns.as_u64().unwrap() > 0 {
                *expected.entry(cause.clone()).or_default() += ns.as_u64().unwrap();
            }
        }
    }
    assert_eq!(
        roots, expected,
        "idle flamegraph roots vs the report's idle by cause"
    );
    // Of the recommended causes, the widest tower is the one with the most
    // idle time (the largest upper bound; recommendations come in the
    // replay's order). Exposed communication is busy time, not in this
    // graph.
    let recs: Vec<(&str, f64)> = report["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["cause"] != "communication")
        .map(|r| {
            (
                r["cause"].as_str().unwrap(),
                r["est_speedup"].as_f64().unwrap(),
            )
        })
        .collect();
    if let Some(most) = recs.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        let widest = roots
            .iter()
            .filter(|(c, _)| recs.iter().any(|r| r.0 == c.as_str()))
            .max_by_key(|(_, n)| **n)
            .map(|(c, _)| c.as_str());
        assert_eq!(
            widest,
            Some(most.0),
            "the widest tower vs the recommendation with the most idle time"
        );
    }
}

#[test]
fn timeline_is_well_formed_and_adds_up_to_the_report() {
    let s = golden();
    let report: Value =
        serde_json::from_slice(&gapscope_stdout(&["report", "-f", "json", &s])).unwrap();
    let trace: Value = serde_json::from_slice(&gapscope_stdout(&["export", &s, "--timeline"]))
        .expect("the timeline is valid JSON");
    let full = check_timeline(&trace);
    check_timeline_against(&full, &report);
    assert!(full.flows > 0, "launch → kernel arrows");

    // A window keeps what overlaps it, clipped, and stays well formed.
    let part: Value = serde_json::from_slice(&gapscope_stdout(&[
        "export",
        &s,
        "--timeline",
        "--window",
        "0.1..0.15",
    ]))
    .unwrap();
    let p = check_timeline(&part);
    assert!(
        p.events < full.events / 2,
        "{} of {} events",
        p.events,
        full.events
    );
    for e in part["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
    {
        let (ts, dur) = (ns(&e["ts"]), ns(&e["dur"]));
        assert!(
            ts >= 100_000_000 && ts + dur <= 150_000_000,
            "slice outside the window: {e}"
        );
    }
    let idle: u64 = p.idle.values().flat_map(|m| m.values()).sum();
    assert!(
        idle > 0 && idle <= 50_000_000,
        "idle in a 50 ms window: {idle}"
    );
}

#[test]
fn timeline_of_a_pytorch_trace_is_well_formed_and_adds_up() {
    let dir = kineto_traces();
    for name in ["v100_ns_rank0.json.gz", "a100_8rank_rank3.json.gz"] {
        let path = dir.join(name);
        let path = path.to_str().unwrap();
        let report: Value =
            serde_json::from_slice(&gapscope_stdout(&["report", "-f", "json", path])).unwrap();
        let trace: Value =
            serde_json::from_slice(&gapscope_stdout(&["export", path, "--timeline"])).unwrap();
        let t = check_timeline(&trace);
        check_timeline_against(&t, &report);
        assert!(t.flows > 1000, "{name}: {} launch arrows", t.flows);
        // The profiler's own ops are drawn on their threads.
        let ops = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "cpu_op")
            .count();
        assert!(ops > 1000, "{name}: {ops} cpu_op slices");
        check_idle_flamegraph(path, &report);
    }
}

#[test]
fn flamegraphs_account_for_the_reports_time() {
    let s = golden();
    let report: Value =
        serde_json::from_slice(&gapscope_stdout(&["report", "-f", "json", &s])).unwrap();
    check_idle_flamegraph(&s, &report);
    // The widest tower of all is the cause with the most idle time.
    let mut roots: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in folded(&s, "idle") {
        *roots.entry(stack[0].clone()).or_default() += n;
    }
    let widest = roots.iter().max_by_key(|(_, n)| **n).unwrap().0;
    let most = report["gpus"][0]["idle_by_cause_ns"]
        .as_object()
        .unwrap()
        .iter()
        .max_by_key(|(_, ns)| ns.as_u64().unwrap())
        .unwrap()
        .0;
    assert_eq!(widest, most);

    // On-CPU: the samples match the threads' on-CPU time (from the
    // scheduler's switches) at the sampling rate, within sampling noise.
    let hz = u64_of(&report["session"], "sample_hz");
    let samples: u64 = folded(&s, "cpu").iter().map(|(_, n)| n).sum();
    let on_cpu: u64 = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u64_of(t, "on_cpu_ns"))
        .sum();
    let expected = on_cpu as f64 * hz as f64 / 1e9;
    assert!(
        (samples as f64 - expected).abs() <= 0.25 * expected + 3.0,
        "{samples} samples for {on_cpu} ns on CPU at {hz} Hz"
    );
    // Off-CPU: every blocked nanosecond of every thread, under its stack.
    let blocked: u64 = folded(&s, "offcpu").iter().map(|(_, n)| n).sum();
    let off: u64 = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(off_cpu_total)
        .sum();
    assert_close("off-CPU flamegraph total", blocked, off, 0.01);
}

#[test]
fn html_report_renders_in_chromium_with_its_numbers() {
    let Some(browser) = browser("html_report_renders_in_chromium_with_its_numbers") else {
        return;
    };
    let dir = scratch("html");
    // The check can fail: a page with an error is caught.
    let canary = dir.path().join("canary.html");
    std::fs::write(
        &canary,
        "<!doctype html><html><body><script>undefinedFunction()</script></body></html>",
    )
    .unwrap();
    let (_, console) = chromium(&browser, &canary, &["--dump-dom".into()]);
    assert!(
        console.iter().any(|l| l.contains("undefinedFunction")),
        "console errors are not being captured: {console:?}"
    );

    let s = golden();
    let page = dir.path().join("report.html");
    gapscope_stdout(&[
        "report",
        "--format",
        "html",
        "-o",
        page.to_str().unwrap(),
        &s,
    ]);
    let report: Value =
        serde_json::from_slice(&gapscope_stdout(&["report", "-f", "json", &s])).unwrap();
    let text = String::from_utf8(gapscope_stdout(&["report", &s])).unwrap();

    let (dom, console) = chromium(&browser, &page, &["--dump-dom".into()]);
    assert!(console.is_empty(), "console output: {console:#?}");
    assert!(
        dom.contains("SIMULATED GPU"),
        "the simulated device says so"
    );
    for g in report["gpus"].as_array().unwrap() {
        let id = u64_of(g, "id");
        for (k, field) in [
            ("allocated", "allocated_ns"),
            ("busy", "busy_ns"),
            ("idle", "idle_ns"),
        ] {
            let attr = format!(r#"id="gpu{id}-{k}" data-ns="{}""#, u64_of(g, field));
            assert!(dom.contains(&attr), "{attr} not in the page");
        }
        // The numbers people read, as the text report prints them.
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("GPU {id} ")))
            .expect("GPU line in the text report");
        let busy = line
            .split(" · busy ")
            .nth(1)
            .unwrap()
            .split(" · ")
            .next()
            .unwrap();
        assert!(dom.contains(busy), "busy {busy:?} not in the page");
        for (cause, ns) in g["idle_by_cause_ns"].as_object().unwrap() {
            if ns.as_u64().unwrap() > 0 {
                let attr = format!(r#"id="gpu{id}-idle-{cause}" data-ns="{ns}""#);
                assert!(dom.contains(&attr), "{attr} not in the page");
            }
        }
    }
    for r in report["recommendations"].as_array().unwrap() {
        let title = r["title"].as_str().unwrap();
        let cut: String = title.chars().take(60).collect();
        assert!(
            dom.contains(&cut.replace('\'', "&#39;")),
            "recommendation {cut:?}"
        );
        let speedup = r["est_speedup"].as_f64().unwrap();
        assert!(
            dom.contains(&format!("data-speedup=\"{speedup}\"")),
            "speedup {speedup}"
        );
        if let Some(after) = r["what_if"]["wall_ns"].as_u64() {
            assert!(
                dom.contains(&format!("data-after=\"{after}\"")),
                "before/after bar of {}",
                r["cause"]
            );
        }
    }
    assert!(dom.contains("idle-gap flamegraph"), "the flamegraph frame");

    let shots = target_dir().join("test-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("report.png");
    let _ = std::fs::remove_file(&png);
    let (_, console) = chromium(
        &browser,
        &page,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1280,2400".into(),
        ],
    );
    assert!(console.is_empty(), "console output: {console:#?}");
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "screenshot of {} bytes",
        bytes.len()
    );
}

#[test]
fn run_writes_the_whole_bundle() {
    if !bpf_ready("run_writes_the_whole_bundle") {
        return;
    }
    simtrain_data(); // made before taking the lock
    let _lock = recording_lock();
    let dir = scratch("bundle");
    let out = dir.path().join("rec");
    let (r, _) = run_simtrain(dir.path(), &[], &["--bottleneck", "mixed", "--steps", "10"]);
    let files = file_names(&out);
    assert_eq!(
        files,
        [
            "flame-cpu.svg",
            "flame-idle.svg",
            "flame-offcpu.svg",
            "report.html",
            "report.json",
            "report.md",
            "report.txt",
            "session.gsz",
            "trace.json"
        ]
    );
    // The text summary comes last, then where everything is.
    let err = r.stderr();
    let tail = err.trim_end().lines().last().unwrap();
    assert!(tail.contains(out.to_str().unwrap()), "{tail}");

    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report, r.report(), "report.json is what `report` says");
    let trace: Value = serde_json::from_slice(&std::fs::read(out.join("trace.json")).unwrap())
        .expect("trace.json is valid JSON");
    let t = check_timeline(&trace);
    check_timeline_against(&t, &report);
    check_idle_flamegraph(out.to_str().unwrap(), &report);
    for f in ["flame-cpu.svg", "flame-idle.svg", "flame-offcpu.svg"] {
        let svg = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{f}");
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let busy = format!(
        r#"id="gpu0-busy" data-ns="{}""#,
        u64_of(&report["gpus"][0], "busy_ns")
    );
    assert!(html.contains(&busy), "report.html shows the busy time");

    // --no-exports: the session and the plain reports only.
    let lean = dir.path().join("lean");
    let r = run(
        &lean,
        &["--no-exports", "-q"],
        &[workload().to_str().unwrap(), "spin", "--ms", "50"],
    );
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let files = file_names(&lean);
    assert_eq!(
        files,
        ["report.json", "report.md", "report.txt", "session.gsz"]
    );
}

#[test]
fn export_refuses_bad_input_in_one_line() {
    let s = golden();
    let dir = scratch("export-errors");
    let target = dir.path().join("t.json");
    for (args, needle) in [
        (
            vec!["export", &s, "--timeline", "--window", "3..1"],
            "--window",
        ),
        (
            vec!["export", &s, "--timeline", "--window", "50..60"],
            "empty",
        ),
        (
            vec!["export", "/nonexistent/x.gsz", "--flamegraph", "cpu"],
            "/nonexistent/x.gsz",
        ),
    ] {
        let mut cmd = Command::new(gapscope());
        cmd.args(&args).arg("-o").arg(&target);
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
        assert!(!target.exists(), "no half-written output");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no temporary left"
        );
    }
}
