//! A GPU's figures over the recording window as every output counts them —
//! the report, a comparison, the cross-rank table: allocated is busy, idle
//! and unseen together; busy by what ran, idle by cause, and a server's
//! requests. Field names are part of the JSON contracts.

use serde::Serialize;

use super::cause::IdleByCause;
use super::diagnose::GpuDiagnosis;
use super::Analysis;

/// One GPU's time over the window.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    /// Wall time the job held the GPU (the recording window).
    pub allocated_ns: u64,
    pub busy_ns: u64,
    pub busy_by_kind_ns: BusyByKind,
    pub idle_ns: u64,
    /// Neither busy nor idle: the GPU could not be seen.
    pub unseen_ns: u64,
    pub idle_by_cause_ns: IdleByCause,
    pub requests: Option<Requests>,
}

/// GPU `d`'s figures in analysis `a`.
pub fn gpu(a: &Analysis, d: &GpuDiagnosis) -> Gpu {
    let g = &d.gpu;
    let allocated = a.timeline.end - a.timeline.start;
    let busy = g.busy_ns();
    let unseen = d.attribution.unseen;
    Gpu {
        allocated_ns: allocated,
        busy_ns: busy,
        busy_by_kind_ns: BusyByKind {
            compute: g.busy_by_kind.compute,
            communication: g.busy_by_kind.communication,
            memory: g.busy_by_kind.memory,
            communication_waiting: g.busy_by_kind.communication_waiting,
        },
        idle_ns: allocated - busy - unseen,
        unseen_ns: unseen,
        idle_by_cause_ns: IdleByCause::from_fn(|c| d.attribution.get(c)),
        requests: a.requests.get(&g.device).map(|r| Requests {
            count: r.count,
            span_ns: r.end - r.start,
            rate_per_s: r.rate_per_s(),
            latency_p50_ns: r.p50_ns,
            latency_p99_ns: r.p99_ns,
            latency_max_ns: r.max_ns,
            gpu_busy_per_request_ns: r.gpu_busy_ns / r.count.max(1),
            energy_per_request_j: r.energy_j.map(|e| e / r.count.max(1) as f64),
        }),
    }
}

/// Busy time by what ran: compute kernels; communication kernels (NCCL)
/// no compute overlapped, waiting on other ranks included; copies and
/// memsets that neither overlapped. Those three sum to busy_ns exactly.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct BusyByKind {
    pub compute: u64,
    pub communication: u64,
    pub memory: u64,
    /// Of communication: collectives waiting for the last GPU of the
    /// recording to start its own (not in the sum).
    pub communication_waiting: u64,
}

/// A server's requests, each from its arrival (the wakeup that ended the
/// server's wait for it) to the server waiting for the next.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Requests {
    pub count: u64,
    /// From the first request's arrival to the last one's answer.
    pub span_ns: u64,
    pub rate_per_s: f64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    /// The GPU's busy time over the span, per request.
    pub gpu_busy_per_request_ns: u64,
    /// The GPU's energy over the span, per request, where NVML said.
    pub energy_per_request_j: Option<f64>,
}
