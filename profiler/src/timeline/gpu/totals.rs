//! What the analysis reads of a recording's GPU work and CUDA calls as a
//! whole: sums, counts, who launched most, and the few spans it keeps (the
//! collectives), added up item by item — from a timeline's whole GPU side,
//! or as a long recording's spooled records pass once — so that no reader
//! needs every item at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{api_role, ApiRole, Call, CallName, GpuSide, SyncWait, Tid, What, Work};
use gapscope_wire::record::{copy_kind, memory_kind};

/// Count, time and bytes of one kind of GPU work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    pub count: u64,
    pub total_ns: u64,
    pub bytes: u64,
}

impl OpStats {
    fn add(&mut self, start: u64, end: u64, bytes: u64) {
        self.count += 1;
        self.total_ns += end.saturating_sub(start);
        self.bytes += bytes;
    }
}

/// A kernel of a collective-communication library (NCCL names all of its
/// kernels `nccl...`: ncclKernel_AllReduce_..., ncclDevKernel_...).
pub fn is_communication_kernel(name: &str) -> bool {
    // Asked of every kernel: a plain loop, not iterator adapters (6% of a
    // launch-bound recording's whole analysis in a debug build). `| 0x20`
    // lower-cases ASCII letters and maps nothing else onto them.
    let b = name.as_bytes();
    let mut i = 0;
    while i + 4 <= b.len() {
        if b[i] | 0x20 == b'n'
            && b[i + 1] | 0x20 == b'c'
            && b[i + 2] | 0x20 == b'c'
            && b[i + 3] | 0x20 == b'l'
        {
            return true;
        }
        i += 1;
    }
    false
}

/// Kernel durations are counted in these buckets (ns): under 10 µs, to
/// 100 µs, to 1 ms, and longer.
pub const KERNEL_BUCKETS: [u64; 3] = [10_000, 100_000, 1_000_000];

/// One GPU's work, summed.
#[derive(Clone, Debug, Default)]
pub struct DeviceTotals {
    /// Processes that put work on it, in order of first sight.
    pub pids: Vec<u32>,
    /// Work items by the thread whose call launched them.
    pub launchers: ahash::AHashMap<Tid, u64>,
    pub kernels: OpStats,
    /// Copies by (copy kind, host memory kind: 0 for none), as
    /// `gapscope_wire::record` numbers them.
    pub copies: BTreeMap<(u8, u8), OpStats>,
    pub memsets: OpStats,
    /// Kernels by duration, in [`KERNEL_BUCKETS`].
    pub kernel_durations: [u64; 4],
    /// Communication kernels by name: (count, total ns).
    pub communication: BTreeMap<Arc<str>, (u64, u64)>,
    /// Its collectives: its communication kernels' spans, sorted.
    pub collectives: Vec<(u64, u64)>,
}

impl DeviceTotals {
    /// The feeder most often seen issuing work: the attribution's fallback
    /// for gaps whose closing work has no known issuer, and the thread a
    /// what-if replays.
    pub fn main_feeder(&self) -> Option<Tid> {
        self.launchers
            .iter()
            .max_by_key(|(t, n)| (**n, **t))
            .map(|(t, _)| *t)
    }

    /// Copies by their direction's name ("HtoD pageable", ...).
    pub fn copies_by_name(&self) -> BTreeMap<String, OpStats> {
        let mut out: BTreeMap<String, OpStats> = BTreeMap::new();
        for (&(kind, host), s) in &self.copies {
            let mut key = copy_kind::name(kind).to_string();
            if host != 0 {
                key += " ";
                key += memory_kind::name(host);
            }
            let e = out.entry(key).or_default();
            e.count += s.count;
            e.total_ns += s.total_ns;
            e.bytes += s.bytes;
        }
        out
    }

    /// Counts who launched `w`.
    pub(super) fn add_launch(&mut self, w: &Work) {
        if let Some((t, _)) = w.launch {
            *self.launchers.entry(t).or_default() += 1;
        }
    }

    fn work(&mut self, w: &Work) {
        if !self.pids.contains(&w.pid) {
            self.pids.push(w.pid);
        }
        self.add_launch(w);
        let (s, e) = w.span();
        match &w.what {
            What::Kernel(k) => {
                self.kernels.add(s, e, 0);
                let d = e.saturating_sub(s);
                let bucket = KERNEL_BUCKETS.iter().take_while(|&&b| d >= b).count();
                self.kernel_durations[bucket] += 1;
                if is_communication_kernel(&k.name) {
                    let c = self.communication.entry(k.name.clone()).or_default();
                    c.0 += 1;
                    c.1 += d;
                    self.collectives.push((s, e));
                }
            }
            &What::Memcpy {
                bytes,
                copy_kind: kind,
                src_kind,
                dst_kind,
            } => {
                let host = match kind {
                    copy_kind::HTOD => src_kind,
                    copy_kind::DTOH => dst_kind,
                    _ => 0,
                };
                self.copies
                    .entry((kind, host))
                    .or_default()
                    .add(s, e, bytes);
            }
            &What::Memset { bytes } => self.memsets.add(s, e, bytes),
        }
    }
}

/// One host thread's CUDA calls, summed by function.
#[derive(Clone, Debug, Default)]
pub struct CallTotals {
    pub count: u64,
    /// By function: (count, total ns, longest ns).
    pub by_name: ahash::AHashMap<CallName, (u64, u64, u64)>,
}

/// A recording's GPU work and CUDA calls, summed.
#[derive(Clone, Debug, Default)]
pub struct GpuTotals {
    /// By device id.
    pub devices: BTreeMap<u32, DeviceTotals>,
    pub threads: BTreeMap<Tid, CallTotals>,
    /// Synchronization waits by type: (count, total ns).
    pub syncs: BTreeMap<u8, (u64, u64)>,
}

impl GpuTotals {
    /// The totals of a whole GPU side.
    pub fn of(side: &GpuSide) -> GpuTotals {
        let mut t = GpuTotals::default();
        for d in &side.devices {
            let dev = t.devices.entry(d.id).or_default();
            for w in &d.work {
                dev.work(w);
            }
        }
        for (&tid, calls) in &side.calls {
            for c in calls {
                t.call(tid, c);
            }
        }
        for s in &side.syncs {
            t.sync(s);
        }
        t.finish();
        t
    }

    /// A piece of work on its device (`w.device`, a device id).
    pub fn work(&mut self, w: &Work) {
        self.devices.entry(w.device).or_default().work(w);
    }

    pub fn call(&mut self, t: Tid, c: &Call) {
        let th = self.threads.entry(t).or_default();
        th.count += 1;
        let dur = c.end.saturating_sub(c.start);
        let e = match th.by_name.get_mut(&c.name) {
            Some(e) => e,
            None => th.by_name.entry(c.name.clone()).or_default(),
        };
        e.0 += 1;
        e.1 += dur;
        e.2 = e.2.max(dur);
    }

    pub fn sync(&mut self, s: &SyncWait) {
        let e = self.syncs.entry(s.sync_type).or_default();
        e.0 += 1;
        e.1 += s.end.saturating_sub(s.start);
    }

    /// Puts what is kept in order, once every item has been added.
    pub fn finish(&mut self) {
        for d in self.devices.values_mut() {
            d.collectives.sort_unstable();
        }
    }

    /// CUDA calls of `role`, every thread's: (count, total ns).
    pub fn api_calls(&self, role: ApiRole) -> (u64, u64) {
        let mut roles: HashMap<&CallName, ApiRole> = HashMap::new();
        let mut out = (0, 0);
        for t in self.threads.values() {
            for (name, &(n, ns, _)) in &t.by_name {
                let r = *roles.entry(name).or_insert_with(|| api_role(&name.name()));
                if r == role {
                    out.0 += n;
                    out.1 += ns;
                }
            }
        }
        out
    }

    /// How many CUDA calls thread `t` made.
    pub fn calls_of(&self, t: Tid) -> u64 {
        self.threads.get(&t).map_or(0, |c| c.count)
    }
}
