//! A recording's GPU records between the passes over it. The first pass
//! takes them as they come: each piece of work joined to the call that
//! launched it, and work, calls and synchronizations spooled
//! (`crate::spool`) in the order read. What comes out is read back in time
//! order, as a whole GPU side ([`GpuSpools::whole`]) or through a window
//! that moves with the events ([`GpuFeed`]), so that a long recording's
//! GPU side is never held at once.
//!
//! Records come a little out of time order (CUPTI hands its buffers over
//! every 250 ms, a stream's records in order, the streams' interleaved):
//! the first pass measures how far, and a reader holds back that much.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use gapscope_wire::{ApiDomain, GpuRecord};

use super::totals::GpuTotals;
use super::{
    api_role, physical_ids, ApiRole, Call, CallName, Device, GpuSide, Kernel, Range, SyncWait, Tid,
    What, Work,
};
use crate::holdback::Holdback;
use crate::session::{span_within, within, Session};
use crate::spool::{self, Spool};

/// How long after its launching call's start a piece of work is still
/// joined to it (by recorded time): a launch queued behind more work than
/// this is kept without its launcher. Calls are forgotten after it, so a
/// long recording's join holds this much of its calls.
pub const JOIN_HORIZON_NS: u64 = 10_000_000_000;

/// A piece of GPU work as spooled.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct WorkRec {
    start: u64,
    end: u64,
    /// Its launching call's start and end, when `launched`.
    launch_at: u64,
    launch_end: u64,
    bytes: u64,
    pid: u32,
    /// Its launching call's thread, when `launched`.
    launch_tid: u32,
    /// The CUDA ordinal its process gave the GPU.
    ordinal: u32,
    stream: u32,
    correlation: u32,
    /// Its kernel in [`GpuSpools::kernels`], for a kernel.
    kernel: u32,
    kind: u8,
    launched: u8,
    copy_kind: u8,
    src_kind: u8,
    dst_kind: u8,
    _pad: [u8; 3],
}

const _: () = assert!(std::mem::size_of::<WorkRec>() == 72);

const KERNEL: u8 = 0;
const MEMCPY: u8 = 1;
const MEMSET: u8 = 2;

/// A CUDA call reported by a GPU source, as spooled.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct CallRec {
    start: u64,
    end: u64,
    pid: u32,
    tid: u32,
    correlation: u32,
    cbid: u32,
    /// 0 runtime, 1 driver.
    domain: u8,
    /// Its place in [`ROLES`].
    role: u8,
    _pad: [u8; 6],
}

const ROLES: [ApiRole; 4] = [
    ApiRole::Launch,
    ApiRole::Sync,
    ApiRole::Memory,
    ApiRole::Other,
];

/// A span: a synchronization's (with its type), or an NVTX range's.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct SpanRec {
    start: u64,
    end: u64,
    kind: u8,
    _pad: [u8; 7],
}

/// How far behind the latest earlier one a spool's records came, at most,
/// by the time they are read in.
#[derive(Clone, Copy, Debug, Default)]
struct Lateness {
    latest: u64,
    most: u64,
}

impl Lateness {
    fn saw(&mut self, t: u64) {
        self.most = self.most.max(self.latest.saturating_sub(t));
        self.latest = self.latest.max(t);
    }
}

/// Calls by (pid, correlation): (thread, start, end) each.
type Issuers = ahash::AHashMap<(u32, u32), Vec<(u32, u64, u64)>>;

/// The first pass's sink for GPU records.
pub struct GpuIntake {
    out: GpuSpools,
    /// Calls by (pid, correlation) → (thread, start, end), for the work
    /// they launched; forgotten [`JOIN_HORIZON_NS`] after their start.
    issuers: ahash::AHashMap<(u32, u32), (u32, u64, u64)>,
    issued: VecDeque<(u64, (u32, u32))>,
    /// Work read before the call that launched it, waiting for it.
    orphans: ahash::AHashMap<(u32, u32), Vec<WorkRec>>,
    waiting: VecDeque<(u64, (u32, u32))>,
    /// The latest work start read: the join's clock.
    now: u64,
    /// None: nothing is forgotten (a session read whole).
    horizon: Option<u64>,
    /// A role per API id, decided once: the names repeat millions of
    /// times.
    roles: ahash::AHashMap<(ApiDomain, u32), ApiRole>,
    /// Kernels, one copy of each name and shape: every record is read
    /// with its own.
    kernel_ids: ahash::AHashMap<Arc<Kernel>, u32>,
    /// Keep every NVTX range (else only those naming a step).
    all_ranges: bool,
    lateness: [Lateness; 4],
    queue_delay: u64,
}

/// A session's GPU records as the first pass leaves them.
#[derive(Default)]
pub struct GpuSpools {
    work: Spool<WorkRec>,
    calls: Spool<CallRec>,
    syncs: Spool<SpanRec>,
    /// Every range's span, kept or not: those outside the recording count
    /// as dropped.
    range_spans: Spool<SpanRec>,
    /// The ranges kept, by thread.
    ranges: BTreeMap<Tid, Vec<Range>>,
    /// Device names and UUIDs the sources reported, by (pid, ordinal).
    names: BTreeMap<(u32, u32), String>,
    uuids: BTreeMap<(u32, u32), String>,
    markers: Vec<u64>,
    kernels: Vec<Arc<Kernel>>,
    /// Of work starts, call starts, sync starts and launches: see
    /// [`Lateness`]; then the longest queue delay.
    late: [u64; 5],
    /// Read whole: every call by (pid, correlation), in the order read
    /// (thread, start, end). The work is joined to the last of them inside
    /// the recording once its window is known, as a session read whole
    /// is joined after its records outside it are dropped.
    issuers: Option<Issuers>,
    /// Records taken, of any kind.
    pub count: u64,
}

const LATE_WORK: usize = 0;
const LATE_CALLS: usize = 1;
const LATE_SYNCS: usize = 2;
const LATE_LAUNCHES: usize = 3;
/// Not a lateness: how long after its launch a piece of work started, at
/// most.
const QUEUE_DELAY: usize = 4;

impl GpuIntake {
    /// `whole`: the records will be read back whole (a session in memory,
    /// or pictures that draw them all): every NVTX range is kept, and
    /// nothing of the join is forgotten.
    pub fn new(whole: bool) -> GpuIntake {
        GpuIntake {
            out: GpuSpools {
                issuers: whole.then(Default::default),
                ..GpuSpools::default()
            },
            issuers: Default::default(),
            issued: VecDeque::new(),
            orphans: Default::default(),
            waiting: VecDeque::new(),
            now: 0,
            horizon: (!whole).then_some(JOIN_HORIZON_NS),
            roles: Default::default(),
            kernel_ids: Default::default(),
            all_ranges: whole,
            lateness: Default::default(),
            queue_delay: 0,
        }
    }

    /// Keeps every NVTX range, not only those naming a step.
    pub fn keeping_all_ranges(mut self, all: bool) -> GpuIntake {
        self.all_ranges = all;
        self
    }

    pub fn add(&mut self, pid: u32, r: GpuRecord) {
        self.out.count += 1;
        match r {
            GpuRecord::Api {
                domain,
                cbid,
                start,
                end,
                tid,
                correlation,
                ..
            } => {
                let role = *self
                    .roles
                    .entry((domain, cbid))
                    .or_insert_with(|| api_role(&CallName::Api(domain, cbid).name()));
                self.lateness[LATE_CALLS].saw(start);
                self.out.calls.push(CallRec {
                    start,
                    end,
                    pid,
                    tid,
                    correlation,
                    cbid,
                    domain: matches!(domain, ApiDomain::Driver) as u8,
                    role: ROLES.iter().position(|&r| r == role).unwrap_or(3) as u8,
                    _pad: [0; 6],
                });
                let key = (pid, correlation);
                if let Some(all) = self.out.issuers.as_mut() {
                    all.entry(key).or_default().push((tid, start, end));
                    return;
                }
                self.issuers.insert(key, (tid, start, end));
                self.issued.push_back((start, key));
                if let Some(orphans) = self.orphans.remove(&key) {
                    for mut w in orphans {
                        w.launched = 1;
                        w.launch_tid = tid;
                        w.launch_at = start;
                        w.launch_end = end;
                        self.spool_work(w);
                    }
                }
            }
            GpuRecord::Kernel {
                start,
                end,
                device,
                stream,
                correlation,
                grid,
                block,
                name,
                ..
            } => {
                let k = Kernel { name, grid, block };
                let id = match self.kernel_ids.get(&k) {
                    Some(&id) => id,
                    None => {
                        let id = self.out.kernels.len() as u32;
                        let k = Arc::new(k);
                        self.out.kernels.push(k.clone());
                        self.kernel_ids.insert(k, id);
                        id
                    }
                };
                let mut w = work(pid, (start, end), (device, stream, correlation), KERNEL);
                w.kernel = id;
                self.work(w);
            }
            GpuRecord::Memcpy {
                start,
                end,
                device,
                stream,
                correlation,
                bytes,
                copy_kind,
                src_kind,
                dst_kind,
                ..
            } => {
                let mut w = work(pid, (start, end), (device, stream, correlation), MEMCPY);
                w.bytes = bytes;
                w.copy_kind = copy_kind;
                w.src_kind = src_kind;
                w.dst_kind = dst_kind;
                self.work(w);
            }
            GpuRecord::Memset {
                start,
                end,
                device,
                stream,
                correlation,
                bytes,
                ..
            } => {
                let mut w = work(pid, (start, end), (device, stream, correlation), MEMSET);
                w.bytes = bytes;
                self.work(w);
            }
            GpuRecord::Sync {
                start,
                end,
                sync_type,
                ..
            } => {
                self.lateness[LATE_SYNCS].saw(start);
                self.out.syncs.push(SpanRec {
                    start,
                    end,
                    kind: sync_type,
                    _pad: [0; 7],
                });
            }
            GpuRecord::Range {
                start,
                end,
                tid,
                name,
                domain,
            } => {
                self.out.range_spans.push(SpanRec {
                    start,
                    end,
                    kind: 0,
                    _pad: [0; 7],
                });
                if self.all_ranges || super::step_number(&name).is_some() {
                    self.out.ranges.entry((pid, tid)).or_default().push(Range {
                        start,
                        end,
                        name,
                        domain,
                    });
                }
            }
            GpuRecord::Device { id, name } => {
                self.out.names.entry((pid, id)).or_insert(name);
            }
            GpuRecord::DeviceUuid { id, uuid } => {
                self.out.uuids.insert((pid, id), uuid);
            }
            GpuRecord::Marker { ts, .. } => self.out.markers.push(ts),
        }
    }

    /// A piece of work read: joined to its call if that was read, else
    /// held for it.
    fn work(&mut self, mut w: WorkRec) {
        if self.out.issuers.is_some() {
            // Joined once the window is known.
            return self.spool_work(w);
        }
        self.now = self.now.max(w.start);
        self.forget();
        let key = (w.pid, w.correlation);
        match self.issuers.get(&key) {
            Some(&(tid, at, end)) => {
                w.launched = 1;
                w.launch_tid = tid;
                w.launch_at = at;
                w.launch_end = end;
                self.spool_work(w);
            }
            None => {
                self.orphans.entry(key).or_default().push(w);
                self.waiting.push_back((w.start, key));
            }
        }
    }

    fn spool_work(&mut self, w: WorkRec) {
        self.lateness[LATE_WORK].saw(w.start);
        if w.launched != 0 {
            self.lateness[LATE_LAUNCHES].saw(w.launch_at);
            self.queue_delay = self.queue_delay.max(w.start.saturating_sub(w.launch_at));
        }
        self.out.work.push(w);
    }

    /// Lets go of calls and held work past the horizon: held work is
    /// spooled without a launcher.
    fn forget(&mut self) {
        let Some(h) = self.horizon else { return };
        let before = self.now.saturating_sub(h);
        while let Some(&(start, key)) = self.issued.front() {
            if start >= before {
                break;
            }
            self.issued.pop_front();
            // Unless a later call took the key over.
            if self
                .issuers
                .get(&key)
                .is_some_and(|&(_, at, _)| at == start)
            {
                self.issuers.remove(&key);
            }
        }
        while let Some(&(start, key)) = self.waiting.front() {
            if start >= before {
                break;
            }
            self.waiting.pop_front();
            if let Some(held) = self.orphans.remove(&key) {
                for w in held {
                    self.spool_work(w);
                }
            }
        }
    }

    /// What the first pass leaves: the work still waiting for its call is
    /// spooled without one.
    pub fn finish(mut self) -> GpuSpools {
        let mut held: Vec<(u64, (u32, u32))> = self.waiting.drain(..).collect();
        held.sort();
        for (_, key) in held {
            if let Some(ws) = self.orphans.remove(&key) {
                for w in ws {
                    self.spool_work(w);
                }
            }
        }
        for (i, l) in self.lateness.iter().enumerate() {
            self.out.late[i] = l.most;
        }
        self.out.late[QUEUE_DELAY] = self.queue_delay;
        if self.out.issuers.is_some() {
            // Joined later: nothing is known of their launches yet.
            self.out.late[LATE_LAUNCHES] = u64::MAX;
            self.out.late[QUEUE_DELAY] = u64::MAX;
        }
        self.out
    }
}

fn work(
    pid: u32,
    (start, end): (u64, u64),
    (ordinal, stream, correlation): (u32, u32, u32),
    kind: u8,
) -> WorkRec {
    WorkRec {
        start,
        end,
        launch_at: 0,
        launch_end: 0,
        bytes: 0,
        pid,
        launch_tid: 0,
        ordinal,
        stream,
        correlation,
        kernel: 0,
        kind,
        launched: 0,
        copy_kind: 0,
        src_kind: 0,
        dst_kind: 0,
        _pad: [0; 3],
    }
}

/// How the spooled records map onto the GPU side: which GPU each (pid,
/// ordinal) is, where records may lie, and the GPUs, by id, with what
/// their work came to.
pub struct Plan {
    physical: BTreeMap<(u32, u32), u32>,
    window: (u64, u64),
}

impl Plan {
    /// Which GPU a spooled piece of work ran on.
    fn device_of(&self, w: &WorkRec) -> u32 {
        self.physical
            .get(&(w.pid, w.ordinal))
            .copied()
            .unwrap_or(w.ordinal)
    }
}

impl GpuSpools {
    /// The GPU side without its work and calls, and what they all came to
    /// (read once through): its devices named, their work summed, its
    /// kept ranges and the recording's host ops. With how many records lie
    /// outside `window` (dropped, as a session's reader drops them), and
    /// the plan to read the rest by.
    pub fn scan(&mut self, session: &mut Session, window: (u64, u64)) -> (GpuSide, usize, Plan) {
        let ok = |t: u64| within(window, t);
        let span = |a: u64, b: u64| span_within(window, a, b);
        let mut dropped = 0usize;
        // Inserted one by one: collecting would hold a pair per piece of
        // work before it dedups them.
        let mut used: BTreeSet<(u32, u32)> = BTreeSet::new();
        for w in self.work.iter().filter(|w| span(w.start, w.end)) {
            used.insert((w.pid, w.ordinal));
        }
        let physical = physical_ids(&used, &self.uuids, &session.nvml_devices);
        let plan = Plan { physical, window };
        let mut side = GpuSide::default();
        let mut totals = GpuTotals::default();
        let source_of = |pid: u32| {
            session
                .gpu_sources
                .iter()
                .find(|s| s.pid == pid)
                .map(|s| s.kind)
                .unwrap_or_default()
        };
        let mut by_dev: BTreeMap<u32, Device> = BTreeMap::new();
        let mut r = self.work.reader();
        for i in 0..self.work.len() {
            let Some(rec) = r.get(i) else { break };
            let Some(w) = self.to_work(&plan, &rec) else {
                dropped += 1;
                continue;
            };
            let d = by_dev.entry(w.device).or_insert_with(|| Device {
                id: w.device,
                source: source_of(w.pid),
                ..Default::default()
            });
            if !d.pids.contains(&w.pid) {
                d.pids.push(w.pid);
            }
            totals.work(&w);
        }
        for c in self.calls.iter() {
            match self.to_call(&plan, &c) {
                Some((t, call)) => totals.call(t, &call),
                None => dropped += 1,
            }
        }
        for s in self.syncs.iter() {
            match span(s.start, s.end) {
                true => totals.sync(&SyncWait {
                    start: s.start,
                    end: s.end,
                    sync_type: s.kind,
                }),
                false => dropped += 1,
            }
        }
        dropped += self
            .range_spans
            .iter()
            .filter(|r| !span(r.start, r.end))
            .count();
        dropped += self.markers.iter().filter(|&&t| !ok(t)).count();
        for ranges in self.ranges.values_mut() {
            ranges.retain(|r| span(r.start, r.end));
        }
        self.ranges.retain(|_, v| !v.is_empty());
        side.ranges = std::mem::take(&mut self.ranges);
        for op in std::mem::take(&mut session.host_ops) {
            side.host_ops.entry((op.pid, op.tid)).or_default().push(op);
        }
        for ops in side.host_ops.values_mut() {
            ops.sort_by_key(|o| (o.start, std::cmp::Reverse(o.end)));
        }
        let nvml: BTreeMap<u32, &crate::session::NvmlDevice> =
            session.nvml_devices.iter().map(|d| (d.index, d)).collect();
        for d in by_dev.values_mut() {
            // The name and UUID a process of it gave its ordinal of it.
            let ours = || plan.physical.iter().filter(|&(_, &id)| id == d.id);
            let named = ours().find_map(|(key, _)| self.names.get(key));
            // (Not NVML's by index: an ordinal is an NVML index only where
            // the process sees every GPU.)
            d.uuid = ours().find_map(|(key, _)| self.uuids.get(key).cloned());
            d.name = nvml
                .get(&d.id)
                .map(|n| n.name.clone())
                .or_else(|| named.cloned())
                .unwrap_or_else(|| format!("GPU {}", d.id));
        }
        side.devices = by_dev.into_values().collect();
        totals.finish();
        side.totals = totals;
        (side, dropped, plan)
    }

    /// The GPU side whole: `side` as [`GpuSpools::scan`] made it, with
    /// every piece of work and every call, in time order.
    pub fn whole(&self, mut side: GpuSide, plan: &Plan) -> GpuSide {
        let index: HashMap<u32, usize> = side
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id, i))
            .collect();
        let mut feed = self.feed(plan);
        while let Some(w) = feed.next_work(u64::MAX) {
            if let Some(&i) = index.get(&w.device) {
                side.devices[i].work.push(w);
            }
        }
        while let Some((t, c)) = feed.next_call(u64::MAX) {
            side.calls.entry(t).or_default().push(c);
        }
        for d in &mut side.devices {
            d.work.shrink_to_fit();
        }
        for calls in side.calls.values_mut() {
            calls.shrink_to_fit();
        }
        let by_start: ByTime<SpanRec> = |s| Some((s.start, 0));
        let mut syncs = Ordered::new(&self.syncs, self.late[LATE_SYNCS], by_start);
        while let Some(s) = syncs.next_until(u64::MAX) {
            if span_within(plan.window, s.start, s.end) {
                side.syncs.push(SyncWait {
                    start: s.start,
                    end: s.end,
                    sync_type: s.kind,
                });
            }
        }
        side
    }

    /// Who launched a spooled piece of work, and when: a call outside the
    /// recording launched nothing it holds.
    fn launch_of(&self, plan: &Plan, w: &WorkRec) -> Option<(Tid, u64)> {
        let inside = |(tid, at, end): (u32, u64, u64)| {
            span_within(plan.window, at, end).then_some(((w.pid, tid), at))
        };
        match &self.issuers {
            // The last by thread, then as read, as calls are kept.
            Some(all) => all
                .get(&(w.pid, w.correlation))?
                .iter()
                .enumerate()
                .filter_map(|(i, &c)| Some(((c.0, i), inside(c)?)))
                .max_by_key(|x| x.0)
                .map(|x| x.1),
            None if w.launched != 0 => inside((w.launch_tid, w.launch_at, w.launch_end)),
            None => None,
        }
    }

    /// Why records that outgrew memory stayed there (no temporary file
    /// could be made or written), if they did.
    pub fn kept_in_memory(&self) -> Option<&str> {
        self.work
            .kept_in_memory()
            .or(self.calls.kept_in_memory())
            .or(self.syncs.kept_in_memory())
            .or(self.range_spans.kept_in_memory())
    }

    /// How long after its launch a piece of work started, at most.
    pub fn queue_delay(&self) -> u64 {
        self.late[QUEUE_DELAY]
    }

    /// Every piece of work inside the recording, in the order spooled.
    pub fn each_work(&self, plan: &Plan, mut f: impl FnMut(&Work)) {
        let mut r = self.work.reader();
        for i in 0..self.work.len() {
            let Some(rec) = r.get(i) else { break };
            if let Some(w) = self.to_work(plan, &rec) {
                f(&w);
            }
        }
    }

    /// The work on `device` that `feeder` launched, in the order it did
    /// (then by start, then as read): what a what-if replay issues from
    /// the feeder's calls.
    pub fn launched_by<'s>(
        &'s self,
        plan: &'s Plan,
        device: u32,
        feeder: Tid,
    ) -> impl Iterator<Item = Work> + 's {
        let key = move |w: &WorkRec| {
            let launch = self.launch_of(plan, w).filter(|l| l.0 == feeder)?;
            (plan.device_of(w) == device).then_some((launch.1, w.start))
        };
        self.read(
            plan,
            Ordered::new(&self.work, self.late[LATE_LAUNCHES], key),
        )
    }

    /// The rest of the work on `device`, in start order (then as read).
    pub fn launched_by_others<'s>(
        &'s self,
        plan: &'s Plan,
        device: u32,
        feeder: Tid,
    ) -> impl Iterator<Item = Work> + 's {
        let key = move |w: &WorkRec| {
            let mine = self.launch_of(plan, w).is_some_and(|l| l.0 == feeder);
            (!mine && plan.device_of(w) == device).then_some((w.start, 0))
        };
        self.read(plan, Ordered::new(&self.work, self.late[LATE_WORK], key))
    }

    /// Thread `t`'s calls, in start order (then as read).
    pub fn calls_of<'s>(&'s self, plan: &'s Plan, t: Tid) -> impl Iterator<Item = Call> + 's {
        let key = move |c: &CallRec| ((c.pid, c.tid) == t).then_some((c.start, 0));
        let mut calls = Ordered::new(&self.calls, self.late[LATE_CALLS], key);
        std::iter::from_fn(move || loop {
            let c = calls.next_until(u64::MAX)?;
            if let Some((_, c)) = self.to_call(plan, &c) {
                return Some(c);
            }
        })
    }

    fn read<'s, K: Fn(&WorkRec) -> Option<(u64, u64)> + 's>(
        &'s self,
        plan: &'s Plan,
        mut work: Ordered<'s, WorkRec, K>,
    ) -> impl Iterator<Item = Work> + 's {
        std::iter::from_fn(move || loop {
            let w = work.next_until(u64::MAX)?;
            if let Some(w) = self.to_work(plan, &w) {
                return Some(w);
            }
        })
    }

    /// A reader of the work and calls in time order, holding back no more
    /// than their lateness.
    pub fn feed<'s>(&'s self, plan: &'s Plan) -> GpuFeed<'s> {
        GpuFeed {
            spools: self,
            plan,
            work: Ordered::new(&self.work, self.late[LATE_WORK], |w| Some((w.start, 0))),
            calls: Ordered::new(&self.calls, self.late[LATE_CALLS], |c| Some((c.start, 0))),
        }
    }

    /// A spooled piece of work as the timeline keeps it; None when it lies
    /// outside the recording.
    fn to_work(&self, plan: &Plan, w: &WorkRec) -> Option<Work> {
        if !span_within(plan.window, w.start, w.end) {
            return None;
        }
        let what = match w.kind {
            KERNEL => What::Kernel(self.kernels.get(w.kernel as usize)?.clone()),
            MEMCPY => What::Memcpy {
                bytes: w.bytes,
                copy_kind: w.copy_kind,
                src_kind: w.src_kind,
                dst_kind: w.dst_kind,
            },
            _ => What::Memset { bytes: w.bytes },
        };
        let device = plan.device_of(w);
        Some(Work {
            start: w.start,
            end: w.end,
            launch: self.launch_of(plan, w),
            pid: w.pid,
            device,
            stream: w.stream,
            correlation: w.correlation,
            what,
        })
    }

    fn to_call(&self, plan: &Plan, c: &CallRec) -> Option<(Tid, Call)> {
        if !span_within(plan.window, c.start, c.end) {
            return None;
        }
        let domain = match c.domain {
            0 => ApiDomain::Runtime,
            _ => ApiDomain::Driver,
        };
        Some((
            (c.pid, c.tid),
            Call {
                start: c.start,
                end: c.end,
                role: *ROLES.get(c.role as usize)?,
                name: CallName::Api(domain, c.cbid),
                correlation: Some(c.correlation),
            },
        ))
    }
}

/// A spool read in the order of a key, its time first: records are taken
/// in as they lie and held until nothing still to come can come before
/// them (a record comes at most `late` behind the latest time taken in).
/// The key leaves out the records it gives none.
pub(crate) struct Ordered<'s, T: bytemuck::Pod, K> {
    reader: spool::Reader<'s, T>,
    len: usize,
    next: usize,
    held: Holdback<(u64, u64), T>,
    latest: u64,
    late: u64,
    key: K,
}

impl<'s, T: bytemuck::Pod, K: Fn(&T) -> Option<(u64, u64)>> Ordered<'s, T, K> {
    pub(crate) fn new(spool: &'s Spool<T>, late: u64, key: K) -> Self {
        Ordered {
            reader: spool.reader(),
            len: spool.len(),
            next: 0,
            held: Holdback::default(),
            latest: 0,
            late,
            key,
        }
    }

    /// Takes the next record in.
    fn take_one(&mut self) {
        let Some(record) = self.reader.get(self.next) else {
            // Unreadable: what was read stands.
            self.len = self.next;
            return;
        };
        if let Some(key) = (self.key)(&record) {
            self.latest = self.latest.max(key.0);
            self.held.push(key, record);
        }
        self.next += 1;
    }

    /// The next record in order, if its time is at or before `t`.
    pub(crate) fn next_until(&mut self, t: u64) -> Option<T> {
        loop {
            let unread = self.next < self.len;
            // Records not yet taken in come at `floor` or later.
            let floor = self.latest.saturating_sub(self.late);
            match self.held.first() {
                Some(top) if !unread || top.0 < floor => {
                    return match top.0 <= t {
                        true => self.held.pop(),
                        false => None,
                    };
                }
                Some(top) if top.0 > t && floor > t => return None,
                None if !unread || floor > t => return None,
                _ => self.take_one(),
            }
        }
    }

    /// Whether a record timed at or before `t` may still come.
    fn due(&self, t: u64) -> bool {
        self.held.first().is_some_and(|k| k.0 <= t)
            || (self.next < self.len && self.latest.saturating_sub(self.late) <= t)
    }

    /// Why part of the spool could not be read back, if it could not.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.reader.failed()
    }
}

type ByTime<T> = fn(&T) -> Option<(u64, u64)>;

/// The spooled work and calls, read in time order as the events move on.
pub struct GpuFeed<'s> {
    spools: &'s GpuSpools,
    plan: &'s Plan,
    work: Ordered<'s, WorkRec, ByTime<WorkRec>>,
    calls: Ordered<'s, CallRec, ByTime<CallRec>>,
}

impl GpuFeed<'_> {
    /// The next piece of work inside the recording starting at or before
    /// `t`, in start order (then in the order read).
    pub fn next_work(&mut self, t: u64) -> Option<Work> {
        loop {
            let w = self.work.next_until(t)?;
            if let Some(w) = self.spools.to_work(self.plan, &w) {
                return Some(w);
            }
        }
    }

    /// The next call inside the recording starting at or before `t`, in
    /// start order (then in the order read).
    pub fn next_call(&mut self, t: u64) -> Option<(Tid, Call)> {
        loop {
            let c = self.calls.next_until(t)?;
            if let Some(c) = self.spools.to_call(self.plan, &c) {
                return Some(c);
            }
        }
    }

    /// Whether anything starting at or before `t` may still come.
    pub fn due(&self, t: u64) -> bool {
        self.work.due(t) || self.calls.due(t)
    }

    /// Why part of the spooled records could not be read back, if so.
    pub fn failed(&self) -> Option<&str> {
        self.work.failed().or(self.calls.failed())
    }
}
