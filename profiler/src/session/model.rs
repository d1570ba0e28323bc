//! What a session holds: the records written while recording, in the order
//! they were observed. Independent of the kernel ABI, so the BPF side can
//! change without breaking recorded sessions.

use serde::{Deserialize, Serialize};

/// Bumped when a record changes meaning or a new one is added; readers
/// refuse newer versions at the header rather than at an unknown record.
/// 2 added GpuBlind and GpuSkipped (and NVTX ranges among GPU records);
/// 3 added ThreadIo and BlockedRead (recording without per-syscall hooks)
/// and ShimInjected; 4 added CpuIdle; 5 the Window mode; 6 ChargedSwitch;
/// 7 ProcessRank and the SockAccepted fd kind; 8 Neighbours.
pub const FORMAT_VERSION: u16 = 8;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Record {
    Header(SessionHeader),
    Event(Event),
    Stack(Stack),
    Process(ProcessInfo),
    Thread(ThreadSeed),
    Maps(ProcMaps),
    FdPath(FdPath),
    Drops(Drops),
    Symbols(Symbols),
    Note(String),
    End(Footer),
    /// A GPU process's shim (or another GPU source) introduced itself.
    GpuSource(GpuSource),
    /// GPU records from one process.
    Gpu(GpuBatch),
    /// Cumulative GPU record losses of one process.
    GpuDrops {
        pid: u32,
        cupti: u64,
        shim: u64,
    },
    /// One NVML reading of one GPU.
    Nvml(NvmlSample),
    /// A GPU as NVML describes it.
    NvmlDevice(NvmlDevice),
    /// A host-side operation from an imported trace (cpu_op, python_function,
    /// user_annotation): the only view of host threads a trace gives.
    HostOp(HostOp),
    /// What recording cost gapscope's own process (written at the end).
    Cost(CollectorCost),
    /// GPU records a process's shim had to drop, and the span they covered.
    GpuLost(GpuLost),
    /// A span in which a process's shim could see nothing, and why.
    GpuBlind(GpuBlind),
    /// Cumulative counts of GPU records a process's shim did not pass on.
    GpuSkipped {
        pid: u32,
        /// Delivered incomplete by CUPTI (zero timestamps, refused mid-buffer).
        incomplete: u64,
        /// Of kinds the shim does not read.
        unknown: u64,
    },
    /// Which rank of a multi-process job this is (from a trace's metadata).
    Rank(Rank),
    /// A thread's I/O accounting as the kernel keeps it, read when recording
    /// began (from /proc) and when it ended or the thread exited.
    ThreadIo(ThreadIo),
    /// gapscope brought the CUPTI shim into a running process with ptrace.
    ShimInjected(ShimInjected),
    /// How long the machine's CPUs had sat idle, read every second.
    CpuIdle(CpuIdle),
    /// Which rank of a multi-process job a recorded process is, as its
    /// launcher's environment said.
    ProcessRank {
        pid: u32,
        rank: Rank,
    },
    /// What the machine's unrecorded tasks had run, read with the idle time.
    Neighbours(Neighbours),
}

/// The machine's idle CPU time, summed over its CPUs, since boot (the
/// kernel's `idle` and `iowait` in /proc/stat), read at `ts`. Two readings
/// say how many CPUs sat free between them — CPUs the recorded processes
/// could have had, which their own threads cannot show: strangers' work
/// is not recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuIdle {
    pub ts: u64,
    pub idle_ns: u64,
}

/// The CPU time the machine's unrecorded tasks of the fair class had run
/// since recording began, summed over its CPUs, read at `ts`: those in the
/// recorded job's own scheduling group (its cgroup's or autogroup's) and
/// those elsewhere. The kernel shares a group's CPUs thread by thread and
/// the machine's among groups, so more threads of the job (loader workers)
/// win CPU from the first and not from the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Neighbours {
    pub ts: u64,
    pub same_group_ns: u64,
    pub elsewhere_ns: u64,
}

/// The CUPTI shim was loaded into process `pid` by `attach`, through its
/// thread `tid`: GPU activity exists from `loaded_at` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShimInjected {
    pub pid: u32,
    pub tid: u32,
    /// CLOCK_MONOTONIC ns when its InitializeInjection had returned.
    pub loaded_at: u64,
    /// The longest the thread was held stopped.
    pub longest_stop_ns: u64,
    /// From the first stop to the shim loaded.
    pub took_ns: u64,
    /// Loaded by an earlier attach, dormant since (the times above are 0).
    pub earlier: bool,
}

/// The kernel's I/O counters of one thread at one moment
/// (`/proc/PID/task/TID/io`, or `task->ioac` as it exits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    /// Bytes returned by read-family calls on any fd (`rchar`).
    pub rchar: u64,
    /// Bytes passed to write-family calls on any fd (`wchar`).
    pub wchar: u64,
    pub syscr: u64,
    pub syscw: u64,
    /// Bytes the thread caused to be fetched from storage.
    pub read_bytes: u64,
    /// Bytes the thread caused to be sent to storage.
    pub write_bytes: u64,
}

impl IoCounters {
    /// What was counted between `start` and `self`.
    pub fn since(&self, start: &IoCounters) -> IoCounters {
        IoCounters {
            rchar: self.rchar.saturating_sub(start.rchar),
            wchar: self.wchar.saturating_sub(start.wchar),
            syscr: self.syscr.saturating_sub(start.syscr),
            syscw: self.syscw.saturating_sub(start.syscw),
            read_bytes: self.read_bytes.saturating_sub(start.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(start.write_bytes),
        }
    }
}

/// One reading of a thread's I/O counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadIo {
    pub pid: u32,
    pub tid: u32,
    pub ts: u64,
    /// The reading before recording began (a thread born while recording
    /// starts from zero and has none).
    pub start: bool,
    pub io: IoCounters,
}

/// This recording's place in a distributed job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rank {
    pub rank: u32,
    pub world: u32,
}

/// `[start, end]` in which process `pid`'s GPU view was missing entirely:
/// another CUPTI client held CUPTI, or its stream ended without a goodbye
/// (the process was killed) and what ran after its last record is unknown.
/// The span is lost, never idle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuBlind {
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub reason: String,
}

/// `records` GPU records of process `pid` covering `[start, end]` never
/// reached the session: what the GPU did in that span is partly unknown.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuLost {
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub records: u64,
}

/// gapscope's own resource use: its process only (the target's CPU time,
/// including what the BPF programs cost it, is not in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectorCost {
    /// CPU time while recording (loading before and symbolizing after the
    /// window are not in: they do not compete with the target).
    pub cpu_ns: u64,
    /// Peak resident memory, start to end (the kernel ring buffer, mapped
    /// twice, is in it).
    pub peak_rss_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostOp {
    pub pid: u32,
    pub tid: u32,
    pub start: u64,
    pub end: u64,
    /// Shared: a trace repeats the same op names millions of times.
    pub name: std::sync::Arc<str>,
    pub cat: std::sync::Arc<str>,
}

/// What produced a process's GPU records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// The CUPTI shim: GPU timestamps.
    #[default]
    Cupti,
    /// uprobes on libcuda: CPU-side call times only.
    Uprobe,
    /// The examples' simulated device (a test and demo workload).
    Simulated,
    /// An imported PyTorch profiler trace.
    Kineto,
}

impl SourceKind {
    const ALL: [SourceKind; 4] = [
        SourceKind::Cupti,
        SourceKind::Uprobe,
        SourceKind::Simulated,
        SourceKind::Kineto,
    ];

    /// The name reports use (and sessions store).
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Cupti => "cupti",
            SourceKind::Uprobe => "uprobe",
            SourceKind::Simulated => "simulated",
            SourceKind::Kineto => "kineto",
        }
    }
}

/// Written as its name, in reports and in sessions alike: sessions stored
/// the name before it was a type, so older files read unchanged.
impl Serialize for SourceKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SourceKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        SourceKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown GPU source kind {name:?}")))
    }
}

/// Where a process's GPU records come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSource {
    pub pid: u32,
    /// The report's `source`.
    pub kind: SourceKind,
    pub hello: gapscope_wire::Hello,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuBatch {
    pub pid: u32,
    pub records: Vec<gapscope_wire::GpuRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvmlDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvmlSample {
    pub ts: u64,
    pub index: u32,
    /// utilization.gpu: % of the sample period a kernel was running.
    pub util_gpu: Option<u32>,
    pub util_memory: Option<u32>,
    pub memory_used: Option<u64>,
    pub power_mw: Option<u32>,
    /// Total energy since the driver loaded, mJ.
    pub energy_mj: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    /// Per-process SM utilization % of the target's processes on this GPU.
    pub processes: Vec<(u32, u32)>,
}

/// How a session was made. In reports, written in lower case ("run").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Run,
    Attach,
    /// Imported from a PyTorch profiler (Kineto) trace: GPU and host ops, no eBPF.
    Kineto,
    /// One window of a continuous recording (the agent): the window's edges
    /// are where the recording was cut, not where the job started or ended
    /// (unless its footer says the target exited).
    Window,
    /// Imported from a PyTorch profiler trace that starts mid-run (a
    /// profiler schedule's wait and warm-up steps, or GPU work launched
    /// before it began): the idle before its first GPU work is not the
    /// job's start-up (after its last, the profiler stopping, is tear-down).
    #[serde(rename = "kineto-window")]
    KinetoWindow,
}

impl Mode {
    /// Imported from a PyTorch profiler trace.
    pub fn is_trace(self) -> bool {
        matches!(self, Mode::Kineto | Mode::KinetoWindow)
    }
}

/// A kernel on stream 7 of device 0, for unit tests.
#[cfg(test)]
pub fn test_kernel(start: u64, end: u64) -> gapscope_wire::GpuRecord {
    gapscope_wire::GpuRecord::Kernel {
        start,
        end,
        device: 0,
        context: 1,
        stream: 7,
        correlation: 0,
        name: "k".into(),
        grid: [1, 1, 1],
        block: [1, 1, 1],
    }
}

#[cfg(test)]
impl SessionHeader {
    /// A header for unit tests: process 1, started at 0 on both clocks.
    pub fn for_test(mode: Mode, nr_cpus: u32) -> SessionHeader {
        SessionHeader {
            gapscope_version: String::new(),
            mode,
            target_pid: 1,
            command: vec![],
            hostname: String::new(),
            kernel: String::new(),
            nr_cpus,
            start_ns: 0,
            start_unix_ns: 0,
            sample_hz: 99,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionHeader {
    pub gapscope_version: String,
    pub mode: Mode,
    pub target_pid: u32,
    pub command: Vec<String>,
    pub hostname: String,
    pub kernel: String,
    pub nr_cpus: u32,
    /// CLOCK_MONOTONIC ns at which recording started (the window start).
    pub start_ns: u64,
    /// CLOCK_REALTIME ns read together with `start_ns`, to print wall times.
    pub start_unix_ns: u64,
    pub sample_hz: u64,
}

/// Kind of the file behind an fd, decided in the kernel (`enum gs_fd_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FdKind {
    None,
    File,
    Block,
    SockInet,
    SockUnix,
    SockOther,
    Pipe,
    Anon,
    Gpu,
    Char,
    Pseudo,
    /// An INET socket the kernel made by accepting a connection (a server's
    /// side of it), where the recording saw it accepted; others are
    /// `SockInet`.
    SockAccepted,
}

impl FdKind {
    pub fn from_raw(raw: u8) -> FdKind {
        match raw {
            1 => FdKind::File,
            2 => FdKind::Block,
            3 => FdKind::SockInet,
            4 => FdKind::SockUnix,
            5 => FdKind::SockOther,
            6 => FdKind::Pipe,
            7 => FdKind::Anon,
            8 => FdKind::Gpu,
            9 => FdKind::Char,
            10 => FdKind::Pseudo,
            11 => FdKind::SockAccepted,
            _ => FdKind::None,
        }
    }
}

/// The other end of a TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Peer {
    /// IPv4's in the first four bytes where not `v6`.
    pub addr: [u8; 16],
    pub v6: bool,
    pub port: u16,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.v6 {
            let ip = std::net::Ipv6Addr::from(self.addr);
            write!(f, "[{ip}]:{}", self.port)
        } else {
            let [a, b, c, d, ..] = self.addr;
            write!(f, "{}:{}", std::net::Ipv4Addr::new(a, b, c, d), self.port)
        }
    }
}

/// The thread that left a CPU in a `Switch`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwitchOut {
    pub pid: u32,
    pub tid: u32,
    /// TASK_* state bits; meaningless when `preempted`.
    pub state: u64,
    /// Still runnable: preempted, or yielded, rather than blocked.
    pub preempted: bool,
    pub ustack: u64,
    pub kstack: u64,
    /// Syscall in flight, if any.
    pub syscall: Option<i32>,
    pub fd: i32,
    pub fd_kind: FdKind,
    /// The thread (pid, tid) that took the CPU, tracked or not: who a
    /// preempted thread lost its CPU to.
    pub next: (u32, u32),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A tracked thread left (`out`) and/or took (`in_`) a CPU.
    Switch {
        ts: u64,
        cpu: u16,
        out: Option<SwitchOut>,
        in_: Option<(u32, u32)>,
    },
    Wakeup {
        ts: u64,
        pid: u32,
        tid: u32,
        waker_pid: u32,
        waker_tid: u32,
        new_task: bool,
    },
    Syscall {
        ts: u64,
        pid: u32,
        tid: u32,
        dur: u64,
        nr: i32,
        fd: i32,
        fd_kind: FdKind,
        ret: i64,
    },
    Sample {
        ts: u64,
        pid: u32,
        tid: u32,
        cpu: u16,
        ustack: u64,
        kstack: u64,
    },
    Fault {
        ts: u64,
        pid: u32,
        tid: u32,
        address: u64,
        error_code: u64,
    },
    Fork {
        ts: u64,
        pid: u32,
        tid: u32,
        parent_pid: u32,
        parent_tid: u32,
        thread: bool,
        comm: String,
    },
    Exec {
        ts: u64,
        pid: u32,
        tid: u32,
        old_tid: u32,
        comm: String,
        filename: String,
    },
    Exit {
        ts: u64,
        pid: u32,
        tid: u32,
        /// wait(2)-style status of the thread.
        status: i32,
        group_dead: bool,
        comm: String,
    },
    Open {
        ts: u64,
        pid: u32,
        tid: u32,
        fd: i32,
        path: String,
    },
    /// A call into libcuda seen by a uprobe (no shim in that process).
    CudaCall {
        ts: u64,
        pid: u32,
        tid: u32,
        dur: u64,
        function: String,
        /// The stream handle or byte count the call was given, 0 if none.
        arg: u64,
    },
    /// The switch-out just before it blocked a thread in a read-family call
    /// that asked for `size` bytes (recorded without the per-syscall hooks,
    /// which record the bytes each call returned instead).
    BlockedRead {
        ts: u64,
        pid: u32,
        tid: u32,
        nr: i32,
        fd: i32,
        fd_kind: FdKind,
        size: u64,
    },
    /// A `Switch` that also says how much CPU time the kernel charged
    /// `out` for the run that ends here. Recorded instead of `Switch` when
    /// the kernel said; less than the run's wall time when the CPU was
    /// taken from the thread (hypervisor steal; interrupts, with IRQ time
    /// accounting).
    ChargedSwitch {
        ts: u64,
        cpu: u16,
        out: Option<SwitchOut>,
        in_: Option<(u32, u32)>,
        charged: u64,
    },
    // New variants go last: a session holds variants by their index.
    /// TCP sent a segment again on a socket thread `tid` used (blocked on
    /// it, or connected it): one lost on the way, or its ACK.
    Retransmit {
        ts: u64,
        pid: u32,
        tid: u32,
        peer: Peer,
        local_port: u16,
    },
}

impl Event {
    pub fn ts(&self) -> u64 {
        match self {
            Event::Switch { ts, .. }
            | Event::Wakeup { ts, .. }
            | Event::Syscall { ts, .. }
            | Event::Sample { ts, .. }
            | Event::Fault { ts, .. }
            | Event::Retransmit { ts, .. }
            | Event::Fork { ts, .. }
            | Event::Exec { ts, .. }
            | Event::Exit { ts, .. }
            | Event::Open { ts, .. }
            | Event::CudaCall { ts, .. }
            | Event::BlockedRead { ts, .. }
            | Event::ChargedSwitch { ts, .. } => *ts,
        }
    }
}

/// A raw stack as captured, identified by the hash the kernel gave it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stack {
    pub hash: u64,
    /// Owning process for user stacks; 0 for kernel stacks.
    pub pid: u32,
    pub kernel: bool,
    /// Innermost frame first.
    pub addrs: Vec<u64>,
}

/// A process of the target tree, from /proc or from fork/exec events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub argv: Vec<String>,
}

/// A thread that existed when recording started (attach), with its state
/// then, so its time before its first event is accounted correctly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadSeed {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// /proc state letter: R, S, D, ...
    pub state: char,
    pub syscall: Option<i32>,
    pub fd_kind: FdKind,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MapRange {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// A process's executable mappings, read while it was alive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcMaps {
    pub pid: u32,
    pub ranges: Vec<MapRange>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FdPath {
    pub pid: u32,
    pub fd: i32,
    pub path: String,
}

/// Cumulative counts of records lost, per source, written every second
/// while recording. The last one wins; its time also bounds how long a
/// session that was cut short is known to have been recording.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Drops {
    /// CLOCK_MONOTONIC ns at which the counters were read.
    pub ts: u64,
    /// Kernel records lost to a full ring buffer, by event kind name.
    pub cpu_by_kind: Vec<(String, u64)>,
    /// Records that arrived but could not be decoded.
    pub cpu_malformed: u64,
    pub gpu_records: u64,
}

impl Drops {
    pub fn cpu_events(&self) -> u64 {
        // Saturating: counters from a damaged file can be anything.
        self.cpu_by_kind
            .iter()
            .fold(self.cpu_malformed, |acc, (_, n)| acc.saturating_add(*n))
    }
}

/// One symbolized frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub function: String,
    /// File name of the module (binary or shared library), "" for the kernel.
    pub module: String,
}

/// Resolved frames for stacks: written as the processes they belong to
/// exit (in batches) and for the rest when recording ends; a reader merges
/// them all. Frames are interned per record: `stacks[i].1` indexes into
/// `frames`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Symbols {
    pub frames: Vec<Frame>,
    pub stacks: Vec<(u64, Vec<u32>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    TargetExited,
    Duration,
    Interrupted,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Footer {
    /// CLOCK_MONOTONIC ns at which recording stopped (the window end).
    pub end_ns: u64,
    pub reason: StopReason,
    /// The target's exit code, shell style (128+N when killed by signal N).
    pub exit_code: Option<i32>,
    pub events: u64,
}

/// Shell-style exit code from a wait status: the code, or 128 + signal.
pub fn exit_code_of(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        status
    }
}

/// Frames every stack ends in (process and thread entry, language runtime
/// start-up): they say nothing about where the time went.
pub fn is_entry_frame(f: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "_start",
        "__libc_start_",
        "start_thread",
        "clone3",
        "__clone",
        "std::rt::lang_start",
        "__rust_begin_short_backtrace",
        "std::sys::backtrace::__rust_begin_short_backtrace",
        "core::ops::function::FnOnce::call_once",
        "std::panicking::",
        "std::panic::catch_unwind",
        "__rust_try",
        "std::thread::",
        "<core::panic::unwind_safe::AssertUnwindSafe",
        "std::sys::pal::unix::thread::Thread::new::thread_start",
        "std::sys::thread::unix::Thread::new::thread_start",
    ];
    PREFIXES.iter().any(|p| f.starts_with(p))
}
