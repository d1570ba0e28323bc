//! The timeline as Chrome trace event JSON, for Perfetto UI and
//! chrome://tracing: a track per GPU stream, per host thread (states), its
//! syscalls and its CUDA calls, one "idle (cause)" track per GPU, flow arrows
//! from each launch to its kernel. Written as it is generated, never built
//! whole in memory.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use gapscope_cupti::record::{copy_kind, memory_kind};
use gapscope_cupti::GpuRecord;

use crate::analyze::api_name;
use crate::analyze::diagnose::Diagnosis;
use crate::session::{Event, Session};
use crate::timeline::{syscall_name, State, Timeline};

// Synthetic ids stay below 2^31: trace viewers read pid and tid as 32-bit
// integers, and Linux pids stay below 2^22.
/// GPUs as processes, far above real pids.
const GPU_PID_BASE: u64 = 1 << 30;
/// Per GPU, the idle track's tid.
const IDLE_TID: u64 = 1 << 30;
/// A host thread's extra tracks: tid + this × n.
const SYSCALL_TRACK: u64 = 1 << 24;
const CUDA_TRACK: u64 = 2 << 24;
/// Syscalls shorter than this are left out (they are in the report).
const MIN_SYSCALL_NS: u64 = 10_000;

pub struct Writer<W: Write> {
    out: W,
    first: bool,
    base: u64,
    window: (u64, u64),
}

fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn esc(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

impl<W: Write> Writer<W> {
    fn raw(&mut self, event: &str) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_all(event.as_bytes())
    }

    /// Clips to the window; false when nothing of it is inside.
    fn clip(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let (s, e) = (start.max(self.window.0), end.min(self.window.1));
        (e > s || (e == s && start >= self.window.0 && start <= self.window.1)).then_some((s, e))
    }

    fn name(&mut self, what: &str, pid: u64, tid: u64, name: &str) -> io::Result<()> {
        self.raw(&format!(
            r#"{{"ph":"M","name":"{what}","pid":{pid},"tid":{tid},"args":{{"name":{}}}}}"#,
            esc(name)
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn slice(
        &mut self,
        pid: u64,
        tid: u64,
        cat: &str,
        name: &str,
        start: u64,
        end: u64,
        args: &str,
    ) -> io::Result<()> {
        let Some((s, e)) = self.clip(start, end) else {
            return Ok(());
        };
        self.raw(&format!(
            r#"{{"ph":"X","cat":"{cat}","name":{},"pid":{pid},"tid":{tid},"ts":{},"dur":{},"args":{{{args}}}}}"#,
            esc(name),
            us(s - self.base),
            us(e - s)
        ))
    }

    fn flow(&mut self, ph: &str, id: u64, pid: u64, tid: u64, ts: u64) -> io::Result<()> {
        let bp = if ph == "f" { r#","bp":"e""# } else { "" };
        self.raw(&format!(
            r#"{{"ph":"{ph}","cat":"launch","name":"launch","id":{id},"pid":{pid},"tid":{tid},"ts":{}{bp}}}"#,
            us(ts - self.base)
        ))
    }
}

fn gpu_work(r: &GpuRecord) -> Option<(u32, u32, u64, u64, u32, String, String)> {
    Some(match r {
        GpuRecord::Kernel {
            device,
            stream,
            start,
            end,
            correlation,
            name,
            grid,
            block,
            ..
        } => (
            *device,
            *stream,
            *start,
            *end,
            *correlation,
            name.to_string(),
            format!(r#""grid":{grid:?},"block":{block:?},"correlation":{correlation}"#),
        ),
        GpuRecord::Memcpy {
            device,
            stream,
            start,
            end,
            correlation,
            bytes,
            copy_kind: ck,
            src_kind,
            dst_kind,
            ..
        } => (
            *device,
            *stream,
            *start,
            *end,
            *correlation,
            format!("Memcpy {}", copy_kind::name(*ck)),
            format!(
                r#""bytes":{bytes},"from":"{}","to":"{}","correlation":{correlation}"#,
                memory_kind::name(*src_kind),
                memory_kind::name(*dst_kind)
            ),
        ),
        GpuRecord::Memset {
            device,
            stream,
            start,
            end,
            correlation,
            bytes,
            ..
        } => (
            *device,
            *stream,
            *start,
            *end,
            *correlation,
            "Memset".into(),
            format!(r#""bytes":{bytes},"correlation":{correlation}"#),
        ),
        _ => return None,
    })
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

/// Writes the timeline of `[window]` (absolute CLOCK_MONOTONIC ns; the whole
/// recording when None). `tl` must carry intervals.
pub fn write_timeline(
    session: &Session,
    tl: &Timeline,
    d: &Diagnosis,
    window: Option<(u64, u64)>,
    out: impl Write,
) -> io::Result<()> {
    let window = window.unwrap_or((tl.start, tl.end));
    let mut w = Writer {
        out,
        first: true,
        base: tl.start,
        window,
    };
    w.out
        .write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;

    // Names first: processes, threads and their extra tracks.
    for (pid, p) in &tl.processes {
        w.name(
            "process_name",
            *pid as u64,
            0,
            &format!("{} (pid {pid})", p.comm),
        )?;
    }
    for ((pid, tid), t) in &tl.threads {
        let (pid, tid) = (*pid as u64, *tid as u64);
        w.name("thread_name", pid, tid, &format!("{} {tid}", t.comm))?;
        w.name(
            "thread_name",
            pid,
            tid + SYSCALL_TRACK,
            &format!("{} {tid} syscalls", t.comm),
        )?;
        w.name(
            "thread_name",
            pid,
            tid + CUDA_TRACK,
            &format!("{} {tid} CUDA API", t.comm),
        )?;
    }
    let mut streams: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (_, r) in &session.gpu {
        if let Some((dev, stream, ..)) = gpu_work(r) {
            let v = streams.entry(dev).or_default();
            if !v.contains(&stream) {
                v.push(stream);
            }
        }
    }
    for g in &d.gpus {
        streams.entry(g.gpu.device).or_default();
    }
    let names: HashMap<u32, String> = d
        .gpus
        .iter()
        .map(|g| (g.gpu.device, g.gpu.name.clone()))
        .collect();
    for (dev, ss) in &streams {
        let pid = GPU_PID_BASE + *dev as u64;
        let name = names
            .get(dev)
            .cloned()
            .unwrap_or_else(|| format!("GPU {dev}"));
        w.name("process_name", pid, 0, &format!("GPU {dev}: {name}"))?;
        w.name("thread_name", pid, IDLE_TID, "idle (cause)")?;
        for s in ss {
            w.name("thread_name", pid, *s as u64, &format!("stream {s}"))?;
        }
    }

    // Host threads: states.
    for ((pid, tid), t) in &tl.threads {
        for iv in t.intervals.iter().flatten() {
            let (name, args) = match &iv.state {
                State::OnCpu => ("running".to_string(), String::new()),
                State::Runnable => ("runnable".to_string(), String::new()),
                State::Off(o) => (
                    format!("blocked: {}", o.kind.name()),
                    match o.syscall {
                        Some(nr) => format!(r#""syscall":{}"#, esc(&syscall_name(nr))),
                        None => String::new(),
                    },
                ),
            };
            w.slice(
                *pid as u64,
                *tid as u64,
                "state",
                &name,
                iv.start,
                iv.end,
                &args,
            )?;
        }
    }
    // Syscalls and libcuda calls seen by eBPF.
    for e in &session.events {
        match e {
            Event::Syscall {
                ts,
                pid,
                tid,
                dur,
                nr,
                ret,
                ..
            } if *dur >= MIN_SYSCALL_NS => {
                w.slice(
                    *pid as u64,
                    *tid as u64 + SYSCALL_TRACK,
                    "syscall",
                    &syscall_name(*nr),
                    *ts,
                    ts + dur,
                    &format!(r#""ret":{ret}"#),
                )?;
            }
            Event::CudaCall {
                ts,
                pid,
                tid,
                dur,
                function,
                arg,
            } => {
                w.slice(
                    *pid as u64,
                    *tid as u64 + CUDA_TRACK,
                    "cuda_api",
                    function,
                    *ts,
                    ts + dur,
                    &format!(r#""arg":{arg}"#),
                )?;
            }
            _ => {}
        }
    }
    // CUDA API calls from the GPU source, with flows to the work they launched.
    let mut launched: HashMap<(u32, u32), (u64, u64, u64)> = HashMap::new();
    for (pid, r) in &session.gpu {
        if let GpuRecord::Api {
            domain,
            cbid,
            start,
            end,
            tid,
            correlation,
            ..
        } = r
        {
            let track = *tid as u64 + CUDA_TRACK;
            w.slice(
                *pid as u64,
                track,
                "cuda_api",
                &api_name(*domain, *cbid),
                *start,
                *end,
                &format!(r#""correlation":{correlation}"#),
            )?;
            launched.insert((*pid, *correlation), (*pid as u64, track, *start));
        }
    }
    let mut flow_id = 0u64;
    for (pid, r) in &session.gpu {
        let Some((dev, stream, start, end, corr, name, args)) = gpu_work(r) else {
            continue;
        };
        let gpid = GPU_PID_BASE + dev as u64;
        w.slice(gpid, stream as u64, "gpu", &name, start, end, &args)?;
        if let Some(&(hpid, htid, hts)) = launched.get(&(*pid, corr)) {
            if w.clip(hts, hts).is_some() && w.clip(start, start).is_some() {
                flow_id += 1;
                w.flow("s", flow_id, hpid, htid, hts)?;
                w.flow("f", flow_id, gpid, stream as u64, start)?;
            }
        }
    }
    // Idle, by cause: consecutive pieces of one cause merged.
    for g in &d.gpus {
        let gpid = GPU_PID_BASE + g.gpu.device as u64;
        let mut pieces = g.attribution.pieces.clone();
        pieces.sort_by_key(|p| p.start);
        let mut run: Option<(u64, u64, &'static str)> = None;
        for p in &pieces {
            let c = p.cause.name();
            match &mut run {
                Some(r) if r.1 == p.start && r.2 == c => r.1 = p.end,
                _ => {
                    if let Some((s, e, c)) = run.take() {
                        w.slice(gpid, IDLE_TID, "idle", &format!("idle: {c}"), s, e, "")?;
                    }
                    run = Some((p.start, p.end, c));
                }
            }
        }
        if let Some((s, e, c)) = run {
            w.slice(gpid, IDLE_TID, "idle", &format!("idle: {c}"), s, e, "")?;
        }
    }
    w.out.write_all(b"\n]}\n")?;
    w.out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

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
