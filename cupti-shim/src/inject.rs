//! The shim inside the CUDA process. The driver calls `InitializeInjection`
//! when `CUDA_INJECTION64_PATH` names this library. From then on:
//!
//! - with `GAPSCOPE_SOCKET` set (gapscope run), it connects and records at once;
//! - otherwise it listens on `@gapscope-cupti.<pid>` and stays dormant (no
//!   CUPTI activity enabled, no cost) until `gapscope attach` connects;
//! - when the profiler leaves, activity is disabled and flushed; at exit it
//!   flushes what is pending.
//!
//! Every `extern "C"` entry catches panics: nothing unwinds into the driver,
//! and a failure leaves the shim doing nothing rather than the job failing.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cudarc::cupti::sys;

use crate::activity::{self, Decoded};
use crate::clock::monotonic_ns as now_monotonic;
use crate::loader::{self, Cupti, CUPTI_SUCCESS};
use crate::protocol::{self, ClockMethod, Frame, Hello, RecordsFrame, VERSION};
use crate::record::GpuRecord;
use crate::transport::{self, Transport};

/// Activity kinds recorded while a profiler listens.
const KINDS: &[u32] = &[
    activity::KIND_CONCURRENT_KERNEL,
    activity::KIND_MEMCPY,
    activity::KIND_MEMSET,
    activity::KIND_SYNCHRONIZATION,
    activity::KIND_RUNTIME,
    activity::KIND_DRIVER,
    activity::KIND_MARKER,
];
const BUFFER_SIZE: usize = 2 << 20;
/// Buffers handed to CUPTI at once; past this CUPTI drops and counts.
const MAX_BUFFERS: usize = 16;
/// Records frames are cut at this many payload bytes.
const FRAME_TARGET: usize = 1 << 20;
const FLUSH_EVERY: Duration = Duration::from_millis(250);

struct Shim {
    pid: u32,
    driver: u32,
    cupti: Option<Cupti>,
    clock: ClockMethod,
    clock_offset: AtomicI64,
    /// Why there is no CUPTI, or other things the session should say.
    notes: Mutex<Vec<String>>,
    link: Mutex<Option<Transport>>,
    enabled: AtomicBool,
    outstanding: AtomicUsize,
    pool: Mutex<Vec<usize>>, // buffer addresses, kept as integers to be Send
    cupti_dropped: AtomicU64,
    skipped: AtomicU64,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

extern "C" fn monotonic_timestamp() -> u64 {
    now_monotonic()
}

/// Called by the CUDA driver. Always reports success: a shim that cannot
/// work must not stop the job.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    let _ = catch_unwind(init);
    1
}

fn init() {
    if SHIM.get().is_some() {
        return;
    }
    let pid = std::process::id();
    let driver = loader::driver_version();
    let mut notes = Vec::new();
    let cupti = match Cupti::load(driver) {
        Ok(c) => {
            // SAFETY: registering our extern "C" callbacks with CUPTI.
            let rc = unsafe {
                (c.cuptiActivityRegisterCallbacks)(Some(buffer_requested), Some(buffer_completed))
            };
            if rc == CUPTI_SUCCESS {
                Some(c)
            } else {
                notes.push(format!(
                    "CUPTI ({}) refused activity callbacks (CUPTI error {rc}{}); no GPU timeline from this process",
                    c.path,
                    if rc == loader::CUPTI_ERROR_NOT_INITIALIZED { ": not initialized" } else { "" }
                ));
                None
            }
        }
        Err(why) => {
            notes.push(format!("no GPU timeline from pid {pid}: {why}"));
            None
        }
    };
    if let Some(c) = &cupti {
        let set = c.cuptiSetThreadIdType;
        // SAFETY: plain CUPTI call.
        let ok = set.is_some_and(|f| unsafe { f(loader::THREAD_ID_TYPE_SYSTEM) } == CUPTI_SUCCESS);
        if !ok {
            notes.push(
                "CUPTI could not report system thread ids: CUDA API calls cannot be tied to host threads"
                    .into(),
            );
        }
    }
    let (clock, offset) = match &cupti {
        Some(c) => clock_method(c),
        None => (ClockMethod::MeasuredOffset, 0),
    };
    let shim = Shim {
        pid,
        driver,
        cupti,
        clock,
        clock_offset: AtomicI64::new(offset),
        notes: Mutex::new(notes),
        link: Mutex::new(None),
        enabled: AtomicBool::new(false),
        outstanding: AtomicUsize::new(0),
        pool: Mutex::new(Vec::new()),
        cupti_dropped: AtomicU64::new(0),
        skipped: AtomicU64::new(0),
    };
    if SHIM.set(shim).is_err() {
        return;
    }
    // SAFETY: registering a plain extern "C" function.
    unsafe { libc::atexit(at_exit) };

    match std::env::var("GAPSCOPE_SOCKET") {
        Ok(name) => match transport::connect(&name) {
            Ok(stream) => attach_profiler(Transport::start(stream)),
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

/// CLOCK_MONOTONIC timestamps: CUPTI's timestamp callback where it exists,
/// else an offset from CUPTI's clock measured now (best of several reads).
fn clock_method(c: &Cupti) -> (ClockMethod, i64) {
    if let Some(register) = c.cuptiActivityRegisterTimestampCallback {
        // SAFETY: registering a plain extern "C" fn() -> u64.
        if unsafe { register(Some(monotonic_timestamp)) } == CUPTI_SUCCESS {
            return (ClockMethod::TimestampCallback, 0);
        }
    }
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..16 {
        let a = now_monotonic();
        let mut cupti_ts = 0u64;
        // SAFETY: cuptiGetTimestamp writes one u64.
        unsafe { (c.cuptiGetTimestamp)(&mut cupti_ts) };
        let b = now_monotonic();
        let offset = (a / 2 + b / 2) as i64 - cupti_ts as i64;
        if best.is_none_or(|(w, _)| b - a < w) {
            best = Some((b - a, offset));
        }
    }
    (ClockMethod::MeasuredOffset, best.map(|b| b.1).unwrap_or(0))
}

fn shim() -> Option<&'static Shim> {
    let s = SHIM.get()?;
    // A forked child (a DataLoader worker) inherits the memory but not the
    // threads or the CUDA context: it must stay silent.
    (s.pid == std::process::id()).then_some(s)
}

fn send(frame: &Frame, records: u64) {
    let Some(s) = shim() else { return };
    let mut bytes = Vec::new();
    protocol::encode(frame, &mut bytes);
    if let Some(link) = s.link.lock().ok().as_ref().and_then(|l| l.as_ref()) {
        link.send(bytes, records, None);
    }
}

fn attach_profiler(link: Transport) {
    let Some(s) = shim() else { return };
    let hello = Hello {
        version: VERSION,
        pid: s.pid,
        driver_version: s.driver,
        cupti_version: s.cupti.as_ref().map(|c| c.version).unwrap_or(0),
        clock: s.clock,
        source: format!("gapscope-cupti {}", env!("CARGO_PKG_VERSION")),
    };
    let mut bytes = Vec::new();
    protocol::encode(&Frame::Hello(hello), &mut bytes);
    let devices: Vec<GpuRecord> = loader::device_names()
        .into_iter()
        .map(|(id, name)| GpuRecord::Device { id, name })
        .collect();
    protocol::encode(&Frame::Records(devices), &mut bytes);
    for note in s.notes.lock().map(|n| n.clone()).unwrap_or_default() {
        protocol::encode(&Frame::Info(note), &mut bytes);
    }
    link.send(bytes, 0, None);
    if let Ok(mut l) = s.link.lock() {
        *l = Some(link);
    }
    if let Some(c) = &s.cupti {
        probe_other_clients(c);
        let mut refused = Vec::new();
        for &k in KINDS {
            // SAFETY: plain CUPTI call with a kind value.
            let rc = unsafe { (c.cuptiActivityEnable)(k) };
            if rc != CUPTI_SUCCESS {
                refused.push(format!("kind {k}: error {rc}"));
            }
        }
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
        s.enabled.store(true, Ordering::SeqCst);
    }
}

/// CUPTI allows one callback subscriber. Taking the slot would break a
/// torch.profiler or Nsight started later, so the shim only probes it.
fn probe_other_clients(c: &Cupti) {
    let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: subscribe with no callback, then release at once.
    let rc = unsafe { (c.cuptiSubscribe)(&mut handle, None, std::ptr::null_mut()) };
    if rc == CUPTI_SUCCESS {
        unsafe { (c.cuptiUnsubscribe)(handle) };
    } else if rc == loader::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED {
        send(
            &Frame::Info(
                "another CUPTI client is active in this process (torch.profiler, Nsight?): \
                 GPU records may be incomplete while it runs"
                    .into(),
            ),
            0,
        );
    }
}

/// The profiler left (or the process is exiting): stop recording, flush
/// what CUPTI holds, say goodbye.
fn detach_profiler(wait: Duration) {
    let Some(s) = shim() else { return };
    if let Some(c) = &s.cupti {
        if s.enabled.swap(false, Ordering::SeqCst) {
            for &k in KINDS {
                // SAFETY: plain CUPTI calls.
                unsafe { (c.cuptiActivityDisable)(k) };
            }
            unsafe { (c.cuptiActivityFlushAll)(1) };
        }
    }
    send_dropped();
    send(&Frame::Goodbye, 0);
    let link = s.link.lock().ok().and_then(|mut l| l.take());
    if let Some(link) = link {
        link.close(wait);
    }
}

fn send_dropped() {
    let Some(s) = shim() else { return };
    let shim_dropped = s
        .link
        .lock()
        .ok()
        .and_then(|l| l.as_ref().map(Transport::dropped))
        .unwrap_or(0);
    send(
        &Frame::Dropped {
            cupti: s.cupti_dropped.load(Ordering::Relaxed),
            shim: shim_dropped,
        },
        0,
    );
}

/// Waits for `gapscope attach` on the control socket, one profiler at a time.
fn listen() {
    let Some(s) = shim() else { return };
    let Ok(listener) = transport::listen(&transport::control_socket_name(s.pid)) else {
        return;
    };
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
                    attach_profiler(Transport::start(stream));
                    // The profiler never writes: end of input (or an error)
                    // means it is done, or gone.
                    let mut byte = [0u8; 1];
                    while matches!(std::io::Read::read(&mut reader, &mut byte), Ok(n) if n > 0) {}
                    detach_profiler(Duration::from_secs(2));
                }));
            }
        });
}

fn periodic() {
    let Some(s) = shim() else { return };
    if !s.enabled.load(Ordering::SeqCst) {
        return;
    }
    let connected = s
        .link
        .lock()
        .ok()
        .is_some_and(|l| l.as_ref().is_some_and(|t| t.is_connected()));
    if !connected {
        // The profiler is gone: stop paying for activity records.
        detach_profiler(Duration::from_millis(10));
        return;
    }
    if let Some(c) = &s.cupti {
        // SAFETY: plain CUPTI call; 0 = flush completed buffers only.
        unsafe { (c.cuptiActivityFlushAll)(0) };
    }
    send_dropped();
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| detach_profiler(Duration::from_secs(2)));
}

// ------------------------------------------------------------ CUPTI buffers

extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let got = catch_unwind(|| shim().and_then(take_buffer)).ok().flatten();
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *max_records = 0;
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
    if s.outstanding.fetch_add(1, Ordering::SeqCst) >= MAX_BUFFERS {
        s.outstanding.fetch_sub(1, Ordering::SeqCst);
        return None;
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
            if let Some(c) = &s.cupti {
                let records = CuptiRecords {
                    cupti: c,
                    buffer,
                    valid,
                    cur: std::ptr::null_mut(),
                };
                let offset = s.clock_offset.load(Ordering::Relaxed);
                let mut last_end: Option<u64> = None;
                let skipped = encode_records(records, offset, s.pid, &mut |frame, n, span| {
                    if let Some((_, e)) = span {
                        last_end = Some(last_end.map_or(e, |l| l.max(e)));
                    }
                    send_raw(s, frame, n, span)
                });
                s.skipped.fetch_add(skipped, Ordering::Relaxed);
                let mut dropped = 0usize;
                // SAFETY: CUPTI call with the context and stream it gave us.
                if unsafe { (c.cuptiActivityGetNumDroppedRecords)(ctx, stream, &mut dropped) }
                    == CUPTI_SUCCESS
                {
                    s.cupti_dropped.fetch_add(dropped as u64, Ordering::Relaxed);
                    if let Some(lost) = cupti_loss(last_end, now_monotonic(), dropped as u64) {
                        send(&lost, 0);
                    }
                }
            }
        }
        if let Ok(mut pool) = s.pool.lock() {
            pool.push(buffer as usize);
        }
    }));
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

fn send_raw(s: &Shim, frame: Vec<u8>, records: u64, span: Option<(u64, u64)>) {
    if let Some(link) = s.link.lock().ok().as_ref().and_then(|l| l.as_ref()) {
        link.send(frame, records, span);
    }
}

/// Iterates a completed buffer with cuptiActivityGetNextRecord.
struct CuptiRecords<'a> {
    cupti: &'a Cupti,
    buffer: *mut u8,
    valid: usize,
    cur: *mut sys::CUpti_Activity,
}

impl Iterator for CuptiRecords<'_> {
    type Item = *const u8;
    fn next(&mut self) -> Option<*const u8> {
        // SAFETY: CUPTI walks the buffer it filled; `cur` is its cursor.
        let rc = unsafe {
            (self.cupti.cuptiActivityGetNextRecord)(self.buffer, self.valid, &mut self.cur)
        };
        (rc == CUPTI_SUCCESS && !self.cur.is_null()).then_some(self.cur as *const u8)
    }
}

/// Decodes records into Records frames of bounded size, handing each frame
/// (and its record count) to `emit`. Returns how many records were of kinds
/// not read. This is the shim's whole buffer handling, shared by the CUPTI
/// path and the tests.
pub fn encode_records(
    records: impl Iterator<Item = *const u8>,
    clock_offset: i64,
    pid: u32,
    emit: &mut dyn FnMut(Vec<u8>, u64, Option<(u64, u64)>),
) -> u64 {
    let mut skipped = 0;
    let mut out = Vec::with_capacity(FRAME_TARGET + 4096);
    let mut frame = RecordsFrame::begin(&mut out);
    for rec in records {
        // SAFETY: each pointer is a complete record from a filled buffer.
        match unsafe { activity::decode(rec, clock_offset, pid) } {
            Decoded::Record(r) => frame.push(&mut out, &r),
            Decoded::Skipped(_) => skipped += 1,
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
    skipped
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
    fn buffer_handling_turns_records_into_frames_and_counts_unknown_kinds() {
        let mut buf = SyntheticBuffer::new();
        for i in 0..10u64 {
            let k = kernel(&mut buf, i * 100, i * 100 + 50, i as u32);
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

        let mut frames = Vec::new();
        let skipped = encode_records(buf.records().into_iter(), 0, 1, &mut |f, n, span| {
            frames.push((f, n, span))
        });
        assert_eq!(skipped, 1);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].1, 11);
        // What the frame covers, should it be dropped: first kernel start
        // to the copy's end.
        assert_eq!(frames[0].2, Some((0, 6_000)));
        let mut d = Decoder::new();
        d.push(&frames[0].0);
        let Some(Frame::Records(recs)) = d.next_frame().unwrap() else {
            panic!("not a records frame")
        };
        assert_eq!(recs.len(), 11);
        assert!(matches!(
            &recs[9],
            GpuRecord::Kernel {
                start: 900,
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
