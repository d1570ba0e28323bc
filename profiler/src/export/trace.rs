//! The timeline as Chrome trace event JSON, for Perfetto UI and
//! chrome://tracing: a track per GPU stream, per host thread (states), its
//! syscalls, CUDA calls and profiler ops, one "idle (cause)" track per GPU,
//! flow arrows from each launch to its kernel. Written as it is generated,
//! never built whole in memory; every track is named when first used.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};

use gapscope_wire::record::{copy_kind, memory_kind};

use super::{Options, View};
use crate::timeline::gpu::{CallName, What, Work};
use crate::timeline::{syscall_name, State, Timeline};

// Trace viewers read pid and tid as 32-bit integers. Real Linux ids stay
// below 2^22; traces from other tools may carry larger ones (pthread ids),
// which get synthetic ids instead.
const REAL_ID_LIMIT: u32 = 1 << 22;
/// A thread's extra tracks: its tid + KIND_STRIDE × kind.
const KIND_STRIDE: u32 = 1 << 24;
/// Synthetic ids (tracks of large tids; GPUs as processes) start here.
const SYNTHETIC_BASE: u32 = 1 << 28;
/// GPUs as processes, and each one's idle track. Device numbers at or above
/// GPU_ID_LIMIT (only in damaged or foreign sessions) get synthetic pids.
const GPU_PID_BASE: u32 = 1 << 30;
const GPU_ID_LIMIT: u32 = 1 << 20;
const IDLE_TID: u32 = 1 << 30;
/// The recording itself, as a process: where it lost events.
const RECORDING_PID: u32 = GPU_PID_BASE - 1;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Track {
    /// A host thread's states (or, in traces, its ops).
    Thread(u32, u32),
    Syscalls(u32, u32),
    Cuda(u32, u32),
    Ops(u32, u32),
    /// NVTX ranges a thread pushed (often the training steps).
    Nvtx(u32, u32),
    Stream(u32, u32),
    Idle(u32),
    /// Windows in which the recording lost events.
    Lossy,
}

/// What a trace process stands for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum PidOf {
    Host(u32),
    Gpu(u32),
}

impl Track {
    fn kind(self) -> (u32, &'static str) {
        match self {
            Track::Thread(..) => (0, ""),
            Track::Syscalls(..) => (1, " syscalls"),
            Track::Cuda(..) => (2, " CUDA API"),
            Track::Ops(..) => (3, " ops"),
            Track::Nvtx(..) => (4, " NVTX"),
            Track::Stream(..) | Track::Idle(_) | Track::Lossy => (0, ""),
        }
    }
}

struct Writer<'a, W: Write> {
    out: W,
    first: bool,
    base: u64,
    window: (u64, u64),
    tracks: HashMap<Track, (u32, u32)>,
    /// Processes and GPUs as drawn (large numbers get synthetic ids).
    pids: HashMap<PidOf, u32>,
    named_pids: HashSet<u32>,
    next_synthetic: u32,
    tl: &'a Timeline,
    gpu_names: HashMap<u32, String>,
}

fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn esc(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

impl<W: Write> Writer<'_, W> {
    fn raw(&mut self, event: &str) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_all(event.as_bytes())
    }

    /// Clips to the window; None when nothing of it is inside.
    fn clip(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let (s, e) = (start.max(self.window.0), end.min(self.window.1));
        (e > s || (e == s && start >= self.window.0 && start <= self.window.1)).then_some((s, e))
    }

    fn name(&mut self, what: &str, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.raw(&format!(
            r#"{{"ph":"M","name":"{what}","pid":{pid},"tid":{tid},"args":{{"name":{}}}}}"#,
            esc(name)
        ))
    }

    /// The pid a host process or a GPU is drawn as: its own number (GPUs
    /// past every host pid) while that is below its limit, else a synthetic
    /// one, the same for all of its tracks.
    fn drawn_pid(&mut self, of: PidOf) -> u32 {
        if let Some(&pid) = self.pids.get(&of) {
            return pid;
        }
        let pid = match of {
            PidOf::Host(pid) if pid < REAL_ID_LIMIT => pid,
            PidOf::Gpu(dev) if dev < GPU_ID_LIMIT => GPU_PID_BASE + dev,
            _ => self.synthetic(),
        };
        self.pids.insert(of, pid);
        pid
    }

    fn synthetic(&mut self) -> u32 {
        self.next_synthetic += 1;
        SYNTHETIC_BASE + self.next_synthetic
    }

    /// The (pid, tid) a track is drawn on, naming it (and its process) the
    /// first time.
    fn track(&mut self, t: Track) -> io::Result<(u32, u32)> {
        if let Some(&ids) = self.tracks.get(&t) {
            return Ok(ids);
        }
        let (pid, tid, pname, tname) = match t {
            Track::Thread(pid, tid)
            | Track::Syscalls(pid, tid)
            | Track::Cuda(pid, tid)
            | Track::Ops(pid, tid)
            | Track::Nvtx(pid, tid) => {
                let (kind, suffix) = t.kind();
                let id = if tid < REAL_ID_LIMIT && pid < REAL_ID_LIMIT {
                    tid + KIND_STRIDE * kind
                } else {
                    self.synthetic()
                };
                let pname = match self.tl.process_name(pid) {
                    Some(c) => format!("{c} (pid {pid})"),
                    None => format!("pid {pid}"),
                };
                (
                    self.drawn_pid(PidOf::Host(pid)),
                    id,
                    pname,
                    format!("{} {tid}{suffix}", self.tl.thread_name(pid, tid)),
                )
            }
            Track::Stream(dev, stream) => {
                let id = if stream < REAL_ID_LIMIT {
                    stream
                } else {
                    self.synthetic()
                };
                (
                    self.drawn_pid(PidOf::Gpu(dev)),
                    id,
                    self.gpu_name(dev),
                    format!("stream {stream}"),
                )
            }
            Track::Idle(dev) => (
                self.drawn_pid(PidOf::Gpu(dev)),
                IDLE_TID,
                self.gpu_name(dev),
                "idle (cause)".to_string(),
            ),
            Track::Lossy => (
                RECORDING_PID,
                1,
                "gapscope (the recording)".to_string(),
                "events lost".to_string(),
            ),
        };
        if self.named_pids.insert(pid) {
            self.name("process_name", pid, 0, &pname)?;
        }
        self.name("thread_name", pid, tid, &tname)?;
        self.tracks.insert(t, (pid, tid));
        Ok((pid, tid))
    }

    fn gpu_name(&self, dev: u32) -> String {
        match self.gpu_names.get(&dev) {
            Some(n) => format!("GPU {dev}: {n}"),
            None => format!("GPU {dev}"),
        }
    }

    fn slice(
        &mut self,
        track: Track,
        cat: &str,
        name: &str,
        (start, end): (u64, u64),
        args: &str,
    ) -> io::Result<Option<(u32, u32)>> {
        let Some((s, e)) = self.clip(start, end) else {
            return Ok(None);
        };
        let (pid, tid) = self.track(track)?;
        self.raw(&format!(
            r#"{{"ph":"X","cat":"{cat}","name":{},"pid":{pid},"tid":{tid},"ts":{},"dur":{},"args":{{{args}}}}}"#,
            esc(name),
            us(s - self.base),
            us(e - s)
        ))?;
        Ok(Some((pid, tid)))
    }

    fn flow(&mut self, ph: &str, id: u64, (pid, tid): (u32, u32), ts: u64) -> io::Result<()> {
        let bp = if ph == "f" { r#","bp":"e""# } else { "" };
        self.raw(&format!(
            r#"{{"ph":"{ph}","cat":"launch","name":"launch","id":{id},"pid":{pid},"tid":{tid},"ts":{}{bp}}}"#,
            us(ts - self.base)
        ))
    }
}

fn gpu_work(w: &Work) -> (u32, u32, u64, u64, u32, String, String) {
    let correlation = w.correlation;
    let (name, args) = match &w.what {
        What::Kernel(k) => (
            k.name.to_string(),
            format!(
                r#""grid":{:?},"block":{:?},"correlation":{correlation}"#,
                k.grid, k.block
            ),
        ),
        What::Memcpy {
            bytes,
            copy_kind: ck,
            src_kind,
            dst_kind,
        } => (
            format!("Memcpy {}", copy_kind::name(*ck)),
            format!(
                r#""bytes":{bytes},"from":"{}","to":"{}","correlation":{correlation}"#,
                memory_kind::name(*src_kind),
                memory_kind::name(*dst_kind)
            ),
        ),
        What::Memset { bytes } => (
            "Memset".into(),
            format!(r#""bytes":{bytes},"correlation":{correlation}"#),
        ),
    };
    (w.device, w.stream, w.start, w.end, correlation, name, args)
}

/// Parses `START..END`, seconds from the start of the recording (either
/// side may be left out), into absolute ns inside `[start, end]`.
pub fn parse_window(spec: &str, start: u64, end: u64) -> Result<(u64, u64), String> {
    let bad = || {
        format!("--window {spec:?}: expected START..END in seconds from the start, e.g. 10..12.5")
    };
    let (a, b) = spec.split_once("..").ok_or_else(bad)?;
    let secs = |t: &str, default: u64| -> Result<u64, String> {
        let t = t.trim();
        if t.is_empty() {
            return Ok(default);
        }
        let v: f64 = t.parse().map_err(|_| bad())?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(bad());
        }
        Ok(start.saturating_add((v * 1e9).round() as u64).min(end))
    };
    let (a, b) = (secs(a, start)?, secs(b, end)?);
    if b <= a {
        return Err(format!(
            "--window {spec:?} is empty: the recording lasts {:.3}s",
            (end - start) as f64 / 1e9
        ));
    }
    Ok((a, b))
}

/// Writes the timeline of `opts.window` (absolute CLOCK_MONOTONIC ns; the
/// whole recording when None). The analysis must keep its intervals
/// (`AnalyzeOptions::pictures`).
pub fn write(v: &View, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let a = v.analysis;
    let (tl, d) = (&a.timeline, &a.diagnosis);
    let window = opts.window.unwrap_or((tl.start, tl.end));
    let mut w = Writer {
        out,
        first: true,
        base: tl.start,
        window,
        tracks: HashMap::new(),
        pids: HashMap::new(),
        named_pids: HashSet::new(),
        next_synthetic: 0,
        tl,
        gpu_names: d
            .gpus
            .iter()
            .map(|g| (g.gpu.device, g.gpu.name.clone()))
            .collect(),
    };
    write!(
        w.out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"generator\":{},\"window_s\":\"{:.6}..{:.6}\",\"recording_s\":{:.6}{}}},\n\"traceEvents\":[\n",
        esc(&format!("gapscope {}", a.facts.header.gapscope_version)),
        (window.0 - tl.start) as f64 / 1e9,
        (window.1 - tl.start) as f64 / 1e9,
        (tl.end - tl.start) as f64 / 1e9,
        if a.facts.simulated() {
            ",\"note\":\"SIMULATED GPU: gapscope's test and demo workload\""
        } else {
            ""
        }
    )?;

    // Host threads: states.
    for t in tl.all_threads() {
        let (pid, tid) = (&t.pid, &t.tid);
        for iv in t.intervals.iter().flatten() {
            let (name, args) = match &iv.state {
                State::OnCpu => ("running".to_string(), String::new()),
                State::Runnable => ("runnable".to_string(), String::new()),
                State::Stolen => ("stolen (CPU taken from it)".to_string(), String::new()),
                State::Off(o) => (
                    format!("blocked: {}", o.kind.name()),
                    match o.syscall {
                        Some(nr) => format!(r#""syscall":{}"#, esc(&syscall_name(nr))),
                        None => String::new(),
                    },
                ),
            };
            w.slice(
                Track::Thread(*pid, *tid),
                "state",
                &name,
                (iv.start, iv.end),
                &args,
            )?;
        }
    }
    // Profiler ops (traces): on the thread's own track when there are no
    // states to share it with.
    let traced = a.facts.events > 0;
    for ((pid, tid), ops) in &tl.gpu.host_ops {
        let track = if traced {
            Track::Ops(*pid, *tid)
        } else {
            Track::Thread(*pid, *tid)
        };
        for op in ops {
            w.slice(track, &op.cat, &op.name, (op.start, op.end), "")?;
        }
    }
    // What eBPF saw, in time order: syscalls and libcuda calls.
    enum Seen<'a> {
        Syscall(&'a crate::timeline::thread::LongSyscall),
        Uprobe(&'a crate::timeline::gpu::Call, u64),
    }
    let mut seen: Vec<(u64, (u32, u32), Seen)> = Vec::new();
    for t in tl.all_threads() {
        for sc in t.long_syscalls.iter().flatten() {
            seen.push((sc.ts, (t.pid, t.tid), Seen::Syscall(sc)));
        }
    }
    for (&t, calls) in &tl.gpu.calls {
        for c in calls {
            if let CallName::Uprobe(u) = &c.name {
                seen.push((c.start, t, Seen::Uprobe(c, u.arg)));
            }
        }
    }
    seen.sort_by_key(|s| s.0);
    for (ts, (pid, tid), what) in seen {
        match what {
            Seen::Syscall(sc) => w.slice(
                Track::Syscalls(pid, tid),
                "syscall",
                &syscall_name(sc.nr),
                (ts, ts + sc.dur),
                &format!(r#""ret":{}"#, sc.ret),
            )?,
            Seen::Uprobe(c, arg) => w.slice(
                Track::Cuda(pid, tid),
                "cuda_api",
                &c.name.name(),
                (c.start, c.end),
                &format!(r#""arg":{arg}"#),
            )?,
        };
    }
    // CUDA calls from the GPU source, remembered for the flows to the work
    // they launched.
    let mut launched: HashMap<(u32, u32), (u32, u32, u64)> = HashMap::new();
    for (&(pid, tid), calls) in &tl.gpu.calls {
        for c in calls {
            let (CallName::Api(..), Some(corr)) = (&c.name, c.correlation) else {
                continue;
            };
            let drawn = w.slice(
                Track::Cuda(pid, tid),
                "cuda_api",
                &c.name.name(),
                (c.start, c.end),
                &format!(r#""correlation":{corr}"#),
            )?;
            if let Some((hpid, htid)) = drawn {
                launched.insert((pid, corr), (hpid, htid, c.start));
            }
        }
    }
    for (&(pid, tid), ranges) in &tl.gpu.ranges {
        for r in ranges {
            let args = format!(r#""domain":{}"#, esc(&r.domain));
            w.slice(
                Track::Nvtx(pid, tid),
                "nvtx",
                &r.name,
                (r.start, r.end),
                &args,
            )?;
        }
    }
    let mut flow_id = 0u64;
    for work in tl.gpu.devices.iter().flat_map(|d| &d.work) {
        let (dev, stream, start, end, corr, name, args) = gpu_work(work);
        let pid = &work.pid;
        let Some(gpu_track) = w.slice(
            Track::Stream(dev, stream),
            "gpu",
            &name,
            (start, end),
            &args,
        )?
        else {
            continue;
        };
        if let Some(&(hpid, htid, hts)) = launched.get(&(*pid, corr)) {
            if w.clip(hts, hts).is_some() && w.clip(start, start).is_some() {
                flow_id += 1;
                w.flow("s", flow_id, (hpid, htid), hts)?;
                w.flow("f", flow_id, gpu_track, start)?;
            }
        }
    }
    // Idle, by cause: consecutive pieces of one cause merged.
    for g in &d.gpus {
        let mut pieces = g.attribution.pieces.clone();
        pieces.sort_by_key(|p| p.start);
        let mut run: Option<(u64, u64, &'static str)> = None;
        let track = Track::Idle(g.gpu.device);
        for p in &pieces {
            let c = p.cause.name();
            match &mut run {
                Some(r) if r.1 == p.start && r.2 == c => r.1 = p.end,
                _ => {
                    if let Some((s, e, c)) = run.take() {
                        w.slice(track, "idle", &format!("idle: {c}"), (s, e), "")?;
                    }
                    run = Some((p.start, p.end, c));
                }
            }
        }
        if let Some((s, e, c)) = run {
            w.slice(track, "idle", &format!("idle: {c}"), (s, e), "")?;
        }
    }
    // Where the recording is incomplete, so that nobody reads a gap there
    // as the job's own (idle inside is unattributed in the report).
    for &(s, e) in &d.lossy_windows {
        w.slice(Track::Lossy, "lossy", "events lost", (s, e), "")?;
    }
    w.out.write_all(b"\n]}\n")?;
    w.out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_recordings_get_the_middle_in_the_bundle() {
        use crate::export::bundle_timeline_window;
        assert_eq!(bundle_timeline_window(5, 5 + 60_000_000_000), None);
        let (s, e) = bundle_timeline_window(0, 3_600_000_000_000).unwrap();
        assert_eq!((s, e), (1_785_000_000_000, 1_815_000_000_000));
    }

    #[test]
    fn windows_parse_in_seconds_from_the_start() {
        let (s, e) = (1_000_000_000, 21_000_000_000);
        assert_eq!(
            parse_window("10..12.5", s, e),
            Ok((11_000_000_000, 13_500_000_000))
        );
        assert_eq!(parse_window("..1", s, e), Ok((s, 2_000_000_000)));
        assert_eq!(parse_window("19..", s, e), Ok((20_000_000_000, e)));
        assert_eq!(parse_window("5..100", s, e), Ok((6_000_000_000, e)));
        for bad in ["", "5", "a..b", "-1..2", "3..2", "25..30", "nan..1"] {
            assert!(parse_window(bad, s, e).is_err(), "{bad}");
        }
    }
}
