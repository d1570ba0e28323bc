//! Turns raw stack addresses into function names, so that a session carries
//! its own symbols and offline reports need neither the target's binaries nor
//! root. User addresses are mapped to (file, offset) through the /proc maps
//! snapshots taken while the processes were alive, then symbolized with
//! blazesym; JIT frames come from perf maps (`/tmp/perf-PID.map`, written by
//! e.g. Python 3.12+ with `-X perf`); kernel frames from /proc/kallsyms.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::mpsc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::session::{Frame, MapRange, ProcMaps, Stack, Symbols};

const UNKNOWN: &str = "[unknown]";

/// Where a user address lives.
enum Location {
    File {
        path: String,
        offset: u64,
    },
    /// [vdso], [vsyscall], [stack], ...: named by the kernel, not a file.
    Special(String),
    Anon,
}

struct Resolver<'a> {
    /// Per pid, newest snapshot last.
    maps: HashMap<u32, Vec<&'a [MapRange]>>,
    perf_maps: HashMap<u32, Option<PerfMap>>,
    kallsyms: Option<Kallsyms>,
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
                return Some(Location::File {
                    path: r.path.trim_end_matches(" (deleted)").to_string(),
                    offset: addr - r.start + r.offset,
                });
            }
        }
        None
    }

    fn perf_map(&mut self, pid: u32) -> Option<&PerfMap> {
        self.perf_maps
            .entry(pid)
            .or_insert_with(|| {
                // A process writes its map in its own /tmp under the pid its
                // own namespace gives it — in a container, not ours: read
                // through /proc while it lives; after, from our /tmp.
                super::pidns::own_pid(pid)
                    .and_then(|ns| {
                        PerfMap::load(Path::new(&format!("/proc/{pid}/root/tmp/perf-{ns}.map")))
                    })
                    .or_else(|| PerfMap::load(Path::new(&format!("/tmp/perf-{pid}.map"))))
            })
            .as_ref()
    }
}

/// Symbolizes every stack; frames are interned in the result.
pub fn symbolize(stacks: &HashMap<u64, Stack>, maps: &[ProcMaps]) -> Symbols {
    let mut resolver = Resolver {
        maps: HashMap::new(),
        perf_maps: HashMap::new(),
        kallsyms: None,
    };
    for m in maps {
        resolver.maps.entry(m.pid).or_default().push(&m.ranges);
    }
    if stacks.values().any(|s| s.kernel) {
        resolver.kallsyms = Kallsyms::load();
    }

    // Pass 1: find every (file, offset) to look up, batched per file.
    let mut per_file: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for s in stacks.values().filter(|s| !s.kernel) {
        for (i, &addr) in s.addrs.iter().enumerate() {
            if let Some(Location::File { path, offset }) =
                resolver.locate(s.pid, lookup_addr(i, addr))
            {
                per_file.entry(path).or_default().push(offset);
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
        let mut idx = Vec::with_capacity(s.addrs.len());
        let mut leaf = true;
        for (i, &addr) in s.addrs.iter().enumerate() {
            let frame = if s.kernel {
                let function = resolver
                    .kallsyms
                    .as_ref()
                    .and_then(|k| k.lookup(addr))
                    .unwrap_or(UNKNOWN);
                // Stacks taken in a tracepoint start inside our own program
                // and the kernel's BPF dispatch: not the traced code's time.
                if leaf && is_tracer_frame(function) {
                    continue;
                }
                leaf = false;
                Frame {
                    function: function.to_string(),
                    module: "[kernel]".into(),
                }
            } else {
                user_frame(&mut resolver, &names, s.pid, lookup_addr(i, addr))
            };
            idx.push(intern(frame, &mut out));
        }
        out.stacks.push((*hash, idx));
    }
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
}

/// Symbolizes batches of stacks on a thread of its own while recording, so
/// that the event loop keeps draining the ring buffer meanwhile (a batch
/// reads the symbol tables of every binary involved, which takes long for
/// large libraries). Each batch gets a fresh blazesym symbolizer, as the
/// one pass at the end of a recording always did: nothing is cached from
/// one batch to the next, so the worker holds no more than the batch it is
/// on.
pub(crate) struct Worker {
    /// None once the thread is gone (or never started): batches are then
    /// symbolized by the caller.
    jobs: Option<mpsc::SyncSender<Batch>>,
    done: mpsc::Receiver<Symbols>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Results of batches symbolized by the caller.
    inline: Vec<Symbols>,
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
                for batch in inbox {
                    if results.send(symbolize(&batch.stacks, &batch.maps)).is_err() {
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
        }
    }

    /// Hands over stacks and the maps that resolve them.
    pub(crate) fn submit(&mut self, stacks: HashMap<u64, Stack>, maps: Vec<ProcMaps>) {
        if stacks.is_empty() {
            return;
        }
        let batch = Batch { stacks, maps };
        let batch = match &self.jobs {
            Some(jobs) => match jobs.send(batch) {
                Ok(()) => return,
                Err(mpsc::SendError(batch)) => batch,
            },
            None => batch,
        };
        self.jobs = None;
        self.inline.push(symbolize(&batch.stacks, &batch.maps));
    }

    /// Results ready now, without waiting.
    pub(crate) fn ready(&mut self) -> Vec<Symbols> {
        let mut out = std::mem::take(&mut self.inline);
        out.extend(self.done.try_iter());
        out
    }

    /// Waits for every batch handed over and returns what is left.
    pub(crate) fn finish(mut self) -> Vec<Symbols> {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.ready()
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
        Some(Location::File { path, offset }) => {
            let module = Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.clone());
            let function = names
                .get(&(path, offset))
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

/// Removes `/tmp/perf-PID.map` if CPython wrote it (its entries are its
/// trampolines, `py::…`): for a process that has exited and whose stacks
/// are symbolized, when gapscope turned the trampoline on. Another
/// runtime's map (V8's, a JIT's the user asked for) stays.
pub fn remove_python_perf_map(pid: u32) {
    use std::io::Read;
    let path = format!("/tmp/perf-{pid}.map");
    let mut head = [0u8; 512];
    let n = std::fs::File::open(&path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let first = head[..n].split(|&b| b == b'\n').next().unwrap_or(&[]);
    if String::from_utf8_lossy(first).contains(" py::") {
        let _ = std::fs::remove_file(&path);
    }
}

/// A `/tmp/perf-PID.map` file: "START SIZE NAME" per line, hex.
struct PerfMap {
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    fn load(path: &Path) -> Option<PerfMap> {
        let text = std::fs::read_to_string(path).ok()?;
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
        Some(PerfMap { entries })
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

/// /proc/kallsyms text symbols, sorted by address.
struct Kallsyms {
    syms: Vec<(u64, String)>,
}

impl Kallsyms {
    fn load() -> Option<Kallsyms> {
        let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let ty = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(ty, "t" | "T" | "w" | "W")).then(|| (addr, name.to_string()))
            })
            .collect();
        if syms.is_empty() {
            return None; // not root: addresses are hidden
        }
        syms.sort_by_key(|s| s.0);
        Some(Kallsyms { syms })
    }

    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        Some(&self.syms[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolization() -> usize {
        marker_function_for_symbolization as *const () as usize
    }

    #[test]
    fn own_function_resolves_from_maps_snapshot() {
        let addr = marker_function_for_symbolization() as u64;
        let pid = std::process::id();
        let maps = vec![ProcMaps {
            pid,
            ranges: crate::collect::procfs::exec_maps(pid).unwrap(),
        }];
        let stack = Stack {
            hash: 1,
            pid,
            kernel: false,
            addrs: vec![addr + 1, 0x10],
        };
        let stacks = HashMap::from([(1, stack)]);
        let sym = symbolize(&stacks, &maps);
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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        std::fs::write(
            &path,
            "1000 100 py::train:train.py\n2000 10 py::step:train.py\n",
        )
        .unwrap();
        let m = PerfMap::load(&path).unwrap();
        assert_eq!(m.lookup(0x1050), Some("py::train:train.py"));
        assert_eq!(m.lookup(0x1100), None);
        assert_eq!(m.lookup(0x2005), Some("py::step:train.py"));
        assert_eq!(m.lookup(0x10), None);
    }
}
