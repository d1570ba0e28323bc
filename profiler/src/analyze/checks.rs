//! Does the GPU timeline sit on the CPU clock? Checks that need no GPU of
//! their own: every kernel after the API call that launched it, and every
//! launch call made while the eBPF timeline had its thread on a CPU.

use std::collections::BTreeMap;

use gapscope_cupti::GpuRecord;
use serde::Serialize;

use crate::timeline::{State, Timeline};

/// Does the GPU timeline sit on the CPU clock? A kernel must start after the
/// API call that launched it, and a launch call must happen while the eBPF
/// timeline has its thread on a CPU.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct ClockCheck {
    pub kernels_checked: u64,
    pub kernels_before_launch: u64,
    pub launches_checked: u64,
    pub launches_while_off_cpu: u64,
}

/// Per device: kernels vs their launch calls, launch calls vs the eBPF
/// thread states.
pub fn clock_checks(tl: &Timeline) -> BTreeMap<u32, ClockCheck> {
    let mut out: BTreeMap<u32, ClockCheck> = BTreeMap::new();
    for d in &tl.gpu.devices {
        for w in &d.work {
            let GpuRecord::Kernel { start, .. } = &w.record else {
                continue;
            };
            let Some((thread, api_start)) = w.launch else {
                continue;
            };
            let c = out.entry(d.id).or_default();
            c.kernels_checked += 1;
            if *start < api_start {
                c.kernels_before_launch += 1;
            }
            let Some(iv) = tl.threads.get(&thread).and_then(|t| t.intervals.as_ref()) else {
                continue;
            };
            c.launches_checked += 1;
            // A thread calls only while on a CPU: a launch timed anywhere
            // else — blocked, waiting for a CPU, or outside the thread's
            // known life — says the two clocks disagree.
            let i = iv.partition_point(|i| i.end <= api_start);
            let on_cpu = iv
                .get(i)
                .is_some_and(|i| i.start <= api_start && matches!(i.state, State::OnCpu));
            if !on_cpu {
                c.launches_while_off_cpu += 1;
            }
        }
    }
    out
}
