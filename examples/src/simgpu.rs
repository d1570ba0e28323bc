//! The simulated GPU of gapscope's test and demo workloads — NOT a GPU.
//!
//! A single stream on CLOCK_MONOTONIC: work runs back to back in issue
//! order, and its records (with the CUDA API calls that issued them) go to
//! gapscope through its GPU wire protocol, the same code the CUPTI shim
//! uses. It says so in its handshake, so reports show `source:
//! "simulated"`. simtrain links it; Python workloads load it as
//! libgs_simgpu.so through its C ABI (below), so that real host code — a
//! PyTorch DataLoader, say — can feed a simulated device.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gapscope_wire::clock::{monotonic_ns as now, thread_cpu_ns};
use gapscope_wire::protocol::{encode, ClockMethod, Frame, Hello, VERSION};
use gapscope_wire::record::{copy_kind, memory_kind, sync_type};
use gapscope_wire::{ApiDomain, GpuRecord};

/// Busy-waits `ns` of wall time (work the host cannot hide, e.g. a launch).
pub fn spin_wall(ns: u64) {
    let end = now() + ns;
    while now() < end {
        std::hint::spin_loop();
    }
}

/// Real CPU work, as a driver call does: `ns` of this thread's CPU time
/// (a wait for a CPU in between makes it longer, as it would a real one).
pub fn spin_cpu(ns: u64) {
    let end = thread_cpu_ns() + ns;
    while thread_cpu_ns() < end {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    }
}

pub fn sleep_until(t: u64) {
    let n = now();
    if t > n {
        std::thread::sleep(Duration::from_nanos(t - n));
    }
}

/// This thread's time waiting on a run queue so far (the second field of
/// its schedstat); 0 where the kernel does not keep it.
fn run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// [`sleep_until`], and how long the thread then waited for a CPU before
/// it ran again (the end of the sleep: its wake-up's wait).
fn sleep_until_waiting(t: u64) -> u64 {
    let before = run_delay_ns();
    sleep_until(t);
    run_delay_ns().saturating_sub(before)
}

/// How often this thread has given up its CPU of its own accord so far:
/// blocked (a page of its code read back in from storage, a kernel lock
/// another thread held), not preempted.
fn voluntary_switches() -> i64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u.ru_nvcsw
    }
}

/// A stretch of a call: `[start, end)`, of which the thread waited
/// `waited` for a CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallPiece {
    pub start: u64,
    pub end: u64,
    pub waited: u64,
}

fn tid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Where the device's records go: gapscope's socket under `gapscope run`;
/// otherwise, as a dormant shim does, the profiler that connects to its
/// control socket (`gapscope attach`), while it stays.
type Link = Arc<Mutex<Option<UnixStream>>>;

/// A single-stream simulated GPU. Work runs back to back in issue order, on
/// CLOCK_MONOTONIC; its records go to gapscope as they would from CUPTI.
pub struct SimDevice {
    /// Its device ordinal: GS_SIMGPU_DEVICE, as CUDA_VISIBLE_DEVICES gives
    /// each rank of a job its own GPU; 0 without it.
    ordinal: u32,
    link: Link,
    pid: u32,
    /// When the queue empties.
    pub free_at: u64,
    correlation: u32,
    pending: Vec<GpuRecord>,
    /// Every span of device activity, for the ground truth.
    pub busy: Vec<(u64, u64)>,
    /// Records dropped on purpose (`--lose-gpu-step`), and the span they
    /// covered.
    pub lost: Option<(u64, u64, u64)>,
    /// Of the last launch call's time, how long its thread waited for a
    /// CPU (its wall time less its CPU time): for the ground truth. None
    /// of it where the call blocked (see [`SimDevice::launch_kernels`]).
    /// It carries the wall time of one read of the CPU clock (a syscall,
    /// about half a microsecond): nothing for a few calls a step; a loop
    /// of many calls measures its wait over the loop instead.
    pub last_call_waited: u64,
    /// Launch calls' time off a CPU that was not a wait for one: blocked
    /// inside the call (for the ground truth's account of what it left out).
    pub blocked_in_calls: u64,
    /// The last copy call, piece by piece (see [`SimDevice::memcpy`]).
    pub last_call_pieces: Vec<CallPiece>,
    /// Dormant: when a profiler first connected (0 until then).
    sighted: Arc<std::sync::atomic::AtomicU64>,
    /// The thread that encodes and sends what the device says, as CUPTI
    /// hands its buffers to the shim on a thread of its own: the caller
    /// only queues it, and never waits for gapscope to read (a
    /// synchronous send would block the trainer whenever gapscope fell
    /// behind — time no real training loop spends). Taken at goodbye.
    sender: Option<(Sender<Frame>, JoinHandle<()>)>,
    /// How long goodbye waited for the sending thread to hand gapscope
    /// what was still queued: the recorder's cost at exit (it falls behind
    /// a job that makes records fast on a busy machine), not the job's.
    pub exit_waited: u64,
}

impl SimDevice {
    /// Connects to gapscope through GAPSCOPE_SOCKET (if set) and says who
    /// it is: `who` goes into the handshake and the device's name. Without
    /// it, the device waits dormant on its control socket, like the shim.
    pub fn connect(who: &str) -> SimDevice {
        let pid = std::process::id();
        let ordinal = ordinal();
        let mut greeting = Vec::new();
        encode(
            &Frame::Hello(Hello {
                version: VERSION,
                pid,
                driver_version: 0,
                cupti_version: 0,
                clock: ClockMethod::Native,
                source: format!("simulated device ({who})"),
            }),
            &mut greeting,
        );
        encode(
            &Frame::Records(vec![GpuRecord::Device {
                id: ordinal,
                name: format!("Simulated GPU {ordinal} ({who})"),
            }]),
            &mut greeting,
        );
        let link: Link = Arc::default();
        let sighted: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let conn = std::env::var("GAPSCOPE_SOCKET")
            .ok()
            .and_then(|name| gapscope_wire::transport::connect(&name).ok());
        match conn {
            Some(c) => *lock(&link) = Some(c),
            None => {
                eprintln!("{who}: not under gapscope run: the simulated GPU waits, dormant, for gapscope attach");
                wait_dormant(link.clone(), greeting.clone(), sighted.clone());
            }
        }
        send(&link, &greeting);
        let (tx, rx) = channel::<Frame>();
        let sending = link.clone();
        let thread = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            for frame in rx {
                bytes.clear();
                encode(&frame, &mut bytes);
                send(&sending, &bytes);
            }
        });
        SimDevice {
            link,
            pid,
            ordinal,
            free_at: 0,
            correlation: 0,
            pending: Vec::new(),
            busy: Vec::new(),
            lost: None,
            last_call_waited: 0,
            blocked_in_calls: 0,
            last_call_pieces: Vec::new(),
            sighted,
            sender: Some((tx, thread)),
            exit_waited: 0,
        }
    }

    /// A dormant device: when a profiler first connected — where what a
    /// profiler can see of the job begins.
    pub fn sighted_at(&self) -> Option<u64> {
        Some(self.sighted.load(std::sync::atomic::Ordering::SeqCst)).filter(|&t| t > 0)
    }

    /// Hands `frame` to the sending thread.
    fn send(&self, frame: Frame) {
        if let Some((tx, _)) = &self.sender {
            let _ = tx.send(frame);
        }
    }

    /// Sends the pending records (queued for the sending thread).
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if !connected(&self.link) {
            // Dormant: nobody to tell, and nothing kept for later.
            self.pending.clear();
            return;
        }
        let records = std::mem::take(&mut self.pending);
        self.send(Frame::Records(records));
    }

    /// Drops the pending records the way the shim's transport does when
    /// its queue is full: they never reach gapscope, the span they covered
    /// does.
    pub fn lose_pending(&mut self) {
        let records = std::mem::take(&mut self.pending);
        let Some((start, end)) = records
            .iter()
            .filter_map(GpuRecord::span)
            .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
        else {
            return;
        };
        self.lost = Some((start, end, records.len() as u64));
        self.send(Frame::Lost {
            start,
            end,
            records: records.len() as u64,
        });
    }

    fn api(&mut self, cbid: u32, start: u64, end: u64) -> u32 {
        self.correlation += 1;
        self.pending.push(GpuRecord::Api {
            domain: ApiDomain::Runtime,
            cbid,
            start,
            end,
            pid: self.pid,
            tid: tid(),
            correlation: self.correlation,
        });
        self.correlation
    }

    /// Schedules `ns` of device work that may start no earlier than `ready`.
    fn schedule(&mut self, ready: u64, ns: u64) -> (u64, u64) {
        let start = ready.max(self.free_at);
        let end = start + ns;
        self.free_at = end;
        self.busy.push((start, end));
        (start, end)
    }

    /// cudaLaunchKernel: `cost` of host time inside the call, then the kernel
    /// queues behind earlier work.
    pub fn launch(&mut self, kernel_ns: u64, cost: u64) -> (u64, u64) {
        self.launch_kernels(211, 1, kernel_ns, cost)
    }

    /// cudaGraphLaunch: `n` kernels of `kernel_ns` from one call.
    pub fn launch_graph(&mut self, n: usize, kernel_ns: u64) -> (u64, u64) {
        self.launch_kernels(311, n, kernel_ns, 0)
    }

    /// A call that blocked (a page of the spinning code read back in on a
    /// machine short of memory, a lock the sending thread held): its wall
    /// time less its CPU time is not a wait for a CPU, and the kernel's
    /// switches show it as the call's own time off a CPU — the call's, as
    /// a real driver call that blocked would be. Taken for contention, it
    /// asked the recording for waits for a CPU that the kernel never saw.
    fn launch_kernels(&mut self, cbid: u32, n: usize, kernel_ns: u64, cost: u64) -> (u64, u64) {
        let (a, cpu, switches) = (now(), thread_cpu_ns(), voluntary_switches());
        spin_cpu(cost);
        // The driver queues the kernels before the call returns: that
        // bookkeeping is the call's (with CUDA graphs it goes too).
        let queued = now();
        let corr = self.api(cbid, a, queued);
        let record = self.pending.len() - 1;
        for _ in 0..n {
            let span = self.schedule(queued, kernel_ns);
            self.kernel(span, corr, "simulated_step_kernel");
        }
        let cpu = thread_cpu_ns() - cpu;
        let b = now();
        if let Some(GpuRecord::Api { end, .. }) = self.pending.get_mut(record) {
            *end = b;
        }
        let off_cpu = (b - a).saturating_sub(cpu);
        if voluntary_switches() == switches {
            self.last_call_waited = off_cpu;
        } else {
            self.last_call_waited = 0;
            self.blocked_in_calls += off_cpu;
        }
        (a, b)
    }

    fn kernel(&mut self, (start, end): (u64, u64), correlation: u32, name: &str) {
        self.pending.push(GpuRecord::Kernel {
            start,
            end,
            device: self.ordinal,
            context: 1,
            stream: 7,
            correlation,
            grid: [1024, 1, 1],
            block: [256, 1, 1],
            name: name.into(),
        });
    }

    /// cudaStreamSynchronize: blocks until the queue is empty. Returns the
    /// call's span, as every call here does.
    pub fn synchronize(&mut self) -> (u64, u64) {
        self.synchronize_from(now())
    }

    /// A synchronize called at `a`.
    fn synchronize_from(&mut self, a: u64) -> (u64, u64) {
        sleep_until(self.free_at);
        let b = now();
        let corr = self.api(131, a, b);
        self.pending.push(GpuRecord::Sync {
            start: a,
            end: b,
            context: 1,
            stream: 7,
            correlation: corr,
            sync_type: sync_type::STREAM_SYNCHRONIZE,
            event: 0,
        });
        (a, b)
    }

    /// A collective (NCCL's all-reduce) and, with `synchronize`, the
    /// synchronize after it, as one rank of several sees them: the kernel
    /// starts when the stream reaches it and ends `xfer_ns` after the last
    /// rank's has started — `meet` is told this rank's start and blocks
    /// until it knows the last one (the host then waits inside
    /// cudaStreamSynchronize, as it would for `loss.item()` behind the
    /// all-reduce). Returns the kernel's span.
    pub fn all_reduce(
        &mut self,
        xfer_ns: u64,
        synchronize: bool,
        meet: impl FnOnce(u64) -> u64,
    ) -> (u64, u64) {
        let a = now();
        let corr = self.api(211, a, now());
        let start = now().max(self.free_at);
        let synchronizing = now();
        let end = meet(start).max(start) + xfer_ns;
        self.free_at = end;
        self.busy.push((start, end));
        self.kernel(
            (start, end),
            corr,
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        );
        if synchronize {
            self.synchronize_from(synchronizing);
        }
        (start, end)
    }

    /// cudaMemcpy from pageable memory: synchronous, so it first waits for
    /// the stream to drain, then the host stages the data (a real copy) while
    /// the GPU has nothing to do, then the device copies it.
    ///
    /// `pinned` (cudaMemcpyAsync from pinned memory): no staging, no
    /// waiting; the device still copies the bytes.
    ///
    /// Where in it the thread waited for a CPU is left in
    /// [`SimDevice::last_call_pieces`]: the end of each sleep (its wake-up)
    /// and, spread over it, the staging's.
    pub fn memcpy(&mut self, src: &[u8], staging: &mut [u8], pinned: bool) -> (u64, u64) {
        let a = now();
        self.last_call_pieces.clear();
        let slept = |pieces: &mut Vec<CallPiece>, from: u64, until: u64| {
            let waited = sleep_until_waiting(until);
            let woke = now();
            let ran = woke.saturating_sub(waited).max(from);
            pieces.push(CallPiece {
                start: from,
                end: ran,
                waited: 0,
            });
            pieces.push(CallPiece {
                start: ran,
                end: woke,
                waited: woke - ran,
            });
            woke
        };
        let mut at = a;
        if !pinned {
            at = slept(&mut self.last_call_pieces, at, self.free_at);
            let cpu = thread_cpu_ns();
            staging.copy_from_slice(src);
            std::hint::black_box(&staging);
            let done = now();
            self.last_call_pieces.push(CallPiece {
                start: at,
                end: done,
                waited: (done - at).saturating_sub(thread_cpu_ns() - cpu),
            });
            at = done;
        }
        let staged = at;
        let (start, end) = self.schedule(staged, src.len() as u64 / 20); // 20 GB/s
        if !pinned {
            at = slept(&mut self.last_call_pieces, at, end);
        }
        let b = now();
        self.last_call_pieces.push(CallPiece {
            start: at,
            end: b,
            waited: 0,
        });
        // cudaMemcpy, cudaMemcpyAsync.
        let corr = self.api(if pinned { 41 } else { 31 }, a, b);
        self.pending.push(GpuRecord::Memcpy {
            start,
            end,
            device: self.ordinal,
            context: 1,
            stream: 7,
            correlation: corr,
            bytes: src.len() as u64,
            copy_kind: copy_kind::HTOD,
            src_kind: if pinned {
                memory_kind::PINNED
            } else {
                memory_kind::PAGEABLE
            },
            dst_kind: memory_kind::DEVICE,
        });
        (a, b)
    }

    /// An NVTX range of the calling thread (nvtxRangePush/Pop), sent with
    /// the next records.
    pub fn range(&mut self, name: String, start: u64, end: u64) {
        self.pending.push(GpuRecord::Range {
            start,
            end,
            tid: tid(),
            name,
            domain: String::new(),
        });
    }

    pub fn goodbye(&mut self) {
        self.flush();
        // The shim's cumulative loss counts, as it sends them when leaving.
        self.send(Frame::Dropped {
            cupti: 0,
            shim: self.lost.map_or(0, |l| l.2),
        });
        self.send(Frame::Goodbye);
        // Everything queued is sent before the caller goes on (to exit).
        if let Some((tx, thread)) = self.sender.take() {
            let t = now();
            drop(tx);
            let _ = thread.join();
            self.exit_waited = now() - t;
        }
    }
}

/// Whether a profiler is connected, without waiting for the link: the
/// sending thread holds it while a write blocks on a profiler that fell
/// behind, and the trainer must not wait on that (taken, it is in use: a
/// profiler is there, or one is connecting).
/// The device ordinal GS_SIMGPU_DEVICE asks for (0 without it).
fn ordinal() -> u32 {
    std::env::var("GS_SIMGPU_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn connected(link: &Link) -> bool {
    match link.try_lock() {
        Ok(l) => l.is_some(),
        Err(std::sync::TryLockError::WouldBlock) => true,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().is_some(),
    }
}

fn lock(link: &Link) -> std::sync::MutexGuard<'_, Option<UnixStream>> {
    link.lock().unwrap_or_else(|e| e.into_inner())
}

fn send(link: &Link, bytes: &[u8]) {
    let mut link = lock(link);
    if let Some(c) = link.as_mut() {
        if c.write_all(bytes).is_err() {
            *link = None;
        }
    }
}

/// Listens on the control socket a dormant CUPTI shim would (`gapscope
/// attach` and the agent look for it), one profiler at a time: each gets the
/// greeting, then the device's records from that moment until it leaves.
fn wait_dormant(link: Link, greeting: Vec<u8>, sighted: Arc<std::sync::atomic::AtomicU64>) {
    use gapscope_wire::transport;
    let name = transport::local_control_socket_name(std::process::id());
    let Ok(listener) = transport::listen(&name) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("simgpu-listen".into())
        .spawn(move || {
            for mut stream in listener.incoming().flatten() {
                // Only our own user (or root) may switch recording on.
                // SAFETY: getuid has no preconditions.
                let me = unsafe { libc::getuid() };
                if !transport::peer_uid(&stream).is_some_and(|u| u == me || u == 0) {
                    continue;
                }
                let Ok(mut reader) = stream.try_clone() else {
                    continue;
                };
                let mut hello = greeting.clone();
                let at = now();
                let _ = sighted.compare_exchange(
                    0,
                    at,
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                );
                encode(&Frame::Sighted { at }, &mut hello);
                if stream.write_all(&hello).is_err() {
                    continue;
                }
                *lock(&link) = Some(stream);
                // The profiler never writes: end of input means it is done.
                let mut byte = [0u8; 1];
                while matches!(reader.read(&mut byte), Ok(n) if n > 0) {}
                if let Some(s) = lock(&link).take() {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
        });
}

// ------------------------------------------------------------ the C ABI

/// The process's one device, made on first use.
static DEVICE: Mutex<Option<SimDevice>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut SimDevice) -> T) -> T {
    let mut d = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    f(d.get_or_insert_with(|| SimDevice::connect("gs_simgpu")))
}

/// Launches a kernel of `kernel_ns` on the simulated device, the call
/// costing `cost_ns` of host time; sends the records. Returns when the
/// kernel will end (CLOCK_MONOTONIC ns).
#[no_mangle]
pub extern "C" fn gs_simgpu_launch(kernel_ns: u64, cost_ns: u64) -> u64 {
    with(|d| {
        d.launch(kernel_ns, cost_ns);
        d.flush();
        d.free_at
    })
}

/// cudaStreamSynchronize: returns once the device's queue is empty.
#[no_mangle]
pub extern "C" fn gs_simgpu_synchronize() {
    with(|d| {
        d.synchronize();
        d.flush();
    })
}

/// The device's busy time so far, ns (ground truth for tests).
#[no_mangle]
pub extern "C" fn gs_simgpu_busy_ns() -> u64 {
    with(|d| intervals_total(&d.busy))
}

/// Waits for the device, says goodbye to gapscope, and forgets the device.
#[no_mangle]
pub extern "C" fn gs_simgpu_close() {
    let mut d = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(mut dev) = d.take() {
        sleep_until(dev.free_at);
        dev.goodbye();
    }
}

/// Possibly overlapping spans as disjoint ones, in order (ground truth's
/// own, not gapscope's).
pub fn union(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut spans = spans.to_vec();
    union_in_place(&mut spans);
    spans
}

/// [`union`] without new memory: a launch-bound run's 90k spans, copied at
/// exit, cost tens of ms of page faults inside the recorded run on a VM
/// (more than the launches a fix takes away leave of the run).
pub fn union_in_place(spans: &mut Vec<(u64, u64)>) {
    // (The device's come in order: no sorting 90k of them in a debug build.)
    if !spans.is_sorted() {
        spans.sort_unstable();
    }
    let mut n = 0;
    for i in 0..spans.len() {
        let (s, e) = spans[i];
        if n > 0 && s <= spans[n - 1].1 {
            spans[n - 1].1 = spans[n - 1].1.max(e);
        } else {
            spans[n] = (s, e);
            n += 1;
        }
    }
    spans.truncate(n);
}

/// The total length of possibly overlapping spans.
pub fn intervals_total(spans: &[(u64, u64)]) -> u64 {
    union(spans).iter().map(|(s, e)| e - s).sum()
}
