//! Why was the GPU idle? Every idle nanosecond of a GPU gets exactly one
//! cause, decided from what the *feeder* — the host thread whose work ended
//! the gap — was doing meanwhile, following wakeup edges to the threads it
//! waited on.
//!
//! Rules, for each piece of a gap:
//! - feeder inside a CUDA call: launch → `cpu.launch`; synchronize/wait →
//!   `sync`; copy/alloc/free → `memory`;
//! - feeder on-CPU outside CUDA → by the code it runs (its samples, through
//!   the regions of `code.rs`): input code → `input.cpu`; its own work →
//!   `cpu.host`, except, when the gap opened as a synchronize returned (the
//!   `.item()` pattern), as much of it as the synchronize waited for the
//!   GPU: that much overlap would have hidden → `sync`; work outlasting it is
//!   the work's own;
//! - feeder runnable → `cpu.contention`;
//! - feeder blocked on a file → `input.io`, on a socket → `input.network`,
//!   in a page fault → `memory`;
//! - feeder blocked on another thread (pipe, futex, queue): what the waker did
//!   meanwhile, followed up to [`MAX_HOPS`] threads: reading files →
//!   `input.io`, receiving from the network → `input.network`, on-CPU →
//!   `input.cpu`, runnable → `cpu.contention`;
//! - before the first GPU work: `startup`; after the last: `teardown` —
//!   unless the window was cut from a longer recording ([`Edges`]);
//! - anything else: `unattributed`, shown, never hidden.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use crate::analyze::code::{Code, Region};
use crate::session::FdKind;
use crate::timeline::{
    Interval, IoTally, OffCpu, OffKind, ProcessTimeline, State, ThreadTimeline, NO_CPU,
};

/// Waits followed from thread to thread before giving up.
pub const MAX_HOPS: usize = 3;
/// A gap "opens as a synchronize returns" when the sync ended this close to it.
const SYNC_SLACK_NS: u64 = 200_000;

pub use super::cause::Cause;

pub use crate::timeline::gpu::{api_role, main_feeder, ApiRole, Call, Tid};

/// A piece of idle time and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Piece {
    pub start: u64,
    pub end: u64,
    pub cause: Cause,
    /// The thread whose state decided the cause (the feeder, or a waker).
    pub thread: Option<Tid>,
}

pub struct Inputs<'a> {
    pub window: (u64, u64),
    /// Disjoint busy spans of one GPU, sorted.
    pub busy: &'a [(u64, u64)],
    /// Start of each GPU work item on this GPU and the thread that issued
    /// it, when known (from the correlation with its API call).
    pub work: &'a [crate::timeline::gpu::Work],
    /// Threads with their state intervals.
    pub threads: &'a BTreeMap<Tid, ThreadTimeline>,
    /// The processes, for who descends from whom: a feeder's loaders are
    /// its process's descendants, not every process of the job.
    pub processes: &'a BTreeMap<u32, ProcessTimeline>,
    /// Where each thread's cpu-clock samples found it: the share of its
    /// time on a CPU that moved data, where syscalls were not hooked.
    pub io_tally: &'a HashMap<Tid, IoTally>,
    /// Each thread's CUDA API calls, sorted by start.
    pub api: &'a BTreeMap<Tid, Vec<Call>>,
    /// For threads without eBPF states (imported traces): what their host
    /// ops say, as disjoint sorted (start, end, cause) segments.
    pub ops: &'a HashMap<Tid, Vec<(u64, u64, Cause)>>,
    /// Which code each sampled stack is in: the feeder's own time on a CPU
    /// is charged by the code it ran where its samples say.
    pub code: Option<&'a super::code::CodeOf>,
    /// Where the GPU could not be seen, and where events were lost (see
    /// [`Attribution`]).
    pub blind: &'a [(u64, u64)],
    pub lossy: &'a [(u64, u64)],
    /// Keep every piece: the pictures draw them; the report needs only
    /// their sums.
    pub keep_pieces: bool,
    /// The span of the run's steps, where known: idle inside it is also
    /// tallied apart ([`Attribution::in_steps`]).
    pub steps: Option<(u64, u64)>,
    /// Set when a thread asked about had not yet moved past the span asked
    /// about: its states there may still change (the attribution of a
    /// recording still being replayed; see `analyze::stream`).
    pub unsettled: Option<&'a Cell<bool>>,
}

#[derive(Clone, Debug)]
pub struct Attribution {
    pub by_cause: BTreeMap<Cause, u64>,
    /// Idle per cause and the thread whose state decided it.
    pub by_thread: BTreeMap<(Cause, Tid), u64>,
    /// `comm` idle by the process of the job waited for (another rank),
    /// where the wakeups lead to one.
    pub waited_for: BTreeMap<u32, u64>,
    /// Every piece in time order, when kept ([`Inputs::keep_pieces`]).
    pub pieces: Vec<Piece>,
    /// Time without GPU records that fell where the GPU could not be seen
    /// at all (a blind span): taken out of the idle time, not charged.
    pub unseen: u64,
    /// The idle inside the run's steps ([`Attribution::within_steps`]), per
    /// cause.
    pub in_steps: BTreeMap<Cause, u64>,
    steps: Option<(u64, u64)>,
    /// Where the GPU could not be seen, sorted and disjoint.
    blind: Vec<(u64, u64)>,
    /// Where events were lost, sorted and disjoint: idle inside is charged
    /// to `unattributed` rather than to a cause it cannot prove (start-up
    /// excepted: it follows from the GPU records alone).
    lossy: Vec<(u64, u64)>,
    keep_pieces: bool,
    /// [`Attribution::add_all`]'s sums, kept between gaps.
    sums: Vec<(Cause, Option<Tid>, u64, u64)>,
    /// Sum the pieces by cause and thread (else only keep them: a piece of
    /// an attribution still to be added to another).
    sum: bool,
}

impl Default for Attribution {
    fn default() -> Attribution {
        Attribution::new(Vec::new(), Vec::new(), true)
    }
}

impl Attribution {
    pub fn new(blind: Vec<(u64, u64)>, lossy: Vec<(u64, u64)>, keep_pieces: bool) -> Attribution {
        Attribution {
            by_cause: BTreeMap::new(),
            by_thread: BTreeMap::new(),
            waited_for: BTreeMap::new(),
            pieces: Vec::new(),
            unseen: 0,
            in_steps: BTreeMap::new(),
            steps: None,
            blind,
            lossy,
            keep_pieces,
            sums: Vec::new(),
            sum: true,
        }
    }

    /// The pieces alone, in time order, to be added to another attribution
    /// (or an account): nothing summed, no blind or lossy windows.
    pub fn pieces_only() -> Attribution {
        Attribution {
            sum: false,
            ..Attribution::new(Vec::new(), Vec::new(), true)
        }
    }

    /// Empties a [`Attribution::pieces_only`] for the next gap, keeping its
    /// buffer.
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.waited_for.clear();
    }

    /// Also tallies the idle inside `[a, b)`, the span of the run's steps,
    /// by cause: what the report compares with a step breakdown.
    pub fn within_steps(mut self, span: Option<(u64, u64)>) -> Attribution {
        self.steps = span;
        self
    }

    /// A gap's pieces, as [`Attribution::add`] would take them one by one.
    /// A gap has tens of pieces and a few causes: where no piece needs a
    /// window's split and none is kept, they are summed per cause and
    /// thread here first, and the maps touched once per sum (adding them
    /// one by one was a sixth of the streamed attribution's time).
    pub(crate) fn add_all(&mut self, pieces: impl IntoIterator<Item = Piece>) {
        if !self.sum || self.keep_pieces {
            return pieces.into_iter().for_each(|p| self.add(p));
        }
        let mut sums = std::mem::take(&mut self.sums);
        for p in pieces {
            if p.end <= p.start || self.meets_a_window(&p) {
                self.add(p);
                continue;
            }
            let (ns, inside) = (p.end - p.start, self.inside_steps(&p));
            match sums.iter_mut().find(|s| s.0 == p.cause && s.1 == p.thread) {
                Some(s) => (s.2, s.3) = (s.2 + ns, s.3 + inside),
                None => sums.push((p.cause, p.thread, ns, inside)),
            }
        }
        for (cause, thread, ns, inside) in sums.drain(..) {
            self.tally(cause, thread, ns, inside);
        }
        self.sums = sums;
    }

    /// Whether `p` has a part in a blind span, or one in a lossy window
    /// that its cause does not exempt it from.
    fn meets_a_window(&self, p: &Piece) -> bool {
        overlaps(&self.blind, p) || (!lossy_exempt(p.cause) && overlaps(&self.lossy, p))
    }

    /// A piece as the rules decided it: its parts in blind spans are
    /// unseen, its parts in lossy windows unattributed.
    pub(crate) fn add(&mut self, p: Piece) {
        if p.end <= p.start {
            return;
        }
        // Most pieces touch neither kind of window.
        if !self.meets_a_window(&p) {
            return self.record(p);
        }
        let exempt = lossy_exempt(p.cause);
        let blind = std::mem::take(&mut self.blind);
        split(&blind, p, |inside, part| {
            if inside {
                self.unseen += part.end - part.start;
            } else if exempt {
                self.record(part);
            } else {
                let lossy = std::mem::take(&mut self.lossy);
                split(&lossy, part, |inside, part| {
                    self.record(if inside {
                        Piece {
                            cause: Cause::Unattributed,
                            thread: None,
                            ..part
                        }
                    } else {
                        part
                    })
                });
                self.lossy = lossy;
            }
        });
        self.blind = blind;
    }

    fn record(&mut self, p: Piece) {
        if !self.sum {
            self.pieces.push(p);
            return;
        }
        self.tally(p.cause, p.thread, p.end - p.start, self.inside_steps(&p));
        if self.keep_pieces {
            self.pieces.push(p);
        }
    }

    /// `p`'s time inside the run's steps, if they are asked about.
    fn inside_steps(&self, p: &Piece) -> u64 {
        self.steps
            .map_or(0, |(a, b)| p.end.min(b).saturating_sub(p.start.max(a)))
    }

    /// `ns` of idle for `cause`, decided by `thread`, `inside` of it within
    /// the run's steps, into the sums.
    fn tally(&mut self, cause: Cause, thread: Option<Tid>, ns: u64, inside: u64) {
        *self.by_cause.entry(cause).or_default() += ns;
        if let Some(t) = thread {
            *self.by_thread.entry((cause, t)).or_default() += ns;
        }
        if inside > 0 {
            *self.in_steps.entry(cause).or_default() += inside;
        }
    }

    pub fn get(&self, c: Cause) -> u64 {
        self.by_cause.get(&c).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.by_cause.values().sum()
    }
}

/// Start-up follows from the GPU records alone, and unattributed is what a
/// lossy window would make a piece: neither is split by one.
fn lossy_exempt(c: Cause) -> bool {
    matches!(c, Cause::Startup | Cause::Unattributed)
}

/// Whether `p` meets any of `windows` (sorted, disjoint).
fn overlaps(windows: &[(u64, u64)], p: &Piece) -> bool {
    let first = windows.partition_point(|w| w.1 <= p.start);
    windows.get(first).is_some_and(|w| w.0 < p.end)
}

/// The parts of `p` outside and inside `windows` (sorted, disjoint), in
/// time order, each non-empty.
fn split(windows: &[(u64, u64)], p: Piece, mut part: impl FnMut(bool, Piece)) {
    let mut at = p.start;
    let first = windows.partition_point(|w| w.1 <= p.start);
    for &(ws, we) in windows[first..].iter().take_while(|w| w.0 < p.end) {
        let (s, e) = (ws.max(p.start), we.min(p.end));
        if s > at {
            part(
                false,
                Piece {
                    start: at,
                    end: s,
                    ..p
                },
            );
        }
        let s = s.max(at);
        if e > s {
            part(
                true,
                Piece {
                    start: s,
                    end: e,
                    ..p
                },
            );
        }
        at = at.max(e);
    }
    if at < p.end {
        part(false, Piece { start: at, ..p });
    }
}

pub fn attribute(inp: &Inputs) -> Attribution {
    let mut out = Attribution::new(inp.blind.to_vec(), inp.lossy.to_vec(), inp.keep_pieces)
        .within_steps(inp.steps);
    let (head, tail) = edges(inp.window, inp.busy);
    out.add(head);
    let fallback = main_feeder(inp.work);
    for w in inp.busy.windows(2) {
        attribute_gap(inp, w[0].1, w[1].0, fallback, &mut out);
    }
    if let Some(tail) = tail {
        out.add(tail);
    }
    out
}

/// Whether a window's edges are the job's own start-up and tear-down. A
/// window cut from a longer recording (the agent's) starts in the middle of
/// the job and, unless the job exited in it, stops there too: the idle
/// before its first work and after its last is a gap like any other, with
/// a feeder doing something meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edges {
    pub startup: bool,
    pub teardown: bool,
}

impl Edges {
    /// A whole job's recording: both edges are the job's.
    pub const JOB: Edges = Edges {
        startup: true,
        teardown: true,
    };

    pub fn of(session: &crate::session::Session) -> Edges {
        use crate::session::Mode;
        match session.header().mode {
            Mode::Window => Edges {
                startup: false,
                teardown: session
                    .footer
                    .as_ref()
                    .is_some_and(|f| f.reason == crate::session::StopReason::TargetExited),
            },
            // The profiler started with the job running; the trace's tail,
            // after its last GPU work, is the profiler stopping.
            Mode::KinetoWindow => Edges {
                startup: false,
                teardown: true,
            },
            Mode::Run | Mode::Attach | Mode::Kineto => Edges::JOB,
        }
    }

    /// The busy spans the rules walk: `busy` bounded by empty spans at the
    /// edges that are not start-up or tear-down, which makes the idle there
    /// a gap (ended by the window's first work, or by the window's end).
    pub fn bound(self, window: (u64, u64), busy: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let (lo, hi) = window;
        let mut out = Vec::with_capacity(busy.len() + 2);
        if !self.startup && busy.first().is_none_or(|b| b.0 > lo) {
            out.push((lo, lo));
        }
        out.extend_from_slice(busy);
        if !self.teardown && busy.last().is_none_or(|b| b.1 < hi) {
            out.push((hi, hi));
        }
        out
    }
}

/// The idle before a GPU's first work and after its last: start-up and
/// tear-down; a GPU that never worked is one unattributed span. (`busy`
/// bounded by [`Edges::bound`] makes these empty where they are not.)
pub(crate) fn edges(window: (u64, u64), busy: &[(u64, u64)]) -> (Piece, Option<Piece>) {
    let (lo, hi) = window;
    let edge = |start: u64, end: u64, cause: Cause| Piece {
        start,
        end,
        cause,
        thread: None,
    };
    match (busy.first(), busy.last()) {
        (Some(&(first, _)), Some(&(_, last))) => (
            edge(lo, first.max(lo), Cause::Startup),
            Some(edge(last.min(hi), hi, Cause::Teardown)),
        ),
        _ => (edge(lo, hi, Cause::Unattributed), None),
    }
}

/// The gap `[a, b)` between two busy spans, by what its feeder (the issuer
/// of the work that ended it, else `fallback`) was doing.
pub(crate) fn attribute_gap(
    inp: &Inputs,
    a: u64,
    b: u64,
    fallback: Option<Tid>,
    out: &mut Attribution,
) {
    // The work that ended the gap: the first item starting at b.
    let i = inp.work.partition_point(|x| x.start < b);
    let feeder = inp
        .work
        .get(i)
        .filter(|x| x.start == b)
        .and_then(|x| x.launch.map(|l| l.0))
        .or(fallback);
    match feeder {
        Some(f) => split_gap(inp, f, a, b, out),
        None => out.add(Piece {
            start: a,
            end: b,
            cause: Cause::Unattributed,
            thread: None,
        }),
    }
}

/// A launch or copy call of the feeder's over `[a, b)`: `cause`, except
/// where the feeder waited for a CPU inside it (preempted, or its CPU taken
/// by the hypervisor): that wait is no launch overhead or copy, and goes by
/// the rules for waiting (the loaders' CPUs, or contention). Beside a busy
/// hypervisor a launch-bound trainer lost 128 ms of 598 on a CPU to steal,
/// most of it inside its launches.
fn call_pieces(
    inp: &Inputs,
    feeder: Tid,
    a: u64,
    b: u64,
    cause: Cause,
    follow: bool,
    out: &mut Attribution,
) {
    let mut at = a;
    if let Some(tl) = inp.threads.get(&feeder) {
        for (s, e, state) in states_in(tl, a, b) {
            if matches!(state, State::Runnable | State::Stolen) {
                if s > at {
                    out.add(piece(at, s, cause, feeder));
                }
                let walk = Walk {
                    sync_left: None,
                    hops: 0,
                    follow,
                    feeder_pid: feeder.0,
                };
                thread_pieces(inp, feeder, s, e, walk, out);
                at = e;
            }
        }
    }
    if b > at {
        out.add(piece(at, b, cause, feeder));
    }
}

/// Intervals of `t` overlapping `[a, b)`, clipped to it; time the thread did
/// not exist in is left out (the caller fills it as unattributed).
fn states_in(t: &ThreadTimeline, a: u64, b: u64) -> impl Iterator<Item = (u64, u64, &State)> {
    intervals_in(t, a, b).map(|(s, e, x)| (s, e, &x.state))
}

/// The intervals of `t` overlapping `[a, b)`, clipped to it.
fn intervals_in(t: &ThreadTimeline, a: u64, b: u64) -> impl Iterator<Item = (u64, u64, &Interval)> {
    let iv = t.intervals.as_deref().unwrap_or(&[]);
    let i = iv.partition_point(|x| x.end <= a);
    iv[i..]
        .iter()
        .take_while(move |x| x.start < b)
        .map(move |x: &Interval| (x.start.max(a), x.end.min(b), x))
        .filter(|(s, e, _)| e > s)
}

/// CUDA calls of `t` overlapping `[a, b)`, clipped, with the gaps between them.
fn api_pieces(
    api: Option<&Vec<Call>>,
    a: u64,
    b: u64,
) -> impl Iterator<Item = (u64, u64, Option<ApiRole>)> + '_ {
    let spans = api.map_or(&[][..], Vec::as_slice);
    let i = spans.partition_point(|s| s.end <= a);
    let mut calls = spans[i..].iter().take_while(move |s| s.start < b);
    let mut cur = a;
    // A call's piece waits while the gap before it is handed out.
    let mut pending: Option<(u64, u64, Option<ApiRole>)> = None;
    std::iter::from_fn(move || loop {
        if let Some(p) = pending.take() {
            return Some(p);
        }
        let Some(s) = calls.next() else {
            let last = (cur < b).then_some((cur, b, None));
            cur = b;
            return last;
        };
        let (s0, s1) = (s.start.max(cur), s.end.min(b));
        let gap = (s0 > cur).then_some((cur, s0, None));
        pending = (s1 > s0).then_some((s0, s1, Some(s.role)));
        cur = if s1 > s0 { s1 } else { s0 };
        if gap.is_some() {
            return gap;
        }
    })
}

/// Did the feeder come out of a synchronize just as the GPU went idle? How
/// long it waited there: the GPU work that ran while it did, which the
/// host's next work could have overlapped had it not waited.
fn gap_opened_by_sync(api: Option<&Vec<Call>>, gap_start: u64) -> Option<u64> {
    let spans = api?;
    let i = spans.partition_point(|s| s.end < gap_start.saturating_sub(SYNC_SLACK_NS));
    spans[i..]
        .iter()
        .take_while(|s| s.start <= gap_start + SYNC_SLACK_NS)
        .filter(|s| s.role == ApiRole::Sync && s.end + SYNC_SLACK_NS >= gap_start)
        .map(|s| s.end - s.start)
        .max()
}

fn split_gap(inp: &Inputs, feeder: Tid, a: u64, b: u64, out: &mut Attribution) {
    let hides = gap_opened_by_sync(inp.api.get(&feeder), a);
    feeder_pieces(inp, feeder, a, b, hides, true, out);
}

/// What `feeder` did over `[a, b)`, GPU idle or not, by the same rules:
/// the account of its time a what-if replay rearranges (`analyze::replay`).
/// Its on-CPU time is host work (`cpu.host`) throughout: whether a gap
/// opened at a synchronize is the replay's to decide. Outside the GPU's
/// idle gaps and start-up a wait for another thread is not followed (that
/// thread's states there are not kept): an unattributed piece in its name
/// says whom the feeder waited on.
pub(crate) fn account(inp: &Inputs, feeder: Tid, a: u64, b: u64, out: &mut Attribution) {
    let busy = inp.busy;
    let mut at = a;
    // Start-up is an idle gap too: the feeder's first batch, and the CPUs
    // its loaders took from it meanwhile.
    if let Some(&(first, _)) = busy.first() {
        if at < first.min(b) {
            feeder_pieces(inp, feeder, at, first.min(b), None, true, out);
            at = first.min(b);
        }
    }
    // The gaps between busy spans, from the first ending after `a`.
    let first = busy.partition_point(|x| x.0 <= a).saturating_sub(1);
    let gaps = busy[first..].windows(2).map(|w| (w[0].1, w[1].0));
    for (s, e) in gaps.take_while(|x| x.0 < b).filter(|x| x.1 > a) {
        let (s, e) = (s.max(at), e.min(b));
        if s > at {
            feeder_pieces(inp, feeder, at, s, None, false, out);
        }
        if e > s {
            feeder_pieces(inp, feeder, s, e, None, true, out);
        }
        at = at.max(e);
    }
    if at < b {
        feeder_pieces(inp, feeder, at, b, None, false, out);
    }
}

/// `follow`: follow waits for other threads into what they did.
/// `sync_hides`: the gap opened as a synchronize returned, after waiting
/// this long for the GPU — up to that much of the feeder's own work after
/// it is what overlap would have hidden, `sync`; the rest outlasts the GPU
/// and is the work's own.
fn feeder_pieces(
    inp: &Inputs,
    feeder: Tid,
    a: u64,
    b: u64,
    sync_hides: Option<u64>,
    follow: bool,
    out: &mut Attribution,
) {
    let api = inp.api.get(&feeder);
    let sync_left = sync_hides.map(Cell::new);
    for (s, e, role) in api_pieces(api, a, b) {
        match role {
            Some(ApiRole::Launch) => call_pieces(inp, feeder, s, e, Cause::CpuLaunch, follow, out),
            Some(ApiRole::Sync) => sync_pieces(inp, feeder, s, e, follow, out),
            Some(ApiRole::Memory) => call_pieces(inp, feeder, s, e, Cause::Memory, follow, out),
            Some(ApiRole::Other) | None => {
                let walk = Walk {
                    sync_left: sync_left.as_ref(),
                    hops: 0,
                    follow,
                    feeder_pid: feeder.0,
                };
                thread_pieces(inp, feeder, s, e, walk, out);
            }
        }
    }
}

fn piece(start: u64, end: u64, cause: Cause, thread: Tid) -> Piece {
    Piece {
        start,
        end,
        cause,
        thread: Some(thread),
    }
}

/// How a thread's states are read.
#[derive(Clone, Copy)]
struct Walk<'a> {
    /// The gap opened as a synchronize returned: how much of the feeder's
    /// own work overlap would still have hidden (see [`feeder_pieces`]).
    sync_left: Option<&'a Cell<u64>>,
    /// Wakeup edges followed so far; 0 is the feeder itself.
    hops: usize,
    /// Follow a wait for another thread into what it did.
    follow: bool,
    /// The feeder's process: a loader waiting on it is waiting for work.
    feeder_pid: u32,
}

/// Attributes `[a, b)` by what thread `t` was doing.
fn thread_pieces(inp: &Inputs, t: Tid, a: u64, b: u64, walk: Walk, out: &mut Attribution) {
    let Walk {
        sync_left,
        hops,
        follow,
        feeder_pid,
    } = walk;
    let sync_left = sync_left.filter(|_| hops == 0);
    let Some(tl) = inp.threads.get(&t) else {
        match inp.ops.get(&t) {
            Some(ops) => op_pieces(Some(ops), t, a, b, sync_left, out),
            None => call_spacing(inp.api.get(&t), t, a, b, out),
        }
        return;
    };
    if let Some(unsettled) = inp.unsettled {
        if tl.closed_until() < b {
            unsettled.set(true);
        }
    }
    let mut cur = a;
    let mut previous: Option<&State> = None;
    // The feeder's work on a batch a loader just handed it (unpickling it,
    // rebuilding its tensors), up to its next CUDA call, is input work.
    let mut receiving = hops == 0 && handed_batch_before(inp, t, a);
    for (s, e, iv) in intervals_in(tl, a, b) {
        let state = &iv.state;
        if s > cur {
            before_birth(inp, tl, cur, s, walk, out);
        }
        let came_from = previous.take();
        previous = Some(state);
        if hops == 0 {
            if let State::Off(o) = state {
                receiving = hands_batch(inp, o, t).unwrap_or(receiving);
            }
        }
        // The feeder on a CPU: what code it ran, where its samples say.
        let code = match (state, inp.code) {
            (State::OnCpu, Some(c)) if hops == 0 => {
                // A sample just after the stretch may speak for it: not
                // settled until the thread has moved past that too.
                if let Some(unsettled) = inp.unsettled {
                    if tl.closed_until() < b.max(e).saturating_add(c.reach_ns()) {
                        unsettled.set(true);
                    }
                }
                // A stretch no sample speaks for (short ones between reads)
                // takes the code of the feeder's samples over the gap.
                tl.sample_times.as_deref().and_then(|samples| {
                    c.during(samples, s, e)
                        .or_else(|| c.during(samples, a.min(s), b.max(e)))
                })
            }
            _ => None,
        };
        let cause = match state {
            // A CPU taken from the feeder by the hypervisor or interrupts
            // is none of the job's doing.
            State::Stolen if hops == 0 => Some(Cause::CpuContention),
            // Loading input itself (num_workers=0: decoding, collating),
            // or taking a batch from the workers: input, even right after a
            // synchronize.
            State::OnCpu if code.is_some_and(|c| c.is_input()) => Some(Cause::InputCpu),
            // In a collective (gloo reducing, NCCL's host side polling):
            // waiting for the other ranks.
            State::OnCpu if code == Some(Code::In(Region::Collective)) => Some(Cause::Comm),
            // Code of its own after a batch arrived is not receiving it.
            State::OnCpu if code.is_some() => {
                own_work(s, e, t, sync_left, out);
                None
            }
            // Waiting for a CPU to do that work on is not the work: it
            // falls to the rules for waiting below (the loaders' CPUs, or
            // others').
            State::OnCpu if receiving => Some(Cause::InputCpu),
            State::OnCpu if hops == 0 => {
                own_work(s, e, t, sync_left, out);
                None
            }
            // A data worker on a CPU: inside file or socket syscalls it is
            // doing I/O, otherwise preprocessing.
            State::OnCpu => {
                io_split(inp, tl, s, e, t, out);
                None
            }
            // Waiting for a CPU: the job's own loaders holding them make
            // it an input cost; others, contention.
            State::Runnable if hops == 0 && follow => {
                held_by_loaders(inp, t, s, e, iv.cpu, out);
                None
            }
            State::Runnable if hops == 0 => Some(Cause::CpuContention),
            // A data worker waiting for a CPU (or whose CPU was taken):
            // right after its I/O completed that is the I/O's tail; after a
            // preemption, a CPU-bound loader.
            State::Runnable | State::Stolen => {
                Some(match came_from.or_else(|| state_before(tl, s)) {
                    Some(State::Off(o)) if o.kind == OffKind::File => Cause::InputIo,
                    Some(State::Off(o)) if o.kind == OffKind::Net => Cause::InputNetwork,
                    _ => Cause::InputCpu,
                })
            }
            // Blocked in a collective or point-to-point call, on a socket
            // to another rank or a futex of the process group's: waiting
            // for the other ranks, not for data.
            // Blocked in a server's request loop (accepting, reading the
            // next request): no work was offered.
            State::Off(o) if hops == 0 && blocked_in(inp, o, Region::Serve) => Some(Cause::Demand),
            State::Off(o) if hops == 0 && blocked_in(inp, o, Region::Collective) => {
                if let Some(peer) = peer_waited_for(inp, t, o, s, e) {
                    *out.waited_for.entry(peer).or_default() += e - s;
                }
                Some(Cause::Comm)
            }
            // Blocked on a connection it accepted, in code of no known
            // server: a client's next request, not data it went to fetch.
            State::Off(o) if hops == 0 && o.fd_kind == FdKind::SockAccepted => Some(Cause::Demand),
            State::Off(o) => match o.kind {
                OffKind::File => Some(Cause::InputIo),
                OffKind::Net => Some(Cause::InputNetwork),
                OffKind::Fault => Some(Cause::Memory),
                OffKind::Gpu if hops == 0 => Some(Cause::Sync),
                OffKind::Sleep if hops == 0 => Some(Cause::CpuHost),
                OffKind::Ipc => match o.waker {
                    Some(w) if !follow && w != t => {
                        out.add(piece(s, e, Cause::Unattributed, w));
                        None
                    }
                    Some(w)
                        if hops < MAX_HOPS
                            && w != t
                            && (hops == 0 || w.0 != feeder_pid)
                            && inp.threads.contains_key(&w) =>
                    {
                        let next = Walk {
                            sync_left: None,
                            hops: hops + 1,
                            ..walk
                        };
                        thread_pieces(inp, w, s, e, next, out);
                        None
                    }
                    // A loader with nothing to do (waiting for the feeder's
                    // next request, or for a thread out of reach) is not
                    // what the feeder waits for: its siblings, working, are
                    // (DataLoader's workers share one result queue, and the
                    // one whose batch woke the feeder need not be the one
                    // it waited for).
                    _ if hops > 0 => {
                        siblings_pieces(inp, t, feeder_pid, s, e, out);
                        None
                    }
                    _ => Some(Cause::Unattributed),
                },
                _ => Some(Cause::Unattributed),
            },
        };
        if let Some(c) = cause {
            out.add(piece(s, e, c, t));
        }
        cur = e;
    }
    if cur < b {
        out.add(piece(cur, b, Cause::Unattributed, t));
    }
}

/// The feeder's own work over `[s, e)`: `cpu.host`, except the part a
/// synchronize just before it kept from overlapping the GPU's (`sync`).
fn own_work(s: u64, e: u64, t: Tid, sync_left: Option<&Cell<u64>>, out: &mut Attribution) {
    let hidden = sync_left.map_or(0, |left| {
        let n = left.get().min(e - s);
        left.set(left.get() - n);
        n
    });
    if hidden > 0 {
        out.add(piece(s, s + hidden, Cause::Sync, t));
    }
    if s + hidden < e {
        out.add(piece(s + hidden, e, Cause::CpuHost, t));
    }
}

/// `[a, b)` before thread `tl` existed. A waker that was not born yet
/// delivered work its creator was doing meanwhile — Python's
/// multiprocessing queue starts its feeder thread at the first `put`, so
/// the first batch of each DataLoader worker reaches the trainer through a
/// thread born as the batch was done: before that the worker made it. The
/// feeder's own time, and a creator in the feeder's process (it forked a
/// worker), stay unattributed.
fn before_birth(
    inp: &Inputs,
    tl: &ThreadTimeline,
    a: u64,
    b: u64,
    walk: Walk,
    out: &mut Attribution,
) {
    let t = (tl.pid, tl.tid);
    match tl.creator {
        Some(c)
            if walk.hops > 0
                && walk.hops < MAX_HOPS
                && b <= tl.start
                && c != t
                && c.0 != walk.feeder_pid
                && inp.threads.contains_key(&c) =>
        {
            let next = Walk {
                hops: walk.hops + 1,
                ..walk
            };
            thread_pieces(inp, c, a, b, next, out);
        }
        _ => out.add(piece(a, b, Cause::Unattributed, t)),
    }
}

/// `[a, b)` of a thread known only by its host ops: the innermost op's
/// cause; no op at all → unattributed.
fn op_pieces(
    ops: Option<&Vec<(u64, u64, Cause)>>,
    t: Tid,
    a: u64,
    b: u64,
    sync_left: Option<&Cell<u64>>,
    out: &mut Attribution,
) {
    let mut cur = a;
    if let Some(ops) = ops {
        let i = ops.partition_point(|x| x.1 <= a);
        for &(s, e, c) in ops[i..].iter().take_while(|x| x.0 < b) {
            let (s, e) = (s.max(cur), e.min(b));
            if e <= s {
                continue;
            }
            if s > cur {
                out.add(piece(cur, s, Cause::Unattributed, t));
            }
            if c == Cause::CpuHost {
                own_work(s, e, t, sync_left, out);
            } else {
                out.add(piece(s, e, c, t));
            }
            cur = e;
        }
    }
    if cur < b {
        out.add(piece(cur, b, Cause::Unattributed, t));
    }
}

/// Between two CUDA calls of a thread this close, it was running host code.
pub const CALL_SPACING_NS: u64 = 1_000_000;

/// A call that asks whether work is done without waiting for it: a loop of
/// them is a wait.
fn polls(c: &Call) -> bool {
    let n = c.name.name();
    n.contains("EventQuery") || n.contains("StreamQuery")
}

/// `[a, b)` of a thread a trace shows only by its CUDA calls (no ops, no
/// states): inside or between polling calls it waited for the GPU
/// (`sync`); between calls at most [`CALL_SPACING_NS`] apart it ran host
/// code (`cpu.host`); longer silences stay unattributed.
fn call_spacing(calls: Option<&Vec<Call>>, t: Tid, a: u64, b: u64, out: &mut Attribution) {
    let calls = calls.map_or(&[][..], Vec::as_slice);
    let mut cur = a;
    while cur < b {
        // The last call starting at or before `cur`, and the next one.
        let i = calls.partition_point(|c| c.start <= cur);
        let prev = i.checked_sub(1).map(|j| &calls[j]);
        let next = calls.get(i);
        let end = next.map_or(b, |n| n.start.min(b));
        let cause = match (prev, next) {
            (Some(p), _) if p.end > cur && polls(p) => Cause::Sync,
            (Some(p), _) if p.end > cur => Cause::Unattributed,
            (Some(p), Some(n)) if polls(p) && polls(n) => Cause::Sync,
            (Some(p), Some(n)) if n.start - p.end <= CALL_SPACING_NS => Cause::CpuHost,
            _ => Cause::Unattributed,
        };
        // Inside a call: up to its end; between calls: up to the next.
        let end = match prev {
            Some(p) if p.end > cur => p.end.min(b),
            _ => end,
        };
        // `end > cur`: a call starting after `cur`, or one ending after it.
        out.add(piece(cur, end, cause, t));
        cur = end;
    }
}

/// Whether a thread blocked in a region's code, as its stack then says.
fn blocked_in(inp: &Inputs, o: &OffCpu, region: Region) -> bool {
    inp.code
        .and_then(|c| c.of_stack(o.ustack))
        .is_some_and(|c| c == Code::In(region))
}

/// The other process of the job a thread blocked in a collective over
/// `[s, e)` was waiting for: the one whose thread woke it, or woke the
/// thread of its own process that woke it (gloo's and NCCL's own threads
/// do the waiting on the network), up to three wakeups back.
fn peer_waited_for(inp: &Inputs, t: Tid, o: &OffCpu, s: u64, e: u64) -> Option<u32> {
    let peer = |w: Tid| (w.0 != t.0 && inp.processes.contains_key(&w.0)).then_some(w.0);
    let mut w = o.waker?;
    for _ in 0..3 {
        if w.0 != t.0 {
            return peer(w);
        }
        // A thread of its own: the latest wakeup of it from another rank,
        // else the latest by another of its own threads, to follow.
        let tl = inp.threads.get(&w)?;
        let mut wakers: Vec<Tid> = states_in(tl, s, e)
            .filter_map(|(_, _, st)| match st {
                State::Off(x) => x.waker.filter(|&k| k != w && k != t),
                _ => None,
            })
            .collect();
        wakers.reverse();
        if let Some(p) = wakers.iter().find_map(|&k| peer(k)) {
            return Some(p);
        }
        w = *wakers.first()?;
    }
    None
}

/// What a named host op (from a trace) means for the GPU waiting on it,
/// given its region of code ([`super::code::Rules::op`]): an input region's
/// op (the DataLoader's iterator, a user's range named as input) is input
/// of a kind the trace cannot tell; a collective's op (`nccl:all_reduce`,
/// `c10d::allreduce_`) is waiting for the other ranks; a read of a result
/// from the GPU is a sync; anything else the host's own work.
pub fn op_cause(name: &str, region: Option<Region>) -> Cause {
    if region.is_some_and(Region::is_input) {
        Cause::InputUnknown
    } else if region == Some(Region::Collective) {
        Cause::Comm
    } else if name == "aten::item"
        || name == "aten::_local_scalar_dense"
        || name.contains("synchronize")
    {
        Cause::Sync
    } else {
        Cause::CpuHost
    }
}

/// Nested ops to disjoint segments, the innermost (latest started) op
/// deciding each.
pub fn flatten_ops(mut ops: Vec<(u64, u64, Cause)>) -> Vec<(u64, u64, Cause)> {
    ops.retain(|o| o.1 > o.0);
    ops.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out: Vec<(u64, u64, Cause)> = Vec::new();
    let mut stack: Vec<(u64, Cause)> = Vec::new(); // (end, cause)
    let mut cur = 0u64;
    let emit = |from: u64, to: u64, c: Cause, out: &mut Vec<(u64, u64, Cause)>| {
        if to > from {
            match out.last_mut() {
                Some(l) if l.1 == from && l.2 == c => l.1 = to,
                _ => out.push((from, to, c)),
            }
        }
    };
    for (s, e, c) in ops {
        // Close ops that end before this one starts.
        while let Some(&(end, top)) = stack.last() {
            if end > s {
                break;
            }
            emit(cur, end, top, &mut out);
            cur = cur.max(end);
            stack.pop();
        }
        if let Some(&(_, top)) = stack.last() {
            emit(cur, s, top, &mut out);
        }
        cur = cur.max(s);
        // An op overrunning its parent (clock jitter) is clipped to it.
        let e = stack.last().map_or(e, |&(pe, _)| e.min(pe));
        // Inside the DataLoader's op the trainer is loading input, whatever
        // op it runs and at any depth (num_workers=0: transforms and
        // collation as ops), as the TensorBoard plugin counts it.
        let c = match stack.last() {
            Some(&(_, Cause::InputUnknown)) => Cause::InputUnknown,
            _ => c,
        };
        stack.push((e, c));
    }
    while let Some((end, top)) = stack.pop() {
        emit(cur, end, top, &mut out);
        cur = cur.max(end);
    }
    out
}

/// `[a, b)` of a loader `t` that was waiting, by what the threads of its
/// sibling loaders (the other processes named as its own, the feeder's
/// aside) did meanwhile:
/// reading files `input.io`, receiving `input.network`, on a CPU or waiting
/// for one `input.cpu`, each in proportion; the rest (nobody working)
/// unattributed.
fn siblings_pieces(inp: &Inputs, t: Tid, feeder_pid: u32, a: u64, b: u64, out: &mut Attribution) {
    // A process is named by its main thread (its other threads, a queue's
    // feeder say, have names of their own), and kin by its parent too:
    // another rank's processes under one launcher are named alike.
    let kin = |pid: u32| {
        let name = inp.threads.get(&(pid, pid)).map(|x| x.comm.as_str());
        name.map(|n| (inp.processes.get(&pid).map(|p| p.ppid), n))
    };
    let Some(family) = kin(t.0) else {
        out.add(piece(a, b, Cause::Unattributed, t));
        return;
    };
    // ns by cause, and the thread that did most of it.
    let mut by: BTreeMap<Cause, (u64, Option<(u64, Tid)>)> = BTreeMap::new();
    for (&k, tl) in inp.threads {
        if k.0 == t.0 || k.0 == feeder_pid || kin(k.0) != Some(family) {
            continue;
        }
        let tally = io_tally(inp, k);
        for (s, e, state) in states_in(tl, a, b) {
            let len = e - s;
            // (moving data through files, through sockets, computing)
            let (io, network, cpu) = match state {
                // On a CPU: moving data or computing, as its samples say.
                State::OnCpu => tally.split(len),
                State::Runnable => (0, 0, len),
                State::Off(o) if o.kind == OffKind::File => (len, 0, 0),
                State::Off(o) if o.kind == OffKind::Net => (0, len, 0),
                _ => continue,
            };
            let parts = [
                (Cause::InputIo, io),
                (Cause::InputNetwork, network),
                (Cause::InputCpu, cpu),
            ];
            for (cause, ns) in parts.into_iter().filter(|x| x.1 > 0) {
                let x = by.entry(cause).or_default();
                x.0 += ns;
                if x.1.is_none_or(|(n, _)| n < ns) {
                    x.1 = Some((ns, k));
                }
            }
        }
    }
    // Several siblings at once count once: shares of the span.
    let busy: u64 = by.values().map(|x| x.0).sum();
    let len = b - a;
    let mut at = a;
    for (cause, (ns, who)) in by {
        let part = (ns as u128 * len.min(busy) as u128 / busy.max(1) as u128) as u64;
        let who = who.map_or(t, |x| x.1);
        out.add(piece(at, at + part, cause, who));
        at += part;
    }
    out.add(piece(at, b, Cause::Unattributed, t));
}

/// `[a, b)` inside a synchronize: `sync`, except where the feeder, the GPU
/// done, waits for a CPU to return on — that is whoever holds the CPUs'
/// (see [`held_by_loaders`]).
fn sync_pieces(inp: &Inputs, t: Tid, a: u64, b: u64, follow: bool, out: &mut Attribution) {
    let Some(tl) = inp.threads.get(&t).filter(|_| follow) else {
        out.add(piece(a, b, Cause::Sync, t));
        return;
    };
    let mut cur = a;
    for (s, e, iv) in intervals_in(tl, a, b) {
        if iv.state == State::Runnable {
            if s > cur {
                out.add(piece(cur, s, Cause::Sync, t));
            }
            held_by_loaders(inp, t, s, e, iv.cpu, out);
            cur = e;
        }
    }
    if cur < b {
        out.add(piece(cur, b, Cause::Sync, t));
    }
}

/// What a wait of the feeder says about the batch it may be receiving:
/// handed over by another process of the job → `Some(true)` (a loader,
/// its descendant, or a data service the launcher started beside it: other
/// ranks do not hand a trainer work through pipes and queues); a handoff
/// inside its own process (the GIL, a lock) says nothing → `None`;
/// anything else ends the receiving → `Some(false)`.
fn hands_batch(inp: &Inputs, o: &OffCpu, t: Tid) -> Option<bool> {
    match o.waker {
        Some(w) if o.kind == OffKind::Ipc && w.0 == t.0 => None,
        Some(w) if o.kind == OffKind::Ipc => Some(inp.threads.contains_key(&w)),
        _ => Some(false),
    }
}

/// Whether process `pid` descends from process `ancestor`: a feeder's
/// loaders do (DataLoader's workers are its children, or a forkserver's),
/// other processes of the job — another rank under the same launcher, the
/// launcher — do not.
fn descends_from(inp: &Inputs, pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    // Bounded: a pid reused within the recording could make a cycle.
    for _ in 0..32 {
        match inp.processes.get(&p).map(|x| x.ppid) {
            Some(parent) if parent == ancestor => return true,
            Some(parent) if parent > 1 && parent != p => p = parent,
            _ => return false,
        }
    }
    false
}

/// Was `t` handed a batch by another process since its last CUDA call
/// before `at`, and busy with it since?
fn handed_batch_before(inp: &Inputs, t: Tid, at: u64) -> bool {
    let Some(iv) = inp.threads.get(&t).and_then(|tl| tl.intervals.as_deref()) else {
        return false;
    };
    let since = inp.api.get(&t).map_or(0, |calls| {
        let i = calls.partition_point(|c| c.start < at);
        // The last few: a runtime call and the driver calls nested in it.
        calls[..i]
            .iter()
            .rev()
            .take(8)
            .map(|c| c.end)
            .max()
            .unwrap_or(0)
    });
    let i = iv.partition_point(|x| x.start < at);
    for x in iv[..i].iter().rev().take_while(|x| x.end > since) {
        if let State::Off(o) = &x.state {
            if let Some(handed) = hands_batch(inp, o, t) {
                return handed;
            }
        }
    }
    false
}

/// The feeder waiting for CPU `waited_for` over `[a, b)` (its runnable
/// interval's): as long as its loaders (the processes descending from its
/// own) held that CPU it is `input.cpu`, the rest `cpu.contention` —
/// whoever else held it, of the job or not. Loaders busy on other CPUs kept
/// it from nothing (on a node of many CPUs they nearly always are). Where
/// the recording does not say which CPU ([`NO_CPU`]), their time on any
/// CPU counts.
fn held_by_loaders(inp: &Inputs, t: Tid, a: u64, b: u64, waited_for: u16, out: &mut Attribution) {
    let own: u64 = inp
        .threads
        .iter()
        .filter(|(k, _)| descends_from(inp, k.0, t.0))
        .flat_map(|(_, tl)| intervals_in(tl, a, b))
        .filter(|x| x.2.state == State::OnCpu)
        .filter(|x| waited_for == NO_CPU || x.2.cpu == waited_for)
        .map(|x| x.1 - x.0)
        .sum();
    let loaders = own.min(b - a);
    out.add(piece(a, a + loaders, Cause::InputCpu, t));
    out.add(piece(a + loaders, b, Cause::CpuContention, t));
}

/// The state a thread was in just before `ts`.
fn state_before(t: &ThreadTimeline, ts: u64) -> Option<&State> {
    let iv = t.intervals.as_ref()?;
    let i = iv.partition_point(|x| x.end <= ts);
    i.checked_sub(1).map(|i| &iv[i].state)
}

/// A data worker's on-CPU time `[a, b)`: input.io or input.network inside
/// its file or socket syscalls, input.cpu outside them. Where its syscalls
/// were not recorded, in the shares its cpu-clock samples found it in each.
fn io_split(inp: &Inputs, t: &ThreadTimeline, a: u64, b: u64, tid: Tid, out: &mut Attribution) {
    let spans = t.io_spans.as_deref().unwrap_or(&[]);
    if spans.is_empty() {
        sampled_split(inp, a, b, tid, out);
        return;
    }
    let mut cur = a;
    let i = spans.partition_point(|x| x.1 <= a);
    for &(s, e, kind) in spans[i..].iter().take_while(|x| x.0 < b) {
        let (s, e) = (s.max(cur), e.min(b));
        if e <= s {
            continue;
        }
        if s > cur {
            out.add(piece(cur, s, Cause::InputCpu, tid));
        }
        let cause = if kind == OffKind::Net {
            Cause::InputNetwork
        } else {
            Cause::InputIo
        };
        out.add(piece(s, e, cause, tid));
        cur = e;
    }
    if cur < b {
        out.add(piece(cur, b, Cause::InputCpu, tid));
    }
}

fn io_tally(inp: &Inputs, t: Tid) -> IoTally {
    inp.io_tally.get(&t).copied().unwrap_or_default()
}

/// A loader's time on a CPU `[a, b)` split by where its samples found it:
/// moving data through files (`input.io`), through network sockets
/// (`input.network`), or computing (`input.cpu`).
fn sampled_split(inp: &Inputs, a: u64, b: u64, tid: Tid, out: &mut Attribution) {
    let (file, net, _) = io_tally(inp, tid).split(b - a);
    out.add(piece(a, a + file, Cause::InputIo, tid));
    out.add(piece(a + file, a + file + net, Cause::InputNetwork, tid));
    out.add(piece(a + file + net, b, Cause::InputCpu, tid));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{FdKind, SwitchOut};
    use crate::timeline::gpu::CallName;

    #[test]
    fn a_gaps_pieces_added_at_once_sum_as_added_one_by_one() {
        let mut rng = crate::testing::Rng::new(0x853c_49e6_748f_ea9b);
        let mut rand = |n: u64| rng.below(n);
        let causes = [
            Cause::InputCpu,
            Cause::InputIo,
            Cause::Sync,
            Cause::Startup,
            Cause::Unattributed,
        ];
        for round in 0..200 {
            // Some rounds with windows that split pieces, some without.
            let mut windows = |k: u64| {
                let mut at = rand(100);
                (0..rand(k))
                    .map(|_| {
                        let w = (at, at + 1 + rand(40));
                        at = w.1 + 1 + rand(200);
                        w
                    })
                    .collect::<Vec<_>>()
            };
            let (blind, lossy) = match round % 2 {
                0 => (Vec::new(), Vec::new()),
                _ => (windows(4), windows(4)),
            };
            let steps = (rand(3) > 0).then(|| (rand(300), 300 + rand(700)));
            let mut at = 0u64;
            let pieces: Vec<Piece> = (0..rand(60))
                .map(|_| {
                    let start = at.saturating_sub(rand(5));
                    at = start + rand(30);
                    Piece {
                        start,
                        end: at,
                        cause: causes[rand(5) as usize],
                        thread: [None, Some((1, 1)), Some((1, 2))][rand(3) as usize],
                    }
                })
                .collect();
            let mut one = Attribution::new(blind.clone(), lossy.clone(), false).within_steps(steps);
            let mut all = Attribution::new(blind, lossy, false).within_steps(steps);
            pieces.iter().for_each(|&p| one.add(p));
            all.add_all(pieces.iter().copied());
            assert_eq!(
                (&one.by_cause, &one.by_thread, &one.in_steps, one.unseen),
                (&all.by_cause, &all.by_thread, &all.in_steps, all.unseen),
                "round {round}: {pieces:?}"
            );
        }
    }

    fn call(start: u64, end: u64, role: ApiRole) -> Call {
        Call {
            start,
            end,
            role,
            name: CallName::Api(gapscope_wire::ApiDomain::Runtime, 0),
            correlation: None,
        }
    }

    const FEEDER: Tid = (10, 10);
    const WORKER: Tid = (20, 20);
    const WORKER2: Tid = (30, 30);

    fn out(kind_syscall: i32, fd_kind: FdKind) -> SwitchOut {
        SwitchOut {
            pid: 0,
            tid: 0,
            state: 1,
            preempted: false,
            ustack: 0,
            kstack: 0,
            syscall: Some(kind_syscall),
            fd: 3,
            fd_kind,
            next: (0, 0),
        }
    }

    const READ: i32 = 0;
    const FUTEX: i32 = 202;

    /// A thread built from (time, event) steps.
    enum Step {
        /// Switched in, the CPU not recorded.
        In,
        InOn(u16),
        Block(i32, FdKind),
        Preempt,
        /// Blocks on a futex, the kernel having charged its run this much.
        BlockCharged(u64),
        Wake(Tid),
    }

    fn thread(t: Tid, steps: &[(u64, Step)], end: u64) -> ThreadTimeline {
        let mut th = ThreadTimeline::forked(t.0, t.1, 0, true);
        for (ts, s) in steps {
            match s {
                Step::In => th.switch_in(*ts, NO_CPU),
                Step::InOn(cpu) => th.switch_in(*ts, *cpu),
                Step::Block(nr, k) => th.switch_out(*ts, &out(*nr, *k), None),
                Step::Preempt => {
                    let mut o = out(READ, FdKind::None);
                    o.preempted = true;
                    th.switch_out(*ts, &o, None)
                }
                Step::BlockCharged(ns) => th.switch_out(*ts, &out(FUTEX, FdKind::None), Some(*ns)),
                Step::Wake(w) => th.wakeup(*ts, *w),
            }
        }
        th.finish(end);
        th
    }

    /// Every process other than the feeder's is its child (a loader).
    fn run(
        busy: &[(u64, u64)],
        work: &[(u64, Option<Tid>)],
        threads: Vec<ThreadTimeline>,
        api: BTreeMap<Tid, Vec<Call>>,
        window: (u64, u64),
    ) -> Attribution {
        run_with_parents(busy, work, threads, api, window, &[], &HashMap::new())
    }

    /// `parents`: (pid, parent) where a process is not the feeder's child;
    /// `io_tally`: where threads' samples found them.
    fn run_with_parents(
        busy: &[(u64, u64)],
        work: &[(u64, Option<Tid>)],
        threads: Vec<ThreadTimeline>,
        api: BTreeMap<Tid, Vec<Call>>,
        window: (u64, u64),
        parents: &[(u32, u32)],
        io_tally: &HashMap<Tid, IoTally>,
    ) -> Attribution {
        let threads: BTreeMap<Tid, ThreadTimeline> =
            threads.into_iter().map(|t| ((t.pid, t.tid), t)).collect();
        let processes: BTreeMap<u32, ProcessTimeline> = threads
            .keys()
            .map(|&(pid, _)| {
                let ppid = parents
                    .iter()
                    .find(|x| x.0 == pid)
                    .map_or(if pid == FEEDER.0 { 1 } else { FEEDER.0 }, |x| x.1);
                let p = ProcessTimeline {
                    pid,
                    ppid,
                    ..Default::default()
                };
                (pid, p)
            })
            .collect();
        let ops = HashMap::new();
        // Only when each item started and who launched it are read.
        let work: Vec<crate::timeline::gpu::Work> = work
            .iter()
            .map(|&(start, by)| crate::timeline::gpu::Work {
                start,
                end: start,
                launch: by.map(|t| (t, start)),
                pid: by.map_or(0, |t| t.0),
                device: 0,
                stream: 0,
                correlation: 0,
                what: crate::timeline::gpu::What::Memset { bytes: 0 },
            })
            .collect();
        let a = attribute(&Inputs {
            window,
            busy,
            work: &work,
            threads: &threads,
            processes: &processes,
            io_tally,
            api: &api,
            ops: &ops,
            code: None,
            blind: &[],
            lossy: &[],
            keep_pieces: true,
            steps: None,
            unsettled: None,
        });
        let busy_total: u64 = busy.iter().map(|(s, e)| e - s).sum();
        assert_eq!(
            a.total() + busy_total,
            window.1 - window.0,
            "Σ causes = idle"
        );
        a
    }

    #[test]
    fn feeder_waiting_on_a_worker_that_reads_files_is_input_io() {
        // GPU: busy 100-200, idle 200-500, busy 500-600.
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (200, Step::Block(READ, FdKind::Pipe)),
                (480, Step::Wake(WORKER)),
                (490, Step::In),
            ],
            1000,
        );
        // The worker reads a file 150-400, decodes 400-480.
        let worker = thread(
            WORKER,
            &[
                (0, Step::In),
                (150, Step::Block(READ, FdKind::File)),
                (390, Step::Wake((0, 0))),
                (400, Step::In),
            ],
            1000,
        );
        let a = run(
            &[(100, 200), (500, 600)],
            &[(100, Some(FEEDER)), (500, Some(FEEDER))],
            vec![feeder, worker],
            BTreeMap::new(),
            (0, 1000),
        );
        assert_eq!(a.get(Cause::Startup), 100);
        assert_eq!(a.get(Cause::Teardown), 400);
        // 200-390 reading, and 390-400 runnable right after the read: its tail.
        assert_eq!(a.get(Cause::InputIo), 200);
        // Worker on-CPU 400-480; then the feeder, handed the batch, waits
        // for a CPU 480-490 and works on it 490-500: input work too.
        assert_eq!(a.get(Cause::InputCpu), 80 + 20);
        assert_eq!(a.get(Cause::CpuContention), 0);
        assert_eq!(a.get(Cause::CpuHost), 0);
        assert_eq!(a.get(Cause::Unattributed), 0);
    }

    /// Syscalls not hooked: a worker's time on a CPU is moving data or
    /// computing in the shares its samples found it in each.
    #[test]
    fn a_workers_cpu_time_splits_as_its_samples_found_it() {
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (200, Step::Block(READ, FdKind::Pipe)),
                (480, Step::Wake(WORKER)),
                (480, Step::In),
            ],
            1000,
        );
        // On a CPU 100-480: three samples of four inside reads of files.
        let worker = thread(
            WORKER,
            &[(0, Step::Block(FUTEX, FdKind::None)), (100, Step::In)],
            1000,
        );
        let tally = IoTally {
            samples: 4,
            file: 3,
            net: 0,
        };
        let a = run_with_parents(
            &[(100, 200), (480, 600)],
            &[(100, Some(FEEDER)), (480, Some(FEEDER))],
            vec![feeder, worker],
            BTreeMap::new(),
            (0, 1000),
            &[],
            &HashMap::from([(WORKER, tally)]),
        );
        // The 280 of the gap: 210 reading, 70 decoding.
        assert_eq!(a.get(Cause::InputIo), 210);
        assert_eq!(a.get(Cause::InputCpu), 70);
    }

    /// Preempted inside a launch (390-400) and a copy (320-330): those
    /// waits for a CPU are contention, the rest of each call its own.
    #[test]
    fn waits_for_a_cpu_inside_a_call_are_not_the_call() {
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (320, Step::Preempt),
                (330, Step::In),
                (390, Step::Preempt),
                (400, Step::In),
            ],
            1000,
        );
        let api = BTreeMap::from([(
            FEEDER,
            vec![
                call(300, 350, ApiRole::Memory),
                call(380, 420, ApiRole::Launch),
            ],
        )]);
        let a = run(
            &[(100, 300), (420, 500)],
            &[(420, Some(FEEDER))],
            vec![feeder],
            api,
            (100, 500),
        );
        assert_eq!(a.get(Cause::Memory), 40);
        assert_eq!(a.get(Cause::CpuLaunch), 30);
        assert_eq!(a.get(Cause::CpuContention), 10 + 10);
        assert_eq!(a.get(Cause::CpuHost), 30);
    }

    #[test]
    fn launch_sync_and_memory_calls_name_their_causes() {
        let feeder = thread(FEEDER, &[(0, Step::In)], 1000);
        let api = BTreeMap::from([(
            FEEDER,
            vec![
                call(150, 220, ApiRole::Sync),
                call(300, 350, ApiRole::Memory),
                call(380, 420, ApiRole::Launch),
            ],
        )]);
        let a = run(
            &[(100, 200), (420, 500)],
            &[(420, Some(FEEDER))],
            vec![feeder],
            api,
            (100, 500),
        );
        // Gap 200-420: sync 200-220; host 220-300 after a sync that waited
        // 70: its first 70 overlap would have hidden → sync, the 10 past
        // them host; memcpy 300-350; host 350-380, past what the sync could
        // hide → host; launch 380-420.
        assert_eq!(a.get(Cause::Sync), 20 + 70);
        assert_eq!(a.get(Cause::Memory), 50);
        assert_eq!(a.get(Cause::CpuLaunch), 40);
        assert_eq!(a.get(Cause::CpuHost), 10 + 30);
    }

    #[test]
    fn a_wakeup_chain_across_two_processes_is_followed() {
        // feeder waits on worker (pipe) who waits on worker2 (socket pair,
        // unix = ipc), who is receiving from the network.
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (100, Step::Block(READ, FdKind::Pipe)),
                (300, Step::Wake(WORKER)),
                (300, Step::In),
            ],
            400,
        );
        let worker = thread(
            WORKER,
            &[
                (0, Step::In),
                (50, Step::Block(READ, FdKind::SockUnix)),
                (290, Step::Wake(WORKER2)),
                (290, Step::In),
            ],
            400,
        );
        let worker2 = thread(
            WORKER2,
            &[
                (0, Step::In),
                (60, Step::Block(READ, FdKind::SockInet)),
                (280, Step::Wake((1, 1))),
                (280, Step::In),
            ],
            400,
        );
        let a = run(
            &[(0, 100), (300, 400)],
            &[(300, Some(FEEDER))],
            vec![feeder, worker, worker2],
            BTreeMap::new(),
            (0, 400),
        );
        assert_eq!(a.get(Cause::InputNetwork), 180); // worker2 receiving 100-280
        assert_eq!(a.get(Cause::InputCpu), 20); // worker2 280-290 + worker 290-300
    }

    #[test]
    fn runnable_feeder_is_contention_and_unknown_waits_are_unattributed() {
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (100, Step::Preempt),
                (150, Step::In),
                (160, Step::Block(FUTEX, FdKind::None)),
                (190, Step::Wake((99, 99))),
                (190, Step::In),
            ],
            300,
        );
        let a = run(
            &[(0, 100), (200, 300)],
            &[(200, Some(FEEDER))],
            vec![feeder],
            BTreeMap::new(),
            (0, 300),
        );
        assert_eq!(a.get(Cause::CpuContention), 50);
        assert_eq!(a.get(Cause::CpuHost), 10 + 10);
        assert_eq!(a.get(Cause::Unattributed), 30); // woken by an untracked thread
    }

    /// The part of the feeder's run the kernel did not charge it for (the
    /// hypervisor took the CPU) is contention, not its host work.
    #[test]
    fn a_cpu_taken_from_the_feeder_is_contention() {
        const MS: u64 = 1_000_000;
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (200 * MS, Step::BlockCharged(160 * MS)),
                (250 * MS, Step::Wake((99, 99))),
                (250 * MS, Step::In),
            ],
            300 * MS,
        );
        let a = run(
            &[(0, 100 * MS), (250 * MS, 300 * MS)],
            &[(250 * MS, Some(FEEDER))],
            vec![feeder],
            BTreeMap::new(),
            (0, 300 * MS),
        );
        // The 40 ms taken are laid over the 200 ms run: 20 ms of them fall
        // in the GPU's idle 100–200 ms.
        assert_eq!(a.get(Cause::CpuHost), 80 * MS);
        assert_eq!(a.get(Cause::CpuContention), 20 * MS);
        assert_eq!(a.get(Cause::Unattributed), 50 * MS);
    }

    /// Waiting for a CPU the feeder's own loader holds is an input cost; for
    /// one nobody recorded holds, contention — and for one a process of the
    /// job holds that does not descend from the feeder's (its sibling:
    /// another rank under one launcher), contention too.
    #[test]
    fn a_cpu_held_by_the_jobs_loader_is_input_not_contention() {
        let feeder = thread(
            FEEDER,
            &[(0, Step::In), (100, Step::Preempt), (180, Step::In)],
            300,
        );
        // The loader runs 90-150: it holds the CPU for 50 of the 80.
        let worker = thread(
            WORKER,
            &[
                (0, Step::Block(FUTEX, FdKind::None)),
                (90, Step::Wake((0, 0))),
                (90, Step::In),
                (150, Step::Block(FUTEX, FdKind::None)),
            ],
            300,
        );
        let attribute = |threads: Vec<ThreadTimeline>, parents: &[(u32, u32)]| {
            run_with_parents(
                &[(0, 100), (200, 300)],
                &[(200, Some(FEEDER))],
                threads,
                BTreeMap::new(),
                (0, 300),
                parents,
                &HashMap::new(),
            )
        };
        let a = attribute(vec![feeder.clone(), worker.clone()], &[]);
        assert_eq!(a.get(Cause::InputCpu), 50);
        assert_eq!(a.get(Cause::CpuContention), 30);
        assert_eq!(a.get(Cause::CpuHost), 20);
        // Its sibling: both children of pid 5.
        let a = attribute(
            vec![feeder.clone(), worker.clone()],
            &[(FEEDER.0, 5), (WORKER.0, 5)],
        );
        assert_eq!(a.get(Cause::InputCpu), 0);
        assert_eq!(a.get(Cause::CpuContention), 80);
        // Its grandchild, through pid 99 (the feeder's child, recorded): a
        // loader still; through a pid not recorded, nobody's.
        let middle = thread((99, 99), &[], 300);
        let a = attribute(
            vec![feeder.clone(), worker.clone(), middle],
            &[(WORKER.0, 99)],
        );
        assert_eq!(a.get(Cause::InputCpu), 50);
        let a = attribute(vec![feeder, worker], &[(WORKER.0, 99)]);
        assert_eq!(a.get(Cause::InputCpu), 0);
    }

    /// The same wait where the recording says which CPUs: the loader's run
    /// on the CPU the feeder waited for is input, on another CPU it kept the
    /// feeder from nothing — whoever held the feeder's CPU is contention.
    #[test]
    fn a_loader_busy_on_another_cpu_is_not_what_the_feeder_waited_for() {
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::InOn(0)),
                (100, Step::Preempt),
                (180, Step::InOn(0)),
            ],
            300,
        );
        let worker_on = |cpu| {
            thread(
                WORKER,
                &[
                    (0, Step::Block(FUTEX, FdKind::None)),
                    (90, Step::Wake((0, 0))),
                    (90, Step::InOn(cpu)),
                    (150, Step::Block(FUTEX, FdKind::None)),
                ],
                300,
            )
        };
        let attribute = |worker| {
            run(
                &[(0, 100), (200, 300)],
                &[(200, Some(FEEDER))],
                vec![feeder.clone(), worker],
                BTreeMap::new(),
                (0, 300),
            )
        };
        let a = attribute(worker_on(0));
        assert_eq!(a.get(Cause::InputCpu), 50);
        assert_eq!(a.get(Cause::CpuContention), 30);
        let a = attribute(worker_on(1));
        assert_eq!(a.get(Cause::InputCpu), 0);
        assert_eq!(a.get(Cause::CpuContention), 80);
        assert_eq!(a.get(Cause::CpuHost), 20);
    }

    /// The thread that hands the feeder its batch was born as the batch was
    /// done (Python's multiprocessing queue starts its feeder thread at the
    /// first put): before it existed, its creator — the worker, decoding —
    /// is what the feeder waited for.
    #[test]
    fn a_waker_born_during_the_wait_points_at_its_creator() {
        const QUEUE: Tid = (20, 21);
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (100, Step::Block(READ, FdKind::Pipe)),
                (390, Step::Wake(QUEUE)),
                (400, Step::In),
            ],
            500,
        );
        // The worker decodes until 300, starts the queue's thread, waits.
        let worker = thread(
            WORKER,
            &[(0, Step::In), (300, Step::Block(FUTEX, FdKind::None))],
            500,
        );
        let mut queue = ThreadTimeline::forked(QUEUE.0, QUEUE.1, 300, true);
        queue.creator = Some(WORKER);
        queue.switch_in(300, NO_CPU);
        queue.switch_out(390, &out(FUTEX, FdKind::None), None);
        queue.finish(500);
        let threads = || vec![feeder.clone(), worker.clone(), queue.clone()];
        let a = run(
            &[(0, 100), (400, 500)],
            &[(0, Some(FEEDER)), (400, Some(FEEDER))],
            threads(),
            BTreeMap::new(),
            (0, 500),
        );
        assert_eq!(a.get(Cause::Unattributed), 0);
        // 100-300 the worker, 300-390 the queue's thread: input; 390-400
        // the feeder waiting for a CPU after the batch came, with no
        // loader of the job on one: contention.
        assert_eq!(a.get(Cause::InputCpu), 290, "{:?}", a.by_cause);
        assert_eq!(a.get(Cause::CpuContention), 10, "{:?}", a.by_cause);
        assert_eq!(a.by_thread[&(Cause::InputCpu, WORKER)], 200);
        // Unknown creator: the time before its birth is not known.
        let mut orphan = queue.clone();
        orphan.creator = None;
        let a = run(
            &[(0, 100), (400, 500)],
            &[(0, Some(FEEDER)), (400, Some(FEEDER))],
            vec![feeder.clone(), worker.clone(), orphan],
            BTreeMap::new(),
            (0, 500),
        );
        assert_eq!(a.get(Cause::Unattributed), 200);
    }

    /// DataLoader's workers share one result queue: the worker whose batch
    /// woke the feeder was itself waiting for the feeder's next request;
    /// the one computing the batch the feeder waited for is its sibling —
    /// a process of its parent and name, not one named alike elsewhere
    /// (another rank's loader under the same launcher).
    #[test]
    fn a_waker_waiting_for_work_points_at_its_working_siblings() {
        let feeder = thread(
            FEEDER,
            &[
                (0, Step::In),
                (100, Step::Block(READ, FdKind::Pipe)),
                (200, Step::Wake(WORKER)),
                (200, Step::In),
            ],
            300,
        );
        // Waiting 50-200 for an index from the feeder's process.
        let worker = thread(
            WORKER,
            &[
                (0, Step::In),
                (50, Step::Block(READ, FdKind::Pipe)),
                (190, Step::Wake((FEEDER.0, 11))),
                (195, Step::In),
            ],
            300,
        );
        let requester = thread((FEEDER.0, 11), &[(0, Step::In)], 300);
        // Decoding 0-160, then waiting too.
        let sibling = thread(
            WORKER2,
            &[(0, Step::In), (160, Step::Block(FUTEX, FdKind::None))],
            300,
        );
        let attribute = |parents: &[(u32, u32)]| {
            run_with_parents(
                &[(0, 100), (200, 300)],
                &[(200, Some(FEEDER))],
                vec![
                    feeder.clone(),
                    worker.clone(),
                    requester.clone(),
                    sibling.clone(),
                ],
                BTreeMap::new(),
                (0, 300),
                parents,
                &HashMap::new(),
            )
        };
        // 100-190: the sibling decoding until 160, nobody after; 190-200:
        // the waker itself, runnable then sending.
        let a = attribute(&[]);
        assert_eq!(a.get(Cause::InputCpu), 60 + 10);
        assert_eq!(a.get(Cause::Unattributed), 30);
        // The same process decoding for another trainer (pid 40): nobody
        // of the worker's family works 100-190.
        let a = attribute(&[(WORKER2.0, 40)]);
        assert_eq!(a.get(Cause::InputCpu), 10);
        assert_eq!(a.get(Cause::Unattributed), 90);
    }

    #[test]
    fn two_feeders_on_one_gpu_each_gap_goes_to_the_one_that_ended_it() {
        let f1 = thread(
            FEEDER,
            &[
                (0, Step::In),
                (100, Step::Block(READ, FdKind::File)),
                (250, Step::Wake((1, 1))),
                (250, Step::In),
            ],
            500,
        );
        let f2 = thread(
            WORKER,
            &[
                (0, Step::In),
                (300, Step::Block(READ, FdKind::SockInet)),
                (450, Step::Wake((1, 1))),
                (450, Step::In),
            ],
            500,
        );
        let a = run(
            &[(0, 100), (250, 300), (450, 500)],
            &[(0, Some(FEEDER)), (250, Some(FEEDER)), (450, Some(WORKER))],
            vec![f1, f2],
            BTreeMap::new(),
            (0, 500),
        );
        assert_eq!(a.get(Cause::InputIo), 150);
        assert_eq!(a.get(Cause::InputNetwork), 150);
    }

    #[test]
    fn missing_correlations_fall_back_to_the_main_feeder_and_no_feeder_is_unattributed() {
        let f = thread(
            FEEDER,
            &[
                (0, Step::In),
                (100, Step::Block(READ, FdKind::File)),
                (200, Step::Wake((1, 1))),
                (200, Step::In),
            ],
            300,
        );
        let a = run(
            &[(0, 100), (200, 300)],
            &[(0, Some(FEEDER)), (200, None)],
            vec![f.clone()],
            BTreeMap::new(),
            (0, 300),
        );
        assert_eq!(a.get(Cause::InputIo), 100);
        let a = run(
            &[(0, 100), (200, 300)],
            &[(0, None), (200, None)],
            vec![f],
            BTreeMap::new(),
            (0, 300),
        );
        assert_eq!(a.get(Cause::Unattributed), 100);
    }

    #[test]
    fn gaps_at_window_edges_and_a_gpu_that_never_ran() {
        let a = run(&[], &[], vec![], BTreeMap::new(), (0, 100));
        assert_eq!(a.get(Cause::Unattributed), 100);
        // Busy right from the window start and to its end: no startup/teardown.
        let a = run(&[(0, 100)], &[], vec![], BTreeMap::new(), (0, 100));
        assert_eq!(a.total(), 0);
    }

    /// A window cut from a longer recording: the idle before its first work
    /// is what the feeder did then (here mostly reading a file), after its last
    /// work too (host work) — tear-down only when the job ended there.
    #[test]
    fn a_window_cut_mid_job_attributes_its_edges_like_gaps() {
        let feeder = || {
            thread(
                FEEDER,
                &[
                    (0, Step::In),
                    (10, Step::Block(READ, FdKind::File)),
                    (95, Step::Wake((0, 0))),
                    (100, Step::In),
                ],
                1000,
            )
        };
        let busy = [(100, 200), (500, 600)];
        let work = [(100, Some(FEEDER)), (500, Some(FEEDER))];
        let mid = Edges {
            startup: false,
            teardown: false,
        };
        let spans = mid.bound((0, 1000), &busy);
        let a = run(&spans, &work, vec![feeder()], BTreeMap::new(), (0, 1000));
        assert_eq!(a.get(Cause::Startup) + a.get(Cause::Teardown), 0);
        // Reading 10-95, then waiting for a CPU until its work at 100.
        assert_eq!(a.get(Cause::InputIo), 85);
        assert_eq!(a.get(Cause::CpuContention), 5);
        assert_eq!(a.get(Cause::CpuHost), 10 + 300 + 400);
        let last = Edges {
            startup: false,
            teardown: true,
        };
        let spans = last.bound((0, 1000), &busy);
        let a = run(&spans, &work, vec![feeder()], BTreeMap::new(), (0, 1000));
        assert_eq!(a.get(Cause::Teardown), 400);
        assert_eq!(a.get(Cause::CpuHost), 10 + 300);
        // A whole job's recording: both edges are the job's.
        let a = run(
            &Edges::JOB.bound((0, 1000), &busy),
            &work,
            vec![feeder()],
            BTreeMap::new(),
            (0, 1000),
        );
        assert_eq!((a.get(Cause::Startup), a.get(Cause::Teardown)), (100, 400));
    }

    #[test]
    fn zero_length_and_nested_calls_never_count_twice() {
        let api = BTreeMap::from([(
            FEEDER,
            vec![
                call(120, 120, ApiRole::Launch),
                call(130, 130, ApiRole::Launch),
                call(140, 190, ApiRole::Sync),
                call(150, 160, ApiRole::Launch),
            ],
        )]);
        let a = run(
            &[(0, 100), (200, 300)],
            &[(200, Some(FEEDER))],
            vec![],
            api,
            (0, 300),
        );
        assert_eq!(a.get(Cause::Sync), 50);
        // A thread known only by its calls: between calls close together it
        // ran host code (120-140); before its first and after its last, not
        // known.
        assert_eq!(a.get(Cause::CpuHost), 20);
        assert_eq!(a.get(Cause::Unattributed), 30);
    }

    #[test]
    fn nested_ops_flatten_to_the_innermost_inside_the_dataloader_input() {
        let f = flatten_ops(vec![
            (0, 100, Cause::CpuHost),      // ProfilerStep#1
            (10, 40, Cause::InputUnknown), // enumerate(DataLoader)...__next__
            (15, 30, Cause::CpuHost),      // a transform inside it
            (20, 25, Cause::CpuHost),      // and an op inside that
            (50, 60, Cause::Sync),         // aten::item
            (55, 58, Cause::CpuHost),      // aten::_local_scalar_dense's child
        ]);
        assert_eq!(
            f,
            vec![
                (0, 10, Cause::CpuHost),
                (10, 40, Cause::InputUnknown),
                (40, 50, Cause::CpuHost),
                (50, 55, Cause::Sync),
                (55, 58, Cause::CpuHost),
                (58, 60, Cause::Sync),
                (60, 100, Cause::CpuHost),
            ]
        );
    }

    #[test]
    fn an_ops_cause_follows_its_region_of_code() {
        use crate::analyze::code::Rules;
        let mut rules = Rules::default();
        let cause = |rules: &Rules, name: &str| op_cause(name, rules.op(name));
        assert_eq!(
            cause(
                &rules,
                "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
            ),
            Cause::InputUnknown
        );
        assert_eq!(cause(&rules, "aten::item"), Cause::Sync);
        assert_eq!(cause(&rules, "aten::mm"), Cause::CpuHost);
        assert_eq!(rules.op("Optimizer.step#SGD.step"), Some(Region::Optimizer));
        assert_eq!(cause(&rules, "Optimizer.step#SGD.step"), Cause::CpuHost);
        assert_eq!(rules.op("## forward ##"), Some(Region::Forward));
        assert_eq!(rules.op("nccl:all_reduce"), Some(Region::Collective));
        assert_eq!(cause(&rules, "nccl:all_reduce"), Cause::Comm);
        assert_eq!(cause(&rules, "c10d::allreduce_"), Cause::Comm);
        // A user's record_function range named as input is input.
        assert_eq!(cause(&rules, "augment_batch"), Cause::CpuHost);
        rules.add("input.transform=op:augment_*").unwrap();
        assert_eq!(cause(&rules, "augment_batch"), Cause::InputUnknown);
        // Op rules name ops only, not frames.
        assert_eq!(rules.op("aten::add"), None);
    }

    #[test]
    fn api_roles() {
        assert_eq!(api_role("cudaLaunchKernel"), ApiRole::Launch);
        assert_eq!(api_role("cuLaunchKernel_ptsz"), ApiRole::Launch);
        assert_eq!(api_role("cudaGraphLaunch"), ApiRole::Launch);
        assert_eq!(api_role("cudaStreamSynchronize"), ApiRole::Sync);
        assert_eq!(api_role("cuStreamWaitEvent"), ApiRole::Sync);
        assert_eq!(api_role("cudaMemcpyAsync"), ApiRole::Memory);
        assert_eq!(api_role("cuMemAlloc_v2"), ApiRole::Memory);
        assert_eq!(api_role("cudaFree"), ApiRole::Memory);
        assert_eq!(api_role("cudaGetDevice"), ApiRole::Other);
    }
}
