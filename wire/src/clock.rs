//! Clock readings as u64 nanoseconds: the one implementation the shim, the
//! profiler and the example workloads share (the shim is the crate they all
//! depend on). CLOCK_MONOTONIC is the timeline's clock, the one
//! bpf_ktime_get_ns() reads.

pub fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC, ns.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CLOCK_MONOTONIC minus another clock, read by `other`: the tightest of
/// several readings taken between two of ours, so that neither the cost of
/// reading it nor a preemption between the reads skews the result.
pub fn monotonic_minus(mut other: impl FnMut() -> u64) -> i64 {
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..16 {
        let a = monotonic_ns();
        let t = other();
        let b = monotonic_ns();
        let offset = (a / 2 + b / 2) as i64 - t as i64;
        if best.is_none_or(|(w, _)| b - a < w) {
            best = Some((b - a, offset));
        }
    }
    best.map(|b| b.1).unwrap_or(0)
}
