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

use super::{CollectorCost, Drops, Record, SessionError, SessionReader, SessionWriter};

/// What a merge made.
#[derive(Debug, Default)]
pub struct Merged {
    pub windows: usize,
    pub records: u64,
    /// GPU-side records held by two windows, written once.
    pub shared: u64,
}

/// Writes `windows` (session files or run directories, in time order) as
/// one session at `out`: the first of them and those that follow it
/// without a break (each beginning where the one before ended — one
/// recording's). Returns how many that was; the caller merges the rest
/// (another recording of the same job) elsewhere. A window not begun yet
/// (no header) ends the run.
pub fn merge(windows: &[PathBuf], out: &Path) -> Result<Merged, SessionError> {
    let paths: Vec<PathBuf> = windows.iter().map(|w| super::resolve_path(w)).collect();
    let mut starts = Vec::with_capacity(paths.len());
    for p in &paths {
        match SessionReader::open(p).ok().and_then(|mut r| r.next()) {
            Some(Record::Header(h)) => starts.push(h.start_ns),
            _ => break,
        }
    }
    if starts.is_empty() {
        let path = paths.first().cloned().unwrap_or_default();
        return Err(SessionError::NoHeader { path });
    }
    let mut m = Merger::default();
    let mut writer = SessionWriter::create(out)?;
    let mut last_end = None;
    for (i, p) in paths.iter().enumerate().take(starts.len()) {
        let since = i.checked_sub(1).map(|_| starts[i]);
        let next = starts.get(i + 1).copied();
        // Only the last window's end is the merged session's: one still
        // being written has none yet.
        last_end = None;
        let mut reader = SessionReader::open(p)?;
        for record in reader.by_ref() {
            if let Record::End(f) = record {
                m.events += f.events;
                last_end = Some(f);
                continue;
            }
            if let Some(r) = m.take(record, since, next) {
                writer.push(&r)?;
                m.out.records += 1;
            }
        }
        m.next_window();
        m.out.windows += 1;
        // The next window is another recording's (or this one has no end).
        if next.is_some() && last_end.as_ref().map(|f| f.end_ns) != next {
            break;
        }
    }
    writer.push(&Record::Cost(m.cost))?;
    if let Some(mut f) = last_end {
        f.events = m.events;
        writer.push(&Record::End(f))?;
    }
    writer.finish()?;
    Ok(m.out)
}

/// The windows in `job_dir` (the agent's `<workload>-<pid>/` folder: one
/// run directory per window, named by the unix ms it began at), in time
/// order.
pub fn windows_in(job_dir: &Path) -> Vec<PathBuf> {
    let mut windows: Vec<(u64, u64, PathBuf)> = std::fs::read_dir(job_dir)
        .into_iter()
        .flatten()
        .flatten()
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
        records.push(Record::End(Footer {
            end_ns: end,
            reason,
            exit_code: None,
            events: 3,
        }));
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
        let m = merge(&[a, b, c.clone()], &out).unwrap();
        assert_eq!((m.windows, m.shared), (2, 1));
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
}
