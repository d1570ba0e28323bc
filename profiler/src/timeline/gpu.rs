//! The GPU side of the timeline: every piece of GPU work on its device and
//! stream, with the host call that launched it (correlation resolved here,
//! once), each host thread's CUDA calls and NVTX ranges, and the host's
//! synchronization waits. The analysis and every renderer read these; none
//! goes back to the raw records.

use std::collections::{BTreeMap, HashMap};

use gapscope_cupti::{ApiDomain, GpuRecord};

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
    /// Seen by a libcuda uprobe, with the stream handle or byte count it
    /// was given (0 if none).
    Uprobe { function: String, arg: u64 },
}

impl CallName {
    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            CallName::Api(domain, cbid) => gapscope_cupti::cbid::api_name(*domain, *cbid),
            CallName::Uprobe { function, .. } => std::borrow::Cow::Borrowed(function),
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

/// One piece of GPU work (a kernel, copy or memset) and who launched it.
#[derive(Clone, Debug, PartialEq)]
pub struct Work {
    /// The process whose GPU source reported it.
    pub pid: u32,
    /// The record as reported: always `Kernel`, `Memcpy` or `Memset`.
    pub record: GpuRecord,
    /// The host thread whose call launched it, and that call's start.
    pub launch: Option<(Tid, u64)>,
}

impl Work {
    pub fn start(&self) -> u64 {
        self.record.start()
    }

    pub fn span(&self) -> (u64, u64) {
        self.record.span().expect("work records have a span")
    }

    pub fn stream(&self) -> u32 {
        match &self.record {
            GpuRecord::Kernel { stream, .. }
            | GpuRecord::Memcpy { stream, .. }
            | GpuRecord::Memset { stream, .. } => *stream,
            _ => 0,
        }
    }
}

/// One GPU: its name, how it was seen, and its work in start order.
#[derive(Clone, Debug, Default)]
pub struct Device {
    pub id: u32,
    pub name: String,
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
}

impl GpuSide {
    /// Takes the session's GPU records and host ops: the timeline owns them
    /// from here on. (The libcuda calls among its events come as they are
    /// replayed.)
    pub fn build(session: &mut Session) -> GpuSide {
        let records = std::mem::take(&mut session.gpu);
        let mut side = GpuSide::default();
        let mut names: BTreeMap<u32, String> = BTreeMap::new();
        // A role per API id, decided once: the names repeat millions of times.
        let mut roles: HashMap<(ApiDomain, u32), ApiRole> = HashMap::new();
        let mut issuer: ahash::AHashMap<(u32, u32), (Tid, u64)> = ahash::AHashMap::new();
        let mut work: Vec<Work> = Vec::new();
        for (pid, r) in records {
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
                    let role = *roles
                        .entry((domain, cbid))
                        .or_insert_with(|| api_role(&CallName::Api(domain, cbid).name()));
                    side.calls.entry((pid, tid)).or_default().push(Call {
                        start,
                        end,
                        role,
                        name: CallName::Api(domain, cbid),
                        correlation: Some(correlation),
                    });
                    issuer.insert((pid, correlation), ((pid, tid), start));
                }
                GpuRecord::Kernel { .. } | GpuRecord::Memcpy { .. } | GpuRecord::Memset { .. } => {
                    work.push(Work {
                        pid,
                        record: r,
                        launch: None,
                    })
                }
                GpuRecord::Sync {
                    start,
                    end,
                    sync_type,
                    ..
                } => side.syncs.push(SyncWait {
                    start,
                    end,
                    sync_type,
                }),
                GpuRecord::Range {
                    start,
                    end,
                    tid,
                    name,
                    domain,
                } => side.ranges.entry((pid, tid)).or_default().push(Range {
                    start,
                    end,
                    name,
                    domain,
                }),
                GpuRecord::Device { id, name } => {
                    names.entry(id).or_insert(name);
                }
                GpuRecord::Marker { .. } => {}
            }
        }
        for op in std::mem::take(&mut session.host_ops) {
            side.host_ops.entry((op.pid, op.tid)).or_default().push(op);
        }
        for ops in side.host_ops.values_mut() {
            ops.sort_by_key(|o| (o.start, std::cmp::Reverse(o.end)));
        }

        let source_of = |pid: u32| {
            session
                .gpu_sources
                .iter()
                .find(|s| s.pid == pid)
                .map(|s| s.kind)
                .unwrap_or_default()
        };
        let mut by_dev: BTreeMap<u32, Device> = BTreeMap::new();
        for mut w in work {
            let (device, correlation) = match &w.record {
                GpuRecord::Kernel {
                    device,
                    correlation,
                    ..
                }
                | GpuRecord::Memcpy {
                    device,
                    correlation,
                    ..
                }
                | GpuRecord::Memset {
                    device,
                    correlation,
                    ..
                } => (*device, *correlation),
                _ => unreachable!("only work is kept"),
            };
            w.launch = issuer.get(&(w.pid, correlation)).copied();
            let d = by_dev.entry(device).or_insert_with(|| Device {
                id: device,
                source: source_of(w.pid),
                ..Default::default()
            });
            if !d.pids.contains(&w.pid) {
                d.pids.push(w.pid);
            }
            d.work.push(w);
        }
        let nvml: BTreeMap<u32, &NvmlDevice> =
            session.nvml_devices.iter().map(|d| (d.index, d)).collect();
        for d in by_dev.values_mut() {
            d.work.sort_by_key(Work::start);
            d.name = nvml
                .get(&d.id)
                .map(|n| n.name.clone())
                .or_else(|| names.get(&d.id).cloned())
                .unwrap_or_else(|| format!("GPU {}", d.id));
        }
        side.devices = by_dev.into_values().collect();
        side
    }

    /// Where the attribution will read thread states: the holes between
    /// each GPU's busy spans (a superset of the holes inside any window),
    /// and the calls that launched kernels (the clock checks).
    pub fn wanted(&self) -> super::Wanted {
        let mut gaps = Vec::new();
        for d in &self.devices {
            // Work is in start order: merging as it comes gives the busy
            // spans, the holes lie between them.
            let mut busy_until: Option<u64> = None;
            for w in &d.work {
                let (s, e) = w.span();
                match busy_until {
                    Some(until) if s > until => {
                        gaps.push((until, s));
                        busy_until = Some(e);
                    }
                    Some(until) => busy_until = Some(until.max(e)),
                    None => busy_until = Some(e),
                }
            }
        }
        gaps.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(gaps.len());
        for (s, e) in gaps {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let mut launches: HashMap<Tid, Vec<u64>> = HashMap::new();
        for w in self.devices.iter().flat_map(|d| &d.work) {
            if let (GpuRecord::Kernel { .. }, Some((t, at))) = (&w.record, w.launch) {
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
        }
    }

    /// A libcuda call a uprobe saw (calls are put in order at the end).
    pub(super) fn uprobe_call(&mut self, pid: u32, tid: u32, ts: u64, dur: u64, f: &str, arg: u64) {
        self.calls.entry((pid, tid)).or_default().push(Call {
            start: ts,
            end: ts + dur,
            role: api_role(f),
            name: CallName::Uprobe {
                function: f.to_string(),
                arg,
            },
            correlation: None,
        });
    }

    pub fn device_name(&self, id: u32) -> Option<&str> {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .map(|d| d.name.as_str())
    }
}
