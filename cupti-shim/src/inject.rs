//! The shim inside the CUDA process. The driver calls `InitializeInjection`
//! when `CUDA_INJECTION64_PATH` names this library (NVTX calls
//! `InitializeInjectionNvtx2` when `NVTX_INJECTION64_PATH` does, see
//! `nvtx.rs`). From then on:
//!
//! - with `GAPSCOPE_SOCKET` set (gapscope run), it connects and records at once;
//! - otherwise it listens on its control socket and stays **dormant** until
//!   `gapscope attach` connects. Dormant means CUPTI is not touched at all:
//!   no callbacks, no thread-id type, no timestamp clock — CUPTI 13 has one
//!   activity client per process, and a later torch.profiler must find it
//!   exactly as it would without us;
//! - CUPTI is shared, never fought over. If another client (torch.profiler's
//!   Kineto, Nsight) holds CUPTI when recording would start, or takes it over
//!   while we record, the shim stands back — touches nothing the other client
//!   set — and tells the profiler which span it cannot see and why (a Blind
//!   frame), so that span is lost, never idle;
//! - when the profiler leaves, activity is disabled and flushed; at exit the
//!   GPU gets time to finish what is queued before a forced flush.
//!
//! `gapscope attach` brings the shim into a running process and calls
//! `gapscope_injected` instead, with the libcupti to use (or none): an
//! injected shim takes no setting from the process's environment, which
//! may be a less trusted user's (a setuid program's), and neither does one
//! in a process the kernel marks secure (`AT_SECURE`).
//!
//! Every `extern "C"` entry catches panics: nothing unwinds into the driver,
//! and a failure leaves the shim doing nothing rather than the job failing.

use std::ffi::{c_char, c_int, CStr};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use cudarc::cupti::sys;

use crate::activity::{self, Decoded};
use crate::clock::monotonic_ns as now_monotonic;
use crate::loader::{self, Cupti, CUPTI_SUCCESS};
use crate::protocol::{self, ClockMethod, Frame, Hello, RecordsFrame, VERSION};
use crate::record::GpuRecord;
use crate::transport::{self, Transport};

/// Activity kinds recorded while a profiler listens. NVTX is not among
/// them: it comes through NVTX's own injection (`nvtx.rs`), because routing
/// NVTX to CUPTI makes CUPTI take the one callback subscriber slot.
const KINDS: &[u32] = &[
    activity::KIND_CONCURRENT_KERNEL,
    activity::KIND_MEMCPY,
    activity::KIND_MEMSET,
    activity::KIND_SYNCHRONIZATION,
    activity::KIND_RUNTIME,
    activity::KIND_DRIVER,
];

/// CUDA calls PyTorch (and Triton, NCCL's watchdog) make around every op
/// to keep its bookkeeping: thousands per second, none of them GPU work or
/// a wait. Recording them costs the job time in every call and fills the
/// session with noise, so they are switched off where CUPTI allows it — the
/// same calls Kineto leaves out, and their neighbours of the same kind.
const QUIET_RUNTIME: &[u32] = &[
    3,   // cudaGetDeviceCount
    10,  // cudaGetLastError
    11,  // cudaPeekAtLastError
    15,  // cudaFuncGetAttributes
    16,  // cudaSetDevice
    17,  // cudaGetDevice
    200, // cudaDeviceGetAttribute
    317, // cudaStreamIsCapturing
    318, // cudaStreamIsCapturing (ptsz)
];
const QUIET_DRIVER: &[u32] = &[
    16,  // cuCtxGetDevice
    85,  // cuFuncGetAttribute
    303, // cuCtxSetCurrent
    304, // cuCtxGetCurrent
    392, // cuDevicePrimaryCtxGetState
    626, // cuGetProcAddress
    677, // cuGetProcAddress (v2)
    686, // cuKernelGetAttribute
    795, // cuCtxGetDevice (v2)
];

/// Records CUPTI puts in one buffer of ours before handing it back. Small
/// on purpose: when torch.profiler takes CUPTI over, CUPTI goes on filling
/// the buffer it already had from us and then hands it to torch.profiler,
/// which cannot read a buffer it did not allocate. What its trace can miss
/// is at most this many records, at its very start.
const RECORDS_PER_BUFFER: usize = 512;
/// Room for RECORDS_PER_BUFFER of the largest record read (CUDA 13's
/// kernel record is under 256 bytes).
const BUFFER_SIZE: usize = 128 << 10;
/// Buffers handed to CUPTI at once (8 MiB); past this CUPTI drops and counts.
const MAX_BUFFERS: usize = 64;
/// CUPTI older than API 27 can crash on a refused buffer: it gets buffers
/// up to this cap, and past it recording stops (and says so) instead.
const MAX_BUFFERS_OLD_CUPTI: usize = 256;
/// Records frames are cut at this many payload bytes.
const FRAME_TARGET: usize = 1 << 20;
const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// Longest the shim waits for the GPU to drain at exit before a forced
/// flush, and the quiet period that ends the wait early.
const EXIT_DRAIN: Duration = Duration::from_millis(1500);
const EXIT_QUIET: Duration = Duration::from_millis(50);
/// Timestamps this far from "now" cannot be CLOCK_MONOTONIC: the timestamp
/// callback was replaced (Kineto registers its own TSC clock).
const CLOCK_SLACK_NS: u64 = 2_000_000_000;
/// NVTX ranges waiting for the next flush, at most.
const MAX_PENDING_RANGES: usize = 100_000;

/// What the shim is doing with CUPTI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum State {
    /// Nothing registered, nothing enabled.
    Dormant = 0,
    /// Our callbacks and clock registered, our kinds enabled.
    Recording = 1,
    /// Another client holds CUPTI: we touch nothing and report the span.
    Blind = 2,
}

struct Shim {
    pid: u32,
    driver: AtomicU64,
    /// Loaded at the first recording, never before: a dormant shim does not
    /// even load libcupti.
    cupti: OnceLock<Result<Cupti, String>>,
    clock: Mutex<ClockMethod>,
    clock_offset: AtomicI64,
    link: Mutex<Option<Transport>>,
    /// A profiler is connected (NVTX ranges are wanted).
    listening: AtomicBool,
    state: AtomicU8,
    outstanding: AtomicUsize,
    /// Buffers CUPTI holds (handed out, not yet completed).
    in_cupti: AtomicI64,
    pool: Mutex<Vec<usize>>, // buffer addresses, kept as integers to be Send
    /// CUPTI < 27 needed more buffers than we give: stop at the next tick.
    overloaded: AtomicBool,
    cupti_dropped: AtomicU64,
    unknown: AtomicU64,
    incomplete: AtomicU64,
    /// When recording (re)started, and the latest record end seen since.
    since: AtomicU64,
    last_end: AtomicU64,
    /// Buffers completed to us, ever: the exit drain watches it move.
    completions: AtomicU64,
    /// Records timed off CLOCK_MONOTONIC: someone replaced our clock.
    foreign_clock: AtomicU64,
    devices_sent: AtomicBool,
    ranges: Mutex<Vec<GpuRecord>>,
    ranges_dropped: AtomicU64,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

/// The shim's sockets, for a forked child to close: a DataLoader worker
/// forked from the job inherits them, and holding the profiler's end open
/// would keep it waiting for an end of stream long after the job exited.
/// Plain atomics: a child of fork() may not take a lock.
static LINK_FD: AtomicI32 = AtomicI32::new(-1);
static READER_FD: AtomicI32 = AtomicI32::new(-1);
static LISTEN_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn close_in_child() {
    for fd in [&LINK_FD, &READER_FD, &LISTEN_FD] {
        let fd = fd.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: an fd this process inherited and will never use.
            unsafe { libc::close(fd) };
        }
    }
}

extern "C" fn monotonic_timestamp() -> u64 {
    now_monotonic()
}

/// Set when `gapscope attach` brought the shim in: the libcupti it named,
/// if any.
static INJECTED: OnceLock<Option<String>> = OnceLock::new();

/// Called by the loader stub of `gapscope attach` once the shim is mapped
/// (in place of the driver's `InitializeInjection`), with the libcupti to
/// use or an empty string. Always reports success, as that one does.
#[no_mangle]
pub extern "C" fn gapscope_injected(cupti: *const c_char) -> c_int {
    let _ = catch_unwind(|| {
        let path = (!cupti.is_null())
            // SAFETY: the stub passes a NUL-terminated string in its page.
            .then(|| {
                unsafe { CStr::from_ptr(cupti) }
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|p| !p.is_empty());
        let _ = INJECTED.set(path);
        init();
    });
    1
}

/// A setting from the process's environment, where one may be taken: not
/// in a shim `gapscope attach` brought in, nor in a setuid or otherwise
/// secure process (glibc's `secure_getenv` rule).
pub(crate) fn setting(name: &str) -> Option<String> {
    // SAFETY: getauxval has no preconditions.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    if INJECTED.get().is_some() || secure {
        return None;
    }
    std::env::var(name).ok()
}

/// The libcupti named for this process: by `gapscope attach`'s injector,
/// or `GAPSCOPE_CUPTI` where the environment may be read.
pub(crate) fn named_cupti() -> Option<String> {
    match INJECTED.get() {
        Some(named) => named.clone(),
        None => setting("GAPSCOPE_CUPTI"),
    }
}

/// Called by the CUDA driver inside `cuInit`. Only cheap, local work
/// happens here — no driver calls (re-entering the driver during its own
/// initialisation can deadlock it), no blocking beyond a bounded connect.
/// Always reports success: a shim that cannot work must not stop the job.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    let _ = catch_unwind(init);
    1
}

fn init() {
    if SHIM.get().is_some() {
        return;
    }
    let shim = Shim {
        pid: std::process::id(),
        driver: AtomicU64::new(0),
        cupti: OnceLock::new(),
        clock: Mutex::new(ClockMethod::TimestampCallback),
        clock_offset: AtomicI64::new(0),
        link: Mutex::new(None),
        listening: AtomicBool::new(false),
        state: AtomicU8::new(State::Dormant as u8),
        outstanding: AtomicUsize::new(0),
        in_cupti: AtomicI64::new(0),
        pool: Mutex::new(Vec::new()),
        overloaded: AtomicBool::new(false),
        cupti_dropped: AtomicU64::new(0),
        unknown: AtomicU64::new(0),
        incomplete: AtomicU64::new(0),
        since: AtomicU64::new(0),
        last_end: AtomicU64::new(0),
        completions: AtomicU64::new(0),
        foreign_clock: AtomicU64::new(0),
        devices_sent: AtomicBool::new(false),
        ranges: Mutex::new(Vec::new()),
        ranges_dropped: AtomicU64::new(0),
    };
    if SHIM.set(shim).is_err() {
        return;
    }
    // SAFETY: registering a handler that only closes fds (async-signal-safe).
    unsafe { libc::pthread_atfork(None, None, Some(close_in_child)) };
    match setting("GAPSCOPE_SOCKET").ok_or(()) {
        Ok(name) => match transport::connect(&name) {
            Ok(stream) => {
                LINK_FD.store(stream.as_raw_fd(), Ordering::SeqCst);
                attach_profiler(Transport::start(stream))
            }
            Err(_) => listen(),
        },
        Err(_) => listen(),
    }
    let _ = std::thread::Builder::new()
        .name("gapscope-flush".into())
        .spawn(|| loop {
            std::thread::sleep(FLUSH_EVERY);
            let _ = catch_unwind(periodic);
        });
}

fn shim() -> Option<&'static Shim> {
    let s = SHIM.get()?;
    // A forked child (a DataLoader worker) inherits the memory but not the
    // threads or the CUDA context: it must stay silent.
    (s.pid == std::process::id()).then_some(s)
}

impl Shim {
    fn state(&self) -> State {
        match self.state.load(Ordering::SeqCst) {
            1 => State::Recording,
            2 => State::Blind,
            _ => State::Dormant,
        }
    }

    fn set_state(&self, st: State) {
        self.state.store(st as u8, Ordering::SeqCst);
    }

    fn cupti(&self) -> Option<&Cupti> {
        self.cupti.get().and_then(|c| c.as_ref().ok())
    }

    fn driver(&self) -> u32 {
        let mut v = self.driver.load(Ordering::Relaxed) as u32;
        if v == 0 {
            v = loader::driver_version();
            self.driver.store(v as u64, Ordering::Relaxed);
        }
        v
    }

    /// Loads libcupti the first time it is needed. The exit handler is
    /// registered right after, so that it runs before CUPTI's own teardown
    /// (handlers run in reverse order of registration).
    /// The loader's note, if any, comes back once, for the first hello.
    fn load_cupti(&self) -> (Option<&Cupti>, Option<String>) {
        static AT_EXIT: Once = Once::new();
        let mut note = None;
        let loaded = self.cupti.get_or_init(|| {
            Cupti::load(self.driver()).map(|(c, n)| {
                note = n;
                c
            })
        });
        AT_EXIT.call_once(|| {
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(at_exit) };
        });
        (loaded.as_ref().ok(), note)
    }
}

fn send(frame: &Frame, records: u64) {
    let Some(s) = shim() else { return };
    let mut bytes = Vec::new();
    protocol::encode(frame, &mut bytes);
    send_raw(s, bytes, records, None);
}

fn send_raw(s: &Shim, frame: Vec<u8>, records: u64, span: Option<(u64, u64)>) {
    if let Some(link) = s.link.lock().ok().as_ref().and_then(|l| l.as_ref()) {
        link.send(frame, records, span);
    }
}

/// A profiler connected: introduce ourselves and start recording, unless
/// another CUPTI client holds CUPTI.
fn attach_profiler(link: Transport) {
    let Some(s) = shim() else { return };
    if let Ok(mut l) = s.link.lock() {
        *l = Some(link);
    }
    s.listening.store(true, Ordering::SeqCst);
    let (cupti, note) = s.load_cupti();
    let holder = cupti.and_then(other_client);
    // The clock is set up before the hello so that the hello says the one
    // in use (a CUPTI may refuse the timestamp callback); when not
    // recording, the one recording would use.
    let clock = match (cupti, &holder) {
        (Some(c), None) => use_clock(s, c),
        (Some(c), Some(_)) if c.cuptiActivityRegisterTimestampCallback.is_none() => {
            ClockMethod::MeasuredOffset
        }
        _ => ClockMethod::TimestampCallback,
    };
    let hello = Hello {
        version: VERSION,
        pid: s.pid,
        driver_version: s.driver(),
        cupti_version: cupti.map(|c| c.version).unwrap_or(0),
        clock,
        source: format!("gapscope-cupti {}", env!("CARGO_PKG_VERSION")),
    };
    send(&Frame::Hello(hello), 0);
    if let Some(n) = note {
        send(&Frame::Info(n), 0);
    }
    let Some(c) = cupti else {
        let why = match s.cupti.get() {
            Some(Err(why)) => why.clone(),
            _ => "libcupti not loaded".into(),
        };
        send(
            &Frame::Info(format!("no GPU timeline from pid {}: {why}", s.pid)),
            0,
        );
        return;
    };
    send(
        &Frame::Info(format!("CUPTI {} from {}", version_text(c.version), c.path)),
        0,
    );
    match holder {
        Some(holder) => go_blind(s, now_monotonic(), &holder),
        None => start_recording(s, c),
    }
}

/// "13.0.1 (API version 130001)" for CUPTI 13; older CUPTIs count API
/// versions only (18 and up).
fn version_text(v: u32) -> String {
    if v >= 100_000 {
        format!(
            "{}.{}.{} (API version {v})",
            v / 10_000,
            v / 100 % 100,
            v % 100
        )
    } else {
        format!("API version {v}")
    }
}

/// Whether another CUPTI client holds the callback subscriber slot, by
/// taking and releasing it at once. CUPTI 13 allows one subscriber, and
/// every profiler (Kineto, Nsight, CUPTI's own NVTX injection) subscribes
/// before it traces: a taken slot means someone else is, or may be,
/// tracing. Our probe holds the slot for microseconds only.
fn other_client(c: &Cupti) -> Option<String> {
    let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: subscribe with no callback, then release at once.
    let rc = unsafe { (c.cuptiSubscribe)(&mut handle, None, std::ptr::null_mut()) };
    if rc == CUPTI_SUCCESS {
        // SAFETY: releasing the handle just obtained.
        unsafe { (c.cuptiUnsubscribe)(handle) };
        None
    } else if rc == loader::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED {
        Some(
            "another CUPTI client holds CUPTI in this process (torch.profiler, Nsight Systems \
             or a CUPTI NVTX injection): gapscope stands back so that its trace stays whole"
                .into(),
        )
    } else {
        None
    }
}

/// Registers our callbacks, then enables our kinds and quiets the
/// bookkeeping calls. The clock must be in place first ([`use_clock`]):
/// CUPTI wants a timestamp callback registered before any kind is enabled.
fn start_recording(s: &Shim, c: &Cupti) {
    // SAFETY: registering our extern "C" callbacks with CUPTI.
    let rc = unsafe {
        (c.cuptiActivityRegisterCallbacks)(Some(buffer_requested), Some(buffer_completed))
    };
    if rc != CUPTI_SUCCESS {
        send(
            &Frame::Info(format!(
                "CUPTI ({}) refused activity callbacks (CUPTI error {rc}{}); no GPU timeline from this process",
                c.path,
                if rc == loader::CUPTI_ERROR_NOT_INITIALIZED { ": not initialized" } else { "" }
            )),
            0,
        );
        return;
    }
    if let Some(set) = c.cuptiSetThreadIdType {
        // SAFETY: plain CUPTI call.
        if unsafe { set(loader::THREAD_ID_TYPE_SYSTEM) } != CUPTI_SUCCESS {
            send(
                &Frame::Info(
                    "CUPTI could not report system thread ids: CUDA API calls cannot be tied to host threads"
                        .into(),
                ),
                0,
            );
        }
    }
    let mut refused = Vec::new();
    for &k in KINDS {
        // SAFETY: plain CUPTI call with a kind value.
        let rc = unsafe { (c.cuptiActivityEnable)(k) };
        if rc != CUPTI_SUCCESS {
            refused.push(format!("kind {k}: error {rc}"));
        }
    }
    quiet_bookkeeping(c);
    if !refused.is_empty() {
        send(
            &Frame::Info(format!(
                "CUPTI {} would not enable some activity ({}){}",
                c.path,
                refused.join(", "),
                if refused.len() == KINDS.len() {
                    "; no GPU timeline from this process (no driver or GPU?)"
                } else {
                    ""
                }
            )),
            0,
        );
    }
    let now = now_monotonic();
    s.since.store(now, Ordering::SeqCst);
    s.last_end.store(0, Ordering::SeqCst);
    s.foreign_clock.store(0, Ordering::SeqCst);
    s.set_state(State::Recording);
    // From here on the GPU is seen: a profiler that attached to a dormant
    // shim counts the time before as unseen, not idle.
    send(&Frame::Sighted { at: now }, 0);
}

fn quiet_bookkeeping(c: &Cupti) {
    if let Some(f) = c.cuptiActivityEnableRuntimeApi {
        for &cbid in QUIET_RUNTIME {
            // SAFETY: plain CUPTI call; an unknown id is refused, not fatal.
            unsafe { f(cbid, 0) };
        }
    }
    if let Some(f) = c.cuptiActivityEnableDriverApi {
        for &cbid in QUIET_DRIVER {
            // SAFETY: as above.
            unsafe { f(cbid, 0) };
        }
    }
    if let Some(f) = c.cuptiActivityEnableAllSyncRecords {
        // SAFETY: plain CUPTI call.
        unsafe { f(0) };
    }
}

/// CLOCK_MONOTONIC timestamps: CUPTI's timestamp callback where it exists,
/// else an offset from CUPTI's clock measured now (best of several reads)
/// and again at every flush, since CUPTI's default clock (CLOCK_REALTIME)
/// is stepped and slewed by NTP over a long run.
fn use_clock(s: &Shim, c: &Cupti) -> ClockMethod {
    let registered = c
        .cuptiActivityRegisterTimestampCallback
        .is_some_and(|register| {
            // SAFETY: registering a plain extern "C" fn() -> u64.
            unsafe { register(Some(monotonic_timestamp)) == CUPTI_SUCCESS }
        });
    let (method, offset) = if registered {
        (ClockMethod::TimestampCallback, 0)
    } else {
        (ClockMethod::MeasuredOffset, measure_offset(c))
    };
    if let Ok(mut m) = s.clock.lock() {
        *m = method;
    }
    s.clock_offset.store(offset, Ordering::Relaxed);
    method
}

fn measure_offset(c: &Cupti) -> i64 {
    crate::clock::monotonic_minus(|| {
        let mut cupti_ts = 0u64;
        // SAFETY: cuptiGetTimestamp writes one u64.
        unsafe { (c.cuptiGetTimestamp)(&mut cupti_ts) };
        cupti_ts
    })
}

/// Another client holds CUPTI: from `start` on we see nothing. Nothing is
/// disabled or flushed — those are the other client's now.
fn go_blind(s: &Shim, start: u64, reason: &str) {
    s.set_state(State::Blind);
    send(
        &Frame::Blind {
            start,
            reason: reason.to_string(),
        },
        0,
    );
}

/// The profiler left (or the process is exiting): stop recording, flush
/// what CUPTI holds, say goodbye.
fn detach_profiler(wait: Duration, exiting: bool) {
    let Some(s) = shim() else { return };
    if s.state() == State::Recording {
        if let Some(c) = s.cupti() {
            if exiting {
                drain(s, c);
            } else {
                for &k in KINDS {
                    // SAFETY: plain CUPTI calls.
                    unsafe { (c.cuptiActivityDisable)(k) };
                }
                drain(s, c);
                // Leave CUPTI's clock as we found it: a torch.profiler
                // started later must not get our timestamps.
                if let Some(register) = c.cuptiActivityRegisterTimestampCallback {
                    // SAFETY: None restores CUPTI's default clock.
                    unsafe { register(None) };
                }
            }
            send_devices(s);
        }
    }
    s.set_state(State::Dormant);
    s.listening.store(false, Ordering::SeqCst);
    send_ranges(s);
    send_counts(s);
    send(&Frame::Goodbye, 0);
    LINK_FD.store(-1, Ordering::SeqCst);
    READER_FD.store(-1, Ordering::SeqCst);
    let link = s.link.lock().ok().and_then(|mut l| l.take());
    if let Some(link) = link {
        link.close(wait);
    }
}

/// Lets the GPU finish what is queued: plain flushes until CUPTI holds no
/// buffer of ours and a quiet period delivered nothing (or the drain time
/// is up), then a forced flush for what is still running. Its records come
/// back incomplete: they are counted, and the span after the last record
/// seen is reported lost rather than left to look idle.
fn drain(s: &Shim, c: &Cupti) {
    let deadline = Instant::now() + EXIT_DRAIN;
    loop {
        let before = s.completions.load(Ordering::SeqCst);
        // SAFETY: plain CUPTI call; 0 = completed records only.
        unsafe { (c.cuptiActivityFlushAll)(0) };
        std::thread::sleep(EXIT_QUIET);
        // SAFETY: as above.
        unsafe { (c.cuptiActivityFlushAll)(0) };
        let quiet = s.completions.load(Ordering::SeqCst) == before;
        let held = s.in_cupti.load(Ordering::SeqCst) > 0;
        if (quiet && !held) || Instant::now() >= deadline {
            break;
        }
    }
    let incomplete = s.incomplete.load(Ordering::SeqCst);
    // SAFETY: 1 = CUPTI_ACTIVITY_FLAG_FLUSH_FORCED.
    unsafe { (c.cuptiActivityFlushAll)(1) };
    let cut = s.incomplete.load(Ordering::SeqCst) - incomplete;
    if cut > 0 {
        let now = now_monotonic();
        let last = s.last_end.load(Ordering::SeqCst);
        send(
            &Frame::Lost {
                start: if last > 0 { last.min(now) } else { now },
                end: now,
                records: cut,
            },
            0,
        );
    }
}

fn send_counts(s: &Shim) {
    let shim_dropped = s
        .link
        .lock()
        .ok()
        .and_then(|l| l.as_ref().map(Transport::dropped))
        .unwrap_or(0)
        + s.ranges_dropped.load(Ordering::Relaxed);
    send(
        &Frame::Dropped {
            cupti: s.cupti_dropped.load(Ordering::Relaxed),
            shim: shim_dropped,
        },
        0,
    );
    send(
        &Frame::Skipped {
            incomplete: s.incomplete.load(Ordering::Relaxed),
            unknown: s.unknown.load(Ordering::Relaxed),
        },
        0,
    );
}

/// Waits for `gapscope attach` on the control socket, one profiler at a time.
fn listen() {
    let Some(s) = shim() else { return };
    let Ok(listener) = transport::listen(&transport::local_control_socket_name(s.pid)) else {
        return;
    };
    LISTEN_FD.store(listener.as_raw_fd(), Ordering::SeqCst);
    let _ = std::thread::Builder::new()
        .name("gapscope-listen".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    // Only our own user (or root) may switch recording on.
                    // SAFETY: getuid has no preconditions.
                    let me = unsafe { libc::getuid() };
                    match transport::peer_uid(&stream) {
                        Some(uid) if uid == me || uid == 0 => {}
                        _ => return,
                    }
                    let Ok(mut reader) = stream.try_clone() else {
                        return;
                    };
                    LINK_FD.store(stream.as_raw_fd(), Ordering::SeqCst);
                    READER_FD.store(reader.as_raw_fd(), Ordering::SeqCst);
                    attach_profiler(Transport::start(stream));
                    // The profiler never writes: end of input (or an error)
                    // means it is done, or gone.
                    let mut byte = [0u8; 1];
                    while matches!(std::io::Read::read(&mut reader, &mut byte), Ok(n) if n > 0) {}
                    detach_profiler(Duration::from_secs(2), false);
                }));
            }
        });
}

fn periodic() {
    let Some(s) = shim() else { return };
    if !s.listening.load(Ordering::SeqCst) {
        return;
    }
    let state = s.state();
    let connected = s
        .link
        .lock()
        .ok()
        .is_some_and(|l| l.as_ref().is_some_and(|t| t.is_connected()));
    if !connected {
        // The profiler is gone: stop paying for activity records.
        detach_profiler(Duration::from_millis(10), false);
        return;
    }
    send_ranges(s);
    let Some(c) = s.cupti() else { return };
    match state {
        State::Recording => {
            // Probe before flushing: once another client holds CUPTI, a
            // flush of ours would only hand it buffers it does not know.
            let taken = other_client(c).or_else(|| {
                // SAFETY: plain CUPTI call; 0 = flush completed buffers only.
                unsafe { (c.cuptiActivityFlushAll)(0) };
                let foreign = s.foreign_clock.swap(0, Ordering::SeqCst);
                (foreign > 0).then(|| {
                    format!(
                        "{foreign} GPU records came timed on another clock: another CUPTI client \
                         registered its own timestamp callback (torch.profiler does) and took CUPTI over"
                    )
                })
            });
            if let Some(why) = taken {
                // CUPTI hands buffers back in order, so whatever did not
                // reach us ran after the last record that did: lost from
                // there (a kernel still running at the last flush started
                // after it too, so the last flush is no bound).
                let last = s.last_end.load(Ordering::SeqCst);
                let start = if last > 0 {
                    last
                } else {
                    s.since.load(Ordering::SeqCst)
                };
                go_blind(s, start, &why);
                return;
            }
            if s.overloaded.load(Ordering::SeqCst) {
                stop_overloaded(s, c);
                return;
            }
            if s.clock
                .lock()
                .is_ok_and(|m| *m == ClockMethod::MeasuredOffset)
            {
                s.clock_offset.store(measure_offset(c), Ordering::Relaxed);
            }
            send_devices(s);
            send_counts(s);
        }
        State::Blind => {
            // The other client gave CUPTI back (unsubscribed): ours again.
            if other_client(c).is_none() {
                let at = now_monotonic();
                use_clock(s, c);
                start_recording(s, c);
                if s.state() == State::Recording {
                    send(&Frame::Sighted { at }, 0);
                }
            }
        }
        State::Dormant => {}
    }
}

/// The GPUs' names and UUIDs, once, as soon as CUDA works (a record came
/// back): the driver can be asked outside its initialisation then. Asked at
/// a periodic flush and, for a process that ends before one found a record,
/// at the last drain.
fn send_devices(s: &Shim) {
    if s.devices_sent.load(Ordering::Relaxed) || s.last_end.load(Ordering::Relaxed) == 0 {
        return;
    }
    s.devices_sent.store(true, Ordering::Relaxed);
    let devices: Vec<GpuRecord> = loader::device_names()
        .into_iter()
        .flat_map(|(id, name, uuid)| {
            let uuid = uuid.map(|uuid| GpuRecord::DeviceUuid { id, uuid });
            std::iter::once(GpuRecord::Device { id, name }).chain(uuid)
        })
        .collect();
    if !devices.is_empty() {
        send(&Frame::Records(devices), 0);
    }
}

/// CUPTI < 27 asked for more buffers than the cap: it cannot be refused
/// one safely, so recording stops here, said as a blind span.
fn stop_overloaded(s: &Shim, c: &Cupti) {
    for &k in KINDS {
        // SAFETY: plain CUPTI calls.
        unsafe { (c.cuptiActivityDisable)(k) };
    }
    // SAFETY: as above.
    unsafe { (c.cuptiActivityFlushAll)(0) };
    go_blind(
        s,
        now_monotonic(),
        &format!(
            "gapscope could not keep up and CUPTI {} (API < {}) cannot be refused a buffer \
             safely: GPU recording stopped here",
            version_text(c.version),
            loader::API_VERSION_REFUSES_SAFELY
        ),
    );
}

/// Whether a profiler is listening: NVTX handlers return at once when not.
/// NVTX ranges need no CUPTI: they are recorded whatever CUPTI's state.
pub(crate) fn recording() -> bool {
    shim().is_some_and(|s| s.listening.load(Ordering::Relaxed))
}

/// NVTX initialised (possibly before CUDA): start the shim as CUDA's
/// injection would, so that ranges have somewhere to go.
pub(crate) fn start_from_nvtx() {
    let _ = catch_unwind(init);
}

/// A completed NVTX range or mark, from the NVTX handlers: kept for the
/// next flush, so that a step-per-range job does not cost a frame per range.
pub(crate) fn record_nvtx(range: GpuRecord) {
    let Some(s) = shim() else { return };
    if let Ok(mut r) = s.ranges.lock() {
        if r.len() < MAX_PENDING_RANGES {
            r.push(range);
            return;
        }
    }
    s.ranges_dropped.fetch_add(1, Ordering::Relaxed);
}

fn send_ranges(s: &Shim) {
    let ranges = s
        .ranges
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    for chunk in ranges.chunks(4096) {
        let mut bytes = Vec::new();
        let mut frame = RecordsFrame::begin(&mut bytes);
        for r in chunk {
            frame.push(&mut bytes, r);
        }
        let span = frame.span();
        frame.finish(&mut bytes);
        send_raw(s, bytes, chunk.len() as u64, span);
    }
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| detach_profiler(Duration::from_secs(2), true));
}

// ------------------------------------------------------------ CUPTI buffers

extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let got = catch_unwind(|| {
        let s = shim()?;
        let b = take_buffer(s)?;
        s.in_cupti.fetch_add(1, Ordering::SeqCst);
        Some(b)
    })
    .ok()
    .flatten();
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *max_records = RECORDS_PER_BUFFER;
        match got {
            Some(p) => {
                *buffer = p;
                *size = BUFFER_SIZE;
            }
            None => {
                // Size 0 makes CUPTI drop records (and count them) instead
                // of this process growing without bound.
                *buffer = std::ptr::null_mut();
                *size = 0;
            }
        }
    }
}

fn take_buffer(s: &Shim) -> Option<*mut u8> {
    if let Some(p) = s.pool.lock().ok()?.pop() {
        return Some(p as *mut u8);
    }
    let refuses_safely = s
        .cupti()
        .is_some_and(|c| c.version >= loader::API_VERSION_REFUSES_SAFELY);
    let cap = if refuses_safely {
        MAX_BUFFERS
    } else {
        MAX_BUFFERS_OLD_CUPTI
    };
    if s.outstanding.fetch_add(1, Ordering::SeqCst) >= cap {
        if refuses_safely {
            s.outstanding.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // Refusing would crash this CUPTI: give one more and stop at the
        // next tick.
        s.overloaded.store(true, Ordering::SeqCst);
    }
    // u64 storage: CUPTI wants 8-byte aligned buffers.
    let storage = vec![0u64; BUFFER_SIZE / 8].into_boxed_slice();
    Some(Box::into_raw(storage) as *mut u64 as *mut u8)
}

extern "C" fn buffer_completed(
    ctx: *mut std::ffi::c_void,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(s) = SHIM.get() else { return };
        if buffer.is_null() {
            return;
        }
        if shim().is_some() {
            if let Some(c) = s.cupti() {
                s.in_cupti.fetch_sub(1, Ordering::SeqCst);
                s.completions.fetch_add(1, Ordering::SeqCst);
                read_buffer(s, c, ctx, stream, buffer, valid);
            }
        }
        if let Ok(mut pool) = s.pool.lock() {
            pool.push(buffer as usize);
        }
    }));
}

fn read_buffer(
    s: &Shim,
    c: &Cupti,
    ctx: *mut std::ffi::c_void,
    stream: u32,
    buffer: *mut u8,
    valid: usize,
) {
    let records = CuptiRecords {
        cupti: c,
        buffer,
        valid,
        cur: std::ptr::null_mut(),
        done: false,
    };
    let offset = s.clock_offset.load(Ordering::Relaxed);
    let now = now_monotonic();
    let plausible = s
        .since
        .load(Ordering::Relaxed)
        .saturating_sub(CLOCK_SLACK_NS)..=now.saturating_add(CLOCK_SLACK_NS);
    let mut last_end: Option<u64> = None;
    // SAFETY: the records come from a buffer CUPTI filled and walks itself.
    let counts = unsafe {
        encode_records(records, offset, s.pid, plausible, &mut |frame, n, span| {
            if let Some((_, e)) = span {
                last_end = Some(last_end.map_or(e, |l| l.max(e)));
            }
            send_raw(s, frame, n, span)
        })
    };
    s.unknown.fetch_add(counts.unknown, Ordering::Relaxed);
    s.incomplete.fetch_add(counts.incomplete, Ordering::Relaxed);
    if counts.foreign > 0 {
        s.foreign_clock.fetch_add(counts.foreign, Ordering::SeqCst);
    }
    if let Some(e) = last_end {
        s.last_end.fetch_max(e, Ordering::SeqCst);
    }
    let mut dropped = 0usize;
    // SAFETY: CUPTI call with the context and stream it gave us.
    if unsafe { (c.cuptiActivityGetNumDroppedRecords)(ctx, stream, &mut dropped) } == CUPTI_SUCCESS
    {
        s.cupti_dropped.fetch_add(dropped as u64, Ordering::Relaxed);
        if let Some(lost) = cupti_loss(last_end, now_monotonic(), dropped as u64) {
            send(&lost, 0);
        }
    }
}

/// What CUPTI's drops in a buffer cover: it drops records once the buffer
/// is full, so they happened after its last record and before it came back
/// to us (`now`); with no record to go by, only `now` is known.
fn cupti_loss(last_end: Option<u64>, now: u64, dropped: u64) -> Option<Frame> {
    (dropped > 0).then(|| {
        let start = last_end.unwrap_or(now).min(now);
        Frame::Lost {
            start,
            end: now,
            records: dropped,
        }
    })
}

/// One step of walking a buffer.
pub(crate) enum Walked {
    Record(*const u8),
    /// A record CUPTI refused to hand over (incomplete or invalid); the
    /// walk goes on past it.
    Bad,
}

/// Iterates a completed buffer with cuptiActivityGetNextRecord. An error
/// other than "no more records" is one bad record when CUPTI moved its
/// cursor past it (the rest of the buffer is still read), and the end of
/// the walk when it did not (counted as one record lost).
struct CuptiRecords<'a> {
    cupti: &'a Cupti,
    buffer: *mut u8,
    valid: usize,
    cur: *mut sys::CUpti_Activity,
    done: bool,
}

impl Iterator for CuptiRecords<'_> {
    type Item = Walked;
    fn next(&mut self) -> Option<Walked> {
        if self.done {
            return None;
        }
        let before = self.cur;
        // SAFETY: CUPTI walks the buffer it filled; `cur` is its cursor.
        let rc = unsafe {
            (self.cupti.cuptiActivityGetNextRecord)(self.buffer, self.valid, &mut self.cur)
        };
        if rc == CUPTI_SUCCESS && !self.cur.is_null() {
            return Some(Walked::Record(self.cur as *const u8));
        }
        if rc == loader::CUPTI_ERROR_MAX_LIMIT_REACHED || rc == CUPTI_SUCCESS {
            self.done = true;
            return None;
        }
        if self.cur.is_null() || self.cur == before {
            self.done = true;
        }
        Some(Walked::Bad)
    }
}

/// What a buffer held besides the records passed on.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct BufferCounts {
    /// Records of kinds not read.
    pub unknown: u64,
    /// Records CUPTI delivered incomplete or refused.
    pub incomplete: u64,
    /// Records timed outside `plausible`: on another client's clock.
    pub foreign: u64,
}

/// Decodes records into Records frames of bounded size, handing each frame
/// (its record count, and the time it covers) to `emit`. Records timed
/// outside `plausible` are on some other clock (another client replaced
/// the timestamp callback): counted, never passed on as times. This is the
/// shim's whole buffer handling, shared by the CUPTI path and the tests.
///
/// # Safety
/// Every `Walked::Record` pointer must point to a complete activity record
/// as CUPTI delivers it, valid for the duration of the call, with any name
/// pointers in it valid (see [`activity::decode`]).
pub(crate) unsafe fn encode_records(
    records: impl Iterator<Item = Walked>,
    clock_offset: i64,
    pid: u32,
    plausible: std::ops::RangeInclusive<u64>,
    emit: &mut dyn FnMut(Vec<u8>, u64, Option<(u64, u64)>),
) -> BufferCounts {
    let mut counts = BufferCounts::default();
    let mut out = Vec::with_capacity(FRAME_TARGET + 4096);
    let mut frame = RecordsFrame::begin(&mut out);
    for rec in records {
        let Walked::Record(rec) = rec else {
            counts.incomplete += 1;
            continue;
        };
        // SAFETY: the caller vouches for the record.
        match activity::decode(rec, clock_offset, pid) {
            Decoded::Record(r) => match r.span() {
                Some((a, e)) if !plausible.contains(&a) || !plausible.contains(&e) => {
                    counts.foreign += 1
                }
                _ => frame.push(&mut out, &r),
            },
            Decoded::Skipped(_) => counts.unknown += 1,
            Decoded::Incomplete(_) => counts.incomplete += 1,
        }
        if frame.len(&out) >= FRAME_TARGET {
            let (n, span) = (frame.count() as u64, frame.span());
            frame.finish(&mut out);
            emit(std::mem::take(&mut out), n, span);
            frame = RecordsFrame::begin(&mut out);
        }
    }
    if !frame.is_empty() {
        let (n, span) = (frame.count() as u64, frame.span());
        frame.finish(&mut out);
        emit(out, n, span);
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::tests::{kernel, memcpy, SyntheticBuffer};
    use crate::protocol::Decoder;

    #[test]
    fn cupti_drops_cover_the_end_of_the_buffer_to_its_return() {
        assert_eq!(cupti_loss(Some(100), 500, 0), None);
        assert_eq!(
            cupti_loss(Some(100), 500, 7),
            Some(Frame::Lost {
                start: 100,
                end: 500,
                records: 7
            })
        );
        // A record timed after `now` (an offset clock) never makes a
        // reversed span.
        assert_eq!(
            cupti_loss(Some(900), 500, 1),
            Some(Frame::Lost {
                start: 500,
                end: 500,
                records: 1
            })
        );
        assert_eq!(
            cupti_loss(None, 500, 2),
            Some(Frame::Lost {
                start: 500,
                end: 500,
                records: 2
            })
        );
    }

    #[test]
    fn cupti_13_versions_read_as_releases() {
        assert_eq!(version_text(130001), "13.0.1 (API version 130001)");
        assert_eq!(version_text(130400), "13.4.0 (API version 130400)");
        assert_eq!(version_text(26), "API version 26");
    }

    #[test]
    fn buffer_handling_turns_records_into_frames_and_counts_what_it_cannot_read() {
        let mut buf = SyntheticBuffer::new();
        for i in 0..10u64 {
            let k = kernel(&mut buf, 1 + i * 100, i * 100 + 50, i as u32);
            buf.push(&k);
        }
        buf.push(&memcpy(
            5_000,
            6_000,
            99,
            crate::record::memory_kind::PAGEABLE,
        ));
        // SAFETY: zeroed plain-data record.
        let mut ov: sys::CUpti_ActivityOverhead = unsafe { std::mem::zeroed() };
        ov.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_OVERHEAD;
        buf.push(&ov);
        let k = kernel(&mut buf, 0, 0, 100); // forced flush, still running
        buf.push(&k);
        // Timed on another client's clock (a TSC far from CLOCK_MONOTONIC).
        let k = kernel(&mut buf, 7_000_000_000, 7_000_000_100, 101);
        buf.push(&k);

        let mut frames = Vec::new();
        let walk = buf
            .records()
            .into_iter()
            .map(Walked::Record)
            // One record CUPTI refused mid-buffer: the rest is still read.
            .chain([Walked::Bad])
            .chain(std::iter::once(Walked::Record(buf.records()[0])));
        // SAFETY: pointers into the synthetic buffer, alive for the call.
        let counts = unsafe {
            encode_records(walk, 0, 1, 0..=1_000_000, &mut |f, n, span| {
                frames.push((f, n, span))
            })
        };
        assert_eq!(
            counts,
            BufferCounts {
                unknown: 1,
                incomplete: 2,
                foreign: 1,
            }
        );
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].1, 12);
        // What the frame covers, should it be dropped: first kernel start
        // to the copy's end.
        assert_eq!(frames[0].2, Some((1, 6_000)));
        let mut d = Decoder::new();
        d.push(&frames[0].0);
        let Some(Frame::Records(recs)) = d.next_frame().unwrap() else {
            panic!("not a records frame")
        };
        assert_eq!(recs.len(), 12);
        assert!(matches!(
            &recs[9],
            GpuRecord::Kernel {
                start: 901,
                end: 950,
                correlation: 9,
                ..
            }
        ));
        assert!(matches!(
            &recs[10],
            GpuRecord::Memcpy {
                correlation: 99,
                ..
            }
        ));
    }
}
