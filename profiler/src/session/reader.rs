use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use gapscope_cupti::GpuRecord;

use super::{
    Drops, Event, FdPath, Footer, Frame, GpuBlind, GpuLost, GpuSource, HostOp, NvmlDevice,
    NvmlSample, ProcMaps, ProcessInfo, Record, SessionError, SessionHeader, Stack, ThreadSeed,
    CHUNK_HEADER_LEN, FILE_HEADER_LEN, FORMAT_VERSION, MAGIC, MAX_CHUNK_COMPRESSED, MAX_CHUNK_RAW,
};

/// Streams records out of a session file. A damaged or cut-off tail ends the
/// stream and is reported through [`SessionReader::truncated`], never as a
/// panic: everything before it is still good.
pub struct SessionReader {
    input: BufReader<File>,
    path: PathBuf,
    offset: u64,
    chunk: Vec<u8>,
    pos: usize,
    truncated: Option<String>,
    done: bool,
}

impl SessionReader {
    pub fn open(path: &Path) -> Result<Self, SessionError> {
        let io = |source| SessionError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut header = [0u8; FILE_HEADER_LEN];
        let n = read_full(&mut input, &mut header).map_err(io)?;
        if n < FILE_HEADER_LEN || &header[..8] != MAGIC {
            return Err(SessionError::NotASession {
                path: path.to_path_buf(),
            });
        }
        let version = u16::from_le_bytes([header[8], header[9]]);
        if version > FORMAT_VERSION {
            return Err(SessionError::UnsupportedVersion {
                path: path.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        Ok(SessionReader {
            input,
            path: path.to_path_buf(),
            offset: FILE_HEADER_LEN as u64,
            chunk: Vec::new(),
            pos: 0,
            truncated: None,
            done: false,
        })
    }

    /// Why the stream ended early, if it did.
    pub fn truncated(&self) -> Option<&str> {
        self.truncated.as_deref()
    }

    fn stop(&mut self, why: String) {
        self.truncated = Some(why);
        self.done = true;
    }

    /// Loads the next chunk; false at a clean end or when the tail is bad.
    fn next_chunk(&mut self) -> bool {
        let mut head = [0u8; CHUNK_HEADER_LEN];
        match read_full(&mut self.input, &mut head) {
            Ok(0) => {
                self.done = true;
                return false;
            }
            Ok(n) if n < CHUNK_HEADER_LEN => {
                self.stop(format!(
                    "cut off inside a chunk header at byte {}",
                    self.offset
                ));
                return false;
            }
            Ok(_) => {}
            Err(e) => {
                self.stop(format!("read error at byte {}: {e}", self.offset));
                return false;
            }
        }
        let len = u32::from_le_bytes(head[0..4].try_into().unwrap());
        let raw_len = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let crc = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if len > MAX_CHUNK_COMPRESSED || raw_len > MAX_CHUNK_RAW {
            self.stop(format!(
                "implausible chunk length at byte {} ({len} / {raw_len} bytes)",
                self.offset
            ));
            return false;
        }
        let mut compressed = vec![0u8; len as usize];
        match read_full(&mut self.input, &mut compressed) {
            Ok(n) if n == len as usize => {}
            Ok(_) => {
                self.stop(format!("cut off inside the chunk at byte {}", self.offset));
                return false;
            }
            Err(e) => {
                self.stop(format!("read error at byte {}: {e}", self.offset));
                return false;
            }
        }
        if crc32fast::hash(&compressed) != crc {
            self.stop(format!(
                "checksum mismatch in the chunk at byte {}",
                self.offset
            ));
            return false;
        }
        // The frame states its own size: a chunk header that disagrees is
        // corrupt, refused before its claimed size is allocated.
        if !matches!(
            zstd::zstd_safe::get_frame_content_size(&compressed),
            Ok(Some(n)) if n == raw_len as u64
        ) {
            self.stop(format!("undecodable chunk at byte {}", self.offset));
            return false;
        }
        match zstd::bulk::decompress(&compressed, raw_len as usize) {
            Ok(raw) if raw.len() == raw_len as usize => self.chunk = raw,
            _ => {
                self.stop(format!("undecodable chunk at byte {}", self.offset));
                return false;
            }
        }
        self.offset += (CHUNK_HEADER_LEN + len as usize) as u64;
        self.pos = 0;
        true
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Iterator for SessionReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        while !self.done {
            if self.pos < self.chunk.len() {
                match postcard::take_from_bytes::<Record>(&self.chunk[self.pos..]) {
                    Ok((record, rest)) => {
                        self.pos = self.chunk.len() - rest.len();
                        return Some(record);
                    }
                    Err(e) => {
                        self.stop(format!(
                            "undecodable record in the chunk ending before byte {}: {e}",
                            self.offset
                        ));
                        return None;
                    }
                }
            }
            if !self.next_chunk() {
                return None;
            }
        }
        None
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A whole session, read into memory and grouped by record type.
#[derive(Debug, Default)]
pub struct Session {
    pub header: Option<SessionHeader>,
    pub events: Vec<Event>,
    pub stacks: HashMap<u64, Stack>,
    pub processes: Vec<ProcessInfo>,
    pub threads: Vec<ThreadSeed>,
    pub maps: Vec<ProcMaps>,
    pub fd_paths: Vec<FdPath>,
    /// Readings of threads' I/O counters, in order.
    pub thread_io: Vec<super::ThreadIo>,
    /// Processes the shim was injected into while recording.
    pub injected: Vec<super::ShimInjected>,
    pub drops: Drops,
    /// Every reading of the drop counters, in order (they are cumulative).
    pub drop_readings: Vec<Drops>,
    pub symbols: HashMap<u64, Vec<Frame>>,
    pub notes: Vec<String>,
    pub footer: Option<Footer>,
    pub gpu_sources: Vec<GpuSource>,
    /// GPU records with the pid of the process they came from.
    pub gpu: Vec<(u32, GpuRecord)>,
    /// Last cumulative (cupti, shim) losses per process.
    pub gpu_drops: HashMap<u32, (u64, u64)>,
    /// Spans whose GPU records were (partly) dropped by a shim.
    pub gpu_lost: Vec<GpuLost>,
    /// Spans a shim could not see at all, with the reason.
    pub gpu_blind: Vec<GpuBlind>,
    /// Last cumulative (incomplete, unknown kind) skipped records per process.
    pub gpu_skipped: HashMap<u32, (u64, u64)>,
    /// This recording's rank in a distributed job, when known.
    pub rank: Option<super::Rank>,
    pub nvml: Vec<NvmlSample>,
    pub nvml_devices: Vec<NvmlDevice>,
    pub host_ops: Vec<HostOp>,
    /// Readings of the machine's idle CPU time, in order (absent in
    /// imported traces and sessions before format 4).
    pub cpu_idle: Vec<super::CpuIdle>,
    /// gapscope's own cost while recording (absent in imported traces).
    pub collector: Option<super::CollectorCost>,
    /// Set when the file ends in a damaged or cut-off chunk, or has no footer.
    pub truncated: Option<String>,
}

impl Session {
    pub fn header(&self) -> &SessionHeader {
        self.header
            .as_ref()
            .expect("read_session guarantees a header")
    }
}

/// Checks that a file is a session this gapscope can read, reading no
/// further than its first record.
pub fn check(path: &Path) -> Result<(), SessionError> {
    let path = super::resolve_path(path);
    let mut reader = SessionReader::open(&path)?;
    match reader.next() {
        Some(Record::Header(_)) => Ok(()),
        Some(_) => Err(SessionError::NoHeader { path }),
        None => Err(SessionError::Empty { path }),
    }
}

/// Reads a session file (or the session in a run directory).
pub fn read_session(path: &Path) -> Result<Session, SessionError> {
    let mut events = Vec::new();
    let (mut s, _) = read_records(path, |e| events.push(e), None)?;
    s.events = events;
    let dropped = sanitize(&mut s);
    note_dropped(&mut s, dropped);
    into_time_order(&mut s.events);
    finish(&mut s);
    Ok(s)
}

/// A session read for an analysis that streams its events: everything but
/// the events in memory, and what it takes to replay them in time order
/// holding only a short window of them (see [`EventStream::replay`]).
pub struct Outline {
    /// The session without its events.
    pub session: Session,
    pub events: EventStream,
    /// The recording holds libcuda calls seen by uprobes.
    pub cuda_calls: bool,
}

/// A session file's events, to be read again in time order.
pub struct EventStream {
    path: PathBuf,
    /// Records the first pass read, so that the second reads the same ones
    /// even if the file grows meanwhile.
    records: u64,
    /// How far behind the latest earlier event an event came, at most: the
    /// second pass holds events back this long to put them in time order.
    lateness: u64,
    /// Where events may lie and still be believed (see [`sanitize`]).
    window: (u64, u64),
    /// Non-event records dropped by [`sanitize`].
    dropped: usize,
}

/// Reads everything of a session but its events, noting how out of order
/// they are; its GPU records go to `gpu` as they are read, and each event
/// passes `event` (to count what must be known before they are replayed).
pub fn read_outline(
    path: &Path,
    mut gpu: impl FnMut(u32, GpuRecord),
    mut event: impl FnMut(&Event),
) -> Result<Outline, SessionError> {
    let mut latest = 0u64;
    let mut lateness = 0u64;
    let mut cuda_calls = false;
    let (mut s, records) = read_records(
        path,
        |e| {
            event(&e);
            let ts = e.ts();
            lateness = lateness.max(latest.saturating_sub(ts));
            latest = latest.max(ts);
            cuda_calls |= matches!(e, Event::CudaCall { .. });
        },
        Some(&mut gpu),
    )?;
    let dropped = sanitize(&mut s);
    finish(&mut s);
    let window = window(&s);
    Ok(Outline {
        session: s,
        events: EventStream {
            path: super::resolve_path(path),
            records,
            lateness,
            window,
            dropped,
        },
        cuda_calls,
    })
}

impl EventStream {
    /// Where records may lie and still be believed: GPU records taken
    /// apart from the session are checked against it too.
    pub fn window(&self) -> (u64, u64) {
        self.window
    }

    /// Hands `each` the events, in time order (stably, as [`read_session`]
    /// orders them) and past the same checks; returns how many records
    /// were dropped as timed outside the recording, the outline's included.
    pub fn replay(&self, mut each: impl FnMut(Event)) -> Result<usize, SessionError> {
        let reader = SessionReader::open(&self.path)?;
        let mut held: std::collections::BinaryHeap<Held> = Default::default();
        let mut latest = 0u64;
        let mut dropped = 0usize;
        let mut seq = 0u64;
        for record in reader.take(self.records as usize) {
            let Record::Event(e) = record else {
                continue;
            };
            let ts = e.ts();
            latest = latest.max(ts);
            if !event_within(self.window, &e) {
                dropped += 1;
                continue;
            }
            seq += 1;
            held.push(Held { ts, seq, event: e });
            // No event still to come can be earlier than this: the first
            // pass measured how late any of them came.
            let ready = latest.saturating_sub(self.lateness);
            while held.peek().is_some_and(|h| h.ts < ready) {
                each(held.pop().expect("peeked").event);
            }
        }
        while let Some(h) = held.pop() {
            each(h.event);
        }
        Ok(self.dropped + dropped)
    }
}

/// An event held back for ordering: earliest first, then in file order.
struct Held {
    ts: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Held {
    fn eq(&self, o: &Held) -> bool {
        (self.ts, self.seq) == (o.ts, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Held) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    // Reversed: BinaryHeap pops its greatest.
    fn cmp(&self, o: &Held) -> std::cmp::Ordering {
        (o.ts, o.seq).cmp(&(self.ts, self.seq))
    }
}

/// Reads every record, grouped by type, handing the events to `event` and
/// the GPU records to `gpu` when given; also returns how many records it
/// read.
fn read_records(
    path: &Path,
    mut event: impl FnMut(Event),
    mut gpu: Option<&mut dyn FnMut(u32, GpuRecord)>,
) -> Result<(Session, u64), SessionError> {
    let path = super::resolve_path(path);
    let mut reader = SessionReader::open(&path)?;
    let mut s = Session::default();
    let mut first = true;
    let mut records = 0u64;
    for record in reader.by_ref() {
        records += 1;
        if first {
            if !matches!(record, Record::Header(_)) {
                return Err(SessionError::NoHeader { path });
            }
            first = false;
        }
        match record {
            Record::Header(h) => s.header = Some(h),
            Record::Event(e) => event(e),
            Record::Stack(st) => {
                s.stacks.insert(st.hash, st);
            }
            Record::Process(p) => s.processes.push(p),
            Record::Thread(t) => s.threads.push(t),
            Record::Maps(m) => s.maps.push(m),
            Record::FdPath(f) => s.fd_paths.push(f),
            Record::ThreadIo(t) => s.thread_io.push(t),
            Record::ShimInjected(i) => s.injected.push(i),
            Record::Drops(d) => {
                s.drop_readings.push(d.clone());
                s.drops = d;
            }
            Record::Symbols(sym) => {
                for (hash, idx) in sym.stacks {
                    let frames = idx
                        .iter()
                        .filter_map(|&i| sym.frames.get(i as usize).cloned())
                        .collect();
                    s.symbols.insert(hash, frames);
                }
            }
            Record::Note(n) => s.notes.push(n),
            Record::End(f) => s.footer = Some(f),
            Record::GpuSource(g) => s.gpu_sources.push(g),
            Record::Gpu(b) => match gpu.as_mut() {
                Some(take) => b.records.into_iter().for_each(|r| take(b.pid, r)),
                None => s.gpu.extend(b.records.into_iter().map(|r| (b.pid, r))),
            },
            Record::GpuDrops { pid, cupti, shim } => {
                s.gpu_drops.insert(pid, (cupti, shim));
            }
            Record::Nvml(n) => s.nvml.push(n),
            Record::NvmlDevice(d) => s.nvml_devices.push(d),
            Record::HostOp(o) => s.host_ops.push(o),
            Record::Cost(c) => s.collector = Some(c),
            Record::GpuLost(l) => s.gpu_lost.push(l),
            Record::GpuBlind(b) => s.gpu_blind.push(b),
            Record::GpuSkipped {
                pid,
                incomplete,
                unknown,
            } => {
                s.gpu_skipped.insert(pid, (incomplete, unknown));
            }
            Record::Rank(r) => s.rank = Some(r),
            Record::CpuIdle(c) => s.cpu_idle.push(c),
        }
    }
    if first {
        return Err(SessionError::Empty { path });
    }
    s.truncated = reader.truncated().map(str::to_string);
    Ok((s, records))
}

fn finish(s: &mut Session) {
    if s.truncated.is_none() && s.footer.is_none() {
        s.truncated = Some("the recording did not finish (no end record)".into());
    }
}

/// Says how many records timed outside the recording were left out.
pub(crate) fn note_dropped(s: &mut Session, dropped: usize) {
    if dropped > 0 {
        s.notes.push(format!(
            "{dropped} records timed outside the recording were ignored (a damaged file?)"
        ));
    }
}

/// Puts events into time order, stably and in place, once for every reader
/// of them. They are written in ring-buffer order, which is off by a few
/// microseconds across CPUs, so each is a few places from where it belongs:
/// insertion sort does that without a copy of millions of events. A file
/// that is far from sorted (damaged, or made by hand) gets a general sort
/// once the insertion work passes a bound.
pub(crate) fn into_time_order(events: &mut [Event]) {
    const MOVES_PER_EVENT: usize = 64;
    let budget = events.len().saturating_mul(MOVES_PER_EVENT);
    let mut moves = 0usize;
    for i in 1..events.len() {
        let mut j = i;
        while j > 0 && events[j - 1].ts() > events[j].ts() {
            events.swap(j - 1, j);
            j -= 1;
            moves += 1;
            if moves > budget {
                events.sort_by_key(Event::ts);
                return;
            }
        }
    }
}

/// Longest a recording is taken to be; a window claiming more is damaged.
const MAX_SPAN_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;
/// How far records may lie outside the window and still be believed
/// (drained after the end, GPU work queued before the start).
const SLACK_NS: u64 = 60 * 1_000_000_000;

/// Where records may lie and still be believed, once the footer is
/// checked.
pub(crate) fn window(s: &Session) -> (u64, u64) {
    let start = s.header().start_ns;
    let limit = start.saturating_add(MAX_SPAN_NS);
    let lo = start.saturating_sub(SLACK_NS);
    let hi = s
        .footer
        .as_ref()
        .map_or(limit, |f| f.end_ns)
        .saturating_add(SLACK_NS);
    (lo, hi)
}

/// `t` lies inside `window` (see [`window`]).
pub fn within((lo, hi): (u64, u64), t: u64) -> bool {
    (lo..=hi).contains(&t)
}

/// `[a, b]` lies inside `window` and does not end before it starts.
pub fn span_within(window: (u64, u64), a: u64, b: u64) -> bool {
    within(window, a) && within(window, b) && b >= a
}

/// An event lies inside `window`, its duration included.
fn event_within(window: (u64, u64), e: &Event) -> bool {
    match e {
        Event::Syscall { ts, dur, .. } | Event::CudaCall { ts, dur, .. } => {
            span_within(window, *ts, ts.saturating_add(*dur))
        }
        e => within(window, e.ts()),
    }
}

/// Drops what a damaged file cannot mean: an end before the start, and
/// records timed far outside the recording. The analysis can then trust
/// that every time and duration lies inside a bounded window. Returns how
/// many records it dropped.
pub(crate) fn sanitize(s: &mut Session) -> usize {
    let start = s.header().start_ns;
    let limit = start.saturating_add(MAX_SPAN_NS);
    if s.footer
        .as_ref()
        .is_some_and(|f| f.end_ns < start || f.end_ns > limit)
    {
        s.footer = None;
        s.truncated
            .get_or_insert_with(|| "its end record is damaged".into());
    }
    let w = window(s);
    let ok = |t: u64| within(w, t);
    let span = |a: u64, b: u64| span_within(w, a, b);
    let before = s.events.len() + s.gpu.len() + s.host_ops.len() + s.nvml.len();
    s.events.retain(|e| event_within(w, e));
    s.gpu.retain(|(_, r)| match r {
        GpuRecord::Kernel { start, end, .. }
        | GpuRecord::Memcpy { start, end, .. }
        | GpuRecord::Memset { start, end, .. }
        | GpuRecord::Sync { start, end, .. }
        | GpuRecord::Api { start, end, .. }
        | GpuRecord::Range { start, end, .. } => span(*start, *end),
        GpuRecord::Marker { ts, .. } => ok(*ts),
        GpuRecord::Device { .. } | GpuRecord::DeviceUuid { .. } => true,
    });
    s.host_ops.retain(|o| span(o.start, o.end));
    s.nvml.retain(|n| ok(n.ts));
    s.gpu_lost.retain(|l| span(l.start, l.end));
    s.gpu_blind.retain(|b| span(b.start, b.end));
    s.drop_readings.retain(|d| ok(d.ts));
    before - (s.events.len() + s.gpu.len() + s.host_ops.len() + s.nvml.len())
}
