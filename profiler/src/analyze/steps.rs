//! Training steps, where a recording or a trace marks them: the PyTorch
//! profiler's `ProfilerStep#N` ops, or NVTX ranges named like steps
//! ("step 12", "train_step#3", "iteration_7"). Two runs of one job are
//! compared step by step (`export::diff`).

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

/// Words that name a step when a number follows.
const STEP_WORDS: [&str; 3] = ["step", "iteration", "iter"];

/// A range name as (its name without the number, the number), when it
/// names a numbered step: "ProfilerStep#12" → ("ProfilerStep#", 12).
fn numbered(name: &str) -> Option<(&str, u64)> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || digits > 18 {
        return None;
    }
    let (stem, number) = name.split_at(name.len() - digits);
    let word = stem
        .trim_end_matches([' ', '#', '_', '-', ':', '='])
        .to_ascii_lowercase();
    if !STEP_WORDS.iter().any(|w| word.ends_with(w)) {
        return None;
    }
    Some((stem, number.parse().ok()?))
}

/// The run's steps: `ProfilerStep#N` ops where a trace has them, else the
/// most common numbered step name among the NVTX ranges; None when fewer
/// than two steps are marked.
pub fn find(tl: &Timeline) -> Option<Steps> {
    let ops: Vec<Step> = tl
        .gpu
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
    for r in tl.gpu.ranges.values().flatten() {
        if let Some((stem, n)) = numbered(&r.name) {
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
    let work = || tl.gpu.devices.iter().flat_map(|d| &d.work);
    let mut launched: Vec<(u64, u64)> = work()
        .filter_map(|w| Some((w.launch?.1, w.span().1)))
        .collect();
    launched.sort_unstable();
    let mut out = Vec::with_capacity(steps.steps.len());
    let first_end = steps.steps.first().map_or(0, |s| s.end);
    // Only where launches were seen at all: without them, nothing tells
    // work queued before from work of the steps.
    let mut previous: Option<u64> = work()
        .filter(|w| !launched.is_empty() && w.launch.is_none() && w.span().0 < first_end)
        .map(|w| w.span().1)
        .max()
        .zip(steps.steps.first())
        .map(|(queued, first)| queued.max(first.start));
    for (i, s) in steps.steps.iter().enumerate() {
        let until = steps.steps.get(i + 1).map_or(s.end, |n| n.start.max(s.end));
        let from = launched.partition_point(|x| x.0 < s.start);
        let to = launched.partition_point(|x| x.0 < until);
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
    let steps = find(tl)?;
    let timed = timed(tl, &steps);
    (timed.len() >= 2).then(|| Summary {
        cut: steps.steps.len() - timed.len(),
        source: steps.source,
        timed,
    })
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

    #[test]
    fn step_names() {
        assert_eq!(numbered("ProfilerStep#12"), Some(("ProfilerStep#", 12)));
        assert_eq!(numbered("step 3"), Some(("step ", 3)));
        assert_eq!(numbered("train_step_7"), Some(("train_step_", 7)));
        assert_eq!(numbered("Iteration:40"), Some(("Iteration:", 40)));
        assert_eq!(numbered("iter5"), Some(("iter", 5)));
        assert_eq!(numbered("layer 3"), None);
        assert_eq!(numbered("step"), None);
        assert_eq!(numbered("forward"), None);
    }
}
