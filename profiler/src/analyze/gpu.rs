//! Per-GPU accounting: busy (union of kernel, copy and memset time over all
//! streams), idle, span and the gaps in between, plus what ran, for one
//! recording window.

use std::collections::BTreeMap;

use crate::intervals::{clip, holes, intersect, minus, total, union, within, Spans};
use crate::timeline::gpu::Device;
use crate::timeline::totals::DeviceTotals;
use crate::timeline::GpuSide;

/// Gaps strictly longer than these, in ns (the report's contract).
pub const GAP_THRESHOLDS: [u64; 3] = [10_000, 100_000, 1_000_000];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapBucket {
    pub count: u64,
    pub total_ns: u64,
}

pub use crate::timeline::totals::{is_communication_kernel, OpStats};

/// Busy time split by what ran, each instant counted once: compute kernels
/// first, then communication kernels (NCCL collectives and send/recv) that
/// no compute overlapped, then copies and memsets that neither overlapped.
/// Exposed communication is busy only in name: the GPU was moving data or
/// waiting on its peers with nothing else to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusyByKind {
    pub compute: u64,
    pub communication: u64,
    pub memory: u64,
    /// Of `communication`: its collectives waiting for the last GPU to
    /// start its own, where those GPUs are in the recording — time a
    /// collective cannot progress, not productive work.
    pub communication_waiting: u64,
}

#[derive(Clone, Debug, Default)]
pub struct GpuTimeline {
    pub device: u32,
    pub name: String,
    pub uuid: Option<String>,
    /// "cupti", "uprobe", "simulated"...
    pub source: crate::session::SourceKind,
    /// Processes that put work on it.
    pub pids: Vec<u32>,
    /// Disjoint busy spans inside the window.
    pub busy: Vec<(u64, u64)>,
    pub busy_by_kind: BusyByKind,
    /// Its collectives waiting for the last GPU of the recording to start
    /// its own (disjoint, sorted, not clipped): what the other ranks
    /// arriving on time would take out.
    pub waiting: Vec<(u64, u64)>,
    /// Its collectives matched with every other GPU's of the recording:
    /// `(start, n)`, n counting them alike on every GPU; sorted.
    pub met: Vec<(u64, usize)>,
    pub kernels: OpStats,
    /// Copies by direction name ("HtoD pageable", ...).
    pub copies: BTreeMap<String, OpStats>,
    pub memsets: OpStats,
    /// Its communication kernels running with no compute beside them
    /// (disjoint, sorted, not clipped).
    pub communication_alone: Vec<(u64, u64)>,
}

impl GpuTimeline {
    pub fn busy_ns(&self) -> u64 {
        total(&self.busy)
    }

    /// Busy time inside `[a, b)`.
    pub fn busy_within(&self, a: u64, b: u64) -> u64 {
        within(&self.busy, a, b)
    }

    pub fn first_activity(&self) -> Option<u64> {
        self.busy.first().map(|s| s.0)
    }

    pub fn last_activity(&self) -> Option<u64> {
        self.busy.last().map(|s| s.1)
    }

    /// First activity start to last activity end.
    pub fn span_ns(&self) -> u64 {
        match (self.first_activity(), self.last_activity()) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// Holes in busy between first and last activity.
    pub fn gaps(&self) -> Vec<(u64, u64)> {
        holes(&self.busy)
    }

    pub fn gap_buckets(&self) -> [GapBucket; 3] {
        let mut out = [GapBucket::default(); 3];
        for (s, e) in self.gaps() {
            let len = e - s;
            for (bucket, &threshold) in out.iter_mut().zip(&GAP_THRESHOLDS) {
                if len > threshold {
                    bucket.count += 1;
                    bucket.total_ns += len;
                }
            }
        }
        out
    }
}

/// Accounts each GPU of the timeline, clipped to the window `[start, end)`,
/// in the timeline's device order.
pub fn gpu_timelines(side: &GpuSide, start: u64, end: u64) -> Vec<GpuTimeline> {
    let waits =
        crate::analyze::align::waits_within(side.devices.iter().map(|d| d.id), &side.totals);
    side.devices
        .iter()
        .zip(waits)
        .map(|(d, placed)| {
            let all = union(d.work.iter().map(|w| w.span()).collect());
            let (compute, alone) = compute_and_communication_alone(d);
            GpuTimeline::new(
                d,
                side.totals.devices.get(&d.id),
                placed,
                (start, end),
                clip(&all, start, end),
                total(&clip(&compute, start, end)),
                alone,
            )
        })
        .collect()
}

impl GpuTimeline {
    /// GPU `d`'s account over `window`: from its work's totals, how its
    /// collectives met the other GPUs', its busy spans (clipped to the
    /// window), its compute kernels' time inside the window, and its
    /// communication kernels' spans with no compute beside them
    /// (unclipped).
    pub(crate) fn new(
        d: &Device,
        totals: Option<&DeviceTotals>,
        placed: crate::analyze::align::Placement,
        (start, end): (u64, u64),
        busy: Spans,
        compute_ns: u64,
        alone: Spans,
    ) -> GpuTimeline {
        let empty = DeviceTotals::default();
        let t = totals.unwrap_or(&empty);
        let waiting = union(placed.waiting);
        let communication = total(&clip(&alone, start, end));
        GpuTimeline {
            device: d.id,
            name: d.name.clone(),
            uuid: d.uuid.clone(),
            source: d.source,
            pids: d.pids.clone(),
            busy_by_kind: BusyByKind {
                compute: compute_ns,
                communication,
                memory: total(&busy) - compute_ns - communication,
                // Waiting with compute beside it cost nothing.
                communication_waiting: total(&intersect(&clip(&alone, start, end), &waiting)),
            },
            busy,
            waiting,
            met: placed.met,
            kernels: t.kernels,
            copies: t.copies_by_name(),
            memsets: t.memsets,
            communication_alone: alone,
        }
    }
}

/// A GPU's compute kernels running, and its communication kernels running
/// with no compute beside them: disjoint sorted spans each.
fn compute_and_communication_alone(d: &Device) -> (Spans, Spans) {
    let (mut compute, mut communication) = (Vec::new(), Vec::new());
    for w in &d.work {
        if let Some(k) = w.kernel() {
            if is_communication_kernel(&k.name) {
                communication.push(w.span());
            } else {
                compute.push(w.span());
            }
        }
    }
    let compute = union(compute);
    let alone = minus(&union(communication), &compute);
    (compute, alone)
}

/// Of `waiting` (a GPU's collectives waiting for the other ranks), the
/// time no compute ran beside it: what the waits cost this GPU.
pub fn exposed_waiting(gpu: &GpuTimeline, waiting: &[(u64, u64)]) -> u64 {
    total(&intersect(
        &gpu.communication_alone,
        &union(waiting.to_vec()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Session;
    use gapscope_wire::GpuRecord;

    fn accounts(mut s: Session, start: u64, end: u64) -> Vec<GpuTimeline> {
        gpu_timelines(&GpuSide::build(&mut s), start, end)
    }

    fn kernel(device: u32, stream: u32, start: u64, end: u64) -> (u32, GpuRecord) {
        (
            1,
            GpuRecord::Kernel {
                start,
                end,
                device,
                context: 1,
                stream,
                correlation: 0,
                grid: [1, 1, 1],
                block: [1, 1, 1],
                name: "k".into(),
            },
        )
    }

    #[test]
    fn busy_span_and_gaps_per_device() {
        let s = Session {
            gpu: vec![
                kernel(0, 7, 1_000, 2_000),
                kernel(0, 8, 1_500, 2_500), // overlaps on another stream
                kernel(0, 7, 2_500, 3_000), // adjacent
                kernel(0, 7, 3_005_000, 3_006_000), // after a >1 ms gap
                kernel(0, 7, 3_006_050, 3_006_100), // after a 50 ns gap
                kernel(0, 7, 3_206_100, 3_206_200), // after a 200 µs gap
                kernel(1, 7, 10, 20),
                (
                    1,
                    GpuRecord::Memcpy {
                        start: 3_000,
                        end: 3_500,
                        device: 0,
                        context: 1,
                        stream: 9,
                        correlation: 0,
                        bytes: 1 << 20,
                        copy_kind: 1,
                        src_kind: 1,
                        dst_kind: 3,
                    },
                ),
            ],
            ..Default::default()
        };
        let tls = accounts(s, 0, 10_000_000);
        assert_eq!(tls.len(), 2);
        let g = &tls[0];
        assert_eq!(
            g.busy,
            vec![
                (1_000, 3_500),
                (3_005_000, 3_006_000),
                (3_006_050, 3_006_100),
                (3_206_100, 3_206_200)
            ]
        );
        assert_eq!(g.busy_ns(), 2_500 + 1_000 + 50 + 100);
        assert_eq!(g.span_ns(), 3_206_200 - 1_000);
        let b = g.gap_buckets();
        assert_eq!(
            b[0],
            GapBucket {
                count: 2,
                total_ns: (3_005_000 - 3_500) + 200_000
            }
        );
        assert_eq!(
            b[1],
            GapBucket {
                count: 2,
                total_ns: (3_005_000 - 3_500) + 200_000
            }
        );
        assert_eq!(
            b[2],
            GapBucket {
                count: 1,
                total_ns: 3_005_000 - 3_500
            }
        );
        assert_eq!(g.kernels.count, 6);
        assert_eq!(g.copies["HtoD pageable"].bytes, 1 << 20);
        assert_eq!(tls[1].busy_ns(), 10);
    }

    #[test]
    fn busy_splits_into_compute_then_exposed_communication_then_copies() {
        let named = |name: &str, stream, start, end| {
            let (pid, mut r) = kernel(0, stream, start, end);
            if let GpuRecord::Kernel { name: n, .. } = &mut r {
                *n = name.into();
            }
            (pid, r)
        };
        let s = Session {
            gpu: vec![
                named("sm90_xmma_gemm", 7, 1_000, 2_000),
                // Half hidden under the gemm, half exposed.
                named("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 9, 1_500, 2_500),
                // Exposed entirely.
                named("ncclKernel_SendRecv_RING_SIMPLE", 9, 5_000, 5_400),
                (
                    1,
                    GpuRecord::Memset {
                        start: 2_400,
                        end: 2_700, // 100 under the collective, 200 alone
                        device: 0,
                        context: 1,
                        stream: 8,
                        correlation: 0,
                        bytes: 64,
                        value: 0,
                        memory_kind: 0,
                    },
                ),
            ],
            ..Default::default()
        };
        let g = &accounts(s, 0, 10_000)[0];
        assert_eq!(
            g.busy_by_kind,
            BusyByKind {
                compute: 1_000,
                communication: 500 + 400,
                memory: 200,
                communication_waiting: 0,
            }
        );
        let k = g.busy_by_kind;
        assert_eq!(k.compute + k.communication + k.memory, g.busy_ns());
        assert!(!is_communication_kernel("elementwise_kernel"));
        for name in [
            "ncclKernel_AllReduce_RING_LL_Sum_float",
            "x_NCCL",
            "nccl",
            "ncCL_",
        ] {
            assert!(is_communication_kernel(name), "{name}");
        }
        for name in ["", "ncc", "nccx", "NC\u{e9}L", "n\u{a3}cl", "Nnc_cl"] {
            assert!(!is_communication_kernel(name), "{name}");
        }
    }

    /// Two GPUs of one recording meet in four all-reduces 10 µs apart;
    /// GPU 1 reaches each 2 µs after GPU 0, whose collectives wait those
    /// 2 µs — less the first µs of the first, hidden under a gemm.
    #[test]
    fn collectives_waiting_for_the_other_gpu_are_counted_where_nothing_else_ran() {
        let named = |device, name: &str, start, end| {
            let (pid, mut r) = kernel(device, 9, start, end);
            if let GpuRecord::Kernel { name: n, .. } = &mut r {
                *n = name.into();
            }
            (pid, r)
        };
        let mut gpu = vec![named(0, "sm90_xmma_gemm", 0, 2_000)];
        for n in 0..4 {
            let end = n * 10_000 + 5_000;
            gpu.push(named(0, "ncclDevKernel_AllReduce", end - 4_000, end));
            gpu.push(named(1, "ncclDevKernel_AllReduce", end - 2_000, end));
        }
        let tls = accounts(
            Session {
                gpu,
                ..Default::default()
            },
            0,
            100_000,
        );
        assert_eq!(tls[0].busy_by_kind.communication, 4 * 4_000 - 1_000);
        assert_eq!(tls[0].busy_by_kind.communication_waiting, 4 * 2_000 - 1_000);
        assert_eq!(tls[1].busy_by_kind.communication_waiting, 0);
    }

    #[test]
    fn activity_outside_the_window_is_clipped() {
        let s = Session {
            gpu: vec![kernel(0, 7, 0, 100), kernel(0, 7, 900, 1_100)],
            ..Default::default()
        };
        let g = &accounts(s, 50, 1_000)[0];
        assert_eq!(g.busy, vec![(50, 100), (900, 1_000)]);
    }
}
