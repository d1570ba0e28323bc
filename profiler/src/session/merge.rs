//! Back-to-back windows of one recording (the agent's flight recorder)
//! written out as one session, as if recorded in one go: one header (the
//! first window's) and one end (the last's); processes and threads seeded
//! once, then followed by their events; what every window repeats to stand
//! alone (GPU sources, devices, notes) once; GPU work that ran across a cut,
//! which both windows hold, once; counts that each window keeps from zero
//! (lost events, GPU record losses, gapscope's own cost) added up.
//!
//! Streamed: a window at a time, holding only what spans a cut.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::{CollectorCost, Drops, Footer, Record, SessionError, SessionReader, SessionWriter};

/// What a merge made.
#[derive(Debug, Default)]
pub struct Merged {
    pub windows: usize,
    pub records: u64,
    /// GPU-side records held by two windows, written once.
    pub shared: u64,
}

/// Writes `windows` (session files or run directories of one recording,
/// in time order: one of [`recordings`]) as one session at `out`.
pub fn merge(windows: &[PathBuf], out: &Path) -> Result<Merged, SessionError> {
    let mut records = Merging::open(windows)?;
    let mut writer = SessionWriter::create(out)?;
    for r in records.by_ref() {
        writer.push(&r)?;
    }
    if let Some(e) = records.take_refusal() {
        return Err(e);
    }
    writer.finish()?;
    Ok(records.m.out)
}

/// `windows` (in time order) divided into recordings: each the windows
/// that follow one another without a break, each beginning where the one
/// before ended (a window's end is read from its last chunk alone). A
/// window with no header yet (one just opened) ends the list; one with no
/// end (being written, or cut off by a crash) ends its recording.
pub fn recordings(windows: &[PathBuf]) -> Vec<Vec<PathBuf>> {
    let mut out: Vec<Vec<PathBuf>> = Vec::new();
    let mut last_end: Option<u64> = None;
    for w in windows {
        let path = super::resolve_path(w);
        let Some(start) = start_of(&path) else {
            break;
        };
        match out.last_mut() {
            Some(run) if last_end == Some(start) => run.push(w.clone()),
            _ => out.push(vec![w.clone()]),
        }
        last_end = SessionReader::footer(&path).map(|f| f.end_ns);
    }
    out
}

/// Where a window begins, by its header.
fn start_of(path: &Path) -> Option<u64> {
    match SessionReader::open(path).ok()?.next() {
        Some(Record::Header(h)) => Some(h.start_ns),
        _ => None,
    }
}

/// The records of the windows of one recording, merged as they are read:
/// what [`merge`] writes, and what a report of the windows reads (twice,
/// one window at a time, with no copy on disk).
pub struct Merging {
    windows: Vec<PathBuf>,
    starts: Vec<u64>,
    /// The window being read: its index and its reader.
    reading: Option<(usize, super::reader::Background)>,
    next: usize,
    m: Merger,
    /// The end of the window read last (only the last window's is the
    /// merged session's: one still being written has none yet).
    last_end: Option<Footer>,
    /// What follows the last window's records: the costs added up, then
    /// the end (last first).
    tail: Option<Vec<Record>>,
    /// Bytes of the windows read to their end.
    bytes_before: u64,
    truncated: Option<String>,
    refusal: Option<SessionError>,
}

impl Merging {
    /// Fails when the first window has no header.
    pub fn open(windows: &[PathBuf]) -> Result<Merging, SessionError> {
        let windows: Vec<PathBuf> = windows.iter().map(|w| super::resolve_path(w)).collect();
        let starts: Vec<u64> = windows.iter().map_while(|p| start_of(p)).collect();
        if starts.is_empty() {
            let path = windows.first().cloned().unwrap_or_default();
            return Err(SessionError::NoHeader { path });
        }
        Ok(Merging {
            windows,
            starts,
            reading: None,
            next: 0,
            m: Merger::default(),
            last_end: None,
            tail: None,
            bytes_before: 0,
            truncated: None,
            refusal: None,
        })
    }

    /// Bytes of the windows read so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_before + self.reading.as_ref().map_or(0, |(_, r)| r.bytes_read())
    }

    /// Why the stream ended early, if it did: the first window that did,
    /// and why.
    pub fn truncated(&self) -> Option<&str> {
        self.truncated.as_deref()
    }

    /// The cap a window broke, once the stream has ended (see
    /// [`SessionReader::refused`]).
    pub fn take_refusal(&mut self) -> Option<SessionError> {
        self.refusal.take()
    }

    /// The window `i` read to its end: what it says of how it ended, and
    /// its counts carried into the next.
    fn window_read(&mut self, i: usize, reader: super::reader::Background) {
        self.bytes_before += reader.bytes_read();
        if let Some(e) = reader.refusal() {
            self.refusal = Some(e);
            self.next = self.starts.len();
        }
        // Only the last window may be cut off (by a crash, or being
        // written); one before it that is lost its tail.
        if let Some(why) = reader.truncated() {
            self.truncated
                .get_or_insert_with(|| format!("{}: {why}", self.windows[i].display()));
        }
        self.m.events += self.last_end.as_ref().map_or(0, |f| f.events);
        self.m.next_window();
        self.m.out.windows += 1;
    }
}

impl Iterator for Merging {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some((i, reader)) = self.reading.as_mut() {
                let i = *i;
                let since = i.checked_sub(1).map(|_| self.starts[i]);
                let cut = self.starts.get(i + 1).copied();
                match reader.next() {
                    // A window's end may be written twice (at its cut, and
                    // once its late GPU records are in): the last stands.
                    Some(Record::End(f)) => self.last_end = Some(f),
                    Some(record) => {
                        if let Some(r) = self.m.take(record, since, cut) {
                            self.m.out.records += 1;
                            return Some(r);
                        }
                    }
                    None => {
                        let (i, reader) = self.reading.take().expect("reading");
                        self.window_read(i, reader);
                    }
                }
                continue;
            }
            if self.next < self.starts.len() {
                let i = self.next;
                self.next += 1;
                self.last_end = None;
                match SessionReader::open(&self.windows[i]) {
                    Ok(r) => self.reading = Some((i, r.in_background())),
                    // Gone since it was looked at: what came before stands.
                    Err(e) => {
                        self.truncated.get_or_insert_with(|| e.to_string());
                        self.next = self.starts.len();
                    }
                }
                continue;
            }
            let tail = self.tail.get_or_insert_with(|| {
                let mut tail: Vec<Record> = self
                    .last_end
                    .take()
                    .map(|mut f| {
                        f.events = self.m.events;
                        Record::End(f)
                    })
                    .into_iter()
                    .collect();
                tail.push(Record::Cost(self.m.cost));
                tail
            });
            return tail.pop();
        }
    }
}

/// The windows in `job_dir` (the agent's `<workload>-<pid>/` folder: one
/// run directory per window, named by the unix ms it began at), in time
/// order.
pub fn windows_in(job_dir: &Path) -> Vec<PathBuf> {
    let mut windows: Vec<(u64, u64, PathBuf)> = std::fs::read_dir(job_dir)
        .into_iter()
        .flatten()
        .flatten()
        // Folders only, never a link to one: every window is a folder the
        // recorder made (a link planted beside them is not one of them).
        .filter(|w| w.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|w| w.path().join(super::FILE_NAME).is_file())
        .filter_map(|w| {
            let n = w.file_name().to_string_lossy().into_owned();
            let (ms, k) = n.split_once('-').unwrap_or((&n, "0"));
            Some((ms.parse().ok()?, k.parse().ok()?, w.path()))
        })
        .collect();
    windows.sort();
    windows.into_iter().map(|w| w.2).collect()
}

#[derive(Default)]
struct Merger {
    out: Merged,
    events: u64,
    cost: CollectorCost,
    /// Lost events of the windows before this one, by kind, and malformed.
    drops_before: BTreeMap<String, u64>,
    malformed_before: u64,
    /// This window's last reading (its counts from zero).
    drops_last: Option<Drops>,
    gpu_drops_before: HashMap<u32, (u64, u64)>,
    gpu_drops_last: HashMap<u32, (u64, u64)>,
    /// Said once: sources, NVML devices, injections by pid or index; GPU
    /// devices by (pid, id, whether it is the UUID); notes; processes as
    /// last described.
    sources: HashSet<u32>,
    nvml: HashSet<u32>,
    injected: HashSet<u32>,
    devices: HashSet<(u32, u32, bool)>,
    notes: HashSet<String>,
    processes: HashMap<u32, super::ProcessInfo>,
    /// Threads whose reading from before the recording is written.
    io_started: HashSet<(u32, u32)>,
    /// GPU-side records of this window that run past its cut (the next
    /// window holds them too), and those of the window before.
    spanning: HashSet<Vec<u8>>,
    spanned: HashSet<Vec<u8>>,
}

impl Merger {
    /// `record` as the merged session has it, if at all. `since`: where
    /// this window begins, when one came before; `cut`: where it ends, when
    /// another follows.
    fn take(&mut self, record: Record, since: Option<u64>, cut: Option<u64>) -> Option<Record> {
        let cuts = (since, cut);
        match record {
            Record::Header(_) | Record::Thread(_) if since.is_some() => None,
            Record::Cost(c) => {
                self.cost.cpu_ns += c.cpu_ns;
                self.cost.peak_rss_bytes = self.cost.peak_rss_bytes.max(c.peak_rss_bytes);
                None
            }
            Record::Drops(mut d) => {
                self.drops_last = Some(d.clone());
                for (kind, n) in &mut d.cpu_by_kind {
                    *n += self.drops_before.get(kind).copied().unwrap_or(0);
                }
                for (kind, &n) in &self.drops_before {
                    if !d.cpu_by_kind.iter().any(|(k, _)| k == kind) {
                        d.cpu_by_kind.push((kind.clone(), n));
                    }
                }
                d.cpu_malformed += self.malformed_before;
                Some(Record::Drops(d))
            }
            Record::GpuDrops { pid, cupti, shim } => {
                self.gpu_drops_last.insert(pid, (cupti, shim));
                let (c, s) = self.gpu_drops_before.get(&pid).copied().unwrap_or_default();
                Some(Record::GpuDrops {
                    pid,
                    cupti: cupti + c,
                    shim: shim + s,
                })
            }
            Record::GpuSource(ref s) => self.sources.insert(s.pid).then_some(record),
            Record::NvmlDevice(ref d) => self.nvml.insert(d.index).then_some(record),
            Record::ShimInjected(ref i) => self.injected.insert(i.pid).then_some(record),
            Record::Note(ref n) => self.notes.insert(n.clone()).then_some(record),
            Record::Process(ref p) => {
                if self.processes.get(&p.pid) == Some(p) {
                    return None;
                }
                self.processes.insert(p.pid, p.clone());
                Some(record)
            }
            Record::ThreadIo(ref t) if t.start => {
                self.io_started.insert((t.pid, t.tid)).then_some(record)
            }
            Record::Gpu(mut b) => {
                let pid = b.pid;
                b.records.retain(|r| match r {
                    gapscope_wire::GpuRecord::Device { id, .. } => {
                        self.devices.insert((pid, *id, false))
                    }
                    gapscope_wire::GpuRecord::DeviceUuid { id, .. } => {
                        self.devices.insert((pid, *id, true))
                    }
                    _ => {
                        let span = r.span();
                        let key = || postcard::to_allocvec(&(pid, r)).unwrap_or_default();
                        self.once(span, cuts, key)
                    }
                });
                (!b.records.is_empty()).then_some(Record::Gpu(b))
            }
            Record::GpuBlind(ref x) => {
                let span = Some((x.start, x.end));
                self.once(span, cuts, || {
                    postcard::to_allocvec(&record).unwrap_or_default()
                })
                .then_some(record)
            }
            Record::GpuLost(ref x) => {
                let span = Some((x.start, x.end));
                self.once(span, cuts, || {
                    postcard::to_allocvec(&record).unwrap_or_default()
                })
                .then_some(record)
            }
            other => Some(other),
        }
    }

    /// Whether a GPU-side record over `span` is new: one the window before
    /// held too (it ran across the cut this window began at) is not.
    /// Remembers those that run past this window's own cut.
    fn once(
        &mut self,
        span: Option<(u64, u64)>,
        (since, cut): (Option<u64>, Option<u64>),
        key: impl Fn() -> Vec<u8>,
    ) -> bool {
        let Some((start, end)) = span else {
            return true;
        };
        if since.is_some_and(|t| start < t) && self.spanned.contains(&key()) {
            self.out.shared += 1;
            return false;
        }
        if cut.is_some_and(|t| start < t && end > t) {
            self.spanning.insert(key());
        }
        true
    }

    fn next_window(&mut self) {
        if let Some(d) = self.drops_last.take() {
            for (kind, n) in d.cpu_by_kind {
                *self.drops_before.entry(kind).or_default() += n;
            }
            self.malformed_before += d.cpu_malformed;
        }
        for (pid, (c, s)) in self.gpu_drops_last.drain() {
            let before = self.gpu_drops_before.entry(pid).or_default();
            before.0 += c;
            before.1 += s;
        }
        self.spanned = std::mem::take(&mut self.spanning);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::test_kernel as kernel;
    use crate::session::{
        read_session, FdKind, Footer, GpuBatch, GpuSource, IoCounters, Mode, ProcessInfo,
        SessionHeader, SourceKind, StopReason, ThreadIo, ThreadSeed,
    };
    use gapscope_wire::GpuRecord;

    /// One window as a recording cut into windows writes it: header, seeds,
    /// what it repeats to stand alone, its GPU work, its own counts, end.
    fn window(
        dir: &Path,
        start: u64,
        end: u64,
        kernels: &[(u64, u64)],
        switch_drops: u64,
        reason: StopReason,
    ) -> PathBuf {
        let path = dir.join(format!("{start}.gsz"));
        let mut w = SessionWriter::create(&path).unwrap();
        let mut header = SessionHeader::for_test(Mode::Window, 2);
        header.start_ns = start;
        let mut records = vec![
            Record::Header(header),
            Record::Process(ProcessInfo {
                pid: 1,
                ppid: 0,
                comm: "train".into(),
                argv: vec!["train".into()],
            }),
            Record::Thread(ThreadSeed {
                pid: 1,
                tid: 1,
                comm: "train".into(),
                state: 'S',
                syscall: None,
                fd_kind: FdKind::None,
            }),
            Record::ThreadIo(ThreadIo {
                pid: 1,
                tid: 1,
                ts: start,
                start: true,
                io: IoCounters::default(),
            }),
            Record::GpuSource(GpuSource {
                pid: 1,
                kind: SourceKind::Simulated,
                hello: gapscope_wire::Hello {
                    version: 1,
                    pid: 1,
                    driver_version: 0,
                    cupti_version: 0,
                    clock: gapscope_wire::ClockMethod::Native,
                    source: "simulated".into(),
                },
            }),
            Record::Note("how it was recorded".into()),
        ];
        let mut gpu = vec![GpuRecord::Device {
            id: 0,
            name: "GPU".into(),
        }];
        gpu.extend(kernels.iter().map(|&(s, e)| kernel(s, e)));
        records.push(Record::Gpu(GpuBatch {
            pid: 1,
            records: gpu,
        }));
        records.push(Record::Drops(Drops {
            ts: end,
            cpu_by_kind: vec![("switch".into(), switch_drops)],
            cpu_malformed: 0,
            gpu_records: 0,
        }));
        records.push(Record::GpuDrops {
            pid: 1,
            cupti: 1,
            shim: 0,
        });
        records.push(Record::Cost(CollectorCost {
            cpu_ns: 5,
            peak_rss_bytes: start + 10,
        }));
        // Its end at its cut, late GPU work, and its end again (as a
        // recording cut into windows writes it).
        let footer = Record::End(Footer {
            end_ns: end,
            reason,
            exit_code: None,
            events: 3,
        });
        records.insert(records.len() - 3, footer.clone());
        records.push(footer);
        for r in &records {
            w.push(r).unwrap();
        }
        w.finish().unwrap();
        path
    }

    /// Two windows of one recording (a kernel running across the cut in
    /// both) and a third of another: the first two make one session, as if
    /// recorded in one go.
    #[test]
    fn windows_of_one_recording_read_as_one_session() {
        let dir = tempfile::tempdir().unwrap();
        let a = window(
            dir.path(),
            0,
            100,
            &[(10, 20), (90, 110)],
            2,
            StopReason::Duration,
        );
        let b = window(
            dir.path(),
            100,
            200,
            &[(90, 110), (150, 160)],
            1,
            StopReason::TargetExited,
        );
        let c = window(dir.path(), 300, 400, &[], 0, StopReason::Duration);
        let out = dir.path().join("merged.gsz");
        let runs = recordings(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(runs, [vec![a, b], vec![c.clone()]]);
        let m = merge(&runs[0], &out).unwrap();
        assert_eq!((m.windows, m.shared), (2, 1));
        // Read as they are merged, the windows are the merged file.
        let written: Vec<String> = SessionReader::open(&out)
            .unwrap()
            .map(|r| format!("{r:?}"))
            .collect();
        let streamed: Vec<String> = Merging::open(&runs[0])
            .unwrap()
            .map(|r| format!("{r:?}"))
            .collect();
        assert_eq!(streamed, written);
        let s = read_session(&out).unwrap();
        assert_eq!(s.header().start_ns, 0);
        let f = s.footer.as_ref().unwrap();
        assert_eq!(
            (f.end_ns, f.reason, f.events),
            (200, StopReason::TargetExited, 6)
        );
        assert_eq!(s.threads.len(), 1);
        assert_eq!(s.processes.len(), 1);
        assert_eq!(s.gpu_sources.len(), 1);
        assert_eq!(
            s.notes
                .iter()
                .filter(|n| *n == "how it was recorded")
                .count(),
            1
        );
        assert_eq!(s.thread_io.iter().filter(|t| t.start).count(), 1);
        let spans: Vec<(u64, u64)> = s.gpu.iter().filter_map(|(_, r)| r.span()).collect();
        assert_eq!(spans, [(10, 20), (90, 110), (150, 160)]);
        assert_eq!(s.gpu.len(), 4, "one device description");
        assert_eq!(s.drops.cpu_by_kind, [("switch".to_string(), 3)]);
        assert_eq!(s.gpu_drops[&1], (2, 0));
        let cost = s.collector.unwrap();
        assert_eq!((cost.cpu_ns, cost.peak_rss_bytes), (10, 110));
        // The other recording's window on its own.
        let m = merge(&[c], &dir.path().join("other.gsz")).unwrap();
        assert_eq!(m.windows, 1);
    }

    /// A window cut off by a crash has no end: the next window, if any,
    /// begins another recording, and the window itself still reads.
    #[test]
    fn a_window_without_its_end_ends_its_recording() {
        let dir = tempfile::tempdir().unwrap();
        let a = window(dir.path(), 0, 100, &[(10, 20)], 0, StopReason::Duration);
        let whole = window(dir.path(), 100, 200, &[(150, 160)], 0, StopReason::Duration);
        let c = window(dir.path(), 200, 300, &[], 0, StopReason::Duration);
        // Written as a recording writes it, a chunk at every flush, and
        // killed before its cut: no end, the last chunk torn.
        let b = dir.path().join("b.gsz");
        let mut w = SessionWriter::create(&b).unwrap();
        for r in SessionReader::open(&whole).unwrap() {
            if !matches!(r, Record::End(_)) {
                w.push(&r).unwrap();
                w.flush().unwrap();
            }
        }
        w.finish().unwrap();
        assert!(SessionReader::footer(&whole).is_some_and(|f| f.end_ns == 200));
        let bytes = std::fs::read(&b).unwrap();
        std::fs::write(&b, &bytes[..bytes.len() - 3]).unwrap();
        assert!(SessionReader::footer(&b).is_none());
        let runs = recordings(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(runs, [vec![a.clone(), b.clone()], vec![c]]);
        // Its recording still reads as one, to where the tear is.
        let merged: Vec<Record> = Merging::open(&runs[0]).unwrap().collect();
        assert!(matches!(merged.first(), Some(Record::Header(h)) if h.start_ns == 0));
        assert!(!merged.iter().any(|r| matches!(r, Record::End(_))));
        // A window with no header yet ends the list.
        let d = dir.path().join("empty.gsz");
        SessionWriter::create(&d).unwrap().finish().unwrap();
        assert_eq!(recordings(&[d, a.clone()]), Vec::<Vec<PathBuf>>::new());
    }

    /// The windows of a folder are its run directories named by time, in
    /// time order; a link to a folder elsewhere, planted beside them, is
    /// not one of them.
    #[test]
    fn windows_are_the_folders_made_not_links() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        for (name, at) in [
            ("200", dir.path()),
            ("100", dir.path()),
            ("150", elsewhere.path()),
        ] {
            let run = at.join(name);
            std::fs::create_dir(&run).unwrap();
            SessionWriter::create(&run.join(crate::session::FILE_NAME))
                .unwrap()
                .finish()
                .unwrap();
        }
        std::os::unix::fs::symlink(elsewhere.path().join("150"), dir.path().join("150")).unwrap();
        assert_eq!(
            windows_in(dir.path()),
            [dir.path().join("100"), dir.path().join("200")]
        );
    }
}
