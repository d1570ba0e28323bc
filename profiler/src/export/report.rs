//! The report model: everything the text, markdown and JSON summaries show,
//! computed once. JSON field names are the `gapscope.report/1` contract.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::analyze::{Analysis, Names};
use crate::session::{Frame, Mode, StopReason};
use crate::timeline::{syscall_name, OffKind, ThreadTimeline};

pub use crate::analyze::recommend::{Recommendation, Topic};

pub const SCHEMA: &str = "gapscope.report/1";
const TOP_SYSCALLS: usize = 8;
const TOP_STACKS: usize = 5;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    pub schema: &'static str,
    pub target: TargetInfo,
    pub window_ns: Window,
    pub drops: DropsInfo,
    pub threads: Vec<ThreadReport>,
    pub gpus: Vec<GpuReport>,
    pub recommendations: Vec<Recommendation>,
    /// Whether more GPUs would help, in one line (absent without GPU data).
    pub verdict: Option<String>,
    /// The idle time in the units a team budgets in (absent without GPU
    /// data).
    pub idle_cost: Option<IdleCost>,
    /// The input pipeline by stage (absent where no sample was in input
    /// code).
    pub input_stages: Option<crate::analyze::stages::InputStages>,
    /// The run's steps, where a trace or recording marks them (absent
    /// below two): each GPU's `in_steps` is its time over them.
    pub steps: Option<StepsReport>,
    /// CUDA API time per host thread, from the GPU sources.
    pub cuda_api: Vec<ApiThread>,
    /// Host waits in CUDA synchronization calls, by kind.
    pub cuda_syncs: Vec<SyncReport>,
    /// Where GPU records came from, per process.
    pub gpu_sources: Vec<GpuSourceReport>,
    pub session: SessionInfo,
    pub processes: Vec<ProcessReport>,
    pub notes: Vec<String>,
}

/// The run's steps, each timed from the moment the previous step's results
/// were out to the moment its own were.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepsReport {
    /// What marked them: "ProfilerStep#N", or an NVTX range name.
    pub source: String,
    pub count: usize,
    pub mean_ns: u64,
    /// From the first step's beginning to the last one's end.
    pub window_ns: Window,
    /// Steps at the end left out: the trace stopped before their GPU work
    /// was recorded.
    pub cut: usize,
    pub steps: Vec<StepTime>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepTime {
    pub number: u64,
    pub ns: u64,
}

impl StepsReport {
    fn of(s: &crate::analyze::steps::Summary) -> StepsReport {
        let (start, end) = s.span();
        StepsReport {
            source: s.source.clone(),
            count: s.timed.len(),
            mean_ns: s.mean_ns(),
            window_ns: Window { start, end },
            cut: s.cut,
            steps: s
                .timed
                .iter()
                .map(|t| StepTime {
                    number: t.number,
                    ns: t.end - t.begin,
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct IdleCost {
    /// GPUs' worth of held time that sat idle: the GPUs' idle time over
    /// the window.
    pub equivalent_gpus: f64,
    /// The same over a day of the job at this pace.
    pub gpu_hours_per_day: f64,
    /// Energy the GPUs burnt while idle (NVML power), null without power
    /// readings.
    pub idle_energy_j: Option<f64>,
}

impl IdleCost {
    fn of(gpus: &[GpuReport]) -> Option<IdleCost> {
        let held = gpus
            .iter()
            .map(|g| g.allocated_ns)
            .max()
            .filter(|&n| n > 0)?;
        let idle: u64 = gpus.iter().map(|g| g.idle_ns).sum();
        let equivalent_gpus = idle as f64 / held as f64;
        Some(IdleCost {
            equivalent_gpus: (equivalent_gpus * 1000.0).round() / 1000.0,
            gpu_hours_per_day: (equivalent_gpus * 24.0 * 10.0).round() / 10.0,
            idle_energy_j: gpus.iter().map(|g| g.idle_energy_j).sum(),
        })
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TargetInfo {
    pub pid: u32,
    pub command: Vec<String>,
    pub exit_code: Option<i32>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Window {
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DropsInfo {
    pub cpu_events: u64,
    pub gpu_records: u64,
    pub cpu_by_kind: BTreeMap<String, u64>,
    /// Context switches the kernel never reported, inferred from what the
    /// threads did (not losses, but places where a boundary is estimated).
    pub inferred_switches: u64,
    /// Where CPU events were lost (between two readings of the counters)
    /// or GPU records were (the span a shim's dropped records covered):
    /// GPU idle inside these windows is charged to `unattributed`.
    pub lossy_windows_ns: Vec<Window>,
    /// GPU records the shims did not pass on because CUPTI delivered them
    /// incomplete (a forced flush while the GPU still ran them).
    pub gpu_records_incomplete: u64,
    /// Spans in which a process's GPU activity could not be seen at all,
    /// and why (another CUPTI client held CUPTI; the process was killed).
    /// They are lossy windows too: never counted as idle time of a cause.
    pub gpu_blind: Vec<BlindSpan>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BlindSpan {
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SessionInfo {
    pub gapscope_version: String,
    pub mode: Mode,
    pub hostname: String,
    pub kernel: String,
    pub nr_cpus: u32,
    pub sample_hz: u64,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub events: u64,
    pub stop_reason: Option<&'static str>,
    /// Why the session is incomplete, when it is.
    pub truncated: Option<String>,
    /// gapscope's own CPU time and peak memory while recording.
    pub collector_cpu_ns: Option<u64>,
    pub collector_peak_rss_bytes: Option<u64>,
    /// This recording's rank in a distributed job, when known.
    pub rank: Option<crate::session::Rank>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProcessReport {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub argv: Vec<String>,
    pub execs: Vec<String>,
    pub exit_code: Option<i32>,
    pub threads: usize,
    /// TCP segments sent again on its threads' connections (a peer or the
    /// network lost them).
    pub tcp_retransmits: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OffCpuNs {
    pub file: u64,
    pub net: u64,
    pub ipc: u64,
    pub sleep: u64,
    pub gpu: u64,
    pub fault: u64,
    pub other: u64,
}

impl OffCpuNs {
    pub fn get(&self, kind: OffKind) -> u64 {
        match kind {
            OffKind::File => self.file,
            OffKind::Net => self.net,
            OffKind::Ipc => self.ipc,
            OffKind::Sleep => self.sleep,
            OffKind::Gpu => self.gpu,
            OffKind::Fault => self.fault,
            OffKind::Other => self.other,
        }
    }

    pub fn total(&self) -> u64 {
        OffKind::ALL.iter().map(|&k| self.get(k)).sum()
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct BytesReport {
    pub file: u64,
    pub net: u64,
    pub ipc: u64,
    pub other: u64,
}

/// A thread's I/O as the kernel's accounting counted it: kept whatever
/// syscalls were hooked, but not split by kind of descriptor.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct IoReport {
    pub read_chars: u64,
    pub write_chars: u64,
    pub read_calls: u64,
    pub write_calls: u64,
    pub storage_read_bytes: u64,
    pub storage_write_bytes: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SyscallReport {
    pub name: String,
    pub nr: i32,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StackReport {
    /// On-CPU: estimated from samples (samples x period); off-CPU: measured.
    pub weight_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<OffKind>,
    /// User frames, innermost first.
    pub frames: Vec<String>,
    /// Kernel frames, innermost first.
    pub kernel_frames: Vec<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ThreadReport {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub lifetime_ns: u64,
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    /// Held a CPU in the scheduler's view, but the kernel did not charge
    /// it: hypervisor steal, or interrupts with IRQ time accounting.
    pub stolen_ns: u64,
    pub off_cpu_ns: OffCpuNs,
    pub read_bytes: BytesReport,
    pub write_bytes: BytesReport,
    /// The kernel's own count of the thread's I/O while recording.
    pub io: Option<IoReport>,
    pub page_faults: u64,
    pub samples: u64,
    pub syscalls: Vec<SyscallReport>,
    pub on_cpu_stacks: Vec<StackReport>,
    pub off_cpu_stacks: Vec<StackReport>,
    /// Its time on a CPU by the region of the job's code its samples were
    /// in (analyze::code), most first; empty when no sample was in one.
    pub code: Vec<CodeReport>,
}

/// A thread's samples in one region of the job's code.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CodeReport {
    pub region: crate::analyze::code::Region,
    pub samples: u64,
    /// Its samples times the sampling period.
    pub on_cpu_ns: u64,
}

pub use super::gpu_report::{ApiThread, GpuReport, RequestsReport, SyncReport};
use crate::session::SourceKind;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GpuSourceReport {
    pub pid: u32,
    pub kind: crate::session::SourceKind,
    pub source: String,
    pub driver_version: u32,
    pub cupti_version: u32,
    /// How GPU timestamps were put on CLOCK_MONOTONIC.
    pub clock: String,
    /// How the source got into the process: "environment" (started with
    /// the shim), "ptrace" (injected by attach), "uprobes", or "trace"
    /// (imported) and "simulated".
    pub loaded_by: &'static str,
    /// When this recording injected the shim: what that cost the process.
    pub injection: Option<InjectionReport>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct InjectionReport {
    /// The longest its thread was held stopped.
    pub longest_stop_ns: u64,
    /// From the first stop to the shim loaded.
    pub took_ns: u64,
}

/// Resolves stack hashes to frame names: symbols where the recording had
/// them, addresses where it did not.
struct Stacks<'a> {
    names: &'a Names,
    rules: &'a crate::analyze::code::Rules,
}

impl Stacks<'_> {
    fn frames(&self, hash: u64) -> Vec<String> {
        self.names.frame_names(hash, frame_name)
    }
}

/// A thread's samples by region of code, most first.
fn code_regions(t: &ThreadTimeline, stacks: &Stacks, period_ns: u64) -> Vec<CodeReport> {
    let mut by: HashMap<crate::analyze::code::Region, u64> = HashMap::new();
    for (&(u, _), &n) in &t.samples {
        let region = stacks.names.frames(u).and_then(|f| stacks.rules.stack(f));
        if let Some(r) = region {
            *by.entry(r).or_default() += n;
        }
    }
    let mut out: Vec<CodeReport> = by
        .into_iter()
        .map(|(region, samples)| CodeReport {
            region,
            samples,
            on_cpu_ns: samples * period_ns,
        })
        .collect();
    out.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.region.cmp(&b.region)));
    out
}

fn frame_name(f: &Frame) -> String {
    f.function.clone()
}

fn build_thread(t: &ThreadTimeline, stacks: &Stacks, period_ns: u64) -> ThreadReport {
    let off = |k| t.off.get(&k).copied().unwrap_or(0);
    let mut syscalls: Vec<SyscallReport> = t
        .syscalls
        .iter()
        .map(|(&nr, s)| SyscallReport {
            name: syscall_name(nr).into_owned(),
            nr,
            count: s.count,
            total_ns: s.total_ns,
            max_ns: s.max_ns,
        })
        .collect();
    syscalls.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.nr.cmp(&b.nr)));
    syscalls.truncate(TOP_SYSCALLS);

    // Stacks that differ only in addresses within the same functions are one
    // stack to a reader: merge by resolved frames.
    let mut on: HashMap<(Vec<String>, Vec<String>), u64> = HashMap::new();
    for (&(u, k), &n) in &t.samples {
        *on.entry((stacks.frames(u), stacks.frames(k))).or_default() += n;
    }
    let mut on: Vec<_> = on.into_iter().collect();
    on.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let on_cpu_stacks = on
        .into_iter()
        .take(TOP_STACKS)
        .map(|((frames, kernel_frames), n)| StackReport {
            weight_ns: n * period_ns,
            samples: Some(n),
            kind: None,
            frames,
            kernel_frames,
        })
        .collect();
    let mut blocked: HashMap<(OffKind, Vec<String>, Vec<String>), u64> = HashMap::new();
    for (&(kind, u, k), &ns) in &t.off_stacks {
        *blocked
            .entry((kind, stacks.frames(u), stacks.frames(k)))
            .or_default() += ns;
    }
    let mut blocked: Vec<_> = blocked.into_iter().collect();
    blocked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let off_cpu_stacks = blocked
        .into_iter()
        .take(TOP_STACKS)
        .map(|((kind, frames, kernel_frames), ns)| StackReport {
            weight_ns: ns,
            samples: None,
            kind: Some(kind),
            frames,
            kernel_frames,
        })
        .collect();

    ThreadReport {
        pid: t.pid,
        tid: t.tid,
        comm: t.comm.clone(),
        start_ns: t.start,
        end_ns: t.end,
        lifetime_ns: t.lifetime(),
        on_cpu_ns: t.on_cpu,
        runnable_ns: t.runnable,
        stolen_ns: t.stolen,
        off_cpu_ns: OffCpuNs {
            file: off(OffKind::File),
            net: off(OffKind::Net),
            ipc: off(OffKind::Ipc),
            sleep: off(OffKind::Sleep),
            gpu: off(OffKind::Gpu),
            fault: off(OffKind::Fault),
            other: off(OffKind::Other),
        },
        read_bytes: bytes(t.read_bytes),
        write_bytes: bytes(t.write_bytes),
        io: t.io.map(|io| IoReport {
            read_chars: io.rchar,
            write_chars: io.wchar,
            read_calls: io.syscr,
            write_calls: io.syscw,
            storage_read_bytes: io.read_bytes,
            storage_write_bytes: io.write_bytes,
        }),
        page_faults: t.page_faults,
        samples: t.samples.values().sum(),
        syscalls,
        on_cpu_stacks,
        off_cpu_stacks,
        code: code_regions(t, stacks, period_ns),
    }
}

fn bytes(b: crate::timeline::thread::Bytes) -> BytesReport {
    BytesReport {
        file: b.file,
        net: b.net,
        ipc: b.ipc,
        other: b.other,
    }
}

/// The report model of an analysis.
pub fn build(a: &Analysis) -> Report {
    let tl = &a.timeline;
    let facts = &a.facts;
    let header = &facts.header;
    let stacks = Stacks {
        names: &a.names,
        rules: &a.code,
    };
    let period_ns = 1_000_000_000 / header.sample_hz.max(1);

    let threads: Vec<ThreadReport> = tl
        .all_threads()
        .into_iter()
        .map(|t| build_thread(t, &stacks, period_ns))
        .collect();

    // Threads per process: each thread belongs to the latest process with
    // its pid that had started by then (pids can be reused).
    let all_processes = tl.all_processes();
    let mut thread_counts: HashMap<(u32, u64), usize> = HashMap::new();
    let starts: std::collections::BTreeSet<(u32, u64)> = all_processes
        .iter()
        .map(|p| (p.pid, p.start.unwrap_or(0)))
        .collect();
    for t in tl.all_threads() {
        let owner = starts
            .range(..=(t.pid, t.start))
            .next_back()
            .filter(|(pid, _)| *pid == t.pid)
            .map_or(0, |(_, start)| *start);
        *thread_counts.entry((t.pid, owner)).or_default() += 1;
    }
    let processes = all_processes
        .into_iter()
        .map(|p| ProcessReport {
            pid: p.pid,
            ppid: p.ppid,
            comm: p.comm.clone(),
            argv: p.argv.clone(),
            execs: p.execs.clone(),
            exit_code: p.exit_code,
            threads: thread_counts
                .get(&(p.pid, p.start.unwrap_or(0)))
                .copied()
                .unwrap_or(0),
            tcp_retransmits: tl.retransmits.iter().filter(|r| r.tid.0 == p.pid).count() as u64,
        })
        .collect();

    let footer = facts.footer.as_ref();
    let exit_code = footer.and_then(|f| f.exit_code).or_else(|| {
        tl.processes
            .get(&header.target_pid)
            .and_then(|p| p.exit_code)
    });
    let gpu = super::gpu_report::build(a);
    let lossy = &a.diagnosis.lossy_windows;

    Report {
        schema: SCHEMA,
        target: TargetInfo {
            pid: header.target_pid,
            command: header.command.clone(),
            exit_code,
        },
        window_ns: Window {
            start: tl.start,
            end: tl.end,
        },
        drops: DropsInfo {
            cpu_events: facts.drops.cpu_events(),
            gpu_records: facts
                .drops
                .gpu_records
                .saturating_add(facts.gpu_records_dropped),
            cpu_by_kind: facts.drops.cpu_by_kind.iter().cloned().collect(),
            inferred_switches: tl.all_threads().iter().map(|t| t.inferred_switches).sum(),
            lossy_windows_ns: lossy
                .iter()
                .map(|&(start, end)| Window { start, end })
                .collect(),
            gpu_records_incomplete: facts.gpu_records_incomplete,
            gpu_blind: facts
                .gpu_blind
                .iter()
                .map(|b| BlindSpan {
                    pid: b.pid,
                    start_ns: b.start,
                    end_ns: b.end,
                    reason: b.reason.clone(),
                })
                .collect(),
        },
        threads,
        idle_cost: IdleCost::of(&gpu.gpus),
        input_stages: a.stages.clone(),
        steps: a.diagnosis.steps.as_ref().map(StepsReport::of),
        gpus: gpu.gpus,
        recommendations: a.advice.recommendations.clone(),
        verdict: a.advice.verdict.clone(),
        cuda_api: gpu.api,
        cuda_syncs: gpu.syncs,
        gpu_sources: facts
            .gpu_sources
            .iter()
            // A process with its shim is not also a uprobe source: its
            // uprobe calls are left out (see timeline's `shimmed`).
            .filter(|g| {
                g.kind != SourceKind::Uprobe
                    || !facts
                        .gpu_sources
                        .iter()
                        .any(|o| o.pid == g.pid && o.kind == SourceKind::Cupti)
            })
            .map(|g| GpuSourceReport {
                pid: g.pid,
                kind: g.kind,
                source: g.hello.source.clone(),
                driver_version: g.hello.driver_version,
                cupti_version: g.hello.cupti_version,
                clock: format!("{:?}", g.hello.clock),
                loaded_by: match g.kind {
                    SourceKind::Uprobe => "uprobes",
                    SourceKind::Kineto => "trace",
                    SourceKind::Simulated => "simulated",
                    SourceKind::Cupti if facts.injected.iter().any(|i| i.pid == g.pid) => "ptrace",
                    SourceKind::Cupti => "environment",
                },
                injection: facts
                    .injected
                    .iter()
                    .find(|i| i.pid == g.pid && !i.earlier && g.kind == SourceKind::Cupti)
                    .map(|i| InjectionReport {
                        longest_stop_ns: i.longest_stop_ns,
                        took_ns: i.took_ns,
                    }),
            })
            .collect(),
        session: SessionInfo {
            gapscope_version: header.gapscope_version.clone(),
            mode: header.mode,
            hostname: header.hostname.clone(),
            kernel: header.kernel.clone(),
            nr_cpus: header.nr_cpus,
            sample_hz: header.sample_hz,
            start_unix_ns: header.start_unix_ns,
            duration_ns: tl.end - tl.start,
            events: facts.events,
            stop_reason: footer.map(|f| match f.reason {
                StopReason::TargetExited => "target exited",
                StopReason::Duration => "duration reached",
                StopReason::Interrupted => "interrupted",
            }),
            truncated: facts.truncated.clone(),
            collector_cpu_ns: facts.collector.map(|c| c.cpu_ns),
            collector_peak_rss_bytes: facts.collector.map(|c| c.peak_rss_bytes),
            rank: facts.rank,
        },
        processes,
        notes: a.notes.clone(),
    }
}
