//! Where kernel records go while recording: decoded, written to the session
//! in arrival order, with the process metadata they call for gathered while
//! the processes are still alive.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::bpf::{abi, decode};
use super::{launch, procfs};
use crate::session::SourceKind;
use crate::session::{Drops, Event, ProcMaps, Record, SessionError, SessionWriter, Stack};

/// Re-read a process's maps at most this often when a stack falls outside
/// the snapshot we have (a library loaded since).
const MAPS_REFRESH: Duration = Duration::from_millis(100);

pub struct Sink {
    pub writer: SessionWriter,
    pub target_pid: u32,
    /// User and kernel stacks seen, for symbolization at the end.
    pub stacks: HashMap<u64, Stack>,
    pub maps: Vec<ProcMaps>,
    maps_read: HashMap<u32, Instant>,
    /// Index into `maps` of each process's newest snapshot.
    latest_maps: HashMap<u32, usize>,
    /// Processes of the tree that have not exited.
    pub live: HashSet<u32>,
    pub events: u64,
    pub malformed: u64,
    /// The target's exit code as the kernel reported it (shell style).
    pub target_exit: Option<i32>,
    /// First write error; recording stops when set.
    pub error: Option<SessionError>,
    /// Processes whose libcuda calls the uprobes have seen.
    uprobed: HashSet<u32>,
    /// gapscope's own CPU time between attaching and stopping.
    pub cpu_while_recording: u64,
}

impl Sink {
    pub fn new(writer: SessionWriter, target_pid: u32) -> Sink {
        Sink {
            writer,
            target_pid,
            stacks: HashMap::new(),
            maps: Vec::new(),
            maps_read: HashMap::new(),
            latest_maps: HashMap::new(),
            live: HashSet::new(),
            events: 0,
            malformed: 0,
            target_exit: None,
            error: None,
            uprobed: HashSet::new(),
            cpu_while_recording: 0,
        }
    }

    pub fn push(&mut self, record: Record) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.writer.push(&record) {
            self.error = Some(e);
        }
    }

    /// Snapshots a process's executable mappings now.
    pub fn snapshot_maps(&mut self, pid: u32) {
        self.maps_read.insert(pid, Instant::now());
        if let Some(ranges) = procfs::exec_maps(pid) {
            self.store_maps(ProcMaps { pid, ranges });
        }
    }

    fn store_maps(&mut self, maps: ProcMaps) {
        self.push(Record::Maps(maps.clone()));
        self.latest_maps.insert(maps.pid, self.maps.len());
        self.maps.push(maps);
    }

    fn covers(&self, pid: u32, addrs: &[u64]) -> bool {
        let Some(&i) = self.latest_maps.get(&pid) else {
            return false;
        };
        let ranges = &self.maps[i].ranges;
        addrs
            .iter()
            .all(|&a| ranges.iter().any(|r| r.start <= a && a < r.end))
    }

    /// Handles one raw ring-buffer record.
    pub fn handle(&mut self, bytes: &[u8]) {
        let Some(record) = decode(bytes) else {
            self.malformed += 1;
            return;
        };
        self.events += 1;
        match &record {
            Record::Stack(s) if !s.kernel => {
                let fresh = self
                    .maps_read
                    .get(&s.pid)
                    .is_some_and(|t| t.elapsed() < MAPS_REFRESH);
                if !self.covers(s.pid, &s.addrs) && !fresh {
                    self.snapshot_maps(s.pid);
                }
                self.stacks.insert(s.hash, s.clone());
            }
            Record::Stack(s) => {
                self.stacks.insert(s.hash, s.clone());
            }
            Record::Event(Event::Fork {
                pid,
                parent_pid,
                thread: false,
                comm,
                ..
            }) => {
                self.live.insert(*pid);
                let (pid, parent_pid, comm) = (*pid, *parent_pid, comm.clone());
                self.push(record);
                self.push(Record::Process(crate::session::ProcessInfo {
                    pid,
                    ppid: parent_pid,
                    comm,
                    argv: Vec::new(),
                }));
                // A fork starts with its parent's mappings: inherit the
                // snapshot so a child that exits quickly still symbolizes.
                if let Some(&i) = self.latest_maps.get(&parent_pid) {
                    let ranges = self.maps[i].ranges.clone();
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
                self.snapshot_maps(pid);
                return;
            }
            Record::Event(Event::CudaCall { pid, .. }) if self.uprobed.insert(*pid) => {
                let pid = *pid;
                self.push(Record::GpuSource(crate::session::GpuSource {
                    pid,
                    kind: SourceKind::Uprobe,
                    hello: gapscope_cupti::Hello {
                        version: gapscope_cupti::protocol::VERSION,
                        pid,
                        driver_version: 0,
                        cupti_version: 0,
                        clock: gapscope_cupti::ClockMethod::Native,
                        source: "libcuda uprobes (approximate: API calls, no kernel times)".into(),
                    },
                }));
            }
            Record::Event(Event::Exit {
                pid,
                status,
                group_dead: true,
                ..
            }) => {
                self.live.remove(pid);
                if *pid == self.target_pid {
                    self.target_exit = Some(launch::exit_code_of(*status));
                }
            }
            _ => {}
        }
        self.push(record);
    }

    /// Records the kernel's drop counters (cumulative; the last one wins).
    pub fn drops_record(&mut self, by_kind: &[u64]) -> Drops {
        let drops = Drops {
            ts: crate::clock::monotonic_ns(),
            cpu_by_kind: by_kind
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(k, &n)| (abi::kind::name(k).to_string(), n))
                .collect(),
            cpu_malformed: self.malformed,
            gpu_records: 0,
        };
        self.push(Record::Drops(drops.clone()));
        drops
    }
}
