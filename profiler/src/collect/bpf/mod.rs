//! The kernel side seen from userspace: load `ebpf/gapscope.bpf.c` (built by
//! build.rs), seed the process-tree filter, attach every program, read the
//! ring buffer and the drop counters.

pub mod abi;
pub mod cuda;
pub mod decode;
mod tracked;

pub use decode::{decode, decode_pycode};

use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{PerfEvent, RawTracePoint, UProbe};
use aya::{include_bytes_aligned, Ebpf, EbpfLoader};

static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gapscope.bpf.o"));

/// Raw tracepoints in the order they are attached: process lifetime first,
/// so a fork racing with the attach itself is never missed by the filter.
/// The per-syscall hooks, left out with `syscall_hooks: false`.
const SYSCALL_HOOKS: [&str; 2] = ["gs_sys_enter", "gs_sys_exit"];

const RAW_TRACEPOINTS: &[(&str, &str)] = &[
    ("gs_sched_process_fork", "sched_process_fork"),
    ("gs_sched_process_exec", "sched_process_exec"),
    ("gs_sched_process_exit", "sched_process_exit"),
    ("gs_sched_switch", "sched_switch"),
    ("gs_sched_waking", "sched_waking"),
    ("gs_sched_wakeup_new", "sched_wakeup_new"),
    ("gs_sys_enter", "sys_enter"),
    ("gs_sys_exit", "sys_exit"),
    ("gs_page_fault_user", "page_fault_user"),
    ("gs_inet_sock_set_state", "inet_sock_set_state"),
    ("gs_tcp_retransmit_skb", "tcp_retransmit_skb"),
];

/// The tracepoints a recording attaches to, by their kernel names: every
/// raw tracepoint but the per-syscall hooks unless `syscall_hooks`.
/// (Beside them: cpu-clock sampling, and uprobes on libcuda where mapped.)
pub fn tracepoints(syscall_hooks: bool) -> impl Iterator<Item = &'static str> {
    attached(syscall_hooks).map(|&(_, tp)| tp)
}

/// The (program, tracepoint) pairs attached.
fn attached(syscall_hooks: bool) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    RAW_TRACEPOINTS
        .iter()
        .filter(move |(name, _)| syscall_hooks || !SYSCALL_HOOKS.contains(name))
}

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the BPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("BPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("BPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("BPF object lacks {0}")]
    Missing(&'static str),
    #[error("mapping the tracked-process set: {0}")]
    Mmap(#[source] std::io::Error),
    #[error("process {0} is past the tracked-process set")]
    PidRange(u32),
    #[error("listing online CPUs: {0}")]
    Cpus(#[source] std::io::Error),
}

#[derive(Clone, Debug)]
pub struct TracerConfig {
    /// cpu-clock sampling frequency per CPU, Hz; 0 disables sampling.
    pub sample_hz: u64,
    /// Ring buffer size in bytes (rounded up to a power of two pages).
    pub ring_bytes: u32,
    /// Capture stacks when a tracked thread blocks.
    pub offcpu_stacks: bool,
    /// Hook every syscall's entry and exit (per-syscall records, bytes,
    /// opened paths); without, a blocking thread's syscall is read from
    /// its registers at the switch.
    pub syscall_hooks: bool,
}

impl Default for TracerConfig {
    fn default() -> Self {
        TracerConfig {
            sample_hz: 99,
            ring_bytes: 32 << 20,
            offcpu_stacks: true,
            syscall_hooks: false,
        }
    }
}

/// The loaded programs and the maps userspace talks to.
pub struct Tracer {
    ebpf: Ebpf,
    tracked: tracked::Tracked,
    py_procs: BpfHashMap<MapData, u32, abi::PyProc>,
    drops: PerCpuArray<MapData, u64>,
    neighbours: PerCpuArray<MapData, u64>,
    ring: RingBuf<MapData>,
    sample_hz: u64,
    syscall_hooks: bool,
    /// libcuda files watched already, by (device, inode), with how many
    /// of their functions: a node's jobs often map the same one.
    libcuda: std::collections::HashMap<(u64, u64), usize>,
}

impl Tracer {
    /// Loads (verifies) every program; attaches nothing yet.
    pub fn load(config: &TracerConfig) -> Result<Tracer, BpfError> {
        let ring_bytes = config.ring_bytes.max(4096).next_power_of_two();
        let offcpu_stacks = config.offcpu_stacks as u8;
        let syscall_hooks = config.syscall_hooks as u8;
        let wakeup_bytes: u64 = (ring_bytes as u64 / 8).min(1 << 20);
        let mut ebpf = EbpfLoader::new()
            // Task storage (per-thread syscall state) is a map type this aya
            // has no wrapper for; userspace never touches it.
            .allow_unsupported_maps()
            .override_global("gs_offcpu_stacks", &offcpu_stacks, true)
            .override_global("gs_syscall_hooks", &syscall_hooks, true)
            .override_global("gs_wakeup_bytes", &wakeup_bytes, true)
            .map_max_entries("events", ring_bytes)
            .load(OBJECT)
            .map_err(BpfError::Load)?;

        for (name, _) in RAW_TRACEPOINTS {
            let prog: &mut RawTracePoint = program(&mut ebpf, name)?;
            prog.load()
                .map_err(|source| BpfError::Program { name, source })?;
        }
        for name in ["gs_cuda_enter", "gs_cuda_exit"] {
            let prog: &mut UProbe = program(&mut ebpf, name)?;
            prog.load()
                .map_err(|source| BpfError::Program { name, source })?;
        }
        let sampler: &mut PerfEvent = program(&mut ebpf, "gs_sample")?;
        sampler.load().map_err(|source| BpfError::Program {
            name: "gs_sample",
            source,
        })?;

        let tracked = tracked::Tracked::new(
            ebpf.take_map("tracked")
                .ok_or(BpfError::Missing("tracked"))?,
        )?;
        let py_procs = take_map(&mut ebpf, "py_procs")?;
        let drops = take_map(&mut ebpf, "drops")?;
        let neighbours = take_map(&mut ebpf, "neighbours")?;
        let ring = take_map(&mut ebpf, "events")?;
        Ok(Tracer {
            ebpf,
            tracked,
            py_procs,
            drops,
            neighbours,
            ring,
            sample_hz: config.sample_hz,
            syscall_hooks: config.syscall_hooks,
            libcuda: std::collections::HashMap::new(),
        })
    }

    /// Adds a process (tgid) to the in-kernel filter.
    pub fn track(&mut self, tgid: u32) -> Result<(), BpfError> {
        if self.tracked.insert(tgid) {
            Ok(())
        } else {
            Err(BpfError::PidRange(tgid))
        }
    }

    /// Tells the kernel side where the CPython interpreter of process
    /// `tgid` keeps its frames: its stacks carry Python frames from now on
    /// (and its forked children's, which inherit it).
    pub fn set_python(&mut self, tgid: u32, py: &abi::PyProc) -> Result<(), BpfError> {
        self.py_procs
            .insert(tgid, py, 0)
            .map_err(|source| BpfError::Map {
                name: "py_procs",
                source,
            })
    }

    /// Attaches every program. Events flow for tracked processes from here on.
    pub fn attach(&mut self) -> Result<(), BpfError> {
        for (name, tp) in attached(self.syscall_hooks) {
            let prog: &mut RawTracePoint = program(&mut self.ebpf, name)?;
            prog.attach(tp)
                .map_err(|source| BpfError::Program { name, source })?;
        }
        if self.sample_hz > 0 {
            let prog: &mut PerfEvent = program(&mut self.ebpf, "gs_sample")?;
            let cpus = aya::util::online_cpus().map_err(|(_, e)| BpfError::Cpus(e))?;
            for cpu in cpus {
                prog.attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(self.sample_hz),
                    false,
                )
                .map_err(|source| BpfError::Program {
                    name: "gs_sample",
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Puts uprobes on the libcuda functions of [`cuda::FUNCTIONS`] found in
    /// `lib`; returns how many were attached (symbols a version lacks are
    /// skipped). Calls are reported for tracked processes only.
    pub fn attach_libcuda(&mut self, lib: &std::path::Path) -> Result<usize, BpfError> {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::metadata(lib).ok().map(|m| (m.dev(), m.ino()));
        if let Some(n) = file.and_then(|f| self.libcuda.get(&f)) {
            return Ok(*n);
        }
        let mut attached = 0;
        for (i, f) in cuda::FUNCTIONS.iter().enumerate() {
            let mut ok = true;
            for name in ["gs_cuda_enter", "gs_cuda_exit"] {
                let prog: &mut UProbe = program(&mut self.ebpf, name)?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::Symbol(f.symbol),
                    cookie: Some(abi::cuda_cookie(i, f.arg)),
                };
                if prog.attach(point, lib, UProbeScope::AllProcesses).is_err() {
                    ok = false;
                    break;
                }
            }
            attached += ok as usize;
        }
        if let Some(f) = file {
            self.libcuda.insert(f, attached);
        }
        Ok(attached)
    }

    pub fn ring_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Hands every record waiting in the ring buffer to `f`; returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            f(&item);
            n += 1;
        }
        n
    }

    /// Lets the kernel side forget the stacks it has sent, so that it sends
    /// each again when next seen (a new window of a continuous recording
    /// must hold the stacks its events name).
    pub fn forget_stacks(&mut self) {
        let Some(map) = self.ebpf.map_mut("known_stacks") else {
            return;
        };
        let Ok(mut known) = BpfHashMap::<_, u64, u8>::try_from(map) else {
            return;
        };
        let keys: Vec<u64> = known.keys().flatten().collect();
        for k in keys {
            let _ = known.remove(&k);
        }
    }

    /// Records lost in the kernel so far, per event kind (summed over CPUs).
    pub fn drops(&self) -> Result<[u64; abi::kind::MAX], BpfError> {
        let mut out = [0u64; abi::kind::MAX];
        for (kind, slot) in out.iter_mut().enumerate() {
            let per_cpu = self
                .drops
                .get(&(kind as u32), 0)
                .map_err(|source| BpfError::Map {
                    name: "drops",
                    source,
                })?;
            *slot = per_cpu.iter().sum();
        }
        Ok(out)
    }

    /// What the machine's unrecorded tasks have run since the programs
    /// were attached (summed over CPUs): (in the job's own scheduling
    /// group, elsewhere).
    pub fn neighbours(&self) -> Result<(u64, u64), BpfError> {
        let slot = |i: u32| {
            self.neighbours
                .get(&i, 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .map_err(|source| BpfError::Map {
                    name: "neighbours",
                    source,
                })
        };
        Ok((
            slot(abi::neighbours::SAME_GROUP)?,
            slot(abi::neighbours::ELSEWHERE)?,
        ))
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, BpfError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or(BpfError::Missing(name))?;
    prog.try_into()
        .map_err(|source| BpfError::Program { name, source })
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, BpfError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(BpfError::Missing(name))?;
    T::try_from(map).map_err(|source| BpfError::Map { name, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_syscall_hooks_are_attached_only_when_asked_for() {
        let default: Vec<_> = tracepoints(false).collect();
        let all: Vec<_> = tracepoints(true).collect();
        for tp in ["sched_switch", "sched_waking", "sched_process_fork"] {
            assert!(default.contains(&tp) && all.contains(&tp), "{tp}");
        }
        for tp in ["sys_enter", "sys_exit"] {
            assert!(!default.contains(&tp) && all.contains(&tp), "{tp}");
        }
        assert_eq!(all.len(), RAW_TRACEPOINTS.len());
        assert_eq!(default.len(), RAW_TRACEPOINTS.len() - SYSCALL_HOOKS.len());
    }
}
