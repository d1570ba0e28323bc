//! Where the recording lost events. The kernel's drop counters are read
//! about once a second; a window between two readings in which they grew
//! lost events somewhere inside it. A shim that drops GPU records says
//! which span of time they covered. Conclusions drawn from inside such a
//! window are uncertain: thread states may miss a switch, idle may miss its
//! feeder's activity or be a kernel that was never reported. The report
//! lists the windows, and the attribution charges the GPU idle inside them
//! to `unattributed` rather than to a cause it cannot prove (and takes the
//! time inside blind spans out of idle altogether) as it goes
//! (`Attribution::add`).

use crate::session::Session;

/// Windows `[start, end)` (CLOCK_MONOTONIC ns) in which CPU events or GPU
/// records were dropped, merged and sorted.
pub fn lossy_windows(session: &Session) -> Vec<(u64, u64)> {
    let mut windows = cpu_windows(session);
    windows.extend(
        session
            .gpu_lost
            .iter()
            // A span of one instant (a lone marker) still lost something.
            .map(|l| (l.start, l.end.max(l.start.saturating_add(1)))),
    );
    windows.extend(session.gpu_blind.iter().map(|b| (b.start, b.end)));
    crate::intervals::union(windows)
}

/// The report's note on lossy windows, if there were any.
pub fn lossy_note(lossy: &[(u64, u64)], start: u64) -> Option<String> {
    let (first, last) = (lossy.first()?, lossy.last()?);
    let lost: u64 = lossy.iter().map(|(s, e)| e - s).sum();
    Some(format!(
        "events were lost in {} window(s), {} of the recording ({} to {} after the start): \
         thread states or GPU activity there may be incomplete, and GPU idle inside them \
         is counted as unattributed rather than guessed",
        lossy.len(),
        crate::units::duration(lost),
        crate::units::duration(first.0.saturating_sub(start)),
        crate::units::duration(last.1.saturating_sub(start)),
    ))
}

/// Spans in which some process's GPU could not be seen at all (another
/// CUPTI client held CUPTI; a killed process's tail), merged and sorted.
pub fn blind_windows(session: &Session) -> Vec<(u64, u64)> {
    crate::intervals::union(session.gpu_blind.iter().map(|b| (b.start, b.end)).collect())
}

fn cpu_windows(session: &Session) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut prev = (session.header.as_ref().map_or(0, |h| h.start_ns), 0u64);
    for d in &session.drop_readings {
        let total = d.cpu_events();
        if total > prev.1 && d.ts > prev.0 {
            match out.last_mut() {
                Some(last) if last.1 >= prev.0 => last.1 = d.ts,
                _ => out.push((prev.0, d.ts)),
            }
        }
        // Readings are cumulative and in time order; a damaged one that
        // is not cannot shrink what came before.
        prev = (d.ts.max(prev.0), total.max(prev.1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::attribute::{Attribution, Cause, Piece};
    use crate::session::Drops;

    fn reading(ts: u64, n: u64) -> Drops {
        Drops {
            ts,
            cpu_by_kind: vec![("syscall".into(), n)],
            cpu_malformed: 0,
            gpu_records: 0,
        }
    }

    #[test]
    fn windows_are_where_the_counters_grew() {
        let mut s = Session {
            drop_readings: vec![
                reading(1_000, 0),
                reading(2_000, 5),
                reading(3_000, 9),
                reading(4_000, 9),
                reading(5_000, 12),
            ],
            ..Session::default()
        };
        assert_eq!(lossy_windows(&s), vec![(1_000, 3_000), (4_000, 5_000)]);
        s.drop_readings.truncate(1);
        assert!(lossy_windows(&s).is_empty());
    }

    #[test]
    fn spans_of_dropped_gpu_records_join_the_cpu_windows() {
        let lost = |start, end| crate::session::GpuLost {
            pid: 7,
            start,
            end,
            records: 3,
        };
        let s = Session {
            drop_readings: vec![reading(1_000, 0), reading(2_000, 5)],
            gpu_lost: vec![lost(1_500, 2_500), lost(4_000, 4_200), lost(9_000, 9_000)],
            ..Session::default()
        };
        assert_eq!(
            lossy_windows(&s),
            vec![(1_000, 2_500), (4_000, 4_200), (9_000, 9_001)]
        );
    }

    #[test]
    fn idle_inside_a_blind_span_is_unseen_not_idle() {
        let mut a = Attribution::new(vec![(50, 150), (350, 450), (600, 2_000)], vec![], true);
        for (s, e, c) in [
            (0, 100, Cause::Startup),
            (100, 400, Cause::InputIo),
            (500, 900, Cause::Teardown),
        ] {
            a.add(Piece {
                start: s,
                end: e,
                cause: c,
                thread: Some((1, 1)),
            });
        }
        let before = 100 + 300 + 400;
        assert_eq!(a.get(Cause::Startup), 50);
        assert_eq!(a.get(Cause::InputIo), 200); // 150..350
        assert_eq!(a.get(Cause::Teardown), 100); // 500..600
        assert_eq!(a.unseen, 50 + 50 + 50 + 300);
        assert_eq!(a.total() + a.unseen, before);
    }

    #[test]
    fn idle_inside_a_window_becomes_unattributed_and_nothing_is_lost() {
        let mut a = Attribution::new(vec![], vec![(50, 150), (350, 550)], false);
        for (s, e, c) in [
            (0, 100, Cause::Startup),
            (100, 400, Cause::InputIo),
            (500, 600, Cause::Sync),
        ] {
            a.add(Piece {
                start: s,
                end: e,
                cause: c,
                thread: Some((1, 1)),
            });
        }
        assert_eq!(a.by_cause.values().sum::<u64>(), 100 + 300 + 100);
        // What stays charged to a cause stays with its thread.
        assert_eq!(a.by_thread[&(Cause::InputIo, (1, 1))], 200);
        assert!(a.pieces.is_empty());
        assert_eq!(a.get(Cause::Startup), 100);
        assert_eq!(a.get(Cause::InputIo), 200); // 150..350
        assert_eq!(a.get(Cause::Sync), 50); // 550..600
        assert_eq!(a.get(Cause::Unattributed), 50 + 50 + 50);
    }
}
