//! The requests a server's GPU answered, read from its feeder's account:
//! where the feeder waits in a request loop (`demand`), each wait that
//! ends is a request arriving, and the feeder back in the loop is its
//! answer done. Needs no hook on the server's reads and writes: the
//! account already says where it waited for requests and where it did
//! anything else.
//!
//! A server that answers one request at a time on its feeder thread is
//! read exactly; one that takes the next request before answering the
//! last (pipelining, batching on the feeder) reads as fewer, longer
//! requests, each a batch.

use super::account::Account;
use super::stats;

/// What the requests of one GPU's server came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Requests {
    /// Requests answered: waits for one that ended, and the answer done
    /// (the feeder waiting for the next).
    pub count: u64,
    /// From the first request's arrival to the last one's answer.
    pub start: u64,
    pub end: u64,
    /// Each request's time from its arrival (the wakeup that ended the
    /// wait) to the server waiting for the next, ns.
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// The GPU's busy time over their span.
    pub gpu_busy_ns: u64,
    /// The energy the GPU used over their span, where NVML said.
    pub energy_j: Option<f64>,
}

impl Requests {
    /// Requests a second over their span.
    pub fn rate_per_s(&self) -> f64 {
        self.count as f64 * 1e9 / (self.end - self.start).max(1) as f64
    }
}

/// Each request's `[arrival, answered)`, in order: the stretches between
/// one wait for a request and the next in which the GPU worked. A wait the
/// recording ends in answers nothing; one that ends in no GPU work (a
/// connection accepted, a health check) is no request for the GPU.
pub fn spans(account: &Account, busy_within: impl Fn(u64, u64) -> u64) -> Vec<(u64, u64)> {
    account
        .between_requests()
        .iter()
        .copied()
        .filter(|&(a, b)| busy_within(a, b) > 0)
        .collect()
}

/// The figures of `spans`, or None where no request was answered, with
/// the GPU's busy time and energy over a span.
pub fn of(
    spans: &[(u64, u64)],
    busy_within: impl Fn(u64, u64) -> u64,
    energy_within: impl Fn(u64, u64) -> Option<f64>,
) -> Option<Requests> {
    let (first, last) = (spans.first()?, spans.last()?);
    let mut times: Vec<f64> = spans.iter().map(|(a, b)| (b - a) as f64).collect();
    times.sort_by(f64::total_cmp);
    Some(Requests {
        count: spans.len() as u64,
        start: first.0,
        end: last.1,
        p50_ns: stats::quantile(&times, 0.5).round() as u64,
        p99_ns: stats::quantile(&times, 0.99).round() as u64,
        max_ns: *times.last().expect("not empty") as u64,
        gpu_busy_ns: busy_within(first.0, last.1),
        energy_j: energy_within(first.0, last.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::attribute::Piece;
    use crate::analyze::cause::Cause;

    fn account(pieces: &[(u64, u64, Cause)]) -> Account {
        let feeder = (1, 1);
        let mut a = Account::default();
        for &(start, end, cause) in pieces {
            a.push(
                &Piece {
                    start,
                    end,
                    cause,
                    thread: Some(feeder),
                },
                feeder,
            );
        }
        a
    }

    #[test]
    fn a_request_runs_from_the_wait_it_ends_to_the_next_wait() {
        let a = account(&[
            (0, 10, Cause::CpuHost),
            (10, 50, Cause::Demand),
            // A request: woken at 50, waits for a CPU, works, syncs.
            (50, 52, Cause::CpuContention),
            (52, 60, Cause::CpuHost),
            (60, 64, Cause::Sync),
            (64, 100, Cause::Demand),
            // A wait split in two pieces is one wait.
            (100, 120, Cause::Demand),
            (120, 130, Cause::CpuHost),
            (130, 200, Cause::Demand),
            // Woken by the client closing: no answer follows.
            (200, 205, Cause::Teardown),
        ]);
        let busy = |a: u64, b: u64| (b - a) / 2;
        assert_eq!(spans(&a, busy), vec![(50, 64), (120, 130)]);
        let r = of(&spans(&a, busy), busy, |_, _| None).unwrap();
        assert_eq!((r.count, r.start, r.end, r.max_ns), (2, 50, 130, 14));
        assert_eq!((r.p50_ns, r.gpu_busy_ns), (12, 40));
        assert!((r.rate_per_s() - 2.0 * 1e9 / 80.0).abs() < 1e-6);
    }

    #[test]
    fn a_wakeup_that_gives_the_gpu_no_work_is_no_request() {
        let a = account(&[
            (0, 50, Cause::Demand),
            // A connection accepted, the server back to reading from it.
            (50, 52, Cause::CpuHost),
            (52, 100, Cause::Demand),
            (100, 110, Cause::Sync),
            (110, 150, Cause::Demand),
        ]);
        let busy = |a: u64, b: u64| u64::from(a <= 100 && 100 < b);
        assert_eq!(spans(&a, busy), vec![(100, 110)]);
    }

    #[test]
    fn no_wait_for_requests_is_no_requests() {
        let a = account(&[(0, 10, Cause::CpuHost), (10, 20, Cause::InputNetwork)]);
        assert!(spans(&a, |_, _| 1).is_empty());
        assert_eq!(of(&[], |_, _| 0, |_, _| None), None);
    }
}
