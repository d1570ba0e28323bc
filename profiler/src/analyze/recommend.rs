//! From the idle breakdown to advice: one recommendation per cause that cost
//! real GPU time, with the evidence that points at it, the most fixing it
//! could buy (`wall / (wall - idle removed)`), what it would buy once what
//! it hid comes to light (the run replayed without it: `replay`), and a
//! verdict on whether more GPUs would help.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::analyze::attribute::{ApiRole, Cause, Tid};
use crate::analyze::cause::IdleByCause;
use crate::analyze::code::{Region, Rules};
use crate::analyze::diagnose::{Diagnosis, GpuDiagnosis};
use crate::analyze::replay;
use crate::analyze::stages::InputStages;
use crate::analyze::Names;
use crate::timeline::spooled::{GpuSpools, Plan as SpoolPlan};
use crate::timeline::{OffKind, Timeline};
use crate::units;

/// A cause is worth a recommendation from this share of allocated time.
const MIN_SHARE: f64 = 0.03;
/// Below this much removable idle, the GPUs are doing useful work.
const BUSY_ENOUGH: f64 = 0.10;
const TOP: usize = 3;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Recommendation {
    pub cause: Topic,
    pub title: String,
    pub evidence: Vec<String>,
    /// The upper bound: this cause's idle time subtracted from the wall.
    pub est_speedup: f64,
    /// The run replayed with this cause's stalls taken out (null where
    /// the replay has nothing to go on: no feeder, or busy time).
    pub what_if: Option<WhatIf>,
}

/// What the replay predicts a fix would give.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WhatIf {
    pub wall_ns: u64,
    /// The recorded wall over `wall_ns`.
    pub speedup: f64,
    /// The cause that leads once this one is fixed (null: none worth a
    /// recommendation).
    pub next_cause: Option<Cause>,
    /// For input causes, the other way out: more loader workers (their
    /// computing spread over the CPUs they got, those that sat idle and a
    /// share of those their scheduling group's other tasks held).
    pub more_workers: Vec<MoreWorkers>,
    /// What the replayed run's GPU still idles for, by cause (per GPU):
    /// start-up and tear-down as the recording had them, and what the fix
    /// leaves.
    pub idle_by_cause_ns: IdleByCause,
    /// On a busy machine, the other end of the range: the fix with the
    /// feeder on a CPU of its own ([`replay::Plan::own_cpu`]). Only where
    /// the feeder waited for CPUs others held (see [`contended`]) and the
    /// fix stops it sleeping somewhere.
    pub given_a_cpu: Option<GivenACpu>,
}

/// A [`WhatIf`] with the feeder on a CPU of its own.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GivenACpu {
    pub wall_ns: u64,
    pub speedup: f64,
    pub next_cause: Option<Cause>,
    pub idle_by_cause_ns: IdleByCause,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MoreWorkers {
    pub add: u32,
    /// Workers in all, as the recording counted them plus `add`.
    pub workers: u32,
    pub wall_ns: u64,
    pub speedup: f64,
    /// As [`WhatIf::idle_by_cause_ns`], with these workers.
    pub idle_by_cause_ns: IdleByCause,
    /// Where the prediction counts CPUs won from the job's scheduling
    /// group's other tasks, the other end of the range: none won
    /// ([`replay::Plan::group_keeps_cpus`]).
    pub if_group_keeps_cpus: Option<Predicted>,
}

/// A prediction's wall time, as [`MoreWorkers`] gives it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Predicted {
    pub wall_ns: u64,
    pub speedup: f64,
    pub idle_by_cause_ns: IdleByCause,
}

impl Recommendation {
    /// What it would buy, as every format says it: the replayed speedup
    /// where there is one, else the upper bound.
    pub fn gain(&self) -> String {
        match &self.what_if {
            Some(w) => format!(
                "{:.2}x faster, replayed (its idle time alone: {:.2}x)",
                w.speedup, self.est_speedup
            ),
            None => format!("up to {:.2}x faster", self.est_speedup),
        }
    }

    /// [`Self::gain`] in a few words, for the verdict.
    fn gain_short(&self) -> String {
        match &self.what_if {
            Some(w) => format!("{:.2}x faster by replay", w.speedup),
            None => format!("up to {:.2}x faster", self.est_speedup),
        }
    }

    /// Before → after, and what leads then; `before_ns`: the recorded wall,
    /// on `gpus` GPUs.
    pub fn what_if_lines(&self, before_ns: u64, gpus: usize) -> Vec<String> {
        let Some(w) = &self.what_if else {
            return Vec::new();
        };
        let then = match w.next_cause {
            Some(c) => format!("then {} leads", c.name()),
            None => "then no other cause stands out".into(),
        };
        // The same work in less time: GPU time given back for other work.
        let saved = 1.0 - w.wall_ns as f64 / before_ns.max(1) as f64;
        let mut out = vec![format!(
            "replayed without its stalls: {} → {} ({:.2}x, {:.1} GPU-hours a day given back); {then}",
            units::duration(before_ns),
            units::duration(w.wall_ns),
            w.speedup,
            (saved * 24.0 * gpus as f64).max(0.0)
        )];
        // (Said where it differs: a fix that leaves the GPU the pace gives
        // the same either way.)
        if let Some(g) = w
            .given_a_cpu
            .as_ref()
            .filter(|g| g.wall_ns * 100 < w.wall_ns * 99)
        {
            out.push(format!(
                "on this busy machine, if the scheduler then gives the feeder a CPU of its own (it sleeps less; whether it still shares one is the scheduler's placement): {} → {} ({:.2}x); then {}",
                units::duration(before_ns),
                units::duration(g.wall_ns),
                g.speedup,
                g.next_cause
                    .map_or("no other cause stands out".into(), |c| format!("{} leads", c.name()))
            ));
        }
        if !w.more_workers.is_empty() {
            let options: Vec<String> = w
                .more_workers
                .iter()
                .map(|m| match &m.if_group_keeps_cpus {
                    Some(none) => format!(
                        "{} workers {:.2}-{:.2}x",
                        m.workers, none.speedup, m.speedup
                    ),
                    None => format!("{} workers {:.2}x", m.workers, m.speedup),
                })
                .collect();
            let range = match w.more_workers.iter().any(|m| m.if_group_keeps_cpus.is_some()) {
                true => "; a range where they would win CPUs from busy tasks of the job's own group, from none to a worker's share: how much the kernel gives them is not in one recording",
                false => "",
            };
            out.push(format!(
                "or more loader workers instead (computing on the CPUs the loaders got, those that sat idle and a share of those the job's scheduling group's other tasks held; storage at its recorded pace{range}): {}",
                options.join(" · ")
            ));
        }
        out
    }
}

/// When more of the idle time is unknown than any cause, that comes first:
/// how much, which thread the gaps' work came from, what the recording
/// lacks, and how to record it so that it is known.
fn unknown_first(
    ev: &Evidence,
    idle: &BTreeMap<Cause, u64>,
    by: &HashMap<Tid, u64>,
    n_gpus: u64,
    wall: u64,
) -> Option<String> {
    let unknown = idle.get(&Cause::Unattributed).copied().unwrap_or(0) / n_gpus;
    let known = idle
        .iter()
        .filter(|(c, _)| c.removable())
        .map(|(_, ns)| ns / n_gpus)
        .max()
        .unwrap_or(0);
    if unknown <= known || (unknown as f64) < MIN_SHARE * wall as f64 {
        return None;
    }
    let total: u64 = idle
        .iter()
        .filter(|(c, _)| !matches!(c, Cause::Startup | Cause::Teardown))
        .map(|(_, ns)| ns / n_gpus)
        .sum();
    let head = format!(
        "Most of the idle time is not known: {} ({} of the GPUs' idle time outside start-up and tear-down) could not be attributed",
        units::duration(unknown),
        units::percent(unknown, total)
    );
    let lost = !ev.d.lossy_windows.is_empty();
    let why = match top_threads(by, 1).first() {
        Some(&t) if !ev.tl.threads.contains_key(&t) => {
            let calls = ev.tl.gpu.totals.calls_of(t);
            if ev.tl.gpu.host_ops.contains_key(&t) {
                format!(
                    "thread {} issued the work that ended those gaps, and its ops in the trace do not cover them",
                    ev.who(t)
                )
            } else if calls > 0 {
                format!(
                    "thread {} issued the work that ended those gaps, and the trace shows it only by its {calls} CUDA calls, with no CPU ops: its silences longer than {} between calls say nothing of what it did",
                    ev.who(t),
                    units::duration(crate::analyze::attribute::CALL_SPACING_NS)
                )
            } else {
                format!("thread {} issued the work that ended those gaps, and the recording has nothing of it", ev.who(t))
            }
        }
        Some(&t) => format!(
            "thread {} issued the work that ended those gaps, and its states there were not recorded",
            ev.who(t)
        ),
        None if lost => "events were lost where they fell".to_string(),
        None => "the work that ended those gaps has no launching call in the recording".to_string(),
    };
    let how = if ev.tl.threads.is_empty() {
        "To know it, record the job with `gapscope run` (or `gapscope attach --pid PID` while it runs, torch.profiler can stay on): the scheduler's view of every thread gives each of those gaps its cause."
    } else if lost {
        "To know it, record again with a larger --buffer-mb (and fewer --syscalls)."
    } else {
        "To know it, record that thread too (attach to its process)."
    };
    Some(format!("{head}: {why}. {how}"))
}

/// Loader workers a what-if adds.
const MORE_WORKERS: [u32; 3] = [1, 2, 4];

fn rounded(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Whether a cause's what-if also asks what more loader workers would do.
fn asks_more_workers(cause: Cause, workers: f64) -> bool {
    workers > 0.0
        && matches!(
            cause,
            Cause::InputIo | Cause::InputCpu | Cause::InputNetwork
        )
}

/// Whether fixing `c` stops the feeder sleeping somewhere (waiting for the
/// GPU, its loaders, I/O), not only working less.
fn stops_sleeps(c: Cause) -> bool {
    !matches!(
        c,
        Cause::CpuHost | Cause::CpuLaunch | Cause::CpuContention | Cause::Startup | Cause::Teardown
    )
}

/// The plans [`what_if`] replays for these causes; `contended`: the feeder
/// shared busy CPUs ([`contended`]).
fn what_if_plans(causes: &[Cause], job: &replay::Job, contended: bool) -> Vec<replay::Plan> {
    let workers = job.workers();
    let mut plans: Vec<replay::Plan> = causes.iter().map(|&c| replay::Plan::fix(c)).collect();
    if contended {
        plans.extend(
            causes
                .iter()
                .filter(|&&c| stops_sleeps(c))
                .map(|&c| replay::Plan::fix_on_own_cpu(c)),
        );
    }
    if causes.iter().any(|&c| asks_more_workers(c, workers)) {
        for &add in &MORE_WORKERS {
            let more = replay::Plan {
                add_workers: add,
                ..Default::default()
            };
            plans.push(more);
            if job.wins_from_group(add) {
                plans.push(replay::Plan {
                    group_keeps_cpus: true,
                    ..more
                });
            }
        }
    }
    plans
}

/// The cause that leads once `cause` is fixed as `p` predicts (None: none
/// worth a recommendation).
fn next_cause(p: &replay::Prediction, cause: Cause) -> Option<Cause> {
    p.idle
        .iter()
        .filter(|(c, ns)| {
            c.removable() && **c != cause && **ns as f64 >= MIN_SHARE * p.replayed_wall_ns as f64
        })
        .max_by_key(|(c, ns)| (**ns, std::cmp::Reverse(**c)))
        .map(|(c, _)| *c)
}

/// `plan`'s prediction as a recommendation states it; `contended` as for
/// [`what_if_plans`].
fn what_if(job: &replay::Job, cause: Cause, wall: u64, contended: bool) -> Option<WhatIf> {
    if job.is_empty() {
        return None;
    }
    let p = job.predict(&replay::Plan::fix(cause));
    let next = next_cause(&p, cause);
    let given_a_cpu = (contended && stops_sleeps(cause)).then(|| {
        let g = job.predict(&replay::Plan::fix_on_own_cpu(cause));
        GivenACpu {
            wall_ns: g.wall_ns,
            speedup: rounded(wall as f64 / g.wall_ns.max(1) as f64),
            next_cause: next_cause(&g, cause),
            idle_by_cause_ns: g.idle_by_cause(),
        }
    });
    let workers = job.workers();
    let more_workers = if asks_more_workers(cause, workers) {
        MORE_WORKERS
            .iter()
            .map(|&add| {
                let more = replay::Plan {
                    add_workers: add,
                    ..Default::default()
                };
                let outcome = |plan: &replay::Plan| {
                    let w = job.predict(plan);
                    Predicted {
                        wall_ns: w.wall_ns,
                        speedup: rounded(wall as f64 / w.wall_ns.max(1) as f64),
                        idle_by_cause_ns: w.idle_by_cause(),
                    }
                };
                let w = outcome(&more);
                MoreWorkers {
                    add,
                    workers: workers.round() as u32 + add,
                    wall_ns: w.wall_ns,
                    speedup: w.speedup,
                    idle_by_cause_ns: w.idle_by_cause_ns,
                    if_group_keeps_cpus: job.wins_from_group(add).then(|| {
                        outcome(&replay::Plan {
                            group_keeps_cpus: true,
                            ..more
                        })
                    }),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    Some(WhatIf {
        wall_ns: p.wall_ns,
        speedup: rounded(wall as f64 / p.wall_ns.max(1) as f64),
        next_cause: next,
        more_workers,
        idle_by_cause_ns: p.idle_by_cause(),
        given_a_cpu,
    })
}

/// What a recommendation is about: a cause of idle time, or busy time that
/// was only communication. Written as its name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Topic {
    Idle(Cause),
    Communication,
}

impl Topic {
    pub fn name(self) -> &'static str {
        match self {
            Topic::Idle(c) => c.name(),
            Topic::Communication => "communication",
        }
    }

    pub fn color(self) -> &'static str {
        match self {
            Topic::Idle(c) => c.color(),
            // Busy, but not computing: a light green beside busy's.
            Topic::Communication => "#8fd19e",
        }
    }
}

impl std::fmt::Display for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Topic {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

pub struct Advice {
    pub recommendations: Vec<Recommendation>,
    pub verdict: Option<String>,
    /// What makes the what-ifs less sure: the replay could not reproduce
    /// the recording closely, or the feeder shared busy CPUs.
    pub notes: Vec<String>,
}

/// A feeder that waited for CPUs others held this share of the time it
/// wanted one ran on a busy machine.
const CONTENDED: f64 = 0.10;

/// The unchanged replay this far from the record makes its predictions
/// worth a word of caution.
const REPLAY_FIDELITY: f64 = 0.10;

/// `nr_cpus`: the recorded machine's CPUs (0 when not recorded);
/// `collector_cpu_ns`: what recording them took of them.
/// What the advice needs beyond the timeline and its diagnosis.
pub struct Context<'a> {
    pub nr_cpus: u32,
    /// gapscope's own CPU time while recording (the replay leaves it out).
    pub collector_cpu_ns: u64,
    /// The input pipeline by stage: an input recommendation names the
    /// slowest.
    pub stages: Option<&'a InputStages>,
    /// The code rules: a trace's ops in an input region are loading.
    pub code: &'a Rules,
    /// Where a long recording's GPU work and calls are read back from,
    /// when the timeline does not hold them (the what-if replays read
    /// them).
    pub spooled: Option<(&'a GpuSpools, &'a SpoolPlan)>,
}

pub fn build(cx: Context, tl: &Timeline, d: &Diagnosis, names: &Names) -> Advice {
    let Context {
        nr_cpus,
        collector_cpu_ns,
        stages,
        code,
        spooled,
    } = cx;
    if d.gpus.is_empty() {
        return Advice {
            recommendations: Vec::new(),
            verdict: None,
            notes: Vec::new(),
        };
    }
    // Causes summed over GPUs; the threads behind each.
    let mut idle: BTreeMap<Cause, u64> = BTreeMap::new();
    let mut threads: HashMap<Cause, HashMap<Tid, u64>> = HashMap::new();
    let mut allocated = 0u64;
    for g in &d.gpus {
        allocated = allocated.max(tl.end - tl.start);
        for (c, ns) in &g.attribution.by_cause {
            *idle.entry(*c).or_default() += ns;
        }
        for (&(c, t), ns) in &g.attribution.by_thread {
            *threads.entry(c).or_default().entry(t).or_default() += ns;
        }
    }
    let n_gpus = d.gpus.len().max(1) as u64;
    let unattributed_by = threads.remove(&Cause::Unattributed).unwrap_or_default();
    // Never zero: a recording can be shorter than a clock tick.
    let wall = allocated.max(1);
    let ev = Evidence {
        nr_cpus,
        names,
        tl,
        d,
        stages,
        code,
    };
    // The plans the what-ifs below ask about, replayed at once.
    let advised: Vec<Cause> = idle
        .iter()
        .filter(|&(c, &ns)| c.removable() && (ns / n_gpus) as f64 >= MIN_SHARE * wall as f64)
        .map(|(&c, _)| c)
        .collect();
    let contended = contended(tl, d);
    let job = replay::Job::new(tl, d, spooled, nr_cpus, collector_cpu_ns, |job| {
        what_if_plans(&advised, job, contended.is_some())
    });
    // Each with the time it would give back, to order them: as replayed
    // where it could be (a cause that hides another gives back less than
    // its idle time), else its idle time. The speedup shown is rounded, and
    // two causes a few µs apart would tie on it.
    let mut recs: Vec<(u64, Recommendation)> = Vec::new();
    for (&cause, &ns) in &idle {
        let per_gpu = ns / n_gpus;
        if !advised.contains(&cause) {
            continue;
        }
        let involved = threads.remove(&cause).unwrap_or_default();
        let (title, mut evidence) = advice(cause, &ev, &involved);
        evidence.insert(
            0,
            format!(
                "{} of GPU idle time ({} of the {} each GPU was held)",
                units::duration(per_gpu),
                units::percent(per_gpu, wall),
                units::duration(wall)
            ),
        );
        let est_speedup = wall as f64 / (wall - per_gpu.min(wall - 1)) as f64;
        let what_if = what_if(&job, cause, wall, contended.is_some());
        let gives_back = what_if
            .as_ref()
            .map_or(per_gpu, |w| wall.saturating_sub(w.wall_ns));
        recs.push((
            gives_back,
            Recommendation {
                cause: Topic::Idle(cause),
                title,
                evidence,
                est_speedup: rounded(est_speedup),
                what_if,
            },
        ));
    }
    // Busy time that was only communication: not idle, but no work either.
    let exposed: u64 = d
        .gpus
        .iter()
        .map(|g| g.gpu.busy_by_kind.communication)
        .sum::<u64>()
        / n_gpus;
    if exposed as f64 >= MIN_SHARE * wall as f64 {
        recs.push((exposed, communication_advice(tl, d, exposed, wall)));
    }
    recs.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1.cause.name().cmp(b.1.cause.name()))
    });
    let recs: Vec<Recommendation> = recs.into_iter().map(|(_, r)| r).collect();

    let removable: u64 = idle
        .iter()
        .filter(|(c, _)| c.removable())
        .map(|(_, ns)| ns)
        .sum::<u64>()
        / n_gpus;
    let busy: u64 = d.gpus.iter().map(|g| g.gpu.busy_ns()).sum::<u64>() / n_gpus;
    let top_idle = recs.iter().find_map(|r| match r.cause {
        Topic::Idle(c) => Some((c, r)),
        Topic::Communication => None,
    });
    // Exposed collectives are busy time, so they are said beside the idle
    // verdict rather than instead of it.
    let also_communication = recs
        .iter()
        .find(|r| r.cause == Topic::Communication)
        .map(|r| {
            format!(
                " Also, collectives with no compute beside them took {} of the held time (hiding them: up to {:.2}x faster).",
                units::percent(exposed, wall),
                r.est_speedup
            )
        })
        .unwrap_or_default();
    let unknown = unknown_first(&ev, &idle, &unattributed_by, n_gpus, wall);
    // Waiting for requests is the load, not a stall: where it is most of
    // the idle, the GPU has capacity to spare at this load.
    let demand = idle.get(&Cause::Demand).map_or(0, |n| n / n_gpus);
    let verdict = match top_idle {
        _ if demand >= removable && demand as f64 >= BUSY_ENOUGH * wall as f64 => format!(
            "More GPUs would not help: the GPUs waited for requests {} of the time they were held (busy {}): they have spare capacity at this load — batch requests, share them (MPS, MIG, co-location) or scale down.{}",
            units::percent(demand, wall),
            units::percent(busy, wall),
            match top_idle {
                Some((cause, top)) => format!(
                    " Of the rest, {} costs most (fixing it: {}).",
                    cause.name(),
                    top.gain_short()
                ),
                None => String::new(),
            }
        ),
        Some((cause, top)) if removable as f64 >= BUSY_ENOUGH * wall as f64 => format!(
            "More GPUs would not help until {} is fixed: the GPUs sat idle {} of the time they were held, {} of it because of {} (fixing it: {}{}).",
            cause.name(),
            units::percent(wall.saturating_sub(busy), wall),
            units::percent(
                idle.get(&cause).map_or(0, |n| n / n_gpus),
                wall.saturating_sub(busy)
            ),
            cause.name(),
            top.gain_short(),
            match top.what_if.as_ref().and_then(|w| w.next_cause) {
                Some(next) => format!("; then {} leads", next.name()),
                None => String::new(),
            }
        ) + &also_communication,
        _ if exposed as f64 >= BUSY_ENOUGH * wall as f64 => format!(
            "More GPUs would add to the problem: the GPUs were busy {} of the time they were held, but {} of it ran only collectives with no compute beside them; hide communication behind compute, or find the slow rank, before scaling out.",
            units::percent(busy, wall),
            units::duration(exposed)
        ),
        // What is known is small beside what is not: no call to scale.
        _ if unknown.is_some() => format!(
            "no cause is worth fixing (busy {} of the time they were held; {} idle that a fix could remove).",
            units::percent(busy, wall),
            units::percent(removable, wall)
        ),
        // Nothing removable, or spread over causes too small to name.
        _ => format!(
            "The GPUs are doing useful work (busy {} of the time they were held; {} idle that a fix could remove): scale out.",
            units::percent(busy, wall),
            units::percent(removable, wall)
        ),
    };
    let fidelity = job.fidelity();
    let mut notes: Vec<String> = (!job.is_empty() && (fidelity - 1.0).abs() > REPLAY_FIDELITY)
        .then(|| {
            format!(
                "what-if replays: the run replayed unchanged takes {:.0}% of its recorded wall time; what the replay does not model is assumed to stay as it was, and the predictions are less sure",
                fidelity * 100.0
            )
        })
        .into_iter()
        .collect();
    notes.extend(contended.and_then(|c| contended_note(c, &recs)));
    Advice {
        notes,
        recommendations: recs,
        verdict: Some(match unknown {
            Some(first) => format!("{first} Of what is known: {verdict}"),
            None => verdict,
        }),
    }
}

/// The feeder that waited for CPUs other processes held the largest share
/// of the time it wanted one, where that share is [`CONTENDED`] or more:
/// (its thread, the time it waited, the time it wanted a CPU).
fn contended(tl: &Timeline, d: &Diagnosis) -> Option<(Tid, u64, u64)> {
    d.gpus
        .iter()
        .filter_map(|g| {
            let f = g.feeder.as_ref()?;
            let waited = f.account.contended_ns();
            let wanted = waited + f.cpu_within(tl.start, tl.end);
            Some((f.tid, waited, wanted))
        })
        .max_by(|a, b| {
            (a.1 as f64 / a.2.max(1) as f64).total_cmp(&(b.1 as f64 / b.2.max(1) as f64))
        })
        .filter(|&(_, waited, wanted)| wanted > 0 && waited as f64 >= CONTENDED * wanted as f64)
}

/// Said where a feeder waited long for CPUs others held and a fix would
/// stop it sleeping (a synchronize, a wait for input or for a copy taken
/// out): the replay keeps the share of the CPUs it had, but how a busy
/// machine's scheduler shares its CPUs depends on how often a thread
/// sleeps. Beside two busy loops on two CPUs a trainer that slept in a
/// synchronize each step was woken beside one of them and got half a CPU
/// in every recording; the same trainer without the synchronize is one of
/// three tasks that never sleep on two CPUs, and the kernel leaves one of
/// the three alone on a CPU (moving one would only move the imbalance):
/// from run to run the trainer was that one, shared with a loop, or in
/// between (1.26 to 2.64 s bare, the same 1.1 s on a CPU each time; the
/// kernel's own record showed the loop beside it with 1.1 s and the other
/// with 2.0 s in the slow runs). So the what-ifs give both ends.
fn contended_note(
    (tid, waited, wanted): (Tid, u64, u64),
    recs: &[Recommendation],
) -> Option<String> {
    let fixes: Vec<&str> = recs
        .iter()
        .filter_map(|r| match r.cause {
            Topic::Idle(c) if stops_sleeps(c) && r.what_if.is_some() => Some(c.name()),
            _ => None,
        })
        .collect();
    (!fixes.is_empty()).then(|| {
        format!(
            "what-if replays on a busy machine: the feeder (thread {}/{}) waited for CPUs other processes held {} of the time it wanted one; the predictions keep that share, but without its waits ({}) it would sleep less, and a busy machine's scheduler may then leave it a CPU of its own or keep it sharing one — each of those what-ifs also says what the fix gives on a CPU of its own, and the fixed run falls between the two; measure it on a quieter machine",
            tid.0,
            tid.1,
            units::percent(waited, wanted),
            fixes.join(", ")
        )
    })
}

/// Why a rank the others waited for came late: its GPU's largest own
/// cause of idle (waiting for others aside), as an evidence clause.
fn late_because(h: &GpuDiagnosis) -> String {
    // Of its idle between its first and last work.
    let idle: u64 = h
        .attribution
        .by_cause
        .iter()
        .filter(|(c, _)| !matches!(c, Cause::Startup | Cause::Teardown))
        .map(|x| x.1)
        .sum();
    let own = h
        .attribution
        .by_cause
        .iter()
        .filter(|(c, _)| c.removable() && **c != Cause::Comm)
        .max_by_key(|x| (*x.1, std::cmp::Reverse(*x.0)));
    match own {
        Some((c, &n)) if n > 0 => format!(
            "; that rank's GPU {} idled most for {} ({} of its idle): it came late because of {}, and its fix comes first",
            h.gpu.device,
            c.name(),
            units::percent(n, idle),
            c.name()
        ),
        _ => String::new(),
    }
}

/// Collectives the GPUs waited in with nothing else running: the overlap of
/// communication with compute is what to fix, or the slowest rank.
fn communication_advice(tl: &Timeline, d: &Diagnosis, exposed: u64, wall: u64) -> Recommendation {
    let mut by_name: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for d in tl.gpu.totals.devices.values() {
        for (name, &(count, ns)) in &d.communication {
            let e = by_name.entry(name).or_default();
            e.0 += count;
            e.1 += ns;
        }
    }
    let mut top: Vec<(&str, (u64, u64))> = by_name.into_iter().collect();
    top.sort_by_key(|(name, (_, ns))| (std::cmp::Reverse(*ns), *name));
    let mut evidence = vec![format!(
        "{} of GPU time ran only communication kernels ({} of the {} each GPU was held), waiting on other ranks included",
        units::duration(exposed),
        units::percent(exposed, wall),
        units::duration(wall)
    )];
    for (name, (count, ns)) in top.into_iter().take(TOP) {
        let short: String = name.chars().take(80).collect();
        evidence.push(format!("{short} ×{count} ({})", units::duration(ns)));
    }
    // Where the GPUs that meet are in the recording, how much of that was
    // waiting for the last to arrive, and who arrived last (waited least).
    let meeting: Vec<&GpuDiagnosis> = d
        .gpus
        .iter()
        .filter(|g| g.gpu.busy_by_kind.communication > 0)
        .collect();
    let wait_of = |g: &GpuDiagnosis| g.gpu.busy_by_kind.communication_waiting;
    let last = meeting.iter().copied().min_by_key(|g| wait_of(g));
    if let Some(last) =
        last.filter(|_| meeting.len() >= 2 && meeting.iter().any(|g| wait_of(g) > 0))
    {
        evidence.push(format!(
            "waiting for the other GPUs to reach the collective: {}; GPU {} waited least — the others waited for it{}",
            meeting
                .iter()
                .map(|g| format!("GPU {} {}", g.gpu.device, units::duration(wait_of(g))))
                .collect::<Vec<_>>()
                .join(", "),
            last.gpu.device,
            late_because(last)
        ));
    }
    let est_speedup = wall as f64 / (wall - exposed.min(wall - 1)) as f64;
    Recommendation {
        cause: Topic::Communication,
        title: "Communication not hidden behind compute: the GPU ran only collectives (NCCL), which includes waiting for the slowest rank. Overlap them with compute (DDP: bucket_cap_mb, gradient_as_bucket_view; FSDP: forward and backward prefetch), and compare ranks for a straggler (`gapscope report` over every rank's trace lines them up).".into(),
        evidence,
        est_speedup: rounded(est_speedup),
        what_if: None,
    }
}

struct Evidence<'a> {
    nr_cpus: u32,
    names: &'a Names,
    tl: &'a Timeline,
    d: &'a Diagnosis,
    stages: Option<&'a InputStages>,
    code: &'a Rules,
}

fn top_threads(involved: &HashMap<Tid, u64>, n: usize) -> Vec<Tid> {
    let mut v: Vec<(&Tid, &u64)> = involved.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.into_iter().take(n).map(|(t, _)| *t).collect()
}

impl Evidence<'_> {
    /// Time the threads in `set` spent in ops nested inside an input
    /// region's op, the DataLoader's above all (a trace's record of
    /// loading inline), and the ops that took most of it.
    fn ops_inside_the_dataloader(&self, set: &HashSet<Tid>) -> (u64, Vec<String>) {
        let mut by: HashMap<&str, u64> = HashMap::new();
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (tid, ops) in &self.tl.gpu.host_ops {
            if !set.contains(tid) {
                continue;
            }
            let loading = |name: &str| self.code.op(name).is_some_and(Region::is_input);
            let loaders: Vec<(u64, u64)> = ops
                .iter()
                .filter(|o| loading(&o.name))
                .map(|o| (o.start, o.end))
                .collect();
            for o in ops.iter().filter(|o| !loading(&o.name)) {
                if loaders.iter().any(|&(s, e)| s <= o.start && o.end <= e) {
                    *by.entry(&o.name).or_default() += o.end - o.start;
                    spans.push((o.start, o.end));
                }
            }
        }
        // Nested ops count once: a child's time is in its parent's.
        let total = crate::intervals::total(&crate::intervals::union(spans));
        let mut top: Vec<(&str, u64)> = by.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let ops = top.iter().take(3).map(|(n, _)| n.to_string()).collect();
        (total, ops)
    }

    /// TCP retransmissions on the job's connections (only the recorded
    /// threads' sockets are watched), either end: where a wait on the
    /// network was the network losing segments, not the peer being slow.
    fn retransmits(&self) -> Option<String> {
        let mut by: BTreeMap<crate::session::Peer, u64> = BTreeMap::new();
        for r in &self.tl.retransmits {
            *by.entry(r.peer).or_default() += 1;
        }
        let n: u64 = by.values().sum();
        if n == 0 {
            return None;
        }
        let mut peers: Vec<(crate::session::Peer, u64)> = by.into_iter().collect();
        peers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let top: Vec<String> = peers
            .iter()
            .take(3)
            .map(|(p, k)| format!("{p} ×{k}"))
            .collect();
        Some(format!(
            "{n} TCP retransmissions on the job's connections (to {}): segments the network lost and TCP sent again, each after a wait for the loss to show — part of the wait was the network, not the peer",
            top.join(", ")
        ))
    }

    /// For each GPU whose feeder waited in collectives for another rank of
    /// the job (the process its wakeups led to), that rank and what its own
    /// GPU idled for: the straggler's cause, whose fix comes first.
    fn stragglers(&self) -> Vec<String> {
        let mut out = Vec::new();
        let most = |g: &GpuDiagnosis| {
            g.attribution
                .waited_for
                .iter()
                .max_by_key(|x| (*x.1, *x.0))
                .map(|(&p, &n)| (p, n))
        };
        // A process by its rank in the job, where its launcher said it.
        let rank_of = |pid: u32| self.tl.processes.get(&pid).and_then(|p| p.rank);
        // "rank 1 (pid 42, GPU 1)", "pid 42 (GPU 1)", "rank 1 (pid 42)".
        let named = |pid: u32, gpu: Option<u32>| {
            let gpu = gpu.map_or(String::new(), |d| format!(", GPU {d}"));
            match rank_of(pid) {
                Some(rank) => format!("rank {rank} (pid {pid}{gpu})"),
                None if gpu.is_empty() => format!("pid {pid}"),
                None => format!("pid {pid} ({})", &gpu[2..]),
            }
        };
        // The waits that matter: at least a fifth of the longest (the late
        // rank waits a little for the others too).
        let longest = self.d.gpus.iter().filter_map(most).map(|x| x.1).max();
        for g in &self.d.gpus {
            let Some((pid, ns)) = most(g).filter(|x| x.1 * 5 >= longest.unwrap_or(0)) else {
                continue;
            };
            let waiter = g
                .feeder
                .as_ref()
                .map_or(String::new(), |f| match rank_of(f.tid.0) {
                    Some(rank) => format!(" (rank {rank}, pid {})", f.tid.0),
                    None => format!(" (pid {})", f.tid.0),
                });
            let theirs = self.d.gpus.iter().find(|h| {
                h.gpu.device != g.gpu.device && h.feeder.as_ref().is_some_and(|f| f.tid.0 == pid)
            });
            let Some(h) = theirs else {
                out.push(format!(
                    "GPU {}{waiter} waited {} in collectives for {}, which feeds no GPU recorded here",
                    g.gpu.device,
                    units::duration(ns),
                    named(pid, None)
                ));
                continue;
            };
            let why = late_because(h);
            out.push(format!(
                "GPU {}{waiter} waited {} in collectives for {}{why}",
                g.gpu.device,
                units::duration(ns),
                named(pid, Some(h.gpu.device))
            ));
        }
        out
    }

    /// The input pipeline's slowest CPU stage: an evidence line (its share
    /// and top functions) and a sentence on fixing it.
    fn slowest_stage(&self) -> Option<(String, String)> {
        let stages = self.stages?;
        let s = stages.stages.iter().find(|s| s.stage != "read")?;
        let name = s.stage.strip_prefix("input.").unwrap_or(&s.stage);
        let functions = s.functions_said();
        let line = format!(
            "slowest input stage: {name}, {:.0}% of the input pipeline's time over {} thread(s){}",
            s.pct,
            stages.threads,
            if functions.is_empty() {
                String::new()
            } else {
                format!(" ({})", functions.join(", "))
            }
        );
        let fix = format!(
            " The slowest stage is {name}: {}.",
            crate::analyze::stages::fixes(&s.stage)
        );
        Some((line, fix))
    }

    fn who(&self, t: Tid) -> String {
        let comm = self
            .tl
            .threads
            .get(&t)
            .map(|x| x.comm.clone())
            .unwrap_or_default();
        format!("{}/{} {comm}", t.0, t.1).trim_end().to_string()
    }

    fn frames(&self, hash: u64) -> Vec<String> {
        self.names
            .frames(hash)
            .map(|f| f.iter().map(|x| x.function.clone()).collect())
            .unwrap_or_default()
    }

    fn chain(&self, hash: u64) -> Option<String> {
        let mut f: Vec<String> = self
            .frames(hash)
            .into_iter()
            .filter(|x| !crate::session::is_entry_frame(x))
            .collect();
        f.dedup();
        (!f.is_empty()).then(|| f.into_iter().take(5).collect::<Vec<_>>().join(" ← "))
    }

    /// The heaviest on-CPU stack of these threads.
    fn hot_stack(&self, threads: &[Tid]) -> Option<String> {
        let weights = threads
            .iter()
            .filter_map(|t| self.tl.threads.get(t))
            .flat_map(|tl| tl.samples.iter().map(|(&(u, _), &n)| (u, n)));
        heaviest(weights)
            .and_then(|u| self.chain(u))
            .map(|c| format!("hottest stack: {c}"))
    }

    /// Where these threads blocked longest for `kind`.
    fn blocked_stack(&self, threads: &[Tid], kind: OffKind) -> Option<String> {
        let weights = threads
            .iter()
            .filter_map(|t| self.tl.threads.get(t))
            .flat_map(|tl| {
                tl.off_stacks
                    .iter()
                    .filter(move |(&(k, _, _), _)| k == kind)
                    .map(|(&(_, u, _), &ns)| (u, ns))
            });
        heaviest(weights)
            .and_then(|u| self.chain(u))
            .map(|c| format!("blocked in: {c}"))
    }

    /// Files these threads read, by bytes, with their typical read size.
    fn files_read(&self, threads: &HashSet<Tid>) -> Vec<String> {
        // Keyed by the path each fd had last, as the timeline knows it:
        // bytes, and reads by size.
        type Reads = (u64, BTreeMap<u64, u64>);
        let mut by_path: HashMap<String, Reads> = HashMap::new();
        for t in self.tl.all_threads() {
            if !threads.contains(&(t.pid, t.tid)) {
                continue;
            }
            for (fd, reads) in &t.file_reads {
                let path = self
                    .tl
                    .fd_paths
                    .get(&(t.pid, *fd))
                    .cloned()
                    .unwrap_or_else(|| format!("fd {fd}"));
                let x = by_path.entry(path).or_default();
                x.0 += reads.bytes;
                for (&size, &n) in &reads.sizes {
                    *x.1.entry(size).or_default() += n;
                }
            }
        }
        if by_path.is_empty() {
            return self.blocked_reads(threads);
        }
        let mut v: Vec<(String, Reads)> = by_path.into_iter().collect();
        v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        v.into_iter()
            .take(TOP)
            .map(|(path, (bytes, sizes))| {
                let reads: u64 = sizes.values().sum();
                format!(
                    "read {} from {path} in {reads} reads (median {})",
                    units::bytes(bytes),
                    units::bytes(median(&sizes))
                )
            })
            .collect()
    }

    /// Without per-syscall records: the files these threads blocked
    /// reading, by how often, with the size the reads asked for.
    fn blocked_reads(&self, threads: &HashSet<Tid>) -> Vec<String> {
        let mut by_path: HashMap<&str, BTreeMap<u64, u64>> = HashMap::new();
        for t in self.tl.all_threads() {
            if !threads.contains(&(t.pid, t.tid)) {
                continue;
            }
            for (path, sizes) in &t.blocked_reads {
                let x = by_path.entry(path).or_default();
                for (&size, &n) in sizes {
                    *x.entry(size).or_default() += n;
                }
            }
        }
        let mut v: Vec<(&str, u64, BTreeMap<u64, u64>)> = by_path
            .into_iter()
            .map(|(p, sizes)| (p, sizes.values().sum(), sizes))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.into_iter()
            .take(TOP)
            .map(|(path, reads, sizes)| {
                format!(
                    "blocked {reads} times reading {path} (median request {})",
                    units::bytes(median(&sizes))
                )
            })
            .collect()
    }

    fn processes(&self, threads: &HashSet<Tid>) -> usize {
        threads.iter().map(|t| t.0).collect::<HashSet<_>>().len()
    }

    /// Loader processes that did real work (a tenth of the busiest's at
    /// least): the feeder blocks only on the one that is behind, so its
    /// waits alone undercount them (the replay's pool has the siblings);
    /// else, those among `waited`.
    fn loader_processes(&self, waited: &HashSet<Tid>) -> usize {
        let mut work: HashMap<u32, u64> = HashMap::new();
        for f in self.d.gpus.iter().filter_map(|g| g.feeder.as_ref()) {
            let members = replay::loaders(f.tid, &f.waited, self.tl);
            for t in self.tl.all_threads() {
                if members.contains(&(t.pid, t.tid)) && t.pid != f.tid.0 {
                    let off = |k| t.off.get(&k).copied().unwrap_or(0);
                    *work.entry(t.pid).or_default() +=
                        t.on_cpu + off(OffKind::File) + off(OffKind::Net);
                }
            }
        }
        let most = work.values().copied().max().unwrap_or(0);
        let n = work.values().filter(|&&w| w * 10 >= most && w > 0).count();
        n.max(self.processes(waited))
    }

    fn api_calls(&self, role: ApiRole) -> (u64, u64) {
        self.tl.gpu.totals.api_calls(role)
    }

    fn kernel_histogram(&self) -> String {
        let mut buckets = [0u64; 4];
        for d in self.tl.gpu.totals.devices.values() {
            for (b, n) in buckets.iter_mut().zip(d.kernel_durations) {
                *b += n;
            }
        }
        format!(
            "kernel durations: <10µs {} · 10-100µs {} · 100µs-1ms {} · >1ms {}",
            buckets[0], buckets[1], buckets[2], buckets[3]
        )
    }

    fn copies(&self) -> Vec<String> {
        let mut by: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for g in &self.d.gpus {
            for (k, s) in &g.gpu.copies {
                let e = by.entry(k.clone()).or_default();
                e.0 += s.count;
                e.1 += s.bytes;
            }
        }
        by.into_iter()
            .map(|(k, (n, b))| format!("{k} copies: {n} × {}", units::bytes(b / n.max(1))))
            .collect()
    }

    /// Who took the CPU from these threads when they were preempted.
    fn preempted_by(&self, threads: &HashSet<Tid>) -> Option<String> {
        let mut by: HashMap<u32, u64> = HashMap::new();
        for t in self.tl.all_threads() {
            if threads.contains(&(t.pid, t.tid)) {
                for (&pid, &n) in &t.preempted_by {
                    *by.entry(pid).or_default() += n;
                }
            }
        }
        let mut v: Vec<(u32, u64)> = by.into_iter().collect();
        // Ties broken by pid: hash-map order differs from run to run, and
        // the report written at the end of a run must be the one re-read.
        v.sort_by_key(|&(pid, n)| (std::cmp::Reverse(n), pid));
        let names: Vec<String> = v
            .into_iter()
            .take(TOP)
            .map(|(pid, n)| {
                let comm = self
                    .tl
                    .processes
                    .get(&pid)
                    .map(|p| p.comm.clone())
                    .unwrap_or_else(|| {
                        if pid == 0 {
                            "idle".into()
                        } else {
                            "another process".into()
                        }
                    });
                format!("{comm} (pid {pid}) ×{n}")
            })
            .collect();
        (!names.is_empty()).then(|| format!("preempted by: {}", names.join(", ")))
    }
}

fn advice(cause: Cause, ev: &Evidence, involved: &HashMap<Tid, u64>) -> (String, Vec<String>) {
    let set: HashSet<Tid> = involved.keys().copied().collect();
    let top = top_threads(involved, TOP);
    let whos: Vec<String> = top.iter().map(|t| ev.who(*t)).collect();
    let mut e: Vec<String> = Vec::new();
    if !whos.is_empty() {
        e.push(format!("threads: {}", whos.join(", ")));
    }
    // The recorded machine's CPUs, not those of the machine reading the
    // session (imported traces do not say).
    let cpus = match ev.nr_cpus {
        0 => "CPU count not recorded".to_string(),
        n => format!("{n} CPUs"),
    };
    let title = match cause {
        Cause::InputIo => {
            e.extend(ev.files_read(&set));
            e.extend(ev.blocked_stack(&top, OffKind::File));
            format!(
                "The input pipeline waits on storage ({} loader process(es) reading files). Raise DataLoader num_workers and prefetch_factor, set persistent_workers=True; cache the dataset on local NVMe or in RAM, or read larger sequential shards (WebDataset, tar) instead of many small files.",
                ev.loader_processes(&set)
            )
        }
        Cause::InputCpu => {
            // The trainer's own part: loading batches itself, receiving
            // them, and waiting for CPUs its loaders held.
            let feeders: HashSet<Tid> =
                ev.d.gpus
                    .iter()
                    .filter_map(|g| g.feeder.as_ref().map(|f| f.tid))
                    .collect();
            let trainer: u64 = feeders.iter().filter_map(|f| involved.get(f)).sum();
            if trainer > 0 {
                e.push(format!(
                    "{} of it the trainer's own: loading batches itself, receiving them (unpickling, rebuilding tensors) or waiting for CPUs its loaders held",
                    units::duration(trainer / ev.d.gpus.len().max(1) as u64)
                ));
            }
            let loaders: HashSet<Tid> = set
                .iter()
                .filter(|t| !feeders.iter().any(|f| f.0 == t.0))
                .copied()
                .collect();
            let loader_threads: Vec<Tid> = top
                .iter()
                .filter(|t| loaders.contains(t))
                .copied()
                .collect();
            e.extend(ev.hot_stack(&loader_threads));
            let stage = ev.slowest_stage();
            e.extend(stage.as_ref().map(|(line, _)| line.clone()));
            let stage_fix = stage.map(|(_, fix)| fix).unwrap_or_default();
            let n = ev.loader_processes(&loaders);
            let all: u64 = involved.values().sum();
            if n == 0 || trainer * 10 >= all * 9 {
                // num_workers=0: the trainer decodes while the GPU waits
                // (a helper it once ran, ldconfig for ctypes, is no loader).
                return (
                    format!(
                        "The trainer loads its own batches (DataLoader num_workers=0): the GPU waits while it reads, decodes and collates each one. Set num_workers toward the {cpus} (and pin_memory=True, persistent_workers=True) so that batches are made while the GPU works.{stage_fix}"
                    ),
                    e,
                );
            }
            let crowded = ev.nr_cpus > 0 && n as u32 >= ev.nr_cpus;
            // Unrecorded tasks of the job's own scheduling group share its
            // CPUs thread by thread: more workers take theirs.
            let group = ev
                .tl
                .neighbour_cpus(ev.tl.start, ev.tl.end)
                .map_or(0.0, |n| n.0);
            let workers = if !crowded {
                " Raise num_workers toward the cores available.".to_string()
            } else if group >= 0.25 {
                format!(
                    " The loaders hold every CPU the rest of the job leaves; other processes in its scheduling group (its cgroup, or its session's autogroup) held {group:.1} CPUs beside them, and more workers would win a share of those, at their expense: better give the job CPUs of its own."
                )
            } else {
                " The loaders already hold every CPU, the trainer's included: more workers will not help; give the job more CPUs.".to_string()
            };
            format!(
                "Data loading is CPU-bound (decode, augmentation in {n} loader process(es), {cpus}).{workers} Keep torch.set_num_threads(1) in workers, move decode/augmentation to the GPU (DALI, torchvision v2 on GPU), or preprocess offline.{stage_fix}"
            )
        }
        Cause::InputNetwork => {
            e.extend(ev.blocked_stack(&top, OffKind::Net));
            e.extend(ev.retransmits());
            "The input pipeline waits on the network. Prefetch more (prefetch_factor, more workers), fetch shards in parallel, cache them on local disk, or move the data next to the GPUs.".into()
        }
        Cause::InputUnknown => {
            let (inside, ops) = ev.ops_inside_the_dataloader(&set);
            if inside > 0 {
                e.push(format!(
                    "{} of the trainer's own ops ran inside the DataLoader's ({}): it made the batches itself",
                    units::duration(inside),
                    ops.join(", ")
                ));
                return (
                    "The trainer loads its own batches (DataLoader num_workers=0): its transforms and collation run inside the DataLoader's op while the GPU waits. Set num_workers toward the CPUs available (and pin_memory=True, persistent_workers=True) so that batches are made while the GPU works; record the job with `gapscope run` to see which stage (read, decode, transform, collate) is slowest.".into(),
                    e,
                );
            }
            "The training loop waits for its DataLoader. This trace cannot tell storage, preprocessing or network apart (no off-CPU data; record the job with `gapscope run` to find out); first try more num_workers, prefetch_factor and persistent_workers=True, and pin_memory=True.".into()
        }
        Cause::CpuHost => {
            e.extend(ev.hot_stack(&top));
            "Host-side work between GPU steps (Python, framework overhead). Cut per-step host work with torch.compile or CUDA graphs, move logging and metrics off the step, or grow the batch so each step gives the GPU more work.".into()
        }
        Cause::CpuLaunch => {
            let (n, ns) = ev.api_calls(ApiRole::Launch);
            if let Some(mean) = ns.checked_div(n) {
                e.push(format!(
                    "{n} launch calls, {} each on average",
                    units::duration(mean)
                ));
            }
            e.push(ev.kernel_histogram());
            "Launch-bound: the host cannot issue kernels as fast as the GPU runs them. Capture the step in CUDA graphs (torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs), fuse elementwise ops with torch.compile, or raise the batch size.".into()
        }
        Cause::CpuContention => {
            e.extend(ev.preempted_by(&set));
            format!(
                "The training thread waits for a CPU ({cpus}). Avoid oversubscription: set OMP_NUM_THREADS/MKL_NUM_THREADS (torch.set_num_threads) so loaders × threads fit the cores, pin the trainer and the loaders to separate cores, and keep num_workers below the core count."
            )
        }
        Cause::Sync => {
            let (n, ns) = ev.api_calls(ApiRole::Sync);
            if n > 0 {
                e.push(format!(
                    "{n} synchronize calls, {} waiting in them",
                    units::duration(ns)
                ));
            }
            e.extend(ev.blocked_stack(&top, OffKind::Gpu));
            e.extend(ev.hot_stack(&top));
            "The host synchronizes with the GPU every step, then the GPU waits for the host. Remove .item(), .cpu(), printing tensors and torch.cuda.synchronize() from the loop; accumulate metrics on the GPU and read them every N steps.".into()
        }
        Cause::Comm => {
            e.extend(ev.stragglers());
            e.extend(ev.retransmits());
            e.extend(ev.blocked_stack(&top, OffKind::Net));
            e.extend(ev.blocked_stack(&top, OffKind::Ipc));
            e.extend(ev.hot_stack(&top));
            "Ranks wait for each other in collectives: this GPU idles while its rank waits for the slowest one to arrive, or for the network. Read every rank's session together (gapscope report RANK0 RANK1 …: the cross-rank table names the rank the others wait for) and fix that straggler's own top cause — uneven input or host work, a slower node; where the wait is the network, overlap communication with compute (DDP's gradient buckets, no_sync() across accumulation steps) or send less.".into()
        }
        Cause::Memory => {
            let (n, ns) = ev.api_calls(ApiRole::Memory);
            if n > 0 {
                e.push(format!(
                    "{n} copy/alloc calls, {} in them",
                    units::duration(ns)
                ));
            }
            e.extend(ev.copies());
            "Host-to-device copies and allocations stall the GPU. Use pin_memory=True in the DataLoader and .to(device, non_blocking=True); avoid pageable copies; keep tensors on the GPU; reuse memory (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) if cudaMalloc/cudaFree show up.".into()
        }
        Cause::Startup | Cause::Teardown | Cause::Unattributed | Cause::Demand => String::new(),
    };
    (title, e)
}

/// The user stack with the most weight, summed over kernel stacks and
/// threads; ties go to the lowest hash, so the answer does not depend on
/// hash-map order.
fn heaviest(weights: impl Iterator<Item = (u64, u64)>) -> Option<u64> {
    let mut by_stack: std::collections::BTreeMap<u64, u64> = Default::default();
    for (u, w) in weights.filter(|&(u, _)| u != 0) {
        *by_stack.entry(u).or_default() += w;
    }
    by_stack
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(u, _)| u)
}

/// The size of read number n/2 in size order, of reads counted by size.
fn median(sizes: &BTreeMap<u64, u64>) -> u64 {
    let reads: u64 = sizes.values().sum();
    let mut seen = 0;
    sizes
        .iter()
        .find(|&(_, &n)| {
            seen += n;
            seen > reads / 2
        })
        .map_or(0, |(&size, _)| size)
}

#[cfg(test)]
mod tests {
    use super::heaviest;

    #[test]
    fn heaviest_sums_per_stack_and_breaks_ties_the_same_way() {
        // 7 is split over two kernel stacks and wins; 0 (no stack) never does.
        assert_eq!(
            heaviest([(7, 2), (9, 3), (7, 2), (0, 10)].into_iter()),
            Some(7)
        );
        assert_eq!(heaviest([(9, 3), (5, 3)].into_iter()), Some(5));
        assert_eq!(heaviest([(5, 3), (9, 3)].into_iter()), Some(5));
        assert_eq!(heaviest(std::iter::empty()), None);
    }
}
