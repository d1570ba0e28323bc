//! GPUs that meet in collectives, replayed together. Each GPU's replay runs
//! on a thread of its own; at each collective it says when its stream
//! reached it and waits until every GPU has, and the collective then runs
//! from the last arrival — as NCCL's kernels do, spinning until every rank
//! is in. A GPU sped up by a fix arrives earlier, and the others stop
//! waiting for it; one sped up alone waits longer.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, PoisonError};

/// The meeting point of one joint replay.
pub struct Meeting {
    runs: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Collectives not yet started: how many GPUs arrived, and the last
    /// arrival.
    arrived: BTreeMap<usize, (usize, u64)>,
    /// Collectives every GPU that will come has reached: when they start.
    released: BTreeMap<usize, u64>,
    /// GPUs waiting at a collective not yet started (counted off as it is
    /// released, not as each wakes: a GPU released but not yet running is
    /// not waiting), and those whose replay ended.
    waiting: usize,
    done: usize,
}

impl State {
    /// Starts collective `n` at its last arrival; those that waited go.
    /// `completes`: the caller is the arrival that completes it, which was
    /// never counted as waiting.
    fn release(&mut self, n: usize, completes: bool) {
        if let Some((count, last)) = self.arrived.remove(&n) {
            self.waiting -= count - usize::from(completes);
            self.released.insert(n, last);
        }
    }
}

impl Meeting {
    pub fn new(runs: usize) -> Meeting {
        Meeting {
            runs,
            state: Mutex::default(),
            changed: Condvar::new(),
        }
    }

    /// This GPU reached collective `n` at `at`: when the last GPU does.
    pub fn meet(&self, n: usize, at: u64) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // Released already (the others went on without it): its own.
        if let Some(&t) = s.released.get(&n) {
            return t.max(at);
        }
        let a = s.arrived.entry(n).or_default();
        a.0 += 1;
        a.1 = a.1.max(at);
        if a.0 == self.runs {
            s.release(n, true);
            self.changed.notify_all();
        } else {
            s.waiting += 1;
        }
        loop {
            if let Some(&t) = s.released.get(&n) {
                return t;
            }
            // Nobody else can come: every other GPU waits or has ended (a
            // GPU whose replay issues collectives in another order, or
            // ends before one). The earliest collective goes with those
            // there, so that no replay waits forever.
            if s.waiting + s.done == self.runs {
                if let Some(&k) = s.arrived.keys().next() {
                    s.release(k, false);
                    self.changed.notify_all();
                    continue;
                }
            }
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// This GPU's replay ended: it comes to no more collectives.
    pub fn leave(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.done += 1;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_starts_a_collective_at_the_last_arrival() {
        let m = Meeting::new(3);
        let got: Vec<Vec<u64>> = std::thread::scope(|s| {
            let m = &m;
            let handles: Vec<_> = (0..3u64)
                .map(|g| {
                    s.spawn(move || {
                        let out = (0..5).map(|n| m.meet(n, 100 * n as u64 + 10 * g)).collect();
                        m.leave();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in &got {
            assert_eq!(g, &vec![20, 120, 220, 320, 420]);
        }
    }

    /// A GPU that ends before a collective, and one that skips one: the
    /// others go on with those that came.
    #[test]
    fn a_gpu_that_never_comes_holds_nobody_up() {
        let m = Meeting::new(3);
        std::thread::scope(|s| {
            let m = &m;
            let a = s.spawn(move || {
                let out = [m.meet(0, 5), m.meet(1, 50), m.meet(2, 70)];
                m.leave();
                out
            });
            let b = s.spawn(move || {
                let out = [m.meet(0, 7), m.meet(2, 90)];
                m.leave();
                out
            });
            let c = s.spawn(move || {
                let out = m.meet(0, 1);
                m.leave();
                out
            });
            assert_eq!(c.join().unwrap(), 7);
            assert_eq!(a.join().unwrap(), [7, 50, 90]);
            assert_eq!(b.join().unwrap(), [7, 90]);
        });
    }
}
