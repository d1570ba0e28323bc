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
use crate::intervals::{minus, union, Spans};
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

    /// The walk's spans once every piece of work has come, and the busy
    /// spans among them.
    fn finish(&mut self) -> Spans {
        let (lo, hi) = self.window;
        if self.prefix.is_none() {
            let prefix = !self.edges.startup;
            if prefix {
                self.spans.push((lo, lo));
            }
            self.prefix = Some(prefix);
        }
        let from = usize::from(self.prefix == Some(true));
        let busy = self.spans[from..].to_vec();
        if !self.edges.teardown && busy.last().is_none_or(|b| b.1 < hi) {
            self.spans.push((hi, hi));
        }
        busy
    }
}

/// Disjoint spans built as spans come in start order.
#[derive(Default)]
struct Union {
    done: Spans,
    open: Option<(u64, u64)>,
}

impl Union {
    fn add(&mut self, (s, e): (u64, u64)) {
        if e <= s {
            return;
        }
        match self.open.as_mut() {
            Some(o) if s <= o.1 => o.1 = o.1.max(e),
            _ => self.done.extend(self.open.replace((s, e))),
        }
    }

    fn finish(mut self) -> Spans {
        self.done.extend(self.open.take());
        self.done
    }
}

/// One GPU's gaps, attributed in order.
struct Device {
    /// Its place among the timeline's devices: the rules read its work
    /// there (each item's start and who launched it).
    index: usize,
    walk: Walk,
    compute: Union,
    communication: Union,
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
                    compute: Union::default(),
                    communication: Union::default(),
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
                true => d.communication.add(w.span()),
                false => d.compute.add(w.span()),
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
                let mut gap = Attribution::new(Vec::new(), Vec::new(), true);
                attribute::attribute_gap(&inp, a, b, d.fallback, &mut gap);
                let mut account = Attribution::new(Vec::new(), Vec::new(), true);
                if let Some(f) = d.fallback {
                    attribute::account(&inp, f, d.account_to, b, &mut account);
                }
                if unsettled.get() {
                    break;
                }
                for p in gap.pieces {
                    d.out.add(p);
                }
                for (pid, ns) in gap.waited_for {
                    *d.out.waited_for.entry(pid).or_default() += ns;
                }
                if let Some(f) = d.feeder.as_mut() {
                    f.extend(account.pieces);
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
                let busy = d.walk.finish();
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
                    let mut rest = Attribution::new(Vec::new(), Vec::new(), true);
                    attribute::account(&inp, f.tid, d.account_to, window.1, &mut rest);
                    f.extend(rest.pieces);
                    f.close();
                    f.add_cpu(&tl.threads, d.account_to, window.1);
                    f
                });
                let compute = d.compute.finish();
                let alone = minus(&union(d.communication.finish()), &compute);
                let gpu = GpuTimeline::new(
                    device,
                    tl.gpu.totals.devices.get(&device.id),
                    placed,
                    window,
                    busy,
                    compute,
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
