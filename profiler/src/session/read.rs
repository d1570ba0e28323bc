//! A session read: whole into memory ([`Session`]), or as its outline
//! first and then its events in time order ([`EventStream`]), from one
//! file or one recording's windows.

use std::collections::HashMap;
use std::path::Path;

use gapscope_wire::GpuRecord;

use crate::holdback::Holdback;

use super::reader::{refused, SessionReader};
use super::stored::Stored;
use super::{
    Drops, Event, FdPath, Footer, Frame, GpuBlind, GpuLost, GpuSource, HostOp, NvmlDevice,
    NvmlSample, ProcMaps, ProcessInfo, Record, SessionError, SessionHeader, Stack, ThreadSeed,
};

/// Bytes of frames a file's symbol records may expand to (every stack
/// holds a copy of its frames), per byte of the file, and whatever its
/// size: one 64 KiB name indexed a million times would be 64 GiB.
const MAX_SYMBOL_RATIO: u64 = 1024;
const FREE_SYMBOLS: u64 = 64 << 20;
/// Distinct notes kept, and the longest kept whole: a recording writes a
/// few per process it saw, each a line.
const MAX_NOTES: usize = 256;
const MAX_NOTE_LEN: usize = 4 << 10;

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
    /// The recorded processes that are ranks of a job, by pid.
    pub process_ranks: HashMap<u32, super::Rank>,
    pub nvml: Vec<NvmlSample>,
    pub nvml_devices: Vec<NvmlDevice>,
    pub host_ops: Vec<HostOp>,
    /// Readings of the machine's idle CPU time, in order (absent in
    /// imported traces and sessions before format 4).
    pub cpu_idle: Vec<super::CpuIdle>,
    /// Readings of what unrecorded tasks ran, in order (absent in imported
    /// traces and sessions before format 8).
    pub neighbours: Vec<super::Neighbours>,
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
        None => Err(reader.refusal().unwrap_or(SessionError::Empty { path })),
    }
}

/// Reads a session file (or the session in a run directory).
pub fn read_session(path: &Path) -> Result<Session, SessionError> {
    let mut events = Vec::new();
    let (mut s, _) = read_records(&path.into(), |e| events.push(e), None)?;
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
    stored: Stored,
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
    stored: Stored,
    mut gpu: impl FnMut(u32, GpuRecord),
    mut event: impl FnMut(&Event),
) -> Result<Outline, SessionError> {
    let mut latest = 0u64;
    let mut lateness = 0u64;
    let mut cuda_calls = false;
    let (mut s, records) = read_records(
        &stored,
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
            stored,
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
    /// The file is read, decoded and put in order on a thread of its own,
    /// a few thousand events ahead.
    pub fn replay(&self, mut each: impl FnMut(Event)) -> Result<usize, SessionError> {
        /// Events handed over at once, and batches waiting.
        const BATCH: usize = 4096;
        const AHEAD: usize = 4;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Event>>(AHEAD);
        let (stored, records, lateness, window) = (
            self.stored.clone(),
            self.records,
            self.lateness,
            self.window,
        );
        let order = move || -> Result<usize, SessionError> {
            let reader = stored.records_here()?;
            let mut held = Holdback::default();
            let mut latest = 0u64;
            let mut dropped = 0usize;
            let mut batch = Vec::with_capacity(BATCH);
            let hand = |batch: &mut Vec<Event>| {
                let full = std::mem::replace(batch, Vec::with_capacity(BATCH));
                // The reader went away: stop reading.
                tx.send(full).is_ok()
            };
            for record in reader.take(records as usize) {
                let Record::Event(e) = record else {
                    continue;
                };
                let ts = e.ts();
                latest = latest.max(ts);
                if !event_within(window, &e) {
                    dropped += 1;
                    continue;
                }
                held.push(ts, e);
                // No event still to come can be earlier than this: the
                // first pass measured how late any of them came.
                let ready = latest.saturating_sub(lateness);
                while let Some(e) = held.pop_before(ready) {
                    batch.push(e);
                    if batch.len() == BATCH && !hand(&mut batch) {
                        return Ok(dropped);
                    }
                }
            }
            while let Some(e) = held.pop_before(u64::MAX) {
                batch.push(e);
            }
            hand(&mut batch);
            Ok(dropped)
        };
        let worker = std::thread::Builder::new()
            .name("gapscope-order".into())
            .spawn(order);
        let dropped = match worker {
            Ok(worker) => {
                for batch in rx {
                    batch.into_iter().for_each(&mut each);
                }
                // It does not panic by design; if it did, what came stands.
                worker.join().unwrap_or(Ok(0))?
            }
            Err(e) => {
                return Err(SessionError::Io {
                    path: self.stored.path(),
                    source: e,
                })
            }
        };
        Ok(self.dropped + dropped)
    }
}

/// Reads every record, grouped by type, handing the events to `event` and
/// the GPU records to `gpu` when given; also returns how many records it
/// read.
fn read_records(
    stored: &Stored,
    mut event: impl FnMut(Event),
    mut gpu: Option<&mut dyn FnMut(u32, GpuRecord)>,
) -> Result<(Session, u64), SessionError> {
    let path = stored.path();
    let mut reader = stored.records()?;
    let mut s = Session::default();
    let mut first = true;
    let mut records = 0u64;
    let mut notes = Notes::default();
    let mut symbol_bytes = 0u64;
    while let Some(record) = reader.next() {
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
                let limit = reader
                    .bytes_read()
                    .saturating_mul(MAX_SYMBOL_RATIO)
                    .saturating_add(FREE_SYMBOLS);
                for (hash, idx) in sym.stacks {
                    let frames: Vec<Frame> = idx
                        .iter()
                        .filter_map(|&i| sym.frames.get(i as usize))
                        .take_while(|f| {
                            symbol_bytes += frame_bytes(f);
                            symbol_bytes <= limit
                        })
                        .cloned()
                        .collect();
                    if symbol_bytes > limit {
                        return Err(refused(
                            path,
                            format!(
                                "refused: its symbols would expand to more than {limit} \
                                 bytes ({MAX_SYMBOL_RATIO} times the {} bytes read, plus {} \
                                 MiB): not a recording",
                                reader.bytes_read(),
                                FREE_SYMBOLS >> 20
                            ),
                        ));
                    }
                    s.symbols.insert(hash, frames);
                }
            }
            Record::Note(n) => notes.add(&mut s.notes, n),
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
            Record::ProcessRank { pid, rank } => {
                s.process_ranks.insert(pid, rank);
            }
            Record::CpuIdle(c) => s.cpu_idle.push(c),
            Record::Neighbours(n) => s.neighbours.push(n),
        }
    }
    if let Some(e) = reader.take_refusal() {
        return Err(e);
    }
    if first {
        return Err(SessionError::Empty { path });
    }
    notes.finish(&mut s.notes);
    s.truncated = reader.truncated().map(str::to_string);
    Ok((s, records))
}

/// A file refused by a cap, as the one-line error its reader returns (the
/// session error that carries a reason).
/// What a copy of `f` holds.
fn frame_bytes(f: &Frame) -> u64 {
    (std::mem::size_of::<Frame>() + f.function.len() + f.module.len()) as u64
}

/// A session's notes as read: each once, at most [`MAX_NOTES`] of them,
/// each cut to [`MAX_NOTE_LEN`].
#[derive(Default)]
struct Notes {
    seen: std::collections::HashSet<String>,
    left_out: u64,
}

impl Notes {
    fn add(&mut self, notes: &mut Vec<String>, mut n: String) {
        if n.len() > MAX_NOTE_LEN {
            let mut end = MAX_NOTE_LEN;
            while !n.is_char_boundary(end) {
                end -= 1;
            }
            n.truncate(end);
            n.push('…');
        }
        if self.seen.contains(&n) {
            return;
        }
        if notes.len() >= MAX_NOTES {
            self.left_out += 1;
            return;
        }
        self.seen.insert(n.clone());
        notes.push(n);
    }

    fn finish(self, notes: &mut Vec<String>) {
        if self.left_out > 0 {
            notes.push(format!(
                "{} further notes left out (only {MAX_NOTES} different ones are kept)",
                self.left_out
            ));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::super::reader::*;
    use super::super::FILE_HEADER_LEN;
    use super::*;
    use crate::session::{wrap_records, SessionWriter, Symbols};

    fn header() -> Record {
        Record::Header(crate::session::tests::header())
    }

    fn encode(records: &[Record]) -> Vec<u8> {
        let mut raw = Vec::new();
        for r in records {
            postcard::to_io(r, &mut raw).unwrap();
        }
        raw
    }

    /// A chunk as the writer frames one.
    fn chunk(raw: &[u8]) -> Vec<u8> {
        // wrap_records frames a whole file; its chunk follows the header.
        wrap_records(raw)[FILE_HEADER_LEN..].to_vec()
    }

    fn refusal_of(path: &Path) -> String {
        match read_session(path) {
            Err(SessionError::Io { source, .. }) => source.to_string(),
            Err(e) => panic!("not refused: {e}"),
            Ok(s) => panic!("not refused: read {} notes", s.notes.len()),
        }
    }

    #[test]
    fn an_empty_note_bomb_is_refused_before_it_is_unpacked() {
        // An empty note is two bytes (variant 9, length 0); 32 Mi of them
        // compress to a few KB and would be 2.6 GB as strings.
        assert_eq!(encode(&[Record::Note(String::new())]), [9, 0]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bomb.gsz");
        let mut w = SessionWriter::create(&path).unwrap();
        w.push(&header()).unwrap();
        w.finish().unwrap();
        let header_end = std::fs::metadata(&path).unwrap().len();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend(chunk(&[9u8, 0].repeat(32 << 20)));
        std::fs::write(&path, &bytes).unwrap();
        assert!(bytes.len() < 16 << 10);

        let mut reader = SessionReader::open(&path).unwrap();
        assert!(matches!(reader.next(), Some(Record::Header(_))));
        assert!(reader.next().is_none());
        assert!(reader.refused().unwrap().contains("decompression bomb"));
        // The bomb's chunk was never taken in.
        assert_eq!(reader.bytes_read(), header_end);

        let why = refusal_of(&path);
        assert!(why.starts_with("refused: "), "{why}");
        assert!(!why.contains('\n'), "{why}");
        // Refused as the first chunk, too, where only the header is read.
        bytes.truncate(FILE_HEADER_LEN);
        bytes.extend(chunk(
            &[encode(&[header()]), [9u8, 0].repeat(30 << 20)].concat(),
        ));
        std::fs::write(&path, &bytes).unwrap();
        let err = check(&path).unwrap_err().to_string();
        assert!(err.contains("refused"), "{err}");
    }

    #[test]
    fn many_small_chunks_count_against_one_budget() {
        // Each chunk alone is small (1 MiB of notes in ~100 bytes); the file
        // as a whole is the bomb.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bomb.gsz");
        let mut w = SessionWriter::create(&path).unwrap();
        w.push(&header()).unwrap();
        w.finish().unwrap();
        let bomb = chunk(&[9u8, 0].repeat(1 << 19));
        let mut bytes = std::fs::read(&path).unwrap();
        for _ in 0..64 {
            bytes.extend_from_slice(&bomb);
        }
        std::fs::write(&path, &bytes).unwrap();
        assert!(bytes.len() < 64 << 10);
        assert!(refusal_of(&path).contains("decompression bomb"));
        // Before the budget ran out, a stream reader got the header and
        // the first chunks' notes.
        let reader = SessionReader::open(&path).unwrap();
        assert!(reader.count() > 1);
    }

    #[test]
    fn notes_are_kept_once_each_and_only_so_many() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.gsz");
        let mut w = SessionWriter::create(&path).unwrap();
        w.push(&header()).unwrap();
        for i in 0..1000 {
            w.push(&Record::Note("the same thing again".into()))
                .unwrap();
            w.push(&Record::Note(format!("note {i}"))).unwrap();
        }
        w.push(&Record::Note("é".repeat(1 << 20))).unwrap();
        w.finish().unwrap();
        let s = read_session(&path).unwrap();
        assert_eq!(s.notes.len(), MAX_NOTES + 1);
        assert_eq!(s.notes[0], "the same thing again");
        assert_eq!(
            s.notes
                .iter()
                .filter(|n| *n == "the same thing again")
                .count(),
            1
        );
        assert!(
            s.notes[MAX_NOTES].contains("left out"),
            "{:?}",
            s.notes.last()
        );

        // A long note is cut on a character boundary.
        let mut w = SessionWriter::create(&path).unwrap();
        w.push(&header()).unwrap();
        w.push(&Record::Note("é".repeat(1 << 20))).unwrap();
        w.finish().unwrap();
        let s = read_session(&path).unwrap();
        assert!(s.notes[0].len() <= MAX_NOTE_LEN + '…'.len_utf8());
        assert!(s.notes[0].starts_with("éé") && s.notes[0].ends_with('…'));
    }

    #[test]
    fn symbols_that_copy_one_frame_endlessly_are_refused() {
        // One 60 KB name indexed 100 000 times: 6 GB of copies from a
        // record of 160 KB.
        let sym = Symbols {
            frames: vec![Frame {
                function: "f".repeat(60_000),
                module: String::new(),
            }],
            stacks: vec![(1, vec![0; 100_000])],
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("symbols.gsz");
        std::fs::write(
            &path,
            wrap_records(&encode(&[header(), Record::Symbols(sym)])),
        )
        .unwrap();
        assert!(refusal_of(&path).contains("symbols would expand"));
    }

    #[test]
    fn events_replay_in_the_order_a_whole_read_sorts_them() {
        // Runs in order, events a few places late, one far late, and equal
        // times (which keep their file order): the stream's queue and heap
        // together hand them out as a stable sort does.
        let times: Vec<u64> = (0..5000u64)
            .map(|i| match i % 97 {
                0 => i * 10 - 900.min(i * 10),
                13 => i * 10 - 35.min(i * 10),
                _ => i * 10 - i % 3 * 10,
            })
            .chain([3, 0, 49_000, 49_000])
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("late.gsz");
        let mut w = SessionWriter::create(&path).unwrap();
        w.push(&header()).unwrap();
        for (i, &ts) in times.iter().enumerate() {
            w.push(&Record::Event(Event::Wakeup {
                ts,
                pid: 1,
                tid: i as u32,
                waker_pid: 0,
                waker_tid: 0,
                new_task: false,
            }))
            .unwrap();
        }
        w.finish().unwrap();
        let whole = read_session(&path).unwrap().events;
        let outline = read_outline(Stored::File(path), |_, _| {}, |_| {}).unwrap();
        let mut streamed = Vec::new();
        assert_eq!(outline.events.replay(|e| streamed.push(e)).unwrap(), 0);
        let key = |e: &Event| match e {
            Event::Wakeup { ts, tid, .. } => (*ts, *tid),
            _ => unreachable!(),
        };
        assert_eq!(whole.len(), times.len());
        assert!(whole.windows(2).all(|w| key(&w[0]) < key(&w[1])));
        assert_eq!(
            streamed.iter().map(key).collect::<Vec<_>>(),
            whole.iter().map(key).collect::<Vec<_>>()
        );
    }

    #[test]
    fn recordings_stay_well_inside_the_budgets() {
        // The golden recording (a real simtrain run) unpacks 5.0 times and
        // reads with all its notes and symbols.
        let golden =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/simtrain-mixed.gsz");
        let mut reader = SessionReader::open(&golden).unwrap();
        let records = reader.by_ref().count();
        assert!(records > 0 && reader.refused().is_none());
        let size = std::fs::metadata(&golden).unwrap().len();
        assert!(
            reader.unpacked < size * 6,
            "{} from {size}",
            reader.unpacked
        );
        let s = read_session(&golden).unwrap();
        let expanded: u64 = s.symbols.values().flatten().map(frame_bytes).sum();
        assert!(
            expanded < size * MAX_SYMBOL_RATIO / 8,
            "{expanded} from {size}"
        );
        assert!(s.notes.len() < MAX_NOTES / 8);
    }
}
