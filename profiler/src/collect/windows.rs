//! One recording cut into windows (the agent's): the BPF programs, the GPU
//! streams and the NVML sampler stay up for as long as the job is watched,
//! and every `every` the session being written is closed and the next one
//! opened, so nothing falls between two windows and nothing is loaded
//! twice. Each window is a session of its own (`Mode::Window`): it begins
//! with what a reader needs to stand alone — the processes and threads as
//! they are then, the GPU sources and devices already introduced, the
//! recording's notes — and its edges are not the job's start-up and
//! tear-down.
//!
//! GPU records come late: a shim flushes every 250 ms, and a kernel is
//! reported once it has ended. So a window closed to the kernel's events
//! stays open to GPU records for [`GRACE`]: each goes to the window(s) its
//! time falls in (one running across the cut, to both; the analysis clips
//! to the window).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gapscope_wire::GpuRecord;

use super::{RecordError, Recording};
use crate::output::OutDir;
use crate::session::{
    Footer, GpuBatch, Record, SessionError, SessionWriter, StopReason, FILE_NAME,
};

/// How long a closed window still takes GPU records that belong to it:
/// several shim flushes (250 ms each) and the socket between.
pub const GRACE: Duration = Duration::from_secs(2);

/// Cut the recording every `every`; each window but the last goes to
/// `done` once closed (the last is what `record` returns), as
/// `out_dir/<unix ms at its start>/session.gsz`.
#[derive(Clone, Debug)]
pub struct Windows {
    pub every: Duration,
    pub done: Sender<Result<Recording, RecordError>>,
    /// Set to stop at the next tick (the current window closes short).
    pub stop: Arc<AtomicBool>,
}

/// A recording being cut into windows: the folder they go in, and what
/// each begins with again.
pub struct Cutting {
    pub folder: Arc<OutDir>,
    pub sticky: Sticky,
}

impl Cutting {
    pub fn new(folder: Arc<OutDir>) -> Cutting {
        Cutting {
            folder,
            sticky: Sticky::default(),
        }
    }
}

/// What every window must begin with again: the GPU sources and the devices
/// they described, NVML's devices, the shims injected, and the notes so far.
#[derive(Default)]
pub struct Sticky {
    sources: BTreeMap<u32, Record>,
    /// By (pid, id, whether it is the UUID).
    devices: BTreeMap<(u32, u32, bool), GpuRecord>,
    nvml: BTreeMap<u32, Record>,
    injected: BTreeMap<u32, Record>,
    notes: Vec<String>,
}

/// Notes carried from window to window, at most (they say how the
/// recording was made; a recording that keeps adding them is saying the
/// same thing again).
const MAX_NOTES: usize = 64;

impl Sticky {
    /// Keeps what `record` says that later windows need.
    pub fn remember(&mut self, record: &Record) {
        match record {
            Record::GpuSource(s) => {
                self.sources.insert(s.pid, record.clone());
            }
            Record::Gpu(b) => {
                for r in &b.records {
                    let key = match r {
                        GpuRecord::Device { id, .. } => (b.pid, *id, false),
                        GpuRecord::DeviceUuid { id, .. } => (b.pid, *id, true),
                        _ => continue,
                    };
                    self.devices.insert(key, r.clone());
                }
            }
            Record::NvmlDevice(d) => {
                self.nvml.insert(d.index, record.clone());
            }
            Record::ShimInjected(i) => {
                self.injected.insert(i.pid, record.clone());
            }
            Record::Note(n) if self.notes.len() < MAX_NOTES && !self.notes.contains(n) => {
                self.notes.push(n.clone());
            }
            _ => {}
        }
    }

    /// The records a new window begins with (after its header and seeds),
    /// for the processes still alive; the others are let go.
    pub fn replay(&mut self, alive: impl Fn(u32) -> bool) -> Vec<Record> {
        self.sources.retain(|&pid, _| alive(pid));
        self.devices.retain(|&(pid, _, _), _| alive(pid));
        self.injected.retain(|&pid, _| alive(pid));
        let mut out: Vec<Record> = self.nvml.values().cloned().collect();
        out.extend(self.sources.values().cloned());
        let mut by_pid: BTreeMap<u32, Vec<GpuRecord>> = BTreeMap::new();
        for (&(pid, _, _), r) in &self.devices {
            by_pid.entry(pid).or_default().push(r.clone());
        }
        out.extend(
            by_pid
                .into_iter()
                .map(|(pid, records)| Record::Gpu(GpuBatch { pid, records })),
        );
        out.extend(self.injected.values().cloned());
        out.extend(self.notes.iter().cloned().map(Record::Note));
        out
    }
}

/// `record` (from the GPU side) divided at `t`: what belongs before it and
/// what after. A record covering `t` goes to both; one at no time (a
/// device description, a note, a source's hello, a cumulative count) after.
pub fn split_at(record: Record, t: u64) -> (Option<Record>, Option<Record>) {
    let by_span = |start: u64, end: u64, r: Record| -> (Option<Record>, Option<Record>) {
        match (start < t, end > t || start >= t) {
            (true, true) => (Some(r.clone()), Some(r)),
            (true, false) => (Some(r), None),
            _ => (None, Some(r)),
        }
    };
    match record {
        Record::Gpu(GpuBatch { pid, records }) => {
            let (mut before, mut after) = (Vec::new(), Vec::new());
            for r in records {
                match r.span() {
                    Some((s, e)) if s < t => {
                        if e > t {
                            after.push(r.clone());
                        }
                        before.push(r);
                    }
                    _ => after.push(r),
                }
            }
            let batch = |records: Vec<GpuRecord>| {
                (!records.is_empty()).then_some(Record::Gpu(GpuBatch { pid, records }))
            };
            (batch(before), batch(after))
        }
        Record::Nvml(ref s) => {
            let ts = s.ts;
            by_span(ts, ts, record)
        }
        Record::GpuLost(ref l) => {
            let (s, e) = (l.start, l.end);
            by_span(s, e, record)
        }
        Record::GpuBlind(ref b) => {
            let (s, e) = (b.start, b.end);
            by_span(s, e, record)
        }
        other => (None, Some(other)),
    }
}

/// A window closed to the kernel's events at `end_ns`, still taking the GPU
/// records that come for it until `until`.
///
/// Its end is written twice: at the cut, flushed with everything before it
/// (a recorder killed while the window takes its late records leaves it
/// whole but for them, and saying where it ended, so the next window is
/// still read as its continuation), and again last, once they are in.
pub struct Closing {
    writer: SessionWriter,
    pub end_ns: u64,
    pub until: Instant,
    events: u64,
    drops: u64,
    error: Option<SessionError>,
}

impl Closing {
    pub fn new(writer: SessionWriter, end_ns: u64, events: u64, drops: u64) -> Closing {
        let mut c = Closing {
            writer,
            end_ns,
            until: Instant::now() + GRACE,
            events,
            drops,
            error: None,
        };
        c.push(&c.footer());
        if let Err(e) = c.writer.flush() {
            c.error.get_or_insert(e);
        }
        c
    }

    fn footer(&self) -> Record {
        Record::End(Footer {
            end_ns: self.end_ns,
            reason: StopReason::Duration,
            exit_code: None,
            events: self.events,
        })
    }

    pub fn push(&mut self, record: &Record) {
        if self.error.is_none() {
            if let Err(e) = self.writer.push(record) {
                self.error = Some(e);
            }
        }
    }

    /// Ends the window's session and hands it over.
    pub fn close(mut self, done: &Sender<Result<Recording, RecordError>>) {
        self.push(&self.footer());
        let session = self.writer.path().to_path_buf();
        let dir = self.writer.dir().clone();
        let finished = match self.error.take() {
            Some(e) => Err(e),
            None => self.writer.finish(),
        };
        let _ = done.send(finished.map_err(RecordError::from).map(|()| Recording {
            session,
            dir,
            reason: StopReason::Duration,
            exit_code: None,
            events: self.events,
            drops: self.drops,
            target_left_running: false,
            windows: None,
        }));
    }
}

/// The session file of a new window in `folder`, named by the unix ms it
/// begins at.
pub fn create(folder: &OutDir) -> Result<SessionWriter, RecordError> {
    let ms = crate::clock::realtime_ns() / 1_000_000;
    let mut name = ms.to_string();
    // Two cuts within a millisecond (a very short window): never reuse one.
    let mut n = 1;
    while folder.subdir_existing(&name).is_ok() {
        name = format!("{ms}-{n}");
        n += 1;
    }
    let out = folder.subdir(&name).map_err(super::io_err(format!(
        "creating {}",
        folder.join(&name).display()
    )))?;
    Ok(SessionWriter::create_in(Arc::new(out), FILE_NAME)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{test_kernel as kernel, GpuBlind, GpuSource, SourceKind};

    fn spans(r: &Option<Record>) -> Vec<(u64, u64)> {
        match r {
            Some(Record::Gpu(b)) => b.records.iter().filter_map(|r| r.span()).collect(),
            None => Vec::new(),
            Some(other) => panic!("{other:?}"),
        }
    }

    /// A batch flushed after the cut holds work from both sides: each piece
    /// goes where it ran, the kernel running across the cut to both, the
    /// device description (no time) to the new window only.
    #[test]
    fn a_batch_is_divided_where_its_work_ran() {
        let batch = Record::Gpu(GpuBatch {
            pid: 9,
            records: vec![
                kernel(10, 20),
                kernel(90, 110),
                kernel(100, 120),
                GpuRecord::Device {
                    id: 0,
                    name: "GPU".into(),
                },
                kernel(130, 140),
            ],
        });
        let (before, after) = split_at(batch, 100);
        assert_eq!(spans(&before), [(10, 20), (90, 110)]);
        assert_eq!(spans(&after), [(90, 110), (100, 120), (130, 140)]);
        let Some(Record::Gpu(b)) = after else {
            unreachable!()
        };
        assert!(b.records.iter().any(|r| r.span().is_none()));
        // All on one side: no empty batch on the other.
        let (before, after) = split_at(
            Record::Gpu(GpuBatch {
                pid: 9,
                records: vec![kernel(10, 20)],
            }),
            100,
        );
        assert!(before.is_some() && after.is_none());
    }

    #[test]
    fn spans_and_points_go_where_they_fall() {
        let blind = |start, end| {
            Record::GpuBlind(GpuBlind {
                pid: 1,
                start,
                end,
                reason: String::new(),
            })
        };
        let (b, a) = split_at(blind(50, 150), 100);
        assert!(b.is_some() && a.is_some());
        let (b, a) = split_at(blind(50, 100), 100);
        assert!(b.is_some() && a.is_none());
        let (b, a) = split_at(blind(100, 100), 100);
        assert!(b.is_none() && a.is_some());
        let (b, a) = split_at(Record::Note("n".into()), 100);
        assert!(b.is_none() && a.is_some());
    }

    /// A new window begins with the sources and devices of the processes
    /// still alive, once each, and the notes so far.
    #[test]
    fn sticky_records_follow_the_living() {
        let mut s = Sticky::default();
        for pid in [1, 2] {
            s.remember(&Record::GpuSource(GpuSource {
                pid,
                kind: SourceKind::Simulated,
                hello: gapscope_wire::Hello {
                    version: 1,
                    pid,
                    driver_version: 0,
                    cupti_version: 0,
                    clock: gapscope_wire::ClockMethod::Native,
                    source: "simulated".into(),
                },
            }));
            // Described twice: kept once.
            for _ in 0..2 {
                s.remember(&Record::Gpu(GpuBatch {
                    pid,
                    records: vec![
                        GpuRecord::Device {
                            id: 0,
                            name: "GPU".into(),
                        },
                        kernel(1, 2),
                    ],
                }));
            }
        }
        s.remember(&Record::Note("how".into()));
        s.remember(&Record::Note("how".into()));
        let out = s.replay(|pid| pid == 2);
        let sources: Vec<u32> = out
            .iter()
            .filter_map(|r| match r {
                Record::GpuSource(s) => Some(s.pid),
                _ => None,
            })
            .collect();
        assert_eq!(sources, [2]);
        let devices: Vec<(u32, usize)> = out
            .iter()
            .filter_map(|r| match r {
                Record::Gpu(b) => Some((b.pid, b.records.len())),
                _ => None,
            })
            .collect();
        assert_eq!(devices, [(2, 1)]);
        assert_eq!(
            out.iter().filter(|r| matches!(r, Record::Note(_))).count(),
            1
        );
    }
}
