//! Clocks as the profiler uses them. The timeline is CLOCK_MONOTONIC
//! nanoseconds, the clock bpf_ktime_get_ns() uses; readings come from
//! gapscope_wire::clock, shared with the shim.

use gapscope_wire::clock::read;

/// CLOCK_MONOTONIC, ns: the timeline's clock.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME, ns since the Unix epoch.
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// One reading of both clocks taken together: (CLOCK_MONOTONIC,
/// CLOCK_REALTIME) ns. The realtime read is bracketed by two monotonic ones
/// and the tightest of a few tries kept, its monotonic side the bracket's
/// middle: a preemption between two plain reads would put the pair off by
/// as long as it lasted, and sessions from several nodes are aligned on
/// these pairs.
pub fn pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..8 {
        let a = monotonic_ns();
        let wall = realtime_ns();
        let b = monotonic_ns();
        if b - a < best.0 {
            best = (b - a, a + (b - a) / 2, wall);
        }
    }
    (best.1, best.2)
}

/// Wall-clock time (Unix ns) of a timeline timestamp, given one pair of
/// readings of both clocks taken together.
pub fn to_unix_ns(mono_ns: u64, anchor_mono_ns: u64, anchor_unix_ns: u64) -> u64 {
    (anchor_unix_ns as i128 + mono_ns as i128 - anchor_mono_ns as i128).max(0) as u64
}

/// A UTC date and time from Unix ns, without a time-zone database.
pub fn utc(unix_ns: u64) -> String {
    let secs = (unix_ns / 1_000_000_000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_of_readings_keeps_the_clocks_offset() {
        // Two pairs a moment apart: the same offset between the clocks, to
        // well within a millisecond (NTP slews far slower than that).
        let (m1, w1) = pair();
        let (m2, w2) = pair();
        let off = |m: u64, w: u64| w as i128 - m as i128;
        assert!((off(m1, w1) - off(m2, w2)).abs() < 1_000_000);
        assert!(m2 >= m1);
    }

    #[test]
    fn monotonic_matches_bpf_clock_domain_and_advances() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(b - a >= 5_000_000, "{a} -> {b}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            utc(1_795_000_000 * 1_000_000_000),
            "2026-11-18 11:06:40 UTC"
        );
    }

    #[test]
    fn unix_conversion_is_an_offset() {
        assert_eq!(to_unix_ns(150, 100, 1_000), 1_050);
        assert_eq!(to_unix_ns(50, 100, 1_000), 950);
    }
}
