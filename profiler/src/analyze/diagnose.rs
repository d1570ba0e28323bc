//! The merged analysis of a session: per GPU, its busy timeline and the
//! attribution of every idle nanosecond, plus each thread's CUDA calls.

use std::collections::HashMap;

use gapscope_cupti::GpuRecord;

use super::attribute::{self, api_role, ApiSpan, Attribution, Cause, Inputs, Tid};
use super::gpu::{gpu_timelines, GpuTimeline};
use super::{api_name, RecordMap};
use crate::session::{Event, Session};
use crate::timeline::Timeline;

pub struct GpuDiagnosis {
    pub gpu: GpuTimeline,
    pub attribution: Attribution,
}

pub struct Diagnosis {
    pub gpus: Vec<GpuDiagnosis>,
    /// Where CPU events or GPU records were lost: idle inside is charged to
    /// unattributed.
    pub lossy_windows: Vec<(u64, u64)>,
    /// Each thread's CUDA API calls, sorted.
    pub api: HashMap<Tid, Vec<ApiSpan>>,
}

/// `tl` must have been built with intervals.
pub fn diagnose(session: &Session, tl: &Timeline) -> Diagnosis {
    let mut api: RecordMap<Tid, Vec<ApiSpan>> = RecordMap::new();
    let mut issuer: RecordMap<(u32, u32), Tid> = RecordMap::new();
    // A role per API id, decided once: the names repeat millions of times.
    let mut roles: RecordMap<(gapscope_cupti::ApiDomain, u32), attribute::ApiRole> =
        RecordMap::new();
    for (pid, r) in &session.gpu {
        if let GpuRecord::Api {
            domain,
            cbid,
            start,
            end,
            tid,
            correlation,
            ..
        } = r
        {
            let role = *roles
                .entry((*domain, *cbid))
                .or_insert_with(|| api_role(&api_name(*domain, *cbid)));
            api.entry((*pid, *tid)).or_default().push(ApiSpan {
                start: *start,
                end: *end,
                role,
            });
            issuer.insert((*pid, *correlation), (*pid, *tid));
        }
    }
    for e in &session.events {
        if let Event::CudaCall {
            ts,
            pid,
            tid,
            dur,
            function,
            ..
        } = e
        {
            api.entry((*pid, *tid)).or_default().push(ApiSpan {
                start: *ts,
                end: ts + dur,
                role: api_role(function),
            });
        }
    }
    for spans in api.values_mut() {
        spans.sort_by_key(|s| s.start);
    }
    let api: HashMap<Tid, Vec<ApiSpan>> = api.into_iter().collect();

    let mut work: RecordMap<u32, Vec<(u64, Option<Tid>)>> = RecordMap::new();
    for (pid, r) in &session.gpu {
        let (device, start, correlation) = match r {
            GpuRecord::Kernel {
                device,
                start,
                correlation,
                ..
            }
            | GpuRecord::Memcpy {
                device,
                start,
                correlation,
                ..
            }
            | GpuRecord::Memset {
                device,
                start,
                correlation,
                ..
            } => (*device, *start, *correlation),
            _ => continue,
        };
        work.entry(device)
            .or_default()
            .push((start, issuer.get(&(*pid, correlation)).copied()));
    }
    for w in work.values_mut() {
        w.sort_by_key(|x| x.0);
    }

    let mut ops: HashMap<Tid, Vec<(u64, u64, Cause)>> = HashMap::new();
    for o in &session.host_ops {
        ops.entry((o.pid, o.tid))
            .or_default()
            .push((o.start, o.end, attribute::op_cause(&o.name)));
    }
    let ops: HashMap<Tid, Vec<(u64, u64, Cause)>> = ops
        .into_iter()
        .map(|(t, v)| (t, attribute::flatten_ops(v)))
        .collect();
    let lossy_windows = super::loss::lossy_windows(session);
    let blind_windows = super::loss::blind_windows(session);
    let gpus = gpu_timelines(session, tl.start, tl.end)
        .into_iter()
        .map(|gpu| {
            let empty = Vec::new();
            let mut attribution = attribute::attribute(&Inputs {
                window: (tl.start, tl.end),
                busy: &gpu.busy,
                work: work.get(&gpu.device).unwrap_or(&empty),
                threads: &tl.threads,
                api: &api,
                ops: &ops,
            });
            super::loss::cut_unseen(&mut attribution, &blind_windows);
            super::loss::mark(&mut attribution, &lossy_windows);
            GpuDiagnosis { gpu, attribution }
        })
        .collect();
    Diagnosis {
        gpus,
        api,
        lossy_windows,
    }
}
