//! One recording for all of a node's jobs (the agent's): the BPF programs
//! loaded and attached once, every job's process tree tracked in the same
//! filter, and each kernel record routed to the job whose tree it is in,
//! each job cut into windows of its own. A node running eight jobs runs
//! one set of programs at every context switch, not eight.
//!
//! What the kernel side counts for the whole machine is each job's as
//! read: its drop counters, and what the machine's untracked tasks ran
//! (another job's threads are tracked, so not among them). gapscope's own
//! CPU over a window is the node's share per job.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::UnboundedReceiver;

use super::bpf::{abi, BpfError, Tracer, TracerConfig};
use super::event_loop::{self as lp, Probes, Started};
use super::sink::Sink;
use super::windows::{Closing, Windows};
use super::{gpu, io_err, nvml, own_cost, preflight, start, symbolize, sys};
use super::{RecordError, RecordOptions, Target};
use crate::clock;
use crate::session::{Record, StopReason};

/// The node's recording, on a thread of its own.
pub struct Node {
    commands: Sender<Follow>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A job to follow, and where to say whether its recording started.
struct Follow {
    pid: u32,
    opts: RecordOptions,
    started: Sender<Result<(), RecordError>>,
}

impl Node {
    /// Loads and attaches the programs; no process is tracked yet.
    pub fn start(config: &TracerConfig) -> Result<Node, RecordError> {
        preflight::check()?;
        let (commands, followed) = channel();
        let (ready, started) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (config, stopping) = (config.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gapscope-node".into())
            .spawn(move || {
                let setup = || -> Result<_, RecordError> {
                    let mut tracer = Tracer::load(&config)?;
                    tracer.attach()?;
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(io_err("starting the event loop"))?;
                    Ok((tracer, runtime))
                };
                match setup() {
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                    Ok((mut tracer, runtime)) => {
                        let _ = ready.send(Ok(()));
                        runtime.block_on(run(&mut tracer, followed, &stopping));
                    }
                }
            })
            .map_err(io_err("starting the node's recording"))?;
        started.recv().unwrap_or_else(|_| Err(stopped()))?;
        Ok(Node {
            commands,
            stop,
            thread: Some(thread),
        })
    }

    /// Records the process tree of `pid` in windows as `opts.windows` asks
    /// (which it must): each window goes to its `done` once closed, the
    /// last when the job exits or the node stops, and then `done` is let
    /// go of.
    pub fn follow(&self, pid: u32, opts: RecordOptions) -> Result<(), RecordError> {
        let (started, answer) = channel();
        self.commands
            .send(Follow { pid, opts, started })
            .map_err(|_| stopped())?;
        answer.recv().unwrap_or_else(|_| Err(stopped()))
    }

    /// Every job's window closes short and is handed over; then the
    /// programs are detached.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.halt();
    }
}

fn stopped() -> RecordError {
    RecordError::Io {
        what: "the node's recording".into(),
        source: std::io::Error::other("it has stopped"),
    }
}

/// A job being recorded.
struct Job {
    sink: Sink,
    pidfd: OwnedFd,
    windows: Windows,
    gpu_rx: UnboundedReceiver<Record>,
    streams: Option<gpu::GpuStreams>,
    sampler: Option<nvml::Sampler>,
    /// Its processes, for the NVML sampler.
    tree: Arc<RwLock<HashSet<u32>>>,
    next_cut: Instant,
    /// The window cut last, still taking its late GPU records.
    closing: Option<Closing>,
    /// The node's CPU time when its window began.
    cpu_from: u64,
    ending: Option<Ending>,
}

/// A job that has stopped, waiting for its GPU streams to end.
struct Ending {
    end_ns: u64,
    reason: StopReason,
    cpu_ns: u64,
    streams: Option<tokio::task::JoinHandle<()>>,
}

/// How often the kernel's records are drained when it does not wake us.
const TICK: Duration = Duration::from_millis(50);

async fn run(tracer: &mut Tracer, followed: Receiver<Follow>, stop: &AtomicBool) {
    // SAFETY: the ring buffer's fd belongs to `tracer`, which outlives this
    // function.
    let ring = unsafe {
        AsyncFd::register_with_interest(sys::Readable(Probes::ring_fd(tracer)), Interest::READABLE)
    }
    .ok();
    let mut tick = tokio::time::interval(TICK);
    let mut jobs: Vec<Job> = Vec::new();
    let mut last_second = Instant::now();
    loop {
        match &ring {
            Some(ring) => tokio::select! {
                guard = ring.readable() => {
                    if let Ok(mut g) = guard {
                        g.clear_ready();
                    }
                }
                _ = tick.tick() => {}
            },
            None => {
                tick.tick().await;
            }
        }
        drain(tracer, &mut jobs);
        while let Ok(f) = followed.try_recv() {
            let added = add(tracer, f.pid, &f.opts, jobs.len() + 1).map(|job| jobs.push(job));
            let _ = f.started.send(added);
        }
        let stopping = stop.load(Ordering::SeqCst);
        let second = last_second.elapsed() >= Duration::from_secs(1);
        if second {
            last_second = Instant::now();
        }
        let share = jobs.len().max(1) as u64;
        let mut i = 0;
        while i < jobs.len() {
            let job = &mut jobs[i];
            while let Ok(r) = job.gpu_rx.try_recv() {
                lp::route(&mut job.sink, job.closing.as_mut(), r);
            }
            if let Some(e) = &job.ending {
                if e.streams.as_ref().is_none_or(|s| s.is_finished()) {
                    let job = jobs.swap_remove(i);
                    end(tracer, &mut jobs, job);
                } else {
                    i += 1;
                }
                continue;
            }
            if second {
                lp::upkeep(tracer, &mut job.sink, &job.tree);
                if let Some(s) = job.streams.as_mut() {
                    s.connect(job.sink.live().iter().copied());
                }
            }
            lp::install_python(tracer, &mut job.sink);
            let (_, exited_ns) = job.sink.target_exit();
            let exited = exited_ns.is_some() || !sys::alive(&job.pidfd);
            let asked = stopping || job.windows.stop.load(Ordering::SeqCst);
            if exited || asked || job.sink.failed() {
                let now_ns = clock::monotonic_ns();
                let start = job.sink.window_start();
                let end_ns = exited_ns
                    .filter(|&t| exited && t >= start && t <= now_ns)
                    .unwrap_or(now_ns);
                lp::read_machine(tracer, &mut job.sink);
                if let Some(s) = job.sampler.take() {
                    s.stop();
                }
                job.ending = Some(Ending {
                    end_ns,
                    reason: if exited {
                        StopReason::TargetExited
                    } else {
                        StopReason::Interrupted
                    },
                    cpu_ns: own_cost().cpu_ns.saturating_sub(job.cpu_from) / share,
                    // GPU processes flush at exit: their streams get a
                    // moment to arrive, while the other jobs go on.
                    streams: job
                        .streams
                        .take()
                        .map(|s| tokio::spawn(s.finish(Duration::from_secs(3)))),
                });
                i += 1;
                continue;
            }
            if Instant::now() >= job.next_cut {
                let mut job = jobs.swap_remove(i);
                if let Some(c) = job.closing.take() {
                    c.close(&job.windows.done);
                }
                let cpu_ns = own_cost().cpu_ns.saturating_sub(job.cpu_from) / share;
                let cut = lp::cut(
                    &mut Shared {
                        tracer: &mut *tracer,
                        mine: job.sink.live().clone(),
                        others: &mut jobs,
                    },
                    &mut job.sink,
                    cpu_ns,
                );
                job.cpu_from = own_cost().cpu_ns;
                job.next_cut = Instant::now() + job.windows.every;
                match cut {
                    Ok(c) => job.closing = Some(c),
                    Err(e) => {
                        let _ = job.windows.done.send(Err(e));
                        job.windows.stop.store(true, Ordering::SeqCst);
                    }
                }
                // At the end: the job swapped into `i` is looked at next.
                jobs.push(job);
                continue;
            }
            if job
                .closing
                .as_ref()
                .is_some_and(|c| Instant::now() >= c.until)
            {
                if let Some(c) = job.closing.take() {
                    c.close(&job.windows.done);
                }
            }
            i += 1;
        }
        if stopping && jobs.is_empty() {
            break;
        }
    }
}

/// Starts following the tree of `pid`: checked, seeded and tracked, its
/// GPU streams and sampler set up, its first window open. `jobs`: how many
/// the node follows with it.
fn add(
    tracer: &mut Tracer,
    pid: u32,
    opts: &RecordOptions,
    jobs: usize,
) -> Result<Job, RecordError> {
    let windows = opts.windows.clone().ok_or_else(|| RecordError::Io {
        what: format!("following {pid}"),
        source: std::io::Error::other("a node records its jobs in windows"),
    })?;
    let checked = start::check(Target::Pid(pid), opts)?;
    let Started {
        mut sink,
        pidfd,
        child: _,
        gpu: gpu_setup,
    } = start::join(tracer, checked, opts, symbolize::Worker::start())?;
    let (gpu_tx, gpu_rx) = tokio::sync::mpsc::unbounded_channel();
    let tree = Arc::new(RwLock::new(sink.live().clone()));
    let mut streams = None;
    let mut sampler = None;
    if let Some(setup) = gpu_setup {
        let mut s = gpu::GpuStreams::new(gpu_tx.clone());
        s.attached_at(sink.window_start());
        s.connect(sink.live().iter().copied());
        streams = Some(s);
        sampler = Some(nvml::Sampler::start(setup.nvml_hz, tree.clone(), gpu_tx));
    }
    if jobs > 1 {
        sink.push(Record::Note(format!(
            "recorded by one set of programs with the node's other jobs ({} in all when it began)",
            jobs
        )));
    }
    lp::read_machine(tracer, &mut sink);
    // The header and seeds go to disk now.
    sink.flush_now()?;
    Ok(Job {
        sink,
        pidfd,
        next_cut: Instant::now() + windows.every,
        windows,
        gpu_rx,
        streams,
        sampler,
        tree,
        closing: None,
        cpu_from: own_cost().cpu_ns,
        ending: None,
    })
}

/// Closes a job that has ended: its last window sealed and handed over,
/// the kernel's records on the way routed to the others.
fn end(tracer: &mut Tracer, others: &mut [Job], mut job: Job) {
    while let Ok(r) = job.gpu_rx.try_recv() {
        lp::route(&mut job.sink, job.closing.as_mut(), r);
    }
    if let Some(c) = job.closing.take() {
        c.close(&job.windows.done);
    }
    let Some(e) = job.ending.take() else {
        return;
    };
    let last = lp::finish(
        &mut Shared {
            tracer,
            mine: job.sink.live().clone(),
            others,
        },
        job.sink,
        e.cpu_ns,
        e.end_ns,
        e.reason,
        None,
        false,
    );
    // Then `done` goes with the job: the follower sees the end.
    let _ = job.windows.done.send(last);
}

/// Hands every kernel record waiting to the job it belongs to.
fn drain(tracer: &mut Tracer, jobs: &mut [Job]) {
    Probes::drain(tracer, &mut |b| route(jobs, b, &mut |_| {}));
}

/// What routing asks of a job: whether its tree holds a process, and to
/// take a record.
trait Tree {
    fn holds(&self, pid: u32) -> bool;
    fn take(&mut self, bytes: &[u8]);
}

impl Tree for Job {
    fn holds(&self, pid: u32) -> bool {
        self.sink.live().contains(&pid)
    }
    fn take(&mut self, bytes: &[u8]) {
        self.sink.handle(bytes)
    }
}

/// The job whose tree holds process `pid`.
fn owner(jobs: &[impl Tree], pid: u32) -> Option<usize> {
    jobs.iter().position(|j| j.holds(pid))
}

/// Gives kernel record `bytes` to the job whose tree it is in (a fork: its
/// parent's); a switch between threads of two jobs is split, each getting
/// its own side. What is in none of `jobs` goes to `rest`.
fn route(jobs: &mut [impl Tree], bytes: &[u8], rest: &mut dyn FnMut(&[u8])) {
    let Some(h) = abi::read::<abi::Header>(bytes) else {
        return rest(bytes);
    };
    let pid = match h.kind {
        abi::kind::FORK => match abi::read::<abi::Fork>(bytes) {
            Some(f) => f.parent_pid,
            None => h.pid,
        },
        abi::kind::SWITCH => {
            let Some(e) = abi::read::<abi::Switch>(bytes) else {
                return rest(bytes);
            };
            let side =
                |pid: u32, flag: u8| (e.flags & flag != 0).then(|| owner(jobs, pid)).flatten();
            let (prev, next) = (
                side(e.prev_pid, abi::SW_PREV_TRACKED),
                side(e.next_pid, abi::SW_NEXT_TRACKED),
            );
            if prev == next {
                return match prev {
                    Some(i) => jobs[i].take(bytes),
                    None => rest(bytes),
                };
            }
            for (to, keep) in [(prev, abi::SW_PREV_TRACKED), (next, abi::SW_NEXT_TRACKED)] {
                if e.flags & keep == 0 {
                    continue;
                }
                let mut half = e;
                half.flags &= !((abi::SW_PREV_TRACKED | abi::SW_NEXT_TRACKED) & !keep);
                let half = bytemuck::bytes_of(&half);
                match to {
                    Some(i) => jobs[i].take(half),
                    None => rest(half),
                }
            }
            return;
        }
        _ => h.pid,
    };
    match owner(jobs, pid) {
        Some(i) => jobs[i].take(bytes),
        None => rest(bytes),
    }
}

/// The kernel side as one job sees it while its window is cut or closed:
/// the records of the node's other jobs go to them as they pass, and of
/// the rest only what is in its own tree (`mine`, its processes as it
/// began, and the children they fork meanwhile) reaches it — not what a
/// job that has ended left running.
struct Shared<'a> {
    tracer: &'a mut Tracer,
    mine: HashSet<u32>,
    others: &'a mut [Job],
}

/// A job's tree while its window is sealed: its processes, and the
/// children they fork meanwhile; what reaches it goes to `f`.
struct Mine<'a, 'f> {
    pids: &'a mut HashSet<u32>,
    f: &'f mut dyn FnMut(&[u8]),
}

impl Tree for Mine<'_, '_> {
    fn holds(&self, pid: u32) -> bool {
        self.pids.contains(&pid)
    }
    fn take(&mut self, bytes: &[u8]) {
        if let Some(h) = abi::read::<abi::Header>(bytes).filter(|h| h.kind == abi::kind::FORK) {
            self.pids.insert(h.pid);
        }
        (self.f)(bytes)
    }
}

/// Passes on to `f` the part of kernel record `bytes` that is in the tree
/// `mine` (a fork of one of its processes adds the child), routed as the
/// node routes any record.
fn claim(mine: &mut HashSet<u32>, bytes: &[u8], f: &mut dyn FnMut(&[u8])) {
    route(&mut [Mine { pids: mine, f }], bytes, &mut |_| {});
}

impl Probes for Shared<'_> {
    fn ring_fd(&self) -> std::os::fd::RawFd {
        Probes::ring_fd(&*self.tracer)
    }
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let (others, mine) = (&mut *self.others, &mut self.mine);
        Probes::drain(self.tracer, &mut |b| {
            route(others, b, &mut |x| claim(mine, x, &mut *f))
        })
    }
    fn drops(&self) -> Result<[u64; abi::kind::MAX], BpfError> {
        Probes::drops(&*self.tracer)
    }
    fn neighbours(&self) -> Result<(u64, u64), BpfError> {
        Probes::neighbours(&*self.tracer)
    }
    fn forget_stacks(&mut self) {
        Probes::forget_stacks(self.tracer)
    }
    fn set_python(&mut self, tgid: u32, py: &abi::PyProc) -> Result<(), BpfError> {
        Probes::set_python(self.tracer, tgid, py)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    /// A job's tree and the records it was given.
    struct Fake {
        pids: HashSet<u32>,
        got: Vec<Vec<u8>>,
    }

    impl Tree for Fake {
        fn holds(&self, pid: u32) -> bool {
            self.pids.contains(&pid)
        }
        fn take(&mut self, bytes: &[u8]) {
            self.got.push(bytes.to_vec());
        }
    }

    fn header(kind: u16, pid: u32, size: usize) -> abi::Header {
        abi::Header {
            ts: 1,
            pid,
            tid: pid,
            kind,
            cpu: 0,
            size: size as u32,
        }
    }

    fn switch(prev: Option<u32>, next: Option<u32>) -> Vec<u8> {
        let mut e = abi::Switch::zeroed();
        e.h = header(
            abi::kind::SWITCH,
            prev.unwrap_or(0),
            std::mem::size_of::<abi::Switch>(),
        );
        if let Some(p) = prev {
            (e.prev_pid, e.prev_tid) = (p, p);
            e.flags |= abi::SW_PREV_TRACKED | abi::SW_CHARGED;
        }
        if let Some(n) = next {
            (e.next_pid, e.next_tid) = (n, n);
            e.flags |= abi::SW_NEXT_TRACKED;
        }
        bytemuck::bytes_of(&e).to_vec()
    }

    fn sides(bytes: &[u8]) -> (Option<u32>, Option<u32>) {
        let e: abi::Switch = abi::read(bytes).unwrap();
        (
            (e.flags & abi::SW_PREV_TRACKED != 0).then_some(e.prev_pid),
            (e.flags & abi::SW_NEXT_TRACKED != 0).then_some(e.next_pid),
        )
    }

    #[test]
    fn each_job_gets_its_own_records_and_its_side_of_a_switch() {
        let job = |pids: &[u32]| Fake {
            pids: pids.iter().copied().collect(),
            got: Vec::new(),
        };
        let mut jobs = [job(&[10, 11]), job(&[20])];
        let mut rest = Vec::new();
        let mut give =
            |jobs: &mut [Fake], b: Vec<u8>| route(jobs, &b, &mut |x| rest.push(x.to_vec()));

        // A fork: its parent's job, though the child is in no tree yet.
        let mut fork = abi::Fork::zeroed();
        fork.h = header(abi::kind::FORK, 12, std::mem::size_of::<abi::Fork>());
        (fork.parent_pid, fork.parent_tid) = (11, 11);
        give(&mut jobs, bytemuck::bytes_of(&fork).to_vec());
        // Within one job, whole; between two, split; with an untracked
        // side, the tracked side's job.
        give(&mut jobs, switch(Some(10), Some(11)));
        give(&mut jobs, switch(Some(10), Some(20)));
        give(&mut jobs, switch(Some(20), None));
        // A process in no job's tree.
        give(&mut jobs, switch(Some(30), None));
        let mut exit = abi::Exit::zeroed();
        exit.h = header(abi::kind::EXIT, 20, std::mem::size_of::<abi::Exit>());
        give(&mut jobs, bytemuck::bytes_of(&exit).to_vec());

        let [a, b] = &jobs;
        assert_eq!(a.got.len(), 3);
        assert_eq!(
            abi::read::<abi::Header>(&a.got[0]).unwrap().kind,
            abi::kind::FORK
        );
        assert_eq!(sides(&a.got[1]), (Some(10), Some(11)));
        assert_eq!(sides(&a.got[2]), (Some(10), None));
        assert_eq!(b.got.len(), 3);
        assert_eq!(sides(&b.got[0]), (None, Some(20)));
        // The half without its thread says nothing of what the kernel
        // charged it.
        let e: abi::Switch = abi::read(&b.got[0]).unwrap();
        assert_eq!(e.flags & abi::SW_PREV_TRACKED, 0);
        assert_eq!(sides(&b.got[1]), (Some(20), None));
        assert_eq!(
            abi::read::<abi::Header>(&b.got[2]).unwrap().kind,
            abi::kind::EXIT
        );
        assert_eq!(rest.len(), 1);
        assert_eq!(sides(&rest[0]), (Some(30), None));
    }

    /// While a job's window is sealed, of what no other job takes only its
    /// own part reaches it: not a process of a job that has ended.
    #[test]
    fn a_job_being_sealed_takes_only_its_own_tree() {
        let mut mine: HashSet<u32> = [10].into();
        let mut got = Vec::new();
        let mut take = |b: Vec<u8>| claim(&mut mine, &b, &mut |x| got.push(x.to_vec()));
        let mut fork = abi::Fork::zeroed();
        fork.h = header(abi::kind::FORK, 12, std::mem::size_of::<abi::Fork>());
        fork.parent_pid = 10;
        take(bytemuck::bytes_of(&fork).to_vec());
        // Its new child's switch to a tracked thread of no job: its side.
        take(switch(Some(12), Some(40)));
        // Another's process, and the ended job's switches among themselves.
        let mut exit = abi::Exit::zeroed();
        exit.h = header(abi::kind::EXIT, 40, std::mem::size_of::<abi::Exit>());
        take(bytemuck::bytes_of(&exit).to_vec());
        take(switch(Some(40), Some(41)));
        take(switch(Some(10), Some(12)));
        assert_eq!(got.len(), 3);
        assert_eq!(sides(&got[1]), (Some(12), None));
        assert_eq!(sides(&got[2]), (Some(10), Some(12)));
    }
}
