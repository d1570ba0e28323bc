//! One thread's account: a state machine over its scheduler events that
//! splits its lifetime into on-CPU, runnable, stolen and off-CPU (by kind),
//! plus what it did in syscalls and where its stacks were.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::classify::{byte_class, io_dir, offcpu_kind, ByteClass, IoDir, OffKind};
use crate::session::{FdKind, IoCounters, SwitchOut, ThreadSeed};

/// Why a thread was off-CPU, with what the kernel saw at switch-out.
#[derive(Clone, Debug, PartialEq)]
pub struct OffCpu {
    pub kind: OffKind,
    pub syscall: Option<i32>,
    pub fd: i32,
    pub fd_kind: FdKind,
    pub ustack: u64,
    pub kstack: u64,
    /// The thread that woke it (pid, tid), once known.
    pub waker: Option<(u32, u32)>,
}

impl OffCpu {
    pub fn from_switch(out: &SwitchOut) -> OffCpu {
        OffCpu {
            kind: offcpu_kind(out.syscall, out.fd_kind),
            syscall: out.syscall,
            fd: out.fd,
            fd_kind: out.fd_kind,
            ustack: out.ustack,
            kstack: out.kstack,
            waker: None,
        }
    }

    /// Blocked on something the recording did not see.
    fn unknown(waker: Option<(u32, u32)>) -> OffCpu {
        OffCpu {
            kind: OffKind::Other,
            syscall: None,
            fd: -1,
            fd_kind: FdKind::None,
            ustack: 0,
            kstack: 0,
            waker,
        }
    }

    fn from_seed(seed: &ThreadSeed) -> OffCpu {
        OffCpu {
            kind: offcpu_kind(seed.syscall, seed.fd_kind),
            syscall: seed.syscall,
            fd: -1,
            fd_kind: seed.fd_kind,
            ustack: 0,
            kstack: 0,
            waker: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum State {
    OnCpu,
    Runnable,
    /// Held its CPU in the scheduler's view, but the kernel did not charge
    /// it the time: the hypervisor ran another guest on that CPU (steal)
    /// or, with IRQ time accounting, interrupts were handled on it. The
    /// kernel says how much of a run, not when: laid over the run evenly
    /// (`spread_stolen`).
    Stolen,
    Off(OffCpu),
}

/// A span of one state, kept when the caller asks for intervals.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    pub start: u64,
    pub end: u64,
    pub state: State,
    /// The CPU of an on-CPU (or stolen) span; of a runnable span ended by
    /// a switch-in, the CPU the thread then ran on — the one whose holder
    /// it waited for. [`NO_CPU`] for the rest, or where not recorded.
    pub cpu: u16,
}

/// [`Interval::cpu`] where no CPU is known.
pub const NO_CPU: u16 = u16::MAX;

#[derive(Clone, Debug)]
enum Cur {
    /// Existed before recording; what it was doing is inferred from its
    /// first event. `hint` is what /proc said it was blocked on, if anything.
    Unknown {
        hint: Option<OffCpu>,
    },
    Known(State),
    /// Exited at `at` in a run that began with a reported switch-in: held
    /// open until its final switch-out says what the kernel charged the
    /// run (a thread that ran to its end without a switch-out has that
    /// run's steal only there). Dead to every other event.
    Exiting {
        at: u64,
    },
    Dead,
}

/// A run's wall time and the kernel's charge come from different clocks
/// (CLOCK_MONOTONIC is slewed by NTP, the scheduler's clock is not) read a
/// few instructions apart: a difference within this much of the run, plus
/// [`STOLEN_FLOOR_NS`], is the clocks, not a CPU taken away.
const STOLEN_NOISE_PPM: u64 = 1_000;
const STOLEN_FLOOR_NS: u64 = 5_000;
/// Stolen time is laid over its run in slices of this length, at most
/// [`STOLEN_SLICES`] of them.
const STOLEN_SLICE_NS: u64 = 1_000_000;
const STOLEN_SLICES: u64 = 32;

/// Syscalls shorter than this are only counted, not kept one by one.
pub const LONG_SYSCALL_NS: u64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LongSyscall {
    pub ts: u64,
    pub dur: u64,
    pub nr: i32,
    pub ret: i64,
}

/// Bytes read from one fd, and how many reads of each size.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileReads {
    pub bytes: u64,
    pub sizes: BTreeMap<u64, u64>,
}

#[derive(Clone, Debug, Default)]
pub struct SyscallStat {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bytes {
    pub file: u64,
    pub net: u64,
    pub ipc: u64,
    pub other: u64,
}

impl Bytes {
    fn add(&mut self, class: ByteClass, n: u64) {
        match class {
            ByteClass::File => self.file += n,
            ByteClass::Net => self.net += n,
            ByteClass::Ipc => self.ipc += n,
            ByteClass::Other => self.other += n,
        }
    }
}

/// What of a thread's life to keep beyond its accounts.
#[derive(Clone, Debug, Default)]
pub enum Keep {
    /// Totals only (the per-thread report).
    #[default]
    Accounts,
    /// Every state interval, I/O span, sample and long syscall (pictures,
    /// the timeline export).
    Everything,
    /// The state intervals and I/O spans the GPU attribution and the clock
    /// checks read: those overlapping an idle gap or holding a launch, and
    /// the one just before each of them.
    Gaps(Arc<Wanted>),
    /// Every state interval, I/O span and sample, for an attribution that
    /// lets go of them as it moves on (`analyze::stream`): where the GPU's
    /// gaps lie is not known ahead.
    Recent,
}

impl From<bool> for Keep {
    fn from(everything: bool) -> Keep {
        if everything {
            Keep::Everything
        } else {
            Keep::Accounts
        }
    }
}

/// Where the analysis will look at thread states.
#[derive(Debug, Default)]
pub struct Wanted {
    /// Disjoint, sorted.
    pub gaps: Vec<(u64, u64)>,
    /// Per thread, sorted: when it called to launch GPU work.
    pub launches: HashMap<(u32, u32), Vec<u64>>,
    /// Threads whose every state is wanted.
    pub whole: HashSet<(u32, u32)>,
}

/// A thread's place in [`Wanted`]: its states close in time order, so
/// cursors only move forward.
#[derive(Clone, Debug)]
struct Sieve {
    wanted: Arc<Wanted>,
    gap: usize,
    io_gap: usize,
    launch: usize,
    /// The last interval left out, kept if the next one is wanted (the
    /// attribution asks what came just before a state).
    held: Option<Interval>,
}

impl Sieve {
    fn overlaps_gap(gaps: &[(u64, u64)], cursor: &mut usize, s: u64, e: u64) -> bool {
        while *cursor < gaps.len() && gaps[*cursor].1 <= s {
            *cursor += 1;
        }
        gaps.get(*cursor).is_some_and(|g| g.0 < e)
    }

    fn wants(&mut self, tid: (u32, u32), s: u64, e: u64) -> bool {
        if self.wanted.whole.contains(&tid) {
            return true;
        }
        if Self::overlaps_gap(&self.wanted.gaps, &mut self.gap, s, e) {
            return true;
        }
        let Some(l) = self.wanted.launches.get(&tid) else {
            return false;
        };
        while self.launch < l.len() && l[self.launch] < s {
            self.launch += 1;
        }
        l.get(self.launch).is_some_and(|&t| t < e)
    }
}

#[derive(Clone, Debug)]
pub struct ThreadTimeline {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Lifetime inside the window.
    pub start: u64,
    pub end: u64,
    pub on_cpu: u64,
    pub runnable: u64,
    /// Of `runnable`, the waits for a CPU right after a wakeup from a
    /// block of each kind (the read done, the thread not yet running): the
    /// what-ifs ask whether a fix that does without the block does without
    /// them (`analyze::replay::Woken`), where waits in the middle of its
    /// work scale with the work.
    pub runnable_after: BTreeMap<OffKind, u64>,
    /// See [`State::Stolen`].
    pub stolen: u64,
    pub off: BTreeMap<OffKind, u64>,
    pub syscalls: BTreeMap<i32, SyscallStat>,
    pub read_bytes: Bytes,
    pub write_bytes: Bytes,
    pub page_faults: u64,
    /// cpu-clock samples by (user stack, kernel stack).
    pub samples: HashMap<(u64, u64), u64>,
    /// Blocked time by (kind, user stack, kernel stack).
    pub off_stacks: HashMap<(OffKind, u64, u64), u64>,
    pub intervals: Option<Vec<Interval>>,
    /// With intervals: the thread's syscalls on files and sockets, as
    /// (start, end, what they moved data with), sorted by start.
    pub io_spans: Option<Vec<(u64, u64, OffKind)>>,
    /// Context switches the kernel did not report but other events prove
    /// (see `evidence_of_running`).
    pub inferred_switches: u64,
    /// Reads from files and block devices that moved data, by fd: the
    /// evidence of an input pipeline waiting on storage.
    pub file_reads: BTreeMap<i32, FileReads>,
    /// Reads of files and block devices it blocked in (recorded without the
    /// per-syscall hooks): by path, how many asked for each size.
    pub blocked_reads: BTreeMap<String, BTreeMap<u64, u64>>,
    /// What the kernel's I/O accounting counted for it while recording.
    pub io: Option<IoCounters>,
    /// Who took the CPU when the thread was preempted: switches by pid.
    pub preempted_by: BTreeMap<u32, u64>,
    /// With intervals: cpu-clock samples as (time, user stack, kernel
    /// stack), in time order, to name what the thread ran at a moment (the
    /// attribution reads the code of the feeder's time on a CPU).
    pub sample_times: Option<Vec<(u64, u64, u64)>>,
    /// With intervals: syscalls of [`LONG_SYSCALL_NS`] or more, in order.
    pub long_syscalls: Option<Vec<LongSyscall>>,
    /// The thread that created it, when its creation was recorded.
    pub creator: Option<(u32, u32)>,
    sieve: Option<Sieve>,
    cur: Cur,
    since: u64,
    /// Latest moment the thread is known to have been on a CPU.
    last_ran: u64,
    /// The current run began at a recorded switch-in, so its wall time is
    /// known and can be set against what the kernel charged for it.
    run_from_switch_in: bool,
    /// The CPU of the run under way (see [`Interval::cpu`]).
    run_cpu: u16,
    /// A wakeup seen while the thread was believed on-CPU.
    pending_wakeup: Option<(u64, (u32, u32))>,
    /// What the runnable span under way was woken from, if a wakeup
    /// began it (see `runnable_after`).
    woken_from: Option<OffKind>,
}

impl ThreadTimeline {
    fn new(pid: u32, tid: u32, start: u64, cur: Cur, keep: Keep) -> ThreadTimeline {
        let keep_intervals = !matches!(keep, Keep::Accounts);
        let everything = matches!(keep, Keep::Everything);
        let sieve = match keep {
            Keep::Gaps(wanted) => Some(Sieve {
                wanted,
                gap: 0,
                io_gap: 0,
                launch: 0,
                held: None,
            }),
            _ => None,
        };
        ThreadTimeline {
            pid,
            tid,
            comm: String::new(),
            start,
            end: start,
            on_cpu: 0,
            runnable: 0,
            runnable_after: BTreeMap::new(),
            stolen: 0,
            off: BTreeMap::new(),
            syscalls: BTreeMap::new(),
            read_bytes: Bytes::default(),
            write_bytes: Bytes::default(),
            page_faults: 0,
            samples: HashMap::new(),
            off_stacks: HashMap::new(),
            intervals: keep_intervals.then(Vec::new),
            io_spans: keep_intervals.then(Vec::new),
            inferred_switches: 0,
            file_reads: BTreeMap::new(),
            blocked_reads: BTreeMap::new(),
            io: None,
            preempted_by: BTreeMap::new(),
            sample_times: keep_intervals.then(Vec::new),
            long_syscalls: everything.then(Vec::new),
            creator: None,
            sieve,
            cur,
            since: start,
            last_ran: start,
            run_from_switch_in: false,
            run_cpu: NO_CPU,
            pending_wakeup: None,
            woken_from: None,
        }
    }

    /// A thread that existed when recording started.
    pub fn seeded(seed: &ThreadSeed, window_start: u64, keep: impl Into<Keep>) -> ThreadTimeline {
        let hint = match seed.state {
            'R' => None,
            _ => Some(OffCpu::from_seed(seed)),
        };
        let mut t = Self::new(
            seed.pid,
            seed.tid,
            window_start,
            Cur::Unknown { hint },
            keep.into(),
        );
        t.comm = seed.comm.clone();
        t
    }

    /// A thread created during recording: runnable until it first runs.
    pub fn forked(pid: u32, tid: u32, ts: u64, keep: impl Into<Keep>) -> ThreadTimeline {
        Self::new(pid, tid, ts, Cur::Known(State::Runnable), keep.into())
    }

    /// A thread first seen mid-stream (its creation was not recorded).
    pub fn first_seen(pid: u32, tid: u32, ts: u64, keep: impl Into<Keep>) -> ThreadTimeline {
        Self::new(pid, tid, ts, Cur::Unknown { hint: None }, keep.into())
    }

    /// Up to when the thread's states are final: every interval that will
    /// ever cover time before this has been closed.
    pub fn closed_until(&self) -> u64 {
        match self.cur {
            Cur::Dead => u64::MAX,
            _ => self.since,
        }
    }

    /// Lets go of the states and I/O spans that end by `t`, keeping the
    /// last such state (the attribution asks what came just before a
    /// state).
    pub fn forget_before(&mut self, t: u64) {
        if let Some(iv) = self.intervals.as_mut() {
            let k = iv.partition_point(|x| x.end <= t);
            if k > 1 {
                iv.drain(..k - 1);
            }
        }
        if let Some(spans) = self.io_spans.as_mut() {
            let k = spans.partition_point(|x| x.1 <= t);
            spans.drain(..k);
        }
        // Samples name the code of the states around them (a sampling
        // period at most): a second behind is far enough.
        if let Some(samples) = self.sample_times.as_mut() {
            let k = samples.partition_point(|x| x.0.saturating_add(1_000_000_000) <= t);
            samples.drain(..k);
        }
    }

    pub fn is_dead(&self) -> bool {
        matches!(self.cur, Cur::Dead | Cur::Exiting { .. })
    }

    pub fn lifetime(&self) -> u64 {
        self.end - self.start
    }

    /// Closes the current span at `ts`; `before` is what the event implies the
    /// thread was doing, used when the state was unknown.
    fn close(&mut self, ts: u64, before: State) {
        self.close_waiting_for(ts, before, NO_CPU)
    }

    /// [`close`](Self::close), where a switch-in to `switched_to` ends a
    /// runnable span: the CPU whose holder it waited for.
    fn close_waiting_for(&mut self, ts: u64, before: State, switched_to: u16) {
        let ts = ts.max(self.since);
        let state = match std::mem::replace(&mut self.cur, Cur::Dead) {
            Cur::Known(s) => s,
            Cur::Unknown { hint } => match (before, hint) {
                (State::Off(_), Some(h)) => State::Off(h),
                (State::Off(o), None) => State::Off(o),
                (b, _) => b,
            },
            Cur::Dead | Cur::Exiting { .. } => return,
        };
        let dur = ts - self.since;
        let woken_from = self.woken_from.take();
        match &state {
            State::OnCpu => self.on_cpu += dur,
            State::Runnable => {
                self.runnable += dur;
                if let Some(k) = woken_from {
                    *self.runnable_after.entry(k).or_default() += dur;
                }
            }
            State::Stolen => self.stolen += dur,
            State::Off(o) => {
                *self.off.entry(o.kind).or_default() += dur;
                if o.ustack != 0 || o.kstack != 0 {
                    *self
                        .off_stacks
                        .entry((o.kind, o.ustack, o.kstack))
                        .or_default() += dur;
                }
            }
        }
        if let Some(iv) = self.intervals.as_mut() {
            if dur > 0 {
                let cpu = match state {
                    State::OnCpu | State::Stolen => self.run_cpu,
                    State::Runnable => switched_to,
                    State::Off(_) => NO_CPU,
                };
                let interval = Interval {
                    start: self.since,
                    end: ts,
                    state,
                    cpu,
                };
                match self.sieve.as_mut() {
                    None => iv.push(interval),
                    Some(sieve) => {
                        if sieve.wants((self.pid, self.tid), interval.start, interval.end) {
                            iv.extend(sieve.held.take());
                            iv.push(interval);
                        } else {
                            sieve.held = Some(interval);
                        }
                    }
                }
            }
        }
        self.since = ts;
        self.end = ts;
    }

    fn set(&mut self, state: State) {
        self.cur = Cur::Known(state);
    }

    /// `charged`: the CPU time the kernel charged the run that ends here,
    /// when the recording says.
    pub fn switch_out(&mut self, ts: u64, out: &SwitchOut, charged: Option<u64>) {
        if let Cur::Exiting { at } = self.cur {
            // Its last run, charged up to its final switch-out: the part
            // before the exit at the run's rate.
            self.cur = Cur::Known(State::OnCpu);
            if let Some(stolen) = charged.and_then(|c| self.stolen_in_run(ts, c)) {
                let ran = (at - self.since) as u128;
                let wall = ts.saturating_sub(self.since).max(1) as u128;
                let before = (stolen as u128 * ran / wall).min(stolen as u128);
                self.spread_stolen(at, before as u64);
            }
            return self.died(at);
        }
        if self.is_dead() {
            return;
        }
        if let (Some(charged), true, Cur::Known(State::OnCpu)) =
            (charged, self.run_from_switch_in, &self.cur)
        {
            if let Some(stolen) = self.stolen_in_run(ts, charged) {
                self.spread_stolen(ts, stolen);
            }
        }
        self.run_from_switch_in = false;
        self.close(ts, State::OnCpu);
        // A run inferred before the next switch-in is on a CPU not known.
        self.run_cpu = NO_CPU;
        self.set(if out.preempted {
            State::Runnable
        } else {
            State::Off(OffCpu::from_switch(out))
        });
        self.pending_wakeup = None;
    }

    /// Of the run since the last switch-in, up to `ts`, the time the
    /// kernel did not charge (`charged`), when more than the clocks' noise.
    fn stolen_in_run(&self, ts: u64, charged: u64) -> Option<u64> {
        let wall = ts.saturating_sub(self.since);
        let stolen = wall.saturating_sub(charged);
        (stolen > STOLEN_FLOOR_NS + wall * STOLEN_NOISE_PPM / 1_000_000).then_some(stolen)
    }

    /// Lays `stolen` of the run that ends at `ts` over it evenly: each
    /// [`STOLEN_SLICE_NS`] of the run (at most [`STOLEN_SLICES`] of them)
    /// ends in its share. The kernel says how much of a run was taken, not
    /// when; spread, it falls on the run's moments in proportion (a run
    /// that launched work and then waited keeps its steal beside the
    /// launch, not all of it in the wait).
    fn spread_stolen(&mut self, ts: u64, stolen: u64) {
        let wall = ts - self.since;
        let slices = (wall / STOLEN_SLICE_NS).clamp(1, STOLEN_SLICES);
        let start = self.since;
        for k in 1..=slices {
            // Slice k ends at start + wall·k/n with stolen·k/n taken by then.
            let end = start + (wall as u128 * k as u128 / slices as u128) as u64;
            let taken = (stolen as u128 * k as u128 / slices as u128) as u64;
            let before = (stolen as u128 * (k - 1) as u128 / slices as u128) as u64;
            self.close(end - (taken - before), State::OnCpu);
            self.set(State::Stolen);
            self.close(end, State::Stolen);
            self.set(State::OnCpu);
        }
    }

    /// `cpu`: the CPU it took, [`NO_CPU`] where not known.
    pub fn switch_in(&mut self, ts: u64, cpu: u16) {
        if self.is_dead() {
            return;
        }
        if matches!(self.cur, Cur::Known(State::OnCpu)) && ts > self.since {
            // Its switch-out was never reported: it ran until the last sign
            // of life, then waited (blocked until a wakeup, if one came).
            self.inferred_switches += 1;
            self.close(self.last_ran, State::OnCpu);
            if let Some((woken, waker)) = self.pending_wakeup.take() {
                if woken > self.since && woken < ts {
                    self.set(State::Off(OffCpu::unknown(Some(waker))));
                    self.close(woken, State::Runnable);
                }
            }
            self.set(State::Runnable);
        }
        self.close_waiting_for(ts, State::Runnable, cpu);
        self.run_cpu = cpu;
        self.set(State::OnCpu);
        self.last_ran = ts;
        self.run_from_switch_in = true;
    }

    /// The thread did something only a running thread does (entered a
    /// syscall, took a fault, was sampled, woke another thread) at `ts`.
    ///
    /// The kernel occasionally runs a task without a sched_switch event for
    /// it (seen on 6.x: both ftrace and BPF miss it); without this, the time
    /// until its next switch-out would be counted as waiting.
    pub fn evidence_of_running(&mut self, ts: u64) {
        match &self.cur {
            Cur::Known(State::OnCpu) => self.last_ran = self.last_ran.max(ts),
            Cur::Known(_) if ts > self.since => {
                self.inferred_switches += 1;
                self.close(ts, State::Runnable);
                self.set(State::OnCpu);
                self.last_ran = ts;
            }
            _ => {}
        }
    }

    pub fn wakeup(&mut self, ts: u64, waker: (u32, u32)) {
        let (blocked, kind) = match &mut self.cur {
            Cur::Known(State::Off(o)) => {
                o.waker = Some(waker);
                (true, Some(o.kind))
            }
            Cur::Unknown { hint } => {
                let kind = hint.as_mut().map(|h| {
                    h.waker = Some(waker);
                    h.kind
                });
                (true, kind)
            }
            Cur::Known(State::OnCpu) => {
                // Usually woken just before it would have slept; kept in
                // case its switch-out went unreported.
                self.pending_wakeup = Some((ts, waker));
                (false, None)
            }
            _ => (false, None),
        };
        if blocked {
            self.close(ts, State::Off(OffCpu::unknown(Some(waker))));
            self.set(State::Runnable);
            self.woken_from = kind;
        }
    }

    pub fn exit(&mut self, ts: u64) {
        if let Cur::Exiting { at } = self.cur {
            return self.died(at);
        }
        if self.run_from_switch_in
            && matches!(self.cur, Cur::Known(State::OnCpu))
            && ts > self.since
        {
            // Until its final switch-out (`switch_out`), or the window's end.
            self.run_from_switch_in = false;
            self.cur = Cur::Exiting { at: ts };
            self.end = ts;
            return;
        }
        self.died(ts);
    }

    /// Its account ends at `ts`, on a CPU since the last state's start.
    fn died(&mut self, ts: u64) {
        if let Cur::Exiting { .. } = self.cur {
            self.cur = Cur::Known(State::OnCpu);
        }
        self.close(ts, State::OnCpu);
        self.cur = Cur::Dead;
    }

    /// Ends the account at the window end.
    pub fn finish(&mut self, end: u64) {
        if let Cur::Exiting { at } = self.cur {
            // Its final switch-out never came: its last run as it was.
            self.died(at);
        }
        if !self.is_dead() {
            // Never switched during the window: a thread seen running was on
            // a CPU the whole time.
            self.close(end, State::OnCpu);
            self.cur = Cur::Dead;
        }
    }

    pub fn syscall(&mut self, ts: u64, nr: i32, dur: u64, fd: i32, fd_kind: FdKind, ret: i64) {
        if dur >= LONG_SYSCALL_NS {
            if let Some(v) = self.long_syscalls.as_mut() {
                v.push(LongSyscall { ts, dur, nr, ret });
            }
        }
        if ret > 0 && matches!(fd_kind, FdKind::File | FdKind::Block) && io_dir(nr) == IoDir::Read {
            let r = self.file_reads.entry(fd).or_default();
            r.bytes += ret as u64;
            *r.sizes.entry(ret as u64).or_default() += 1;
        }
        if let Some(spans) = self.io_spans.as_mut() {
            let kind = match byte_class(fd_kind) {
                ByteClass::File => Some(OffKind::File),
                ByteClass::Net => Some(OffKind::Net),
                _ => None,
            };
            if let (Some(k), IoDir::Read | IoDir::Write) = (kind, io_dir(nr)) {
                let wanted = self.sieve.as_mut().is_none_or(|s| {
                    Sieve::overlaps_gap(&s.wanted.gaps, &mut s.io_gap, ts, ts + dur)
                });
                if wanted {
                    spans.push((ts, ts + dur, k));
                }
            }
        }
        let s = self.syscalls.entry(nr).or_default();
        s.count += 1;
        s.total_ns += dur;
        s.max_ns = s.max_ns.max(dur);
        if ret > 0 {
            match io_dir(nr) {
                IoDir::Read => self.read_bytes.add(byte_class(fd_kind), ret as u64),
                IoDir::Write => self.write_bytes.add(byte_class(fd_kind), ret as u64),
                IoDir::None => {}
            }
        }
    }

    /// It blocked in a read of `fd` (known as `path`) that asked for `size`.
    pub fn blocked_read(&mut self, path: Option<&str>, fd: i32, size: u64) {
        let sizes = match path {
            Some(p) => match self.blocked_reads.get_mut(p) {
                Some(sizes) => sizes,
                None => self.blocked_reads.entry(p.to_string()).or_default(),
            },
            None => self.blocked_reads.entry(format!("fd {fd}")).or_default(),
        };
        *sizes.entry(size).or_default() += 1;
    }

    pub fn sample(&mut self, ts: u64, ustack: u64, kstack: u64) {
        *self.samples.entry((ustack, kstack)).or_default() += 1;
        if let Some(v) = self.sample_times.as_mut() {
            v.push((ts, ustack, kstack));
        }
    }

    pub fn off_total(&self) -> u64 {
        self.off.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(syscall: i32, fd_kind: FdKind) -> SwitchOut {
        SwitchOut {
            pid: 1,
            tid: 1,
            state: 1,
            preempted: false,
            ustack: 9,
            kstack: 0,
            syscall: Some(syscall),
            fd: 3,
            fd_kind,
            next: (0, 0),
        }
    }

    /// A thread /proc showed running when recording started.
    fn running_at_attach() -> ThreadSeed {
        ThreadSeed {
            pid: 1,
            tid: 1,
            comm: "x".into(),
            state: 'R',
            syscall: None,
            fd_kind: FdKind::None,
        }
    }

    #[test]
    fn states_partition_the_lifetime() {
        let mut t = ThreadTimeline::forked(1, 1, 100, true);
        t.switch_in(110, NO_CPU); // runnable 10
        t.switch_out(150, &blocked(0, FdKind::File), None); // on 40
        t.wakeup(250, (1, 2)); // file 100
        t.switch_in(255, NO_CPU); // runnable 5
        let mut pre = blocked(0, FdKind::None);
        pre.preempted = true;
        t.switch_out(300, &pre, None); // on 45
        t.switch_in(320, NO_CPU); // runnable 20
        t.exit(330); // on 10
        t.switch_out(331, &blocked(60, FdKind::None), None); // after death: ignored
        assert_eq!(t.on_cpu, 95);
        assert_eq!(t.runnable, 35);
        // Of it, only the wait after the read's wakeup follows a block: not
        // the new thread's first, nor the one after its preemption.
        assert_eq!(t.runnable_after, BTreeMap::from([(OffKind::File, 5)]));
        assert_eq!(t.off[&OffKind::File], 100);
        assert_eq!(t.lifetime(), 230);
        assert_eq!(t.on_cpu + t.runnable + t.off_total(), t.lifetime());
        assert_eq!(t.off_stacks[&(OffKind::File, 9, 0)], 100);
        let iv = t.intervals.as_ref().unwrap();
        assert_eq!(iv.len(), 7);
        assert!(matches!(&iv[2].state, State::Off(o) if o.waker == Some((1, 2))));
    }

    #[test]
    fn unknown_start_is_inferred_from_first_event() {
        // Seen running at attach, first event is a switch-out: it was on-CPU.
        let seed = running_at_attach();
        let mut t = ThreadTimeline::seeded(&seed, 0, false);
        t.switch_out(40, &blocked(202, FdKind::None), None);
        assert_eq!(t.on_cpu, 40);
        // Blocked in a pipe read at attach: off-CPU ipc until its wakeup.
        let seed = ThreadSeed {
            state: 'S',
            syscall: Some(0),
            fd_kind: FdKind::Pipe,
            ..seed
        };
        let mut t = ThreadTimeline::seeded(&seed, 0, false);
        t.wakeup(70, (5, 5));
        t.finish(100);
        assert_eq!(t.off[&OffKind::Ipc], 70);
        assert_eq!(t.runnable, 30);
    }

    #[test]
    fn an_unreported_switch_in_is_inferred_from_activity() {
        let mut t = ThreadTimeline::forked(1, 1, 0, false);
        t.switch_in(10, NO_CPU);
        let mut pre = blocked(0, FdKind::None);
        pre.preempted = true;
        t.switch_out(20, &pre, None); // runnable from 20 ...
        t.evidence_of_running(25); // ... but running again by 25 (switch-in lost)
        t.evidence_of_running(30);
        t.switch_out(40, &pre, None);
        t.finish(40);
        assert_eq!(t.on_cpu, 10 + 15);
        assert_eq!(t.runnable, 10 + 5);
        assert_eq!(t.inferred_switches, 1);
    }

    #[test]
    fn an_unreported_switch_out_is_inferred_from_a_second_switch_in() {
        let mut t = ThreadTimeline::forked(1, 1, 0, false);
        t.switch_in(10, NO_CPU);
        t.evidence_of_running(20); // last sign of life
        t.wakeup(50, (7, 7)); // it had blocked (switch-out lost) and is woken
        t.switch_in(60, NO_CPU);
        t.finish(70);
        assert_eq!(t.on_cpu, 10 + 10);
        assert_eq!(t.off[&OffKind::Other], 30);
        assert_eq!(t.runnable, 10 + 10);
        assert_eq!(t.inferred_switches, 1);
        assert_eq!(t.on_cpu + t.runnable + t.off_total(), t.lifetime());
    }

    #[test]
    fn a_run_the_kernel_charged_less_for_lost_the_rest_of_its_cpu() {
        const MS: u64 = 1_000_000;
        let mut pre = blocked(0, FdKind::None);
        pre.preempted = true;
        let mut t = ThreadTimeline::forked(1, 1, 0, true);
        t.switch_in(MS, NO_CPU);
        // 100 ms on the CPU by the clock, 60 ms by the kernel's charge.
        t.switch_out(101 * MS, &pre, Some(60 * MS));
        // A run the clocks' disagreement alone explains loses nothing.
        t.switch_in(102 * MS, NO_CPU);
        t.switch_out(112 * MS, &pre, Some(10 * MS - 3_000));
        // Charged more than the clock says: nothing taken either.
        t.switch_in(113 * MS, NO_CPU);
        t.switch_out(114 * MS, &blocked(0, FdKind::File), Some(2 * MS));
        t.finish(120 * MS);
        assert_eq!(t.stolen, 40 * MS);
        assert_eq!(t.on_cpu, 60 * MS + 10 * MS + MS);
        assert_eq!(
            t.on_cpu + t.runnable + t.stolen + t.off_total(),
            t.lifetime()
        );
        // Laid over the run evenly: 32 slices of 3.125 ms, each ending in
        // 1.25 ms taken.
        let iv = t.intervals.as_ref().unwrap();
        let run: Vec<&Interval> = iv.iter().filter(|x| x.end <= 101 * MS).skip(1).collect();
        assert_eq!(run.len(), 64);
        assert_eq!(
            (run[0].start, run[0].end, &run[0].state),
            (MS, MS + 1_875_000, &State::OnCpu)
        );
        assert_eq!(
            (run[1].end, &run[1].state),
            (MS + 3_125_000, &State::Stolen)
        );
        assert_eq!((run[63].end, &run[63].state), (101 * MS, &State::Stolen));

        // A run whose start was not seen (running at attach) has no wall
        // time to set the charge against.
        let seed = running_at_attach();
        let mut t = ThreadTimeline::seeded(&seed, 0, false);
        t.switch_out(100 * MS, &pre, Some(MS));
        assert_eq!((t.on_cpu, t.stolen), (100 * MS, 0));
    }

    /// A thread that ran to its end without a switch-out: its exit holds
    /// the run open for its final switch-out's charge, whose share before
    /// the exit is steal; without that switch-out, the run stays whole.
    #[test]
    fn a_run_that_ends_in_exit_keeps_its_steal() {
        const MS: u64 = 1_000_000;
        let mut t = ThreadTimeline::forked(1, 1, 0, true);
        t.switch_in(0, NO_CPU);
        t.exit(100 * MS);
        assert_eq!(t.closed_until(), 0, "open until its final switch-out");
        // After its exit: nothing.
        t.wakeup(100 * MS + 10, (1, 2));
        // 110 ms by the clock to the final switch-out, 77 ms charged:
        // 33 ms taken, 30 of them before the exit.
        t.switch_out(110 * MS, &blocked(0, FdKind::None), Some(77 * MS));
        assert_eq!(t.closed_until(), u64::MAX);
        assert_eq!((t.on_cpu, t.stolen), (70 * MS, 30 * MS));
        assert_eq!(t.lifetime(), 100 * MS);
        t.finish(200 * MS);
        assert_eq!(t.on_cpu + t.stolen, t.lifetime());

        let mut t = ThreadTimeline::forked(1, 1, 0, true);
        t.switch_in(0, NO_CPU);
        t.exit(100 * MS);
        t.finish(200 * MS);
        assert_eq!((t.on_cpu, t.stolen, t.lifetime()), (100 * MS, 0, 100 * MS));
    }

    #[test]
    fn a_wakeup_while_running_changes_nothing() {
        let mut t = ThreadTimeline::forked(1, 1, 0, false);
        t.switch_in(10, NO_CPU);
        t.wakeup(15, (7, 7));
        t.switch_out(20, &blocked(202, FdKind::None), None);
        t.wakeup(30, (7, 7));
        t.switch_in(35, NO_CPU);
        t.finish(40);
        assert_eq!((t.on_cpu, t.runnable, t.off[&OffKind::Ipc]), (15, 15, 10));
        assert_eq!(t.inferred_switches, 0);
    }

    #[test]
    fn bytes_by_direction_and_kind() {
        let mut t = ThreadTimeline::forked(1, 1, 0, false);
        t.syscall(0, 0, 10, 3, FdKind::File, 4096);
        t.syscall(0, 0, 10, 3, FdKind::File, -11);
        t.syscall(0, 45, 10, 4, FdKind::SockInet, 100);
        t.syscall(0, 1, 10, 5, FdKind::Pipe, 7);
        assert_eq!(t.read_bytes.file, 4096);
        assert_eq!(t.read_bytes.net, 100);
        assert_eq!(t.write_bytes.ipc, 7);
        assert_eq!(t.syscalls[&0].count, 2);
    }
}
