//! The GPU half of the report: per GPU, allocated / NVML utilization / busy
//! side by side, idle split by cause, gaps, what ran; and CUDA API time per
//! thread. Field names are the `gapscope.report/1` contract.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::analyze::attribute::Cause;
use crate::analyze::{figures, gpu, Analysis};

#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct GapReport {
    pub count: u64,
    pub total_ns: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct Gaps {
    pub gt_10us: GapReport,
    pub gt_100us: GapReport,
    pub gt_1ms: GapReport,
}

pub use crate::analyze::cause::IdleByCause;

#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct OpReport {
    pub count: u64,
    pub total_ns: u64,
    pub bytes: u64,
}

impl From<gpu::OpStats> for OpReport {
    fn from(s: gpu::OpStats) -> OpReport {
        OpReport {
            count: s.count,
            total_ns: s.total_ns,
            bytes: s.bytes,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GpuReport {
    pub id: u32,
    pub name: String,
    /// As NVML and nvidia-smi write it, when known.
    pub uuid: Option<String>,
    pub source: crate::session::SourceKind,
    /// Wall time the job held the GPU (the recording window).
    pub allocated_ns: u64,
    /// Mean NVML utilization.gpu over the window, as dashboards show it.
    pub nvml_util_pct: Option<f64>,
    pub busy_ns: u64,
    /// busy_ns split by what ran, each instant once (compute first).
    pub busy_by_kind_ns: BusyByKindReport,
    pub idle_ns: u64,
    /// Time the GPU could not be seen (another CUPTI client held CUPTI, or
    /// the process was killed): neither busy nor idle. busy + idle + unseen
    /// = allocated.
    pub unseen_ns: u64,
    /// First GPU activity start to last GPU activity end.
    pub span_ns: u64,
    pub gaps: Gaps,
    pub idle_by_cause_ns: IdleByCause,
    pub kernels: OpReport,
    /// Copies by direction and host memory kind ("HtoD pageable", ...).
    pub copies: BTreeMap<String, OpReport>,
    pub memsets: OpReport,
    /// Energy the GPU used during the window, joules, when NVML reports it.
    pub energy_j: Option<f64>,
    /// Of which spent while idle (NVML power integrated over idle time).
    pub idle_energy_j: Option<f64>,
    pub pids: Vec<u32>,
    /// Integrity of the merged clock (see [`ClockCheck`]).
    pub clock_check: ClockCheck,
    /// The same over the run's steps only (the report's `steps`), where
    /// they are marked: what a step breakdown (the TensorBoard plugin's
    /// overview) shows.
    pub in_steps: Option<InSteps>,
    /// The requests it served, where its feeder waits for them in a
    /// server's request loop (the `demand` cause).
    pub requests: Option<RequestsReport>,
}

/// A GPU over the run's steps: from the first step's beginning to the last
/// one's end. busy + idle + unseen = span.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct InSteps {
    pub span_ns: u64,
    pub busy_ns: u64,
    pub idle_ns: u64,
    pub idle_by_cause_ns: IdleByCause,
}

pub use crate::analyze::checks::ClockCheck;
pub use crate::analyze::figures::{BusyByKind as BusyByKindReport, Requests as RequestsReport};

pub use crate::analyze::api::{ApiThread, SyncReport};

/// Everything GPU in a session, for the window `[start, end)`.
pub struct GpuSection {
    pub gpus: Vec<GpuReport>,
    pub api: Vec<ApiThread>,
    pub syncs: Vec<SyncReport>,
}

pub fn build(a: &Analysis) -> GpuSection {
    let gpus = a
        .diagnosis
        .gpus
        .iter()
        .map(|d| {
            let g = &d.gpu;
            let f = figures::gpu(a, d);
            let b = g.gap_buckets();
            let gap = |i: usize| GapReport {
                count: b[i].count,
                total_ns: b[i].total_ns,
            };
            let nvml = a.nvml.get(&g.device).copied().unwrap_or_default();
            GpuReport {
                id: g.device,
                name: g.name.clone(),
                uuid: g.uuid.clone(),
                source: g.source,
                allocated_ns: f.allocated_ns,
                nvml_util_pct: nvml.util_pct,
                busy_ns: f.busy_ns,
                busy_by_kind_ns: f.busy_by_kind_ns,
                idle_ns: f.idle_ns,
                unseen_ns: f.unseen_ns,
                span_ns: g.span_ns(),
                gaps: Gaps {
                    gt_10us: gap(0),
                    gt_100us: gap(1),
                    gt_1ms: gap(2),
                },
                idle_by_cause_ns: f.idle_by_cause_ns,
                kernels: g.kernels.into(),
                copies: g
                    .copies
                    .iter()
                    .map(|(k, v)| (k.clone(), (*v).into()))
                    .collect(),
                memsets: g.memsets.into(),
                energy_j: nvml.energy_j,
                idle_energy_j: nvml.idle_energy_j,
                clock_check: a.clock_checks.get(&g.device).cloned().unwrap_or_default(),
                pids: g.pids.clone(),
                in_steps: a.diagnosis.steps.as_ref().map(|s| {
                    let (from, to) = s.span();
                    let of = |c: Cause| d.attribution.in_steps.get(&c).copied().unwrap_or(0);
                    let idle = IdleByCause::from_fn(of);
                    InSteps {
                        span_ns: to - from,
                        busy_ns: g.busy_within(from, to),
                        idle_ns: idle.total(),
                        idle_by_cause_ns: idle,
                    }
                }),
                requests: f.requests,
            }
        })
        .collect();

    GpuSection {
        gpus,
        api: a.api.threads.clone(),
        syncs: a.api.syncs.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gapscope_wire::GpuRecord;

    #[test]
    fn busy_plus_idle_is_allocated_and_causes_sum_to_idle() {
        let mut s = crate::session::Session::default();
        for (a, b) in [(1_000u64, 2_000u64), (5_000, 9_000), (8_000, 9_500)] {
            s.gpu.push((
                1,
                GpuRecord::Kernel {
                    start: a,
                    end: b,
                    device: 0,
                    context: 1,
                    stream: 1,
                    correlation: 0,
                    grid: [1; 3],
                    block: [1; 3],
                    name: "k".into(),
                },
            ));
        }
        s.header = Some(crate::session::SessionHeader::for_test(
            crate::session::Mode::Run,
            1,
        ));
        s.footer = Some(crate::session::Footer {
            end_ns: 20_000,
            reason: crate::session::StopReason::TargetExited,
            exit_code: Some(0),
            events: 0,
        });
        let a = crate::analyze::analyze(s, &Default::default()).unwrap();
        let sec = build(&a);
        let g = &sec.gpus[0];
        assert_eq!(g.allocated_ns, 20_000);
        assert_eq!(g.busy_ns, 1_000 + 4_500);
        assert_eq!(g.busy_ns + g.idle_ns, g.allocated_ns);
        assert_eq!(g.idle_by_cause_ns.total(), g.idle_ns);
        assert_eq!(g.idle_by_cause_ns.get(Cause::Startup), 1_000);
        assert_eq!(g.idle_by_cause_ns.get(Cause::Teardown), 10_500);
        assert_eq!(g.idle_by_cause_ns.get(Cause::Unattributed), 3_000); // no feeder known
        assert_eq!(g.span_ns, 8_500);
    }
}
