//! What would a fix buy? The run replayed with one cause's stalls taken
//! out, everything else kept at its recorded length and in its order.
//!
//! Removing a stall is not subtracting its idle time: what it hid comes to
//! light. A trainer that no longer waits for its loaders may now wait for
//! its own synchronize; host work that ran after a `.item()` still has to
//! run once the sync is gone, now beside the GPU's work. So the replay
//! rebuilds the run from its dependencies, per GPU:
//!
//! - the *feeder* (the thread that issued most of the GPU's work) and its
//!   account: every moment of it, GPU idle or not, classified by the
//!   attribution's own rules (`attribute::account`);
//! - the GPU work it issued, by stream, each item after the call that
//!   launched it and after the stream's previous item, for its recorded
//!   duration;
//! - its synchronizations, which wait for the work issued before them;
//! - its waits for other threads (loaders), and the loaders' pool: how many
//!   worked, and what their time went to (reading, receiving, computing,
//!   waiting for a CPU).
//!
//! A fix takes the cause's own time out: host work of that cause, launch
//! overhead, a synchronize's wait (its caller goes on; the work after it
//! stays), a pageable copy's staging and its waits. A loader pool that kept
//! the feeder waiting for most of the run sets the pace: its batches come as
//! fast as its work allows, and a fix or more workers change that work's
//! length (the computing part spread over no more than the CPUs the run had
//! spare). A pool that was mostly idle only adds latency: the fixed cause's
//! part of each wait goes.
//!
//! Limits: one feeder per GPU (others' work keeps its place relative to
//! it); GPUs are replayed one by one (a collective's wait for a slower rank
//! is kept as it was); a synchronize waits for all earlier work, not only
//! its stream's; a pool's batches are assumed alike.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::attribute::{Cause, Piece, Tid};
use super::diagnose::Diagnosis;
use crate::timeline::gpu::{ApiRole, Call, Device};
use crate::timeline::{OffKind, ThreadTimeline, Timeline};

/// A pool busy this share of the recording paced the feeder.
const POOL_BOUND: f64 = 0.75;
/// A copy call returning this close to its copy's end waited for it.
const SYNC_COPY_SLACK_NS: u64 = 50_000;

/// The change a replay tries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Plan {
    /// The cause whose stalls take no time.
    pub removed: Option<Cause>,
    /// Loader workers added to the pool.
    pub add_workers: u32,
}

impl Plan {
    pub fn fix(cause: Cause) -> Plan {
        Plan {
            removed: Some(cause),
            add_workers: 0,
        }
    }

    fn removes(&self, c: Cause) -> bool {
        self.removed == Some(c)
    }
}

/// A replayed run of one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// From the window's start to the end of the feeder's last moment or
    /// the GPU's last work, whichever is later.
    pub wall_ns: u64,
    pub busy_ns: u64,
    /// The replayed GPU's idle time by the cause the feeder's replayed
    /// account gives it.
    pub idle: BTreeMap<Cause, u64>,
}

/// The loaders that fed the feeder, as their time says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pool {
    /// Blocked reading files, receiving from the network, on a CPU, and
    /// waiting for one: summed over the pool's threads.
    pub io: u64,
    pub net: u64,
    pub cpu: u64,
    pub runnable: u64,
    /// The busiest thread's working time.
    pub busiest: u64,
}

impl Pool {
    fn add(&mut self, t: &ThreadTimeline) {
        let off = |k| t.off.get(&k).copied().unwrap_or(0);
        let (io, net) = (off(OffKind::File), off(OffKind::Net));
        self.io += io;
        self.net += net;
        self.cpu += t.on_cpu;
        self.runnable += t.runnable;
        self.busiest = self.busiest.max(io + net + t.on_cpu + t.runnable);
    }

    fn total(&self) -> u64 {
        self.io + self.net + self.cpu + self.runnable
    }

    /// Workers, counted by how much each worked (two busy workers and a
    /// thread that only passes batches on make about 2).
    pub fn workers(&self) -> f64 {
        if self.busiest == 0 {
            0.0
        } else {
            self.total() as f64 / self.busiest as f64
        }
    }

    /// The pool worked most of the window: its pace was the run's.
    fn paced(&self, window: u64) -> bool {
        self.busiest as f64 >= POOL_BOUND * window as f64
    }

    /// Time the pool needs per unit of the recorded output, with `workers`
    /// (`recorded` of them before) on `cpus` CPUs and `removed`'s part of
    /// its work gone. Computing spreads over workers up to the CPUs;
    /// waiting for a server spreads over workers (more requests in
    /// flight); reading storage does not: how many reads a device serves at
    /// once is not in the recording, so its throughput is held at the
    /// recorded one (more workers never look better than they are).
    fn service(&self, removed: Option<Cause>, workers: f64, recorded: f64, cpus: f64) -> f64 {
        let keep = |c: Cause, ns: u64| if removed == Some(c) { 0 } else { ns } as f64;
        let (io, cpu) = (
            keep(Cause::InputIo, self.io),
            keep(Cause::InputCpu, self.cpu),
        );
        let all = io
            + keep(Cause::InputNetwork, self.net)
            + cpu
            + keep(Cause::CpuContention, self.runnable);
        (all / workers)
            .max(cpu / workers.min(cpus).max(1e-9))
            .max(io / recorded)
    }

    /// What the pool's remaining work mostly is, once `removed` is gone.
    fn cause(&self, removed: Option<Cause>) -> Cause {
        let keep = |c: Cause, ns: u64| if removed == Some(c) { 0 } else { ns };
        [
            (keep(Cause::InputIo, self.io), Cause::InputIo),
            (keep(Cause::InputNetwork, self.net), Cause::InputNetwork),
            (
                keep(Cause::InputCpu, self.cpu) + keep(Cause::CpuContention, self.runnable),
                Cause::InputCpu,
            ),
        ]
        .into_iter()
        .max_by_key(|x| x.0)
        .map_or(Cause::InputCpu, |x| x.1)
    }
}

/// One GPU's run, as the replay reads it.
pub struct Run<'a> {
    pub window: (u64, u64),
    /// The GPU's recorded busy spans, disjoint and sorted.
    pub busy: &'a [(u64, u64)],
    pub feeder: Tid,
    /// The feeder's account over the window, in time order.
    pub account: &'a [Piece],
    /// The feeder's CUDA calls, by start.
    pub calls: &'a [Call],
    pub device: &'a Device,
    pub pool: Pool,
    /// CPUs the loaders could have: the machine's, less the feeder's share.
    pub spare_cpus: f64,
}

/// A piece of GPU work as the replay schedules it.
#[derive(Clone, Copy)]
struct Item {
    /// When it was issued: its launching call's start for the feeder's,
    /// its recorded start for the rest.
    issued: u64,
    recorded_start: u64,
    recorded_end: u64,
    dur: u64,
    stream: u32,
}

/// The replayed GPU: streams that run their work in order.
#[derive(Default)]
struct Gpu {
    free: HashMap<u32, u64>,
    /// When everything issued so far is done.
    done: u64,
    spans: Vec<(u64, u64)>,
}

impl Gpu {
    fn run(&mut self, ready: u64, it: &Item) -> u64 {
        let free = self.free.entry(it.stream).or_default();
        let start = ready.max(*free);
        let end = start + it.dur;
        *free = end;
        self.done = self.done.max(end);
        if it.dur > 0 {
            self.spans.push((start, end));
        }
        end
    }
}

/// The pool of loaders behind the feeder's waits in `account`, from their
/// threads' times. The feeder blocks only on the worker that is behind, so
/// the pool is the threads its waits led to and their siblings: the other
/// processes of the same parent and name (DataLoader's workers, forked
/// alike), every thread of those processes, and threads of the feeder's own
/// process named like one it waited on (a thread pool). With it, the CPU
/// time every other recorded thread took.
pub fn pool(feeder: Tid, account: &[Piece], tl: &Timeline) -> (Pool, u64) {
    let waited: HashSet<Tid> = account
        .iter()
        .filter_map(|p| p.thread)
        .filter(|&t| t != feeder)
        .collect();
    let processes = tl.all_processes();
    let kin = |pid: u32| {
        processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| (p.ppid, p.comm.as_str()))
    };
    let families: HashSet<(u32, &str)> = waited
        .iter()
        .filter(|t| t.0 != feeder.0)
        .filter_map(|t| kin(t.0))
        .collect();
    let threads = tl.all_threads();
    let named_in_feeder: HashSet<&str> = threads
        .iter()
        .filter(|t| t.pid == feeder.0 && waited.contains(&(t.pid, t.tid)))
        .map(|t| t.comm.as_str())
        .collect();
    let mut pool = Pool::default();
    let mut elsewhere = 0;
    for t in threads {
        let tid = (t.pid, t.tid);
        let member = if t.pid == feeder.0 {
            tid != feeder && (waited.contains(&tid) || named_in_feeder.contains(t.comm.as_str()))
        } else {
            waited.contains(&tid) || kin(t.pid).is_some_and(|k| families.contains(&k))
        };
        if member {
            pool.add(t);
        } else {
            elsewhere += t.on_cpu;
        }
    }
    (pool, elsewhere)
}

impl Run<'_> {
    /// The pool's pace under `plan`, relative to the recorded one.
    fn pace(&self, plan: &Plan) -> f64 {
        let k = self.pool.workers();
        if k == 0.0 {
            return 1.0;
        }
        let before = self.pool.service(None, k, k, self.spare_cpus);
        let after = self.pool.service(
            plan.removed,
            k + plan.add_workers as f64,
            k,
            self.spare_cpus,
        );
        if before <= 0.0 {
            1.0
        } else {
            after / before
        }
    }

    fn items(&self) -> (Vec<Item>, Vec<Item>) {
        let (mut mine, mut others) = (Vec::new(), Vec::new());
        for w in &self.device.work {
            let (start, end) = w.span();
            let it = |issued| Item {
                issued,
                recorded_start: start,
                recorded_end: end,
                dur: end.saturating_sub(start),
                stream: w.stream(),
            };
            match w.launch {
                Some((t, at)) if t == self.feeder => mine.push(it(at)),
                _ => others.push(it(start)),
            }
        }
        mine.sort_by_key(|i| i.issued);
        others.sort_by_key(|i| i.issued);
        (mine, others)
    }

    /// The feeder's call starting at or containing `t`, if it launches,
    /// synchronizes or copies.
    fn call_at(&self, t: u64) -> Option<&Call> {
        let i = self.calls.partition_point(|c| c.start <= t);
        self.calls[..i]
            .iter()
            .rev()
            .take(4)
            .find(|c| c.end > t && c.role != ApiRole::Other)
    }

    /// Recorded GPU idle time inside `[a, b)`.
    fn idle_within(&self, a: u64, b: u64) -> u64 {
        (b.saturating_sub(a)).saturating_sub(crate::intervals::total(&crate::intervals::clip(
            self.busy, a, b,
        )))
    }

    pub fn replay(&self, plan: &Plan) -> Outcome {
        let (t0, t1) = self.window;
        let (first, last) = match (self.busy.first(), self.busy.last()) {
            (Some(f), Some(l)) => (f.0, l.1),
            _ => return Outcome::default(),
        };
        let pace = self.pace(plan);
        let paced = self.pool.paced(t1.saturating_sub(t0));
        let (mine, others) = self.items();
        let (mut mi, mut oi) = (0, 0);
        let mut gpu = Gpu::default();
        let mut h = t0;
        // The replayed account: (start, end, cause), in order.
        let mut log: Vec<(u64, u64, Cause)> = Vec::new();
        let note = |log: &mut Vec<(u64, u64, Cause)>, a: u64, b: u64, c: Cause| {
            if b > a {
                log.push((a, b, c));
            }
        };
        let mut after_sync = false;
        let mut skip_until = 0;
        let mut i = 0;
        while i < self.account.len() {
            let p = self.account[i];
            // What was issued before this moment goes now.
            while mi < mine.len() && mine[mi].issued < p.start {
                gpu.run(h, &mine[mi]);
                mi += 1;
            }
            while oi < others.len() && others[oi].issued < p.start {
                gpu.run(h, &others[oi]);
                oi += 1;
            }
            if p.end <= skip_until {
                i += 1;
                continue;
            }
            // A wait for the loaders: the whole run of pieces another thread
            // decided.
            if p.thread.is_some_and(|t| t != self.feeder) {
                let mut latency = 0;
                let mut e = p.start;
                while let Some(q) = self
                    .account
                    .get(i)
                    .filter(|q| q.thread.is_some_and(|t| t != self.feeder))
                {
                    if !plan.removes(q.cause) {
                        latency += q.end - q.start;
                    }
                    e = q.end;
                    i += 1;
                }
                let ready = if paced {
                    h.max(t0 + ((e - t0) as f64 * pace) as u64)
                } else {
                    h + latency
                };
                note(&mut log, h, ready, self.pool.cause(plan.removed));
                h = ready;
                continue;
            }
            if let Some(call) = self.call_at(p.start) {
                skip_until = call.end;
                let issued = |mi: usize| {
                    mine[mi..]
                        .iter()
                        .take_while(|it| it.issued < call.end)
                        .count()
                };
                match call.role {
                    ApiRole::Launch => {
                        let cost = if plan.removes(Cause::CpuLaunch) {
                            0
                        } else {
                            call.end - call.start
                        };
                        note(&mut log, h, h + cost, Cause::CpuLaunch);
                        h += cost;
                        after_sync = false;
                        for _ in 0..issued(mi) {
                            gpu.run(h, &mine[mi]);
                            mi += 1;
                        }
                    }
                    ApiRole::Sync => {
                        if !plan.removes(Cause::Sync) {
                            let w = h.max(gpu.done);
                            note(&mut log, h, w, Cause::Sync);
                            after_sync = w > h;
                            h = w;
                        }
                    }
                    ApiRole::Memory => {
                        let n = issued(mi);
                        let copies = &mine[mi..mi + n];
                        let waited = copies
                            .iter()
                            .map(|c| c.recorded_end)
                            .max()
                            .is_some_and(|end| call.end + SYNC_COPY_SLACK_NS >= end);
                        if plan.removes(Cause::Memory) {
                            // From pinned memory: issued, not waited for.
                            for c in copies {
                                gpu.run(h, c);
                            }
                        } else if waited {
                            // A pageable copy: the queue drains, the host
                            // stages the data, the GPU copies it, the call
                            // returns.
                            let first_copy = copies.iter().map(|c| c.recorded_start).min();
                            let staging = self.idle_within(
                                call.start,
                                first_copy.unwrap_or(call.end).min(call.end),
                            );
                            let drained = h.max(gpu.done);
                            let staged = drained + staging;
                            let mut end = staged;
                            for c in copies {
                                end = end.max(gpu.run(staged, c));
                            }
                            note(&mut log, h, end, Cause::Memory);
                            h = end;
                        } else {
                            let cost = call.end - call.start;
                            note(&mut log, h, h + cost, Cause::Memory);
                            h += cost;
                            for c in copies {
                                gpu.run(h, c);
                            }
                        }
                        mi += n;
                    }
                    ApiRole::Other => unreachable!("call_at skips them"),
                }
                i += 1;
                continue;
            }
            // The feeder's own time outside those calls.
            let d = p.end - p.start;
            let inside = p.start >= first && p.start < last;
            match p.cause {
                // Blocked in the driver, waiting for the GPU.
                Cause::Sync => {
                    if !plan.removes(Cause::Sync) {
                        let w = h.max(gpu.done);
                        note(&mut log, h, w, Cause::Sync);
                        h = w;
                    }
                }
                c if inside && plan.removes(c) => {}
                c => {
                    let c = if after_sync && c == Cause::CpuHost {
                        Cause::Sync
                    } else {
                        c
                    };
                    note(&mut log, h, h + d, c);
                    h += d;
                }
            }
            i += 1;
        }
        for it in mine[mi..].iter().chain(&others[oi..]) {
            gpu.run(h, it);
        }
        let end = h.max(gpu.done);
        outcome(t0, end, gpu.spans, &log)
    }
}

/// The replayed GPU's busy and idle time, its idle split by the replayed
/// account: before its first work start-up, after its last tear-down, and
/// in between whatever the feeder was doing.
fn outcome(t0: u64, end: u64, spans: Vec<(u64, u64)>, log: &[(u64, u64, Cause)]) -> Outcome {
    let busy = crate::intervals::union(spans);
    let mut idle: BTreeMap<Cause, u64> = BTreeMap::new();
    let (Some(&(first, _)), Some(&(_, last))) = (busy.first(), busy.last()) else {
        return Outcome {
            wall_ns: end - t0,
            busy_ns: 0,
            idle: BTreeMap::from([(Cause::Unattributed, end - t0)]),
        };
    };
    *idle.entry(Cause::Startup).or_default() += first - t0;
    *idle.entry(Cause::Teardown).or_default() += end - last;
    let mut j = 0;
    for w in busy.windows(2) {
        let (a, b) = (w[0].1, w[1].0);
        let mut covered = 0;
        while j < log.len() && log[j].1 <= a {
            j += 1;
        }
        for &(s, e, c) in log[j..].iter().take_while(|x| x.0 < b) {
            let (s, e) = (s.max(a), e.min(b));
            if e > s {
                *idle.entry(c).or_default() += e - s;
                covered += e - s;
            }
        }
        if b - a > covered {
            *idle.entry(Cause::Unattributed).or_default() += b - a - covered;
        }
    }
    idle.retain(|_, ns| *ns > 0);
    Outcome {
        wall_ns: end - t0,
        busy_ns: crate::intervals::total(&busy),
        idle,
    }
}

/// Every GPU of a recording, ready to replay.
pub struct Job<'a> {
    runs: Vec<Run<'a>>,
    /// Each run replayed unchanged: how far the replay is from the record.
    baseline: Vec<Outcome>,
    recorded: u64,
}

/// A plan's outcome for the whole job.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The job's wall time under the plan: each GPU's replayed wall scaled
    /// by how its unchanged replay compares with the record (what the
    /// replay does not model stays as it was), the slowest GPU's.
    pub wall_ns: u64,
    /// Its replayed idle time by cause, per GPU on average, and the
    /// replayed wall it is a share of.
    pub idle: BTreeMap<Cause, u64>,
    pub replayed_wall_ns: u64,
}

impl<'a> Job<'a> {
    /// `nr_cpus`: the recorded machine's CPUs (0 when not recorded: the
    /// loaders are then not bounded by CPUs); `collector_cpu_ns`: what the
    /// recorder itself took of them.
    pub fn new(tl: &'a Timeline, d: &'a Diagnosis, nr_cpus: u32, collector_cpu_ns: u64) -> Job<'a> {
        let window = (tl.start, tl.end);
        let span = tl.end.saturating_sub(tl.start).max(1);
        let runs: Vec<Run<'a>> = d
            .gpus
            .iter()
            .filter_map(|g| {
                let f = g.feeder.as_ref()?;
                let device = tl.gpu.devices.iter().find(|x| x.id == g.gpu.device)?;
                let (pool, elsewhere) = pool(f.tid, &f.account, tl);
                let taken = (elsewhere + collector_cpu_ns) as f64 / span as f64;
                let spare_cpus = if nr_cpus == 0 {
                    f64::INFINITY
                } else {
                    (nr_cpus as f64 - taken).max(1.0)
                };
                Some(Run {
                    window,
                    busy: &g.gpu.busy,
                    feeder: f.tid,
                    account: &f.account,
                    calls: tl.gpu.calls.get(&f.tid).map_or(&[], Vec::as_slice),
                    device,
                    pool,
                    spare_cpus,
                })
            })
            .collect();
        let baseline = runs.iter().map(|r| r.replay(&Plan::default())).collect();
        Job {
            runs,
            baseline,
            recorded: span,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Loader workers of the busiest pool (0 without one).
    pub fn workers(&self) -> f64 {
        self.runs
            .iter()
            .map(|r| r.pool.workers())
            .fold(0.0, f64::max)
    }

    /// The unchanged replay's wall over the recorded one (1 is exact).
    pub fn fidelity(&self) -> f64 {
        let replayed = self.baseline.iter().map(|o| o.wall_ns).max().unwrap_or(0);
        replayed as f64 / self.recorded as f64
    }

    pub fn predict(&self, plan: &Plan) -> Prediction {
        let mut wall = 0u64;
        let mut replayed = 0u64;
        let mut idle: BTreeMap<Cause, u64> = BTreeMap::new();
        for (run, base) in self.runs.iter().zip(&self.baseline) {
            let o = run.replay(plan);
            let scale = self.recorded as f64 / base.wall_ns.max(1) as f64;
            wall = wall.max((o.wall_ns as f64 * scale).round() as u64);
            replayed = replayed.max(o.wall_ns);
            for (c, ns) in o.idle {
                *idle.entry(c).or_default() += ns / self.runs.len() as u64;
            }
        }
        Prediction {
            wall_ns: wall,
            idle,
            replayed_wall_ns: replayed,
        }
    }
}
