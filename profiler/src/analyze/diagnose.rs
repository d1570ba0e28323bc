//! Per GPU: its busy timeline and the attribution of every idle nanosecond,
//! with the recording's lossy windows and blind spans applied.

use std::collections::HashMap;

use super::attribute::{self, Attribution, Cause, Inputs, Piece, Tid};
use super::gpu::{gpu_timelines, GpuTimeline};
use crate::session::Session;
use crate::timeline::Timeline;

pub struct GpuDiagnosis {
    pub gpu: GpuTimeline,
    pub attribution: Attribution,
    /// The thread that issued most of this GPU's work, and its whole time
    /// by the attribution's rules: what the what-if replay rearranges.
    pub feeder: Option<Feeder>,
}

pub struct Feeder {
    pub tid: Tid,
    pub account: Vec<Piece>,
}

pub struct Diagnosis {
    pub gpus: Vec<GpuDiagnosis>,
    /// Where CPU events or GPU records were lost: idle inside is charged to
    /// unattributed.
    pub lossy_windows: Vec<(u64, u64)>,
}

/// What each thread's profiler ops (imported traces) say, as disjoint
/// sorted (start, end, cause) segments.
pub(crate) fn op_causes(tl: &Timeline) -> HashMap<Tid, Vec<(u64, u64, Cause)>> {
    tl.gpu
        .host_ops
        .iter()
        .map(|(t, ops)| {
            let causes = ops
                .iter()
                .map(|o| (o.start, o.end, attribute::op_cause(&o.name)))
                .collect();
            (*t, attribute::flatten_ops(causes))
        })
        .collect()
}

/// `tl` must have been built with intervals. `keep_pieces`: see
/// [`Inputs::keep_pieces`].
pub fn diagnose(session: &Session, tl: &Timeline, keep_pieces: bool) -> Diagnosis {
    let ops = op_causes(tl);
    let lossy_windows = super::loss::lossy_windows(session);
    let blind_windows = super::loss::blind_windows(session);
    let gpus = gpu_timelines(&tl.gpu, tl.start, tl.end)
        .into_iter()
        .zip(&tl.gpu.devices)
        .map(|(gpu, device)| {
            let work = device.starts();
            let inputs = Inputs {
                window: (tl.start, tl.end),
                busy: &gpu.busy,
                work: &work,
                threads: &tl.threads,
                api: &tl.gpu.calls,
                ops: &ops,
                blind: &blind_windows,
                lossy: &lossy_windows,
                keep_pieces,
                unsettled: None,
            };
            let attribution = attribute::attribute(&inputs);
            let feeder = attribute::main_feeder(&work).map(|tid| {
                let mut account = Attribution::new(Vec::new(), Vec::new(), true);
                attribute::account(&inputs, tid, tl.start, tl.end, &mut account);
                Feeder {
                    tid,
                    account: account.pieces,
                }
            });
            GpuDiagnosis {
                gpu,
                attribution,
                feeder,
            }
        })
        .collect();
    Diagnosis {
        gpus,
        lossy_windows,
    }
}
