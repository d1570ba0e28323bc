//! The CUPTI shim through its whole life, against a stand-in libcupti with
//! CUDA 13.0 CUPTI's semantics (gs-fakecupti: one client per process,
//! process-global callbacks and clock, flush flags, incomplete records,
//! dropped records) driven by `gs-cuda-host`, a stand-in CUDA driver and
//! training loop that prints its own ground truth. No GPU needed; the
//! `gapscope run` tests need BPF like every recording test.
//!
//! The ground truth is the stand-in's own: every kernel it simulated, with
//! its start and end on CLOCK_MONOTONIC, the steps, and what its
//! torch.profiler-like client (Kineto's behaviour at trace start and stop)
//! received.

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gapscope_tests::*;
use gapscope_wire::protocol::{ClockMethod, Frame};
use gapscope_wire::{ApiDomain, GpuRecord};
use serde_json::Value;

fn stand_in() -> PathBuf {
    bin("libcupti_standin.so")
}

fn host_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("gs-cuda-host"));
    cmd.args(args)
        .env("GS_FAKE_CUPTI", stand_in())
        .env_remove("GAPSCOPE_SOCKET")
        .env_remove("GAPSCOPE_CUPTI")
        .stdout(Stdio::piped());
    cmd
}

/// What one run of the host showed: its ground truth and, when a listener
/// was there, every frame the shim sent.
struct Life {
    truth: Value,
    frames: Vec<Frame>,
}

impl Life {
    fn kernels(&self) -> Vec<(u32, u64, u64)> {
        self.records()
            .filter_map(|r| match r {
                GpuRecord::Kernel {
                    correlation,
                    start,
                    end,
                    ..
                } => Some((*correlation, *start, *end)),
                _ => None,
            })
            .collect()
    }

    fn records(&self) -> impl Iterator<Item = &GpuRecord> {
        self.frames.iter().flat_map(|f| match f {
            Frame::Records(r) => r.as_slice(),
            _ => &[],
        })
    }

    fn truth_kernels(&self) -> Vec<(u32, u64, u64, bool)> {
        self.truth["kernels"]
            .as_array()
            .expect("kernels")
            .iter()
            .map(|k| {
                (
                    k["correlation"].as_u64().unwrap() as u32,
                    u64_of(k, "start_ns"),
                    u64_of(k, "end_ns"),
                    k["pending"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    }

    fn skipped(&self) -> (u64, u64) {
        self.frames
            .iter()
            .rev()
            .find_map(|f| match f {
                Frame::Skipped {
                    incomplete,
                    unknown,
                } => Some((*incomplete, *unknown)),
                _ => None,
            })
            .expect("the shim reports what it skipped")
    }

    fn blind(&self) -> Vec<(u64, String)> {
        self.frames
            .iter()
            .filter_map(|f| match f {
                Frame::Blind { start, reason } => Some((*start, reason.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Runs `cmd` with the shim injected and connected to a listener of ours,
/// the way `gapscope run` starts a job; returns every frame the shim sent
/// and how the process ended.
fn listened(mut cmd: Command) -> (Vec<Frame>, std::process::Output) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "gapscope-test-life.{}.{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let child = cmd
        .env("CUDA_INJECTION64_PATH", shim())
        .env("GAPSCOPE_SOCKET", format!("@{name}"))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("the shim never connected: {e}"),
        }
    };
    // The ground truth can outgrow a pipe: read it while the frames come.
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    let out = waiter.join().unwrap();
    let frames = frames_of(&bytes);
    (frames, out)
}

fn recorded(args: &[&str]) -> Life {
    let (frames, out) = listened(host_command(args));
    Life {
        truth: last_json_line(&out.stdout),
        frames,
    }
}

fn last_json_line(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .last()
        .expect("the host prints its ground truth");
    serde_json::from_str(line).expect("ground truth is JSON")
}

/// Within this many ns of the stand-in's own times (the shim's clock is
/// read in a different call than the stand-in's).
const CLOCK_TOLERANCE_NS: u64 = 20_000;

#[track_caller]
fn assert_same_time(what: &str, got: u64, truth: u64) {
    assert!(
        got.abs_diff(truth) <= CLOCK_TOLERANCE_NS,
        "{what}: recorded {got} vs truth {truth} ({} ns apart)",
        got.abs_diff(truth)
    );
}

#[test]
fn every_kernel_arrives_on_the_cpu_clock_and_bookkeeping_calls_are_left_out() {
    let life = recorded(&[
        "--steps",
        "8",
        "--kernels-per-step",
        "3",
        "--kernel-us",
        "1000",
        "--gap-us",
        "2000",
        "--sync-every-step",
        "--bookkeeping",
        "4",
        "--queries",
        "3",
    ]);
    let Some(Frame::Hello(hello)) = life.frames.first() else {
        panic!("first frame is not Hello: {:?}", life.frames.first())
    };
    assert_eq!(hello.cupti_version, 130001);
    assert_eq!(hello.clock, ClockMethod::TimestampCallback);
    assert!(
        life.frames
            .iter()
            .any(|f| matches!(f, Frame::Info(s) if s.contains("CUPTI 13.0.1"))),
        "{:?}",
        life.frames
    );
    // Every kernel, each at the time the stand-in ran it.
    let truth = life.truth_kernels();
    let got = life.kernels();
    assert_eq!(got.len(), truth.len(), "recorded {got:?}");
    for (corr, start, end, _) in &truth {
        let (_, s, e) = got
            .iter()
            .find(|k| k.0 == *corr)
            .unwrap_or_else(|| panic!("kernel {corr} missing"));
        assert_same_time("kernel start", *s, *start);
        assert_same_time("kernel end", *e, *end);
    }
    // The per-op bookkeeping calls (cudaGetDevice, cuCtxGetCurrent) are not
    // recorded; the event queries are, as calls, but not as waits.
    let api: Vec<(ApiDomain, u32)> = life
        .records()
        .filter_map(|r| match r {
            GpuRecord::Api { domain, cbid, .. } => Some((*domain, *cbid)),
            _ => None,
        })
        .collect();
    assert!(!api.contains(&(ApiDomain::Runtime, 17)), "cudaGetDevice");
    assert!(!api.contains(&(ApiDomain::Driver, 304)), "cuCtxGetCurrent");
    let queries = api
        .iter()
        .filter(|a| **a == (ApiDomain::Runtime, 138))
        .count();
    assert_eq!(queries, 8 * 3, "cudaEventQuery calls");
    let launches = api
        .iter()
        .filter(|a| **a == (ApiDomain::Runtime, 211))
        .count();
    assert_eq!(launches, truth.len(), "cudaLaunchKernel calls");
    let syncs: Vec<u8> = life
        .records()
        .filter_map(|r| match r {
            GpuRecord::Sync { sync_type, .. } => Some(*sync_type),
            _ => None,
        })
        .collect();
    assert_eq!(
        syncs,
        vec![gapscope_wire::record::sync_type::CONTEXT_SYNCHRONIZE; 9],
        "one wait per step and the final one, no query"
    );
    assert_eq!(life.skipped(), (0, 0));
    assert!(life.blind().is_empty(), "{:?}", life.blind());
    assert!(matches!(life.frames.last(), Some(Frame::Goodbye)));
}

#[test]
fn without_a_timestamp_callback_the_measured_offset_keeps_kernels_on_the_cpu_clock() {
    // A CUPTI that refuses the callback (before 11.6, WSL) times records on
    // its own clock (CLOCK_REALTIME): the hello must say the offset is in
    // use, and the kernels still land where they ran.
    let mut cmd = host_command(&["--steps", "4", "--sync-every-step"]);
    cmd.env("GS_FAKE_CUPTI_NO_TIMESTAMP_CALLBACK", "1");
    let (frames, out) = listened(cmd);
    let life = Life {
        truth: last_json_line(&out.stdout),
        frames,
    };
    let Some(Frame::Hello(hello)) = life.frames.first() else {
        panic!("{:?}", life.frames.first())
    };
    assert_eq!(hello.clock, ClockMethod::MeasuredOffset);
    let got = life.kernels();
    let truth = life.truth_kernels();
    assert_eq!(got.len(), truth.len());
    for (corr, start, end, _) in &truth {
        let (_, s, e) = got.iter().find(|k| k.0 == *corr).unwrap();
        assert_same_time("kernel start", *s, *start);
        assert_same_time("kernel end", *e, *end);
    }
}

#[test]
fn a_dormant_shim_leaves_cupti_to_torch_profiler_untouched() {
    let args = [
        "--steps",
        "10",
        "--kineto-from",
        "2",
        "--kineto-to",
        "8",
        "--sync-every-step",
        "--kernel-us",
        "500",
        "--gap-us",
        "1000",
    ];
    // With the shim injected but no profiler: dormant.
    let out = host_command(&args)
        .env("CUDA_INJECTION64_PATH", shim())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let dormant = last_json_line(&out.stdout);
    // Without any shim at all: what torch.profiler gets on its own.
    let out = host_command(&args)
        .env_remove("CUDA_INJECTION64_PATH")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let alone = last_json_line(&out.stdout);
    let stats = |v: &Value| {
        (
            u64_of(&v["kineto_stats"], "kernels"),
            u64_of(&v["kineto_stats"], "unknown_buffers"),
            u64_of(&v["kineto_stats"], "subscribe_rc"),
        )
    };
    // Six steps of three kernels, every one in its trace, no buffer of ours
    // handed to it, and the subscriber slot free for it.
    assert_eq!(stats(&alone), (18, 0, 0));
    assert_eq!(stats(&dormant), stats(&alone));
    // Not one CUPTI call from the dormant shim before torch.profiler came:
    // no callbacks, no clock, no thread-id type, not even a version query.
    assert_eq!(dormant["cupti_calls_before_kineto"], 0, "{dormant}");
}

#[test]
fn torch_profiler_taking_cupti_mid_run_is_a_blind_span_and_its_trace_stays_whole() {
    let life = recorded(&[
        "--steps",
        "14",
        "--kineto-from",
        "6",
        "--kineto-to",
        "11",
        "--sync-every-step",
        "--kernels-per-step",
        "200",
        "--kernel-us",
        "20",
        "--gap-us",
        "60000",
    ]);
    let kineto = &life.truth["kineto"];
    let (k_start, k_end) = (u64_of(kineto, "start_ns"), u64_of(kineto, "end_ns"));
    // torch.profiler's trace is whole but for what CUPTI put in the buffer
    // it already had from the shim (at most one buffer, 512 records: half
    // of them launch calls), which it is handed and cannot read.
    let stats = &life.truth["kineto_stats"];
    let window = 5 * 200;
    let got_by_kineto = u64_of(stats, "kernels");
    assert!(
        got_by_kineto <= window && got_by_kineto + 256 >= window,
        "torch.profiler got {got_by_kineto} of the {window} kernels of its window"
    );
    assert!(u64_of(stats, "unknown_buffers") <= 1, "{stats}");
    assert_eq!(u64_of(stats, "subscribe_rc"), 0);
    assert!(u64_of(&life.truth, "cupti_calls_before_kineto") > 0);
    // gapscope said when it stopped seeing, and why.
    let blind = life.blind();
    assert_eq!(blind.len(), 1, "{:?}", life.frames);
    let (from, why) = &blind[0];
    assert!(why.contains("another CUPTI client"), "{why}");
    assert!(
        *from <= k_start,
        "blind from {from}, torch.profiler from {k_start}"
    );
    // Nothing it recorded is claimed after that, and every kernel it did
    // not record lies inside the blind span (open to the end: the other
    // client keeps CUPTI).
    let got = life.kernels();
    assert!(
        !got.is_empty(),
        "the steps before the takeover were recorded"
    );
    for (corr, start, end, _) in life.truth_kernels() {
        match got.iter().find(|k| k.0 == corr) {
            Some((_, s, e)) => {
                assert_same_time("kernel start", *s, start);
                assert!(*e <= *from + CLOCK_TOLERANCE_NS, "kernel {corr} ends after the blind start");
            }
            None => assert!(
                start + CLOCK_TOLERANCE_NS >= *from,
                "kernel {corr} ({start}..{end}) is neither recorded nor in the blind span from {from}"
            ),
        }
    }
    assert!(k_end > k_start);
    // It stood back: no records after the takeover, no Sighted after its
    // Blind (the other client never gave CUPTI back; the one Sighted is
    // from when it began recording), and it still said goodbye.
    let blind_at = life
        .frames
        .iter()
        .position(|f| matches!(f, Frame::Blind { .. }))
        .unwrap();
    assert!(!life.frames[blind_at..]
        .iter()
        .any(|f| matches!(f, Frame::Sighted { .. })));
    assert!(life.frames[..blind_at]
        .iter()
        .any(|f| matches!(f, Frame::Sighted { .. })));
    assert!(matches!(life.frames.last(), Some(Frame::Goodbye)));
}

#[test]
fn work_queued_at_exit_is_waited_for() {
    // Three 200 ms kernels still queued when the process leaves main.
    let life = recorded(&["--steps", "2", "--kernel-us", "500", "--pending", "3"]);
    let truth = life.truth_kernels();
    assert_eq!(truth.iter().filter(|k| k.3).count(), 3);
    let got = life.kernels();
    for (corr, start, end, _) in &truth {
        let (_, s, e) = got
            .iter()
            .find(|k| k.0 == *corr)
            .unwrap_or_else(|| panic!("kernel {corr} missing: {got:?}"));
        assert_same_time("kernel start", *s, *start);
        assert_same_time("kernel end", *e, *end);
    }
    assert_eq!(life.skipped(), (0, 0));
    assert!(!life.frames.iter().any(|f| matches!(f, Frame::Lost { .. })));
}

#[test]
fn work_still_running_after_the_drain_is_counted_and_its_span_lost() {
    // Twelve 200 ms kernels queued: more than the exit drain waits for.
    let life = recorded(&["--steps", "1", "--kernel-us", "500", "--pending", "12"]);
    let truth = life.truth_kernels();
    let got = life.kernels();
    let missing: Vec<_> = truth
        .iter()
        .filter(|k| !got.iter().any(|g| g.0 == k.0))
        .collect();
    assert!(!missing.is_empty(), "the forced flush cut nothing short");
    let (incomplete, _) = life.skipped();
    assert_eq!(
        incomplete,
        missing.len() as u64,
        "counted, not silently dropped"
    );
    // Those that did arrive are whole; the span of those that did not is
    // reported lost.
    for (corr, s, e) in &got {
        let t = truth.iter().find(|k| k.0 == *corr).unwrap();
        assert_same_time("kernel start", *s, t.1);
        assert_same_time("kernel end", *e, t.2);
    }
    let lost: Vec<(u64, u64, u64)> = life
        .frames
        .iter()
        .filter_map(|f| match f {
            Frame::Lost {
                start,
                end,
                records,
            } => Some((*start, *end, *records)),
            _ => None,
        })
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    let first_missing = missing.iter().map(|k| k.1).min().unwrap();
    assert_eq!(lost[0].2, incomplete);
    assert!(
        lost[0].0 <= first_missing + CLOCK_TOLERANCE_NS && lost[0].1 > first_missing,
        "lost span {lost:?} does not cover the first unfinished kernel at {first_missing}"
    );
}

#[test]
fn a_killed_process_says_no_goodbye() {
    let life = recorded(&["--steps", "3", "--await-delivery", "--exit", "sigkill-self"]);
    assert!(matches!(life.frames.first(), Some(Frame::Hello(_))));
    assert!(!life.frames.iter().any(|f| matches!(f, Frame::Goodbye)));
}

#[test]
fn an_old_cupti_with_a_wrong_path_asked_for_still_uses_the_mapped_one() {
    // Two CUPTIs in one process is never right: the mapped one wins over
    // GAPSCOPE_CUPTI, and the shim says so.
    let mut cmd = host_command(&["--steps", "2", "--sync-every-step"]);
    cmd.env("GAPSCOPE_CUPTI", "/elsewhere/libcupti.so.13")
        .env("GS_FAKE_CUPTI_VERSION", "26");
    let (frames, out) = listened(cmd);
    assert!(out.status.success());
    let Some(Frame::Hello(hello)) = frames.first() else {
        panic!("{frames:?}")
    };
    assert_eq!(hello.cupti_version, 26);
    assert!(
        frames.iter().any(|f| matches!(f, Frame::Info(s)
            if s.contains("already has") && s.contains("libcupti_standin.so") && s.contains("/elsewhere/libcupti.so.13"))),
        "{frames:?}"
    );
    let kernels = frames
        .iter()
        .flat_map(|f| match f {
            Frame::Records(r) => r.as_slice(),
            _ => &[],
        })
        .filter(|r| matches!(r, GpuRecord::Kernel { .. }))
        .count();
    assert_eq!(kernels, 2 * 3);
}

/// Launches so many kernels behind one another that CUPTI fills buffer
/// after buffer before any comes back, as a burst does while the GPU lags.
fn burst(version: &str) -> (Life, std::process::ExitStatus) {
    let mut cmd = host_command(&[
        "--steps",
        "1",
        "--kernels-per-step",
        "1",
        "--pending",
        "70000",
    ]);
    cmd.env("GS_FAKE_CUPTI_VERSION", version)
        .stderr(Stdio::piped());
    let (frames, out) = listened(cmd);
    let truth = if out.status.success() {
        last_json_line(&out.stdout)
    } else {
        Value::Null
    };
    (Life { truth, frames }, out.status)
}

#[test]
fn a_cupti_that_cannot_refuse_a_buffer_is_never_refused_one() {
    // CUPTI before API 27 crashes on a refused buffer (the stand-in
    // aborts): the shim gives it buffers past its usual cap, then stops
    // recording and says so.
    let (life, status) = burst("26");
    assert!(status.success(), "the job crashed: {status:?}");
    assert!(
        !life
            .frames
            .iter()
            .any(|f| matches!(f, Frame::Dropped { cupti, .. } if *cupti > 0)),
        "a buffer was refused"
    );
    // A CUPTI that refuses safely is refused past the cap: it drops and
    // counts, and the profiler is told which span the drops cover.
    let (life, status) = burst("130001");
    assert!(status.success(), "{status:?}");
    let dropped = life
        .frames
        .iter()
        .rev()
        .find_map(|f| match f {
            Frame::Dropped { cupti, .. } => Some(*cupti),
            _ => None,
        })
        .unwrap();
    assert!(dropped > 0, "the burst never reached the cap");
    assert!(life.frames.iter().any(|f| matches!(f, Frame::Lost { .. })));
}

/// Once CUDA works the shim asks the driver for its devices: each one's
/// name and UUID (as NVML writes it) reach the profiler — a stand-in
/// libcuda (libfakecuda.so) mapped as the process's libcuda.so.1.
#[test]
fn the_driver_names_each_device_and_its_uuid() {
    // Asked at a periodic flush (every 250 ms) once records came back (a
    // buffer comes back once all its work is done): 1.4 s, the GPU queue
    // drained every step and idle five sixths of the time, so that some
    // flush finds a buffer done and a later one asks.
    names_each_device(&["--steps", "40", "--gap-us", "30000", "--sync-every-step"]);
    // A process over before any periodic flush: asked at its last drain.
    names_each_device(&["--steps", "3"]);
}

fn names_each_device(args: &[&str]) {
    let dir = scratch("driver");
    std::fs::copy(bin("libfakecuda.so"), dir.path().join("libcuda.so.1")).unwrap();
    let mut cmd = host_command(&[args, &["--driver", "libcuda.so.1"]].concat());
    cmd.env("LD_LIBRARY_PATH", dir.path());
    let (frames, out) = listened(cmd);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let life = Life {
        truth: last_json_line(&out.stdout),
        frames,
    };
    let devices: Vec<(u32, &str)> = life
        .records()
        .filter_map(|r| match r {
            GpuRecord::Device { id, name } => Some((*id, name.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(devices, [(0, "Stand-in GPU 0"), (1, "Stand-in GPU 1")]);
    let uuids: Vec<(u32, &str)> = life
        .records()
        .filter_map(|r| match r {
            GpuRecord::DeviceUuid { id, uuid } => Some((*id, uuid.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        uuids,
        [
            (0, "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"),
            (1, "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f")
        ]
    );
    assert_eq!(life.kernels().len(), life.truth_kernels().len());
}

// ------------------------------------------------ through `gapscope run`

fn gapscope_run_host(test: &str, host_args: &[&str]) -> Option<(Run, Value)> {
    if !bpf_ready(test) {
        return None;
    }
    let _lock = recording_lock();
    let dir = scratch(test);
    let mut cmd = vec![bin("gs-cuda-host").to_string_lossy().into_owned()];
    cmd.extend(host_args.iter().map(|s| s.to_string()));
    std::env::set_var("GS_FAKE_CUPTI", stand_in());
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let r = run(dir.path(), &["-q", "--no-exports"], &cmd);
    let truth = last_json_line(&r.output.stdout);
    let report = r.report();
    let text = std::fs::read_to_string(dir.path().join("report.txt")).unwrap_or_default();
    // Keep the directory alive until the reports are read.
    drop(dir);
    Some((
        r,
        serde_json::json!({"truth": truth, "report": report, "text": text}),
    ))
}

/// The report's one blind span, which must give `reason`.
#[track_caller]
fn the_blind_span<'a>(report: &'a Value, reason: &str) -> &'a Value {
    let blind = report["drops"]["gpu_blind"].as_array().expect("gpu_blind");
    assert_eq!(blind.len(), 1, "{blind:?}");
    let why = blind[0]["reason"].as_str().unwrap();
    assert!(why.contains(reason), "{why}");
    &blind[0]
}

#[test]
fn gapscope_counts_torch_profilers_span_as_unseen_never_idle() {
    let Some((r, both)) = gapscope_run_host(
        "gapscope_counts_torch_profilers_span_as_unseen_never_idle",
        &[
            "--steps",
            "12",
            "--kineto-from",
            "4",
            "--kineto-to",
            "8",
            "--sync-every-step",
            "--kernel-us",
            "2000",
            "--gap-us",
            "60000",
        ],
    ) else {
        return;
    };
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    let (truth, report) = (&both["truth"], &both["report"]);
    let blind = the_blind_span(report, "another CUPTI client");
    let from = u64_of(blind, "start_ns");
    let k_start = u64_of(&truth["kineto"], "start_ns");
    assert!(from <= k_start);
    let g = &report["gpus"][0];
    // busy + idle + unseen = allocated; the causes share only the idle.
    assert_gpu_partitions(g);
    // Everything from the takeover to the end of the stream was unseen:
    // nothing it recorded ran after the blind start, so none of it is busy,
    // and none is idle of a cause. (The stream's end is noticed after the
    // recording window closed, or before: the window ends when gapscope
    // sees the process gone.)
    let end = u64_of(blind, "end_ns").min(u64_of(&report["window_ns"], "end"));
    assert_eq!(u64_of(g, "unseen_ns"), end - from, "{blind}");
    // The text report says it, per GPU and with the reason.
    let text = both["text"].as_str().unwrap();
    assert!(text.contains("not seen"), "{text}");
    assert!(
        text.contains("GPU not seen: pid") && text.contains("another CUPTI client"),
        "{text}"
    );
    // The kernels counted are exactly those that ended before it.
    let before = truth["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| u64_of(k, "end_ns") <= from + CLOCK_TOLERANCE_NS)
        .count() as u64;
    assert_eq!(u64_of(&g["kernels"], "count"), before);
}

#[test]
fn gapscope_loses_a_killed_processs_tail_instead_of_calling_it_idle() {
    let Some((r, both)) = gapscope_run_host(
        "gapscope_loses_a_killed_processs_tail_instead_of_calling_it_idle",
        &[
            "--steps",
            "20",
            "--kernel-us",
            "2000",
            "--gap-us",
            "30000",
            "--await-delivery",
            "--pending",
            "2",
            "--exit",
            "sigkill-self",
        ],
    ) else {
        return;
    };
    assert_eq!(r.code(), Some(128 + 9), "{}", r.stderr());
    let (truth, report) = (&both["truth"], &both["report"]);
    let blind = the_blind_span(report, "without a goodbye");
    // The queued kernels ran after the last record that arrived: inside
    // the lost tail, which reaches the end of the stream.
    let from = u64_of(blind, "start_ns");
    for k in truth["kernels"].as_array().unwrap() {
        if k["pending"].as_bool() == Some(true) {
            assert!(u64_of(k, "start_ns") + CLOCK_TOLERANCE_NS >= from, "{k}");
        }
    }
    // All of it is unseen — none of it idle of some cause, teardown
    // included — and it holds no busy time: no record came from it.
    let g = &report["gpus"][0];
    assert_gpu_partitions(g);
    // (The stream's end is noticed after the recording window closed.)
    let end = u64_of(blind, "end_ns").min(u64_of(&report["window_ns"], "end"));
    assert_eq!(u64_of(g, "unseen_ns"), end - from, "{blind}");
}
