//! Training steps, where a recording or a trace marks them: the PyTorch
//! profiler's `ProfilerStep#N` ops, or NVTX ranges named like steps
//! ("step 12", "train_step#3", "iteration_7"). Two runs of one job are
//! compared step by step (`export::diff`).

use crate::timeline::gpu::{step_number, GpuSide};
use crate::timeline::Timeline;

/// One step: its number (as named) and its span on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub number: u64,
    pub start: u64,
    pub end: u64,
}

/// The steps of a run and what marked them.
#[derive(Clone, Debug, PartialEq)]
pub struct Steps {
    /// "ProfilerStep#N", or the NVTX name with N for the number
    /// ("NVTX step N").
    pub source: String,
    /// By start.
    pub steps: Vec<Step>,
}

/// The run's steps: `ProfilerStep#N` ops where a trace has them, else the
/// most common numbered step name among the NVTX ranges; None when fewer
/// than two steps are marked.
pub fn find(gpu: &GpuSide) -> Option<Steps> {
    let ops: Vec<Step> = gpu
        .host_ops
        .values()
        .flatten()
        .filter_map(|o| {
            let n = o.name.strip_prefix("ProfilerStep#")?.parse().ok()?;
            Some(Step {
                number: n,
                start: o.start,
                end: o.end,
            })
        })
        .collect();
    if ops.len() >= 2 {
        return Some(Steps {
            source: "ProfilerStep#N".into(),
            steps: in_order(ops),
        });
    }
    // NVTX: by stem, the one most ranges carry.
    let mut by_stem: std::collections::BTreeMap<&str, Vec<Step>> = Default::default();
    for r in gpu.ranges.values().flatten() {
        if let Some((stem, n)) = step_number(&r.name) {
            by_stem.entry(stem).or_default().push(Step {
                number: n,
                start: r.start,
                end: r.end,
            });
        }
    }
    let (stem, steps) = by_stem.into_iter().max_by_key(|(_, v)| v.len())?;
    (steps.len() >= 2).then(|| Steps {
        source: format!("NVTX \"{stem}N\""),
        steps: in_order(steps),
    })
}

/// One step as timed: from the moment the previous step's results were
/// out to the moment its own were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed {
    pub number: u64,
    pub begin: u64,
    pub end: u64,
    /// GPU work it launched, as the trace or recording holds it.
    pub launched: usize,
}

/// Each step from the moment the previous step's results were out to the
/// moment its own were — its host span's end, or the end of the GPU work
/// it launched when that came later. (A loop that never waits for its GPU
/// queues steps far faster than the GPU runs them: host spans alone would
/// call it fast however slow its GPU work is.) The first step's
/// predecessor is GPU work launched before the recording or trace began
/// (work whose launch it does not hold, running before that step's end):
/// the step begins when that is done, as the TensorBoard plugin times it.
///
/// Steps at the end whose GPU work was not recorded are left out, as the
/// plugin leaves them: a profiler stopping at a step's end stops before
/// the kernels that step queued have run, so those steps look short and
/// idle. Those that launched nothing the trace holds go, and then the last
/// if it launched under 80% of what the step before it did.
pub fn timed(tl: &Timeline, steps: &Steps) -> Vec<Timed> {
    let mut t = Timing::new(steps);
    for w in tl.gpu.devices.iter().flat_map(|d| &d.work) {
        t.add(w.launch.map(|l| l.1), w.span());
    }
    t.finish()
}

/// [`timed`], its GPU work added an item at a time, in any order.
pub struct Timing<'s> {
    steps: &'s [Step],
    /// Where each step's launches end: the next step's start, or its own
    /// end if later.
    until: Vec<u64>,
    /// The largest `until` up to each step: a launch at `t` belongs to the
    /// steps starting by `t` whose `until` is past it.
    reach: Vec<u64>,
    /// Per step: work launched in it, and the latest end of that work.
    launched: Vec<(usize, u64)>,
    any_launched: bool,
    /// The latest end of work with no launch starting before the first
    /// step's end.
    queued: Option<u64>,
}

impl<'s> Timing<'s> {
    pub fn new(steps: &'s Steps) -> Timing<'s> {
        let s = &steps.steps;
        let until: Vec<u64> = (0..s.len())
            .map(|i| s.get(i + 1).map_or(s[i].end, |n| n.start.max(s[i].end)))
            .collect();
        let reach = until
            .iter()
            .scan(0u64, |m, &u| {
                *m = (*m).max(u);
                Some(*m)
            })
            .collect();
        Timing {
            steps: s,
            until,
            reach,
            launched: vec![(0, 0); s.len()],
            any_launched: false,
            queued: None,
        }
    }

    /// A piece of GPU work over `span`, launched at `launch` if known.
    pub fn add(&mut self, launch: Option<u64>, (start, end): (u64, u64)) {
        let Some(at) = launch else {
            if self.steps.first().is_some_and(|f| start < f.end) {
                self.queued = Some(self.queued.map_or(end, |q| q.max(end)));
            }
            return;
        };
        self.any_launched = true;
        let mut i = self.steps.partition_point(|s| s.start <= at);
        while i > 0 && self.reach[i - 1] > at {
            i -= 1;
            if self.until[i] > at {
                let l = &mut self.launched[i];
                l.0 += 1;
                l.1 = l.1.max(end);
            }
        }
    }

    pub fn finish(self) -> Vec<Timed> {
        let steps = self.steps;
        let mut out = Vec::with_capacity(steps.len());
        // Only where launches were seen at all: without them, nothing tells
        // work queued before from work of the steps.
        let mut previous: Option<u64> = self
            .queued
            .filter(|_| self.any_launched)
            .zip(steps.first())
            .map(|(queued, first)| queued.max(first.start));
        for (s, &(launched, latest)) in steps.iter().zip(&self.launched) {
            let done = s.end.max(latest);
            let begun = previous.map_or(s.start, |p| p.min(done));
            out.push(Timed {
                number: s.number,
                begin: begun,
                end: done,
                launched,
            });
            previous = Some(previous.map_or(done, |p| p.max(done)));
        }
        if self.any_launched && out.len() > 1 {
            let Some(last) = out.iter().rposition(|t| t.launched > 0) else {
                return out;
            };
            let mut keep = last + 1;
            if last > 0 && (out[last].launched as f64) < 0.8 * out[last - 1].launched as f64 {
                keep = last;
            }
            out.truncate(keep);
        }
        out
    }
}

/// The steps as a report gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub source: String,
    pub timed: Vec<Timed>,
    /// Steps at the end left out, their GPU work not recorded.
    pub cut: usize,
}

impl Summary {
    /// From the first step's beginning to the last one's end.
    pub fn span(&self) -> (u64, u64) {
        let a = self.timed.first().map_or(0, |t| t.begin);
        (a, self.timed.last().map_or(a, |t| t.end))
    }

    pub fn mean_ns(&self) -> u64 {
        let n = self.timed.len().max(1) as u64;
        self.timed.iter().map(|t| t.end - t.begin).sum::<u64>() / n
    }
}

/// The run's steps, timed; None when fewer than two are marked (or kept).
pub fn summary(tl: &Timeline) -> Option<Summary> {
    let steps = find(&tl.gpu)?;
    let timed = timed(tl, &steps);
    Summary::new(steps, timed)
}

impl Summary {
    /// The steps found and `timed`; None when fewer than two are kept.
    pub fn new(steps: Steps, timed: Vec<Timed>) -> Option<Summary> {
        (timed.len() >= 2).then(|| Summary {
            cut: steps.steps.len() - timed.len(),
            source: steps.source,
            timed,
        })
    }
}

/// Sorted by start, one per number (ranks or threads marking the same
/// step: the first).
fn in_order(mut steps: Vec<Step>) -> Vec<Step> {
    steps.sort_by_key(|s| (s.start, s.number));
    let mut seen = std::collections::HashSet::new();
    steps.retain(|s| seen.insert(s.number));
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timing as first written: every launch sorted, then each step's
    /// range of them.
    fn timed_at_once(steps: &Steps, work: &[(Option<u64>, (u64, u64))]) -> Vec<Timed> {
        let mut launched: Vec<(u64, u64)> = work
            .iter()
            .filter_map(|&(l, (_, e))| Some((l?, e)))
            .collect();
        launched.sort_unstable();
        let first_end = steps.steps.first().map_or(0, |s| s.end);
        let mut previous: Option<u64> = work
            .iter()
            .filter(|&&(l, (s, _))| !launched.is_empty() && l.is_none() && s < first_end)
            .map(|&(_, (_, e))| e)
            .max()
            .zip(steps.steps.first())
            .map(|(queued, first)| queued.max(first.start));
        let mut out = Vec::new();
        for (i, s) in steps.steps.iter().enumerate() {
            let until = steps.steps.get(i + 1).map_or(s.end, |n| n.start.max(s.end));
            let from = launched.partition_point(|x| x.0 < s.start);
            let to = launched.partition_point(|x| x.0 < until).max(from);
            let done = launched[from..to].iter().map(|x| x.1).fold(s.end, u64::max);
            let begun = previous.map_or(s.start, |p| p.min(done));
            out.push(Timed {
                number: s.number,
                begin: begun,
                end: done,
                launched: to - from,
            });
            previous = Some(previous.map_or(done, |p| p.max(done)));
        }
        if !launched.is_empty() && out.len() > 1 {
            let Some(last) = out.iter().rposition(|t| t.launched > 0) else {
                return out;
            };
            let mut keep = last + 1;
            if last > 0 && (out[last].launched as f64) < 0.8 * out[last - 1].launched as f64 {
                keep = last;
            }
            out.truncate(keep);
        }
        out
    }

    #[test]
    fn steps_timed_item_by_item_in_any_order_are_timed_as_at_once() {
        let mut rng = crate::testing::Rng::new(0x2545f4914f6cdd1d);
        let mut rnd = |n: u64| rng.below(n);
        for _ in 0..300 {
            let mut steps = Vec::new();
            let mut at = rnd(50);
            for number in 0..rnd(8) {
                let len = 1 + rnd(40);
                steps.push(Step {
                    number,
                    start: at,
                    end: at + len,
                });
                // Steps may overlap (ranks or threads marking them).
                at = (at + len + rnd(20)).saturating_sub(rnd(30));
            }
            let steps = Steps {
                source: String::new(),
                steps: in_order(steps),
            };
            let work: Vec<(Option<u64>, (u64, u64))> = (0..rnd(40))
                .map(|_| {
                    let s = rnd(300);
                    let launch = (rnd(4) > 0).then(|| s.saturating_sub(rnd(30)));
                    (launch, (s, s + rnd(50)))
                })
                .collect();
            let mut t = Timing::new(&steps);
            for &(l, span) in work.iter().rev() {
                t.add(l, span);
            }
            assert_eq!(
                t.finish(),
                timed_at_once(&steps, &work),
                "{steps:?} {work:?}"
            );
        }
    }

    #[test]
    fn step_names() {
        assert_eq!(step_number("ProfilerStep#12"), Some(("ProfilerStep#", 12)));
        assert_eq!(step_number("step 3"), Some(("step ", 3)));
        assert_eq!(step_number("train_step_7"), Some(("train_step_", 7)));
        assert_eq!(step_number("Iteration:40"), Some(("Iteration:", 40)));
        assert_eq!(step_number("iter5"), Some(("iter", 5)));
        assert_eq!(step_number("layer 3"), None);
        assert_eq!(step_number("step"), None);
        assert_eq!(step_number("forward"), None);
    }
}
