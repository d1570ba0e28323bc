//! Flamegraphs, folded or drawn with inferno: on-CPU samples, off-CPU time
//! by blocking stack, and — the one nobody else draws — what the machine was
//! doing while the GPU was idle, rooted at the cause, so the widest tower is
//! the thing to fix.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use super::{Format, Options, View};
use crate::analyze::diagnose::Diagnosis;
use crate::analyze::{Analysis, Names};
use crate::session::HostOp;
use crate::timeline::{State, Timeline};

/// The flamegraph `opts.format` names, drawn or folded.
pub fn write(v: &View, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let (kind, draw) = match opts.format {
        Format::Flamegraph(kind) => (kind, true),
        Format::Folded(kind) => (kind, false),
        other => return Err(io::Error::other(format!("{other:?} is not a flamegraph"))),
    };
    let lines = folded(v.analysis, kind);
    if draw {
        write_svg(v.analysis.facts.simulated(), kind, &lines, out)
    } else {
        write_folded(&lines, out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlameKind {
    Cpu,
    OffCpu,
    Idle,
}

impl FlameKind {
    pub fn file_stem(self) -> &'static str {
        match self {
            FlameKind::Cpu => "flame-cpu",
            FlameKind::OffCpu => "flame-offcpu",
            FlameKind::Idle => "flame-idle",
        }
    }

    fn title(self) -> &'static str {
        match self {
            FlameKind::Cpu => "On-CPU time (cpu-clock samples)",
            FlameKind::OffCpu => "Off-CPU time, by where threads blocked",
            FlameKind::Idle => "What the host was doing while the GPU sat idle, by cause",
        }
    }

    fn count_name(self) -> &'static str {
        match self {
            FlameKind::Cpu => "samples",
            _ => "ns",
        }
    }
}

/// Frame text safe in folded format (';' separates frames).
fn clean(f: &str) -> String {
    f.replace(';', ":").replace(['\n', '\r'], " ")
}

struct Frames<'a> {
    names: &'a Names,
}

impl Frames<'_> {
    /// Root-first frames of a user and a kernel stack (the kernel below).
    fn chain(&self, ustack: u64, kstack: u64) -> Vec<String> {
        let mut out = Vec::new();
        for (hash, suffix) in [(ustack, ""), (kstack, "_[k]")] {
            if hash == 0 {
                continue;
            }
            match self.names.frames(hash) {
                Some(frames) => out.extend(
                    frames
                        .iter()
                        .rev()
                        .map(|f| format!("{}{suffix}", clean(&f.function))),
                ),
                None => out.push("[unknown]".into()),
            }
        }
        out
    }
}

fn comm(tl: &Timeline, pid: u32, tid: u32) -> String {
    let name = tl
        .threads
        .get(&(pid, tid))
        .map(|t| t.comm.clone())
        .or_else(|| tl.processes.get(&pid).map(|p| p.comm.clone()))
        .unwrap_or_default();
    clean(&if name.is_empty() {
        format!("{pid}/{tid}")
    } else {
        name
    })
}

/// Folded stacks: (root;...;leaf, weight), sorted for stable output.
pub fn folded(a: &Analysis, kind: FlameKind) -> Vec<(String, u64)> {
    let (tl, d) = (&a.timeline, &a.diagnosis);
    let frames = Frames { names: &a.names };
    let mut acc: BTreeMap<String, u64> = BTreeMap::new();
    let mut add = |stack: Vec<String>, w: u64| {
        if w > 0 {
            *acc.entry(stack.join(";")).or_default() += w;
        }
    };
    match kind {
        FlameKind::Cpu => {
            for t in tl.all_threads() {
                for (&(u, k), &n) in &t.samples {
                    let mut s = vec![comm(tl, t.pid, t.tid)];
                    s.extend(frames.chain(u, k));
                    add(s, n);
                }
            }
        }
        FlameKind::OffCpu => {
            for t in tl.all_threads() {
                for (&(kind, u, k), &ns) in &t.off_stacks {
                    let mut s = vec![comm(tl, t.pid, t.tid)];
                    s.extend(frames.chain(u, k));
                    s.push(format!("[blocked: {}]", kind.name()));
                    add(s, ns);
                }
            }
        }
        FlameKind::Idle => {
            // Samples by thread, in time order, to name what a running thread ran.
            let mut samples: SamplesByThread = HashMap::new();
            for t in tl.all_threads() {
                if let Some(v) = t.sample_times.as_ref().filter(|v| !v.is_empty()) {
                    samples.entry((t.pid, t.tid)).or_default().extend(v);
                }
            }
            for v in samples.values_mut() {
                v.sort_unstable();
            }
            let ops = op_stacks(tl, d);
            for (gi, g) in d.gpus.iter().enumerate() {
                for (pi, p) in g.attribution.pieces.iter().enumerate() {
                    let mut s = vec![p.cause.name().to_string()];
                    if let Some((pid, tid)) = p.thread {
                        s.push(comm(tl, pid, tid));
                        match ops.get(&(gi, pi)) {
                            Some(op_frames) => s.extend(op_frames.iter().cloned()),
                            None => s.extend(stack_during(
                                tl,
                                &samples,
                                &frames,
                                (pid, tid),
                                p.start,
                                p.end,
                            )),
                        }
                    }
                    add(s, p.end - p.start);
                }
            }
        }
    }
    acc.into_iter().collect()
}

/// An op as a frame; steps merged ("ProfilerStep#12" → "ProfilerStep") so
/// the towers add up across steps.
fn op_frame(name: &str) -> String {
    match name.split_once('#') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => clean(base),
        _ => clean(name),
    }
}

/// An idle piece: (GPU index, piece index) in the diagnosis.
type PieceKey = (usize, usize);

/// For traces with host ops (PyTorch profiler) and no stacks: per idle
/// piece (GPU index, piece index), the ops its thread was inside at the
/// piece's middle, outermost first. One sweep per thread over ops sorted by
/// start, keeping the ops still open: O(n log n) on traces of millions.
fn op_stacks(tl: &Timeline, d: &Diagnosis) -> HashMap<PieceKey, Vec<String>> {
    let mut out = HashMap::new();
    if tl.gpu.host_ops.is_empty() {
        return out;
    }
    // Per thread: (the piece's middle, its key).
    let mut queries: HashMap<(u32, u32), Vec<(u64, PieceKey)>> = HashMap::new();
    for (gi, g) in d.gpus.iter().enumerate() {
        for (pi, p) in g.attribution.pieces.iter().enumerate() {
            if let Some(t) = p.thread {
                queries
                    .entry(t)
                    .or_default()
                    .push((p.start / 2 + p.end / 2, (gi, pi)));
            }
        }
    }
    for (t, mut qs) in queries {
        // Sorted by (start, longest first) in the timeline.
        let Some(thread_ops) = tl.gpu.host_ops.get(&t) else {
            continue;
        };
        qs.sort_unstable();
        let mut open: Vec<&HostOp> = Vec::new();
        let mut next = 0;
        for (mid, key) in qs {
            while next < thread_ops.len() && thread_ops[next].start <= mid {
                let op = &thread_ops[next];
                open.retain(|o| o.end > op.start);
                open.push(op);
                next += 1;
            }
            open.retain(|o| o.end > mid);
            if !open.is_empty() {
                out.insert(key, open.iter().map(|o| op_frame(&o.name)).collect());
            }
        }
    }
    out
}

/// Per thread, its cpu-clock samples as (time, user stack, kernel stack),
/// in time order.
type SamplesByThread = HashMap<(u32, u32), Vec<(u64, u64, u64)>>;

/// The stack of a thread during `[a, b)`: where it blocked, or its nearest
/// cpu-clock sample while it ran.
fn stack_during(
    tl: &Timeline,
    samples: &SamplesByThread,
    frames: &Frames,
    t: (u32, u32),
    a: u64,
    b: u64,
) -> Vec<String> {
    let state = tl.threads.get(&t).and_then(|th| {
        let iv = th.intervals.as_ref()?;
        let i = iv.partition_point(|x| x.end <= a);
        iv.get(i).filter(|x| x.start <= a).map(|x| &x.state)
    });
    match state {
        Some(State::Off(o)) => {
            let mut s = frames.chain(o.ustack, o.kstack);
            s.push(format!("[blocked: {}]", o.kind.name()));
            s
        }
        Some(State::Runnable) => vec!["[waiting for a CPU]".into()],
        Some(State::Stolen) => vec!["[CPU taken from it: steal, interrupts]".into()],
        _ => {
            // Nearest sample within 20 ms of the piece.
            let near = samples.get(&t).and_then(|v| {
                let mid = a / 2 + b / 2;
                let i = v.partition_point(|x| x.0 < mid);
                [i.checked_sub(1), Some(i)]
                    .into_iter()
                    .flatten()
                    .filter_map(|j| v.get(j))
                    .filter(|x| x.0 + 20_000_000 >= a && x.0 <= b + 20_000_000)
                    .min_by_key(|x| x.0.abs_diff(mid))
            });
            match near {
                Some(&(_, u, k)) => frames.chain(u, k),
                None => vec!["[running]".into()],
            }
        }
    }
}

fn write_folded(lines: &[(String, u64)], out: &mut dyn Write) -> io::Result<()> {
    for (stack, w) in lines {
        writeln!(out, "{stack} {w}")?;
    }
    Ok(())
}

/// An SVG flamegraph (interactive, self-contained).
/// `simulated`: the GPU was gapscope's own simulated device.
fn write_svg(
    simulated: bool,
    kind: FlameKind,
    lines: &[(String, u64)],
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = kind.title().to_string();
    if simulated {
        opts.subtitle = Some("SIMULATED GPU: gapscope's test and demo workload".into());
    }
    opts.count_name = kind.count_name().to_string();
    opts.deterministic = true;
    opts.hash = true;
    if lines.is_empty() {
        // inferno refuses empty input; an empty picture says more.
        return writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="600" height="60"><text x="10" y="35" font-family="sans-serif" font-size="14">{}: nothing recorded</text></svg>"#,
            kind.title()
        );
    }
    // inferno sums weights in a usize; keep the total well inside it (only
    // a damaged session gets near: real totals are nanoseconds of a run).
    let total: u128 = lines.iter().map(|(_, w)| *w as u128).sum();
    let scale = (total >> 52) as u64 + 1;
    let text: Vec<String> = lines
        .iter()
        .filter(|(_, w)| w / scale > 0)
        .map(|(s, w)| format!("{s} {}", w / scale))
        .collect();
    if text.is_empty() {
        return write_svg(simulated, kind, &[], out);
    }
    inferno::flamegraph::from_lines(&mut opts, text.iter().map(String::as_str), out)
        .map_err(|e| io::Error::other(e.to_string()))
}
