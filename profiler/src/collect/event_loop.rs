//! The event loop of a recording: the kernel's records drained into the
//! session as they come, GPU records routed to the window they belong in,
//! the target's exit, the duration, signals and window cuts waited on; then
//! the session sealed and closed. The kernel side is reached through
//! [`Probes`], so the loop runs without root on recorded records (tests).

use std::collections::HashSet;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::bpf::{abi, BpfError, Tracer};
use super::seed::{push_thread_io, seed_process};
use super::signals::{Signal, SignalSource};
use super::sink::Sink;
use super::{gpu, io_err, launch, nvml, own_cost, procfs, status, sys, windows};
use super::{RecordError, RecordOptions, Recording};
use crate::clock;
use crate::session::{Drops, Footer, Mode, Record, StopReason};

/// The kernel side as the event loop sees it: the loaded programs
/// ([`Tracer`]), or records played back in a test.
pub(super) trait Probes {
    /// Readable when records wait to be drained.
    fn ring_fd(&self) -> RawFd;
    /// Hands every record waiting to `f`; returns how many.
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> usize;
    /// Records lost so far, per event kind.
    fn drops(&self) -> Result<[u64; abi::kind::MAX], BpfError>;
    /// What unrecorded tasks have run: (same scheduling group, elsewhere).
    fn neighbours(&self) -> Result<(u64, u64), BpfError>;
    /// Lets the kernel side send each stack again when next seen.
    fn forget_stacks(&mut self);
    /// Where a CPython process's frames are.
    fn set_python(&mut self, tgid: u32, py: &abi::PyProc) -> Result<(), BpfError>;
}

impl Probes for Tracer {
    fn ring_fd(&self) -> RawFd {
        Tracer::ring_fd(self)
    }
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        Tracer::drain(self, f)
    }
    fn drops(&self) -> Result<[u64; abi::kind::MAX], BpfError> {
        Tracer::drops(self)
    }
    fn neighbours(&self) -> Result<(u64, u64), BpfError> {
        Tracer::neighbours(self)
    }
    fn forget_stacks(&mut self) {
        Tracer::forget_stacks(self)
    }
    fn set_python(&mut self, tgid: u32, py: &abi::PyProc) -> Result<(), BpfError> {
        Tracer::set_python(self, tgid, py)
    }
}

/// What the event loop needs to collect GPU activity.
pub(super) struct GpuSetup {
    /// `run`: where the target's shims connect; `attach`: none (we connect).
    pub listener: Option<gpu::GpuListener>,
    pub nvml_hz: u64,
}

/// A recording started: its session seeded, its target watched through
/// `pidfd` (`child` if we started it), its GPU sources if recorded.
pub(super) struct Started {
    pub sink: Sink,
    pub pidfd: OwnedFd,
    pub child: Option<u32>,
    pub gpu: Option<GpuSetup>,
}

/// Runs a started recording until the target exits, the duration passes or
/// a signal stops it, cutting windows on the way if asked; then closes the
/// session.
pub(super) async fn run(
    tracer: &mut impl Probes,
    started: Started,
    mut signals: SignalSource,
    opts: &RecordOptions,
) -> Result<Recording, RecordError> {
    let Started {
        mut sink,
        pidfd,
        child,
        gpu: gpu_setup,
    } = started;
    let (gpu_tx, mut gpu_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut streams = gpu::GpuStreams::new(gpu_tx.clone());
    let tree = Arc::new(std::sync::RwLock::new(sink.live().clone()));
    let mut sampler = None;
    if let Some(setup) = gpu_setup {
        match setup.listener {
            Some(listener) => {
                if let Err(e) = streams.accept(listener, sink.target_pid()) {
                    sink.push(Record::Note(format!(
                        "GPU socket unusable ({e}): no CUPTI timeline"
                    )));
                }
            }
            None => {
                streams.attached_at(sink.window_start());
                streams.connect(sink.live().iter().copied())
            }
        }
        sampler = Some(nvml::Sampler::start(
            setup.nvml_hz,
            tree.clone(),
            gpu_tx.clone(),
        ));
    }
    drop(gpu_tx);
    // SAFETY: the ring buffer fd belongs to `tracer`, which outlives this
    // function; the pidfd is owned by the AsyncFd itself.
    let ring = unsafe {
        AsyncFd::register_with_interest(sys::Readable(tracer.ring_fd()), Interest::READABLE)
    }
    .map_err(|e| io_err("polling the ring buffer")(e.into()))?;
    let exited = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
        .map_err(|e| io_err("watching the target")(e.into()))?;
    let started = Instant::now();
    let cpu_at_start = own_cost().cpu_ns;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    // The kernel wakes us only for large batches; this bounds the latency of
    // small ones and paces flushes, drop counters and the status line.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut status = status::StatusLine::new(opts.status_line);
    read_machine(tracer, &mut sink);
    install_python(tracer, &mut sink);
    // The header and seeds go to disk now: a crash from here on still leaves
    // a readable session.
    sink.flush_now()?;
    let mut last_flush = Instant::now();
    let mut interrupts = 0;
    let mut target_left_running = false;
    // Windows: when the next cut is due, and the window cut last while it
    // still takes its late GPU records.
    let windows = opts.windows.as_ref();
    let mut next_cut = windows.map(|w| tokio::time::Instant::now() + w.every);
    let mut closing: Option<windows::Closing> = None;
    let mut window_cpu_from = cpu_at_start;

    let reason = loop {
        tokio::select! {
            guard = ring.readable() => {
                if let Ok(mut g) = guard {
                    g.clear_ready();
                }
                tracer.drain(&mut |b| sink.handle(b));
            }
            _ = tick.tick() => {
                if windows.is_some_and(|w| w.stop.load(std::sync::atomic::Ordering::SeqCst)) {
                    break StopReason::Interrupted;
                }
                tracer.drain(&mut |b| sink.handle(b));
                if last_flush.elapsed() >= Duration::from_secs(1) {
                    last_flush = Instant::now();
                    upkeep(tracer, &mut sink, &tree);
                    if child.is_none() && sampler.is_some() {
                        // Processes that started with the shim after we attached.
                        streams.connect(sink.live().iter().copied());
                    }
                }
                if status.enabled() {
                    let drops = tracer.drops().map(|d| d.iter().sum()).unwrap_or(0);
                    status.update(started.elapsed(), sink.events(), drops, sink.live().len());
                }
            }
            _ = tokio::time::sleep(PYTHON_POLL), if sink.watching_python() => sink.poll_python(),
            Some(record) = gpu_rx.recv() => route(&mut sink, closing.as_mut(), record),
            _ = exited.readable() => break StopReason::TargetExited,
            _ = sleep_until(deadline) => break StopReason::Duration,
            _ = sleep_until(next_cut) => {
                let w = windows.expect("cuts only with windows");
                if let Some(c) = closing.take() {
                    c.close(&w.done);
                }
                match cut(
                    tracer,
                    &mut sink,
                    own_cost().cpu_ns.saturating_sub(window_cpu_from),
                ) {
                    Ok(c) => closing = Some(c),
                    Err(e) => {
                        let _ = w.done.send(Err(e));
                        break StopReason::Interrupted;
                    }
                }
                window_cpu_from = own_cost().cpu_ns;
                next_cut = Some(tokio::time::Instant::now() + w.every);
            }
            _ = sleep_until(closing.as_ref().map(|c| c.until.into())) => {
                if let (Some(c), Some(w)) = (closing.take(), windows) {
                    c.close(&w.done);
                }
            }
            sig = signals.recv() => {
                match (sig, child) {
                    // `run`: the child gets the signal; we finish when it exits.
                    (Some(s), Some(pid)) => {
                        if !s.from_terminal {
                            sys::signal_child(pid, s.signo);
                        }
                        if s.signo == libc::SIGINT {
                            interrupts += 1;
                            if interrupts >= 2 {
                                target_left_running = true;
                                break StopReason::Interrupted;
                            }
                            status.message("interrupt sent to the target; Ctrl-C again to stop recording now");
                        }
                    }
                    // `attach`: stop recording, leave the target alone.
                    (Some(Signal { .. }), None) => break StopReason::Interrupted,
                    (None, _) => {}
                }
            }
        }
        install_python(tracer, &mut sink);
        if sink.failed() {
            break StopReason::Interrupted;
        }
    };
    status.clear();
    // Another signal from here on gives up on the symbols still being read.
    sink.give_up_on(signals.arm());
    // The window ends now, not after the GPU streams have drained below;
    // a target that exited ended it when the kernel saw it leave, however
    // late a busy loop got to its pidfd (under load, tens of ms: a longer
    // job than the one recorded).
    let now_ns = clock::monotonic_ns();
    let end_ns = match reason {
        StopReason::TargetExited => {
            tracer.drain(&mut |b| sink.handle(b));
            sink.target_exit()
                .1
                .filter(|&t| t >= sink.window_start() && t <= now_ns)
                .unwrap_or(now_ns)
        }
        _ => now_ns,
    };
    read_machine(tracer, &mut sink);
    let cpu_ns = own_cost().cpu_ns.saturating_sub(window_cpu_from);

    // GPU processes flush at exit; give their streams a moment to arrive.
    streams.finish(Duration::from_secs(3)).await;
    if let Some(s) = sampler {
        s.stop();
    }
    while let Ok(record) = gpu_rx.try_recv() {
        route(&mut sink, closing.as_mut(), record);
    }
    if let (Some(c), Some(w)) = (closing.take(), windows) {
        c.close(&w.done);
    }

    let mut exit_code = None;
    if let Some(pid) = child {
        if reason == StopReason::TargetExited {
            exit_code = sys::reap(pid).map(launch::exit_code_of);
        }
    }
    finish(
        tracer,
        sink,
        cpu_ns,
        end_ns,
        reason,
        exit_code,
        target_left_running,
    )
}

/// How often a python just exec'd is looked at until its libpython is
/// mapped.
const PYTHON_POLL: Duration = Duration::from_millis(2);

/// Tells the kernel side where the frames of the CPython processes the sink
/// found since the last call are.
pub(super) fn install_python(tracer: &mut impl Probes, sink: &mut Sink) {
    for (pid, py) in sink.take_python() {
        if let Err(e) = tracer.set_python(pid, &py) {
            sink.push(Record::Note(format!(
                "process {pid}: its Python frames cannot be walked ({e})"
            )));
        }
    }
}

/// A GPU-side record to the window it belongs in: while the window cut last
/// still takes late records, by its time ([`windows::split_at`]).
pub(super) fn route(sink: &mut Sink, closing: Option<&mut windows::Closing>, record: Record) {
    let Some(c) = closing else {
        return sink.push(record);
    };
    let (before, after) = windows::split_at(record, c.end_ns);
    if let Some(r) = before {
        c.push(&r);
    }
    if let Some(r) = after {
        sink.push(r);
    }
}

/// Cuts the recording: the window being written is closed to the kernel's
/// events (its stacks symbolized, its threads' I/O counters read, its cost
/// and drops written) and a new one opened in `dir`, beginning as a
/// session of its own would. Returns the old one, still open to late GPU
/// records.
pub(super) fn cut(
    tracer: &mut impl Probes,
    sink: &mut Sink,
    cpu_ns: u64,
) -> Result<windows::Closing, RecordError> {
    // The next window starts where this one ends: none of the job's time
    // falls between two windows (the new one's seeds are read a fraction
    // of a millisecond later).
    let (end_ns, end_unix_ns) = clock::pair();
    read_machine(tracer, sink);
    let drops = seal(tracer, sink, cpu_ns);
    let live = sorted(sink.live());
    // Stacks the kernel side has sent are in the old window only: it sends
    // them again when seen again.
    tracer.forget_stacks();
    let events = sink.events();
    let folder = sink
        .cutting_mut()
        .expect("cut only with windows")
        .folder
        .clone();
    let writer = windows::create(&folder)?;
    let old = sink.next_window(writer);
    let mut header = sink
        .header()
        .cloned()
        .expect("a recording begins with its header");
    (header.start_ns, header.start_unix_ns) = (end_ns, end_unix_ns);
    header.mode = Mode::Window;
    sink.push(Record::Header(header));
    for &pid in &live {
        let whole = !sink.withheld(pid);
        seed_process(sink, pid, whole);
    }
    let alive: HashSet<u32> = live.iter().copied().collect();
    let sticky = sink
        .cutting_mut()
        .map(|c| c.sticky.replay(|pid| alive.contains(&pid)));
    for r in sticky.into_iter().flatten() {
        sink.push(r);
    }
    read_machine(tracer, sink);
    sink.flush_now()?;
    Ok(windows::Closing::new(
        old,
        end_ns,
        events,
        drops.cpu_events(),
    ))
}

/// What a session gets before its footer, the last window of a recording
/// or one cut from it: the kernel's records still in the ring, its drop
/// counters, the stacks still waiting symbolized, the living threads' I/O
/// counters (those that exited were read by the kernel as they left), and
/// gapscope's own cost, `cpu_ns` of CPU. Returns the drops.
pub(super) fn seal(tracer: &mut impl Probes, sink: &mut Sink, cpu_ns: u64) -> Drops {
    tracer.drain(&mut |b| sink.handle(b));
    let drops = tracer
        .drops()
        .map(|d| sink.drops_record(&d))
        .unwrap_or_default();
    // The counters at the window's end, before the symbols (which take
    // long under load, while a process that outlives the recording reads
    // on: a test's target was counted a 4 MiB pass past the window).
    for pid in sorted(sink.live()) {
        for tid in procfs::threads(pid) {
            push_thread_io(sink, pid, tid, false);
        }
    }
    sink.finish_symbols();
    sink.push(Record::Cost(crate::session::CollectorCost {
        cpu_ns,
        peak_rss_bytes: own_cost().peak_rss_bytes,
    }));
    drops
}

fn sorted(pids: &HashSet<u32>) -> Vec<u32> {
    let mut v: Vec<u32> = pids.iter().copied().collect();
    v.sort_unstable();
    v
}

/// What a recording does once a second beside draining the kernel's
/// records: its process tree published (the GPU side follows it), the drop
/// counters and the machine's readings written, and the sink maintained
/// and flushed. One job's (`run`, `attach`) and each of a node's alike.
pub(super) fn upkeep(
    tracer: &impl Probes,
    sink: &mut Sink,
    tree: &std::sync::RwLock<HashSet<u32>>,
) {
    if let Ok(mut t) = tree.write() {
        t.clone_from(sink.live());
    }
    if let Ok(d) = tracer.drops() {
        sink.drops_record(&d);
    }
    read_machine(tracer, sink);
    sink.maintain();
    sink.flush();
}

/// The machine's idle CPU time now, and what unrecorded tasks have run:
/// how many CPUs the job could have had beyond what it used, and from whom
/// more threads of it would win some (the replay's bounds on more loader
/// workers).
pub(super) fn read_machine(tracer: &impl Probes, sink: &mut Sink) {
    let ts = clock::monotonic_ns();
    if let Some(idle_ns) = procfs::machine_idle_ns() {
        sink.push(Record::CpuIdle(crate::session::CpuIdle { ts, idle_ns }));
    }
    if let Ok((same_group_ns, elsewhere_ns)) = tracer.neighbours() {
        sink.push(Record::Neighbours(crate::session::Neighbours {
            ts,
            same_group_ns,
            elsewhere_ns,
        }));
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Drains what is left, symbolizes the stacks still waiting and closes the
/// session; `cpu_ns` is gapscope's own CPU over the window.
pub(super) fn finish(
    tracer: &mut impl Probes,
    mut sink: Sink,
    cpu_ns: u64,
    end_ns: u64,
    reason: StopReason,
    exit_code: Option<i32>,
    target_left_running: bool,
) -> Result<Recording, RecordError> {
    let drops = seal(tracer, &mut sink, cpu_ns);
    let exit_code = exit_code.or(sink.target_exit().0);
    let events = sink.events();
    let closed = sink.close(Footer {
        end_ns,
        reason,
        exit_code,
        events,
    })?;
    Ok(Recording {
        session: closed.session,
        dir: closed.dir,
        reason,
        exit_code,
        events,
        drops: drops.cpu_events(),
        target_left_running,
        windows: closed.windows,
    })
}

#[cfg(test)]
mod tests {
    //! The loop without root: the kernel side is records played back, the
    //! target a real child of the test.
    use super::*;
    use crate::session::{read_session, Event, Session, SessionWriter, FILE_NAME};
    use bytemuck::Zeroable;
    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// Kernel records handed over once their time has come, as the ring
    /// would hand them; lost records counted as given.
    struct Playback {
        records: VecDeque<(u64, Vec<u8>)>,
        bell: UnixStream,
        _ringer: UnixStream,
        lost: [u64; abi::kind::MAX],
    }

    impl Playback {
        fn new(records: Vec<(u64, Vec<u8>)>, lost_switches: u64) -> Playback {
            let (bell, mut ringer) = UnixStream::pair().unwrap();
            bell.set_nonblocking(true).unwrap();
            ringer.write_all(&[1]).unwrap();
            let mut lost = [0; abi::kind::MAX];
            lost[abi::kind::SWITCH as usize] = lost_switches;
            Playback {
                records: records.into(),
                bell,
                _ringer: ringer,
                lost,
            }
        }
    }

    impl Probes for Playback {
        fn ring_fd(&self) -> RawFd {
            self.bell.as_raw_fd()
        }
        fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
            let _ = (&self.bell).read(&mut [0; 16]);
            let now = clock::monotonic_ns();
            let mut n = 0;
            while self.records.front().is_some_and(|(at, _)| *at <= now) {
                let (_, bytes) = self.records.pop_front().unwrap();
                f(&bytes);
                n += 1;
            }
            n
        }
        fn drops(&self) -> Result<[u64; abi::kind::MAX], BpfError> {
            Ok(self.lost)
        }
        fn neighbours(&self) -> Result<(u64, u64), BpfError> {
            Ok((7, 11))
        }
        fn forget_stacks(&mut self) {}
        fn set_python(&mut self, _: u32, _: &abi::PyProc) -> Result<(), BpfError> {
            Ok(())
        }
    }

    /// A tracked thread of `pid` switched out, blocked, at `ts`.
    fn switch_out(pid: u32, ts: u64) -> (u64, Vec<u8>) {
        let mut e = abi::Switch::zeroed();
        e.h = abi::Header {
            ts,
            pid,
            tid: pid,
            kind: abi::kind::SWITCH,
            cpu: 0,
            size: std::mem::size_of::<abi::Switch>() as u32,
        };
        (e.prev_pid, e.prev_tid, e.prev_state) = (pid, pid, 1);
        e.flags = abi::SW_PREV_TRACKED;
        (ts, bytemuck::bytes_of(&e).to_vec())
    }

    fn options(duration: Option<Duration>, windows: Option<windows::Windows>) -> RecordOptions {
        RecordOptions {
            out_dir: None,
            tracer: Default::default(),
            duration,
            status_line: false,
            env: Vec::new(),
            gpu: false,
            nvml_hz: 1,
            libcuda: None,
            cupti: None,
            any_user: false,
            inject: false,
            windows,
            python_frames: false,
        }
    }

    /// A recording of `child` begun as `start` begins one: header, seeds.
    fn started(child: &std::process::Child, dir: &std::path::Path, cut: bool) -> Started {
        let pid = child.id();
        let dir = Arc::new(crate::output::OutDir::named(dir).unwrap());
        let (writer, folder) = if cut {
            (windows::create(&dir).unwrap(), Some(dir))
        } else {
            (SessionWriter::create_in(dir, FILE_NAME).unwrap(), None)
        };
        let mut sink = Sink::new(writer, pid);
        sink.cut_into(folder);
        sink.push(Record::Header(super::super::seed::header(
            if cut { Mode::Window } else { Mode::Attach },
            pid,
            vec!["sleep".into()],
            0,
        )));
        sink.add_live(pid);
        seed_process(&mut sink, pid, false);
        Started {
            sink,
            pidfd: sys::pidfd_open(pid).unwrap(),
            child: None,
            gpu: None,
        }
    }

    fn switches(s: &Session) -> Vec<u64> {
        s.events
            .iter()
            .filter_map(|e| match e {
                Event::Switch {
                    ts, out: Some(_), ..
                } => Some(*ts),
                _ => None,
            })
            .collect()
    }

    fn run_loop(probes: &mut Playback, started: Started, opts: &RecordOptions) -> Recording {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let signals = SignalSource::install().unwrap();
        rt.block_on(run(probes, started, signals, opts)).unwrap()
    }

    #[test]
    fn records_in_a_session_out_until_the_target_exits() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("0.4")
            .spawn()
            .unwrap();
        let started = started(&child, tmp.path(), false);
        let pid = child.id();
        let t0 = clock::monotonic_ns();
        // Some now, the rest over the next 200 ms (drained at the ticks).
        let mut records: Vec<_> = (0..500u64)
            .map(|i| switch_out(pid, t0 + i * 400_000))
            .collect();
        records.sort_by_key(|r| r.0);
        let want: Vec<u64> = records.iter().map(|r| r.0).collect();
        let mut probes = Playback::new(records, 3);
        let rec = run_loop(&mut probes, started, &options(None, None));
        let _ = child.wait();

        assert_eq!(rec.reason, StopReason::TargetExited);
        assert_eq!((rec.events, rec.drops), (500, 3));
        let s = read_session(&rec.session).unwrap();
        let mut got = switches(&s);
        got.sort_unstable();
        assert_eq!(got, want, "every record played back is in the session once");
        let footer = s.footer.expect("closed with a footer");
        assert_eq!(
            (footer.reason, footer.events),
            (StopReason::TargetExited, 500)
        );
        assert!(footer.end_ns > *want.last().unwrap());
        assert_eq!(s.drops.cpu_events(), 3);
        let n = s.neighbours.last().expect("the machine read");
        assert_eq!((n.same_group_ns, n.elsewhere_ns), (7, 11));
    }

    #[test]
    fn windows_cut_a_recording_without_losing_or_repeating_a_record() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let started = started(&child, tmp.path(), true);
        let pid = child.id();
        let t0 = clock::monotonic_ns();
        let records: Vec<_> = (0..900u64)
            .map(|i| switch_out(pid, t0 + i * 1_000_000))
            .collect();
        let (done, cut) = std::sync::mpsc::channel();
        let opts = options(
            Some(Duration::from_millis(1_200)),
            Some(windows::Windows {
                every: Duration::from_millis(300),
                done,
                stop: Default::default(),
            }),
        );
        let mut probes = Playback::new(records, 0);
        let last = run_loop(&mut probes, started, &opts);
        let _ = child.kill();
        let _ = child.wait();

        assert_eq!(last.reason, StopReason::Duration);
        let mut windows: Vec<Recording> = cut.try_iter().map(|w| w.unwrap()).collect();
        windows.push(last);
        assert!(windows.len() >= 3, "{} windows", windows.len());
        let mut seen = Vec::new();
        let mut end_before = None;
        for w in &windows {
            let s = read_session(&w.session).unwrap();
            let header = s.header.as_ref().unwrap();
            assert_eq!(header.mode, Mode::Window);
            // Each begins where the one before ended: no time between.
            if let Some(end) = end_before {
                assert_eq!(header.start_ns, end);
            }
            let footer = s.footer.as_ref().expect("each window closed");
            end_before = Some(footer.end_ns);
            let got = switches(&s);
            assert_eq!(footer.events, got.len() as u64);
            assert!(s.processes.iter().any(|p| p.pid == pid), "seeded again");
            seen.extend(got);
        }
        seen.sort_unstable();
        let want: Vec<u64> = (0..900u64).map(|i| t0 + i * 1_000_000).collect();
        assert_eq!(seen, want, "each record in exactly one window");
    }
}
