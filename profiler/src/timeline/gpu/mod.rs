//! The GPU side of the timeline: every piece of GPU work on its device and
//! stream, with the host call that launched it (correlation resolved here,
//! once), each host thread's CUDA calls and NVTX ranges, and the host's
//! synchronization waits. The analysis and every renderer read these; none
//! goes back to the raw records.

pub mod spooled;
pub mod totals;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use gapscope_wire::ApiDomain;

use crate::session::{HostOp, NvmlDevice, Session, SourceKind};

pub type Tid = (u32, u32);

/// What a CUDA API call does, for attribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiRole {
    Launch,
    Sync,
    Memory,
    Other,
}

pub fn api_role(name: &str) -> ApiRole {
    let n = name.trim_start_matches('_');
    // cudaEventQuery polls without waiting: not a synchronization.
    if n.contains("Synchronize") || n.contains("WaitEvent") {
        ApiRole::Sync
    } else if n.contains("Launch") {
        ApiRole::Launch
    } else if n.contains("Memcpy")
        || n.contains("Memset")
        || n.contains("Malloc")
        || n.contains("MemAlloc")
        || n.contains("Free")
        || n.contains("HostAlloc")
        || n.contains("HostRegister")
    {
        ApiRole::Memory
    } else {
        ApiRole::Other
    }
}

/// Which function a CUDA call was.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CallName {
    /// Reported by CUPTI (or an import) by callback id.
    Api(ApiDomain, u32),
    /// Seen by a libcuda uprobe. Boxed: the variant's name would make
    /// every call, CUPTI's millions too, two words longer.
    Uprobe(Box<Uprobed>),
}

/// A libcuda call as a uprobe saw it: the function, and the stream handle
/// or byte count it was given (0 if none).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Uprobed {
    pub function: String,
    pub arg: u64,
}

impl CallName {
    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            CallName::Api(domain, cbid) => gapscope_wire::cbid::api_name(*domain, *cbid),
            CallName::Uprobe(u) => std::borrow::Cow::Borrowed(&u.function),
        }
    }
}

/// One CUDA call of a host thread.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub start: u64,
    pub end: u64,
    pub role: ApiRole,
    pub name: CallName,
    /// The id that ties it to the GPU work it launched (CUPTI calls only).
    pub correlation: Option<u32>,
}

// A long run holds millions of calls.
const _: () = assert!(std::mem::size_of::<Call>() == 48);

/// One piece of GPU work (a kernel, copy or memset) and who launched it:
/// what the analysis and every renderer read of it, taken apart once from
/// the record it came in (a long run holds millions).
#[derive(Clone, Debug, PartialEq)]
pub struct Work {
    pub start: u64,
    pub end: u64,
    /// The host thread whose call launched it, and that call's start.
    pub launch: Option<(Tid, u64)>,
    /// The process whose GPU source reported it.
    pub pid: u32,
    /// The GPU (see [`physical_ids`]) and stream it ran on.
    pub device: u32,
    pub stream: u32,
    /// The id that ties it to the call that launched it.
    pub correlation: u32,
    pub what: What,
}

const _: () = assert!(std::mem::size_of::<Work>() == 72);

/// What a piece of GPU work was.
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// Shared: a job launches the same few kernels, shaped alike, millions
    /// of times.
    Kernel(std::sync::Arc<Kernel>),
    /// `copy_kind` and the memory kinds as `gapscope_wire::record` numbers
    /// them.
    Memcpy {
        bytes: u64,
        copy_kind: u8,
        src_kind: u8,
        dst_kind: u8,
    },
    Memset {
        bytes: u64,
    },
}

/// A kernel as launched: its name as CUPTI gives it (mangled for C++) and
/// its shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub name: std::sync::Arc<str>,
    pub grid: [i32; 3],
    pub block: [i32; 3],
}

impl Work {
    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn span(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    pub fn stream(&self) -> u32 {
        self.stream
    }

    pub fn correlation(&self) -> u32 {
        self.correlation
    }

    /// The kernel it was, if it was one.
    pub fn kernel(&self) -> Option<&Kernel> {
        match &self.what {
            What::Kernel(k) => Some(k),
            _ => None,
        }
    }
}

/// The feeder most often seen issuing work (`work`: in start order, with
/// who launched it): the attribution's fallback for gaps whose closing work
/// has no known issuer, and the thread a what-if replays.
pub fn main_feeder(work: &[Work]) -> Option<Tid> {
    let mut d = totals::DeviceTotals::default();
    for w in work {
        d.add_launch(w);
    }
    d.main_feeder()
}

/// Words that name a step when a number follows.
const STEP_WORDS: [&str; 3] = ["step", "iteration", "iter"];

/// A range name as (its name without the number, the number), when it
/// names a numbered step: "ProfilerStep#12" → ("ProfilerStep#", 12).
pub fn step_number(name: &str) -> Option<(&str, u64)> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || digits > 18 {
        return None;
    }
    let (stem, number) = name.split_at(name.len() - digits);
    let word = stem
        .trim_end_matches([' ', '#', '_', '-', ':', '='])
        .to_ascii_lowercase();
    if !STEP_WORDS.iter().any(|w| word.ends_with(w)) {
        return None;
    }
    Some((stem, number.parse().ok()?))
}

/// One GPU: its name, how it was seen, and its work in start order.
#[derive(Clone, Debug, Default)]
pub struct Device {
    pub id: u32,
    pub name: String,
    /// Its UUID, as its processes' driver gave it.
    pub uuid: Option<String>,
    pub source: SourceKind,
    /// Processes that put work on it, in order of first sight.
    pub pids: Vec<u32>,
    pub work: Vec<Work>,
}

/// An NVTX range a thread pushed.
#[derive(Clone, Debug, PartialEq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
    pub name: String,
    pub domain: String,
}

/// A synchronization the host waited in, as CUPTI reported it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyncWait {
    pub start: u64,
    pub end: u64,
    pub sync_type: u8,
}

#[derive(Clone, Debug, Default)]
pub struct GpuSide {
    /// By device id.
    pub devices: Vec<Device>,
    /// Each thread's CUDA calls, sorted by start.
    pub calls: BTreeMap<Tid, Vec<Call>>,
    /// Each thread's NVTX ranges.
    pub ranges: BTreeMap<Tid, Vec<Range>>,
    pub syncs: Vec<SyncWait>,
    /// Profiler ops of imported traces, per thread, sorted by start.
    pub host_ops: BTreeMap<Tid, Vec<HostOp>>,
    /// Its work and calls summed, once the timeline has ended.
    pub totals: totals::GpuTotals,
    /// It holds only the work and calls around the events being replayed
    /// (a long recording's, read as its events are: `spooled::GpuFeed`);
    /// `totals` are the whole recording's.
    pub windowed: bool,
}

/// Which GPU each (process, CUDA ordinal) is, as the ids the report gives
/// GPUs. An ordinal counts the GPUs one process may see
/// (CUDA_VISIBLE_DEVICES), so two processes' ordinals name one GPU only
/// when their UUIDs agree. A GPU whose UUID NVML lists takes its NVML
/// index; any other keeps the smallest ordinal its processes gave it, the
/// first to want an id (ordinal-only GPUs first, then by UUID) keeping it
/// and the others numbered past every id wanted. An ordinal without a UUID
/// (older shims, traces, uprobes) is that ordinal's GPU, for every process.
pub fn physical_ids(
    used: &BTreeSet<(u32, u32)>,
    uuids: &BTreeMap<(u32, u32), String>,
    nvml: &[NvmlDevice],
) -> BTreeMap<(u32, u32), u32> {
    #[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
    enum Gpu<'a> {
        Ordinal(u32),
        Uuid(&'a str),
    }
    let gpu_of = |pid: u32, ordinal: u32| {
        uuids
            .get(&(pid, ordinal))
            .map_or(Gpu::Ordinal(ordinal), |u| Gpu::Uuid(u))
    };
    let mut wants: BTreeMap<Gpu, u32> = BTreeMap::new();
    for &(pid, ordinal) in used {
        let gpu = gpu_of(pid, ordinal);
        let want = match gpu {
            Gpu::Uuid(u) => nvml
                .iter()
                .find(|d| d.uuid == u)
                .map_or(ordinal, |d| d.index),
            Gpu::Ordinal(o) => o,
        };
        let w = wants.entry(gpu).or_insert(want);
        *w = (*w).min(want);
    }
    let mut order: Vec<(u32, Gpu)> = wants.iter().map(|(g, &w)| (w, g.clone())).collect();
    order.sort();
    let mut next = order.iter().map(|x| x.0 + 1).max().unwrap_or(0);
    let mut taken: BTreeSet<u32> = BTreeSet::new();
    let mut ids: BTreeMap<Gpu, u32> = BTreeMap::new();
    for (want, gpu) in order {
        let id = if taken.insert(want) {
            want
        } else {
            next += 1;
            next - 1
        };
        taken.insert(id);
        ids.insert(gpu, id);
    }
    used.iter()
        .map(|&(pid, ordinal)| ((pid, ordinal), ids[&gpu_of(pid, ordinal)]))
        .collect()
}

impl GpuSide {
    /// Takes the session's GPU records and host ops: the timeline owns them
    /// from here on. (The libcuda calls among its events come as they are
    /// replayed.) The session's records have been checked against its
    /// window already.
    pub fn build(session: &mut Session) -> GpuSide {
        let mut intake = spooled::GpuIntake::new(true);
        for (pid, r) in std::mem::take(&mut session.gpu) {
            intake.add(pid, r);
        }
        let mut spools = intake.finish();
        let (side, _, plan) = spools.scan(session, (0, u64::MAX));
        spools.whole(side, &plan)
    }

    /// Where the attribution will read thread states: the holes between
    /// each GPU's busy spans (a superset of the holes inside any window),
    /// and the calls that launched kernels (the clock checks).
    pub fn wanted(&self) -> super::Wanted {
        use crate::intervals::{holes, union};
        let mut gaps = Vec::new();
        for d in &self.devices {
            let busy = union(d.work.iter().map(Work::span).collect());
            // Start-up too: whether the job's loaders held the CPUs the
            // feeder waited for before its first work (`attribute::account`).
            if let Some(&(first, _)) = busy.first() {
                gaps.push((0, first));
            }
            gaps.extend(holes(&busy));
        }
        let merged = union(gaps);
        let mut launches: HashMap<Tid, Vec<u64>> = HashMap::new();
        for w in self.devices.iter().flat_map(|d| &d.work) {
            if let (What::Kernel(_), Some((t, at))) = (&w.what, w.launch) {
                launches.entry(t).or_default().push(at);
            }
        }
        for v in launches.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        super::Wanted {
            gaps: merged,
            launches,
            // The replay reads their every moment (`attribute::account`).
            whole: self
                .devices
                .iter()
                .filter_map(|d| main_feeder(&d.work))
                .collect(),
        }
    }

    /// A libcuda call a uprobe saw (calls are put in order at the end).
    pub(super) fn uprobe_call(&mut self, pid: u32, tid: u32, ts: u64, dur: u64, f: &str, arg: u64) {
        let call = Call {
            start: ts,
            end: ts + dur,
            role: api_role(f),
            name: CallName::Uprobe(Box::new(Uprobed {
                function: f.to_string(),
                arg,
            })),
            correlation: None,
        };
        if self.windowed {
            self.totals.call((pid, tid), &call);
        }
        self.calls.entry((pid, tid)).or_default().push(call);
    }

    pub fn device_name(&self, id: u32) -> Option<&str> {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .map(|d| d.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(
        used: &[(u32, u32)],
        uuids: &[((u32, u32), &str)],
        nvml: &[(u32, &str)],
    ) -> Vec<((u32, u32), u32)> {
        let used: BTreeSet<(u32, u32)> = used.iter().copied().collect();
        let uuids = uuids.iter().map(|&(k, u)| (k, u.to_string())).collect();
        let nvml: Vec<NvmlDevice> = nvml
            .iter()
            .map(|&(index, uuid)| NvmlDevice {
                index,
                name: String::new(),
                uuid: uuid.into(),
                memory_total: 0,
            })
            .collect();
        physical_ids(&used, &uuids, &nvml).into_iter().collect()
    }

    #[test]
    fn gpus_are_told_apart_by_uuid_not_by_ordinal() {
        // No UUIDs: an ordinal is one GPU for every process.
        assert_eq!(
            ids(&[(1, 0), (2, 0), (2, 1)], &[], &[]),
            [((1, 0), 0), ((2, 0), 0), ((2, 1), 1)]
        );
        // Two ranks, each seeing its own GPU as 0 (CUDA_VISIBLE_DEVICES).
        let two = [((1, 0), "GPU-b"), ((2, 0), "GPU-a")];
        assert_eq!(
            ids(&[(1, 0), (2, 0)], &two, &[]),
            [((1, 0), 1), ((2, 0), 0)]
        );
        // Two processes sharing one GPU.
        let one = [((1, 0), "GPU-a"), ((2, 0), "GPU-a")];
        assert_eq!(
            ids(&[(1, 0), (2, 0)], &one, &[]),
            [((1, 0), 0), ((2, 0), 0)]
        );
        // NVML knows them: its indexes.
        let nvml = [(3, "GPU-a"), (5, "GPU-b")];
        assert_eq!(
            ids(&[(1, 0), (2, 0)], &two, &nvml),
            [((1, 0), 5), ((2, 0), 3)]
        );
        // One process sees both, another only the second as its 0: the
        // second is one GPU.
        let mixed = [((1, 0), "GPU-a"), ((1, 1), "GPU-b"), ((2, 0), "GPU-b")];
        assert_eq!(
            ids(&[(1, 0), (1, 1), (2, 0)], &mixed, &[]),
            [((1, 0), 0), ((1, 1), 1), ((2, 0), 1)]
        );
    }
}
