//! Clocks as the profiler uses them. The timeline is CLOCK_MONOTONIC
//! nanoseconds, the clock bpf_ktime_get_ns() uses; readings come from
//! gapscope_cupti::clock, shared with the shim.

use gapscope_cupti::clock::read;

/// CLOCK_MONOTONIC, ns: the timeline's clock.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME, ns since the Unix epoch.
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// Wall-clock time (Unix ns) of a timeline timestamp, given one pair of
/// readings of both clocks taken together.
pub fn to_unix_ns(mono_ns: u64, anchor_mono_ns: u64, anchor_unix_ns: u64) -> u64 {
    (anchor_unix_ns as i128 + mono_ns as i128 - anchor_mono_ns as i128).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_matches_bpf_clock_domain_and_advances() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(b - a >= 5_000_000, "{a} -> {b}");
    }

    #[test]
    fn unix_conversion_is_an_offset() {
        assert_eq!(to_unix_ns(150, 100, 1_000), 1_050);
        assert_eq!(to_unix_ns(50, 100, 1_000), 950);
    }
}
