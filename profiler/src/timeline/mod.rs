//! The merged model of a recording on one clock (CLOCK_MONOTONIC ns): per
//! host thread, its states and what it did, built by replaying the events in
//! time order; per GPU, its work with the calls that launched it (`gpu`).

pub mod classify;
pub mod gpu;
/// The GPU side's totals and spools, parts of it (`gpu/`).
pub use gpu::{spooled, totals};
mod syscall_names;
pub mod thread;

use std::collections::{BTreeMap, HashMap};

use crate::session::{Event, FdKind, Session, SwitchOut, ThreadIo};
pub use classify::{syscall_name, OffKind};
pub use gpu::GpuSide;
pub use thread::{Interval, Keep, OffCpu, State, ThreadTimeline, Wanted, LONG_SYSCALL_NS, NO_CPU};

#[derive(Clone, Debug, Default)]
pub struct ProcessTimeline {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub argv: Vec<String>,
    /// Executables it ran, in order.
    pub execs: Vec<String>,
    pub exit_code: Option<i32>,
    pub start: Option<u64>,
    pub end: Option<u64>,
    /// Its rank in a multi-process job, as its launcher told it.
    pub rank: Option<u32>,
}

/// TCP sent a segment again on a connection thread `tid` used.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Retransmit {
    pub ts: u64,
    pub tid: (u32, u32),
    pub peer: crate::session::Peer,
}

#[derive(Debug)]
pub struct Timeline {
    pub start: u64,
    pub end: u64,
    pub threads: BTreeMap<(u32, u32), ThreadTimeline>,
    pub processes: BTreeMap<u32, ProcessTimeline>,
    /// Paths of fds (pid, fd) as opened during recording or found at attach.
    pub fd_paths: HashMap<(u32, i32), String>,
    /// Earlier threads and processes whose ids a later one reused (the
    /// maps above hold the latest of each id).
    pub retired: Vec<ThreadTimeline>,
    pub retired_processes: Vec<ProcessTimeline>,
    pub gpu: GpuSide,
    /// The machine's idle CPU time, as read while recording, in order
    /// (empty when not recorded).
    pub cpu_idle: Vec<crate::session::CpuIdle>,
    /// What unrecorded tasks ran, as read while recording, in order (empty
    /// when not recorded).
    pub neighbours: Vec<crate::session::Neighbours>,
    /// TCP retransmissions on the recorded threads' connections, in order.
    pub retransmits: Vec<Retransmit>,
    /// What threads keep beyond their accounts.
    keep: Keep,
    /// Processes whose CUDA calls their shim reports: libcuda uprobes on
    /// them (attach watches every libcuda in the tree) would count each
    /// call twice.
    shimmed: std::collections::HashSet<u32>,
    /// Per thread, where its cpu-clock samples found it (see
    /// [`IoTally`]): known before any event is replayed, so that what is
    /// attributed while they are is what is attributed after.
    pub io_tally: HashMap<(u32, u32), IoTally>,
}

/// A thread's cpu-clock samples, and how many found it moving data through
/// files and through network sockets (see [`classify::sampled_io`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoTally {
    pub samples: u64,
    pub file: u64,
    pub net: u64,
}

impl IoTally {
    /// `ns` of its time on a CPU split as its samples found it: (moving
    /// data through files, through network sockets, computing) — all
    /// computing without samples. An estimate where syscalls were not
    /// hooked.
    pub fn split(&self, ns: u64) -> (u64, u64, u64) {
        if self.samples == 0 {
            return (0, 0, ns);
        }
        let part = |n: u64| (ns as u128 * n as u128 / self.samples as u128) as u64;
        let (file, net) = (part(self.file), part(self.net));
        (file, net, ns - file - net)
    }
}

/// Samples by (pid, tid, kernel stack), counted as a recording is read.
pub type SampleStacks = ahash::AHashMap<(u32, u32, u64), u64>;

/// Every thread's [`IoTally`] from its samples' kernel stacks.
pub fn io_tally(
    stacks: &SampleStacks,
    symbols: &HashMap<u64, Vec<crate::session::Frame>>,
) -> HashMap<(u32, u32), IoTally> {
    let mut kinds: HashMap<u64, Option<OffKind>> = HashMap::new();
    let mut out: HashMap<(u32, u32), IoTally> = HashMap::new();
    for (&(pid, tid, kstack), &n) in stacks {
        let kind = *kinds.entry(kstack).or_insert_with(|| {
            symbols
                .get(&kstack)
                .and_then(|frames| classify::sampled_io(frames))
        });
        let t = out.entry((pid, tid)).or_default();
        t.samples += n;
        match kind {
            Some(OffKind::File) => t.file += n,
            Some(OffKind::Net) => t.net += n,
            _ => {}
        }
    }
    out
}

/// Counts a sample into `stacks` (other events pass).
pub fn count_sample(stacks: &mut SampleStacks, e: &Event) {
    if let Event::Sample {
        pid, tid, kstack, ..
    } = e
    {
        *stacks.entry((*pid, *tid, *kstack)).or_default() += 1;
    }
}

/// Where a finished recording ends, as its end record says: known before
/// any event is replayed.
pub fn recorded_end(session: &Session) -> Option<u64> {
    let start = session.header().start_ns;
    session.footer.as_ref().map(|f| f.end_ns.max(start))
}

impl Timeline {
    /// Gives each thread what the kernel counted for it while recording:
    /// its last reading less its reading at the start (none: born while
    /// recording, from zero). A reading belongs to the thread of that id
    /// that was alive at its time.
    fn account_io(&mut self, readings: &[ThreadIo]) {
        let mut by_thread: HashMap<(u32, u32), Vec<&ThreadIo>> = HashMap::new();
        for r in readings {
            by_thread.entry((r.pid, r.tid)).or_default().push(r);
        }
        let threads = self.threads.values_mut().chain(self.retired.iter_mut());
        for t in threads {
            let Some(rs) = by_thread.get(&(t.pid, t.tid)) else {
                continue;
            };
            let mine = rs
                .iter()
                .filter(|r| r.ts >= t.start && r.ts <= t.end.max(t.start));
            let start = mine.clone().find(|r| r.start).map(|r| r.io);
            // Exited threads are read by the kernel at exit, which is
            // their end; the living just after the window closed. Called
            // before the living are closed, when dead means exited.
            let last = rs
                .iter()
                .filter(|r| !r.start && r.ts >= t.start)
                .filter(|r| !t.is_dead() || r.ts <= t.end)
                .max_by_key(|r| r.ts);
            if let Some(last) = last {
                t.io = Some(last.io.since(&start.unwrap_or_default()));
            }
        }
    }

    /// Every thread of the recording, reused ids included, in (pid, tid,
    /// start) order.
    pub fn all_threads(&self) -> Vec<&ThreadTimeline> {
        let mut v: Vec<&ThreadTimeline> = self.threads.values().chain(&self.retired).collect();
        v.sort_by_key(|t| (t.pid, t.tid, t.start));
        v
    }

    /// Where thread `t`'s samples found it (see [`IoTally`]).
    pub fn io_tally_of(&self, t: (u32, u32)) -> IoTally {
        self.io_tally.get(&t).copied().unwrap_or_default()
    }

    /// A process's command name: the live one's, else the first that
    /// exited with that pid; None where the recording never saw one.
    pub fn process_name(&self, pid: u32) -> Option<&str> {
        self.processes
            .get(&pid)
            .or_else(|| self.retired_processes.iter().find(|p| p.pid == pid))
            .map(|p| p.comm.as_str())
            .filter(|c| !c.is_empty())
    }

    /// What a thread is called in every output: its own name, else its
    /// process's (live or exited), else `pid/tid` — the one fallback for a
    /// thread whose name the recording never saw.
    pub fn thread_name(&self, pid: u32, tid: u32) -> String {
        self.threads
            .get(&(pid, tid))
            .map(|t| t.comm.as_str())
            .filter(|c| !c.is_empty())
            .or_else(|| self.process_name(pid))
            .map_or_else(|| format!("{pid}/{tid}"), str::to_string)
    }

    /// Every process of the recording, reused pids included.
    pub fn all_processes(&self) -> Vec<&ProcessTimeline> {
        let mut v: Vec<&ProcessTimeline> = self
            .processes
            .values()
            .chain(&self.retired_processes)
            .collect();
        v.sort_by_key(|p| (p.pid, p.start));
        v
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct BuildOptions {
    /// Keep the state intervals the GPU attribution reads (the per-thread
    /// report needs none).
    pub intervals: bool,
    /// Keep every state interval, sample and long syscall: the pictures and
    /// the timeline export draw them all.
    pub pictures: bool,
    /// Keep every state interval the attribution reads, for an attribution
    /// that lets go of them as it goes (the GPU side comes with the events,
    /// so where its gaps lie is not known ahead).
    pub recent: bool,
}

/// The thread an event is about, created on first sight.
fn thread_mut<'a>(
    threads: &'a mut BTreeMap<(u32, u32), ThreadTimeline>,
    pid: u32,
    tid: u32,
    ts: u64,
    keep: &Keep,
) -> &'a mut ThreadTimeline {
    threads
        .entry((pid, tid))
        .or_insert_with(|| ThreadTimeline::first_seen(pid, tid, ts, keep.clone()))
}

impl Timeline {
    /// Replays the session's events; its GPU records and profiler ops move
    /// into the timeline's GPU side.
    pub fn build(session: &mut Session, opts: BuildOptions) -> Timeline {
        let mut tl = Timeline::begin(session, opts);
        let mut stacks = SampleStacks::new();
        for e in &session.events {
            count_sample(&mut stacks, e);
        }
        tl.io_tally = io_tally(&stacks, &session.symbols);
        // Records are written in ring-buffer order, which differs from time
        // order by at most a few microseconds across CPUs; the reader puts
        // them in time order, and a session built another way is sorted
        // here (by reference, leaving it as it is).
        let mut last = None;
        if session.events.is_sorted_by_key(Event::ts) {
            for e in &session.events {
                tl.apply(e);
            }
            last = session.events.last().map(Event::ts);
        } else {
            let mut v: Vec<&Event> = session.events.iter().collect();
            v.sort_by_key(|e| e.ts());
            for e in &v {
                tl.apply(e);
            }
            if let Some(e) = v.last() {
                last = Some(e.ts());
            }
        }
        tl.end(session, last);
        tl
    }

    /// A timeline before any event: the threads, processes and fds known at
    /// the start, and the GPU side (the session's GPU records and profiler
    /// ops move into it). Feed it events in time order with [`apply`], then
    /// close it with [`end`].
    ///
    /// [`apply`]: Timeline::apply
    /// [`end`]: Timeline::end
    pub fn begin(session: &mut Session, opts: BuildOptions) -> Timeline {
        let gpu = GpuSide::build(session);
        Timeline::begin_with(session, gpu, opts)
    }

    /// [`begin`](Timeline::begin) with a GPU side built apart.
    pub fn begin_with(session: &Session, gpu: GpuSide, opts: BuildOptions) -> Timeline {
        let start = session.header().start_ns;
        let keep = if opts.pictures {
            Keep::Everything
        } else if opts.intervals && opts.recent {
            Keep::Recent
        } else if opts.intervals {
            Keep::Gaps(std::sync::Arc::new(gpu.wanted()))
        } else {
            Keep::Accounts
        };
        let mut tl = Timeline {
            start,
            end: start,
            threads: BTreeMap::new(),
            processes: BTreeMap::new(),
            fd_paths: HashMap::new(),
            retired: Vec::new(),
            retired_processes: Vec::new(),
            gpu,
            cpu_idle: session.cpu_idle.clone(),
            neighbours: session.neighbours.clone(),
            retransmits: Vec::new(),
            keep,
            shimmed: session
                .gpu_sources
                .iter()
                .filter(|g| g.kind == crate::session::SourceKind::Cupti)
                .map(|g| g.pid)
                .collect(),
            io_tally: HashMap::new(),
        };
        for p in &session.processes {
            let e = tl.processes.entry(p.pid).or_default();
            e.pid = p.pid;
            e.ppid = p.ppid;
            e.comm = p.comm.clone();
            if !p.argv.is_empty() {
                e.argv = p.argv.clone();
            }
        }
        for (&pid, r) in &session.process_ranks {
            if let Some(p) = tl.processes.get_mut(&pid) {
                p.rank = Some(r.rank);
            }
        }
        for f in &session.fd_paths {
            tl.fd_paths.insert((f.pid, f.fd), f.path.clone());
        }
        for seed in &session.threads {
            tl.threads.insert(
                (seed.pid, seed.tid),
                ThreadTimeline::seeded(seed, start, tl.keep.clone()),
            );
        }
        tl
    }

    /// How many CPUs sat idle on average over `[a, b)` (clipped to the
    /// readings' span); None without two readings inside it.
    pub fn idle_cpus(&self, a: u64, b: u64) -> Option<f64> {
        cpus_between(&self.cpu_idle, |r| (r.ts, r.idle_ns), a, b)
    }

    /// How many CPUs unrecorded tasks held on average over `[a, b)`: (in
    /// the job's own scheduling group, elsewhere); None as for
    /// [`Timeline::idle_cpus`].
    pub fn neighbour_cpus(&self, a: u64, b: u64) -> Option<(f64, f64)> {
        let v = &self.neighbours;
        Some((
            cpus_between(v, |r| (r.ts, r.same_group_ns), a, b)?,
            cpus_between(v, |r| (r.ts, r.elsewhere_ns), a, b)?,
        ))
    }

    /// Closes every account at the end of the recording. `last_event`: the
    /// time of the last event applied.
    pub fn end(&mut self, session: &Session, last_event: Option<u64>) {
        // A session cut short ends at the last moment it is known to have
        // been recording: its last event or its last periodic drops record.
        let last_seen = last_event.unwrap_or(self.start).max(session.drops.ts);
        let end = recorded_end(session).unwrap_or(last_seen.max(self.start));
        self.end = end;
        // Before the living are closed: until then, dead means exited.
        self.account_io(&session.thread_io);
        for t in self.threads.values_mut() {
            t.finish(end);
        }
        for t in self.threads.values_mut().chain(self.retired.iter_mut()) {
            if let Some(v) = t.sample_times.as_mut() {
                v.sort_unstable();
            }
        }
        for calls in self.gpu.calls.values_mut() {
            calls.sort_by_key(|c| c.start);
        }
        // A side read whole is summed here; one that came with the events
        // was summed as it came.
        if !self.gpu.windowed {
            self.gpu.totals = totals::GpuTotals::of(&self.gpu);
        }
        // Threads whose names came only from /proc or fork keep those.
        for t in self.threads.values_mut().chain(self.retired.iter_mut()) {
            if t.comm.is_empty() {
                if let Some(p) = self.processes.get(&t.pid) {
                    t.comm = p.comm.clone();
                }
            }
        }
    }

    fn switch(
        &mut self,
        ts: u64,
        cpu: u16,
        out: Option<&SwitchOut>,
        in_: Option<(u32, u32)>,
        charged: Option<u64>,
    ) {
        let keep = &self.keep;
        if let Some(o) = out {
            let t = thread_mut(&mut self.threads, o.pid, o.tid, ts, keep);
            if o.preempted {
                *t.preempted_by.entry(o.next.0).or_default() += 1;
            }
            t.switch_out(ts, o, charged);
        }
        if let Some((pid, tid)) = in_ {
            thread_mut(&mut self.threads, pid, tid, ts, keep).switch_in(ts, cpu);
        }
    }

    /// One event into the thread and process accounts; events come in time
    /// order.
    pub fn apply(&mut self, e: &Event) {
        let keep = &self.keep;
        match e {
            Event::Switch { ts, cpu, out, in_ } => self.switch(*ts, *cpu, out.as_ref(), *in_, None),
            Event::ChargedSwitch {
                ts,
                cpu,
                out,
                in_,
                charged,
            } => self.switch(*ts, *cpu, out.as_ref(), *in_, Some(*charged)),
            Event::Wakeup {
                ts,
                pid,
                tid,
                waker_pid,
                waker_tid,
                new_task,
            } => {
                if !new_task {
                    thread_mut(&mut self.threads, *pid, *tid, *ts, keep)
                        .wakeup(*ts, (*waker_pid, *waker_tid));
                }
                // Waking a thread is done on a CPU.
                if let Some(w) = self.threads.get_mut(&(*waker_pid, *waker_tid)) {
                    w.evidence_of_running(*ts);
                }
            }
            Event::Syscall {
                ts,
                pid,
                tid,
                dur,
                nr,
                fd,
                fd_kind,
                ret,
            } => {
                let t = thread_mut(&mut self.threads, *pid, *tid, *ts, keep);
                t.evidence_of_running(*ts);
                t.syscall(*ts, *nr, *dur, *fd, *fd_kind, *ret);
            }
            Event::Sample {
                ts,
                pid,
                tid,
                ustack,
                kstack,
                ..
            } => {
                let t = thread_mut(&mut self.threads, *pid, *tid, *ts, keep);
                t.evidence_of_running(*ts);
                t.sample(*ts, *ustack, *kstack);
            }
            // In no thread's context (a timer or the network stack): no
            // evidence of the thread running.
            Event::Retransmit {
                ts, pid, tid, peer, ..
            } => self.retransmits.push(Retransmit {
                ts: *ts,
                tid: (*pid, *tid),
                peer: *peer,
            }),
            Event::Fault { ts, pid, tid, .. } => {
                let t = thread_mut(&mut self.threads, *pid, *tid, *ts, keep);
                t.evidence_of_running(*ts);
                t.page_faults += 1;
            }
            Event::Fork {
                ts,
                pid,
                tid,
                parent_pid,
                parent_tid,
                thread: is_thread,
                comm,
            } => {
                let mut t = ThreadTimeline::forked(*pid, *tid, *ts, keep.clone());
                t.comm = comm.clone();
                t.creator = Some((*parent_pid, *parent_tid));
                // A new task with the id of one seen before: the kernel
                // reused it, the earlier one is over.
                if let Some(mut old) = self.threads.insert((*pid, *tid), t) {
                    old.finish(*ts);
                    self.retired.push(old);
                }
                if !is_thread {
                    // An entry that has started is an earlier process
                    // with this pid; one filled from metadata only is
                    // this one's.
                    if self.processes.get(pid).is_some_and(|p| p.start.is_some()) {
                        let old = self.processes.remove(pid).expect("checked above");
                        self.retired_processes.push(old);
                    }
                    let p = self.processes.entry(*pid).or_default();
                    p.pid = *pid;
                    p.ppid = *parent_pid;
                    p.comm = comm.clone();
                    p.start = Some(*ts);
                }
            }
            Event::Exec {
                pid,
                tid,
                comm,
                filename,
                ..
            } => {
                let p = self.processes.entry(*pid).or_default();
                p.pid = *pid;
                p.comm = comm.clone();
                p.execs.push(filename.clone());
                if let Some(t) = self.threads.get_mut(&(*pid, *tid)) {
                    t.comm = comm.clone();
                }
            }
            Event::Exit {
                ts,
                pid,
                tid,
                status,
                group_dead,
                comm,
            } => {
                let t = thread_mut(&mut self.threads, *pid, *tid, *ts, keep);
                t.exit(*ts);
                t.comm = comm.clone();
                if *group_dead {
                    let p = self.processes.entry(*pid).or_default();
                    p.pid = *pid;
                    p.end = Some(*ts);
                    p.exit_code = Some(crate::session::exit_code_of(*status));
                }
            }
            Event::Open { pid, fd, path, .. } => {
                self.fd_paths.insert((*pid, *fd), path.clone());
            }
            Event::BlockedRead {
                ts,
                pid,
                tid,
                fd,
                fd_kind,
                size,
                ..
            } => {
                if matches!(fd_kind, FdKind::File | FdKind::Block) {
                    // The path the fd has now: a loader reusing one fd
                    // number for file after file is charged file by file.
                    let path = self.fd_paths.get(&(*pid, *fd));
                    thread_mut(&mut self.threads, *pid, *tid, *ts, keep).blocked_read(
                        path.map(String::as_str),
                        *fd,
                        *size,
                    );
                }
            }
            Event::CudaCall {
                ts,
                pid,
                tid,
                dur,
                function,
                arg,
            } => {
                thread_mut(&mut self.threads, *pid, *tid, *ts, keep).evidence_of_running(*ts);
                if !self.shimmed.contains(pid) {
                    self.gpu.uprobe_call(*pid, *tid, *ts, *dur, function, *arg);
                }
            }
        }
    }
}

/// A cumulative CPU-time counter's average rate over `[a, b)` in CPUs,
/// clipped to its readings' span, each reading taken as rising evenly to
/// the next; None without two readings inside it. `reading`: (time, ns).
fn cpus_between<R>(v: &[R], reading: impl Fn(&R) -> (u64, u64), a: u64, b: u64) -> Option<f64> {
    let (a, b) = (a.max(reading(v.first()?).0), b.min(reading(v.last()?).0));
    if b <= a {
        return None;
    }
    // The counter at `t`, inside the readings' span: the first reading at
    // or after it, and the one before when it is after.
    let at = |t: u64| -> f64 {
        let i = v.partition_point(|r| reading(r).0 < t);
        let next = reading(&v[i]);
        match i.checked_sub(1).map(|j| reading(&v[j])) {
            Some(prev) if next.0 > t => {
                prev.1 as f64
                    + next.1.saturating_sub(prev.1) as f64 * (t - prev.0) as f64
                        / (next.0 - prev.0) as f64
            }
            _ => next.1 as f64,
        }
    };
    Some((at(b) - at(a)).max(0.0) / (b - a) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{GpuSource, SessionHeader, SourceKind};

    /// Each thread's samples, told apart by their kernel stacks: inside a
    /// read of a file, a receive from a socket, or elsewhere (unknown stacks
    /// too).
    #[test]
    fn io_tally_counts_samples_by_where_their_kernel_stacks_were() {
        let frames = |names: &[&str]| -> Vec<crate::session::Frame> {
            names
                .iter()
                .map(|n| crate::session::Frame {
                    function: n.to_string(),
                    module: String::new(),
                })
                .collect()
        };
        let symbols = HashMap::from([
            (
                1,
                frames(&["filemap_read", "vfs_read", "__x64_sys_pread64"]),
            ),
            (
                2,
                frames(&["tcp_recvmsg", "inet_recvmsg", "__x64_sys_recvfrom"]),
            ),
            (3, frames(&["asm_common_interrupt"])),
        ]);
        let mut stacks = SampleStacks::new();
        for (pid, tid, kstack) in [
            (5, 5, 1),
            (5, 5, 1),
            (5, 5, 0),
            (5, 6, 2),
            (5, 6, 3),
            (5, 6, 9),
        ] {
            count_sample(
                &mut stacks,
                &Event::Sample {
                    ts: 0,
                    pid,
                    tid,
                    cpu: 0,
                    ustack: 0,
                    kstack,
                },
            );
        }
        let t = io_tally(&stacks, &symbols);
        let tally = |samples, file, net| IoTally { samples, file, net };
        assert_eq!(t[&(5, 5)], tally(3, 2, 0));
        assert_eq!(t[&(5, 6)], tally(3, 0, 1));
        assert_eq!(t[&(5, 5)].split(300), (200, 0, 100));
        assert_eq!(t[&(5, 6)].split(301), (0, 100, 201));
        assert_eq!(IoTally::default().split(300), (0, 0, 300));
    }

    /// Idle CPUs between readings a second apart: 1.5 CPUs idle in the
    /// first second, none in the second; outside the readings, unknown.
    #[test]
    fn idle_cpus_between_readings() {
        const S: u64 = 1_000_000_000;
        let mut s = Session {
            header: Some(SessionHeader::for_test(crate::session::Mode::Run, 2)),
            ..Session::default()
        };
        for (ts, idle_ns) in [
            (S, 10 * S),
            (2 * S, 10 * S + 3 * S / 2),
            (3 * S, 10 * S + 3 * S / 2),
        ] {
            s.cpu_idle.push(crate::session::CpuIdle { ts, idle_ns });
        }
        let tl = Timeline::build(&mut s, BuildOptions::default());
        let near = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 1e-9);
        assert!(near(tl.idle_cpus(S, 2 * S), 1.5));
        assert!(near(tl.idle_cpus(S + S / 2, 2 * S + S / 2), 0.75));
        assert!(
            near(tl.idle_cpus(0, 3 * S), 0.75),
            "clipped to the readings"
        );
        assert!(near(tl.idle_cpus(2 * S, 5 * S), 0.0));
        assert_eq!(tl.idle_cpus(3 * S, 4 * S), None);
        assert_eq!(
            Timeline::build(
                &mut Session {
                    cpu_idle: vec![],
                    ..s
                },
                BuildOptions::default()
            )
            .idle_cpus(0, S),
            None
        );
    }

    /// A process whose shim reports its CUDA calls is not counted a second
    /// time from libcuda uprobes; one without a shim is.
    #[test]
    fn uprobe_calls_of_a_shimmed_process_are_left_out() {
        let header = Some(SessionHeader::for_test(crate::session::Mode::Attach, 1));
        let source = |pid, kind| GpuSource {
            pid,
            kind,
            hello: gapscope_wire::Hello {
                version: 0,
                pid,
                driver_version: 0,
                cupti_version: 0,
                clock: gapscope_wire::ClockMethod::Native,
                source: String::new(),
            },
        };
        let mut s = Session {
            header,
            gpu_sources: vec![source(1, SourceKind::Cupti), source(2, SourceKind::Uprobe)],
            ..Session::default()
        };
        for pid in [1, 2] {
            s.events.push(Event::CudaCall {
                ts: 100,
                pid,
                tid: pid,
                dur: 10,
                function: "cuLaunchKernel".into(),
                arg: 0,
            });
        }
        let tl = Timeline::build(&mut s, BuildOptions::default());
        let pids: Vec<u32> = tl.gpu.calls.keys().map(|k| k.0).collect();
        assert_eq!(pids, vec![2]);
    }
}
