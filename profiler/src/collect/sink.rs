//! Where kernel records go while recording: decoded, written to the session
//! in arrival order, with the process metadata they call for gathered while
//! the processes are still alive.
//!
//! What the sink holds is bounded by what is alive, not by how long the
//! recording runs. Stacks wait here, with the maps snapshots that resolve
//! them, only until they are symbolized: a process's once it has exited
//! (batched, see [`DEAD_BATCH`]), everyone's once too many wait
//! ([`MAX_PENDING_STACKS`]), a process's once it has too many snapshots
//! ([`MAX_SNAPSHOTS`]), and what is left at the end. An exited process's
//! maps and bookkeeping go with its last stacks. A reader of the session
//! gets the same stacks, maps and symbols as when everything was symbolized
//! at the end; some Symbols records just come earlier in the file.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bpf::{abi, decode};
use super::symbolize;
use super::{launch, procfs};
use crate::session::SourceKind;
use crate::session::{
    Drops, Event, Footer, MapRange, ProcMaps, Record, SessionError, SessionWriter, Stack,
};

/// Re-read a process's maps at most this often when a stack falls outside
/// the snapshot we have (a library loaded since).
const MAPS_REFRESH: Duration = Duration::from_millis(100);

/// Stacks waiting to be symbolized, at most; reaching it symbolizes them
/// all. A stack is at most 127 frames (1 KiB), so this keeps them under
/// 16 MiB even when all are as deep as the kernel captures, while a steady
/// workload (whose distinct stacks level off well below this) never reaches
/// it and is symbolized in one pass at the end, as before.
const MAX_PENDING_STACKS: usize = 16_384;

/// Exited processes whose stacks wait to be symbolized, at most; reaching it
/// symbolizes them in one batch and frees their maps. Batching reads each
/// binary they share once per batch rather than once per process (a
/// DataLoader respawns its workers every epoch); 64 processes of a few
/// snapshots of some hundred ranges each are a few MiB.
const DEAD_BATCH: usize = 64;

/// How long an exited process's maps stay after its exit record: a stack
/// captured on another CPU while its last thread was exiting can come just
/// after that record (microseconds; one drain later at most).
const DEAD_GRACE: Duration = Duration::from_secs(1);

/// The most a recording's end waits for its last symbols: reading a
/// target's files may hang (a FUSE file system it mounted); the session is
/// whole without them.
const SYMBOLS_AT_END: Duration = Duration::from_secs(60);

/// Maps snapshots kept per process. A process that keeps mapping new code
/// (a JIT) gets a new snapshot whenever a stack falls outside the last one,
/// up to one per [`MAPS_REFRESH`]; past this many, its waiting stacks are
/// symbolized with all of them and only the newest is kept, which covers
/// every address it can still have on a stack. 32 snapshots of a few
/// hundred ranges are a few MiB at most.
const MAX_SNAPSHOTS: usize = 32;

/// How long after its exec a python is watched for its libpython (the
/// loader maps it within milliseconds).
const PYTHON_WATCH: Duration = Duration::from_secs(1);

/// What is kept of one process of the tree.
#[derive(Default)]
struct ProcState {
    /// Its executable mappings as read, oldest first; never two equal ones
    /// in a row (an equal one resolves the same).
    snapshots: Vec<Vec<MapRange>>,
    /// When its maps were last read.
    read_at: Option<Instant>,
    /// The same, on the recording's clock (CLOCK_MONOTONIC ns).
    read_ns: u64,
    /// When it exited.
    exited: Option<Instant>,
    /// Its mapped files and perf map, held from when first read (None
    /// until its maps are read).
    files: Option<symbolize::ProcFiles>,
    /// The CPython found in it since its last exec (None: none found yet).
    python: Option<Option<super::python::Found>>,
}

/// A finished session: its file, its directory (held open) and the folder
/// of windows when the recording was cut into them.
pub struct Closed {
    pub session: std::path::PathBuf,
    pub dir: Arc<crate::output::OutDir>,
    pub windows: Option<Arc<crate::output::OutDir>>,
}

pub struct Sink {
    writer: SessionWriter,
    target_pid: u32,
    /// Where the recording window starts: the start of the header pushed.
    window_start: u64,
    /// User and kernel stacks seen and not yet symbolized.
    stacks: HashMap<u64, Stack>,
    /// Processes seen, until their last stacks are symbolized after exit.
    procs: HashMap<u32, ProcState>,
    /// Symbolizes batches of stacks off the event loop.
    symbolizer: Option<symbolize::Worker>,
    /// Processes of the tree that have not exited.
    live: HashSet<u32>,
    events: u64,
    malformed: u64,
    /// The target's exit code as the kernel reported it (shell style).
    target_exit: Option<i32>,
    /// When the kernel saw the target's last thread leave.
    target_exited_ns: Option<u64>,
    /// First write error; recording stops when set.
    error: Option<SessionError>,
    /// Live processes whose libcuda calls the uprobes have seen.
    uprobed: HashSet<u32>,
    /// The header written last (a new window's is made from it).
    header: Option<crate::session::SessionHeader>,
    /// Where the windows go and what each begins with again, when the
    /// recording is cut into windows.
    cutting: Option<super::windows::Cutting>,
    /// The kernel's drop counters, cumulative, as last read; and as read
    /// when this window began (a window's Drops record counts its own).
    drops_seen: Vec<u64>,
    drops_base: Vec<u64>,
    malformed_base: u64,
    /// Each process's GPU record losses as its shim last counted them
    /// (cumulative), and as counted when this window began.
    gpu_drops_seen: HashMap<u32, (u64, u64)>,
    gpu_drops_base: HashMap<u32, (u64, u64)>,
    /// Mapped files held open, by inode, shared between processes.
    inodes: symbolize::Inodes,
    /// Under the sudo rule (the invoking user's processes only): that user.
    /// A process of the tree with other credentials (a setuid program a
    /// child ran) is recorded without its address space: no maps, stacks,
    /// files or perf map of it reach the session.
    guard: Option<u32>,
    /// Processes recorded without their address space (see `guard`).
    withheld: HashSet<u32>,
    /// When symbolizing at the end gives up (a second signal).
    give_up: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Look for CPython in the processes and walk their frames.
    python_frames: bool,
    /// CPython processes found and not yet told to the kernel side.
    python_new: Vec<(u32, abi::PyProc)>,
    /// Pythons just exec'd whose libpython is not mapped yet, until when
    /// they are looked at again ([`Sink::poll_python`]).
    python_watch: HashMap<u32, Instant>,
    batches_submitted: u64,
    batches_done: u64,
}

impl Sink {
    pub fn new(writer: SessionWriter, target_pid: u32) -> Sink {
        Sink {
            writer,
            target_pid,
            window_start: 0,
            stacks: HashMap::new(),
            procs: HashMap::new(),
            symbolizer: None,
            live: HashSet::new(),
            events: 0,
            malformed: 0,
            target_exit: None,
            target_exited_ns: None,
            error: None,
            uprobed: HashSet::new(),
            header: None,
            cutting: None,
            drops_seen: Vec::new(),
            drops_base: Vec::new(),
            malformed_base: 0,
            gpu_drops_seen: HashMap::new(),
            gpu_drops_base: HashMap::new(),
            inodes: symbolize::Inodes::new(),
            guard: None,
            withheld: HashSet::new(),
            give_up: None,
            python_frames: true,
            python_new: Vec::new(),
            python_watch: HashMap::new(),
            batches_submitted: 0,
            batches_done: 0,
        }
    }

    /// Records a process of other credentials than `uid`'s without its
    /// address space (the sudo rule, see [`Sink::judge`]).
    pub fn guard(&mut self, uid: Option<u32>) {
        self.guard = uid;
    }

    /// Whether to look for CPython in the processes and walk their frames.
    pub fn python_frames(&mut self, on: bool) {
        self.python_frames = on;
    }

    /// Cuts the recording into windows in `folder`.
    pub fn cut_into(&mut self, folder: Option<Arc<crate::output::OutDir>>) {
        self.cutting = folder.map(super::windows::Cutting::new);
    }

    /// Symbolizing at the end gives up once `flag` is set (a second signal).
    pub fn give_up_on(&mut self, flag: Arc<std::sync::atomic::AtomicBool>) {
        self.give_up = Some(flag);
    }

    pub fn target_pid(&self) -> u32 {
        self.target_pid
    }

    /// Where the window being written starts: its header's start.
    pub fn window_start(&self) -> u64 {
        self.window_start
    }

    /// The processes of the tree that have not exited.
    pub fn live(&self) -> &HashSet<u32> {
        &self.live
    }

    /// Adds a process found alive (attach's seeds); false if known.
    pub fn add_live(&mut self, pid: u32) -> bool {
        self.live.insert(pid)
    }

    /// Whether `pid` is recorded without its address space.
    pub fn withheld(&self, pid: u32) -> bool {
        self.withheld.contains(&pid)
    }

    /// The kernel's events written to the window being written.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The target's exit code and when it exited, as the kernel said.
    pub fn target_exit(&self) -> (Option<i32>, Option<u64>) {
        (self.target_exit, self.target_exited_ns)
    }

    /// The header written last (a new window's is made from it).
    pub fn header(&self) -> Option<&crate::session::SessionHeader> {
        self.header.as_ref()
    }

    pub fn cutting_mut(&mut self) -> Option<&mut super::windows::Cutting> {
        self.cutting.as_mut()
    }

    /// Whether writing has failed (recording then stops).
    pub fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// Puts what was written on disk; the first error is kept and stops
    /// the recording.
    pub fn flush(&mut self) {
        if let Err(e) = self.writer.flush() {
            self.error.get_or_insert(e);
        }
    }

    /// Writes what was pushed now, failing on the first error (the seeds
    /// must be on disk before the loop runs).
    pub fn flush_now(&mut self) -> Result<(), SessionError> {
        match self.error.take() {
            Some(e) => Err(e),
            None => self.writer.flush(),
        }
    }

    /// Ends the session with `footer`: its file, its directory, and the
    /// folder of windows if cut into them.
    pub fn close(mut self, footer: Footer) -> Result<Closed, SessionError> {
        self.push(Record::End(footer));
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let closed = Closed {
            session: self.writer.path().to_path_buf(),
            dir: self.writer.dir().clone(),
            windows: self.cutting.map(|c| c.folder),
        };
        self.writer.finish()?;
        Ok(closed)
    }

    /// Lets go of the files no process or batch holds any more.
    fn tidy(&mut self) {
        self.inodes.retain(|_, f| f.strong_count() > 0);
    }

    /// Whether process `pid` may be recorded with its address space: under
    /// the sudo rule, only if every id of it is the invoking user's and the
    /// kernel lets that user look into it (dumpable). Judged when it is
    /// first seen and whenever it execs (a setuid program changes them).
    pub fn judge(&mut self, pid: u32) -> bool {
        let Some(uid) = self.guard else {
            return true;
        };
        let ok = procfs::credentials(pid).is_some_and(|c| c.all_of(uid));
        if !ok && self.withheld.insert(pid) {
            // Whatever was kept of it before goes unwritten.
            self.procs.remove(&pid);
            self.stacks.retain(|_, s| s.pid != pid);
            self.push(Record::Note(format!(
                "process {pid} runs with other credentials than yours (setuid, or another \
                 user's): recorded without its stacks and memory maps"
            )));
        }
        ok
    }

    pub fn push(&mut self, mut record: Record) {
        match &mut record {
            Record::Header(h) => {
                self.window_start = h.start_ns;
                self.header = Some(h.clone());
            }
            Record::GpuDrops { pid, cupti, shim } => {
                self.gpu_drops_seen.insert(*pid, (*cupti, *shim));
                let (c, s) = self.gpu_drops_base.get(pid).copied().unwrap_or_default();
                *cupti = cupti.saturating_sub(c);
                *shim = shim.saturating_sub(s);
            }
            _ => {}
        }
        if let Some(s) = self.cutting.as_mut().map(|c| &mut c.sticky) {
            s.remember(&record);
        }
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.writer.push(&record) {
            self.error = Some(e);
        }
    }

    /// Goes on in `writer`, a new window of the same recording: its counts
    /// start from zero. Returns the window that was being written.
    pub fn next_window(&mut self, writer: SessionWriter) -> SessionWriter {
        self.events = 0;
        self.drops_base.clone_from(&self.drops_seen);
        self.malformed_base = self.malformed;
        self.gpu_drops_base.clone_from(&self.gpu_drops_seen);
        std::mem::replace(&mut self.writer, writer)
    }

    /// Every executable mapping of the snapshots held now, with its pid.
    pub fn mapped(&self) -> impl Iterator<Item = (u32, &MapRange)> {
        self.procs.iter().flat_map(|(&pid, p)| {
            p.snapshots
                .iter()
                .flat_map(move |ranges| ranges.iter().map(move |r| (pid, r)))
        })
    }

    /// Snapshots a process's executable mappings now, holding the files
    /// they map open for symbolization.
    pub fn snapshot_maps(&mut self, pid: u32) {
        if self.withheld.contains(&pid) {
            return;
        }
        let read_ns = crate::clock::monotonic_ns();
        let ranges = procfs::exec_maps(pid);
        self.snapshot_of(pid, ranges, read_ns);
    }

    /// Whether a python just exec'd is being watched for its libpython.
    pub fn watching_python(&self) -> bool {
        !self.python_watch.is_empty()
    }

    /// Looks again at each python just exec'd whose interpreter is in a
    /// libpython the loader had not mapped yet: found within milliseconds
    /// of its exec, before it runs a line of Python (a stack that fell
    /// outside its maps would find it too, but only on a later capture,
    /// and a thread that blocks for good at start-up makes none).
    pub fn poll_python(&mut self) {
        let now = Instant::now();
        let watched: Vec<(u32, Instant)> =
            self.python_watch.iter().map(|(&p, &d)| (p, d)).collect();
        for (pid, deadline) in watched {
            let done = match self.procs.get(&pid) {
                Some(p) => p.exited.is_some() || p.python.is_some() || now >= deadline,
                None => true,
            };
            if done {
                self.python_watch.remove(&pid);
                continue;
            }
            let read_ns = crate::clock::monotonic_ns();
            let Some(ranges) = procfs::exec_maps(pid) else {
                self.python_watch.remove(&pid);
                continue;
            };
            let last = self.procs.get(&pid).and_then(|p| p.snapshots.last());
            if last != Some(&ranges) {
                self.snapshot_of(pid, Some(ranges), read_ns);
            }
        }
    }

    fn snapshot_of(&mut self, pid: u32, ranges: Option<Vec<MapRange>>, read_ns: u64) {
        let p = self.procs.entry(pid).or_default();
        p.read_at = Some(Instant::now());
        p.read_ns = read_ns;
        if let Some(ranges) = ranges {
            let files = p.files.get_or_insert_with(|| symbolize::ProcFiles::of(pid));
            files.hold(pid, &ranges, &mut self.inodes);
            // Looked for again at each snapshot until found: right after an
            // exec the loader may not have mapped libpython yet.
            if self.python_frames && p.python.is_none() {
                let found = super::python::discover(pid, &ranges, |r| files.file(r.start, r.end));
                if found.is_some() {
                    p.python = Some(found.clone());
                    self.python_found(pid, found.as_ref());
                } else if super::python::awaits_libpython(&ranges) {
                    self.python_watch
                        .entry(pid)
                        .or_insert_with(|| Instant::now() + PYTHON_WATCH);
                }
            }
            self.store_maps(ProcMaps { pid, ranges });
        }
    }

    /// What was found of CPython in process `pid`: the kernel side is told
    /// where its frames are, or the session why they cannot be walked.
    fn python_found(&mut self, pid: u32, found: Option<&super::python::Found>) {
        match found {
            Some(super::python::Found::Python { proc, .. }) => self.python_new.push((pid, *proc)),
            Some(super::python::Found::Unsupported { version, why }) => {
                let v = version.map_or(String::new(), |(a, b)| format!(" {a}.{b}"));
                self.push(Record::Note(format!(
                    "Python{v} (pid {pid}): its Python functions are not in the stacks: {why}"
                )));
            }
            None => {}
        }
    }

    /// CPython processes found since the last call, to tell the kernel side:
    /// those that have not exited (whose entry the kernel side removed at
    /// the exit, and whose pid may be another process's next).
    pub fn take_python(&mut self) -> Vec<(u32, abi::PyProc)> {
        let mut found = std::mem::take(&mut self.python_new);
        found.retain(|(pid, _)| self.procs.get(pid).is_none_or(|p| p.exited.is_none()));
        found
    }

    fn store_maps(&mut self, maps: ProcMaps) {
        self.push(Record::Maps(maps.clone()));
        let pid = maps.pid;
        let p = self.procs.entry(pid).or_default();
        if p.snapshots.last() == Some(&maps.ranges) {
            return;
        }
        p.snapshots.push(maps.ranges);
        if p.snapshots.len() > MAX_SNAPSHOTS {
            let stacks = self.take_stacks(|s| !s.kernel && s.pid == pid);
            let (maps, files) = self.maps_of(stacks.values());
            self.submit(stacks, maps, files);
            let p = self.procs.get_mut(&pid).expect("stored above");
            p.snapshots.drain(..p.snapshots.len() - 1);
        }
    }

    fn covers(&self, pid: u32, addrs: &[u64]) -> bool {
        let Some(ranges) = self.procs.get(&pid).and_then(|p| p.snapshots.last()) else {
            return false;
        };
        addrs
            .iter()
            .all(|&a| ranges.iter().any(|r| r.start <= a && a < r.end))
    }

    /// Handles one raw ring-buffer record.
    pub fn handle(&mut self, bytes: &[u8]) {
        if abi::read::<abi::Header>(bytes).is_some_and(|h| h.kind == abi::kind::PYCODE) {
            self.events += 1;
            match super::bpf::decode_pycode(bytes) {
                Some((pid, code, c)) => {
                    if !self.withheld.contains(&pid) {
                        self.procs
                            .entry(pid)
                            .or_default()
                            .files
                            .get_or_insert_with(symbolize::ProcFiles::default)
                            .describe(code, c);
                    }
                }
                None => self.malformed += 1,
            }
            return;
        }
        let Some((record, extra)) = decode(bytes) else {
            self.malformed += 1;
            return;
        };
        self.handle_record(record);
        if let Some(extra) = extra {
            self.handle_record(extra);
        }
    }

    /// Handles one decoded kernel record.
    fn handle_record(&mut self, record: Record) {
        self.events += 1;
        match &record {
            Record::Stack(s) if self.withheld.contains(&s.pid) => {}
            Record::Stack(s) if !s.kernel => {
                let (exited, fresh) = match self.procs.get(&s.pid) {
                    Some(p) => (
                        p.exited.is_some(),
                        p.read_at.is_some_and(|t| t.elapsed() < MAPS_REFRESH),
                    ),
                    None => (false, false),
                };
                // An exited process's maps are gone, or another's by now.
                if !exited && !fresh && !self.covers(s.pid, &s.addrs) {
                    self.snapshot_maps(s.pid);
                }
                self.pend(s.clone());
            }
            Record::Stack(s) => self.pend(s.clone()),
            Record::Event(Event::Fork {
                ts,
                pid,
                parent_pid,
                thread: false,
                comm,
                ..
            }) => {
                self.live.insert(*pid);
                let (ts, pid, parent_pid, comm) = (*ts, *pid, *parent_pid, comm.clone());
                // A pid used again: the process that had it is gone, and
                // its stacks are symbolized with its own maps first.
                if self.procs.get(&pid).is_some_and(|p| p.exited.is_some()) {
                    self.retire(&[pid]);
                }
                self.push(record);
                self.push(Record::Process(crate::session::ProcessInfo {
                    pid,
                    ppid: parent_pid,
                    comm,
                    argv: Vec::new(),
                }));
                if !self.judge(pid) {
                    return;
                }
                // A fork starts with its parent's mappings: inherit the
                // snapshot so a child that exits quickly still symbolizes —
                // if it was read before the fork. Maps are read when their
                // event is handled, which can be after the parent exec'd
                // again (a shell script that forks subshells, then execs
                // python: its subshells are no Python processes).
                let inherited = self.procs.get(&parent_pid).and_then(|p| {
                    if p.read_ns > ts {
                        return None;
                    }
                    Some((
                        p.snapshots.last()?.clone(),
                        p.files.as_ref().map(|f| f.forked(pid)),
                        p.python.clone(),
                    ))
                });
                if let Some((ranges, files, python)) = inherited {
                    // Its interpreter is its parent's, at the same
                    // addresses: the kernel side copied it at the fork,
                    // unless the parent was found after the fork (then
                    // it is told here).
                    if let Some(Some(super::python::Found::Python { proc, .. })) = &python {
                        self.python_new.push((pid, *proc));
                    }
                    let child = self.procs.entry(pid).or_default();
                    child.files = files;
                    child.python = python;
                    self.store_maps(ProcMaps { pid, ranges });
                }
                return;
            }
            Record::Event(Event::Exec { pid, .. }) => {
                let pid = *pid;
                self.push(record);
                if let Some(info) = procfs::process_info(pid) {
                    self.push(Record::Process(info));
                }
                if let Some(rank) = procfs::rank_of(&procfs::environ(pid)) {
                    self.push(Record::ProcessRank { pid, rank });
                }
                // An exec may change who it runs as; what its maps held
                // before is another program's.
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.files = None;
                    p.python = None;
                }
                self.python_watch.remove(&pid);
                if self.judge(pid) {
                    self.snapshot_maps(pid);
                }
                return;
            }
            Record::Event(Event::CudaCall { pid, .. }) if self.uprobed.insert(*pid) => {
                let pid = *pid;
                self.push(Record::GpuSource(crate::session::GpuSource {
                    pid,
                    kind: SourceKind::Uprobe,
                    hello: gapscope_wire::Hello {
                        version: gapscope_wire::protocol::VERSION,
                        pid,
                        driver_version: 0,
                        cupti_version: 0,
                        clock: gapscope_wire::ClockMethod::Native,
                        source: "libcuda uprobes (approximate: API calls, no kernel times)".into(),
                    },
                }));
            }
            Record::Event(Event::Exit {
                ts,
                pid,
                status,
                group_dead: true,
                ..
            }) => {
                self.live.remove(pid);
                self.uprobed.remove(pid);
                self.procs.entry(*pid).or_default().exited = Some(Instant::now());
                if *pid == self.target_pid {
                    self.target_exit = Some(launch::exit_code_of(*status));
                    self.target_exited_ns = Some(*ts);
                }
            }
            _ => {}
        }
        self.push(record);
    }

    /// Keeps a stack for symbolization; symbolizes every waiting one when
    /// there are too many.
    fn pend(&mut self, stack: Stack) {
        self.stacks.insert(stack.hash, stack);
        if self.stacks.len() < MAX_PENDING_STACKS {
            return;
        }
        // A stack that came within MAPS_REFRESH of its process's last
        // snapshot and falls outside it waits for the next one, which is
        // taken now rather than never.
        let mut stale: Vec<u32> = self
            .stacks
            .values()
            .filter(|s| !s.kernel && !self.covers(s.pid, &s.addrs))
            .map(|s| s.pid)
            .filter(|pid| self.procs.get(pid).is_some_and(|p| p.exited.is_none()))
            .collect();
        stale.sort_unstable();
        stale.dedup();
        for pid in stale {
            self.snapshot_maps(pid);
        }
        let stacks = std::mem::take(&mut self.stacks);
        let (maps, files) = self.maps_of(stacks.values());
        self.submit(stacks, maps, files);
    }

    /// Removes and returns the waiting stacks that `f` selects.
    fn take_stacks(&mut self, f: impl Fn(&Stack) -> bool) -> HashMap<u64, Stack> {
        let hashes: Vec<u64> = self
            .stacks
            .values()
            .filter(|s| f(s))
            .map(|s| s.hash)
            .collect();
        hashes
            .into_iter()
            .filter_map(|h| self.stacks.remove_entry(&h))
            .collect()
    }

    /// The snapshots and files of the processes whose user stacks these
    /// are.
    fn maps_of<'a>(
        &self,
        stacks: impl Iterator<Item = &'a Stack>,
    ) -> (Vec<ProcMaps>, HashMap<u32, symbolize::ProcFiles>) {
        let mut pids: Vec<u32> = stacks.filter(|s| !s.kernel).map(|s| s.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let procs: Vec<(u32, &ProcState)> = pids
            .into_iter()
            .filter_map(|pid| Some((pid, self.procs.get(&pid)?)))
            .collect();
        let files = procs
            .iter()
            .filter_map(|(pid, p)| Some((*pid, p.files.clone()?)))
            .collect();
        let maps = procs
            .into_iter()
            .flat_map(|(pid, p)| {
                p.snapshots.iter().map(move |ranges| ProcMaps {
                    pid,
                    ranges: ranges.clone(),
                })
            })
            .collect();
        (maps, files)
    }

    /// Symbolizes the waiting stacks of exited processes `pids` and forgets
    /// the processes.
    fn retire(&mut self, pids: &[u32]) {
        let set: HashSet<u32> = pids.iter().copied().collect();
        let stacks = self.take_stacks(|s| !s.kernel && set.contains(&s.pid));
        let (maps, files) = self.forget(pids.iter().copied());
        self.submit(stacks, maps, files);
    }

    /// Forgets the processes `pids`, returning their maps snapshots and
    /// files.
    fn forget(
        &mut self,
        pids: impl IntoIterator<Item = u32>,
    ) -> (Vec<ProcMaps>, HashMap<u32, symbolize::ProcFiles>) {
        let mut files = HashMap::new();
        let mut maps = Vec::new();
        for pid in pids {
            let Some(p) = self.procs.remove(&pid) else {
                continue;
            };
            if let Some(f) = p.files {
                files.insert(pid, f);
            }
            maps.extend(
                p.snapshots
                    .into_iter()
                    .map(move |ranges| ProcMaps { pid, ranges }),
            );
        }
        (maps, files)
    }

    /// The worker to symbolize batches on, started before the sink (when
    /// None, one is started at the first batch).
    pub fn symbolize_with(&mut self, worker: Option<symbolize::Worker>) {
        self.symbolizer = worker;
    }

    fn submit(
        &mut self,
        stacks: HashMap<u64, Stack>,
        maps: Vec<ProcMaps>,
        files: HashMap<u32, symbolize::ProcFiles>,
    ) {
        if stacks.is_empty() {
            return;
        }
        self.symbolizer
            .get_or_insert_with(symbolize::Worker::start)
            .submit(stacks, maps, files);
        self.batches_submitted += 1;
    }

    /// Writes the symbols of batches done, and lets exited processes go:
    /// at once when none of their stacks wait, in a batch once
    /// [`DEAD_BATCH`] of them have stacks waiting. The event loop calls it
    /// once a second.
    pub fn maintain(&mut self) {
        self.maintain_at(Instant::now());
    }

    fn maintain_at(&mut self, now: Instant) {
        let ripe: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| {
                p.exited
                    .is_some_and(|t| now.duration_since(t) >= DEAD_GRACE)
            })
            .map(|(&pid, _)| pid)
            .collect();
        if !ripe.is_empty() {
            let waiting: HashSet<u32> = self
                .stacks
                .values()
                .filter(|s| !s.kernel)
                .map(|s| s.pid)
                .collect();
            let (with, without): (Vec<u32>, Vec<u32>) =
                ripe.into_iter().partition(|pid| waiting.contains(pid));
            for pid in &without {
                self.procs.remove(pid);
            }
            if with.len() >= DEAD_BATCH {
                self.retire(&with);
            }
        }
        self.write_symbols(false);
    }

    fn write_symbols(&mut self, wait: bool) {
        let done = match (wait, &mut self.symbolizer) {
            (_, None) => return,
            (false, Some(w)) => w.ready(),
            (true, Some(_)) => {
                let give_up = self.give_up.clone();
                let stop = move || {
                    give_up
                        .as_ref()
                        .is_some_and(|g| g.load(std::sync::atomic::Ordering::SeqCst))
                };
                let (done, left) = self
                    .symbolizer
                    .take()
                    .expect("matched")
                    .finish(Instant::now() + SYMBOLS_AT_END, &stop);
                if left > 0 {
                    self.push(Record::Note(format!(
                        "symbolization stopped (a second signal, or {}s passed): {left} batch(es) \
                         of stacks left without names",
                        SYMBOLS_AT_END.as_secs()
                    )));
                }
                done
            }
        };
        self.batches_done += done.len() as u64;
        for symbols in done {
            for chunk in symbolize::split(symbols) {
                self.push(Record::Symbols(chunk));
            }
        }
        self.tidy();
    }

    /// Symbolizes every stack still waiting and writes all symbols; at the
    /// end of a recording.
    pub fn finish_symbols(&mut self) {
        let stacks = std::mem::take(&mut self.stacks);
        let mut pids: Vec<u32> = self.procs.keys().copied().collect();
        pids.sort_unstable();
        let (maps, files) = self.forget(pids);
        self.submit(stacks, maps, files);
        self.write_symbols(true);
    }

    /// Records the kernel's drop counters (cumulative over the window; the
    /// last one wins).
    pub fn drops_record(&mut self, by_kind: &[u64]) -> Drops {
        self.drops_seen = by_kind.to_vec();
        let drops = Drops {
            ts: crate::clock::monotonic_ns(),
            cpu_by_kind: by_kind
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    (
                        k,
                        n.saturating_sub(self.drops_base.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|&(_, n)| n > 0)
                .map(|(k, n)| (abi::kind::name(k).to_string(), n))
                .collect(),
            cpu_malformed: self.malformed - self.malformed_base,
            gpu_records: 0,
        };
        self.push(Record::Drops(drops.clone()));
        drops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{read_session, Frame, Mode, Session};

    /// Pids no process can have (pid_max is at most 2^22).
    const FAKE: u32 = 50_000_000;

    fn sink_in(dir: &std::path::Path) -> Sink {
        let writer = SessionWriter::create(&dir.join(crate::session::FILE_NAME)).unwrap();
        let mut sink = Sink::new(writer, FAKE);
        sink.push(Record::Header(super::super::seed::header(
            Mode::Attach,
            FAKE,
            Vec::new(),
            99,
        )));
        sink
    }

    fn read_back(mut sink: Sink) -> Session {
        sink.finish_symbols();
        assert!(sink.error.is_none());
        let path = sink.writer.path().to_path_buf();
        sink.writer.finish().unwrap();
        read_session(&path).unwrap()
    }

    fn fork(pid: u32, parent_pid: u32) -> Record {
        Record::Event(Event::Fork {
            ts: crate::clock::monotonic_ns(),
            pid,
            tid: pid,
            parent_pid,
            parent_tid: parent_pid,
            thread: false,
            comm: "worker".into(),
        })
    }

    fn exit(pid: u32) -> Record {
        Record::Event(Event::Exit {
            ts: crate::clock::monotonic_ns(),
            pid,
            tid: pid,
            status: 0,
            group_dead: true,
            comm: "worker".into(),
        })
    }

    fn stack(hash: u64, pid: u32, addrs: Vec<u64>) -> Record {
        Record::Stack(Stack {
            hash,
            pid,
            kernel: pid == 0,
            addrs,
        })
    }

    fn special(start: u64, name: String) -> Vec<MapRange> {
        vec![MapRange {
            start,
            end: start + 0x1000,
            offset: 0,
            path: name,
        }]
    }

    fn first_function(s: &Session, hash: u64) -> &str {
        let frames: &Vec<Frame> = s.symbols.get(&hash).expect("stack symbolized");
        &frames[0].function
    }

    /// Ten thousand short-lived processes, each with stacks of its own (and
    /// kernel stacks, and libcuda calls), pids used again: the sink keeps at
    /// most a batch of them, where keeping every process's stacks and maps
    /// to the end would hold all, and every stack still resolves through
    /// the maps of the process it came from.
    /// A child inherits its parent's maps only if they were read before it
    /// was forked: read later, they may be of a program the parent exec'd
    /// since (a shell's subshells are not the python it became).
    #[test]
    fn a_child_inherits_only_maps_read_before_its_fork() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink_in(dir.path());
        let parent = FAKE;
        sink.live.insert(parent);
        let forked_at = crate::clock::monotonic_ns();
        sink.store_maps(ProcMaps {
            pid: parent,
            ranges: special(0x1000, "[python]".into()),
        });
        sink.procs.get_mut(&parent).unwrap().read_ns = forked_at + 1;
        let mut early = fork(FAKE + 1, parent);
        if let Record::Event(Event::Fork { ts, .. }) = &mut early {
            *ts = forked_at;
        }
        sink.handle_record(early);
        assert!(!sink.procs.contains_key(&(FAKE + 1)));
        sink.handle_record(fork(FAKE + 2, parent));
        assert_eq!(sink.procs[&(FAKE + 2)].snapshots.len(), 1);
    }

    #[test]
    fn short_lived_processes_do_not_accumulate() {
        const PROCESSES: u64 = 10_000;
        const PIDS: u64 = 700; // each used again ~14 times
        const USER_STACKS: u64 = 3;
        const KERNEL_STACKS: u64 = 2;
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink_in(dir.path());
        let parent = FAKE;
        sink.live.insert(parent);
        sink.store_maps(ProcMaps {
            pid: parent,
            ranges: special(0x1000, "[parent]".into()),
        });
        let mut expected = Vec::new();
        let mut hash = 1;
        let (mut most_stacks, mut most_procs) = (0, 0);
        for i in 0..PROCESSES {
            let pid = FAKE + 1 + (i % PIDS) as u32;
            sink.handle_record(fork(pid, parent));
            // Its own code, as the snapshot after its exec would show.
            sink.store_maps(ProcMaps {
                pid,
                ranges: special(0x10_0000, format!("[process-{i}]")),
            });
            for k in 0..USER_STACKS {
                sink.handle_record(stack(hash, pid, vec![0x10_0000 + k, 0x1000]));
                expected.push((hash, format!("[process-{i}]")));
                hash += 2;
            }
            for k in 0..KERNEL_STACKS {
                sink.handle_record(stack(hash, 0, vec![0xffff_ffff_8100_0000 + i, k]));
                hash += 2;
            }
            sink.handle_record(Record::Event(Event::CudaCall {
                ts: crate::clock::monotonic_ns(),
                pid,
                tid: pid,
                dur: 1,
                function: "cuLaunchKernel".into(),
                arg: 0,
            }));
            sink.handle_record(exit(pid));
            if i % 50 == 49 {
                // A second of the event loop's ticks later.
                sink.maintain_at(Instant::now() + DEAD_GRACE);
                assert!(sink.procs.len() <= DEAD_BATCH + 1, "{}", sink.procs.len());
                assert!(sink.live.len() <= 1 && sink.uprobed.is_empty());
            }
            most_stacks = most_stacks.max(sink.stacks.len());
            most_procs = most_procs.max(sink.procs.len());
            let snapshots: usize = sink.procs.values().map(|p| p.snapshots.len()).sum();
            assert!(snapshots <= 2 * (DEAD_BATCH + 50) + 1, "{snapshots}");
        }
        // Far more than the bounds came through; no more than them stayed.
        let total_stacks = (PROCESSES * (USER_STACKS + KERNEL_STACKS)) as usize;
        assert!(total_stacks > 2 * MAX_PENDING_STACKS);
        assert!((PROCESSES * KERNEL_STACKS) as usize > MAX_PENDING_STACKS);
        assert!(most_stacks < MAX_PENDING_STACKS, "{most_stacks}");
        assert!(PROCESSES as usize > 10 * (DEAD_BATCH + 50));
        assert!(most_procs <= DEAD_BATCH + 50 + 1, "{most_procs}");

        let s = read_back(sink);
        for (hash, name) in &expected {
            assert_eq!(first_function(&s, *hash), name, "stack {hash}");
        }
        assert_eq!(s.symbols.len(), total_stacks);
    }

    #[inline(never)]
    fn marker_function_for_exited_process() -> usize {
        marker_function_for_exited_process as *const () as usize
    }

    /// A batch of exited processes is symbolized from their binaries while
    /// recording, and their state goes with it.
    #[test]
    fn exited_processes_symbolize_from_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink_in(dir.path());
        let me = std::process::id();
        sink.live.insert(me);
        sink.snapshot_maps(me);
        let addr = marker_function_for_exited_process() as u64;
        let children = DEAD_BATCH as u32 + 6;
        for c in 0..children {
            let pid = FAKE + c;
            sink.handle_record(fork(pid, me));
            sink.handle_record(stack(2 * c as u64 + 1, pid, vec![addr]));
            sink.handle_record(exit(pid));
        }
        assert_eq!(sink.procs.len(), children as usize + 1);
        // Not before the grace: a stack may still be on its way.
        sink.maintain_at(Instant::now());
        assert_eq!(sink.procs.len(), children as usize + 1);
        sink.maintain_at(Instant::now() + DEAD_GRACE);
        assert_eq!(sink.procs.len(), 1, "only the live process stays");
        assert!(sink.stacks.is_empty());
        let s = read_back(sink);
        for c in 0..children {
            let f = first_function(&s, 2 * c as u64 + 1);
            assert!(f.contains("marker_function_for_exited_process"), "{f}");
        }
    }

    /// A live process that keeps mapping new code keeps a bounded number of
    /// snapshots, and each stack resolves through the mapping it was in.
    #[test]
    fn a_jit_keeps_a_bounded_number_of_snapshots() {
        const REGIONS: u64 = 2_000;
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink_in(dir.path());
        let pid = FAKE;
        sink.live.insert(pid);
        for j in 0..REGIONS {
            // The last few regions stay mapped; older ones are gone.
            let ranges = (j.saturating_sub(3)..=j)
                .flat_map(|r| special(0x1000_0000 + r * 0x1000, format!("[jit-{r}]")))
                .collect();
            sink.store_maps(ProcMaps { pid, ranges });
            sink.handle_record(stack(2 * j + 1, pid, vec![0x1000_0000 + j * 0x1000 + 8]));
            assert!(sink.procs[&pid].snapshots.len() <= MAX_SNAPSHOTS);
        }
        assert!(REGIONS as usize > 10 * MAX_SNAPSHOTS);
        let s = read_back(sink);
        for j in 0..REGIONS {
            assert_eq!(first_function(&s, 2 * j + 1), format!("[jit-{j}]"));
        }
    }

    /// Everything symbolized at the end, as before, when nothing forces a
    /// batch earlier: one pass, the same Symbols records.
    #[test]
    fn short_recording_is_symbolized_once_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink_in(dir.path());
        let pid = FAKE;
        sink.live.insert(pid);
        sink.store_maps(ProcMaps {
            pid,
            ranges: special(0x1000, "[a]".into()),
        });
        // An equal snapshot is written but not kept twice.
        sink.store_maps(ProcMaps {
            pid,
            ranges: special(0x1000, "[a]".into()),
        });
        assert_eq!(sink.procs[&pid].snapshots.len(), 1);
        let mut stacks = HashMap::new();
        for h in 0..100u64 {
            let s = Stack {
                hash: 2 * h + 1,
                pid,
                kernel: false,
                addrs: vec![0x1000 + h],
            };
            stacks.insert(s.hash, s.clone());
            sink.handle_record(Record::Stack(s));
        }
        sink.handle_record(exit(pid));
        sink.maintain_at(Instant::now() + DEAD_GRACE);
        let path = sink.writer.path().to_path_buf();
        let s = read_back(sink);
        let want = symbolize::symbolize(
            &stacks,
            &[ProcMaps {
                pid,
                ranges: special(0x1000, "[a]".into()),
            }],
            &HashMap::new(),
        );
        let written: Vec<crate::session::Symbols> = crate::session::SessionReader::open(&path)
            .unwrap()
            .filter_map(|r| match r {
                Record::Symbols(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(written, symbolize::split(want));
        assert_eq!(s.maps.len(), 2);
    }
}
