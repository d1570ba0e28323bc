//! libcupti_standin.so: NOT NVIDIA's CUPTI. It exports the CUPTI entry
//! points gapscope's shim binds, with CUDA 13.0 CUPTI's activity semantics,
//! and drives them from a simulated GPU stream, so the shim can be tested
//! through its whole life (injection, attach, flushes, a torch.profiler
//! taking over CUPTI, exit with work queued) on machines without a GPU.
//!
//! What is modelled, because real CUPTI behaves that way and the shim must
//! cope with it:
//! - one callback subscriber per process (39 for a second one);
//! - buffer and timestamp callbacks are process-global, and registering
//!   replaces them: completed buffers go to whoever is registered *now*,
//!   even buffers an earlier client handed out;
//! - a refused buffer drops the record and counts it per (context, stream),
//!   or crashes before API version 27 (CUPTI before 12.9 does);
//! - a forced flush delivers records of work still queued with zero
//!   timestamps, and cuptiActivityGetNextRecord reports them as INVALID_KIND;
//! - GPU timestamps on CLOCK_REALTIME unless a timestamp callback is set;
//! - a CUPTI thread that hands back buffers as soon as they are full.
//!
//! The application's side (the CUDA driver and the calls a PyTorch program
//! makes) is the `fakecupti_*` control API, used by gs-cuda-host.
#![allow(non_snake_case)]

mod control;
mod kineto;

pub use control::{Counts, KinetoStats};

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{c_char, c_void, CStr};
use std::mem::{offset_of, size_of, zeroed};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::cupti::sys;

pub const SUCCESS: u32 = 0;
pub const ERROR_INVALID_PARAMETER: u32 = 1;
pub const ERROR_INVALID_KIND: u32 = 6;
pub const ERROR_MAX_LIMIT_REACHED: u32 = 12;
pub const ERROR_NOT_INITIALIZED: u32 = 15;
pub const ERROR_NOT_SUPPORTED: u32 = 27;
pub const ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: u32 = 39;

pub const KIND_MEMCPY: u32 = 1;
pub const KIND_MEMSET: u32 = 2;
pub const KIND_KERNEL: u32 = 3;
pub const KIND_DRIVER: u32 = 4;
pub const KIND_RUNTIME: u32 = 5;
pub const KIND_CONCURRENT_KERNEL: u32 = 10;
pub const KIND_MARKER: u32 = 12;
pub const KIND_SYNCHRONIZATION: u32 = 38;
const KNOWN_KINDS: &[u32] = &[
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_KERNEL,
    KIND_DRIVER,
    KIND_RUNTIME,
    KIND_CONCURRENT_KERNEL,
    KIND_MARKER,
    KIND_SYNCHRONIZATION,
];

pub const CBID_RUNTIME_GET_DEVICE: u32 = 17;
pub const CBID_RUNTIME_MEMCPY_ASYNC: u32 = 51;
pub const CBID_RUNTIME_EVENT_QUERY: u32 = 138;
pub const CBID_RUNTIME_DEVICE_SYNCHRONIZE: u32 = 165;
pub const CBID_RUNTIME_LAUNCH_KERNEL: u32 = 211;
pub const CBID_DRIVER_CTX_GET_CURRENT: u32 = 304;

/// CUPTI 13.0's cuptiGetVersion value.
const DEFAULT_VERSION: u32 = 130001;
/// The first API version whose CUPTI survives a refused buffer (CUDA 12.9).
const FIRST_VERSION_SURVIVING_REFUSAL: u32 = 27;
/// CUPTI_SYNCHRONIZATION_INVALID_VALUE: the stream and event of a context
/// synchronize, the stream of an event query.
const SYNC_INVALID: u32 = u32::MAX;
/// The simulated device's context and its one stream.
const CONTEXT: u32 = 1;
const STREAM: u32 = 7;

type Kernel = sys::CUpti_ActivityKernel9;
type Memcpy = sys::CUpti_ActivityMemcpy5;
type Memset = sys::CUpti_ActivityMemset4;
type Sync = sys::CUpti_ActivitySynchronization;
type Api = sys::CUpti_ActivityAPI;
type Marker = sys::CUpti_ActivityMarker2;

type RequestFn = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type CompleteFn = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);
type TimestampFn = unsafe extern "C" fn() -> u64;

// ------------------------------------------------------------------ state

/// One client buffer CUPTI is filling or holding.
struct Buffer {
    base: usize, // address, kept as an integer to be Send
    size: usize,
    /// Where records start: the first 8-byte boundary in the buffer.
    start: usize,
    used: usize,
    /// 0: as many as fit.
    max_records: usize,
    records: Vec<Written>,
}

struct Written {
    offset: usize,
    /// For GPU records, when the work ends on the simulated GPU clock; their
    /// timestamps stay on that clock until delivery.
    gpu_end: Option<u64>,
}

impl Buffer {
    fn fits(&self, size: usize) -> bool {
        self.start + self.used + size <= self.size
            && (self.max_records == 0 || self.records.len() < self.max_records)
    }

    fn complete_at(&self) -> u64 {
        self.records
            .iter()
            .filter_map(|r| r.gpu_end)
            .max()
            .unwrap_or(0)
    }

    fn valid(&self) -> usize {
        if self.records.is_empty() {
            0
        } else {
            self.start + self.used
        }
    }
}

struct State {
    subscriber: Option<usize>,
    next_handle: usize,
    request: Option<RequestFn>,
    complete: Option<CompleteFn>,
    timestamp: Option<TimestampFn>,
    system_tids: bool,
    enabled: u64,
    runtime_off: HashSet<u32>,
    driver_off: HashSet<u32>,
    all_sync: bool,
    current: Option<Buffer>,
    /// Full buffers, oldest first, waiting for their work to finish.
    full: VecDeque<Buffer>,
    /// Buffers obtained while another thread had already installed one, and
    /// buffers too small for any record: returned empty by a forced flush.
    spare: Vec<Buffer>,
    dropped: HashMap<(usize, u32), usize>,
    next_correlation: u32,
    stream_free: u64,
    /// Correlation id -> simulated [start, end] of kernels and copies.
    spans: HashMap<u32, (u64, u64)>,
    names: HashMap<Vec<u8>, &'static CStr>,
    counts: Counts,
}

impl State {
    fn new() -> State {
        State {
            subscriber: None,
            next_handle: 1,
            request: None,
            complete: None,
            timestamp: None,
            system_tids: false,
            enabled: 0,
            runtime_off: HashSet::new(),
            driver_off: HashSet::new(),
            all_sync: true,
            current: None,
            full: VecDeque::new(),
            spare: Vec::new(),
            dropped: HashMap::new(),
            next_correlation: 1,
            stream_free: 0,
            spans: HashMap::new(),
            names: HashMap::new(),
            counts: Counts::default(),
        }
    }

    fn is_enabled(&self, kind: u32) -> bool {
        kind < 64 && self.enabled & (1 << kind) != 0
    }
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::new()));
/// Wakes the delivery thread when a buffer fills up.
static FILLED: Condvar = Condvar::new();

/// A panic while holding the lock leaves consistent-enough state for a test
/// double; carrying on beats failing every later call.
fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs an entry point's body, answering `fallback` instead of unwinding
/// into C.
fn guarded<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Calls into the CUPTI API by any client, counted: a dormant shim must
/// make none.
static CLIENT_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A CUPTI entry point: counted, then [`guarded`].
fn entry<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    CLIENT_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    guarded(fallback, f)
}

fn version() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("GS_FAKE_CUPTI_VERSION")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_VERSION)
    })
}

/// The simulated GPU's clock: CUPTI's default on Linux.
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A timestamp for a host-side record, in the domain records are in now.
fn host_ts() -> u64 {
    let cb = state().timestamp;
    match cb {
        // SAFETY: a client-registered fn() -> u64, called without our lock.
        Some(f) => unsafe { f() },
        None => realtime_ns(),
    }
}

fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

fn record_size(kind: u32) -> Option<usize> {
    let size = match kind {
        KIND_KERNEL | KIND_CONCURRENT_KERNEL => size_of::<Kernel>(),
        KIND_MEMCPY => size_of::<Memcpy>(),
        KIND_MEMSET => size_of::<Memset>(),
        KIND_SYNCHRONIZATION => size_of::<Sync>(),
        KIND_RUNTIME | KIND_DRIVER => size_of::<Api>(),
        KIND_MARKER => size_of::<Marker>(),
        _ => return None,
    };
    Some(size.div_ceil(8) * 8)
}

/// Offsets of the timestamps in GPU records (start, end, and the kernel's
/// `completed`), which delivery converts or zeroes.
fn gpu_timestamp_offsets(kind: u32) -> &'static [usize] {
    const KERNEL: [usize; 3] = [
        offset_of!(Kernel, start),
        offset_of!(Kernel, end),
        offset_of!(Kernel, completed),
    ];
    const MEMCPY: [usize; 2] = [offset_of!(Memcpy, start), offset_of!(Memcpy, end)];
    const MEMSET: [usize; 2] = [offset_of!(Memset, start), offset_of!(Memset, end)];
    match kind {
        KIND_KERNEL | KIND_CONCURRENT_KERNEL => &KERNEL,
        KIND_MEMCPY => &MEMCPY,
        KIND_MEMSET => &MEMSET,
        _ => &[],
    }
}

// ------------------------------------------------------- writing records

/// Appends one record of `kind` to the current buffer, asking the client
/// for a buffer when there is none or it is full. Returns whether it was
/// written (false: kind disabled, or dropped for want of a buffer).
fn write<T: Copy>(kind: u32, rec: &T, gpu_end: Option<u64>) -> bool {
    let size = size_of::<T>().div_ceil(8) * 8;
    loop {
        let request = {
            let mut s = state();
            if !s.is_enabled(kind) {
                return false;
            }
            if let Some(cur) = s.current.as_mut() {
                if cur.fits(size) {
                    let offset = cur.start + cur.used;
                    // SAFETY: the client gave us `size` bytes at `base`;
                    // `fits` checked the record and its padding are inside.
                    unsafe {
                        let dst = (cur.base as *mut u8).add(offset);
                        std::ptr::write_bytes(dst, 0, size);
                        std::ptr::copy_nonoverlapping(
                            rec as *const T as *const u8,
                            dst,
                            size_of::<T>(),
                        );
                    }
                    cur.used += size;
                    cur.records.push(Written { offset, gpu_end });
                    s.counts.pending_records += 1;
                    return true;
                }
            }
            if let Some(cur) = s.current.take() {
                s.full.push_back(cur);
                FILLED.notify_all();
            }
            if let Some(b) = s.spare.iter().position(|b| b.fits(size)) {
                let b = s.spare.swap_remove(b);
                s.current = Some(b);
                continue;
            }
            s.request
        };
        start_delivery_thread();
        let (mut buf, mut len, mut max) = (std::ptr::null_mut::<u8>(), 0usize, 0usize);
        if let Some(f) = request {
            // SAFETY: the client's request callback with valid out-pointers,
            // called without our lock (it may call back into CUPTI).
            unsafe { f(&mut buf, &mut len, &mut max) };
        }
        let start = (buf as usize).next_multiple_of(8) - buf as usize;
        let usable = !buf.is_null() && len >= start + size;
        if !usable {
            if version() < FIRST_VERSION_SURVIVING_REFUSAL {
                eprintln!("stand-in CUPTI: a refused buffer crashes CUPTI before API version 27");
                // SAFETY: abort has no preconditions; it is the point.
                unsafe { libc::abort() };
            }
            let mut s = state();
            if !buf.is_null() {
                s.spare.push(Buffer {
                    base: buf as usize,
                    size: len,
                    start: start.min(len),
                    used: 0,
                    max_records: max,
                    records: Vec::new(),
                });
            }
            *s.dropped.entry((0, 0)).or_insert(0) += 1;
            s.counts.dropped += 1;
            return false;
        }
        let b = Buffer {
            base: buf as usize,
            size: len,
            start,
            used: 0,
            max_records: max,
            records: Vec::new(),
        };
        let mut s = state();
        if s.current.is_none() {
            s.current = Some(b);
        } else {
            s.spare.push(b);
        }
    }
}

fn thread_id(system: bool) -> u32 {
    if system {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    } else {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() as u32 }
    }
}

fn next_correlation() -> u32 {
    let mut s = state();
    let c = s.next_correlation;
    s.next_correlation = s.next_correlation.wrapping_add(1).max(1);
    c
}

/// One runtime or driver API call: `body` runs inside it; its record is
/// written at exit unless the domain or this cbid is switched off.
fn api_call<R>(kind: u32, cbid: u32, correlation: u32, body: impl FnOnce() -> R) -> R {
    let enter = host_ts();
    let out = body();
    let exit = host_ts();
    let (wanted, system) = {
        let s = state();
        let off = if kind == KIND_RUNTIME {
            &s.runtime_off
        } else {
            &s.driver_off
        };
        (s.is_enabled(kind) && !off.contains(&cbid), s.system_tids)
    };
    if wanted {
        // SAFETY: CUPTI records are plain data; zero is a valid pattern.
        let mut a: Api = unsafe { zeroed() };
        a.kind = if kind == KIND_RUNTIME {
            sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_RUNTIME
        } else {
            sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER
        };
        a.cbid = cbid;
        a.start = enter;
        a.end = exit;
        // SAFETY: getpid has no preconditions.
        a.processId = unsafe { libc::getpid() } as u32;
        a.threadId = thread_id(system);
        a.correlationId = correlation;
        a.returnValue = 0;
        write(kind, &a, None);
    }
    out
}

/// Queues `duration` of work on the simulated stream: [start, end] on the
/// GPU clock.
fn schedule(correlation: u32, duration: u64) -> (u64, u64) {
    let now = realtime_ns();
    let mut s = state();
    let start = now.max(s.stream_free);
    let end = start + duration;
    s.stream_free = end;
    s.spans.insert(correlation, (start, end));
    (start, end)
}

fn intern(name: *const c_char) -> *const c_char {
    let bytes = if name.is_null() {
        b"fake_kernel".to_vec()
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        unsafe { CStr::from_ptr(name) }.to_bytes().to_vec()
    };
    let mut s = state();
    if let Some(c) = s.names.get(&bytes) {
        return c.as_ptr();
    }
    let owned = std::ffi::CString::new(bytes.clone()).unwrap_or_default();
    // Kernel records point at their name for as long as the process lives.
    let leaked: &'static CStr = Box::leak(owned.into_boxed_c_str());
    s.names.insert(bytes, leaked);
    leaked.as_ptr()
}

fn sync_record(sync_type: sys::CUpti_ActivitySynchronizationType, start: u64, end: u64, corr: u32) {
    // SAFETY: CUPTI records are plain data; zero is a valid pattern.
    let mut r: Sync = unsafe { zeroed() };
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    r.type_ = sync_type;
    r.start = start;
    r.end = end;
    r.correlationId = corr;
    r.contextId = CONTEXT;
    r.streamId = SYNC_INVALID;
    r.cudaEventId = if sync_type
        == sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE
    {
        1
    } else {
        SYNC_INVALID
    };
    write(KIND_SYNCHRONIZATION, &r, None);
}

// ------------------------------------------------------------- delivery

/// Hands buffers to the completed-callback registered now. GPU timestamps
/// are converted into the timestamp callback's domain here, as CUPTI
/// normalises device timestamps when it processes records; work that has
/// not finished gets zero timestamps (only a forced flush delivers it).
fn deliver(buffers: Vec<Buffer>) {
    for b in buffers {
        let (ts, done) = {
            let s = state();
            (s.timestamp, s.complete)
        };
        // The callback's reading is paired with the midpoint of two of ours,
        // so the conversion is not skewed by the cost of calling it; the
        // tightest of a few pairings, so that a preemption between the reads
        // (a loaded machine) does not skew it either.
        let mut best: Option<(u64, u64, Option<u64>)> = None;
        for _ in 0..8 {
            let before = realtime_ns();
            // SAFETY: a client-registered fn() -> u64, called without our lock.
            let cb = ts.map(|f| unsafe { f() });
            let width = realtime_ns().saturating_sub(before);
            if best.is_none_or(|(w, _, _)| width < w) {
                best = Some((width, before + width / 2, cb));
            }
            if width < 2_000 {
                break;
            }
        }
        let (_, now, cb_now) = best.expect("at least one pairing");
        for r in &b.records {
            let Some(end) = r.gpu_end else { continue };
            // SAFETY: the record was written by us at this offset of the
            // client's buffer, which the client has not had back yet.
            unsafe {
                let rec = (b.base as *mut u8).add(r.offset);
                let kind = std::ptr::read_unaligned(rec as *const u32);
                for &off in gpu_timestamp_offsets(kind) {
                    let p = rec.add(off) as *mut u64;
                    let t = std::ptr::read_unaligned(p);
                    let v = if end > now {
                        0
                    } else if let Some(cb_now) = cb_now {
                        cb_now.wrapping_sub(now - t)
                    } else {
                        t
                    };
                    std::ptr::write_unaligned(p, v);
                }
            }
        }
        {
            let mut s = state();
            let n = b.records.len() as u64;
            s.counts.delivered_records += n;
            s.counts.pending_records -= n;
        }
        if let Some(done) = done {
            // SAFETY: the client's completed-callback with its own buffer,
            // called without our lock (it calls back into CUPTI).
            unsafe {
                done(
                    std::ptr::null_mut(),
                    0,
                    b.base as *mut u8,
                    b.size,
                    b.valid(),
                )
            };
        }
    }
}

/// CUPTI's own thread: returns each full buffer once its work is done.
fn start_delivery_thread() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("fakecupti-worker".into())
            .spawn(|| loop {
                let ready = {
                    let mut s = state();
                    loop {
                        let now = realtime_ns();
                        let mut ready = Vec::new();
                        let mut kept = VecDeque::new();
                        while let Some(b) = s.full.pop_front() {
                            if b.complete_at() <= now {
                                ready.push(b);
                            } else {
                                kept.push_back(b);
                            }
                        }
                        let next = kept.iter().map(Buffer::complete_at).min();
                        s.full = kept;
                        if !ready.is_empty() {
                            break ready;
                        }
                        s = match next {
                            Some(t) => {
                                let wait = Duration::from_nanos(t.saturating_sub(now).max(1));
                                FILLED
                                    .wait_timeout(s, wait)
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0
                            }
                            None => FILLED.wait(s).unwrap_or_else(|e| e.into_inner()),
                        };
                    }
                };
                let _ = catch_unwind(AssertUnwindSafe(|| deliver(ready)));
            });
    });
}

// ------------------------------------------------------- CUPTI entry points

/// # Safety
/// `version` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetVersion(version: *mut u32) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if version.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        // SAFETY: checked non-null; the caller passes a writable u32.
        unsafe { *version = self::version() };
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityRegisterCallbacks(
    request: Option<RequestFn>,
    complete: Option<CompleteFn>,
) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        let (Some(request), Some(complete)) = (request, complete) else {
            return ERROR_INVALID_PARAMETER;
        };
        let mut s = state();
        s.request = Some(request);
        s.complete = Some(complete);
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityRegisterTimestampCallback(cb: Option<TimestampFn>) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        // GS_FAKE_CUPTI_NO_TIMESTAMP_CALLBACK=1 plays a CUPTI without one
        // (before 11.6, or under WSL): records stay on its own clock.
        if std::env::var_os("GS_FAKE_CUPTI_NO_TIMESTAMP_CALLBACK").is_some() {
            return ERROR_NOT_SUPPORTED;
        }
        state().timestamp = cb;
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiSetThreadIdType(kind: u32) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || match kind {
        0 | 1 => {
            state().system_tids = kind == 1;
            SUCCESS
        }
        _ => ERROR_INVALID_PARAMETER,
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnable(kind: u32) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if !KNOWN_KINDS.contains(&kind) {
            return ERROR_INVALID_KIND;
        }
        state().enabled |= 1 << kind;
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityDisable(kind: u32) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if !KNOWN_KINDS.contains(&kind) {
            return ERROR_INVALID_KIND;
        }
        state().enabled &= !(1 << kind);
        SUCCESS
    })
}

/// 0: buffers whose records are all complete; 1 (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED):
/// every buffer, including empty ones and records of unfinished work.
#[no_mangle]
pub extern "C" fn cuptiActivityFlushAll(flag: u32) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        let forced = flag & 1 != 0;
        let buffers = {
            let mut s = state();
            let now = realtime_ns();
            let mut out = Vec::new();
            let mut kept = VecDeque::new();
            while let Some(b) = s.full.pop_front() {
                if forced || b.complete_at() <= now {
                    out.push(b);
                } else {
                    kept.push_back(b);
                }
            }
            s.full = kept;
            let take_current = s
                .current
                .as_ref()
                .is_some_and(|c| forced || (!c.records.is_empty() && c.complete_at() <= now));
            if take_current {
                out.extend(s.current.take());
            }
            if forced {
                out.append(&mut s.spare);
            }
            out
        };
        deliver(buffers);
        SUCCESS
    })
}

/// # Safety
/// `buffer` and `valid` describe a buffer this library delivered; `cur` is
/// writable and null or a record previously returned for that buffer.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNextRecord(
    buffer: *mut u8,
    valid: usize,
    cur: *mut *mut sys::CUpti_Activity,
) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if buffer.is_null() || cur.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        let first = (buffer as usize).next_multiple_of(8) - buffer as usize;
        // SAFETY: `cur` is writable (checked non-null); the records in the
        // first `valid` bytes were written by `write`, so each record's kind
        // gives its size.
        unsafe {
            let offset = if (*cur).is_null() {
                first
            } else {
                let at = (*cur as usize).wrapping_sub(buffer as usize);
                if at >= valid {
                    return ERROR_MAX_LIMIT_REACHED;
                }
                let kind = std::ptr::read_unaligned(buffer.add(at) as *const u32);
                match record_size(kind) {
                    Some(size) => at + size,
                    None => return ERROR_MAX_LIMIT_REACHED,
                }
            };
            if offset + 4 > valid {
                return ERROR_MAX_LIMIT_REACHED;
            }
            let rec = buffer.add(offset);
            let kind = std::ptr::read_unaligned(rec as *const u32);
            let Some(size) = record_size(kind) else {
                return ERROR_MAX_LIMIT_REACHED;
            };
            if offset + size > valid {
                return ERROR_MAX_LIMIT_REACHED;
            }
            *cur = rec as *mut sys::CUpti_Activity;
            let stamps = gpu_timestamp_offsets(kind);
            let unfinished = !stamps.is_empty()
                && stamps[..2]
                    .iter()
                    .all(|&o| std::ptr::read_unaligned(rec.add(o) as *const u64) == 0);
            if unfinished {
                ERROR_INVALID_KIND
            } else {
                SUCCESS
            }
        }
    })
}

/// Reads and resets the count of records dropped in (context, stream);
/// everything this library drops is counted under (NULL, 0), the pair its
/// completed-callbacks are given.
///
/// # Safety
/// `dropped` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNumDroppedRecords(
    context: *mut c_void,
    stream: u32,
    dropped: *mut usize,
) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if dropped.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        let n = state()
            .dropped
            .remove(&(context as usize, stream))
            .unwrap_or(0);
        // SAFETY: checked non-null; the caller passes a writable usize.
        unsafe { *dropped = n };
        SUCCESS
    })
}

/// CUPTI's default clock, whatever timestamp callback is registered.
///
/// # Safety
/// `ts` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetTimestamp(ts: *mut u64) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if ts.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        // SAFETY: checked non-null.
        unsafe { *ts = realtime_ns() };
        SUCCESS
    })
}

/// # Safety
/// `handle` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiSubscribe(
    handle: *mut sys::CUpti_SubscriberHandle,
    _callback: sys::CUpti_CallbackFunc,
    _userdata: *mut c_void,
) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if handle.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        let mut s = state();
        if s.subscriber.is_some() {
            return ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
        }
        let h = s.next_handle;
        s.next_handle += 1;
        s.subscriber = Some(h);
        // SAFETY: checked non-null. The handle is an opaque token, never
        // dereferenced.
        unsafe { *handle = h as sys::CUpti_SubscriberHandle };
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiUnsubscribe(handle: sys::CUpti_SubscriberHandle) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        let mut s = state();
        if s.subscriber.is_some() && s.subscriber == Some(handle as usize) {
            s.subscriber = None;
            SUCCESS
        } else {
            ERROR_INVALID_PARAMETER
        }
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableRuntimeApi(cbid: u32, enable: u8) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        let mut s = state();
        if enable == 0 {
            s.runtime_off.insert(cbid);
        } else {
            s.runtime_off.remove(&cbid);
        }
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableDriverApi(cbid: u32, enable: u8) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        let mut s = state();
        if enable == 0 {
            s.driver_off.insert(cbid);
        } else {
            s.driver_off.remove(&cbid);
        }
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableAllSyncRecords(enable: u8) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        state().all_sync = enable != 0;
        SUCCESS
    })
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetResultString(result: u32, out: *mut *const c_char) -> u32 {
    entry(ERROR_INVALID_PARAMETER, || {
        if out.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        let s: &'static CStr = match result {
            SUCCESS => c"CUPTI_SUCCESS",
            ERROR_INVALID_PARAMETER => c"CUPTI_ERROR_INVALID_PARAMETER",
            ERROR_INVALID_KIND => c"CUPTI_ERROR_INVALID_KIND",
            ERROR_MAX_LIMIT_REACHED => c"CUPTI_ERROR_MAX_LIMIT_REACHED",
            ERROR_NOT_INITIALIZED => c"CUPTI_ERROR_NOT_INITIALIZED",
            ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
                c"CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
            }
            _ => return ERROR_INVALID_PARAMETER,
        };
        // SAFETY: checked non-null; the string is static.
        unsafe { *out = s.as_ptr() };
        SUCCESS
    })
}

// -------------------------------------------------------- control API

/// cudaLaunchKernel: a kernel of `duration_ns` on the simulated stream.
/// Returns its correlation id.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fakecupti_launch_kernel(duration_ns: u64, name: *const c_char) -> u32 {
    guarded(0, || {
        let name = intern(name);
        let corr = next_correlation();
        let (start, end) = api_call(KIND_RUNTIME, CBID_RUNTIME_LAUNCH_KERNEL, corr, || {
            state().counts.launched += 1;
            let span = schedule(corr, duration_ns);
            spin(Duration::from_micros(2));
            span
        });
        // SAFETY: CUPTI records are plain data; zero is a valid pattern.
        let mut k: Kernel = unsafe { zeroed() };
        k.start = start;
        k.end = end;
        k.completed = end;
        k.deviceId = 0;
        k.contextId = CONTEXT;
        k.streamId = STREAM;
        (k.gridX, k.gridY, k.gridZ) = (1024, 1, 1);
        (k.blockX, k.blockY, k.blockZ) = (256, 1, 1);
        k.registersPerThread = 32;
        k.correlationId = corr;
        k.gridId = corr as i64;
        k.name = name;
        let concurrent = state().is_enabled(KIND_CONCURRENT_KERNEL);
        if concurrent {
            k.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
            write(KIND_CONCURRENT_KERNEL, &k, Some(end));
        } else {
            k.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL;
            write(KIND_KERNEL, &k, Some(end));
        }
        corr
    })
}

/// cudaMemcpyAsync host to device of `bytes`, taking `duration_ns` on the
/// stream; `pageable` != 0 copies from pageable memory, else pinned.
#[no_mangle]
pub extern "C" fn fakecupti_memcpy(bytes: u64, duration_ns: u64, pageable: u8) -> u32 {
    guarded(0, || {
        let corr = next_correlation();
        let (start, end) = api_call(KIND_RUNTIME, CBID_RUNTIME_MEMCPY_ASYNC, corr, || {
            let span = schedule(corr, duration_ns);
            spin(Duration::from_micros(2));
            span
        });
        // SAFETY: CUPTI records are plain data; zero is a valid pattern.
        let mut m: Memcpy = unsafe { zeroed() };
        m.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY;
        m.copyKind = 1; // HtoD
        m.srcKind = if pageable != 0 { 1 } else { 2 };
        m.dstKind = 3; // device
        m.bytes = bytes;
        m.start = start;
        m.end = end;
        m.deviceId = 0;
        m.contextId = CONTEXT;
        m.streamId = STREAM;
        m.correlationId = corr;
        write(KIND_MEMCPY, &m, Some(end));
        corr
    })
}

/// cudaDeviceSynchronize: blocks until the simulated stream is idle.
#[no_mangle]
pub extern "C" fn fakecupti_synchronize() -> u32 {
    guarded(0, || {
        let corr = next_correlation();
        let (start, end) = api_call(KIND_RUNTIME, CBID_RUNTIME_DEVICE_SYNCHRONIZE, corr, || {
            let start = host_ts();
            loop {
                let free = state().stream_free;
                let now = realtime_ns();
                if now >= free {
                    break;
                }
                std::thread::sleep(Duration::from_nanos(free - now));
            }
            (start, host_ts())
        });
        sync_record(
            sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE,
            start,
            end,
            corr,
        );
        corr
    })
}

/// cudaEventQuery: recorded as a synchronization only while all sync
/// records are on (CUPTI's default).
#[no_mangle]
pub extern "C" fn fakecupti_event_query() -> u32 {
    guarded(0, || {
        let corr = next_correlation();
        let (start, end) = api_call(KIND_RUNTIME, CBID_RUNTIME_EVENT_QUERY, corr, || {
            let start = host_ts();
            spin(Duration::from_micros(1));
            (start, host_ts())
        });
        if state().all_sync {
            sync_record(
                sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE,
                start,
                end,
                corr,
            );
        }
        corr
    })
}

/// cudaGetDevice: the bookkeeping call PyTorch makes around every op.
#[no_mangle]
pub extern "C" fn fakecupti_get_device() -> u32 {
    guarded(0, || {
        let corr = next_correlation();
        api_call(KIND_RUNTIME, CBID_RUNTIME_GET_DEVICE, corr, || {
            spin(Duration::from_nanos(300))
        });
        corr
    })
}

/// cuCtxGetCurrent, in the driver API domain.
#[no_mangle]
pub extern "C" fn fakecupti_ctx_get_current() -> u32 {
    guarded(0, || {
        let corr = next_correlation();
        api_call(KIND_DRIVER, CBID_DRIVER_CTX_GET_CURRENT, corr, || {
            spin(Duration::from_nanos(200))
        });
        corr
    })
}

/// The simulated [start, end] of the kernel or copy with this correlation
/// id, on the stand-in's GPU clock (CLOCK_REALTIME ns). 0 if known, else 1.
///
/// # Safety
/// `start` and `end` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn fakecupti_span(correlation: u32, start: *mut u64, end: *mut u64) -> u32 {
    guarded(ERROR_INVALID_PARAMETER, || {
        let Some((s, e)) = state().spans.get(&correlation).copied() else {
            return ERROR_INVALID_PARAMETER;
        };
        // SAFETY: each is checked non-null; the caller passes writable u64s.
        unsafe {
            if !start.is_null() {
                *start = s;
            }
            if !end.is_null() {
                *end = e;
            }
        }
        SUCCESS
    })
}

/// # Safety
/// `out` is null or points to a writable `Counts`.
#[no_mangle]
pub unsafe extern "C" fn fakecupti_counts(out: *mut Counts) {
    guarded((), || {
        if !out.is_null() {
            let mut c = state().counts;
            c.client_calls = CLIENT_CALLS.load(std::sync::atomic::Ordering::Relaxed);
            // SAFETY: checked non-null.
            unsafe { *out = c };
        }
    })
}

pub use kineto::{fakecupti_kineto_start, fakecupti_kineto_stats, fakecupti_kineto_stop};

/// Forgets every client, buffer and count (buffers are not delivered).
#[cfg(test)]
fn reset() {
    *state() = State::new();
    kineto::reset();
}

#[cfg(test)]
mod tests;
