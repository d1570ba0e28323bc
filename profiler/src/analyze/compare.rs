//! Two runs of a job compared (`gapscope diff BASE NEW`), from their
//! analyses: per GPU the
//! allocated, busy and idle time and the idle by cause side by side, the
//! training steps matched where they are marked, the idle-gap stacks that
//! grew or shrank, and a verdict — improved, regressed or unchanged —
//! judged against the run's own step-to-step (or second-to-second) spread
//! so that noise does not read as a change.

use std::collections::BTreeMap;

use serde::Serialize;

use super::cause::{Cause, IdleByCause};
use super::figures::{self, BusyByKind, Requests};
use super::stacks::{self, Stack, StackKind};
use super::stats::{self, Summary};
use super::Labelled;
use crate::session::SourceKind;

pub const SCHEMA: &str = "gapscope.diff/1";

/// A change smaller than this (step time, in percent of BASE's) is not
/// called one however sure it is: runs of one job on one machine differ by
/// a few percent from load alone.
pub const DEFAULT_MIN_CHANGE_PCT: f64 = 5.0;
/// The same for the idle share, in points of allocated time.
const MIN_IDLE_POINTS: f64 = 3.0;
/// Below this p-value a difference is more than the spread explains.
const P_CHANGED: f64 = 0.01;
/// Idle stacks listed as grown and as shrunk.
const TOP_STACKS: usize = 10;
/// Recommendations listed per side.
const TOP_RECOMMENDATIONS: usize = 3;

/// What a diff is asked for.
#[derive(Clone, Copy, Debug)]
pub struct DiffOptions {
    /// Fail (exit 3) when NEW's idle share is worse by more than this many
    /// points.
    pub gate_points: Option<f64>,
    /// See [`DEFAULT_MIN_CHANGE_PCT`].
    pub min_change_pct: f64,
}

impl Default for DiffOptions {
    fn default() -> DiffOptions {
        DiffOptions {
            gate_points: None,
            min_change_pct: DEFAULT_MIN_CHANGE_PCT,
        }
    }
}

/// A diff with the idle-gap stacks of each side, for its flamegraph.
pub struct Compared {
    pub diff: Diff,
    pub base_stacks: BTreeMap<Stack, u64>,
    pub new_stacks: BTreeMap<Stack, u64>,
}

impl Compared {
    /// Every idle-gap stack of either side, in order, with its ns in BASE
    /// and in NEW.
    pub fn stacks(&self) -> Vec<(&Stack, u64, u64)> {
        self.base_stacks
            .keys()
            .chain(self.new_stacks.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|s| {
                (
                    s,
                    self.base_stacks.get(s).copied().unwrap_or(0),
                    self.new_stacks.get(s).copied().unwrap_or(0),
                )
            })
            .collect()
    }
}

/// One side: what was given on the command line, and its analyses.
pub struct Side<'a> {
    pub name: String,
    pub inputs: &'a [Labelled],
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Diff {
    pub schema: &'static str,
    pub base: SideInfo,
    pub new: SideInfo,
    /// Either side came from gapscope's simulated GPU.
    pub simulated: bool,
    pub verdict: Verdict,
    /// Idle time as a share of allocated time, all GPUs together.
    pub idle_share: Share,
    pub gate: Option<Gate>,
    pub gpus: Vec<GpuDiff>,
    /// Idle by cause over all GPUs, the largest changes first.
    pub causes: Vec<CauseChange>,
    pub steps: Option<StepsDiff>,
    /// Idle share per bucket of time, where steps are not marked.
    pub rates: Option<RatesDiff>,
    pub recommendations: Recommendations,
    pub idle_stacks: StackChanges,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SideInfo {
    /// As given: a session, run directory, trace or directory of traces.
    pub path: String,
    /// Each input's label (one per rank for directories of traces).
    pub inputs: Vec<String>,
    pub command: Vec<String>,
    pub allocated_ns: u64,
    pub busy_ns: u64,
    pub idle_ns: u64,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Improved,
    Regressed,
    Unchanged,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Improved => "improved",
            Outcome::Regressed => "regressed",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// What the verdict was judged on.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Step times of matched training steps.
    Steps,
    /// The GPUs' idle share, bucket by bucket of their busy span.
    Buckets,
    /// Totals only (too little to judge a spread by).
    Totals,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Verdict {
    pub outcome: Outcome,
    pub basis: Basis,
    /// "step_time_ns" or "idle_share_pct": lower is better for both.
    pub metric: &'static str,
    #[serde(serialize_with = "r3")]
    pub base: f64,
    #[serde(serialize_with = "r3")]
    pub new: f64,
    /// new − base, in percent of base (step time) or in points (idle share).
    #[serde(serialize_with = "r3")]
    pub change: f64,
    /// How often the spread alone would give a difference this large
    /// (Welch's t-test); null on totals.
    pub p_value: Option<f64>,
    /// 1 − p_value: how sure the difference is not noise.
    pub confidence: Option<f64>,
    /// Half the 99% interval of the change, in its unit.
    #[serde(serialize_with = "r3_opt")]
    pub margin99: Option<f64>,
    /// Samples each side contributed.
    pub samples: [usize; 2],
    /// The cause whose idle share moved most.
    pub largest_change: Option<CauseChange>,
    pub text: String,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Share {
    #[serde(serialize_with = "r3")]
    pub base_pct: f64,
    #[serde(serialize_with = "r3")]
    pub new_pct: f64,
    #[serde(serialize_with = "r3")]
    pub change_points: f64,
}

impl Share {
    /// (part, whole) of each side, to 3 decimals here rather than only in
    /// the JSON: every format then shows one number (JSON's 69.75 is
    /// Markdown's 69.8%, not the 69.7% of the 69.7496 behind it).
    fn of(base: (u64, u64), new: (u64, u64)) -> Share {
        let (b, n) = (round3(pct(base.0, base.1)), round3(pct(new.0, new.1)));
        Share {
            base_pct: b,
            new_pct: n,
            change_points: round3(n - b),
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Gate {
    pub points: f64,
    pub passed: bool,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GpuFigures {
    pub allocated_ns: u64,
    pub busy_ns: u64,
    pub busy_by_kind_ns: BusyByKind,
    pub idle_ns: u64,
    #[serde(serialize_with = "r3")]
    pub idle_pct: f64,
    pub idle_by_cause_ns: IdleByCause,
    /// The requests its server answered, where it serves (see the report's).
    pub requests: Option<Requests>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GpuDiff {
    /// "GPU 0", or "<rank label> · GPU 0" with several inputs a side.
    pub key: String,
    pub name: String,
    pub base: Option<GpuFigures>,
    pub new: Option<GpuFigures>,
    pub causes: Vec<CauseChange>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct CauseChange {
    pub cause: Cause,
    pub base_ns: u64,
    pub new_ns: u64,
    /// Shares of each side's allocated time.
    #[serde(flatten)]
    pub share: Share,
}

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct StepStats {
    pub count: usize,
    pub mean_ns: u64,
    pub median_ns: u64,
    pub p90_ns: u64,
    pub sd_ns: u64,
}

impl From<Summary> for StepStats {
    fn from(s: Summary) -> StepStats {
        StepStats {
            count: s.n,
            mean_ns: s.mean.round() as u64,
            median_ns: s.median.round() as u64,
            p90_ns: s.p90.round() as u64,
            sd_ns: s.sd.round() as u64,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepsDiff {
    /// What marked them on each side ("ProfilerStep#N", NVTX "step N").
    pub source: [String; 2],
    /// Steps whose number both sides have (0: the numbers do not overlap,
    /// and all steps of each side are compared).
    pub matched: usize,
    pub base: StepStats,
    pub new: StepStats,
    /// Mean step time's change, percent.
    #[serde(serialize_with = "r3")]
    pub change_pct: f64,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct BucketStats {
    pub count: usize,
    #[serde(serialize_with = "r3")]
    pub mean_pct: f64,
    #[serde(serialize_with = "r3")]
    pub sd_pct: f64,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct RatesDiff {
    /// Width of a bucket: a second, or a tenth of the shorter busy span
    /// when that is under ten seconds.
    pub bucket_ns: u64,
    pub base: BucketStats,
    pub new: BucketStats,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RecommendationBrief {
    pub cause: String,
    pub title: String,
    /// The replay's speedup where there is one, else the upper bound.
    #[serde(serialize_with = "r3")]
    pub speedup: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Recommendations {
    pub base: Vec<RecommendationBrief>,
    pub new: Vec<RecommendationBrief>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StackChange {
    /// Root first: the cause, the thread, then its frames.
    pub frames: Vec<String>,
    pub base_ns: u64,
    pub new_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StackChanges {
    pub grew: Vec<StackChange>,
    pub shrank: Vec<StackChange>,
}

/// Shares and changes to 3 decimals: their noise is in the first.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn r3<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(round3(*x))
}

fn r3_opt<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => r3(v, s),
        None => s.serialize_none(),
    }
}

/// `part` in percent of `whole` (0 of nothing).
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Steps of one input: what marked them, and each one's time by number.
type Steps = (String, Vec<(u64, u64)>);

/// A GPU of one side: the input it is in, and its figures.
struct SideGpu<'a> {
    input: usize,
    id: u32,
    name: &'a str,
    source: SourceKind,
    figures: figures::Gpu,
}

/// One side's analyses, its GPUs' figures taken once.
struct Built<'a> {
    side: &'a Side<'a>,
    gpus: Vec<SideGpu<'a>>,
}

impl<'a> Built<'a> {
    fn new(side: &'a Side<'a>) -> Built<'a> {
        let gpus = side
            .inputs
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.analysis.diagnosis.gpus.iter().map(move |d| SideGpu {
                    input: i,
                    id: d.gpu.device,
                    name: &d.gpu.name,
                    source: d.gpu.source,
                    figures: figures::gpu(&l.analysis, d),
                })
            })
            .collect();
        Built { side, gpus }
    }

    fn totals(&self) -> (u64, u64, u64) {
        self.gpus.iter().fold((0, 0, 0), |(a, b, i), g| {
            let f = &g.figures;
            (a + f.allocated_ns, b + f.busy_ns, i + f.idle_ns)
        })
    }

    fn idle_by_cause(&self) -> IdleByCause {
        IdleByCause::from_fn(|c| {
            self.gpus
                .iter()
                .map(|g| g.figures.idle_by_cause_ns.get(c))
                .sum()
        })
    }

    fn info(&self) -> SideInfo {
        let (allocated_ns, busy_ns, idle_ns) = self.totals();
        SideInfo {
            path: self.side.name.clone(),
            inputs: self.side.inputs.iter().map(|l| l.label.clone()).collect(),
            command: self
                .side
                .inputs
                .first()
                .map(|l| l.analysis.facts.header.command.clone())
                .unwrap_or_default(),
            allocated_ns,
            busy_ns,
            idle_ns,
        }
    }

    /// The steps of input `i` as its analysis timed them (two or more):
    /// what marked them, and each one's time by number.
    fn steps_of(&self, i: usize) -> Option<Steps> {
        let s = self.side.inputs.get(i)?.analysis.diagnosis.steps.as_ref()?;
        let times = s.timed.iter().map(|t| (t.number, t.end - t.begin));
        Some((s.source.clone(), times.collect()))
    }

    /// The first input that marks steps, and its steps.
    fn steps(&self) -> Option<(usize, Steps)> {
        (0..self.side.inputs.len()).find_map(|i| Some((i, self.steps_of(i)?)))
    }

    /// Each GPU's busy span, cut into `width` buckets: each bucket's idle
    /// share, percent (a last bucket shorter than half is left out).
    fn buckets(&self, width: u64) -> Vec<f64> {
        let mut out = Vec::new();
        for l in self.side.inputs {
            for g in &l.analysis.diagnosis.gpus {
                let busy = &g.gpu.busy;
                let (Some(&(first, _)), Some(&(_, last))) = (busy.first(), busy.last()) else {
                    continue;
                };
                let mut a = first;
                while a < last {
                    let b = (a + width).min(last);
                    if (b - a) * 2 < width {
                        break;
                    }
                    let on = crate::intervals::total(&crate::intervals::clip(busy, a, b));
                    out.push(100.0 - pct(on, b - a));
                    a = b;
                }
            }
        }
        out
    }

    fn busy_span(&self) -> u64 {
        self.side
            .inputs
            .iter()
            .flat_map(|l| &l.analysis.diagnosis.gpus)
            .filter_map(|g| Some(g.gpu.busy.last()?.1 - g.gpu.busy.first()?.0))
            .max()
            .unwrap_or(0)
    }

    fn recommendations(&self) -> Vec<RecommendationBrief> {
        self.side
            .inputs
            .iter()
            .flat_map(|l| &l.analysis.advice.recommendations)
            .take(TOP_RECOMMENDATIONS)
            .map(|r| RecommendationBrief {
                cause: r.cause.name().to_string(),
                title: r.title.clone(),
                speedup: r.what_if.as_ref().map_or(r.est_speedup, |w| w.speedup),
            })
            .collect()
    }

    /// Idle-gap stacks over all inputs, each with its ns.
    fn idle_stacks(&self) -> BTreeMap<Stack, u64> {
        let mut out = BTreeMap::new();
        for l in self.side.inputs {
            for (s, w) in stacks::stacks(&l.analysis, StackKind::Idle) {
                *out.entry(s).or_default() += w;
            }
        }
        out
    }

    fn simulated(&self) -> bool {
        self.gpus.iter().any(|g| g.source == SourceKind::Simulated)
    }
}

fn gpu_figures(f: &figures::Gpu) -> GpuFigures {
    GpuFigures {
        allocated_ns: f.allocated_ns,
        busy_ns: f.busy_ns,
        busy_by_kind_ns: f.busy_by_kind_ns,
        idle_ns: f.idle_ns,
        idle_pct: pct(f.idle_ns, f.allocated_ns),
        idle_by_cause_ns: f.idle_by_cause_ns.clone(),
        requests: f.requests.clone(),
    }
}

/// Causes with time on either side, the largest change first.
fn cause_changes(
    base: &IdleByCause,
    b_alloc: u64,
    new: &IdleByCause,
    n_alloc: u64,
) -> Vec<CauseChange> {
    let mut v: Vec<CauseChange> = Cause::ALL
        .iter()
        .map(|&c| {
            let (b, n) = (base.get(c), new.get(c));
            CauseChange {
                cause: c,
                base_ns: b,
                new_ns: n,
                share: Share::of((b, b_alloc), (n, n_alloc)),
            }
        })
        .filter(|c| c.base_ns > 0 || c.new_ns > 0)
        .collect();
    v.sort_by(|a, b| {
        b.share
            .change_points
            .abs()
            .total_cmp(&a.share.change_points.abs())
    });
    v
}

/// Which input of `new` each input of `base` is compared with: the one of
/// the same rank where every input on both sides says its rank, once (a
/// directory of per-rank traces lists them in whatever order their file
/// names give); else the one in the same place. With each, the rank it
/// was matched by.
fn partners(base: &Side, new: &Side) -> Vec<(Option<usize>, Option<u32>)> {
    let ranks = |s: &Side| -> Option<Vec<u32>> {
        let r: Vec<u32> = s
            .inputs
            .iter()
            .map(|l| l.analysis.facts.rank.map(|k| k.rank))
            .collect::<Option<_>>()?;
        let unique: std::collections::HashSet<&u32> = r.iter().collect();
        (unique.len() == r.len()).then_some(r)
    };
    match (ranks(base), ranks(new)) {
        (Some(b), Some(n)) if base.inputs.len() > 1 || new.inputs.len() > 1 => b
            .iter()
            .map(|r| (n.iter().position(|x| x == r), Some(*r)))
            .collect(),
        _ => (0..base.inputs.len())
            .map(|i| ((i < new.inputs.len()).then_some(i), None))
            .collect(),
    }
}

/// Per GPU, matched by input ([`partners`]) and device id.
fn gpu_diffs(base: &Built, new: &Built) -> Vec<GpuDiff> {
    let several = base.side.inputs.len() > 1 || new.side.inputs.len() > 1;
    let partner = partners(base.side, new.side);
    let key = |b: &Built, i: usize, rank: Option<u32>, id: u32| match rank {
        Some(r) => format!("rank {r} · GPU {id}"),
        None if several => format!("{} · GPU {id}", b.side.inputs[i].label),
        None => format!("GPU {id}"),
    };
    let mut out: Vec<GpuDiff> = Vec::new();
    let mut matched = std::collections::HashSet::new();
    for g in &base.gpus {
        let (j, rank) = partner[g.input];
        let other = new.gpus.iter().find(|h| Some(h.input) == j && h.id == g.id);
        if let Some(h) = other {
            matched.insert((h.input, h.id));
        }
        let other = other.map(|h| &h.figures);
        out.push(GpuDiff {
            key: key(base, g.input, rank, g.id),
            name: g.name.to_string(),
            base: Some(gpu_figures(&g.figures)),
            new: other.map(gpu_figures),
            causes: cause_changes(
                &g.figures.idle_by_cause_ns,
                g.figures.allocated_ns,
                &other
                    .map(|h| h.idle_by_cause_ns.clone())
                    .unwrap_or_default(),
                other.map_or(0, |h| h.allocated_ns),
            ),
        });
    }
    for h in &new.gpus {
        if matched.contains(&(h.input, h.id)) {
            continue;
        }
        let rank = new.side.inputs[h.input]
            .analysis
            .facts
            .rank
            .map(|k| k.rank)
            .filter(|_| partner.iter().any(|p| p.1.is_some()));
        out.push(GpuDiff {
            key: key(new, h.input, rank, h.id),
            name: h.name.to_string(),
            base: None,
            new: Some(gpu_figures(&h.figures)),
            causes: cause_changes(
                &IdleByCause::default(),
                0,
                &h.figures.idle_by_cause_ns,
                h.figures.allocated_ns,
            ),
        });
    }
    out
}

/// Matched steps' times (ns) on each side, and how many matched.
fn step_samples(base: &[(u64, u64)], new: &[(u64, u64)]) -> (Vec<f64>, Vec<f64>, usize) {
    let numbers: std::collections::HashSet<u64> = base.iter().map(|s| s.0).collect();
    let common: std::collections::HashSet<u64> = new
        .iter()
        .map(|s| s.0)
        .filter(|n| numbers.contains(n))
        .collect();
    let take = |s: &[(u64, u64)], all: bool| -> Vec<f64> {
        s.iter()
            .filter(|x| all || common.contains(&x.0))
            .map(|x| x.1 as f64)
            .collect()
    };
    if common.len() >= 2 {
        (take(base, false), take(new, false), common.len())
    } else {
        (take(base, true), take(new, true), 0)
    }
}

/// Two sides compared.
pub fn build(base: &Side, new: &Side, opts: &DiffOptions) -> Compared {
    let (b, n) = (Built::new(base), Built::new(new));
    let (bt, nt) = (b.totals(), n.totals());
    let idle_share = Share::of((bt.2, bt.0), (nt.2, nt.0));
    let causes = cause_changes(&b.idle_by_cause(), bt.0, &n.idle_by_cause(), nt.0);
    let largest_change = causes
        .iter()
        .copied()
        .find(|c| c.share.change_points != 0.0);
    let mut notes = Vec::new();

    // The base's first input with steps, and the new side's input it is
    // matched with (the same rank); else the new side's first with steps.
    let base_steps = b.steps();
    let new_steps = base_steps
        .as_ref()
        .and_then(|(i, _)| partners(base, new)[*i].0)
        .and_then(|j| n.steps_of(j))
        .or_else(|| n.steps().map(|s| s.1));
    let steps = match (base_steps.map(|s| s.1), new_steps) {
        (Some(bs), Some(ns)) => {
            let (x, y, matched) = step_samples(&bs.1, &ns.1);
            let (sx, sy) = (Summary::of(&x), Summary::of(&y));
            Some((
                StepsDiff {
                    source: [bs.0, ns.0],
                    matched,
                    base: sx.into(),
                    new: sy.into(),
                    change_pct: if sx.mean > 0.0 {
                        (sy.mean / sx.mean - 1.0) * 100.0
                    } else {
                        0.0
                    },
                },
                x,
                y,
            ))
        }
        (bs, ns) => {
            if bs.is_some() != ns.is_some() {
                notes.push(format!(
                    "training steps are marked in {} only: the runs are compared second by second",
                    if bs.is_some() { "BASE" } else { "NEW" }
                ));
            }
            None
        }
    };

    let (mut verdict, rates, min) = match &steps {
        Some((_, x, y)) if x.len() >= 2 && y.len() >= 2 => {
            let v = judge(
                Basis::Steps,
                "step_time_ns",
                (&Summary::of(x), &Summary::of(y)),
                (&Summary::of(&blocks(x)), &Summary::of(&blocks(y))),
                opts.min_change_pct,
                true,
                largest_change,
            );
            (v, None, opts.min_change_pct)
        }
        _ => {
            let span = b.busy_span().min(n.busy_span());
            let width = if span >= 10_000_000_000 {
                1_000_000_000
            } else {
                (span / 10).max(1)
            };
            let (x, y) = (b.buckets(width), n.buckets(width));
            let (sx, sy) = (Summary::of(&x), Summary::of(&y));
            let rates = RatesDiff {
                bucket_ns: width,
                base: BucketStats {
                    count: sx.n,
                    mean_pct: sx.mean,
                    sd_pct: sx.sd,
                },
                new: BucketStats {
                    count: sy.n,
                    mean_pct: sy.mean,
                    sd_pct: sy.sd,
                },
            };
            let v = if sx.n >= 2 && sy.n >= 2 {
                judge(
                    Basis::Buckets,
                    "idle_share_pct",
                    (&sx, &sy),
                    (&sx, &sy),
                    MIN_IDLE_POINTS,
                    false,
                    largest_change,
                )
            } else {
                totals_verdict(&idle_share, largest_change)
            };
            (v, Some(rates), MIN_IDLE_POINTS)
        }
    };
    verdict.text = verdict_text(&verdict, &idle_share, min);

    let gate = opts.gate_points.map(|points| Gate {
        points,
        passed: idle_share.change_points <= points,
    });

    let (bs, ns) = (b.idle_stacks(), n.idle_stacks());
    let mut changes: Vec<StackChange> = bs
        .keys()
        .chain(ns.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|s| StackChange {
            frames: s.0.clone(),
            base_ns: bs.get(s).copied().unwrap_or(0),
            new_ns: ns.get(s).copied().unwrap_or(0),
        })
        .filter(|c| c.base_ns != c.new_ns)
        .collect();
    let delta = |c: &StackChange| c.new_ns as i128 - c.base_ns as i128;
    changes.sort_by_key(|c| std::cmp::Reverse(delta(c)));
    let grew = changes
        .iter()
        .filter(|c| delta(c) > 0)
        .take(TOP_STACKS)
        .cloned()
        .collect();
    let shrank = changes
        .iter()
        .rev()
        .filter(|c| delta(c) < 0)
        .take(TOP_STACKS)
        .cloned()
        .collect();

    // (`simulated` is what every renderer's SIMULATED GPU banner reads: not
    // also a note.)
    let diff = Diff {
        schema: SCHEMA,
        base: b.info(),
        new: n.info(),
        simulated: b.simulated() || n.simulated(),
        verdict,
        idle_share,
        gate,
        gpus: gpu_diffs(&b, &n),
        causes,
        steps: steps.map(|s| s.0),
        rates,
        recommendations: Recommendations {
            base: b.recommendations(),
            new: n.recommendations(),
        },
        idle_stacks: StackChanges { grew, shrank },
        notes,
    };
    Compared {
        diff,
        base_stacks: bs,
        new_stacks: ns,
    }
}

/// Consecutive steps averaged in blocks, a tenth of the run each (where
/// there are 20 or more): a pipeline's steps alternate long and short (a
/// batch waited for, then one ready), and such steps taken one by one make
/// a spread that hides any change; their blocks' means do not.
fn blocks(steps: &[f64]) -> Vec<f64> {
    if steps.len() < 20 {
        return steps.to_vec();
    }
    let size = steps.len() / 10;
    steps
        .chunks_exact(size)
        .map(|c| c.iter().sum::<f64>() / size as f64)
        .collect()
}

/// The verdict on a lower-is-better metric: `shown`, each side's samples'
/// summary (what the verdict says); `tested`, what Welch's test reads.
/// `relative`: the change is judged in percent of BASE (step time), else
/// in points (idle share); `min`: the smallest change called one.
fn judge(
    basis: Basis,
    metric: &'static str,
    shown: (&Summary, &Summary),
    tested: (&Summary, &Summary),
    min: f64,
    relative: bool,
    largest_change: Option<CauseChange>,
) -> Verdict {
    let (base, new) = shown;
    let c = stats::welch(tested.0, tested.1).expect("two or more samples a side");
    let scale = if relative && base.mean > 0.0 {
        100.0 / base.mean
    } else {
        1.0
    };
    let change = (new.mean - base.mean) * scale;
    let outcome = if c.p_value < P_CHANGED && change.abs() >= min {
        if change < 0.0 {
            Outcome::Improved
        } else {
            Outcome::Regressed
        }
    } else {
        Outcome::Unchanged
    };
    Verdict {
        outcome,
        basis,
        metric,
        base: base.mean,
        new: new.mean,
        change,
        p_value: Some(c.p_value),
        confidence: Some(1.0 - c.p_value),
        margin99: Some(c.margin99 * scale),
        samples: [base.n, new.n],
        largest_change,
        text: String::new(),
    }
}

fn totals_verdict(share: &Share, largest_change: Option<CauseChange>) -> Verdict {
    let change = share.change_points;
    let outcome = if change <= -MIN_IDLE_POINTS {
        Outcome::Improved
    } else if change >= MIN_IDLE_POINTS {
        Outcome::Regressed
    } else {
        Outcome::Unchanged
    };
    Verdict {
        outcome,
        basis: Basis::Totals,
        metric: "idle_share_pct",
        base: share.base_pct,
        new: share.new_pct,
        change,
        p_value: None,
        confidence: None,
        margin99: None,
        samples: [1, 1],
        largest_change,
        text: String::new(),
    }
}

pub fn p_text(p: f64) -> String {
    if p < 0.001 {
        "p < 0.001".into()
    } else {
        format!("p = {p:.3}")
    }
}

pub fn signed_pct(x: f64) -> String {
    format!("{}{:.1}%", if x >= 0.0 { "+" } else { "−" }, x.abs())
}

pub fn signed_points(x: f64) -> String {
    format!("{}{:.1} points", if x >= 0.0 { "+" } else { "−" }, x.abs())
}

/// The verdict in one paragraph. `min`: the smallest change called one.
fn verdict_text(v: &Verdict, share: &Share, min: f64) -> String {
    let head = match v.outcome {
        Outcome::Improved => "Improved",
        Outcome::Regressed => "Regressed",
        Outcome::Unchanged => "Unchanged",
    };
    // The change, its 99% margin, and what it was judged on.
    let spread = |change: String, unit: &str, what: &str| {
        format!(
            "{change} ±{:.1}{unit} at 99%; {} vs {} {what}, {}",
            v.margin99.unwrap_or(0.0),
            v.samples[0],
            v.samples[1],
            p_text(v.p_value.unwrap_or(1.0))
        )
    };
    let mut s = match v.basis {
        Basis::Steps => format!(
            "{head}: step time {} → {} ({})",
            crate::units::duration(v.base.round() as u64),
            crate::units::duration(v.new.round() as u64),
            spread(signed_pct(v.change), "%", "steps")
        ),
        Basis::Buckets => format!(
            "{head}: the GPUs idled {:.1}% → {:.1}% of their busy span ({})",
            v.base,
            v.new,
            spread(signed_points(v.change), "", "stretches")
        ),
        Basis::Totals => format!(
            "{head}: GPU idle {:.1}% → {:.1}% of allocated time ({}; too short to judge the spread)",
            v.base,
            v.new,
            signed_points(v.change)
        ),
    };
    if v.outcome == Outcome::Unchanged && v.basis != Basis::Totals {
        let p = v.p_value.unwrap_or(1.0);
        s += &if p >= P_CHANGED {
            ": within the run's own spread".to_string()
        } else {
            format!(
                ": smaller than the {min:.0}{} called a change",
                if v.basis == Basis::Steps {
                    "%"
                } else {
                    " points"
                }
            )
        };
    }
    s += ".";
    if v.basis != Basis::Totals {
        s += &format!(
            " GPU idle {:.1}% → {:.1}% of allocated time ({})",
            share.base_pct,
            share.new_pct,
            signed_points(share.change_points)
        );
        s += if v.largest_change.is_some() { ";" } else { "." };
    }
    if let Some(c) = v.largest_change {
        s += &format!(
            " the largest change: {} {} ({:.1}% → {:.1}%).",
            c.cause.name(),
            signed_points(c.share.change_points),
            c.share.base_pct,
            c.share.new_pct
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share whose 3-decimal JSON value lies on the other side of a
    /// 1-decimal rounding than the share behind it: every format shows the
    /// JSON's.
    #[test]
    fn a_share_is_one_number_in_every_format() {
        let s = Share::of((697_496, 1_000_000), (0, 1));
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        let from_json = json["base_pct"].as_f64().unwrap();
        assert_eq!(from_json, 69.75);
        assert_eq!(format!("{:.1}", s.base_pct), format!("{from_json:.1}"));
        assert_eq!(s.change_points, -69.75);
    }
}
