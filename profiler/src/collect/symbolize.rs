//! Turns raw stack addresses into function names, so that a session carries
//! its own symbols and offline reports need neither the target's binaries nor
//! root. User addresses are mapped to (file, offset) through the /proc maps
//! snapshots taken while the processes were alive, then symbolized with
//! blazesym; JIT frames come from perf maps (`/tmp/perf-PID.map`, written by
//! e.g. Python 3.12+ with `-X perf`); kernel frames from /proc/kallsyms.
//!
//! Every file read here is one the recorded processes chose: nothing is
//! opened by the path their maps show (in another mount namespace it names
//! another file; after they replaced it, anything, a FIFO included).
//! A mapped file is held open from when the maps were read, through
//! `/proc/PID/map_files` (the inode mapped), and handed to blazesym as
//! `/proc/self/fd/N`; a perf map is read from the process's own /tmp, held
//! open from when it was first seen, only if it is a regular file of the
//! process's user, below that directory, within a size cap
//! ([`crate::safe_fs`]).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::bpf::abi;
use crate::session::{Frame, MapRange, ProcMaps, Stack, Symbols};

const UNKNOWN: &str = "[unknown]";

/// Largest perf map read (a JIT's map of a long run: ~100 bytes a
/// function).
const PERF_MAP_MAX: u64 = 128 << 20;

/// What symbolizing a process's stacks needs of it besides its maps
/// snapshots, taken while it was alive: its mapped files, held open by the
/// mapping's range, and where its perf map is.
#[derive(Clone, Default)]
pub struct ProcFiles {
    files: HashMap<(u64, u64), Arc<File>>,
    perf: Option<Arc<PerfMapAt>>,
    /// Its code objects, by address, as the kernel side described them
    /// (a CPython process); shared with the batches handed over, copied
    /// only when one is described while a batch holds them.
    py: Arc<HashMap<u64, PyCode>>,
}

pub use super::bpf::decode::PyCode;

/// Files held open by inode, shared between the processes that map them
/// (a job's workers map the same libraries).
pub type Inodes = HashMap<(u64, u64), Weak<File>>;

/// A process's perf map: its /tmp (held open), the file's name there (by
/// the pid its own namespace gives it) and the uid that must own it.
pub struct PerfMapAt {
    tmp: OwnedFd,
    name: String,
    uid: u32,
}

impl ProcFiles {
    /// What is known of process `pid` before its mappings: where its perf
    /// map would be.
    pub fn of(pid: u32) -> ProcFiles {
        ProcFiles {
            perf: PerfMapAt::of(pid).map(Arc::new),
            ..ProcFiles::default()
        }
    }

    /// A child forked from a process with these files: the same mappings
    /// and code objects, its own perf map.
    pub fn forked(&self, pid: u32) -> ProcFiles {
        ProcFiles {
            files: self.files.clone(),
            perf: PerfMapAt::of(pid).map(Arc::new),
            py: self.py.clone(),
        }
    }

    /// The file the mapping at `start..end` maps, if held.
    pub fn file(&self, start: u64, end: u64) -> Option<Arc<File>> {
        self.files.get(&(start, end)).cloned()
    }

    /// Code object `code` of this process is `c`.
    pub fn describe(&mut self, code: u64, c: PyCode) {
        Arc::make_mut(&mut self.py).insert(code, c);
    }

    /// Holds the files of `ranges` not held yet: through
    /// `/proc/PID/map_files` while the process lives; files gapscope has
    /// open already (by inode, from any process) are shared.
    pub fn hold(&mut self, pid: u32, ranges: &[MapRange], inodes: &mut Inodes) {
        use std::os::unix::fs::MetadataExt;
        for r in ranges {
            if r.path.is_empty() || r.path.starts_with('[') {
                continue;
            }
            if self.files.contains_key(&(r.start, r.end)) {
                continue;
            }
            let Ok(f) = crate::safe_fs::open_mapping(pid, r.start, r.end) else {
                continue;
            };
            let Ok(m) = f.metadata() else { continue };
            let key = (m.dev(), m.ino());
            let held = match inodes.get(&key).and_then(Weak::upgrade) {
                Some(f) => f,
                None => {
                    let f = Arc::new(f);
                    inodes.insert(key, Arc::downgrade(&f));
                    f
                }
            };
            self.files.insert((r.start, r.end), held);
        }
    }
}

impl PerfMapAt {
    fn of(pid: u32) -> Option<PerfMapAt> {
        use crate::safe_fs::{openat2, proc_root, Resolve};
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
        let nspid = super::pidns::own_pid(pid)?;
        // Its /tmp as it resolves it (a link to elsewhere in its root is
        // its own business); the file below it is looked up with no link.
        let tmp = openat2(
            proc_root(pid).ok()?.as_fd(),
            Path::new("tmp"),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            Resolve::InRoot,
        )
        .ok()?;
        Some(PerfMapAt {
            tmp,
            name: format!("perf-{nspid}.map"),
            uid,
        })
    }

    /// The perf map, opened as `safe_fs` opens what a target can plant:
    /// below its /tmp through no link and no mount, non-blocking, a
    /// regular file of the process's own user.
    fn open(&self) -> Option<File> {
        use std::os::unix::fs::MetadataExt;
        let f = crate::safe_fs::open_regular_at(
            self.tmp.as_fd(),
            Path::new(&self.name),
            crate::safe_fs::Resolve::Beneath,
        )
        .ok()?;
        (f.metadata().ok()?.uid() == self.uid).then_some(f)
    }

    fn load(&self) -> Option<PerfMap> {
        let f = self.open()?;
        let text = crate::safe_fs::read_capped(f, PERF_MAP_MAX).ok()?;
        Some(PerfMap::parse(&String::from_utf8_lossy(&text)))
    }
}

/// Where a user address lives.
enum Location {
    File {
        path: String,
        offset: u64,
        /// The file held open, as blazesym opens it (`/proc/self/fd/N`).
        source: Option<String>,
    },
    /// [vdso], [vsyscall], [stack], ...: named by the kernel, not a file.
    Special(String),
    Anon,
}

struct Resolver<'a> {
    /// Per pid, newest snapshot last.
    maps: HashMap<u32, Vec<&'a [MapRange]>>,
    files: &'a HashMap<u32, ProcFiles>,
    perf_maps: HashMap<u32, Option<PerfMap>>,
    kallsyms: Option<&'a Kallsyms>,
}

impl<'a> Resolver<'a> {
    fn locate(&self, pid: u32, addr: u64) -> Option<Location> {
        let snapshots = self.maps.get(&pid)?;
        for ranges in snapshots.iter().rev() {
            if let Some(r) = ranges.iter().find(|r| r.start <= addr && addr < r.end) {
                if r.path.is_empty() {
                    return Some(Location::Anon);
                }
                if r.path.starts_with('[') {
                    return Some(Location::Special(r.path.clone()));
                }
                let source = self
                    .files
                    .get(&pid)
                    .and_then(|f| f.files.get(&(r.start, r.end)))
                    .map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()));
                return Some(Location::File {
                    path: r.path.trim_end_matches(" (deleted)").to_string(),
                    offset: addr - r.start + r.offset,
                    source,
                });
            }
        }
        None
    }

    fn perf_map(&mut self, pid: u32) -> Option<&PerfMap> {
        let files = self.files;
        self.perf_maps
            .entry(pid)
            .or_insert_with(|| files.get(&pid)?.perf.as_ref()?.load())
            .as_ref()
    }
}

/// Symbolizes every stack; frames are interned in the result.
pub fn symbolize(
    stacks: &HashMap<u64, Stack>,
    maps: &[ProcMaps],
    files: &HashMap<u32, ProcFiles>,
) -> Symbols {
    symbolize_with(stacks, maps, files, &mut KernelSymbols::default())
}

/// The kernel's symbol table, read at the first kernel stack and kept: it
/// is the same for every batch of a recording, and reading and parsing
/// /proc/kallsyms (120 000 lines) cost more than symbolizing the batches
/// themselves (a third of gapscope's CPU beside a launch-bound job, which
/// it slowed).
#[derive(Default)]
pub(crate) struct KernelSymbols(Option<Option<Kallsyms>>);

impl KernelSymbols {
    fn get(&mut self) -> Option<&Kallsyms> {
        self.0.get_or_insert_with(Kallsyms::load).as_ref()
    }
}

fn symbolize_with(
    stacks: &HashMap<u64, Stack>,
    maps: &[ProcMaps],
    files: &HashMap<u32, ProcFiles>,
    kernel: &mut KernelSymbols,
) -> Symbols {
    let kallsyms = if stacks.values().any(|s| s.kernel) {
        kernel.get()
    } else {
        None
    };
    let mut resolver = Resolver {
        maps: HashMap::new(),
        files,
        perf_maps: HashMap::new(),
        kallsyms,
    };
    for m in maps {
        resolver.maps.entry(m.pid).or_default().push(&m.ranges);
    }

    // Pass 1: find every (file, offset) to look up, batched per file.
    let mut per_file: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for s in stacks.values().filter(|s| !s.kernel) {
        // Python frames come after the native ones and name no file.
        let walked = resolver.files.get(&s.pid).is_some_and(|f| !f.py.is_empty());
        let native = &s.addrs[..python_from(&s.addrs, walked)];
        for (i, &addr) in native.iter().enumerate() {
            if let Some(Location::File {
                source: Some(source),
                offset,
                ..
            }) = resolver.locate(s.pid, lookup_addr(i, addr))
            {
                per_file.entry(source).or_default().push(offset);
            }
        }
    }
    let symbolizer = Symbolizer::new();
    let mut names: HashMap<(String, u64), String> = HashMap::new();
    for (path, mut offsets) in per_file {
        offsets.sort_unstable();
        offsets.dedup();
        let src = Source::Elf(Elf::new(&path));
        let Ok(results) = symbolizer.symbolize(&src, Input::FileOffset(&offsets)) else {
            continue;
        };
        for (offset, result) in offsets.iter().zip(results) {
            if let Symbolized::Sym(sym) = result {
                names.insert((path.clone(), *offset), sym.name.into_owned());
            }
        }
    }

    // Pass 2: build interned frames.
    let mut out = Symbols::default();
    let mut interned: HashMap<Frame, u32> = HashMap::new();
    let mut intern = |frame: Frame, out: &mut Symbols| -> u32 {
        *interned.entry(frame.clone()).or_insert_with(|| {
            out.frames.push(frame);
            (out.frames.len() - 1) as u32
        })
    };
    let mut hashes: Vec<&u64> = stacks.keys().collect();
    hashes.sort_unstable();
    for hash in hashes {
        let s = &stacks[hash];
        let frames = if s.kernel {
            kernel_frames(&resolver, &s.addrs)
        } else {
            user_frames(&mut resolver, &names, s.pid, &s.addrs)
        };
        let idx = frames.into_iter().map(|f| intern(f, &mut out)).collect();
        out.stacks.push((*hash, idx));
    }
    out
}

fn kernel_frames(resolver: &Resolver<'_>, addrs: &[u64]) -> Vec<Frame> {
    let mut out = Vec::with_capacity(addrs.len());
    for &addr in addrs {
        let function = resolver
            .kallsyms
            .and_then(|k| k.lookup(addr))
            .unwrap_or(UNKNOWN);
        // Stacks taken in a tracepoint start inside our own program and
        // the kernel's BPF dispatch: not the traced code's time.
        if out.is_empty() && is_tracer_frame(function) {
            continue;
        }
        out.push(Frame {
            function: function.to_string(),
            module: "[kernel]".into(),
        });
    }
    out
}

/// A user stack's frames, innermost first: its native frames with, in a
/// CPython process, its Python frames where the eval loop ran them.
fn user_frames(
    resolver: &mut Resolver<'_>,
    names: &HashMap<(String, u64), String>,
    pid: u32,
    addrs: &[u64],
) -> Vec<Frame> {
    let walked = resolver.files.get(&pid).is_some_and(|f| !f.py.is_empty());
    let first_py = python_from(addrs, walked);
    let mut native = Vec::with_capacity(addrs.len());
    for (i, &addr) in addrs[..first_py].iter().enumerate() {
        native.push(user_frame(resolver, names, pid, lookup_addr(i, addr)));
    }
    let python = addrs[first_py..]
        .iter()
        .map(|&addr| {
            (
                python_frame(resolver.files, pid, addr),
                addr & abi::PY_ENTRY != 0,
            )
        })
        .collect();
    interleave(native, python)
}

/// Where a user stack's Python frames start: the kernel side puts them
/// after the native ones, each tagged, so they are its tagged tail — in a
/// process whose frames it walked. A native frame can carry the tag's bit
/// too (a frame-pointer walk through code built without them reads what is
/// no return address); one followed by untagged frames is no Python frame.
/// (Clearing such frames in the kernel made its verifier take a second
/// longer to load the programs.)
fn python_from(addrs: &[u64], walked: bool) -> usize {
    if !walked {
        return addrs.len();
    }
    addrs
        .iter()
        .rposition(|&a| a & abi::PY_FRAME == 0)
        .map_or(0, |i| i + 1)
}

/// A Python frame: its code object's qualified name and file, as the
/// kernel side described it in this process. No code object marks a walk
/// cut short (more frames than the unwinder walks).
fn python_frame(files: &HashMap<u32, ProcFiles>, pid: u32, addr: u64) -> Frame {
    let code = addr & abi::PY_ADDR_MASK;
    if code == 0 {
        return Frame {
            function: PY_CUT.into(),
            module: String::new(),
        };
    }
    match files.get(&pid).and_then(|f| f.py.get(&code)) {
        Some(c) => Frame {
            function: format!("py::{}:{}", c.name, c.file),
            module: c.file.clone(),
        },
        None => Frame {
            function: "py::[unknown]".into(),
            module: String::new(),
        },
    }
}

/// Where the unwinder stopped with Python frames left (outermost of those
/// shown).
pub const PY_CUT: &str = "py::[more frames not walked]";

/// Whether a native frame is a call of CPython's eval loop.
fn is_eval_loop(function: &str) -> bool {
    function.starts_with("_PyEval_EvalFrameDefault") || function == "PyEval_EvalFrameEx"
}

/// Puts each call of the eval loop's Python frames (`entry` ends one: its
/// outermost frame) in place of that call's native frame, innermost first.
/// Native stacks cut short (an interpreter built without frame pointers)
/// reach no eval loop frame: the Python frames then follow the native
/// ones. Frames CPython's perf trampoline named (`py::`, from its perf
/// map) are the same functions again, and go; so do native frames no
/// mapping holds, which in such a stack are what a frame-pointer walk
/// read past the interpreter's frames, not code.
fn interleave(native: Vec<Frame>, python: Vec<(Frame, bool)>) -> Vec<Frame> {
    if python.is_empty() {
        return native;
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut rest = python.into_iter().peekable();
    for f in native {
        if f.function.starts_with("py::") || f.function == UNKNOWN {
            continue;
        }
        if !is_eval_loop(&f.function) || rest.peek().is_none() {
            out.push(f);
            continue;
        }
        for (p, entry) in rest.by_ref() {
            out.push(p);
            if entry {
                break;
            }
        }
    }
    out.extend(rest.map(|(p, _)| p));
    out
}

/// Keeps each Symbols record to a bounded size.
pub(crate) fn split(all: Symbols) -> Vec<Symbols> {
    const PER_RECORD: usize = 2048;
    let mut out = Vec::new();
    for stacks in all.stacks.chunks(PER_RECORD) {
        let mut chunk = Symbols::default();
        let mut remap = HashMap::new();
        for (hash, idx) in stacks {
            let idx = idx
                .iter()
                .map(|&i| {
                    *remap.entry(i).or_insert_with(|| {
                        chunk.frames.push(all.frames[i as usize].clone());
                        (chunk.frames.len() - 1) as u32
                    })
                })
                .collect();
            chunk.stacks.push((*hash, idx));
        }
        out.push(chunk);
    }
    out
}

/// Stacks to symbolize together, with the maps of every process they
/// belong to.
struct Batch {
    stacks: HashMap<u64, Stack>,
    maps: Vec<ProcMaps>,
    files: HashMap<u32, ProcFiles>,
}

/// Symbolizes batches of stacks on a thread of its own while recording, so
/// that the event loop keeps draining the ring buffer meanwhile (a batch
/// reads the symbol tables of every binary involved, which takes long for
/// large libraries). Each batch gets a fresh blazesym symbolizer, as the
/// one pass at the end of a recording always did: nothing of the target's
/// is cached from one batch to the next, so the worker holds no more than
/// the batch it is on and the kernel's symbol table ([`KernelSymbols`]).
pub(crate) struct Worker {
    /// None once the thread is gone (or never started): batches are then
    /// symbolized by the caller.
    jobs: Option<mpsc::SyncSender<Batch>>,
    done: mpsc::Receiver<Symbols>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Results of batches symbolized by the caller.
    inline: Vec<Symbols>,
    /// Batches handed to the thread and not returned yet.
    pending: usize,
}

impl Worker {
    pub(crate) fn start() -> Worker {
        // One batch waits while another is symbolized: a caller that hands
        // over batches faster than they are symbolized waits for the worker
        // rather than queueing stacks without bound.
        let (jobs, inbox) = mpsc::sync_channel::<Batch>(1);
        let (results, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gapscope-symbols".into())
            .spawn(move || {
                // Read now, while the recording starts (the BPF programs
                // load), rather than beside the job at its first batch.
                let mut kernel = KernelSymbols::default();
                kernel.get();
                for batch in inbox {
                    let symbols =
                        symbolize_with(&batch.stacks, &batch.maps, &batch.files, &mut kernel);
                    if results.send(symbols).is_err() {
                        return;
                    }
                }
            })
            .ok();
        Worker {
            jobs: thread.is_some().then_some(jobs),
            done,
            thread,
            inline: Vec::new(),
            pending: 0,
        }
    }

    /// Hands over stacks and the maps that resolve them.
    pub(crate) fn submit(
        &mut self,
        stacks: HashMap<u64, Stack>,
        maps: Vec<ProcMaps>,
        files: HashMap<u32, ProcFiles>,
    ) {
        if stacks.is_empty() {
            return;
        }
        self.pending += 1;
        let batch = Batch {
            stacks,
            maps,
            files,
        };
        let batch = match &self.jobs {
            Some(jobs) => match jobs.send(batch) {
                Ok(()) => return,
                Err(mpsc::SendError(batch)) => batch,
            },
            None => batch,
        };
        self.jobs = None;
        self.pending -= 1;
        self.inline
            .push(symbolize(&batch.stacks, &batch.maps, &batch.files));
    }

    /// Results ready now, without waiting.
    pub(crate) fn ready(&mut self) -> Vec<Symbols> {
        let mut out = std::mem::take(&mut self.inline);
        for s in self.done.try_iter() {
            self.pending -= 1;
            out.push(s);
        }
        out
    }

    /// Waits for every batch handed over and returns what is left, with
    /// the number of batches given up on: those not done by `deadline` or
    /// once `give_up` says so (a second Ctrl-C or SIGTERM). A file system
    /// a target controls can hold a read of its files for ever; the session
    /// is whole without their symbols.
    pub(crate) fn finish(
        mut self,
        deadline: Instant,
        give_up: &dyn Fn() -> bool,
    ) -> (Vec<Symbols>, usize) {
        self.jobs = None;
        let mut out = std::mem::take(&mut self.inline);
        while self.pending > 0 && Instant::now() < deadline && !give_up() {
            match self.done.recv_timeout(Duration::from_millis(100)) {
                Ok(s) => {
                    self.pending -= 1;
                    out.push(s);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        out.extend(self.ready());
        // The thread is left behind if it is stuck: joining it could wait
        // for ever.
        if self.pending == 0 {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        (out, self.pending)
    }
}

fn is_tracer_frame(f: &str) -> bool {
    f.starts_with("bpf_prog_") || f.starts_with("bpf_trace_run") || f.starts_with("__bpf_trace_")
}

/// Return addresses point after the call; look up the call itself.
fn lookup_addr(index: usize, addr: u64) -> u64 {
    if index == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

fn user_frame(
    resolver: &mut Resolver<'_>,
    names: &HashMap<(String, u64), String>,
    pid: u32,
    addr: u64,
) -> Frame {
    match resolver.locate(pid, addr) {
        Some(Location::File {
            path,
            offset,
            source,
        }) => {
            let module = Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.clone());
            let function = source
                .and_then(|src| names.get(&(src, offset)))
                .cloned()
                .unwrap_or_else(|| format!("{module}+{offset:#x}"));
            Frame { function, module }
        }
        Some(Location::Special(name)) => Frame {
            function: name.clone(),
            module: name,
        },
        Some(Location::Anon) | None => {
            let jit = resolver
                .perf_map(pid)
                .and_then(|m| m.lookup(addr))
                .map(str::to_string);
            Frame {
                function: jit.unwrap_or_else(|| UNKNOWN.to_string()),
                module: String::new(),
            }
        }
    }
}

/// A `/tmp/perf-PID.map` file: "START SIZE NAME" per line, hex.
struct PerfMap {
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    fn parse(text: &str) -> PerfMap {
        let mut entries: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ' ');
                let start = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
                let size = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
                Some((start, size, f.next()?.to_string()))
            })
            .collect();
        entries.sort_by_key(|e| e.0);
        PerfMap { entries }
    }

    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self
            .entries
            .partition_point(|e| e.0 <= addr)
            .checked_sub(1)?;
        let (start, size, name) = &self.entries[i];
        (addr < start + size).then_some(name.as_str())
    }
}

/// /proc/kallsyms text symbols, sorted by address: the names in one
/// string (kept for a whole recording: 4 MiB, not a String per symbol).
struct Kallsyms {
    names: String,
    /// Address, and the name's start and length in `names`.
    syms: Vec<(u64, u32, u32)>,
}

impl Kallsyms {
    fn load() -> Option<Kallsyms> {
        let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
        let mut names = String::new();
        let mut syms = Vec::new();
        for l in text.lines() {
            let mut f = l.split_ascii_whitespace();
            let (Some(addr), Some(ty), Some(name)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if !matches!(ty, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr != 0 {
                syms.push((addr, names.len() as u32, name.len() as u32));
                names.push_str(name);
            }
        }
        if syms.is_empty() {
            return None; // not root: addresses are hidden
        }
        syms.sort_unstable_by_key(|s| s.0);
        Some(Kallsyms { names, syms })
    }

    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (_, at, len) = self.syms[i];
        self.names.get(at as usize..(at + len) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolization() -> usize {
        marker_function_for_symbolization as *const () as usize
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn own_function_resolves_from_maps_snapshot() {
        if !is_root() {
            eprintln!("skipping: /proc/PID/map_files needs root");
            return;
        }
        let addr = marker_function_for_symbolization() as u64;
        let pid = std::process::id();
        let ranges = crate::collect::procfs::exec_maps(pid).unwrap();
        let mut files = ProcFiles::of(pid);
        files.hold(pid, &ranges, &mut Inodes::new());
        let files = HashMap::from([(pid, files)]);
        let maps = vec![ProcMaps { pid, ranges }];
        let stack = Stack {
            hash: 1,
            pid,
            kernel: false,
            addrs: vec![addr + 1, 0x10],
        };
        let stacks = HashMap::from([(1, stack)]);
        let sym = symbolize(&stacks, &maps, &files);
        let frames: Vec<&Frame> = sym.stacks[0]
            .1
            .iter()
            .map(|&i| &sym.frames[i as usize])
            .collect();
        assert!(
            frames[0]
                .function
                .contains("marker_function_for_symbolization"),
            "{frames:?}"
        );
        assert_eq!(frames[1].function, UNKNOWN);
        // By the path its maps show, nothing is opened: without the files
        // held, the frame is its module and offset.
        let sym = symbolize(&stacks, &maps, &HashMap::new());
        let f = &sym.frames[sym.stacks[0].1[0] as usize];
        assert!(f.function.contains("+0x"), "{f:?}");
    }

    /// A perf map that is a FIFO, a link, or another user's file is not
    /// read: the FIFO never holds the open, the link is not followed.
    #[test]
    fn a_perf_map_is_read_only_if_the_processs_own_regular_file() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        std::fs::write(&secret, "1000 100 SECRET\n").unwrap();
        let at = |name: &str, uid: u32| PerfMapAt {
            tmp: crate::safe_fs::dir(t.path()).unwrap(),
            name: name.into(),
            uid,
        };
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        std::fs::write(t.path().join("perf-1.map"), "1000 100 py::f:a.py\n").unwrap();
        let m = at("perf-1.map", me).load().unwrap();
        assert_eq!(m.lookup(0x1001), Some("py::f:a.py"));
        assert!(at("perf-1.map", me + 1).load().is_none(), "another user's");
        symlink(&secret, t.path().join("perf-2.map")).unwrap();
        assert!(at("perf-2.map", me).load().is_none(), "a link");
        let fifo = std::ffi::CString::new(t.path().join("perf-3.map").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(at("perf-3.map", me).load().is_none(), "a FIFO");
    }

    fn frame(name: &str) -> Frame {
        Frame {
            function: name.into(),
            module: String::new(),
        }
    }

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames.iter().map(|f| f.function.as_str()).collect()
    }

    /// Each call of the eval loop's Python frames take its native frame's
    /// place; a native stack that reaches no eval loop has them after it;
    /// the trampoline's frames and unmapped addresses go.
    #[test]
    fn python_frames_go_where_the_eval_loop_ran_them() {
        let native = vec![
            frame("deflate"),
            frame("_PyEval_EvalFrameDefault"),
            frame("py::inner:t.py"),
            frame("PyObject_Call"),
            frame(UNKNOWN),
            frame("_PyEval_EvalFrameDefault"),
            frame("Py_RunMain"),
        ];
        let python = vec![
            (frame("py::inner"), false),
            (frame("py::outer"), true),
            (frame("py::<module>"), true),
        ];
        assert_eq!(
            names(&interleave(native, python.clone())),
            [
                "deflate",
                "py::inner",
                "py::outer",
                "PyObject_Call",
                "py::<module>",
                "Py_RunMain"
            ]
        );
        // Cut short: no eval loop frame.
        let native = vec![frame("__select"), frame(UNKNOWN)];
        assert_eq!(
            names(&interleave(native, python)),
            ["__select", "py::inner", "py::outer", "py::<module>"]
        );
        // No Python frames: the native stack as it is.
        let native = vec![frame("a"), frame(UNKNOWN)];
        assert_eq!(names(&interleave(native, Vec::new())), ["a", UNKNOWN]);
    }

    #[test]
    fn python_frames_are_the_tagged_tail_of_a_walked_process() {
        let py = abi::PY_FRAME | 0x1000;
        let junk = abi::PY_FRAME | 0x7;
        assert_eq!(python_from(&[0x400, 0x500, py, py], true), 2);
        assert_eq!(python_from(&[0x400, junk, 0x500, py], true), 3);
        assert_eq!(python_from(&[py, py], true), 0);
        assert_eq!(python_from(&[0x400, 0x500], true), 2);
        // A process whose frames were not walked has none.
        assert_eq!(python_from(&[0x400, junk], false), 2);
    }

    #[test]
    fn our_own_bpf_frames_are_recognised() {
        assert!(is_tracer_frame("bpf_prog_6b47087af9dcba6b_gs_sched_switch"));
        assert!(is_tracer_frame("bpf_trace_run4"));
        assert!(!is_tracer_frame("__schedule"));
        assert!(!is_tracer_frame("bpf_map_lookup_elem"));
    }

    #[test]
    fn perf_map_lookup() {
        let m = PerfMap::parse("1000 100 py::train:train.py\n2000 10 py::step:train.py\n");
        assert_eq!(m.lookup(0x1050), Some("py::train:train.py"));
        assert_eq!(m.lookup(0x1100), None);
        assert_eq!(m.lookup(0x2005), Some("py::step:train.py"));
        assert_eq!(m.lookup(0x10), None);
    }
}
