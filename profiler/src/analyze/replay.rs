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
//! GPUs of the recording whose collectives waited for each other are
//! replayed together (`analyze::lockstep`): each collective starts when
//! the last GPU reaches it and moves its data for its recorded time less
//! its recorded wait.
//!
//! Limits: one feeder per GPU (others' work keeps its place relative to
//! it); a wait for a rank recorded elsewhere is kept as it was; a
//! synchronize waits for all earlier work, not only
//! its stream's; a pool's batches are assumed alike.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::account::{self, Account, Moment, Who};
use super::attribute::{Cause, Tid};
use super::diagnose::Diagnosis;
use super::lockstep::Meeting;
use crate::spool::Spool;
use crate::timeline::gpu::{ApiRole, Call, CallName, Device, What, Work};
use crate::timeline::spooled::{GpuSpools, Plan as SpoolPlan};
use crate::timeline::{IoTally, OffKind, ThreadTimeline, Timeline};
use gapscope_wire::record::memory_kind;
use gapscope_wire::ApiDomain;

/// A pool busy this share of the recording paced the feeder.
const POOL_BOUND: f64 = 0.75;
/// Work starting this soon after other work ended is taken to have waited
/// for it.
const DEPENDENCY_SLACK_NS: u64 = 20_000;
/// A copy call returning this close to its copy's end waited for it.
const SYNC_COPY_SLACK_NS: u64 = 50_000;
/// Moments of the feeder's account replayed between two tallies of what
/// the replayed GPU did (and lettings go of what it is past).
const SETTLE_EVERY: usize = 4096;
/// How far before the earliest moment a replay still reads it keeps the
/// replayed ends of the GPU's work: what a synchronize or a dependency
/// there asks about.
const LOOKBACK_MARGIN_NS: u64 = 1_000_000;

/// The change a replay tries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Plan {
    /// The cause whose stalls take no time.
    pub removed: Option<Cause>,
    /// Loader workers added to the pool.
    pub add_workers: u32,
    /// The feeder given a CPU of its own: its waits for CPUs other
    /// processes held are gone (its loaders' stay). What a fix that stops
    /// it sleeping gives on a busy machine if the scheduler leaves it
    /// alone on a CPU: a thread that sleeps every step is woken onto a CPU
    /// beside a busy neighbour and shares it, one that never sleeps is one
    /// of three always-runnable tasks on two CPUs, and which of them runs
    /// alone is the scheduler's placement (beside two busy loops the same
    /// fixed run took 1.26 to 2.64 s, its CPU time 1.1 s each time). Its
    /// loaders' waits on waking from the blocks the fix takes out go too
    /// ([`Woken::WithBlock`]), where that is the nearer end.
    pub own_cpu: bool,
    /// Added workers win no CPU from their scheduling group's other tasks,
    /// only what sat idle: on a busy machine the other end of the range
    /// of what more workers give. The kernel gives a worker that sleeps
    /// and wakes less than a busy loop that never sleeps, by an amount
    /// that moves with the program and its neighbours (beside two busy
    /// loops a second worker got 0.32 to 0.47 of a CPU): the prediction
    /// counts them at a worker's rate, and this end not at all.
    pub group_keeps_cpus: bool,
}

impl Plan {
    pub fn fix(cause: Cause) -> Plan {
        Plan {
            removed: Some(cause),
            ..Plan::default()
        }
    }

    /// [`Plan::fix`] with the feeder on a CPU of its own.
    pub fn fix_on_own_cpu(cause: Cause) -> Plan {
        Plan {
            own_cpu: true,
            ..Plan::fix(cause)
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
    /// the GPU's last work, whichever is later, and the recorded stretch
    /// after both (the process exiting).
    pub wall_ns: u64,
    pub busy_ns: u64,
    /// Of it, collectives waiting for other GPUs.
    pub waiting_ns: u64,
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
    /// On a CPU, whatever for, summed over the pool's threads.
    pub on_cpu: u64,
    /// Of it, moving data: in `io` and `net` too.
    pub cpu_io: u64,
    pub cpu_net: u64,
    /// Of `runnable`, the waits for a CPU that followed a read and a
    /// receive (the thread woken, not yet running): see [`Woken`].
    pub runnable_io: u64,
    pub runnable_net: u64,
    /// The busiest thread's working time, and its lifetime in the window.
    pub busiest: u64,
    pub busiest_life: u64,
    /// When its busiest thread began: the pool's pace runs from there.
    pub start: u64,
}

impl Pool {
    /// `tally`: where its samples found it on a CPU.
    fn add(&mut self, t: &ThreadTimeline, tally: IoTally) {
        let off = |k| t.off.get(&k).copied().unwrap_or(0);
        // Its time on a CPU moving data goes with the reading and receiving
        // (as the attribution splits it): a fix that does without the
        // reads takes that CPU time out too, one that decodes faster not.
        let (cpu_io, cpu_net, cpu) = tally.split(t.on_cpu);
        let (io, net) = (off(OffKind::File) + cpu_io, off(OffKind::Net) + cpu_net);
        self.io += io;
        self.net += net;
        self.cpu += cpu;
        // A CPU taken from it (steal) is waiting for a CPU too.
        let runnable = t.runnable + t.stolen;
        self.runnable += runnable;
        let after = |k| t.runnable_after.get(&k).copied().unwrap_or(0);
        self.runnable_io += after(OffKind::File);
        self.runnable_net += after(OffKind::Net);
        self.on_cpu += t.on_cpu;
        self.cpu_io += cpu_io;
        self.cpu_net += cpu_net;
        let work = io + net + cpu + runnable;
        if work > self.busiest {
            self.busiest = work;
            self.busiest_life = t.end.saturating_sub(t.start);
            self.start = t.start;
        }
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

    /// The share of its CPU work it got a CPU for: on a CPU, of on a CPU
    /// or waiting for one. A worker that waited for a CPU a tenth of that
    /// time computed on nine tenths of one (its waits for its reads or for
    /// a full queue are not asking for a CPU). Without a count of its CPU
    /// time, all of it.
    pub fn cpu_share(&self) -> f64 {
        let asked = self.on_cpu + self.runnable;
        if self.on_cpu == 0 || asked == 0 {
            1.0
        } else {
            self.on_cpu as f64 / asked as f64
        }
    }

    /// Its time with `removed`'s part taken out (io: input.io, net:
    /// input.network, cpu: input.cpu, runnable: cpu.contention). Its waits
    /// for a CPU go with the CPU work they delayed: a fix that takes out
    /// part of the pool's CPU time takes that share of them too; those on
    /// waking from a read or a receive as `woken` says.
    fn without(&self, removed: Option<Cause>, woken: Woken) -> Pool {
        let keep = |c: Cause, ns: u64| if removed == Some(c) { 0 } else { ns };
        let on_cpu = keep(Cause::InputIo, self.cpu_io)
            + keep(Cause::InputNetwork, self.cpu_net)
            + keep(Cause::InputCpu, self.on_cpu - self.cpu_io - self.cpu_net);
        let scaled = |ns: u64| match self.on_cpu {
            0 => ns,
            all => (ns as u128 * on_cpu as u128 / all as u128) as u64,
        };
        let runnable = match woken {
            Woken::WithWork => scaled(self.runnable),
            Woken::WithBlock => {
                let after_blocks = self.runnable_io + self.runnable_net;
                keep(Cause::InputIo, self.runnable_io)
                    + keep(Cause::InputNetwork, self.runnable_net)
                    + scaled(self.runnable.saturating_sub(after_blocks))
            }
        };
        Pool {
            io: keep(Cause::InputIo, self.io),
            net: keep(Cause::InputNetwork, self.net),
            cpu: keep(Cause::InputCpu, self.cpu),
            runnable: keep(Cause::CpuContention, runnable),
            on_cpu,
            cpu_io: keep(Cause::InputIo, self.cpu_io),
            cpu_net: keep(Cause::InputNetwork, self.cpu_net),
            runnable_io: keep(Cause::InputIo, self.runnable_io),
            runnable_net: keep(Cause::InputNetwork, self.runnable_net),
            ..*self
        }
    }

    /// The pool worked most of its life: its pace was the run's.
    fn paced(&self) -> bool {
        self.busiest > 0 && self.busiest as f64 >= POOL_BOUND * self.busiest_life as f64
    }

    /// Time the pool needs per unit of the recorded output, with `workers`
    /// (`recorded` of them before) on `cpus` CPUs and `removed`'s part of
    /// its work gone. Each worker does its steps one after another —
    /// reading, waiting for a CPU, computing — and the workers side by
    /// side; computing spreads over workers up to the CPUs; waiting for a
    /// server spreads over workers (more requests in flight); reading
    /// storage does not: how many reads a device serves at once is not in
    /// the recording, so its throughput is held at the recorded one (more
    /// workers never look better than they are).
    ///
    /// The same workers' waits for a CPU are in their own steps (`waits`):
    /// two workers that each read, then waited for a CPU beside busy
    /// neighbours, then computed, gain the whole reading time when the
    /// reads go, although their CPU share stays what it was. More workers'
    /// waits are not known (each waits longer for the same CPUs): the
    /// CPUs' limit alone bounds them, for the recorded pool and the new.
    fn service(
        &self,
        removed: Option<Cause>,
        woken: Woken,
        workers: f64,
        recorded: f64,
        cpus: f64,
        waits: bool,
    ) -> f64 {
        let k = self.without(removed, woken);
        let (io, cpu) = (k.io as f64, k.cpu as f64);
        let waited = if waits { k.runnable } else { 0 };
        let steps = (k.io + k.net + k.cpu + waited) as f64;
        (steps / workers)
            .max(cpu / workers.min(cpus).max(1e-9))
            .max(io / recorded)
    }

    /// What the pool's remaining work mostly is, once `removed` is gone.
    fn cause(&self, removed: Option<Cause>) -> Cause {
        let k = self.without(removed, Woken::WithWork);
        [
            (k.io, Cause::InputIo),
            (k.net, Cause::InputNetwork),
            (k.cpu + k.runnable, Cause::InputCpu),
        ]
        .into_iter()
        .max_by_key(|x| x.0)
        .map_or(Cause::InputCpu, |x| x.1)
    }
}

/// Where a worker's waits for a CPU on waking from a read or a receive go
/// when a fix takes part of its work out. Which is nearer depends on how
/// the kernel shares the CPUs between a worker that blocks often and its
/// busy neighbours, which the recording does not say: a real DataLoader
/// worker beside two busy loops, reading cold PNGs, waited 2.1 s for a CPU
/// as its reads ended and 1.8 s in the rest of its work; with the files
/// cached it waited 2.6 and 3.2 s in all (two runs) — about half of those
/// waits went with the reads. simtrain's loaders there, reading 12 MiB a
/// batch, then decoding, waited 3.4 s less without the reads, where their
/// waits on waking were 0.6 s: a worker that blocks often gets less of the
/// CPUs its group shares than one that does not.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Woken {
    /// With the work, as the rest of its waits: the pool keeps the share
    /// of the CPUs it got (the prediction).
    WithWork,
    /// With the block they ended (a fix's other end, on a busy machine).
    WithBlock,
}

/// One GPU's run, as the replay reads it.
pub struct Run<'a> {
    pub window: (u64, u64),
    /// The GPU's recorded busy spans, disjoint and sorted.
    pub busy: &'a [(u64, u64)],
    pub feeder: Tid,
    /// The feeder's account over the window, in time order.
    pub account: &'a Account,
    /// The feeder's CUDA calls, by start.
    pub calls: Calls<'a>,
    /// The GPU's work, in the order it is issued.
    pub work: Issued<'a>,
    pub pool: Pool,
    /// CPUs the loaders could have: the machine's, less the feeder's share.
    pub spare_cpus: f64,
    /// CPUs that sat idle while they worked, on average (infinite when not
    /// recorded): more workers could have them.
    pub idle_cpus: f64,
    /// CPUs unrecorded tasks in the job's own scheduling group held while
    /// the loaders worked, on average (0 when not recorded): more workers
    /// win a share of them, thread by thread.
    pub group_cpus: f64,
    /// `work` and `calls` as every replay reads them, spooled by the first.
    pub prepared: std::sync::OnceLock<Prepared>,
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
    /// A copy from or to pageable host memory: its call stages the data and
    /// returns once it is copied, asynchronous or not.
    pageable: bool,
    /// Of `dur`: a collective waiting for the last GPU to start its own.
    waiting: u64,
    /// A collective every GPU of the recording ran: its number.
    meet: Option<usize>,
}

/// An [`Item`] as spooled for the replays (see [`Prepared`]).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct ItemRec {
    issued: u64,
    recorded_start: u64,
    recorded_end: u64,
    waiting: u64,
    /// u64::MAX for none.
    meet: u64,
    stream: u32,
    pageable: u32,
}

impl From<Item> for ItemRec {
    fn from(it: Item) -> ItemRec {
        ItemRec {
            issued: it.issued,
            recorded_start: it.recorded_start,
            recorded_end: it.recorded_end,
            waiting: it.waiting,
            meet: it.meet.map_or(u64::MAX, |m| m as u64),
            stream: it.stream,
            pageable: it.pageable as u32,
        }
    }
}

impl From<ItemRec> for Item {
    fn from(r: ItemRec) -> Item {
        Item {
            issued: r.issued,
            recorded_start: r.recorded_start,
            recorded_end: r.recorded_end,
            dur: r.recorded_end.saturating_sub(r.recorded_start),
            stream: r.stream,
            pageable: r.pageable != 0,
            waiting: r.waiting,
            meet: (r.meet != u64::MAX).then_some(r.meet as usize),
        }
    }
}

/// A feeder's call as the replay reads it.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct CallRec {
    start: u64,
    end: u64,
    /// Its place in [`ROLES`].
    role: u8,
    /// cudaDeviceSynchronize and the like, not cudaStreamWaitEvent.
    synchronizes: u8,
    /// An ...Async copy.
    asynchronous: u8,
    _pad: [u8; 5],
}

const ROLES: [ApiRole; 4] = [
    ApiRole::Launch,
    ApiRole::Sync,
    ApiRole::Memory,
    ApiRole::Other,
];

impl CallRec {
    /// `c` as the replay reads it; `named`: what a CUPTI call's name says
    /// (whether it synchronizes, whether it is asynchronous) by its id,
    /// looked up once per id (a long run makes millions of calls of a few
    /// dozen functions).
    fn of(c: &Call, named: &mut HashMap<(ApiDomain, u32), (bool, bool)>) -> CallRec {
        let says = |name: &str| (name.contains("Synchronize"), name.contains("Async"));
        let (synchronizes, asynchronous) = match &c.name {
            &CallName::Api(domain, cbid) => *named
                .entry((domain, cbid))
                .or_insert_with(|| says(&c.name.name())),
            CallName::Uprobe(_) => says(&c.name.name()),
        };
        CallRec {
            start: c.start,
            end: c.end,
            role: ROLES.iter().position(|&r| r == c.role).unwrap_or(3) as u8,
            synchronizes: synchronizes as u8,
            asynchronous: asynchronous as u8,
            _pad: [0; 5],
        }
    }
}

impl CallRec {
    fn role(&self) -> ApiRole {
        ROLES
            .get(self.role as usize)
            .copied()
            .unwrap_or(ApiRole::Other)
    }
}

/// A run's GPU work and its feeder's calls as every replay of it reads
/// them, spooled once: the feeder's work in the order it launched it, the
/// rest in start order, each item as the replay schedules it.
#[derive(Default)]
pub struct Prepared {
    mine: Spool<ItemRec>,
    others: Spool<ItemRec>,
    calls: Spool<CallRec>,
}

/// A GPU's work as the replay issues it: the feeder's, by its launching
/// call's start; the rest, by its recorded start. Read once, in that order,
/// into a run's [`Prepared`] spools: a copy of every item would hold the
/// GPU's work twice over a long run.
pub struct Issued<'a> {
    /// The device's collectives waiting for the other GPUs, and those
    /// matched with theirs (`GpuTimeline`'s).
    waiting: &'a [(u64, u64)],
    met: &'a [(u64, usize)],
    from: IssuedFrom<'a>,
}

enum IssuedFrom<'a> {
    /// The device's work held whole, and indices into it, each in the
    /// order it is issued.
    Memory {
        work: &'a [Work],
        mine: Vec<usize>,
        others: Vec<usize>,
    },
    /// A long recording's, read back from where its first pass spooled it.
    Spooled {
        spools: &'a GpuSpools,
        plan: &'a SpoolPlan,
        device: u32,
        feeder: Tid,
    },
}

impl<'a> Issued<'a> {
    pub fn of(
        device: &'a Device,
        feeder: Tid,
        waiting: &'a [(u64, u64)],
        met: &'a [(u64, usize)],
    ) -> Issued<'a> {
        let work = device.work.as_slice();
        let (mut mine, mut others): (Vec<usize>, Vec<usize>) =
            (0..work.len()).partition(|&k| is_mine(&work[k], feeder));
        // Stable: items issued at once keep the device's order.
        mine.sort_by_key(|&k| issued_at(&work[k], true));
        others.sort_by_key(|&k| issued_at(&work[k], false));
        mine.shrink_to_fit();
        others.shrink_to_fit();
        Issued {
            waiting,
            met,
            from: IssuedFrom::Memory { work, mine, others },
        }
    }

    /// A long recording's work on `device`, read back from its spools.
    pub fn spooled(
        spools: &'a GpuSpools,
        plan: &'a SpoolPlan,
        device: u32,
        feeder: Tid,
        waiting: &'a [(u64, u64)],
        met: &'a [(u64, usize)],
    ) -> Issued<'a> {
        Issued {
            waiting,
            met,
            from: IssuedFrom::Spooled {
                spools,
                plan,
                device,
                feeder,
            },
        }
    }

    /// Spools the feeder's items (`mine`) or the others', in issue order.
    fn spool(&self, mine: bool) -> Spool<ItemRec> {
        let mut out = Spool::default();
        match &self.from {
            IssuedFrom::Memory {
                work,
                mine: m,
                others,
            } => {
                for &k in if mine { m } else { others } {
                    out.push(self.item(&work[k], mine).into());
                }
            }
            &IssuedFrom::Spooled {
                spools,
                plan,
                device,
                feeder,
            } if mine => {
                for w in spools.launched_by(plan, device, feeder) {
                    out.push(self.item(&w, true).into());
                }
            }
            &IssuedFrom::Spooled {
                spools,
                plan,
                device,
                feeder,
            } => {
                for w in spools.launched_by_others(plan, device, feeder) {
                    out.push(self.item(&w, false).into());
                }
            }
        }
        out
    }

    fn item(&self, w: &Work, mine: bool) -> Item {
        let (start, end) = w.span();
        Item {
            issued: issued_at(w, mine),
            recorded_start: start,
            recorded_end: end,
            dur: end.saturating_sub(start),
            stream: w.stream(),
            pageable: matches!(
                w.what,
                What::Memcpy { src_kind, dst_kind, .. }
                    if src_kind == memory_kind::PAGEABLE || dst_kind == memory_kind::PAGEABLE
            ),
            waiting: crate::intervals::within(self.waiting, start, end),
            meet: self
                .met
                .binary_search_by_key(&start, |m| m.0)
                .ok()
                .filter(|_| w.kernel().is_some())
                .map(|i| self.met[i].1),
        }
    }

    /// Whether any of its collectives waited for another GPU. (The waits
    /// are spans of its own collectives' kernels, the empty ones left out.)
    fn waited(&self) -> bool {
        !self.waiting.is_empty()
    }
}

/// Items as one replay reads them, by their place in issue order.
struct Queue<'q>(crate::spool::Reader<'q, ItemRec>);

impl Queue<'_> {
    fn get(&mut self, i: usize) -> Option<Item> {
        self.0.get(i).map(Item::from)
    }

    /// How many items from the `i`th on are issued before `t`.
    fn issued_before(&mut self, i: usize, t: u64) -> usize {
        (i..)
            .take_while(|&k| self.get(k).is_some_and(|it| it.issued < t))
            .count()
    }
}

/// The feeder's calls, as the replay reads them: held whole, or read back
/// from a long recording's spools as the replay reaches them.
pub enum Calls<'a> {
    Memory(&'a [Call]),
    Spooled {
        spools: &'a GpuSpools,
        plan: &'a SpoolPlan,
        feeder: Tid,
    },
}

impl<'a> From<&'a [Call]> for Calls<'a> {
    fn from(calls: &'a [Call]) -> Calls<'a> {
        Calls::Memory(calls)
    }
}

impl Calls<'_> {
    fn spool(&self) -> Spool<CallRec> {
        let mut out = Spool::default();
        let mut named = HashMap::new();
        match self {
            Calls::Memory(c) => c.iter().for_each(|c| out.push(CallRec::of(c, &mut named))),
            &Calls::Spooled {
                spools,
                plan,
                feeder,
            } => spools
                .calls_of(plan, feeder)
                .for_each(|c| out.push(CallRec::of(&c, &mut named))),
        }
        out
    }
}

/// The feeder's calls around the moments a replay is at.
struct CallWindow<'c> {
    calls: crate::spool::Reader<'c, CallRec>,
    /// Calls starting at or before the last moment asked about.
    before: usize,
}

impl CallWindow<'_> {
    /// The feeder's call starting at or containing `t`, if it launches,
    /// synchronizes or copies.
    fn at(&mut self, t: u64) -> Option<CallRec> {
        while self.calls.get(self.before).is_some_and(|c| c.start <= t) {
            self.before += 1;
        }
        while self.before > 0 && self.calls.get(self.before - 1).is_some_and(|c| c.start > t) {
            self.before -= 1;
        }
        // The last few: a runtime call and the driver calls in it.
        (self.before.saturating_sub(4)..self.before)
            .rev()
            .filter_map(|k| self.calls.get(k))
            .find(|c| c.end > t && c.role() != ApiRole::Other)
    }

    /// Where the calls the last moment asked about may start: a few back.
    fn held_from(&mut self, t: u64) -> u64 {
        self.calls
            .get(self.before.saturating_sub(4))
            .map_or(t, |c| c.start.min(t))
    }
}

/// Whether the feeder launched `w`.
fn is_mine(w: &Work, feeder: Tid) -> bool {
    matches!(w.launch, Some((t, _)) if t == feeder)
}

/// When the replay issues `w`: the feeder's by its launching call's start,
/// the rest by its recorded start.
fn issued_at(w: &Work, mine: bool) -> u64 {
    match w.launch {
        Some((_, at)) if mine => at,
        _ => w.start(),
    }
}

/// How a replayed GPU's collectives meet the other GPUs'.
#[derive(Clone, Copy, Default)]
enum Peers<'m> {
    /// Each waits as long as it did.
    #[default]
    AsRecorded,
    /// The others are there on time: no wait.
    OnTime,
    /// Replayed beside them: each starts when the last GPU reaches it.
    Met(&'m Meeting),
}

/// The replayed GPU: streams that run their work in order.
#[derive(Default)]
struct Gpu<'m> {
    peers: Peers<'m>,
    /// Its collectives' time waiting for the other GPUs, summed.
    waiting: u64,
    free: StreamsFree,
    /// When everything issued so far is done.
    done: u64,
    spans: Vec<(u64, u64)>,
    /// Each item's replayed end by its recorded end.
    ends: Ends,
}

/// Replayed ends by recorded end, sorted: items come nearly in recorded
/// order, so each goes in at the back (a B-tree took a tenth of a long
/// replay's time).
#[derive(Default)]
struct Ends(std::collections::VecDeque<(u64, u64)>);

impl Ends {
    /// Work recorded to end at `at` ended at `end`, replayed (the latest
    /// of those recorded to end then).
    fn put(&mut self, at: u64, end: u64) {
        match self.0.back_mut() {
            Some(b) if b.0 < at => self.0.push_back((at, end)),
            Some(b) if b.0 == at => b.1 = b.1.max(end),
            None => self.0.push_back((at, end)),
            Some(_) => match self.0.binary_search_by_key(&at, |x| x.0) {
                Ok(i) => self.0[i].1 = self.0[i].1.max(end),
                Err(i) => self.0.insert(i, (at, end)),
            },
        }
    }

    /// The replayed end of the work recorded to end last at or before `t`,
    /// if it ended at `from` or later.
    fn last(&self, from: u64, t: u64) -> Option<u64> {
        // Asked about the time of work just issued, or of a wait just
        // ended: the answer is nearly always among the last few ends, and
        // searching the whole window for it was a sixth of the replays.
        let n = self.0.len();
        let near = self.0.range(n.saturating_sub(8)..).rposition(|x| x.0 <= t);
        let i = match near {
            Some(k) => n.saturating_sub(8) + k,
            None => self.0.partition_point(|x| x.0 <= t).checked_sub(1)?,
        };
        let (at, end) = self.0[i];
        (at >= from).then_some(end)
    }

    /// Lets go of the ends recorded before `t` but the last of them.
    fn let_go(&mut self, t: u64) {
        let k = self.0.partition_point(|x| x.0 < t);
        if k > 1 {
            self.0.drain(..k - 1);
        }
    }
}

/// When each stream is next free. A GPU has a few streams, asked about once
/// per item per plan: a list read from the stream last asked about beat
/// hashing the stream each time (a tenth of the replays).
#[derive(Default)]
struct StreamsFree {
    streams: Vec<(u32, u64)>,
    last: usize,
}

impl StreamsFree {
    fn slot(&self, stream: u32) -> Option<usize> {
        match self.streams.get(self.last) {
            Some(s) if s.0 == stream => Some(self.last),
            _ => self.streams.iter().position(|s| s.0 == stream),
        }
    }

    fn get(&mut self, stream: u32) -> u64 {
        match self.slot(stream) {
            Some(i) => {
                self.last = i;
                self.streams[i].1
            }
            None => 0,
        }
    }

    fn set(&mut self, stream: u32, free: u64) {
        match self.slot(stream) {
            Some(i) => {
                self.last = i;
                self.streams[i].1 = free;
            }
            None => {
                self.last = self.streams.len();
                self.streams.push((stream, free));
            }
        }
    }
}

impl Gpu<'_> {
    fn run(&mut self, ready: u64, it: &Item) -> u64 {
        // Work that started just as other work ended waited for it (an
        // event between streams, a collective's inputs): it still does.
        // (A trace may show work starting before its launch: no wait then.)
        let after = it
            .recorded_start
            .saturating_sub(DEPENDENCY_SLACK_NS)
            .max(it.issued);
        let dep = match after <= it.recorded_start {
            true => self.ends.last(after, it.recorded_start).unwrap_or(0),
            false => 0,
        };
        let free = self.free.get(it.stream);
        let start = ready.max(free).max(dep);
        // A collective moves its data once every GPU is in.
        let all_in = match (self.peers, it.meet) {
            (Peers::AsRecorded, _) => start + it.waiting,
            (Peers::OnTime, _) | (Peers::Met(_), None) => start,
            (Peers::Met(m), Some(n)) => m.meet(n, start).max(start),
        };
        self.waiting += all_in - start;
        let end = all_in + it.dur - it.waiting;
        self.free.set(it.stream, end);
        self.done = self.done.max(end);
        if it.dur > 0 {
            self.spans.push((start, end));
        }
        self.ends.put(it.recorded_end, end);
        end
    }

    /// When, replayed, the work a wait that ended at `t` (recorded) waited
    /// for was done: the last to finish before it. A synchronize waits for
    /// one stream or event, not for the collective running on another.
    fn awaited(&self, t: u64) -> u64 {
        self.ends.last(0, t).unwrap_or(0)
    }

    /// Lets go of the replayed ends no question still to come asks about:
    /// those recorded before `t`, but for the last of them (what a wait
    /// after `t` finds before it).
    fn let_go(&mut self, t: u64) {
        self.ends.let_go(t);
    }
}

/// The pool of loaders behind the feeder's waits (`waited`: the threads
/// they led to, `diagnose::Feeder::waited`), from their threads' times.
/// The feeder blocks only on the worker that is behind, so
/// the pool is the threads its waits led to and their siblings: the other
/// processes of the same parent and name (DataLoader's workers, forked
/// alike), every thread of those processes, and threads of the feeder's own
/// process named like one it waited on (a thread pool). With it, the CPU
/// time every other recorded thread took.
pub fn pool(feeder: Tid, waited: &HashSet<Tid>, tl: &Timeline) -> (Pool, u64) {
    let members = loaders(feeder, waited, tl);
    let mut pool = Pool::default();
    let mut elsewhere = 0;
    for t in tl.all_threads() {
        if members.contains(&(t.pid, t.tid)) {
            pool.add(t, tl.io_tally_of((t.pid, t.tid)));
        } else {
            elsewhere += t.on_cpu;
        }
    }
    (pool, elsewhere)
}

/// The pool's threads (see [`pool`]).
pub fn loaders(feeder: Tid, waited: &HashSet<Tid>, tl: &Timeline) -> HashSet<Tid> {
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
    // (Not the feeder's own name: a process's helper threads often keep it.)
    let feeder_name = threads
        .iter()
        .find(|t| (t.pid, t.tid) == feeder)
        .map(|t| t.comm.as_str());
    let named_in_feeder: HashSet<&str> = threads
        .iter()
        .filter(|t| t.pid == feeder.0 && waited.contains(&(t.pid, t.tid)))
        .map(|t| t.comm.as_str())
        .filter(|&n| Some(n) != feeder_name)
        .collect();
    threads
        .iter()
        .filter(|t| {
            let tid = (t.pid, t.tid);
            if t.pid == feeder.0 {
                tid != feeder
                    && (waited.contains(&tid) || named_in_feeder.contains(t.comm.as_str()))
            } else {
                waited.contains(&tid) || kin(t.pid).is_some_and(|k| families.contains(&k))
            }
        })
        .map(|t| (t.pid, t.tid))
        .collect()
}

impl Run<'_> {
    /// The run's work and calls as its replays read them.
    fn prepared(&self) -> &Prepared {
        self.prepared.get_or_init(|| {
            // Three reads of the GPU's spools, each into a spool of its
            // own: side by side (on a long run, a third of the what-ifs'
            // time was these done one after another).
            let join = |h: std::thread::ScopedJoinHandle<'_, Spool<_>>| {
                h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
            };
            std::thread::scope(|s| {
                let mine = s.spawn(|| self.work.spool(true));
                let others = s.spawn(|| self.work.spool(false));
                let calls = self.calls.spool();
                Prepared {
                    mine: join(mine),
                    others: join(others),
                    calls,
                }
            })
        })
    }

    /// The pool's pace under `plan`, relative to the recorded one.
    fn pace(&self, plan: &Plan) -> f64 {
        let k = self.pool.workers();
        if k == 0.0 {
            return 1.0;
        }
        // The CPUs the pool computed on: a worker that waited for a CPU a
        // tenth of the time it asked for one got nine tenths of one.
        let got = (k * self.pool.cpu_share()).min(self.spare_cpus);
        let waits = plan.add_workers == 0;
        let before = self.pool.service(None, Woken::WithWork, k, k, got, waits);
        let workers = k + plan.add_workers as f64;
        let cpus = if plan.removed == Some(Cause::CpuContention) {
            // Nothing took a CPU it asked for.
            workers.min(self.spare_cpus)
        } else if plan.add_workers == 0 {
            // The same workers wait for a CPU as they did.
            got
        } else {
            // More workers add the CPUs that sat idle and what they win
            // from their group's other tasks, up to those the run had
            // spare; never the CPU a hypervisor or another group held.
            let won = match plan.group_keeps_cpus {
                true => 0.0,
                false => self.won_in_group(got, k, workers),
            };
            (got + self.idle_cpus + won).min(self.spare_cpus).max(got)
        };
        let mut after = self
            .pool
            .service(plan.removed, Woken::WithWork, workers, k, cpus, waits);
        if plan.own_cpu && plan.add_workers == 0 && plan.removed != Some(Cause::CpuContention) {
            // The range's other end: the waits on waking go with the blocks
            // they ended, and the workers compute on the share of the CPUs
            // they got for the rest — the nearer end for a fix that takes
            // blocks out, the farther for one that takes computing out.
            let woken = Woken::WithBlock;
            let share = self.pool.without(plan.removed, woken).cpu_share();
            let cpus = (workers * share).min(self.spare_cpus);
            after = after.min(
                self.pool
                    .service(plan.removed, woken, workers, k, cpus, waits),
            );
        }
        if before <= 0.0 {
            1.0
        } else {
            after / before
        }
    }

    /// The CPUs `add` more workers are predicted to win from their
    /// group's other tasks, as far as the run had them spare.
    fn won_with(&self, add: u32) -> f64 {
        let k = self.pool.workers();
        if k == 0.0 || add == 0 {
            return 0.0;
        }
        let got = (k * self.pool.cpu_share()).min(self.spare_cpus);
        let room = (self.spare_cpus - got - self.idle_cpus).max(0.0);
        self.won_in_group(got, k, k + add as f64).min(room)
    }

    /// The CPUs `workers` workers (`k` of them recorded, on `got` CPUs)
    /// would win from the unrecorded tasks of their own scheduling group,
    /// whose CPUs the kernel shares thread by thread: those tasks count as
    /// as many threads as their CPUs hold at a worker's rate, and the two
    /// share what both held.
    ///
    /// (Counting them as the threads that wanted a CPU at once, sampled
    /// from the group's run queue, and sharing evenly was tried: beside two
    /// busy loops a second worker got 0.32 to 0.47 of a CPU where an even
    /// share gave 0.45 to 0.5 — the kernel gives a worker that sleeps and
    /// wakes less than a loop that never sleeps, by an amount that moved
    /// with the program and the neighbours. At a worker's rate the
    /// predictions missed by 15% or less either way, evenly by up to 30%.)
    fn won_in_group(&self, got: f64, k: f64, workers: f64) -> f64 {
        let held = self.group_cpus;
        if got <= 0.0 || held <= 0.0 || workers <= k {
            return 0.0;
        }
        let rivals = held * k / got;
        (got + held) * workers / (workers + rivals) - got
    }

    /// Around the feeder's piece `i`, a wait for a CPU: the nearest pieces
    /// of its own work before and after it (within 64), each with whether
    /// it lies outside a call other than a launch — what a plan that
    /// removes their cause removes, and with them the preemption between
    /// ([`Near::removed`]).
    fn near(&self, a: &mut account::Reader, calls: &mut CallWindow, i: usize) -> Near {
        // (A wait for a CPU is split between the loaders' and others'.) A
        // wait for the loaders bounds the feeder's own work, whatever its
        // loaders did meanwhile.
        let working = |p: &Moment| {
            p.who == Who::Other || !matches!(p.cause, Cause::CpuContention | Cause::InputCpu)
        };
        let n = self.account.len();
        let before = (0..i).rev().take(64).map_while(|k| a.get(k)).find(working);
        let after = (i + 1..n).take(64).map_while(|k| a.get(k)).find(working);
        let woke = self.woken_from(a, calls, i);
        let mut own = |p: Option<Moment>| {
            p.filter(|p| p.who != Who::Other).and_then(|p| {
                let bare = p.cause == Cause::CpuLaunch || calls.at(p.start).is_none();
                bare.then_some(p.cause)
            })
        };
        Near(own(before), own(after), woke)
    }

    /// The wait the feeder was woken from just before its wait for a CPU
    /// at piece `i` (the wait's pieces back to back with it: the loaders',
    /// or a synchronize's), as a set of causes (bits by place in
    /// [`Cause::ALL`]); 0 when it was not woken (preempted while working).
    fn woken_from(&self, a: &mut account::Reader, calls: &mut CallWindow, i: usize) -> u32 {
        let Some(mut at) = a.get(i).map(|p| p.start) else {
            return 0;
        };
        let bit = |c: Cause| 1u32 << Cause::ALL.iter().position(|&x| x == c).unwrap_or(0);
        let mut k = i;
        // Back over the rest of the same wait for a CPU, then the wait it
        // ended (within 64 pieces, as `near` looks).
        let floor = i.saturating_sub(64);
        while let Some(p) = k
            .checked_sub(1)
            .filter(|&j| j >= floor)
            .and_then(|j| a.get(j))
        {
            if p.end != at
                || p.who == Who::Other
                || !matches!(p.cause, Cause::CpuContention | Cause::InputCpu)
            {
                break;
            }
            at = p.start;
            k -= 1;
        }
        let mut woke = 0;
        while let Some(p) = k
            .checked_sub(1)
            .filter(|&j| j >= floor)
            .and_then(|j| a.get(j))
            .filter(|p| p.end == at)
        {
            let waited = p.who == Who::Other
                || (p.cause == Cause::Sync
                    && calls.at(p.start).is_some_and(|c| c.role() == ApiRole::Sync));
            if !waited {
                break;
            }
            woke |= bit(p.cause);
            at = p.start;
            k -= 1;
            if p.who != Who::Other {
                break;
            }
        }
        woke
    }

    /// Recorded GPU idle time inside `[a, b)`.
    fn idle_within(&self, a: u64, b: u64) -> u64 {
        (b.saturating_sub(a)).saturating_sub(crate::intervals::total(&crate::intervals::clip(
            self.busy, a, b,
        )))
    }

    pub fn replay(&self, plan: &Plan) -> Outcome {
        self.replay_beside(plan, Peers::AsRecorded)
    }

    fn replay_beside(&self, plan: &Plan, peers: Peers) -> Outcome {
        /// Leaves the meeting however the replay ends.
        struct Leave<'m>(Peers<'m>);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if let Peers::Met(m) = self.0 {
                    m.leave();
                }
            }
        }
        let _leave = Leave(peers);
        let mut out = self.replay_at_once(std::slice::from_ref(plan), peers);
        out.pop().unwrap_or_default()
    }

    /// The run replayed under each of `plans`, all at once: one walk of the
    /// recorded run (its account, work and calls read once) steps every
    /// plan's replay. `peers` meet one plan's replays only.
    fn replay_at_once(&self, plans: &[Plan], peers: Peers) -> Vec<Outcome> {
        debug_assert!(plans.len() == 1 || matches!(peers, Peers::AsRecorded));
        let (t0, t1) = self.window;
        let (first, last) = match (self.busy.first(), self.busy.last()) {
            (Some(f), Some(l)) => (f.0, l.1),
            _ => return vec![Outcome::default(); plans.len()],
        };
        let paced = self.pool.paced();
        // Batches came at the pool's pace from when it began.
        let p0 = self.pool.start.clamp(t0, t1);
        let prepared = self.prepared();
        let (mut mq, mut oq) = (
            Queue(prepared.mine.reader()),
            Queue(prepared.others.reader()),
        );
        let mut calls = CallWindow {
            calls: prepared.calls.reader(),
            before: 0,
        };
        let (mut mi, mut oi) = (0, 0);
        // Before the feeder began and after it ended (the process starting
        // and exiting, the recorder's last flush) nothing is replayed: those
        // stretches keep their recorded length.
        let h0 = self.account.first().map_or(t0, |p| p.start.max(t0));
        let tail = t1.saturating_sub(self.account.last().map_or(t1, |p| p.end).max(last));
        let mut rs: Vec<Replaying> = plans
            .iter()
            .map(|plan| Replaying {
                plan: *plan,
                pace: self.pace(plan),
                h: h0,
                gpu: Gpu {
                    peers,
                    ..Gpu::default()
                },
                log: Tally::new(t0),
                sync_left: 0,
                burst: Burst::default(),
                ended: false,
                step: (h0, h0),
            })
            .collect();
        let mut skip_until = 0;
        let mut i = 0;
        let mut moments = 0usize;
        let mut account = self.account.reader();
        let mut items: Vec<Item> = Vec::new();
        let mut parts: Vec<(Cause, u64)> = Vec::new();
        while let Some(p) = account.get(i) {
            // What was issued before this moment goes now.
            while let Some(it) = mq.get(mi).filter(|it| it.issued < p.start) {
                for r in &mut rs {
                    r.gpu.run(r.h, &it);
                }
                mi += 1;
            }
            // Others' work keeps its place in the feeder's time: between
            // the last step's start and this one's, in proportion.
            let re = p.start;
            while let Some(it) = oq.get(oi).filter(|it| it.issued < re) {
                for r in &mut rs {
                    let ((rs, hs), he) = (r.step, r.h);
                    let into = it.issued.max(rs) - rs;
                    let ready = match re - rs {
                        0 => he,
                        len => hs + (into as u128 * (he - hs) as u128 / len as u128) as u64,
                    };
                    r.gpu.run(ready, &it);
                }
                oi += 1;
            }
            for r in &mut rs {
                r.step = (re, r.h);
            }
            // Whatever is issued from here on runs at `h` or later.
            moments += 1;
            if moments % SETTLE_EVERY == 0 {
                // What the replays still read lies after the moments they
                // look back at (64), the calls holding them, and the work
                // still to issue.
                let back = account
                    .get(i.saturating_sub(64))
                    .map_or(p.start, |b| b.start);
                let held = calls.held_from(back);
                let next = [mq.get(mi), oq.get(oi)]
                    .into_iter()
                    .flatten()
                    .map(|it| it.issued.min(it.recorded_start))
                    .min()
                    .unwrap_or(u64::MAX);
                let behind = held
                    .min(next)
                    .saturating_sub(DEPENDENCY_SLACK_NS + LOOKBACK_MARGIN_NS);
                for r in &mut rs {
                    r.log.settle(&mut r.gpu.spans, r.h);
                    r.gpu.let_go(behind);
                }
            }
            // What came after the GPU's last work (saving the model, the
            // exit: a context's teardown waits for its work) comes after
            // the replayed GPU's last work too, as long after it as it was
            // — unless the fix is to stop waiting for the GPU.
            if p.end > last {
                for r in rs
                    .iter_mut()
                    .filter(|r| !r.ended && !r.plan.removes(Cause::Sync))
                {
                    r.end_burst();
                    r.ended = true;
                    r.h =
                        r.h.max(r.gpu.done.saturating_sub(last.saturating_sub(p.start)));
                }
            }
            if p.end <= skip_until {
                i += 1;
                continue;
            }
            // A wait for the loaders: the whole run of pieces another thread
            // decided.
            if p.who == Who::Other {
                for r in &mut rs {
                    r.end_burst();
                }
                parts.clear();
                let mut e = p.start;
                while let Some(q) = account.get(i).filter(|q| q.who == Who::Other) {
                    parts.push((q.cause, q.end - q.start));
                    e = q.end;
                    i += 1;
                }
                for r in &mut rs {
                    let plan = r.plan;
                    let latency: u64 = parts
                        .iter()
                        .filter(|(c, _)| !plan.removes(*c))
                        .map(|x| x.1)
                        .sum();
                    // Before the pool began, or after the GPU's last work
                    // (the loaders being shut down), waits are not for its
                    // batches: they keep their length.
                    let ready = if e <= p0 || p.start >= last {
                        r.h + (e - p.start)
                    } else if paced {
                        r.h.max(p0 + (e.saturating_sub(p0) as f64 * r.pace) as u64)
                    } else {
                        r.h + latency
                    };
                    r.log.note(r.h, ready, self.pool.cause(plan.removed));
                    r.h = ready;
                }
                continue;
            }
            if let Some(call) = calls.at(p.start) {
                skip_until = call.end;
                let n = match call.role() {
                    ApiRole::Launch | ApiRole::Memory => mq.issued_before(mi, call.end),
                    _ => 0,
                };
                items.clear();
                items.extend((mi..mi + n).filter_map(|k| mq.get(k)));
                mi += n;
                let cost = call.end.saturating_sub(call.start);
                match call.role() {
                    ApiRole::Launch => {
                        for r in &mut rs {
                            r.settle_waits();
                            let cost = if r.plan.removes(Cause::CpuLaunch) {
                                0
                            } else {
                                cost
                            };
                            r.work(call.end.saturating_sub(call.start), cost);
                            r.log.note(r.h, r.h + cost, Cause::CpuLaunch);
                            r.h += cost;
                            r.sync_left = 0;
                            for it in &items {
                                r.gpu.run(r.h, it);
                            }
                        }
                    }
                    // cudaStreamWaitEvent orders streams; the host goes on.
                    ApiRole::Sync if call.synchronizes == 0 => {
                        for r in &mut rs {
                            r.work(cost, cost);
                            r.log.note(r.h, r.h + cost, Cause::Sync);
                            r.h += cost;
                        }
                    }
                    ApiRole::Sync => {
                        for r in rs.iter_mut().filter(|r| !r.plan.removes(Cause::Sync)) {
                            r.end_burst();
                            let w = r.h.max(r.gpu.awaited(call.end));
                            r.log.note(r.h, w, Cause::Sync);
                            r.sync_left = w - r.h;
                            r.h = w;
                        }
                    }
                    ApiRole::Memory => {
                        let copies = &items;
                        // A copy call waits for its copy when it says so
                        // (not ...Async) or the host memory is pageable, and
                        // it did return after the copy.
                        let blocking = call.asynchronous == 0 || copies.iter().any(|c| c.pageable);
                        let waited = blocking
                            && copies
                                .iter()
                                .map(|c| c.recorded_end)
                                .max()
                                .is_some_and(|end| call.end + SYNC_COPY_SLACK_NS >= end);
                        let first_copy = copies.iter().map(|c| c.recorded_start).min();
                        let staging = match waited {
                            true => self.idle_within(
                                call.start,
                                first_copy.unwrap_or(call.end).min(call.end),
                            ),
                            false => 0,
                        };
                        for r in &mut rs {
                            if r.plan.removes(Cause::Memory) {
                                // From pinned memory: issued, not waited for.
                                r.settle_waits();
                                r.work(cost, 0);
                                for c in copies {
                                    r.gpu.run(r.h, c);
                                }
                            } else if waited {
                                // A pageable copy: the queue drains, the
                                // host stages the data, the GPU copies it,
                                // the call returns.
                                r.end_burst();
                                let drained =
                                    r.h.max(r.gpu.awaited(first_copy.unwrap_or(call.start)));
                                let staged = drained + staging;
                                let mut end = staged;
                                for c in copies {
                                    end = end.max(r.gpu.run(staged, c));
                                }
                                r.log.note(r.h, end, Cause::Memory);
                                r.h = end;
                            } else {
                                r.settle_waits();
                                r.work(cost, cost);
                                r.log.note(r.h, r.h + cost, Cause::Memory);
                                r.h += cost;
                                for c in copies {
                                    r.gpu.run(r.h, c);
                                }
                            }
                        }
                    }
                    ApiRole::Other => unreachable!("call_at skips them"),
                }
                i += 1;
                continue;
            }
            // The feeder's own time outside those calls.
            let d = p.end - p.start;
            let inside = p.start >= first && p.start < last;
            // A wait for a CPU its loaders held: the work around it and the
            // wait it ends, if any ([`Near`]); one others held: only the
            // wait it ends (the burst it falls in decides the rest).
            let near = match p.cause {
                _ if !inside || p.who == Who::Other => None,
                Cause::InputCpu => Some(self.near(&mut account, &mut calls, i)),
                Cause::CpuContention => Some(Near(
                    None,
                    None,
                    self.woken_from(&mut account, &mut calls, i),
                )),
                _ => None,
            };
            for r in &mut rs {
                r.own(p, d, inside, near);
            }
            i += 1;
        }
        for r in &mut rs {
            r.end_burst();
        }
        while let Some(it) = mq.get(mi) {
            for r in &mut rs {
                r.gpu.run(r.h, &it);
            }
            mi += 1;
        }
        while let Some(it) = oq.get(oi) {
            for r in &mut rs {
                r.gpu.run(r.h, &it);
            }
            oi += 1;
        }
        rs.into_iter()
            .map(|r| {
                let end = r.h.max(r.gpu.done) + tail;
                Outcome {
                    waiting_ns: r.gpu.waiting,
                    ..r.log.finish(r.gpu.spans, end)
                }
            })
            .collect()
    }
}

/// The nearest pieces of the feeder's own work before and after a wait
/// for a CPU, by cause, where they lie outside calls other than launches;
/// and the causes of the wait it was woken from, if it was (see
/// [`Run::near`]).
#[derive(Clone, Copy)]
struct Near(Option<Cause>, Option<Cause>, u32);

impl Near {
    /// The wait for a CPU its loaders held interrupts work `plan` removes
    /// — host work, or the launch calls' overhead: work that no longer runs
    /// is not preempted either. (Waits for a CPU others held go with the
    /// work in proportion: [`Replaying::settle_waits`].)
    ///
    /// And a wait for a CPU right after the feeder was woken is the
    /// wake-up's latency: where `plan` removes the whole wait it ends, the
    /// feeder no longer sleeps there, so it is not woken either. (Kept, a
    /// recording on a busy machine predicts its wake-ups' latency as if it
    /// still slept: +45% against the fixed run beside two busy loops.)
    fn removed(&self, plan: &Plan) -> bool {
        let gone = |c: Option<Cause>| c.is_some_and(|c| plan.removes(c));
        (gone(self.0) && gone(self.1)) || self.woke_gone(plan)
    }

    /// The feeder was woken just before, from a wait `plan` removes whole.
    fn woke_gone(&self, plan: &Plan) -> bool {
        self.2 != 0
            && Cause::ALL
                .iter()
                .enumerate()
                .filter(|(k, _)| self.2 & (1 << k) != 0)
                .all(|(_, &c)| plan.removes(c))
    }
}

/// One plan's replay, stepped with the others'.
struct Replaying<'m> {
    plan: Plan,
    pace: f64,
    /// The replayed feeder's time.
    h: u64,
    gpu: Gpu<'m>,
    /// The replayed account, summed as it goes.
    log: Tally,
    /// How much of the feeder's own work after a synchronize that waited
    /// is still the synchronize's (what overlap would have hidden; as the
    /// attribution charges it).
    sync_left: u64,
    /// The feeder's burst of running since it last waited.
    burst: Burst,
    ended: bool,
    /// Where the last step began, recorded and replayed.
    step: (u64, u64),
}

impl Replaying<'_> {
    /// The feeder's own piece `p`, `d` long, outside calls; `inside` the
    /// GPU's first and last work.
    fn own(&mut self, p: Moment, d: u64, inside: bool, near: Option<Near>) {
        let plan = self.plan;
        match p.cause {
            // Blocked in the driver, waiting for the GPU.
            Cause::Sync => {
                if !plan.removes(Cause::Sync) {
                    self.end_burst();
                    let w = self.h.max(self.gpu.awaited(p.end));
                    self.log.note(self.h, w, Cause::Sync);
                    self.h = w;
                }
            }
            // Host work before the first GPU work or after the last
            // (loading a model, saving it) is not what a fix changes;
            // waiting for the CPUs the loaders held is.
            // Host work behind a synchronize: as much of it as the
            // synchronize waited is the synchronize's, the rest the host's
            // stall (as attributed) — all that taking the stall out
            // removes.
            Cause::CpuHost if self.sync_left > 0 => {
                let hidden = self.sync_left.min(d);
                self.sync_left -= hidden;
                let rest = if inside && plan.removes(Cause::CpuHost) {
                    0
                } else {
                    d - hidden
                };
                self.work(d, hidden + rest);
                let h = self.h;
                self.log.note(h, h + hidden, Cause::Sync);
                self.log.note(h + hidden, h + hidden + rest, Cause::CpuHost);
                self.h += hidden + rest;
            }
            c if (inside || c == Cause::InputCpu) && plan.removes(c) => {
                if matches!(c, Cause::CpuHost | Cause::CpuLaunch) {
                    self.work(d, 0);
                }
            }
            // Alone on a CPU: nobody else's to wait for.
            Cause::CpuContention if inside && plan.own_cpu => {}
            // A wake-up's latency goes with the wait it ends, or stays
            // whole: it is the wait's, not the work's.
            Cause::CpuContention if near.is_some_and(|n| n.2 != 0) => {
                if !near.is_some_and(|n| n.woke_gone(&plan)) {
                    self.log.note(self.h, self.h + d, Cause::CpuContention);
                    self.h += d;
                }
            }
            Cause::CpuContention if inside => self.wait(d),
            Cause::InputCpu if self.sync_left == 0 && near.is_some_and(|n| n.removed(&plan)) => {}
            c => {
                match c {
                    Cause::CpuHost | Cause::CpuLaunch => self.work(d, d),
                    Cause::CpuContention | Cause::InputCpu => {}
                    _ => self.end_burst(),
                }
                self.log.note(self.h, self.h + d, c);
                self.h += d;
            }
        }
    }

    /// `d` of the feeder's work on a CPU in the recording, `kept` of it in
    /// this replay.
    fn work(&mut self, d: u64, kept: u64) {
        self.burst.work += d;
        self.burst.kept += kept;
    }

    /// A wait for a CPU, `d` long, in the burst: preemptions come with
    /// running — a busy machine's scheduler takes the CPU from a thread at
    /// a rate, wherever its slice happens to end — so the work a fix leaves
    /// in a burst meets them at the burst's rate, not at the places the
    /// recording did: of a burst's waits, as much stays as of its work on a
    /// CPU. (Kept where they fell, beside two busy loops, a preemption
    /// that fell on the host work after a launch loop of 9 ms stayed when
    /// the launches went — 0.5 s of a 0.4 s fixed run — and a host run a
    /// synchronize's share cut from 9 to 6 ms kept 4.9 of its 9.2 ms of
    /// waits, predicting the job 12-17% shorter than it ran.) While the
    /// burst has lost none of its work, a wait stays where it fell (the
    /// GPU's idle then is the wait's, as recorded); after, it waits to be
    /// charged at the burst's share ([`Replaying::settle_waits`]).
    fn wait(&mut self, d: u64) {
        self.burst.waits += d;
        if self.burst.kept == self.burst.work {
            self.burst.charged += d;
            self.log.note(self.h, self.h + d, Cause::CpuContention);
            self.h += d;
        }
    }

    /// Charges the burst's waits up to its share of them so far (what was
    /// charged where it fell counted), before work is issued: the GPU sees
    /// them before the work that follows them.
    fn settle_waits(&mut self) {
        let Burst {
            work,
            kept,
            waits,
            charged,
        } = self.burst;
        let share = match work {
            0 => waits,
            _ => (waits as u128 * kept as u128 / work as u128) as u64,
        };
        let stays = share.saturating_sub(charged);
        if stays > 0 {
            self.burst.charged += stays;
            self.log.note(self.h, self.h + stays, Cause::CpuContention);
            self.h += stays;
        }
    }

    /// The burst ends: the feeder waits (for the GPU, its loaders, I/O).
    fn end_burst(&mut self) {
        self.settle_waits();
        self.burst = Burst::default();
    }
}

/// The feeder's burst of running between two waits: its work on a CPU as
/// recorded, as much of it as the replay keeps, its waits for a CPU
/// (preempted, not woken), and how much of those the replay has charged.
#[derive(Default, Clone, Copy)]
struct Burst {
    work: u64,
    kept: u64,
    waits: u64,
    charged: u64,
}

/// The replayed GPU's busy and idle time, its idle split by the replayed
/// account: before its first work start-up, after its last tear-down, and
/// in between whatever the feeder was doing. Summed as the replay goes:
/// a gap between busy spans is final once no work still to come can start
/// inside it, and the account's moments behind it are let go, so a replay
/// holds only the stretch since then, however long the run.
struct Tally {
    t0: u64,
    /// The first busy span's start, once known.
    first: Option<u64>,
    /// The last busy span settled: later work may still extend it.
    open: Option<(u64, u64)>,
    busy: u64,
    /// The replayed account not yet summed: (start, end, cause), in order
    /// and disjoint.
    log: std::collections::VecDeque<(u64, u64, Cause)>,
    idle: BTreeMap<Cause, u64>,
}

impl Tally {
    fn new(t0: u64) -> Tally {
        Tally {
            t0,
            first: None,
            open: None,
            busy: 0,
            log: Default::default(),
            idle: BTreeMap::new(),
        }
    }

    /// The feeder spent `[a, b)` on `c`, replayed. Back-to-back moments of
    /// one cause are one: the outcome only sums them by cause.
    fn note(&mut self, a: u64, b: u64, c: Cause) {
        match self.log.back_mut() {
            _ if b <= a => {}
            Some(l) if l.1 == a && l.2 == c => l.1 = b,
            _ => self.log.push_back((a, b, c)),
        }
    }

    /// Takes the GPU's spans replayed so far, knowing that no work still to
    /// come starts before `lo`: the gaps that end by then are final.
    fn settle(&mut self, spans: &mut Vec<(u64, u64)>, lo: u64) {
        if spans.is_empty() {
            return;
        }
        let mut all = std::mem::take(spans);
        all.extend(self.open.take());
        let merged = crate::intervals::union(all);
        // Spans starting by `lo` are known, and so is every gap before the
        // last of them; that one may still grow.
        let known = merged.partition_point(|s| s.0 <= lo);
        if known == 0 {
            *spans = merged;
            return;
        }
        self.first.get_or_insert(merged[0].0);
        for w in merged[..known].windows(2) {
            self.busy += w[0].1 - w[0].0;
            self.gap(w[0].1, w[1].0);
        }
        let open = merged[known - 1];
        self.open = Some(open);
        *spans = merged[known..].to_vec();
        // Moments over by the open span's end lie in busy time: every gap
        // still to come starts after it.
        while self.log.front().is_some_and(|l| l.1 <= open.1) {
            self.log.pop_front();
        }
    }

    /// The idle gap `[a, b)`, by what the replayed feeder did in it.
    fn gap(&mut self, a: u64, b: u64) {
        while self.log.front().is_some_and(|l| l.1 <= a) {
            self.log.pop_front();
        }
        let mut covered = 0;
        for &(s, e, c) in self.log.iter().take_while(|x| x.0 < b) {
            let (s, e) = (s.max(a), e.min(b));
            if e > s {
                *self.idle.entry(c).or_default() += e - s;
                covered += e - s;
            }
        }
        if b - a > covered {
            *self.idle.entry(Cause::Unattributed).or_default() += b - a - covered;
        }
    }

    fn finish(mut self, mut spans: Vec<(u64, u64)>, end: u64) -> Outcome {
        self.settle(&mut spans, u64::MAX);
        let t0 = self.t0;
        let (Some(first), Some(last)) = (self.first, self.open) else {
            return Outcome {
                wall_ns: end - t0,
                busy_ns: 0,
                waiting_ns: 0,
                idle: BTreeMap::from([(Cause::Unattributed, end - t0)]),
            };
        };
        let mut idle = self.idle;
        *idle.entry(Cause::Startup).or_default() += first - t0;
        *idle.entry(Cause::Teardown).or_default() += end - last.1;
        idle.retain(|_, ns| *ns > 0);
        Outcome {
            wall_ns: end - t0,
            busy_ns: self.busy + (last.1 - last.0),
            waiting_ns: 0,
            idle,
        }
    }
}

/// Every GPU of a recording, ready to replay.
pub struct Job<'a> {
    runs: Vec<Run<'a>>,
    /// Each run replayed unchanged: how far the replay is from the record.
    baseline: Vec<Outcome>,
    recorded: u64,
    /// Its GPUs wait for each other in collectives (see [`Job::new`]).
    lockstep: bool,
    /// The plans replayed up front, with each run's outcome.
    replayed: Vec<(Plan, Vec<Outcome>)>,
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

impl Prediction {
    /// Its replayed idle by cause, every cause named.
    pub fn idle_by_cause(&self) -> crate::analyze::cause::IdleByCause {
        crate::analyze::cause::IdleByCause::from_fn(|c| self.idle.get(&c).copied().unwrap_or(0))
    }
}

impl<'a> Job<'a> {
    /// `nr_cpus`: the recorded machine's CPUs (0 when not recorded: the
    /// loaders are then not bounded by CPUs); `collector_cpu_ns`: what the
    /// recorder itself took of them. `plans`, given the job's runs (its
    /// pool's workers, what more would win): what the caller will ask
    /// [`Job::predict`] about,
    /// replayed now beside the unchanged run, each plan on a core of its
    /// own as far as the machine has them (each replay walks the whole
    /// run: on a long recording they are most of the report's time).
    /// `spooled`: where a long recording's GPU work and calls are read
    /// back from, when the timeline does not hold them.
    pub fn new(
        tl: &'a Timeline,
        d: &'a Diagnosis,
        spooled: Option<(&'a GpuSpools, &'a SpoolPlan)>,
        nr_cpus: u32,
        collector_cpu_ns: u64,
        plans: impl FnOnce(&Job) -> Vec<Plan>,
    ) -> Job<'a> {
        let window = (tl.start, tl.end);
        let span = tl.end.saturating_sub(tl.start).max(1);
        let runs: Vec<Run<'a>> = d
            .gpus
            .iter()
            .filter_map(|g| {
                let f = g.feeder.as_ref()?;
                let device = tl.gpu.devices.iter().find(|x| x.id == g.gpu.device)?;
                let (pool, elsewhere) = pool(f.tid, &f.waited, tl);
                // The CPUs the rest took while the loaders worked: the
                // feeder's own from its time (a trainer busy importing
                // before its loaders start took nothing from them), the
                // others' and the recorder's spread over the window.
                let life = (pool.start, pool.start + pool.busiest_life);
                let own_total = f.cpu_within(window.0, window.1);
                let taken = if pool.busiest_life > 0 {
                    let rest = elsewhere.saturating_sub(own_total) + collector_cpu_ns;
                    (f.cpu_within(life.0, life.1) as f64
                        + rest as f64 * pool.busiest_life as f64 / span as f64)
                        / pool.busiest_life as f64
                } else {
                    (elsewhere + collector_cpu_ns) as f64 / span as f64
                };
                let spare_cpus = if nr_cpus == 0 {
                    f64::INFINITY
                } else {
                    (nr_cpus as f64 - taken).max(1.0)
                };
                // Unrecorded processes take CPUs too: a new worker could
                // have what sat idle, and a share of what those in the
                // job's own scheduling group held (not another group's).
                let idle_cpus = tl.idle_cpus(life.0, life.1).unwrap_or(f64::INFINITY);
                let group_cpus = tl.neighbour_cpus(life.0, life.1).map_or(0.0, |n| n.0);
                Some(Run {
                    window,
                    busy: &g.gpu.busy,
                    feeder: f.tid,
                    account: &f.account,
                    calls: match spooled {
                        Some((spools, plan)) => Calls::Spooled {
                            spools,
                            plan,
                            feeder: f.tid,
                        },
                        None => tl
                            .gpu
                            .calls
                            .get(&f.tid)
                            .map_or(&[][..], Vec::as_slice)
                            .into(),
                    },
                    work: match spooled {
                        Some((spools, plan)) => Issued::spooled(
                            spools,
                            plan,
                            device.id,
                            f.tid,
                            &g.gpu.waiting,
                            &g.gpu.met,
                        ),
                        None => Issued::of(device, f.tid, &g.gpu.waiting, &g.gpu.met),
                    },
                    pool,
                    spare_cpus,
                    idle_cpus,
                    group_cpus,
                    prepared: Default::default(),
                })
            })
            .collect();
        // GPUs that waited for each other in collectives are replayed
        // together: a fix that speeds up the rank the others waited for
        // speeds up theirs too, and one that speeds up only the others
        // gives nothing.
        let lockstep = runs.len() >= 2 && runs.iter().any(|r| r.work.waited());
        let mut job = Job {
            runs,
            baseline: Vec::new(),
            recorded: span,
            lockstep,
            replayed: Vec::new(),
        };
        let mut wanted = vec![Plan::default()];
        for p in plans(&job) {
            if !wanted.contains(&p) {
                wanted.push(p);
            }
        }
        let mut outcomes = replay_plans(&job.runs, lockstep, &wanted).into_iter();
        job.baseline = outcomes.next().expect("the unchanged run is replayed");
        job.replayed = wanted.into_iter().skip(1).zip(outcomes).collect();
        job
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

    /// Whether `add` more workers are predicted to win a twentieth of a
    /// CPU or more from their scheduling group's other tasks: then how
    /// much is not in the recording ([`Plan::group_keeps_cpus`]), and
    /// less than that changes the prediction by a few percent at most.
    pub fn wins_from_group(&self, add: u32) -> bool {
        self.runs.iter().any(|r| r.won_with(add) >= 0.05)
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
        let outcomes = match self.replayed.iter().find(|(p, _)| p == plan) {
            Some((_, o)) => o.clone(),
            None => replay_all(&self.runs, self.lockstep, plan),
        };
        for ((o, base), _) in outcomes.into_iter().zip(&self.baseline).zip(&self.runs) {
            // Streams are replayed as independent queues, so work the fix
            // issues earlier may overlap other streams' more than it did;
            // kernels side by side share the GPU, so that overlap is not
            // counted as time saved.
            // (Collectives that wait less are not overlap: their waits
            // are not counted.)
            let working = |o: &Outcome| o.busy_ns.saturating_sub(o.waiting_ns);
            let overlap = working(base).saturating_sub(working(&o));
            let scale = self.recorded as f64 / base.wall_ns.max(1) as f64;
            wall = wall.max(((o.wall_ns + overlap) as f64 * scale).round() as u64);
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

/// [`replay_all`] for each plan, in order, spread over the machine's cores:
/// the plans are independent, and each replay reads the runs only.
fn replay_plans(runs: &[Run], lockstep: bool, plans: &[Plan]) -> Vec<Vec<Outcome>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if lockstep {
        // Each plan's replays meet each other: one plan at a time, its
        // GPUs side by side.
        return plans
            .iter()
            .map(|p| replay_all(runs, lockstep, p))
            .collect();
    }
    // Each GPU's run walked once per core, every plan of the core's share
    // stepped at once.
    let shares = cores.min(plans.len()).max(1);
    let per = plans.len().div_ceil(shares);
    let mut out: Vec<Vec<Outcome>> = vec![Vec::with_capacity(runs.len()); plans.len()];
    for run in runs {
        // The run's spools, made once before its walks share them.
        run.prepared();
        let walked: Vec<Vec<Outcome>> = std::thread::scope(|s| {
            let handles: Vec<_> = plans
                .chunks(per)
                .map(|share| s.spawn(move || run.replay_at_once(share, Peers::AsRecorded)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        for (o, plan_out) in walked.into_iter().flatten().zip(out.iter_mut()) {
            plan_out.push(o);
        }
    }
    out
}

/// Every GPU's run replayed under `plan`; in `lockstep`, together (see
/// [`crate::analyze::lockstep`]), or with the others on time when the plan
/// fixes `comm` (the late rank arriving on time).
fn replay_all(runs: &[Run], lockstep: bool, plan: &Plan) -> Vec<Outcome> {
    if !lockstep {
        return runs.iter().map(|r| r.replay(plan)).collect();
    }
    if plan.removes(Cause::Comm) {
        return runs
            .iter()
            .map(|r| r.replay_beside(plan, Peers::OnTime))
            .collect();
    }
    let meeting = Meeting::new(runs.len());
    std::thread::scope(|s| {
        let meeting = &meeting;
        let replays: Vec<_> = runs
            .iter()
            .map(|r| s.spawn(move || r.replay_beside(plan, Peers::Met(meeting))))
            .collect();
        replays
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::attribute::Piece;
    use crate::timeline::gpu::CallName;

    const FEEDER: Tid = (1, 1);
    const LOADER: Tid = (2, 2);
    const MS: u64 = 1_000_000;

    /// The outcome summed at once, from every replayed span and moment:
    /// the reference [`Tally`] must agree with, however it settles.
    fn outcome_at_once(
        t0: u64,
        end: u64,
        spans: Vec<(u64, u64)>,
        log: &[(u64, u64, Cause)],
    ) -> Outcome {
        let busy = crate::intervals::union(spans);
        let (Some(&(first, _)), Some(&(_, last))) = (busy.first(), busy.last()) else {
            return Outcome {
                wall_ns: end - t0,
                busy_ns: 0,
                waiting_ns: 0,
                idle: BTreeMap::from([(Cause::Unattributed, end - t0)]),
            };
        };
        let mut idle: BTreeMap<Cause, u64> = BTreeMap::new();
        *idle.entry(Cause::Startup).or_default() += first - t0;
        *idle.entry(Cause::Teardown).or_default() += end - last;
        for w in busy.windows(2) {
            let (a, b) = (w[0].1, w[1].0);
            let mut covered = 0;
            for &(s, e, c) in log {
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
            waiting_ns: 0,
            idle,
        }
    }

    #[test]
    fn the_outcome_summed_as_the_replay_goes_is_the_outcome_summed_at_once() {
        let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut rand = |n: u64| rng.below(n);
        let causes = [
            Cause::CpuHost,
            Cause::Sync,
            Cause::InputIo,
            Cause::CpuLaunch,
        ];
        for round in 0..300 {
            let t0 = rand(1_000);
            let mut tally = Tally::new(t0);
            let (mut spans, mut all_spans, mut log) = (Vec::new(), Vec::new(), Vec::new());
            let mut h = t0 + rand(50);
            let mut gpu_free = 0u64;
            for _ in 0..rand(400) {
                // The feeder's next moment, sometimes after a jump.
                let d = rand(30);
                let c = causes[rand(4) as usize];
                if d > 0
                    && log
                        .last()
                        .is_some_and(|l: &(u64, u64, Cause)| l.1 == h && l.2 == c)
                {
                    log.last_mut().expect("just seen").1 = h + d;
                } else if d > 0 {
                    log.push((h, h + d, c));
                }
                tally.note(h, h + d, c);
                h += d + if rand(10) == 0 { rand(40) } else { 0 };
                // Work issued now: it starts at `h` or later, on a queue
                // that may run ahead of the host.
                for _ in 0..rand(3) {
                    let start = h.max(if rand(2) == 0 { gpu_free } else { h }) + rand(20);
                    let span = (start, start + rand(25));
                    gpu_free = gpu_free.max(span.1);
                    spans.push(span);
                    all_spans.push(span);
                }
                if rand(round % 7 + 1) == 0 {
                    tally.settle(&mut spans, h);
                }
            }
            let end = h.max(gpu_free) + rand(10);
            assert_eq!(
                tally.finish(spans, end),
                outcome_at_once(t0, end, all_spans, &log),
                "round {round}"
            );
        }
    }

    /// A job built step by step on one stream: the feeder's calls, the
    /// GPU's work and the feeder's account, in time order.
    #[derive(Default)]
    struct Recorded {
        at: u64,
        calls: Vec<Call>,
        work: Vec<Work>,
        account: Account,
        /// When the GPU's queue empties, as recorded.
        free: u64,
        /// CPUs that sat idle while the loaders worked (None: not read).
        idle_cpus: Option<f64>,
    }

    impl Recorded {
        fn piece(&mut self, ns: u64, cause: Cause, thread: Tid) {
            let p = Piece {
                start: self.at,
                end: self.at + ns,
                cause,
                thread: Some(thread),
            };
            self.account.push(&p, FEEDER);
            self.at += ns;
        }

        fn call(&mut self, ns: u64, role: ApiRole) {
            // cudaLaunchKernel, cudaStreamSynchronize.
            let cbid = if role == ApiRole::Launch { 211 } else { 131 };
            self.calls.push(Call {
                start: self.at,
                end: self.at + ns,
                role,
                name: CallName::Api(gapscope_wire::ApiDomain::Runtime, cbid),
                correlation: None,
            });
            let cause = match role {
                ApiRole::Launch => Cause::CpuLaunch,
                ApiRole::Sync => Cause::Sync,
                _ => Cause::Memory,
            };
            self.piece(ns, cause, FEEDER);
        }

        fn launch(&mut self, kernel_ns: u64) {
            let issued = self.at;
            self.call(10_000, ApiRole::Launch);
            let start = self.at.max(self.free);
            self.free = start + kernel_ns;
            self.work.push(Work {
                start,
                end: self.free,
                launch: Some((FEEDER, issued)),
                pid: 1,
                device: 0,
                stream: 7,
                correlation: 0,
                what: What::Kernel(std::sync::Arc::new(crate::timeline::gpu::Kernel {
                    name: "k".into(),
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                })),
            });
        }

        fn sync(&mut self) {
            let wait = self.free.saturating_sub(self.at);
            self.call(wait, ApiRole::Sync);
        }

        /// `n` steps of a kernel `kernel_ns` long, a synchronize waiting
        /// for it, then the feeder's `after` pieces.
        fn synced_steps(&mut self, n: usize, kernel_ns: u64, after: &[(u64, Cause)]) {
            for _ in 0..n {
                self.launch(kernel_ns);
                self.sync();
                for &(ns, cause) in after {
                    self.piece(ns, cause, FEEDER);
                }
            }
        }

        fn busy(&self) -> Vec<(u64, u64)> {
            crate::intervals::union(self.work.iter().map(Work::span).collect())
        }

        fn replay(&self, pool: Pool, plan: &Plan) -> Outcome {
            let device = Device {
                work: self.work.clone(),
                ..Device::default()
            };
            let busy = self.busy();
            Run {
                window: (0, self.at),
                busy: &busy,
                feeder: FEEDER,
                account: &self.account,
                calls: self.calls.as_slice().into(),
                work: Issued::of(&device, FEEDER, &[], &[]),
                pool,
                spare_cpus: 2.0,
                idle_cpus: self.idle_cpus.unwrap_or(f64::INFINITY),
                group_cpus: 0.0,
                prepared: Default::default(),
            }
            .replay(plan)
        }
    }

    /// The `.item()` pattern: launch 6 ms of work, wait for it, then 9 ms
    /// of host work the GPU waits for. Without the sync the host work stays
    /// and runs beside the GPU's: steps of 9 ms, not 6.
    #[test]
    fn a_sync_taken_out_leaves_the_host_work_behind_it() {
        let mut j = Recorded::default();
        for _ in 0..10 {
            j.launch(6 * MS);
            j.sync();
            j.piece(9 * MS, Cause::CpuHost, FEEDER);
        }
        let recorded = j.at;
        let as_recorded = j.replay(Pool::default(), &Plan::default());
        assert_eq!(as_recorded.wall_ns, recorded);
        // The GPU's idle after each sync: as much of the host work as the
        // sync waited (6 ms) is the sync's, the rest the host's — what
        // taking either out gives back.
        let idle = |o: &Outcome, c| o.idle.get(&c).copied().unwrap_or(0);
        assert_eq!(idle(&as_recorded, Cause::Sync), 9 * 6 * MS);
        assert_eq!(idle(&as_recorded, Cause::CpuHost), 9 * 3 * MS);
        // Taking out the host's stall: 3 ms a step, what outlasted the GPU.
        let host_fixed = j.replay(Pool::default(), &Plan::fix(Cause::CpuHost));
        assert_eq!(host_fixed.wall_ns, recorded - 9 * 3 * MS);
        assert_eq!(idle(&host_fixed, Cause::CpuHost), 0);
        let fixed = j.replay(Pool::default(), &Plan::fix(Cause::Sync));
        // Ten launches and host work back to back, the last kernel's tail
        // hidden behind the last host work.
        assert_eq!(fixed.wall_ns, 10 * (9 * MS + 10_000));
        // What is left idle is the host's: 3 ms a step.
        let host = fixed.idle.get(&Cause::CpuHost).copied().unwrap_or(0);
        assert!(host > 25 * MS && host < 31 * MS, "{:?}", fixed.idle);
        assert_eq!(fixed.idle.get(&Cause::Sync), None);
        // Subtracting the idle would have promised 6 ms steps.
        let naive = recorded - 10 * 9 * MS;
        assert!(fixed.wall_ns > naive + 25 * MS);
    }

    /// A feeder waiting on a loader that reads for 20 ms and decodes for
    /// 2 ms a batch, the GPU 5 ms a step: the loader sets the pace. Without
    /// its reads the GPU does; with a second worker the pace halves.
    #[test]
    fn a_pool_that_set_the_pace() {
        let mut j = Recorded::default();
        for _ in 0..20 {
            j.piece(22 * MS, Cause::InputIo, LOADER);
            j.launch(5 * MS);
        }
        j.sync();
        let pool = Pool {
            io: 20 * 20 * MS,
            cpu: 20 * 2 * MS,
            busiest: 20 * 22 * MS,
            busiest_life: j.at,
            ..Pool::default()
        };
        assert!(pool.paced());
        let recorded = j.at;
        assert_eq!(j.replay(pool, &Plan::default()).wall_ns, recorded);
        let fixed = j.replay(pool, &Plan::fix(Cause::InputIo));
        // 2 ms batches now come faster than 5 ms steps: the GPU's pace,
        // after the first batch.
        let gpu = 20 * (5 * MS + 10_000);
        assert!(
            fixed.wall_ns >= gpu && fixed.wall_ns < gpu + 5 * MS,
            "{}",
            fixed.wall_ns
        );
        // What little idle is left is the decoding's, not the reads'.
        assert_eq!(fixed.idle.get(&Cause::InputIo), None, "{:?}", fixed.idle);
        // Storage held at its recorded throughput: a second worker only
        // overlaps the decoding with the other's reads.
        let more = j.replay(
            pool,
            &Plan {
                add_workers: 1,
                ..Default::default()
            },
        );
        let expected = recorded as f64 * 20.0 / 22.0;
        assert!(
            (more.wall_ns as f64 - expected).abs() < 0.02 * expected,
            "{} vs {expected}",
            more.wall_ns
        );
    }

    /// One worker decoding 10 ms a batch for a 2 ms GPU step, on two CPUs:
    /// a second worker halves the pace, unless what else ran on the
    /// machine left it only a quarter of a CPU idle.
    #[test]
    fn more_workers_get_only_the_cpus_that_sat_idle() {
        let mut j = Recorded::default();
        for _ in 0..20 {
            j.piece(10 * MS, Cause::InputCpu, LOADER);
            j.launch(2 * MS);
        }
        j.sync();
        let pool = Pool {
            cpu: 20 * 10 * MS,
            busiest: 20 * 10 * MS,
            busiest_life: j.at,
            ..Pool::default()
        };
        let plan = Plan {
            add_workers: 1,
            ..Default::default()
        };
        let recorded = j.replay(pool, &Plan::default()).wall_ns;
        let free = j.replay(pool, &plan).wall_ns;
        assert!(
            (free as f64 / (recorded as f64 / 2.0) - 1.0).abs() < 0.05,
            "{free} vs {recorded}"
        );
        j.idle_cpus = Some(0.25);
        let crowded = j.replay(pool, &plan).wall_ns;
        let expected = recorded as f64 / 1.25;
        assert!(
            (crowded as f64 / expected - 1.0).abs() < 0.05,
            "{crowded} vs {expected}"
        );
    }

    /// A pool busy a fraction of the time only adds latency: the fixed
    /// cause's part of each wait goes, the rest stays.
    #[test]
    fn a_pool_that_did_not_set_the_pace() {
        let mut j = Recorded::default();
        for _ in 0..10 {
            j.piece(MS, Cause::InputIo, LOADER);
            j.piece(MS, Cause::CpuContention, LOADER);
            j.launch(MS);
            j.piece(8 * MS, Cause::CpuHost, FEEDER);
        }
        let pool = Pool {
            io: 10 * MS,
            runnable: 10 * MS,
            busiest: 20 * MS,
            busiest_life: j.at,
            ..Pool::default()
        };
        assert!(!pool.paced());
        let fixed = j.replay(pool, &Plan::fix(Cause::InputIo));
        assert_eq!(fixed.wall_ns, j.at - 10 * MS);
    }

    /// Host work preempted by a stranger: with the host work gone, its
    /// preemption goes too (but for the synchronize's share: as much of it
    /// as of the work); a wait for a CPU before the work starts (a
    /// wake-up) is not the work's and stays.
    #[test]
    fn a_preemption_inside_removed_host_work_goes_with_it() {
        let mut j = Recorded::default();
        for _ in 0..10 {
            j.launch(MS);
            j.sync();
            j.piece(MS, Cause::CpuContention, FEEDER);
            j.piece(4 * MS, Cause::CpuHost, FEEDER);
            j.piece(3 * MS, Cause::CpuContention, FEEDER);
            j.piece(4 * MS, Cause::CpuHost, FEEDER);
        }
        let fixed = j.replay(Pool::default(), &Plan::fix(Cause::CpuHost));
        let contention = fixed.idle.get(&Cause::CpuContention).copied();
        // The wake-ups' 1 ms a step stay (the last one's behind the GPU's
        // tail); of the 3 ms preemptions, as much as of the 8 ms of work
        // stays: the synchronize's 1 ms.
        // (The launches' own 10 µs count in the burst too: within 0.1 ms.)
        let share = 9 * (3 * MS / 8);
        assert!(
            contention.is_some_and(|ns| (9 * MS + share - MS / 10..=10 * MS + share).contains(&ns)),
            "{:?}",
            fixed.idle
        );
    }

    /// A feeder woken from its synchronize waits 1 ms for a CPU before its
    /// host work (on a busy machine, a wake-up's latency): with the sync
    /// taken out it no longer sleeps there, so it is not woken either and
    /// the waits go with the sync; taking out the host work instead keeps
    /// them (it still sleeps and is still woken).
    #[test]
    fn a_wake_up_goes_with_the_wait_it_ends() {
        let mut j = Recorded::default();
        for _ in 0..10 {
            j.launch(6 * MS);
            j.sync();
            j.piece(MS, Cause::CpuContention, FEEDER);
            j.piece(2 * MS, Cause::CpuHost, FEEDER);
        }
        let contention = |o: &Outcome| o.idle.get(&Cause::CpuContention).copied();
        // (The last one, after the GPU's last work, is tear-down.)
        let as_recorded = j.replay(Pool::default(), &Plan::default());
        assert_eq!(contention(&as_recorded), Some(9 * MS));
        let no_sync = j.replay(Pool::default(), &Plan::fix(Cause::Sync));
        assert_eq!(contention(&no_sync), None, "{:?}", no_sync.idle);
        // Launches and host work back to back, the GPU's 6 ms a step
        // setting the pace: the host's 2 ms hide behind it.
        assert!(
            no_sync.wall_ns <= 10 * 6 * MS + 3 * MS,
            "{}",
            no_sync.wall_ns
        );
        let no_host = j.replay(Pool::default(), &Plan::fix(Cause::CpuHost));
        assert!(
            contention(&no_host).is_some_and(|ns| (9 * MS..=10 * MS).contains(&ns)),
            "{:?}",
            no_host.idle
        );
    }

    /// A feeder that shared its CPU with a busy neighbour half and half
    /// after each synchronize: without the synchronize the replay keeps
    /// that share (16 ms a step for 8 of work, the GPU's 6 hidden behind
    /// it), and on a CPU of its own its waits for the neighbour's CPU go
    /// and its work stays (8 ms a step).
    #[test]
    fn a_cpu_of_its_own_takes_out_the_waits_for_it_not_the_work() {
        let mut j = Recorded::default();
        let (host, waits) = ((4 * MS, Cause::CpuHost), (4 * MS, Cause::CpuContention));
        j.synced_steps(10, 6 * MS, &[host, waits, host, waits]);
        let contention = |o: &Outcome| o.idle.get(&Cause::CpuContention).copied();
        let sharing = j.replay(Pool::default(), &Plan::fix(Cause::Sync));
        let alone = j.replay(Pool::default(), &Plan::fix_on_own_cpu(Cause::Sync));
        // (The last step's work, after the GPU's last work, is tear-down:
        // as recorded, its waits with it.)
        let step = 10_000 + 8 * MS;
        assert_eq!(alone.wall_ns, 10 * step + 8 * MS, "{:?}", alone.idle);
        assert_eq!(
            sharing.wall_ns,
            alone.wall_ns + 9 * 8 * MS,
            "{:?}",
            sharing.idle
        );
        assert!(contention(&sharing).is_some(), "{:?}", sharing.idle);
        assert_eq!(contention(&alone), None, "{:?}", alone.idle);
        // Host work between launches is what the GPU waits for now.
        assert!(alone
            .idle
            .get(&Cause::CpuHost)
            .is_some_and(|&ns| ns > 10 * MS));
    }

    /// Host work behind a synchronize, preempted twice: taking the host's
    /// stall out keeps the synchronize's share of the work (what overlap
    /// would have hidden), and of the preemptions as much as of the work —
    /// not those that happened to fall before the cut.
    #[test]
    fn a_run_cut_short_keeps_its_share_of_the_preemptions() {
        let mut j = Recorded::default();
        j.synced_steps(
            10,
            6 * MS,
            &[
                (4 * MS, Cause::CpuHost),
                (4 * MS, Cause::CpuContention),
                (3 * MS, Cause::CpuHost),
                (4 * MS, Cause::CpuContention),
                (2 * MS, Cause::CpuHost),
            ],
        );
        let fixed = j.replay(Pool::default(), &Plan::fix(Cause::CpuHost));
        // The synchronize waited the kernel's 6 ms: that much of each
        // step's 9 ms of work stays, and as much of its 8 ms of waits (the
        // last step's, after the GPU's last work, is tear-down).
        // (The launch's own 10 µs count in the burst too: within 0.1 ms.)
        let kept = 6 * MS;
        let share = 9 * (8 * MS * kept / (9 * MS));
        assert!(
            fixed
                .idle
                .get(&Cause::CpuContention)
                .is_some_and(|&ns| ns.abs_diff(share) <= MS / 10),
            "{share}: {:?}",
            fixed.idle
        );
        assert_eq!(fixed.idle.get(&Cause::CpuHost), None, "{:?}", fixed.idle);
    }

    /// A launch loop preempted between its launches and after them: with
    /// the launch overhead gone, so are those waits (nothing runs to be
    /// preempted); a wait before the loop, a wake-up after the sync, is
    /// not the launches' and stays.
    #[test]
    fn a_preemption_between_removed_launches_goes_with_them() {
        let mut j = Recorded::default();
        for _ in 0..10 {
            j.piece(MS, Cause::CpuContention, FEEDER);
            for _ in 0..5 {
                j.launch(MS / 10);
                j.piece(2 * MS, Cause::CpuContention, FEEDER);
            }
            j.sync();
        }
        let fixed = j.replay(Pool::default(), &Plan::fix(Cause::CpuLaunch));
        // Each step keeps its 1 ms wake-up (the first one's is start-up).
        assert_eq!(
            fixed.idle.get(&Cause::CpuContention).copied(),
            Some(9 * MS),
            "{:?}",
            fixed.idle
        );
        // Launches that stay keep the waits between them.
        let as_recorded = j.replay(Pool::default(), &Plan::default());
        assert_eq!(as_recorded.wall_ns, j.at);
    }

    /// A program's last work after its GPU's (saving, exiting) waits for
    /// the replayed GPU's too: without its host work the host gets ahead of
    /// the GPU, and the exit still comes after the GPU's last work.
    #[test]
    fn work_after_the_gpus_last_waits_for_it() {
        let mut j = Recorded::default();
        for _ in 0..10 {
            j.launch(MS);
            j.piece(2 * MS, Cause::CpuHost, FEEDER);
        }
        j.piece(20 * MS, Cause::Startup, FEEDER);
        let fixed = j.replay(Pool::default(), &Plan::fix(Cause::CpuHost));
        // Ten 1 ms kernels back to back after the first launch, the last
        // step's end 1 ms before the GPU's as recorded, then the 20 ms exit
        // (beside the GPU's work it would end at 20.01 ms).
        assert_eq!(fixed.wall_ns, 10_000 + 10 * MS - MS + 20 * MS);
    }

    /// Two workers that computed and waited for the two CPUs (getting 1.5
    /// of them): their waits for a CPU are the CPUs' limit, not work more
    /// workers share.
    #[test]
    fn more_workers_do_not_share_waits_for_a_cpu() {
        let pool = Pool {
            cpu: 180 * MS,
            on_cpu: 180 * MS,
            runnable: 60 * MS,
            busiest: 120 * MS,
            busiest_life: 120 * MS,
            ..Pool::default()
        };
        let k = pool.workers();
        let got = k * pool.cpu_share();
        let (before, after) = (
            pool.service(None, Woken::WithWork, k, k, got, false),
            pool.service(None, Woken::WithWork, k + 2.0, k, got, false),
        );
        assert!((after / before - 1.0).abs() < 1e-9, "{after} vs {before}");
    }

    /// Two workers that read, then waited for a CPU beside busy
    /// neighbours (half of one each), then computed: without the reads
    /// each worker's batch takes its wait and its computing only, although
    /// the CPUs they get stay what they were.
    #[test]
    fn reads_taken_out_of_workers_short_of_cpus_still_shorten_them() {
        let pool = Pool {
            io: 40 * MS,
            cpu: 60 * MS,
            on_cpu: 60 * MS,
            runnable: 60 * MS,
            busiest: 80 * MS,
            busiest_life: 80 * MS,
            ..Pool::default()
        };
        let k = pool.workers();
        let got = k * pool.cpu_share();
        let (before, after) = (
            pool.service(None, Woken::WithWork, k, k, got, true),
            pool.service(Some(Cause::InputIo), Woken::WithWork, k, k, got, true),
        );
        assert!((after / before - 0.75).abs() < 1e-9, "{after} vs {before}");
        // Without the computing, its waits for a CPU go too.
        let without_cpu = pool.service(Some(Cause::InputCpu), Woken::WithWork, k, k, got, true);
        assert!(
            (without_cpu / before - 0.25).abs() < 1e-9,
            "{without_cpu} vs {before}"
        );
    }

    /// Two workers that each read 40 ms, then waited 20 ms for a CPU as
    /// the reads ended (a neighbour's turn), then computed 60 ms beside
    /// busy neighbours with 60 ms more of waits between. The prediction
    /// keeps the share of the CPUs they got (60 of 140 ms each): without
    /// the reads a batch is 140 ms of computing and waiting. The other end
    /// (given a CPU) lets the waits on waking go with the reads, and the
    /// workers compute on the share they got in the rest (1/2): 120 ms.
    /// Without the computing, the nearer end scales those waits away with
    /// it, as the prediction does: the range is one figure.
    #[test]
    fn waits_for_a_cpu_on_waking_from_a_read_are_a_range() {
        let pool = Pool {
            io: 2 * 40 * MS,
            cpu: 2 * 60 * MS,
            on_cpu: 2 * 60 * MS,
            runnable: 2 * 80 * MS,
            runnable_io: 2 * 20 * MS,
            busiest: 180 * MS,
            busiest_life: 180 * MS,
            ..Pool::default()
        };
        let account = Account::default();
        let run = pool_only(pool, &account, 2.0, 0.0, 0.0);
        let pace = |plan: Plan| run.pace(&plan) * 180.0;
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let (io, io_alone) = (
            pace(Plan::fix(Cause::InputIo)),
            pace(Plan::fix_on_own_cpu(Cause::InputIo)),
        );
        assert!(near(io, 140.0) && near(io_alone, 120.0), "{io} {io_alone}");
        let (cpu, cpu_alone) = (
            pace(Plan::fix(Cause::InputCpu)),
            pace(Plan::fix_on_own_cpu(Cause::InputCpu)),
        );
        assert!(
            near(cpu, 40.0) && near(cpu_alone, 40.0),
            "{cpu} {cpu_alone}"
        );
    }

    /// A run of which only the pool's pace is asked.
    fn pool_only(
        pool: Pool,
        account: &Account,
        spare_cpus: f64,
        idle_cpus: f64,
        group_cpus: f64,
    ) -> Run<'_> {
        Run {
            window: (0, 0),
            busy: &[],
            feeder: FEEDER,
            account,
            calls: Calls::Memory(&[]),
            work: Issued {
                waiting: &[],
                met: &[],
                from: IssuedFrom::Memory {
                    work: &[],
                    mine: Vec::new(),
                    others: Vec::new(),
                },
            },
            pool,
            spare_cpus,
            idle_cpus,
            group_cpus,
            prepared: Default::default(),
        }
    }

    /// One worker that got 0.95 of a CPU (the rest of its working time it
    /// waited for one), and 0.75 of a CPU idle beside it: a second worker
    /// makes the pool compute on 1.7 CPUs, not on 1.75 as if the first had
    /// had a whole one.
    #[test]
    fn more_workers_add_the_idle_cpus_to_those_the_pool_got() {
        let pool = Pool {
            cpu: 95 * MS,
            runnable: 5 * MS,
            on_cpu: 95 * MS,
            busiest: 100 * MS,
            busiest_life: 100 * MS,
            ..Pool::default()
        };
        let account = Account::default();
        let run =
            |idle_cpus: f64, spare_cpus: f64| pool_only(pool, &account, spare_cpus, idle_cpus, 0.0);
        let more = Plan {
            add_workers: 1,
            ..Plan::default()
        };
        assert!((pool.cpu_share() - 0.95).abs() < 1e-9);
        // Computing bound before (95 ms on 0.95 of a CPU: 100 ms), after
        // on 1.7 CPUs.
        let pace = run(0.75, 2.0).pace(&more);
        assert!((pace - 95.0 / 1.7 / 100.0).abs() < 1e-9, "{pace}");
        // Nothing idle: a second worker only shares the one CPU.
        assert!((run(0.0, 2.0).pace(&more) - 1.0).abs() < 1e-9);
        // Nothing added, nothing changes.
        assert!((run(0.75, 2.0).pace(&Plan::default()) - 1.0).abs() < 1e-9);
    }

    /// Two workers on two CPUs got one between them: busy tasks of the
    /// job's own group held the other. The kernel shares a group's CPUs
    /// thread by thread, so two more workers (four against what counts as
    /// two rivals) compute on 4/6 of the two CPUs; tasks of another group
    /// keep their group's share, and more workers gain nothing from them.
    #[test]
    fn more_workers_win_cpus_from_their_own_group_only() {
        let pool = Pool {
            cpu: 100 * MS,
            runnable: 100 * MS,
            on_cpu: 100 * MS,
            busiest: 100 * MS,
            busiest_life: 100 * MS,
            ..Pool::default()
        };
        let account = Account::default();
        let run = |group_cpus: f64| pool_only(pool, &account, 2.0, 0.0, group_cpus);
        let more = Plan {
            add_workers: 2,
            ..Plan::default()
        };
        assert!((pool.workers() - 2.0).abs() < 1e-9);
        let pace = run(1.0).pace(&more);
        assert!((pace - 1.0 / (2.0 * 4.0 / 6.0)).abs() < 1e-9, "{pace}");
        assert!((run(0.0).pace(&more) - 1.0).abs() < 1e-9);
        // The range's other end: the rivals keep theirs, as if in another
        // group.
        let keep = Plan {
            group_keeps_cpus: true,
            ..more
        };
        assert!((run(1.0).pace(&keep) - 1.0).abs() < 1e-9);
        assert!((run(1.0).won_with(2) - (4.0 / 3.0 - 1.0)).abs() < 1e-9);
        assert_eq!(run(0.0).won_with(2), 0.0);
        // Without their rivals (cpu.contention fixed) two workers have
        // both CPUs.
        let pace = run(1.0).pace(&Plan::fix(Cause::CpuContention));
        assert!((pace - 0.5).abs() < 1e-9, "{pace}");
    }

    #[test]
    fn the_replayed_ends_answer_as_a_scan_of_all_of_them_would() {
        let mut rng = crate::testing::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut rand = |n: u64| rng.below(n);
        let (mut ends, mut all) = (Ends::default(), BTreeMap::<u64, u64>::new());
        let mut at = 1_000;
        for _ in 0..5_000 {
            // Mostly in order, some late by more than the few looked at
            // first from the back.
            let late = match rand(10) {
                0 => rand(400),
                _ => rand(3),
            };
            let recorded = (at + rand(20)).saturating_sub(late);
            let end = rand(1 << 20);
            ends.put(recorded, end);
            let e = all.entry(recorded).or_default();
            *e = (*e).max(end);
            at += rand(15);
            let (from, t) = (at.saturating_sub(rand(300)), at.saturating_sub(rand(60)));
            let want = all
                .range(..=t)
                .next_back()
                .filter(|(&r, _)| r >= from)
                .map(|(_, &e)| e);
            assert_eq!(ends.last(from, t), want, "from {from} t {t}");
        }
    }

    #[test]
    fn each_stream_is_free_when_its_own_last_work_ends() {
        let mut free = StreamsFree::default();
        assert_eq!(free.get(7), 0);
        free.set(7, 10);
        free.set(3, 20);
        free.set(7, 30);
        assert_eq!((free.get(3), free.get(7), free.get(9)), (20, 30, 0));
    }
}
