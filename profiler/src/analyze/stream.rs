//! The attribution run while a session file's events are still being
//! replayed: each idle gap is attributed as soon as every thread it asks
//! about has moved past it, the clock checks of each launch as soon as its
//! thread has, and the thread states behind both are let go. What the
//! timeline holds then follows the gaps still open, not the recording's
//! length. Same rules, same answers as attributing the whole timeline at
//! the end (`diagnose`).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use super::attribute::{self, Attribution, Cause, Inputs, Tid};
use super::checks::{on_cpu_at, ClockCheck};
use super::code::CodeOf;
use super::diagnose::{Diagnosis, Feeder, GpuDiagnosis};
use super::gpu::{gpu_timelines, GpuTimeline};
use super::steps;
use crate::timeline::Timeline;

/// One GPU's gaps, attributed in order.
struct Device {
    gpu: GpuTimeline,
    /// Its busy spans as the rules walk them ([`attribute::Edges::bound`]).
    spans: Vec<(u64, u64)>,
    /// Its place among the timeline's devices: the rules read its work
    /// there (each item's start and who launched it).
    index: usize,
    fallback: Option<Tid>,
    /// The next gap to attribute: between busy[next] and busy[next + 1].
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
    work: &'a [crate::timeline::gpu::Work],
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

/// A kernel launch to check against its thread's state.
#[derive(Clone, Copy)]
struct Launch {
    at: u64,
    thread: Tid,
    device: u32,
}

pub struct Attributor {
    window: (u64, u64),
    devices: Vec<Device>,
    /// In time order, checked up to `next_launch`.
    launches: Vec<Launch>,
    next_launch: usize,
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
}

impl Attributor {
    /// `window`: the recording's, known before its events (from its end
    /// record), and whether its edges are the job's; `blind`, `lossy`: see
    /// [`Attribution`].
    pub fn new(
        tl: &Timeline,
        window: (u64, u64),
        edges: attribute::Edges,
        blind: &[(u64, u64)],
        lossy: Vec<(u64, u64)>,
        code: CodeOf,
    ) -> Attributor {
        let mut checks: BTreeMap<u32, ClockCheck> = BTreeMap::new();
        let mut launches = Vec::new();
        for d in &tl.gpu.devices {
            for w in &d.work {
                let (Some(_), Some((thread, at))) = (w.kernel(), w.launch) else {
                    continue;
                };
                checks.entry(d.id).or_default().kernel(w.start, at);
                launches.push(Launch {
                    at,
                    thread,
                    device: d.id,
                });
            }
        }
        launches.sort_by_key(|l| l.at);
        // The timeline's GPU side (and so the step marks) is whole before
        // the events are replayed.
        let steps = steps::summary(tl);
        let devices = gpu_timelines(&tl.gpu, window.0, window.1)
            .into_iter()
            .zip(&tl.gpu.devices)
            .enumerate()
            .map(|(index, (gpu, d))| {
                let fallback = attribute::main_feeder(&d.work);
                Device {
                    fallback,
                    index,
                    spans: edges.bound(window, &gpu.busy),
                    gpu,
                    next: 0,
                    out: Attribution::new(blind.to_vec(), lossy.clone(), false)
                        .within_steps(steps.as_ref().map(steps::Summary::span)),
                    feeder: fallback.map(|t| Feeder::new(t, window.0)),
                    account_to: window.0,
                }
            })
            .collect();
        Attributor {
            window,
            devices,
            launches,
            next_launch: 0,
            unseen_launchers: Vec::new(),
            checks,
            ops: super::diagnose::op_causes(tl, &code),
            lossy,
            code,
            steps,
        }
    }

    /// Attributes what can be by `now` (every event before it replayed),
    /// then lets the timeline forget what lies behind.
    pub fn settle(&mut self, tl: &mut Timeline, now: u64) {
        let mut forget = u64::MAX;
        let (ops, code, window) = (&self.ops, &self.code, self.window);
        for d in &mut self.devices {
            while d.next + 1 < d.spans.len() {
                let (a, b) = (d.spans[d.next].1, d.spans[d.next + 1].0);
                if b > now {
                    break;
                }
                let unsettled = Cell::new(false);
                let work = &tl.gpu.devices[d.index].work;
                let inp = inputs(&d.spans, work, tl, ops, code, window, Some(&unsettled));
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
            if d.next + 1 < d.spans.len() {
                forget = forget.min(d.spans[d.next].1);
            }
            if d.fallback.is_some() {
                forget = forget.min(d.account_to);
            }
        }
        while let Some(&l) = self.launches.get(self.next_launch) {
            if l.at >= now {
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
            self.next_launch += 1;
        }
        if let Some(l) = self.launches.get(self.next_launch) {
            forget = forget.min(l.at);
        }
        if forget == u64::MAX {
            forget = now;
        }
        for t in tl.threads.values_mut().chain(tl.retired.iter_mut()) {
            t.forget_before(forget);
        }
    }

    /// `on_cpu`: None when the thread keeps no states.
    fn check(&mut self, l: Launch, on_cpu: Option<bool>) {
        self.checks.entry(l.device).or_default().launch(on_cpu);
    }

    /// The rest, once the timeline has ended: the diagnosis and the clock
    /// checks.
    pub fn finish(mut self, tl: &Timeline) -> (Diagnosis, BTreeMap<u32, ClockCheck>) {
        for l in std::mem::take(&mut self.unseen_launchers) {
            // A thread first seen after its launch was due has no state
            // then: checked, and not on a CPU.
            let states = tl.threads.get(&l.thread).and_then(|t| t.intervals.as_ref());
            self.check(l, states.map(|_| false));
        }
        for i in self.next_launch..self.launches.len() {
            let l = self.launches[i];
            let states = tl
                .threads
                .get(&l.thread)
                .and_then(|t| t.intervals.as_deref());
            self.check(l, states.map(|iv| on_cpu_at(iv, l.at)));
        }
        let (ops, code, window) = (&self.ops, &self.code, self.window);
        let gpus = self
            .devices
            .into_iter()
            .map(|mut d| {
                let work = &tl.gpu.devices[d.index].work;
                let inp = inputs(&d.spans, work, tl, ops, code, window, None);
                let (head, tail) = attribute::edges(self.window, &d.spans);
                d.out.add(head);
                while d.next + 1 < d.spans.len() {
                    let (a, b) = (d.spans[d.next].1, d.spans[d.next + 1].0);
                    attribute::attribute_gap(&inp, a, b, d.fallback, &mut d.out);
                    d.next += 1;
                }
                if let Some(tail) = tail {
                    d.out.add(tail);
                }
                let feeder = d.feeder.map(|mut f| {
                    let mut rest = Attribution::new(Vec::new(), Vec::new(), true);
                    attribute::account(&inp, f.tid, d.account_to, self.window.1, &mut rest);
                    f.extend(rest.pieces);
                    f.close();
                    f.add_cpu(&tl.threads, d.account_to, self.window.1);
                    f
                });
                GpuDiagnosis {
                    gpu: d.gpu,
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
