//! Does the GPU timeline sit on the CPU clock? Checks that need no GPU of
//! their own: every kernel after the API call that launched it, and every
//! launch call made while the eBPF timeline had its thread on a CPU.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::timeline::{Interval, State, Timeline};

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

impl ClockCheck {
    /// A kernel against the call that launched it, at `launched`.
    pub(crate) fn kernel(&mut self, start: u64, launched: u64) {
        self.kernels_checked += 1;
        if start < launched {
            self.kernels_before_launch += 1;
        }
    }

    /// That call against its thread's states: `on_cpu` is None when the
    /// thread keeps none.
    pub(crate) fn launch(&mut self, on_cpu: Option<bool>) {
        if let Some(on_cpu) = on_cpu {
            self.launches_checked += 1;
            if !on_cpu {
                self.launches_while_off_cpu += 1;
            }
        }
    }
}

/// Whether a thread with states `iv` was on a CPU at `at`. A thread calls
/// only while on a CPU: a launch timed anywhere else — blocked, waiting for
/// a CPU, or outside the thread's known life — says the two clocks
/// disagree.
pub(crate) fn on_cpu_at(iv: &[Interval], at: u64) -> bool {
    let i = iv.partition_point(|i| i.end <= at);
    iv.get(i)
        .is_some_and(|i| i.start <= at && matches!(i.state, State::OnCpu | State::Stolen))
}

/// Per device: kernels vs their launch calls, launch calls vs the eBPF
/// thread states.
pub fn clock_checks(tl: &Timeline) -> BTreeMap<u32, ClockCheck> {
    let mut out: BTreeMap<u32, ClockCheck> = BTreeMap::new();
    for d in &tl.gpu.devices {
        for w in &d.work {
            let (Some(_), Some((thread, launched))) = (w.kernel(), w.launch) else {
                continue;
            };
            let c = out.entry(d.id).or_default();
            c.kernel(w.start, launched);
            let states = tl.threads.get(&thread).and_then(|t| t.intervals.as_deref());
            c.launch(states.map(|iv| on_cpu_at(iv, launched)));
        }
    }
    out
}
