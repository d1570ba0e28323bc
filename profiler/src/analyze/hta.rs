//! Holistic Trace Analysis's idle-time breakdown per stream, reproduced so
//! users can compare. HTA works on the trace's µs values as doubles, so this
//! does too, deliberately (gapscope's own numbers are exact): whole-µs
//! timestamps (start rounded up, end = start + duration rounded down), GPU
//! work kept only if its launching runtime call starts before the last
//! `ProfilerStep#N` (when there are two or more), and each gap on a stream
//! classified as *host_wait* (the next work was launched after the stream
//! went idle), *kernel_wait* (shorter than 30 µs) or *other*.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::timeline::GpuSide;

pub const KERNEL_WAIT_US: i64 = 30;

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Bucket {
    pub idle_us: i64,
    pub n: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StreamIdle {
    #[serde(skip_serializing_if = "is_empty")]
    pub host_wait: Bucket,
    #[serde(skip_serializing_if = "is_empty")]
    pub kernel_wait: Bucket,
    #[serde(skip_serializing_if = "is_empty")]
    pub other: Bucket,
}

fn is_empty(b: &Bucket) -> bool {
    b.n == 0
}

/// A ns value as the double a JSON parser makes of its µs text.
fn as_double(ns: u64) -> f64 {
    format!("{}.{:03}", ns / 1000, ns % 1000)
        .parse()
        .unwrap_or(ns as f64 / 1000.0)
}

/// Per stream id: HTA's idle breakdown.
pub fn per_stream_idle(side: &GpuSide) -> BTreeMap<u32, StreamIdle> {
    let mut steps: Vec<u64> = side
        .host_ops
        .values()
        .flatten()
        .filter(|o| o.name.starts_with("ProfilerStep#"))
        .map(|o| o.start)
        .collect();
    steps.sort_unstable();
    let cutoff = (steps.len() >= 2).then(|| *steps.last().unwrap());

    let mut streams: BTreeMap<u32, Vec<(i64, i64, f64)>> = BTreeMap::new();
    for w in side.devices.iter().flat_map(|d| &d.work) {
        let Some((_, launch_start)) = w.launch else {
            continue;
        };
        let launched = as_double(launch_start);
        if cutoff.is_some_and(|c| launched >= as_double(c)) {
            continue;
        }
        let (start, end) = w.span();
        let ts = as_double(start);
        let start_us = ts.ceil() as i64;
        let end_us = (ts + as_double(end - start)).floor() as i64;
        streams
            .entry(w.stream())
            .or_default()
            .push((start_us, end_us, launched));
    }
    let mut out = BTreeMap::new();
    for (stream, mut ev) in streams {
        ev.sort_by_key(|e| (e.0, e.1));
        let mut idle = StreamIdle::default();
        for w in ev.windows(2) {
            let (prev_end, (start, _, launched)) = (w[0].1, w[1]);
            let gap = start - prev_end;
            let bucket = if launched > prev_end as f64 {
                &mut idle.host_wait
            } else if gap < KERNEL_WAIT_US {
                &mut idle.kernel_wait
            } else {
                &mut idle.other
            };
            bucket.idle_us += gap;
            bucket.n += 1;
        }
        out.insert(stream, idle);
    }
    out
}
