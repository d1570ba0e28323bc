//! Human-readable numbers for the summaries.

/// 1.23s, 45.6ms, 789µs, 12ns.
pub fn duration(ns: u64) -> String {
    let ns_f = ns as f64;
    if ns >= 100_000_000_000 {
        format!("{:.0}s", ns_f / 1e9)
    } else if ns >= 1_000_000_000 {
        format!("{:.2}s", ns_f / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1}ms", ns_f / 1e6)
    } else if ns >= 1_000 {
        format!("{:.0}µs", ns_f / 1e3)
    } else {
        format!("{ns}ns")
    }
}

/// 512 B, 4.0 KiB, 64.0 MiB, 1.5 GiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Share of a whole, as "12.3%"; "·" for nothing, "-" when the whole is 0.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else if part == 0 {
        "·".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// 950, 12.3k, 4.5M.
pub fn count(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 10_000 {
        format!("{:.1}k", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

pub use crate::clock::utc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(duration(1_234_000_000), "1.23s");
        assert_eq!(duration(45_600_000), "45.6ms");
        assert_eq!(duration(789_000), "789µs");
        assert_eq!(duration(12), "12ns");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(64 << 20), "64.0 MiB");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(0, 3), "·");
        assert_eq!(percent(1, 0), "-");
        assert_eq!(count(12_345), "12.3k");
    }
}
