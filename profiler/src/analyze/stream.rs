//! The attribution run while a session file's events are still being
//! replayed: each idle gap is attributed as soon as every thread it asks
//! about has moved past it, the clock checks of each launch as soon as its
//! thread has, and the thread states behind both are let go. The GPU's work
//! comes the same way, as the events reach it (`timeline::spooled`): each
//! GPU's busy spans are built as it passes, and the work and CUDA calls
//! behind the attribution are let go too. What is held then follows the
//! gaps still open, not the recording's length. Same rules, same answers
//! as attributing the whole timeline at the end (`diagnose`).

use std::cell::Cell;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::attribute::{self, Attribution, Cause, Inputs, Tid};
use super::checks::{on_cpu_at, ClockCheck};
use super::code::CodeOf;
use super::diagnose::{Diagnosis, Feeder, GpuDiagnosis};
use super::gpu::GpuTimeline;
use super::steps;
use crate::intervals::Spans;
use crate::timeline::gpu::Work;
use crate::timeline::Timeline;

/// How long behind the oldest moment still to attribute a thread's CUDA
/// calls are kept (the rules look a little before a gap: a synchronize
/// that ended as it opened).
const CALLS_KEPT_NS: u64 = 1_000_000_000;
/// Calls of a thread kept before that, whatever their age: the rules ask
/// about a thread's last few calls before a moment.
const CALLS_KEPT: usize = 8;

/// A GPU's busy spans as its work comes, in start order: what the rules
/// walk ([`attribute::Edges::bound`] of the clipped union), the last span
/// still growing.
struct Walk {
    window: (u64, u64),
    edges: attribute::Edges,
    spans: Vec<(u64, u64)>,
    /// The span being grown, unclipped.
    open: Option<(u64, u64)>,
    /// `spans`' last element is the open span, clipped.
    open_in: bool,
    /// Whether `spans` begins with the window's start as an empty span.
    prefix: Option<bool>,
}

impl Walk {
    fn new(window: (u64, u64), edges: attribute::Edges) -> Walk {
        Walk {
            window,
            edges,
            spans: Vec::new(),
            open: None,
            open_in: false,
            prefix: None,
        }
    }

    fn add(&mut self, (s, e): (u64, u64)) {
        if e <= s {
            return;
        }
        match self.open.as_mut() {
            Some(o) if s <= o.1 => o.1 = o.1.max(e),
            _ => {
                self.open = Some((s, e));
                self.open_in = false;
            }
        }
        let (lo, hi) = self.window;
        let (os, oe) = self.open.expect("just set");
        let (cs, ce) = (os.max(lo), oe.min(hi));
        if ce <= cs {
            return;
        }
        if self.prefix.is_none() {
            let prefix = !self.edges.startup && cs > lo;
            if prefix {
                self.spans.push((lo, lo));
            }
            self.prefix = Some(prefix);
        }
        match self.open_in {
            true => *self.spans.last_mut().expect("the open span") = (cs, ce),
            false => {
                self.spans.push((cs, ce));
                self.open_in = true;
            }
        }
    }

    /// The walk's spans once every piece of work has come: with the
    /// window's edges where they are gaps.
    fn finish(&mut self) {
        let (lo, hi) = self.window;
        if self.prefix.is_none() {
            let prefix = !self.edges.startup;
            if prefix {
                self.spans.push((lo, lo));
            }
            self.prefix = Some(prefix);
        }
        let busy = &self.spans[usize::from(self.prefix == Some(true))..];
        if !self.edges.teardown && busy.last().is_none_or(|b| b.1 < hi) {
            self.spans.push((hi, hi));
        }
    }

    /// The busy spans, once the walk is done (one copy of them: a long
    /// recording has millions).
    fn into_busy(self) -> Spans {
        let mut spans = self.spans;
        if self.prefix == Some(true) {
            spans.remove(0);
        }
        if spans.last().is_some_and(|&(s, e)| s == e) {
            spans.pop();
        }
        spans.shrink_to_fit();
        spans
    }
}

/// Disjoint spans built as spans come in start order: each, once no
/// later one can touch it, goes to `done`.
#[derive(Default)]
struct Union {
    open: Option<(u64, u64)>,
}

impl Union {
    fn add(&mut self, (s, e): (u64, u64), mut done: impl FnMut((u64, u64))) {
        if e <= s {
            return;
        }
        match self.open.as_mut() {
            Some(o) if s <= o.1 => o.1 = o.1.max(e),
            _ => {
                if let Some(o) = self.open.replace((s, e)) {
                    done(o);
                }
            }
        }
    }

    fn finish(&mut self) -> Option<(u64, u64)> {
        self.open.take()
    }
}

/// A GPU's busy time by kind as its kernels come: its compute kernels'
/// time (clipped to the window), and its communication kernels' spans with
/// no compute beside them (unclipped), without holding the compute spans
/// (a long run has millions): each is held only while a communication
/// span it may overlap is still to be cut.
struct Kinds {
    window: (u64, u64),
    compute: Union,
    communication: Union,
    /// Compute time inside the window, of the spans done.
    compute_ns: u64,
    /// Spans done and not yet cut against each other.
    compute_done: std::collections::VecDeque<(u64, u64)>,
    communication_done: std::collections::VecDeque<(u64, u64)>,
    /// The latest kernel start: kernels still to come start there or later.
    frontier: u64,
    alone: Spans,
}

impl Kinds {
    fn new(window: (u64, u64)) -> Kinds {
        Kinds {
            window,
            compute: Union::default(),
            communication: Union::default(),
            compute_ns: 0,
            compute_done: Default::default(),
            communication_done: Default::default(),
            frontier: 0,
            alone: Vec::new(),
        }
    }

    fn compute(&mut self, span: (u64, u64)) {
        self.frontier = self.frontier.max(span.0);
        let (lo, hi) = self.window;
        let (done, ns) = (&mut self.compute_done, &mut self.compute_ns);
        self.compute.add(span, |(s, e)| {
            *ns += e.min(hi).saturating_sub(s.max(lo));
            done.push_back((s, e));
        });
        self.cut(false);
    }

    fn communication(&mut self, span: (u64, u64)) {
        self.frontier = self.frontier.max(span.0);
        let done = &mut self.communication_done;
        self.communication.add(span, |c| done.push_back(c));
        self.cut(false);
    }

    /// Cuts the communication spans done whose every overlapping compute
    /// span is done (all are, once `last`), and lets go of the compute
    /// spans no communication span still to cut can overlap.
    fn cut(&mut self, last: bool) {
        while let Some(&(a, b)) = self.communication_done.front() {
            if !last && self.compute.open.is_some_and(|o| o.0 < b) {
                break;
            }
            self.communication_done.pop_front();
            let mut at = a;
            for &(s, e) in self.compute_done.iter().take_while(|c| c.0 < b) {
                if e <= at {
                    continue;
                }
                if s > at {
                    self.alone.push((at, s));
                }
                at = at.max(e);
            }
            if at < b {
                self.alone.push((at, b));
            }
        }
        let next = [
            self.communication_done.front().map(|c| c.0),
            self.communication.open.map(|c| c.0),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.frontier);
        while self.compute_done.front().is_some_and(|c| c.1 <= next) {
            self.compute_done.pop_front();
        }
    }

    /// (compute ns inside the window, communication spans with no compute
    /// beside them), once every kernel has come.
    fn finish(mut self) -> (u64, Spans) {
        let (lo, hi) = self.window;
        if let Some((s, e)) = self.compute.finish() {
            self.compute_ns += e.min(hi).saturating_sub(s.max(lo));
            self.compute_done.push_back((s, e));
        }
        self.communication_done.extend(self.communication.finish());
        self.cut(true);
        (self.compute_ns, self.alone)
    }
}

/// One GPU's gaps, attributed in order.
struct Device {
    /// Its place among the timeline's devices: the rules read its work
    /// there (each item's start and who launched it).
    index: usize,
    walk: Walk,
    kinds: Kinds,
    fallback: Option<Tid>,
    /// The next gap to attribute: between walk.spans[next] and [next + 1].
    next: usize,
    out: Attribution,
    /// The main feeder's account (see `diagnose::Feeder`), up to
    /// `account_to`.
    feeder: Option<Feeder>,
    account_to: u64,
}

/// What the rules read for one GPU (its busy spans and work starts). Blind
/// and lossy windows are left to the attribution, which applies them as
/// pieces come.
fn inputs<'a>(
    busy: &'a [(u64, u64)],
    work: &'a [Work],
    tl: &'a Timeline,
    ops: &'a HashMap<Tid, Vec<(u64, u64, Cause)>>,
    code: &'a CodeOf,
    window: (u64, u64),
    unsettled: Option<&'a Cell<bool>>,
) -> Inputs<'a> {
    Inputs {
        window,
        busy,
        work,
        threads: &tl.threads,
        processes: &tl.processes,
        io_tally: &tl.io_tally,
        api: &tl.gpu.calls,
        ops,
        code: Some(code),
        blind: &[],
        lossy: &[],
        keep_pieces: true,
        steps: None,
        unsettled,
    }
}

/// A kernel launch to check against its thread's state, earliest first.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Launch {
    at: u64,
    thread: Tid,
    device: u32,
}

impl PartialOrd for Launch {
    fn partial_cmp(&self, o: &Launch) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Launch {
    // Reversed: BinaryHeap pops its greatest.
    fn cmp(&self, o: &Launch) -> std::cmp::Ordering {
        (o.at, o.thread, o.device).cmp(&(self.at, self.thread, self.device))
    }
}

pub struct Attributor {
    window: (u64, u64),
    devices: Vec<Device>,
    /// Launches not yet checked.
    launches: BinaryHeap<Launch>,
    /// Work still to come was launched no earlier than this.
    launched_from: u64,
    /// How long after its launch a piece of work started, at most.
    queue_delay: u64,
    /// Launches by threads not seen yet when they were due: whether the
    /// thread turns up by the end decides them.
    unseen_launchers: Vec<Launch>,
    checks: BTreeMap<u32, ClockCheck>,
    /// What imported traces' profiler ops say (see `diagnose::op_causes`).
    ops: HashMap<Tid, Vec<(u64, u64, Cause)>>,
    /// Where events were lost (see [`Attribution`]).
    lossy: Vec<(u64, u64)>,
    code: CodeOf,
    steps: Option<steps::Summary>,
    /// The timeline holds only the work and calls still needed: let go of
    /// the rest as the attribution moves on.
    windowed: bool,
}

impl Attributor {
    /// `window`: the recording's, known before its events (from its end
    /// record), and whether its edges are the job's; `blind`, `lossy`: see
    /// [`Attribution`]; `steps`: the run's steps, timed. The GPU's work
    /// comes through [`Attributor::work`]: all of it now when the timeline
    /// holds it whole (`windowed` false), else as the events reach it;
    /// `queue_delay`: how long after its launch work started, at most.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tl: &Timeline,
        window: (u64, u64),
        edges: attribute::Edges,
        blind: &[(u64, u64)],
        lossy: Vec<(u64, u64)>,
        code: CodeOf,
        steps: Option<steps::Summary>,
        windowed: bool,
        queue_delay: u64,
    ) -> Attributor {
        let devices = tl
            .gpu
            .devices
            .iter()
            .enumerate()
            .map(|(index, d)| {
                let fallback = tl
                    .gpu
                    .totals
                    .devices
                    .get(&d.id)
                    .and_then(|t| t.main_feeder());
                Device {
                    index,
                    walk: Walk::new(window, edges),
                    kinds: Kinds::new(window),
                    fallback,
                    next: 0,
                    out: Attribution::new(blind.to_vec(), lossy.clone(), false)
                        .within_steps(steps.as_ref().map(steps::Summary::span)),
                    feeder: fallback.map(|t| Feeder::new(t, window.0)),
                    account_to: window.0,
                }
            })
            .collect();
        let mut a = Attributor {
            window,
            devices,
            launches: BinaryHeap::new(),
            launched_from: 0,
            queue_delay,
            unseen_launchers: Vec::new(),
            checks: BTreeMap::new(),
            ops: super::diagnose::op_causes(tl, &code),
            lossy,
            code,
            steps,
            windowed,
        };
        if !windowed {
            for (i, d) in tl.gpu.devices.iter().enumerate() {
                for w in &d.work {
                    a.work(i, w);
                }
            }
            a.gpu_until(u64::MAX);
        }
        a
    }

    /// A piece of work of the timeline's device `index`, in start order.
    pub fn work(&mut self, index: usize, w: &Work) {
        let d = &mut self.devices[index];
        d.walk.add(w.span());
        if let Some(k) = w.kernel() {
            match crate::analyze::gpu::is_communication_kernel(&k.name) {
                true => d.kinds.communication(w.span()),
                false => d.kinds.compute(w.span()),
            }
        }
        if let (Some(_), Some((thread, at))) = (w.kernel(), w.launch) {
            self.checks.entry(w.device).or_default().kernel(w.start, at);
            self.launches.push(Launch {
                at,
                thread,
                device: w.device,
            });
        }
    }

    /// Every piece of work starting before `t` has come.
    pub fn gpu_until(&mut self, t: u64) {
        self.launched_from = t.saturating_sub(self.queue_delay);
    }

    /// Attributes what can be by `now` (every event before it replayed),
    /// then lets the timeline forget what lies behind.
    pub fn settle(&mut self, tl: &mut Timeline, now: u64) {
        let mut forget = u64::MAX;
        let (ops, code, window) = (&self.ops, &self.code, self.window);
        // Each gap's pieces, and the feeder's account up to its end, are
        // gathered here before they are known settled (one buffer for all).
        let (mut gap, mut account) = (Attribution::pieces_only(), Attribution::pieces_only());
        for d in &mut self.devices {
            let spans = &d.walk.spans;
            while d.next + 1 < spans.len() {
                let (a, b) = (spans[d.next].1, spans[d.next + 1].0);
                if b > now {
                    break;
                }
                let unsettled = Cell::new(false);
                let work = &tl.gpu.devices[d.index].work;
                let inp = inputs(spans, work, tl, ops, code, window, Some(&unsettled));
                gap.clear();
                attribute::attribute_gap(&inp, a, b, d.fallback, &mut gap);
                account.clear();
                if let Some(f) = d.fallback {
                    attribute::account(&inp, f, d.account_to, b, &mut account);
                }
                if unsettled.get() {
                    break;
                }
                d.out.add_all(gap.pieces.drain(..));
                for (&pid, &ns) in &gap.waited_for {
                    *d.out.waited_for.entry(pid).or_default() += ns;
                }
                if let Some(f) = d.feeder.as_mut() {
                    f.extend(account.pieces.drain(..));
                    f.add_cpu(&tl.threads, d.account_to, b);
                }
                d.account_to = b;
                d.next += 1;
            }
            // The gap after the last span known so far opens where it
            // ends, however far on its end still goes (none may follow:
            // the GPU's work still to come says).
            let next_gap = match self.windowed {
                true => d.next < spans.len(),
                false => d.next + 1 < spans.len(),
            };
            if next_gap {
                forget = forget.min(spans[d.next].1);
            } else if self.windowed && spans.is_empty() {
                // Before its first work: the idle there may be a gap.
                forget = forget.min(window.0);
            }
            if d.fallback.is_some() {
                forget = forget.min(d.account_to);
            }
        }
        let due = now.min(self.launched_from);
        while let Some(&l) = self.launches.peek() {
            if l.at >= due {
                break;
            }
            match tl.threads.get(&l.thread) {
                None => self.unseen_launchers.push(l),
                Some(t) if t.closed_until() > l.at => {
                    let on_cpu = t.intervals.as_deref().map(|iv| on_cpu_at(iv, l.at));
                    self.check(l, on_cpu);
                }
                Some(_) => break,
            }
            self.launches.pop();
        }
        forget = forget.min(self.launched_from);
        if let Some(l) = self.launches.peek() {
            forget = forget.min(l.at);
        }
        if forget == u64::MAX {
            forget = now;
        }
        for t in tl.threads.values_mut().chain(tl.retired.iter_mut()) {
            t.forget_before(forget);
        }
        if self.windowed {
            self.let_go(tl, forget);
        }
    }

    /// Lets go of the work no gap still to attribute ends at, and of the
    /// calls well behind `forget`.
    fn let_go(&self, tl: &mut Timeline, forget: u64) {
        for d in &self.devices {
            let Some(&(_, end)) = d.walk.spans.get(d.next) else {
                continue;
            };
            let work = &mut tl.gpu.devices[d.index].work;
            let k = work.partition_point(|w| w.start < end);
            if k > 0 {
                work.drain(..k);
            }
        }
        let behind = forget.saturating_sub(CALLS_KEPT_NS);
        for calls in tl.gpu.calls.values_mut() {
            let k = calls.iter().take_while(|c| c.end <= behind).count();
            let k = k.saturating_sub(CALLS_KEPT);
            if k > 0 {
                calls.drain(..k);
            }
        }
    }

    /// `on_cpu`: None when the thread keeps no states.
    fn check(&mut self, l: Launch, on_cpu: Option<bool>) {
        self.checks.entry(l.device).or_default().launch(on_cpu);
    }

    /// The rest, once the timeline has ended and every piece of work has
    /// come: the diagnosis and the clock checks.
    pub fn finish(mut self, tl: &Timeline) -> (Diagnosis, BTreeMap<u32, ClockCheck>) {
        for l in std::mem::take(&mut self.unseen_launchers) {
            // A thread first seen after its launch was due has no state
            // then: checked, and not on a CPU.
            let states = tl.threads.get(&l.thread).and_then(|t| t.intervals.as_ref());
            self.check(l, states.map(|_| false));
        }
        while let Some(l) = self.launches.pop() {
            let states = tl
                .threads
                .get(&l.thread)
                .and_then(|t| t.intervals.as_deref());
            self.check(l, states.map(|iv| on_cpu_at(iv, l.at)));
        }
        let ids: Vec<u32> = tl.gpu.devices.iter().map(|d| d.id).collect();
        let placed = super::align::waits_within(ids.into_iter(), &tl.gpu.totals);
        let (ops, code, window) = (&self.ops, &self.code, self.window);
        let gpus = self
            .devices
            .into_iter()
            .zip(placed)
            .map(|(mut d, placed)| {
                d.walk.finish();
                let device = &tl.gpu.devices[d.index];
                let work = &device.work;
                let spans = &d.walk.spans;
                let inp = inputs(spans, work, tl, ops, code, window, None);
                let (head, tail) = attribute::edges(window, spans);
                d.out.add(head);
                while d.next + 1 < spans.len() {
                    let (a, b) = (spans[d.next].1, spans[d.next + 1].0);
                    attribute::attribute_gap(&inp, a, b, d.fallback, &mut d.out);
                    d.next += 1;
                }
                if let Some(tail) = tail {
                    d.out.add(tail);
                }
                let feeder = d.feeder.map(|mut f| {
                    let mut rest = Attribution::pieces_only();
                    attribute::account(&inp, f.tid, d.account_to, window.1, &mut rest);
                    f.extend(rest.pieces);
                    f.close();
                    f.add_cpu(&tl.threads, d.account_to, window.1);
                    f
                });
                let (compute_ns, alone) = d.kinds.finish();
                let gpu = GpuTimeline::new(
                    device,
                    tl.gpu.totals.devices.get(&device.id),
                    placed,
                    window,
                    d.walk.into_busy(),
                    compute_ns,
                    alone,
                );
                GpuDiagnosis {
                    gpu,
                    attribution: d.out,
                    feeder,
                }
            })
            .collect();
        let diagnosis = Diagnosis {
            gpus,
            lossy_windows: self.lossy,
            steps: self.steps,
        };
        (diagnosis, self.checks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intervals::{clip, minus, total, union};
    use crate::testing::Rng;

    /// Kernels in start order: (start, end, communication).
    fn kernels(x: &mut Rng) -> Vec<(u64, u64, bool)> {
        let mut at = x.below(50);
        let mut v: Vec<(u64, u64, bool)> = (0..x.below(40))
            .map(|_| {
                at += x.below(30);
                (at, at + x.below(60), x.below(4) == 0)
            })
            .collect();
        v.sort_by_key(|k| k.0);
        v
    }

    #[test]
    fn busy_spans_built_as_work_comes_are_the_bounded_union() {
        let mut x = Rng::new(0x9e3779b97f4a7c15);
        for _ in 0..500 {
            let work = kernels(&mut x);
            let window = (x.below(200), 200 + x.below(1200));
            let edges = attribute::Edges {
                startup: x.below(2) == 0,
                teardown: x.below(2) == 0,
            };
            let mut walk = Walk::new(window, edges);
            for &(s, e, _) in &work {
                walk.add((s, e));
            }
            walk.finish();
            let busy = clip(
                &union(work.iter().map(|&(s, e, _)| (s, e)).collect()),
                window.0,
                window.1,
            );
            assert_eq!(
                walk.spans,
                edges.bound(window, &busy),
                "{work:?} {window:?}"
            );
            assert_eq!(walk.into_busy(), busy);
        }
    }

    #[test]
    fn busy_by_kind_as_kernels_come_is_as_computed_at_once() {
        let mut x = Rng::new(0x2545f4914f6cdd1d);
        for _ in 0..500 {
            let work = kernels(&mut x);
            let window = (x.below(200), 200 + x.below(1200));
            let mut kinds = Kinds::new(window);
            for &(s, e, comm) in &work {
                match comm {
                    true => kinds.communication((s, e)),
                    false => kinds.compute((s, e)),
                }
            }
            let spans = |comm: bool| {
                union(
                    work.iter()
                        .filter(|k| k.2 == comm)
                        .map(|&(s, e, _)| (s, e))
                        .collect(),
                )
            };
            let compute = spans(false);
            let expected = (
                total(&clip(&compute, window.0, window.1)),
                minus(&spans(true), &compute),
            );
            assert_eq!(kinds.finish(), expected, "{work:?} {window:?}");
        }
    }
}
