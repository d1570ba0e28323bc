//! The analysis of a recording, and its one entry point, [`analyze`]: the
//! session replayed into a timeline (CPU and GPU), every idle GPU nanosecond
//! attributed to a cause (`attribute`, vocabulary in `cause`), then the
//! advice, the clock checks, NVML figures and CUDA API accounting. Renderers
//! (`export`) read the [`Analysis`] and nothing else.

pub mod account;
pub mod align;
pub mod api;
pub mod attribute;
pub mod cause;
pub mod checks;
pub mod code;
pub mod compare;
pub mod diagnose;
pub mod figures;
pub mod gpu;
pub mod hta;
pub mod lockstep;
pub mod loss;
pub mod nvml;
mod python;
pub mod ranks;
pub mod recommend;
pub mod replay;
pub mod requests;
pub mod stacks;
pub mod stages;
pub mod stats;
pub mod steps;
pub mod stream;

use std::collections::{BTreeMap, HashMap};

pub use gapscope_wire::cbid::{api_name, cbid_of};

use crate::session::{
    CollectorCost, Drops, Event, Footer, Frame, GpuBlind, GpuSource, Outline, Rank, Session,
    SessionError, SessionHeader, Source, SourceKind, Stack, Stored,
};
use crate::timeline::spooled::GpuIntake;
use crate::timeline::{BuildOptions, Timeline};

/// A map looked up once per GPU record, millions of times: a fast hasher,
/// still seeded at random so that a crafted file cannot make it quadratic.
pub type RecordMap<K, V> = ahash::AHashMap<K, V>;

#[derive(Clone, Debug, Default)]
pub struct AnalyzeOptions {
    /// Keep every thread state, sample and long syscall even without GPU
    /// data: the flamegraphs and the timeline export draw them. Without
    /// it they are kept only where the GPU attribution needs them.
    pub pictures: bool,
    /// Also reproduce HTA's per-stream idle breakdown.
    pub hta: bool,
    /// How stacks are named as regions of the job's code: the built-in
    /// table and the user's rules (`--code`).
    pub code: code::Rules,
}

impl AnalyzeOptions {
    /// How the timeline is built for these options; `recent`: for an
    /// attribution that lets its states go as it moves on.
    fn build(&self, intervals: bool, recent: bool) -> BuildOptions {
        BuildOptions {
            intervals,
            pictures: self.pictures,
            recent,
        }
    }
}

/// What the recording says about itself.
#[derive(Clone, Debug)]
pub struct Facts {
    pub header: SessionHeader,
    pub footer: Option<Footer>,
    pub drops: Drops,
    /// Set when the file ends in a damaged or cut-off chunk, or has no end.
    pub truncated: Option<String>,
    pub gpu_sources: Vec<GpuSource>,
    /// Processes `attach` brought the shim into.
    pub injected: Vec<crate::session::ShimInjected>,
    pub gpu_blind: Vec<GpuBlind>,
    /// GPU records the shims skipped as incomplete.
    pub gpu_records_incomplete: u64,
    /// GPU records CUPTI or the shims dropped.
    pub gpu_records_dropped: u64,
    pub rank: Option<Rank>,
    pub collector: Option<CollectorCost>,
    /// Scheduler, syscall, sample and other eBPF events recorded.
    pub events: u64,
}

impl Facts {
    /// The GPU was gapscope's own simulated device (test and demo
    /// workloads): every output says so.
    pub fn simulated(&self) -> bool {
        self.gpu_sources
            .iter()
            .any(|g| g.kind == SourceKind::Simulated)
    }
}

/// Names of recorded stacks: symbolized frames where the recording
/// resolved them, raw addresses otherwise.
#[derive(Clone, Debug, Default)]
pub struct Names {
    symbols: HashMap<u64, Vec<Frame>>,
    stacks: HashMap<u64, Stack>,
}

impl Names {
    /// Symbolized frames of a stack, innermost first.
    pub fn frames(&self, hash: u64) -> Option<&[Frame]> {
        self.symbols.get(&hash).map(Vec::as_slice)
    }

    /// Raw addresses of a stack the recording could not symbolize.
    pub fn addrs(&self, hash: u64) -> Option<&[u64]> {
        self.stacks.get(&hash).map(|s| s.addrs.as_slice())
    }

    /// A stack's frames as every output names them, innermost first:
    /// `name` of each symbol, else the raw addresses the recording kept,
    /// else [`LOST_STACK`] — the one fallback for a stack that cannot be
    /// read. Nothing for no stack (hash 0).
    pub fn frame_names(&self, hash: u64, name: impl Fn(&Frame) -> String) -> Vec<String> {
        if hash == 0 {
            return Vec::new();
        }
        if let Some(frames) = self.frames(hash) {
            return frames.iter().map(name).collect();
        }
        match self.addrs(hash) {
            Some(addrs) => addrs.iter().map(|a| format!("{a:#x}")).collect(),
            None => vec![LOST_STACK.into()],
        }
    }
}

/// What stands for a stack the recording lost (dropped, or never sent).
pub const LOST_STACK: &str = "[stack lost]";

/// One analysed input of several (a comparison's side, ranks), with the
/// name it goes by.
pub struct Labelled {
    pub label: String,
    pub analysis: Analysis,
}

/// A session analysed once, for the report and every export.
pub struct Analysis {
    pub facts: Facts,
    pub timeline: Timeline,
    pub names: Names,
    pub diagnosis: diagnose::Diagnosis,
    pub advice: recommend::Advice,
    pub clock_checks: BTreeMap<u32, checks::ClockCheck>,
    /// Per GPU (by id): what NVML said.
    pub nvml: BTreeMap<u32, nvml::NvmlFigures>,
    pub api: api::ApiAccounting,
    /// The recording's own notes, then the analysis's.
    pub notes: Vec<String>,
    pub hta: Option<BTreeMap<u32, hta::StreamIdle>>,
    /// The rules the stacks' code regions are read with.
    pub code: code::Rules,
    /// The input pipeline by stage, where samples were in input code.
    pub stages: Option<stages::InputStages>,
    /// Per GPU (by id) whose feeder serves requests: what they came to.
    pub requests: BTreeMap<u32, requests::Requests>,
}

/// The rank a recording is, when its processes are ranks of one job and
/// all the same one (a rank and its DataLoader workers): the recording of
/// one rank of a job launched per node or per rank.
fn only_rank(ranks: &HashMap<u32, crate::session::Rank>) -> Option<crate::session::Rank> {
    let mut all = ranks.values();
    let first = *all.next()?;
    all.all(|r| *r == first).then_some(first)
}

/// The pipeline: session → timeline → attribution → advice. Takes the
/// session: its records move into the timeline rather than being copied. A
/// session file is streamed: its events are replayed from the file through
/// the timeline, never held, and its GPU records go straight to their place.
pub fn analyze(source: impl Into<Source>, opts: &AnalyzeOptions) -> Result<Analysis, SessionError> {
    analyze_settling_every(source, opts, SETTLE_EVERY)
}

/// [`analyze`], trying to attribute what the replayed events passed every
/// `settle_every` events (tests make it 1, to try it at every step).
#[doc(hidden)]
pub fn analyze_settling_every(
    source: impl Into<Source>,
    opts: &AnalyzeOptions,
    settle_every: u64,
) -> Result<Analysis, SessionError> {
    match source.into() {
        Source::InMemory(mut session) => {
            let events = session.events.len() as u64;
            let intervals = opts.pictures
                || !session.gpu.is_empty()
                || session
                    .events
                    .iter()
                    .any(|e| matches!(e, Event::CudaCall { .. }));
            let timeline = Timeline::build(&mut session, opts.build(intervals, false));
            // Everything the timeline needed from the events is in it now.
            session.events = Vec::new();
            Ok(conclude(*session, timeline, events, opts, None, None))
        }
        Source::Stored(stored) => streamed(stored, opts, settle_every),
    }
}

/// The analysis of a stored session, its events streamed: read twice,
/// first all but its events, then its events in time order, attributed as
/// they pass. Where the attribution runs as they pass (a finished
/// recording, no pictures), its GPU work and CUDA calls come with them,
/// read back in time order from where the first pass spooled them, and go
/// once the attribution is past them.
fn streamed(
    stored: Stored,
    opts: &AnalyzeOptions,
    settle_every: u64,
) -> Result<Analysis, SessionError> {
    let mut phases = Phases::start();
    let mut intake = GpuIntake::new(opts.pictures || opts.hta);
    let mut samples = crate::timeline::SampleStacks::new();
    let Outline {
        mut session,
        events: stream,
        cuda_calls,
    } = crate::session::read_outline(
        stored,
        |pid, r| intake.add(pid, r),
        |e| crate::timeline::count_sample(&mut samples, e),
    )?;
    let mut spools = intake.finish();
    phases.done("first pass (everything but the events, GPU records spooled)");
    let intervals = opts.pictures || spools.count > 0 || cuda_calls;
    let (mut side, gpu_dropped, plan) = spools.scan(&mut session, stream.window());
    // With the recording's end known, idle gaps are attributed as the
    // events pass them, and the states behind let go (the pictures keep
    // every state: they draw them all; HTA's table reads all the work).
    let end = crate::timeline::recorded_end(&session).filter(|_| intervals && !opts.pictures);
    let windowed = end.is_some() && !opts.hta;
    let steps = if windowed {
        side.windowed = true;
        steps::find(&side).map(|found| {
            let mut timing = steps::Timing::new(&found);
            spools.each_work(&plan, |w| timing.add(w.launch.map(|l| l.1), w.span()));
            let timed = timing.finish();
            steps::Summary::new(found, timed)
        })
    } else {
        side = spools.whole(side, &plan);
        None
    };
    phases.done("GPU totals and steps, read back from the spools");
    let mut timeline = Timeline::begin_with(&session, side, opts.build(intervals, windowed));
    timeline.io_tally = crate::timeline::io_tally(&samples, &session.symbols);
    let code = code_of(&session, opts);
    let mut attributor = end.map(|end| {
        let steps = match windowed {
            true => steps.flatten(),
            false => steps::summary(&timeline),
        };
        stream::Attributor::new(
            &timeline,
            (timeline.start, end),
            attribute::Edges::of(&session),
            &loss::blind_windows(&session),
            loss::lossy_windows(&session),
            code,
            steps,
            windowed,
            spools.queue_delay(),
        )
    });
    let mut feed = windowed.then(|| spools.feed(&plan));
    let index: HashMap<u32, usize> = timeline
        .gpu
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.id, i))
        .collect();
    let mut events = 0u64;
    let mut last = None;
    let replay = stream.replay(|e| {
        events += 1;
        let ts = e.ts();
        last = Some(ts);
        if let (Some(f), Some(a)) = (feed.as_mut(), attributor.as_mut()) {
            if f.due(ts) {
                pull(f, &index, &mut timeline, a, ts);
            }
        }
        timeline.apply(&e);
        if events % settle_every.max(1) == 0 {
            if let Some(a) = attributor.as_mut() {
                a.settle(&mut timeline, ts);
            }
        }
    });
    if let (Some(f), Some(a)) = (feed.as_mut(), attributor.as_mut()) {
        pull(f, &index, &mut timeline, a, u64::MAX);
        if let Some(why) = f.failed() {
            session.notes.push(format!(
                "part of the GPU's work could not be read back from the report's scratch file ({why}): the figures after it are missing"
            ));
        }
    }
    drop(feed);
    if let Some(why) = spools.kept_in_memory() {
        session.notes.push(scratch_note(why));
    }
    match replay {
        Ok(dropped) => crate::session::note_dropped(&mut session, dropped + gpu_dropped),
        // The file went away between the passes: what was replayed
        // stands.
        Err(e) => session.notes.push(format!("reading the events again: {e}")),
    }
    timeline.end(&session, last);
    phases.done("second pass (the events replayed, attributed as they pass)");
    let spooled = windowed.then_some((spools, plan));
    let a = conclude(session, timeline, events, opts, attributor, spooled);
    phases.done("the rest (the what-if replays, advice)");
    Ok(a)
}

/// What the report says when its scratch file could not be made or
/// written: the analysis holds more in memory, nothing is lost.
fn scratch_note(why: &str) -> String {
    format!(
        "the report could not keep its scratch data in a temporary file ({why}; TMPDIR \
         chooses where): it held it in memory, more of it for a longer recording"
    )
}

/// Takes in the GPU's work and calls starting at or before `t`: into the
/// timeline's window of them, and the work to the attribution.
fn pull(
    feed: &mut crate::timeline::spooled::GpuFeed,
    index: &HashMap<u32, usize>,
    tl: &mut Timeline,
    a: &mut stream::Attributor,
    t: u64,
) {
    while let Some(w) = feed.next_work(t) {
        let Some(&i) = index.get(&w.device) else {
            continue;
        };
        a.work(i, &w);
        tl.gpu.devices[i].work.push(w);
    }
    while let Some((tid, c)) = feed.next_call(t) {
        tl.gpu.calls.entry(tid).or_default().push(c);
    }
    a.gpu_until(t);
}

/// Which code each sampled stack is in, by the options' rules.
fn code_of(session: &Session, opts: &AnalyzeOptions) -> code::CodeOf {
    code::CodeOf::new(&session.symbols, &opts.code, session.header().sample_hz)
}

/// Events replayed between two attempts to attribute what they passed.
const SETTLE_EVERY: u64 = 4096;

/// Where an analysis's time goes, said on stderr when
/// `GAPSCOPE_PHASES` is set (`cargo xtask bench offline` reads it).
struct Phases {
    at: Option<std::time::Instant>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            at: std::env::var_os("GAPSCOPE_PHASES").map(|_| std::time::Instant::now()),
        }
    }

    /// The phase `name` ended now: its time, and the peak memory so far.
    fn done(&mut self, name: &str) {
        if let Some(at) = self.at.as_mut() {
            let peak = std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
                    l.split_whitespace().nth(1)?.parse::<u64>().ok()
                })
                .unwrap_or(0);
            eprintln!(
                "gapscope: phase {name}: {:.3} s (peak {} MiB)",
                at.elapsed().as_secs_f64(),
                peak >> 10
            );
            *at = std::time::Instant::now();
        }
    }
}

/// Everything after the timeline; `attributor`: the attribution done while
/// it was replayed, if it was.
fn conclude(
    mut session: Session,
    timeline: Timeline,
    events: u64,
    opts: &AnalyzeOptions,
    attributor: Option<stream::Attributor>,
    spooled: Option<(
        crate::timeline::spooled::GpuSpools,
        crate::timeline::spooled::Plan,
    )>,
) -> Analysis {
    let (diagnosis, clock_checks) = match attributor {
        Some(a) => a.finish(&timeline),
        None => (
            diagnose::diagnose(&session, &timeline, opts.pictures, &code_of(&session, opts)),
            checks::clock_checks(&timeline),
        ),
    };
    let names = Names {
        symbols: std::mem::take(&mut session.symbols),
        stacks: std::mem::take(&mut session.stacks),
    };
    let nr_cpus = session.header().nr_cpus;
    let collector_cpu = session.collector.map_or(0, |c| c.cpu_ns);
    let stages = stages::of(&timeline, &names, &opts.code, session.header().sample_hz);
    let advice = recommend::build(
        recommend::Context {
            nr_cpus,
            collector_cpu_ns: collector_cpu,
            stages: stages.as_ref(),
            code: &opts.code,
            spooled: spooled.as_ref().map(|(s, p)| (s, p)),
        },
        &timeline,
        &diagnosis,
        &names,
    );
    let nvml = diagnosis
        .gpus
        .iter()
        .map(|g| {
            (
                g.gpu.device,
                nvml::figures(
                    &session,
                    g.gpu.device,
                    &g.gpu.busy,
                    timeline.start,
                    timeline.end,
                ),
            )
        })
        .collect();
    let requests = diagnosis
        .gpus
        .iter()
        .filter_map(|g| {
            let busy = |a, b| g.gpu.busy_within(a, b);
            let spans = requests::spans(&g.feeder.as_ref()?.account, busy);
            let r = requests::of(&spans, busy, |a, b| {
                nvml::nvml_for(&session, g.gpu.device, a, b).1
            })?;
            Some((g.gpu.device, r))
        })
        .collect();
    let api = api::accounting(&timeline.gpu.totals);
    let hta = opts.hta.then(|| hta::per_stream_idle(&timeline.gpu));
    let mut notes = std::mem::take(&mut session.notes);
    let account_kept = diagnosis
        .gpus
        .iter()
        .filter_map(|g| g.feeder.as_ref()?.account.kept_in_memory())
        .next();
    if let Some(why) = account_kept.filter(|_| !notes.iter().any(|n| n.contains("scratch"))) {
        notes.push(scratch_note(why));
    }
    notes.extend(stack_depth_note(&timeline, &names));
    notes.extend(python::notes(&session.maps, &names));
    notes.extend(loss::lossy_note(&diagnosis.lossy_windows, timeline.start));
    notes.extend(advice.notes.iter().cloned());
    let facts = Facts {
        header: session
            .header
            .take()
            .expect("read_session guarantees a header"),
        footer: session.footer.take(),
        drops: std::mem::take(&mut session.drops),
        truncated: session.truncated.take(),
        gpu_sources: std::mem::take(&mut session.gpu_sources),
        injected: std::mem::take(&mut session.injected),
        gpu_blind: std::mem::take(&mut session.gpu_blind),
        // Counts a file states: summed without overflowing, whatever it says.
        gpu_records_incomplete: session
            .gpu_skipped
            .values()
            .fold(0u64, |n, (i, _)| n.saturating_add(*i)),
        gpu_records_dropped: session
            .gpu_drops
            .values()
            .fold(0u64, |n, (c, s)| n.saturating_add(*c).saturating_add(*s)),
        rank: session.rank.or_else(|| only_rank(&session.process_ranks)),
        collector: session.collector,
        events,
    };
    Analysis {
        facts,
        timeline,
        names,
        diagnosis,
        advice,
        clock_checks,
        nvml,
        api,
        notes,
        hta,
        code: opts.code.clone(),
        stages,
        requests,
    }
}

/// Debian's and most distributions' glibc lack frame pointers, so a user
/// stack captured inside libc often stops there. Say so when it matters.
fn stack_depth_note(tl: &Timeline, names: &Names) -> Option<String> {
    let mut total = 0u64;
    let mut short_in_libc = 0u64;
    for t in tl.all_threads() {
        for (&(_, ustack, _), &ns) in &t.off_stacks {
            total += ns;
            let short = names.frames(ustack).is_some_and(|frames| {
                frames.len() <= 2
                    && frames
                        .first()
                        .is_some_and(|f| f.module.starts_with("libc.so"))
            });
            if short {
                short_in_libc += ns;
            }
        }
    }
    (total > 0 && short_in_libc * 4 >= total).then(|| {
        "user stacks that block inside glibc are short: this system's libc is built without \
         frame pointers, so unwinding stops there (times and syscalls are exact; only the \
         call chain above libc is missing)"
            .to_string()
    })
}
