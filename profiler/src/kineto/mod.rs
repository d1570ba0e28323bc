//! PyTorch profiler (Kineto) traces, read into the same session model a
//! recording produces: GPU work by device and stream, runtime/driver calls
//! linked by correlation id, host ops as slices of their threads.

mod parse;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gapscope_wire::record::{copy_kind, memory_kind};
use gapscope_wire::{ApiDomain, ClockMethod, GpuRecord, Hello};

pub use parse::{looks_like_trace, us_text_to_ns, KinetoError, RawEvent};

use crate::session::SourceKind;
use crate::session::{Footer, GpuSource, HostOp, Mode, Session, SessionHeader, StopReason};

/// "Memcpy HtoD (Pageable -> Device)" → (copy kind, src kind, dst kind).
fn memcpy_kinds(name: &str) -> (u8, u8, u8) {
    let kind = [
        ("HtoD", copy_kind::HTOD),
        ("DtoH", copy_kind::DTOH),
        ("DtoD", copy_kind::DTOD),
        ("HtoH", copy_kind::HTOH),
        ("PtoP", copy_kind::PTOP),
    ]
    .iter()
    .find(|(k, _)| name.contains(k))
    .map(|(_, v)| *v)
    .unwrap_or(0);
    let mem = |s: &str| match s.trim() {
        "Pageable" => memory_kind::PAGEABLE,
        "Pinned" => memory_kind::PINNED,
        "Device" => memory_kind::DEVICE,
        "Managed" => memory_kind::MANAGED,
        _ => 0,
    };
    let (src, dst) = name
        .split_once('(')
        .and_then(|(_, r)| r.trim_end_matches(')').split_once("->"))
        .map(|(a, b)| (mem(a), mem(b)))
        .unwrap_or((0, 0));
    (kind, src, dst)
}

/// The CUPTI callback id of a runtime or driver function named in a trace.
fn cbid_of(domain: ApiDomain, name: &str) -> u32 {
    gapscope_wire::cbid::cbid_of(domain, name).unwrap_or(u32::MAX)
}

/// The categories torch has written, 1.8 to today, by what they hold:
/// PyTorch 1.8–1.10 wrote `Kernel`, `Memcpy`, `Memset`, `Runtime`,
/// `Operator`; later ones `kernel`, `gpu_memcpy`, `cuda_runtime`, `cpu_op`…
/// (the TensorBoard plugin reads them case-blind, as here). None: a
/// category gapscope does not read.
fn category(cat: &str) -> Option<&'static str> {
    Some(match cat.to_ascii_lowercase().as_str() {
        "kernel" => "kernel",
        "gpu_memcpy" | "memcpy" => "gpu_memcpy",
        "gpu_memset" | "memset" => "gpu_memset",
        "cuda_runtime" | "runtime" => "cuda_runtime",
        "cuda_driver" | "driver" => "cuda_driver",
        "cpu_op" | "operator" => "cpu_op",
        "python_function" | "python" => "python_function",
        "user_annotation" => "user_annotation",
        _ => return None,
    })
}

/// Categories that carry nothing gapscope reads, counted apart from those it
/// does not know: GPU-side copies of annotations, flow arrows, memory
/// events, the trace's own marks.
fn passed_over(cat: &str) -> bool {
    matches!(
        cat.to_ascii_lowercase().as_str(),
        "gpu_user_annotation"
            | "cuda_sync"
            | "ac2g"
            | "async"
            | "trace"
            | "cpu_instant_event"
            | "memory"
            | "overhead"
    )
}

/// Distinct unknown categories counted (a trace could name millions).
const UNKNOWN_CATEGORIES: usize = 32;

/// Reads a trace into a session.
pub fn import(path: &Path) -> Result<Session, KinetoError> {
    let mut s = Session::default();
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut intern = move |n: String| -> Arc<str> {
        match names.get(&n) {
            Some(a) => a.clone(),
            None => {
                let a: Arc<str> = n.as_str().into();
                names.insert(n, a.clone());
                a
            }
        }
    };
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    let mut cpu_pids: HashMap<u32, usize> = HashMap::new();
    let mut gpu_pids: Vec<u32> = Vec::new();
    let mut unknown: BTreeMap<String, u64> = BTreeMap::new();
    let mut gpu_work = 0u64;
    // What tells a trace that starts mid-run: the first step's number, and
    // GPU work whose launch is not in the trace (correlation, length).
    let mut first_step: Option<u64> = None;
    let mut launches: HashSet<u32> = HashSet::new();
    let mut gpu_corr: Vec<(u32, u64)> = Vec::new();
    let meta = parse::read_events(path, |e| {
        if e.ph != "X" {
            return;
        }
        let Some(cat) = category(&e.cat) else {
            if !passed_over(&e.cat)
                && (unknown.len() < UNKNOWN_CATEGORIES || unknown.contains_key(&e.cat))
            {
                *unknown.entry(e.cat.clone()).or_default() += 1;
            }
            return;
        };
        let (Some(ts), dur) = (e.ts_ns(), e.dur_ns().unwrap_or(0)) else {
            return;
        };
        let end = ts.saturating_add(dur);
        lo = lo.min(ts);
        hi = hi.max(end);
        let pid = e.pid_num().unwrap_or(0) as u32;
        let tid = e.tid_num().unwrap_or(0) as u32;
        let args = e.args.unwrap_or_default();
        let correlation = args.correlation.unwrap_or(0) as u32;
        let device = args.device.unwrap_or(pid);
        let stream = args.stream.unwrap_or(tid);
        let context = args.context.unwrap_or(0);
        let record = match cat {
            "kernel" => {
                let dim = |v: &Option<Vec<i64>>| {
                    let v = v.as_deref().unwrap_or(&[]);
                    [0, 1, 2].map(|i| v.get(i).copied().unwrap_or(1) as i32)
                };
                Some(GpuRecord::Kernel {
                    start: ts,
                    end,
                    device,
                    context,
                    stream,
                    correlation,
                    grid: dim(&args.grid),
                    block: dim(&args.block),
                    name: intern(e.name),
                })
            }
            "gpu_memcpy" => {
                let (copy_kind, src_kind, dst_kind) = memcpy_kinds(&e.name);
                Some(GpuRecord::Memcpy {
                    start: ts,
                    end,
                    device,
                    context,
                    stream,
                    correlation,
                    bytes: args.bytes.unwrap_or(0),
                    copy_kind,
                    src_kind,
                    dst_kind,
                })
            }
            "gpu_memset" => Some(GpuRecord::Memset {
                start: ts,
                end,
                device,
                context,
                stream,
                correlation,
                bytes: args.bytes.unwrap_or(0),
                value: 0,
                memory_kind: 0,
            }),
            "cuda_runtime" | "cuda_driver" => {
                let domain = if cat == "cuda_runtime" {
                    ApiDomain::Runtime
                } else {
                    ApiDomain::Driver
                };
                *cpu_pids.entry(pid).or_default() += 1;
                launches.insert(correlation);
                Some(GpuRecord::Api {
                    domain,
                    cbid: args.cbid.unwrap_or_else(|| cbid_of(domain, &e.name)),
                    start: ts,
                    end,
                    pid,
                    tid,
                    correlation,
                })
            }
            "cpu_op" | "python_function" | "user_annotation" => {
                *cpu_pids.entry(pid).or_default() += 1;
                if let Some(n) = e
                    .name
                    .strip_prefix("ProfilerStep#")
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    first_step = Some(first_step.map_or(n, |f| f.min(n)));
                }
                let (name, cat) = (intern(e.name), intern(cat.to_string()));
                s.host_ops.push(HostOp {
                    pid,
                    tid,
                    start: ts,
                    end,
                    name,
                    cat,
                });
                None
            }
            _ => None,
        };
        if let Some(r) = record {
            if !matches!(r, GpuRecord::Api { .. }) {
                gpu_work += 1;
                gpu_corr.push((correlation, dur));
            }
            if matches!(r, GpuRecord::Api { .. }) {
                s.gpu.push((pid, r));
            } else {
                if !gpu_pids.contains(&pid) {
                    gpu_pids.push(pid);
                }
                // GPU rows carry the device as pid; key the work by the host
                // process later, when it is known.
                s.gpu.push((u32::MAX, r));
            }
        }
    })?;
    if lo == u64::MAX {
        return Err(KinetoError::Format {
            path: path.display().to_string(),
            reason: "no complete events (ph \"X\") with timestamps".into(),
        });
    }
    let unknown_note = (!unknown.is_empty()).then(|| {
        let mut by: Vec<(&String, &u64)> = unknown.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let list: Vec<String> = by
            .iter()
            .take(8)
            .map(|(c, n)| format!("{c:?} ×{n}"))
            .collect();
        format!(
            "{} event(s) {LEFT_OUT}: {}",
            unknown.values().sum::<u64>(),
            list.join(", ")
        )
    });
    // A trace holding GPU activity in a form not read would otherwise be
    // an empty report: the worst answer to a valid input.
    if gpu_work == 0 {
        return Err(KinetoError::Format {
            path: path.display().to_string(),
            reason: format!(
                "no GPU activity (kernels, copies or memsets) in it{}",
                unknown_note
                    .as_ref()
                    .map(|n| format!("; {n}"))
                    .unwrap_or_default()
            ),
        });
    }
    let mid_run = mid_run(first_step, &launches, &gpu_corr);
    // The host process: the one with the most host-side events.
    let host = cpu_pids
        .iter()
        .max_by_key(|(p, n)| (**n, **p))
        .map(|(p, _)| *p)
        .unwrap_or(0);
    for (pid, _) in s.gpu.iter_mut() {
        if *pid == u32::MAX {
            *pid = host;
        }
    }
    let mut names: BTreeMap<u32, String> = BTreeMap::new();
    for (id, name) in meta.devices {
        names.insert(id as u32, name);
    }
    for (id, name) in names {
        s.gpu.push((host, GpuRecord::Device { id, name }));
    }
    // In place (unstable sorts allocate nothing): traces are large.
    s.gpu.sort_unstable_by_key(|(_, r)| r.start());
    s.host_ops
        .sort_unstable_by_key(|o| (o.start, std::cmp::Reverse(o.end)));
    s.gpu.shrink_to_fit();
    s.host_ops.shrink_to_fit();

    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (rank, world) = (meta.rank, meta.world_size);
    s.header = Some(SessionHeader {
        gapscope_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: if mid_run.is_some() {
            Mode::KinetoWindow
        } else {
            Mode::Kineto
        },
        target_pid: host,
        command: vec![format!("kineto:{file}")],
        hostname: String::new(),
        kernel: String::new(),
        nr_cpus: 0,
        start_ns: lo,
        start_unix_ns: lo,
        sample_hz: 0,
    });
    s.footer = Some(Footer {
        end_ns: hi,
        reason: StopReason::TargetExited,
        exit_code: None,
        events: 0,
    });
    s.gpu_sources.push(GpuSource {
        pid: host,
        kind: SourceKind::Kineto,
        hello: Hello {
            version: gapscope_wire::protocol::VERSION,
            pid: host,
            driver_version: 0,
            cupti_version: 0,
            clock: ClockMethod::Native,
            source: format!("PyTorch profiler trace {file}"),
        },
    });
    let as_u32 = |v: Option<u64>| v.and_then(|v| u32::try_from(v).ok());
    if let (Some(rank), Some(world)) = (as_u32(rank), as_u32(world)) {
        s.rank = Some(crate::session::Rank { rank, world });
        s.notes.push(format!("rank {rank} of {world}"));
    }
    s.notes.extend(unknown_note);
    s.notes.extend(mid_run);
    s.notes.push(
        "imported from a PyTorch profiler trace: no off-CPU data, so input waits cannot be split into storage, \
         preprocessing or network, and CPU contention and blocked threads cannot be seen (record with \
         `gapscope run` for those)"
            .into(),
    );
    let dropped = crate::session::sanitize(&mut s);
    crate::session::note_dropped(&mut s, dropped);
    Ok(s)
}

/// What the note on events of unknown categories says, after their count.
const LEFT_OUT: &str = "of categories gapscope does not read were left out";

/// The notes of an imported trace that are said on stderr as well: events
/// it holds that gapscope did not read.
pub fn warnings(s: &Session) -> impl Iterator<Item = &str> {
    s.notes
        .iter()
        .map(String::as_str)
        .filter(|n| n.contains(LEFT_OUT))
}

/// Whether a trace starts mid-run, said as a note: a profiler schedule's
/// wait and warm-up steps came before its first step (`ProfilerStep#N`, N
/// from 1), or GPU work in it was launched before it began (no runtime
/// call in the trace shares its correlation id). The idle before its first
/// GPU work is then not the job's start-up.
fn mid_run(first_step: Option<u64>, launches: &HashSet<u32>, gpu: &[(u32, u64)]) -> Option<String> {
    // A trace with no runtime calls at all says nothing of launches.
    let (n, ns) = if launches.is_empty() {
        (0, 0)
    } else {
        gpu.iter()
            .filter(|(c, _)| !launches.contains(c))
            .fold((0u64, 0u64), |(n, ns), (_, d)| (n + 1, ns + d))
    };
    if first_step.unwrap_or(0) == 0 && n == 0 {
        return None;
    }
    let mut why = Vec::new();
    if let Some(f) = first_step.filter(|&f| f > 0) {
        why.push(format!("its first step is ProfilerStep#{f}"));
    }
    if n > 0 {
        why.push(format!(
            "{n} GPU operation(s) in it, {:.1} ms, were launched before it began",
            ns as f64 / 1e6
        ));
    }
    Some(format!(
        "the trace starts mid-run ({}): the idle before its first GPU work is attributed by what \
         the trainer was doing, not called start-up",
        why.join("; ")
    ))
}

/// Trace files named on the command line, directories expanded.
pub fn trace_files(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.path())
                        .filter(|f| {
                            let n = f.to_string_lossy();
                            n.ends_with(".json") || n.ends_with(".json.gz")
                        })
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy_names() {
        assert_eq!(
            memcpy_kinds("Memcpy HtoD (Pageable -> Device)"),
            (copy_kind::HTOD, memory_kind::PAGEABLE, memory_kind::DEVICE)
        );
        assert_eq!(
            memcpy_kinds("Memcpy DtoH (Device -> Pinned)"),
            (copy_kind::DTOH, memory_kind::DEVICE, memory_kind::PINNED)
        );
        assert_eq!(memcpy_kinds("weird"), (0, 0, 0));
    }

    /// Mid-run: a first step past 0, or GPU work no runtime call in the
    /// trace launched; not where every launch is there (or none is: then
    /// nothing is known of launches).
    #[test]
    fn a_trace_starts_mid_run_by_its_first_step_or_work_launched_before() {
        let launches: HashSet<u32> = [1, 2].into();
        let work = [(1, 1_000_000), (2, 500_000)];
        assert_eq!(mid_run(None, &launches, &work), None);
        assert_eq!(mid_run(Some(0), &launches, &work), None);
        assert_eq!(mid_run(Some(0), &HashSet::new(), &[(7, 1)]), None);
        let n = mid_run(Some(4), &launches, &work).unwrap();
        assert!(n.contains("its first step is ProfilerStep#4)"), "{n}");
        let queued = [(1, 1_000_000), (9, 2_500_000), (8, 500_000)];
        let n = mid_run(Some(0), &launches, &queued).unwrap();
        assert!(
            n.contains("(2 GPU operation(s) in it, 3.0 ms, were launched before it began)"),
            "{n}"
        );
    }
}
