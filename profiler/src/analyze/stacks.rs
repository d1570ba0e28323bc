//! The stacks of a run as keys: on-CPU samples by stack, off-CPU time by
//! where threads blocked, and idle GPU time by cause, thread and what the
//! thread ran (its stack where it blocked or was sampled, or the PyTorch ops
//! it was inside). Flamegraphs draw them; a comparison matches them.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use super::diagnose::Diagnosis;
use super::{Analysis, Names};
use crate::session::HostOp;
use crate::timeline::{State, Timeline};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackKind {
    /// cpu-clock samples, rooted at the thread.
    Cpu,
    /// Time blocked, rooted at the thread, the leaf what it blocked in.
    OffCpu,
    /// Idle GPU time, rooted at its cause, then the thread it waited on.
    Idle,
}

/// A stack, root first. No frame holds a `;` (it becomes `:`), so a stack
/// and its folded text (frames joined by `;`) name each other; stacks are
/// ordered as their folded text is, so that every listing of them is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stack(pub Vec<String>);

impl Stack {
    /// root;…;leaf
    pub fn folded(&self) -> String {
        self.0.join(";")
    }

    fn bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.0
            .iter()
            .enumerate()
            .flat_map(|(i, f)| (i > 0).then_some(b';').into_iter().chain(f.bytes()))
    }
}

impl Ord for Stack {
    fn cmp(&self, other: &Stack) -> Ordering {
        self.bytes()
            .cmp(other.bytes())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for Stack {
    fn partial_cmp(&self, other: &Stack) -> Option<Ordering> {
        Some(self.cmp(other))
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
            let names = self.names.frame_names(hash, |f| clean(&f.function));
            out.extend(names.into_iter().rev().map(|n| format!("{n}{suffix}")));
        }
        out
    }
}

fn comm(tl: &Timeline, pid: u32, tid: u32) -> String {
    clean(&tl.thread_name(pid, tid))
}

/// Every stack of `kind` in the analysis with its weight (samples, or ns),
/// those of no weight left out.
pub fn stacks(a: &Analysis, kind: StackKind) -> BTreeMap<Stack, u64> {
    let (tl, d) = (&a.timeline, &a.diagnosis);
    let frames = Frames { names: &a.names };
    let mut acc: BTreeMap<Stack, u64> = BTreeMap::new();
    let mut add = |stack: Vec<String>, w: u64| {
        if w > 0 {
            *acc.entry(Stack(stack)).or_default() += w;
        }
    };
    match kind {
        StackKind::Cpu => {
            for t in tl.all_threads() {
                for (&(u, k), &n) in &t.samples {
                    let mut s = vec![comm(tl, t.pid, t.tid)];
                    s.extend(frames.chain(u, k));
                    add(s, n);
                }
            }
        }
        StackKind::OffCpu => {
            for t in tl.all_threads() {
                for (&(kind, u, k), &ns) in &t.off_stacks {
                    let mut s = vec![comm(tl, t.pid, t.tid)];
                    s.extend(frames.chain(u, k));
                    s.push(format!("[blocked: {}]", kind.name()));
                    add(s, ns);
                }
            }
        }
        StackKind::Idle => {
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
    acc
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_order_as_their_folded_text() {
        let s = |f: &[&str]| Stack(f.iter().map(|x| x.to_string()).collect());
        let mut v = vec![
            s(&["a", "x"]),
            s(&["a!"]),
            s(&["ab"]),
            s(&["a"]),
            s(&["a", "b", "c"]),
            s(&["b"]),
        ];
        let mut by_text = v.clone();
        by_text.sort_by_key(|x| x.folded());
        v.sort();
        assert_eq!(v, by_text);
    }
}
