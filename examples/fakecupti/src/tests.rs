//! The stand-in's own semantics, through its exported entry points. The
//! library is one process-global CUPTI, so the tests take turns.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

static TURN: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    let g = TURN.lock().unwrap_or_else(|e| e.into_inner());
    reset();
    DELIVERIES.lock().unwrap().clear();
    ALLOCATED.lock().unwrap().clear();
    BUFFER_BYTES.store(64 << 10, Ordering::SeqCst);
    g
}

#[derive(Clone, Debug, PartialEq)]
struct Seen {
    rc: u32,
    kind: u32,
    cbid: u32,
    start: u64,
    end: u64,
    corr: u32,
    tid: u32,
    sync_type: u32,
}

struct Delivery {
    client: char,
    buffer: usize,
    records: Vec<Seen>,
}

static DELIVERIES: Mutex<Vec<Delivery>> = Mutex::new(Vec::new());
static ALLOCATED: Mutex<Vec<(char, usize)>> = Mutex::new(Vec::new());
static BUFFER_BYTES: AtomicUsize = AtomicUsize::new(64 << 10);

fn allocate(client: char, buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let bytes = BUFFER_BYTES.load(Ordering::SeqCst);
    // Leaked: test buffers are small and few.
    let p = Box::leak(vec![0u64; bytes / 8].into_boxed_slice()).as_mut_ptr() as *mut u8;
    ALLOCATED.lock().unwrap().push((client, p as usize));
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = p;
        *size = bytes;
        *max = 0;
    }
}

extern "C" fn request_a(b: *mut *mut u8, s: *mut usize, m: *mut usize) {
    allocate('a', b, s, m)
}
extern "C" fn request_b(b: *mut *mut u8, s: *mut usize, m: *mut usize) {
    allocate('b', b, s, m)
}
extern "C" fn request_none(b: *mut *mut u8, s: *mut usize, _: *mut usize) {
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *b = std::ptr::null_mut();
        *s = 0;
    }
}

fn read<T: Copy>(rec: *const u8, offset: usize) -> T {
    // SAFETY: offsets within records CUPTI returned.
    unsafe { std::ptr::read_unaligned(rec.add(offset) as *const T) }
}

fn walk(buffer: *mut u8, valid: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    let mut cur: *mut sys::CUpti_Activity = std::ptr::null_mut();
    loop {
        // SAFETY: a buffer this library delivered, with its cursor.
        let rc = unsafe { cuptiActivityGetNextRecord(buffer, valid, &mut cur) };
        if rc == ERROR_MAX_LIMIT_REACHED {
            return out;
        }
        assert!(rc == SUCCESS || rc == ERROR_INVALID_KIND, "rc {rc}");
        let p = cur as *const u8;
        let kind: u32 = read(p, 0);
        let mut seen = Seen {
            rc,
            kind,
            cbid: 0,
            start: 0,
            end: 0,
            corr: 0,
            tid: 0,
            sync_type: 0,
        };
        match kind {
            KIND_RUNTIME | KIND_DRIVER => {
                seen.cbid = read(p, offset_of!(Api, cbid));
                seen.start = read(p, offset_of!(Api, start));
                seen.end = read(p, offset_of!(Api, end));
                seen.corr = read(p, offset_of!(Api, correlationId));
                seen.tid = read(p, offset_of!(Api, threadId));
            }
            KIND_CONCURRENT_KERNEL | KIND_KERNEL => {
                seen.start = read(p, offset_of!(Kernel, start));
                seen.end = read(p, offset_of!(Kernel, end));
                seen.corr = read(p, offset_of!(Kernel, correlationId));
            }
            KIND_MEMCPY => {
                seen.start = read(p, offset_of!(Memcpy, start));
                seen.end = read(p, offset_of!(Memcpy, end));
                seen.corr = read(p, offset_of!(Memcpy, correlationId));
            }
            KIND_SYNCHRONIZATION => {
                seen.start = read(p, offset_of!(Sync, start));
                seen.end = read(p, offset_of!(Sync, end));
                seen.corr = read(p, offset_of!(Sync, correlationId));
                seen.sync_type = read(p, offset_of!(Sync, type_));
            }
            _ => panic!("unexpected kind {kind}"),
        }
        out.push(seen);
    }
}

fn complete(client: char, buffer: *mut u8, valid: usize) {
    let records = walk(buffer, valid);
    DELIVERIES.lock().unwrap().push(Delivery {
        client,
        buffer: buffer as usize,
        records,
    });
}

extern "C" fn complete_a(_: *mut c_void, _: u32, b: *mut u8, _: usize, valid: usize) {
    complete('a', b, valid)
}
extern "C" fn complete_b(_: *mut c_void, _: u32, b: *mut u8, _: usize, valid: usize) {
    complete('b', b, valid)
}

/// Every record delivered so far, in order, with the client that got it.
fn delivered() -> Vec<(char, Seen)> {
    DELIVERIES
        .lock()
        .unwrap()
        .iter()
        .flat_map(|d| d.records.iter().map(|r| (d.client, r.clone())))
        .collect()
}

fn counts() -> Counts {
    let mut c = Counts::default();
    // SAFETY: a writable Counts.
    unsafe { fakecupti_counts(&mut c) };
    c
}

fn enable(kinds: &[u32]) {
    for &k in kinds {
        assert_eq!(cuptiActivityEnable(k), SUCCESS);
    }
}

#[test]
fn one_subscriber_at_a_time() {
    let _t = serial();
    let (mut first, mut second): (sys::CUpti_SubscriberHandle, sys::CUpti_SubscriberHandle) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: writable handles.
    unsafe {
        assert_eq!(
            cuptiSubscribe(&mut first, None, std::ptr::null_mut()),
            SUCCESS
        );
        assert_eq!(
            cuptiSubscribe(&mut second, None, std::ptr::null_mut()),
            ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
        );
        assert_eq!(cuptiUnsubscribe(second), ERROR_INVALID_PARAMETER);
        assert_eq!(cuptiUnsubscribe(first), SUCCESS);
        assert_eq!(
            cuptiSubscribe(&mut second, None, std::ptr::null_mut()),
            SUCCESS
        );
        assert_ne!(first, second);
        assert_eq!(cuptiUnsubscribe(second), SUCCESS);
    }
}

#[test]
fn re_registering_sends_old_buffers_to_the_new_client() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME]);
    for _ in 0..3 {
        fakecupti_get_device();
    }
    cuptiActivityRegisterCallbacks(Some(request_b), Some(complete_b));
    cuptiActivityFlushAll(0);
    let d = DELIVERIES.lock().unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].client, 'b');
    assert_eq!(ALLOCATED.lock().unwrap()[..], [('a', d[0].buffer)]);
    assert_eq!(d[0].records.len(), 3);
    assert!(d[0]
        .records
        .iter()
        .all(|r| r.cbid == CBID_RUNTIME_GET_DEVICE));
}

#[test]
fn a_refused_buffer_drops_the_record_and_counts_it() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_none), Some(complete_a));
    enable(&[KIND_RUNTIME]);
    for _ in 0..5 {
        fakecupti_get_device();
    }
    assert_eq!(counts().dropped, 5);
    let mut n = 99;
    // SAFETY: writable out-pointer.
    unsafe {
        assert_eq!(
            cuptiActivityGetNumDroppedRecords(std::ptr::null_mut(), 0, &mut n),
            SUCCESS
        );
        assert_eq!(n, 5);
        cuptiActivityGetNumDroppedRecords(std::ptr::null_mut(), 0, &mut n);
    }
    assert_eq!(n, 0, "reading the count resets it");
    cuptiActivityFlushAll(1);
    assert!(delivered().is_empty());
    assert_eq!(counts().dropped, 5);
}

#[test]
fn a_refused_buffer_crashes_before_version_27() {
    if std::env::var_os("FAKECUPTI_REFUSAL_CHILD").is_some() {
        cuptiActivityRegisterCallbacks(Some(request_none), Some(complete_a));
        enable(&[KIND_RUNTIME]);
        fakecupti_get_device();
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::a_refused_buffer_crashes_before_version_27",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FAKECUPTI_REFUSAL_CHILD", "1")
        .env("GS_FAKE_CUPTI_VERSION", "26")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("stand-in CUPTI: a refused buffer crashes CUPTI before API version 27"));
}

#[test]
fn a_forced_flush_delivers_unfinished_work_as_invalid_kind_and_reading_goes_on() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME, KIND_CONCURRENT_KERNEL]);
    // SAFETY: null name (the default) is allowed.
    let done = unsafe { fakecupti_launch_kernel(1_000, std::ptr::null()) };
    std::thread::sleep(Duration::from_millis(2));
    // SAFETY: a static NUL-terminated name.
    let queued = unsafe { fakecupti_launch_kernel(10_000_000_000, c"long".as_ptr()) };
    let after = fakecupti_get_device();
    cuptiActivityFlushAll(0);
    assert!(delivered().is_empty(), "work still queued: not flushed");
    assert_eq!(counts().pending_records, 5);
    cuptiActivityFlushAll(1);
    let seen: Vec<(u32, u32, u32)> = delivered()
        .iter()
        .map(|(_, s)| (s.rc, s.kind, s.corr))
        .collect();
    assert_eq!(
        seen,
        [
            (SUCCESS, KIND_RUNTIME, done),
            (SUCCESS, KIND_CONCURRENT_KERNEL, done),
            (SUCCESS, KIND_RUNTIME, queued),
            (ERROR_INVALID_KIND, KIND_CONCURRENT_KERNEL, queued),
            (SUCCESS, KIND_RUNTIME, after),
        ]
    );
    let recs = delivered();
    assert!(recs[1].1.start > 0 && recs[1].1.end > recs[1].1.start);
    assert_eq!((recs[3].1.start, recs[3].1.end), (0, 0));
    let c = counts();
    assert_eq!(
        (c.pending_records, c.delivered_records, c.launched),
        (0, 5, 2)
    );
}

#[test]
fn api_records_are_suppressed_per_cbid() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME, KIND_DRIVER]);
    cuptiActivityEnableRuntimeApi(CBID_RUNTIME_GET_DEVICE, 0);
    fakecupti_get_device();
    fakecupti_ctx_get_current();
    fakecupti_event_query();
    cuptiActivityEnableDriverApi(CBID_DRIVER_CTX_GET_CURRENT, 0);
    fakecupti_ctx_get_current();
    cuptiActivityEnableRuntimeApi(CBID_RUNTIME_GET_DEVICE, 1);
    cuptiActivityEnableDriverApi(CBID_DRIVER_CTX_GET_CURRENT, 1);
    fakecupti_get_device();
    fakecupti_ctx_get_current();
    cuptiActivityFlushAll(1);
    let cbids: Vec<u32> = delivered().iter().map(|(_, s)| s.cbid).collect();
    assert_eq!(
        cbids,
        [
            CBID_DRIVER_CTX_GET_CURRENT,
            CBID_RUNTIME_EVENT_QUERY,
            CBID_RUNTIME_GET_DEVICE,
            CBID_DRIVER_CTX_GET_CURRENT
        ]
    );
}

const FAR: u64 = 1 << 50;
extern "C" fn far_clock() -> u64 {
    realtime_ns() + FAR
}

#[test]
fn timestamps_follow_the_registered_callback() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME, KIND_CONCURRENT_KERNEL]);
    cuptiActivityRegisterTimestampCallback(Some(far_clock));
    let before = realtime_ns();
    // SAFETY: null name allowed.
    unsafe { fakecupti_launch_kernel(100_000, std::ptr::null()) };
    let after = realtime_ns();
    std::thread::sleep(Duration::from_millis(1));
    let mut default_clock = 0;
    // SAFETY: writable out-pointer.
    unsafe { cuptiGetTimestamp(&mut default_clock) };
    assert!(default_clock >= after && default_clock < after + 1_000_000_000);
    cuptiActivityFlushAll(0);
    let recs = delivered();
    assert_eq!(recs.len(), 2);
    let (api, kernel) = (&recs[0].1, &recs[1].1);
    assert!(
        api.start >= before + FAR && api.end <= after + FAR,
        "{api:?}"
    );
    let slack = 1_000_000;
    assert!(kernel.start + slack >= before + FAR && kernel.start <= after + FAR + slack);
    assert!((kernel.end - kernel.start).abs_diff(100_000) < 1_000);

    cuptiActivityRegisterTimestampCallback(None);
    let before = realtime_ns();
    fakecupti_get_device();
    let after = realtime_ns();
    cuptiActivityFlushAll(0);
    let last = delivered().pop().unwrap().1;
    assert!(last.start >= before && last.end <= after, "{last:?}");
}

#[test]
fn api_records_carry_the_thread_id_type_asked_for() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME]);
    fakecupti_get_device();
    assert_eq!(cuptiSetThreadIdType(1), SUCCESS);
    fakecupti_get_device();
    assert_eq!(cuptiSetThreadIdType(7), ERROR_INVALID_PARAMETER);
    cuptiActivityFlushAll(0);
    let tids: Vec<u32> = delivered().iter().map(|(_, s)| s.tid).collect();
    // SAFETY: no preconditions.
    let (pthread, tid) = unsafe { (libc::pthread_self() as u32, libc::gettid() as u32) };
    assert_eq!(tids, [pthread, tid]);
}

#[test]
fn queries_are_sync_records_only_while_all_sync_records_are_on() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_SYNCHRONIZATION, KIND_CONCURRENT_KERNEL]);
    let q1 = fakecupti_event_query();
    // SAFETY: null name allowed.
    let k = unsafe { fakecupti_launch_kernel(5_000_000, std::ptr::null()) };
    let s1 = fakecupti_synchronize();
    cuptiActivityEnableAllSyncRecords(0);
    fakecupti_event_query();
    let s2 = fakecupti_synchronize();
    cuptiActivityFlushAll(0);
    let recs = delivered();
    let seen: Vec<(u32, u32, u32)> = recs
        .iter()
        .map(|(_, s)| (s.kind, s.sync_type, s.corr))
        .collect();
    assert_eq!(
        seen,
        [
            (KIND_SYNCHRONIZATION, 1, q1),
            (KIND_CONCURRENT_KERNEL, 0, k),
            (KIND_SYNCHRONIZATION, 4, s1),
            (KIND_SYNCHRONIZATION, 4, s2),
        ]
    );
    let (kernel, sync) = (&recs[1].1, &recs[2].1);
    assert!(sync.start <= kernel.start + 1_000_000 && sync.end >= kernel.end);
}

#[test]
fn full_buffers_come_back_without_a_flush() {
    let _t = serial();
    // Three API records (40 bytes each) per buffer.
    BUFFER_BYTES.store(128, Ordering::SeqCst);
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME]);
    for _ in 0..10 {
        fakecupti_get_device();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while DELIVERIES.lock().unwrap().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let d = DELIVERIES.lock().unwrap();
    assert_eq!(d.len(), 3);
    assert!(d.iter().all(|d| d.records.len() == 3));
    drop(d);
    assert_eq!(counts().pending_records, 1);
    cuptiActivityFlushAll(1);
    assert_eq!(counts().delivered_records, 10);
}

#[test]
fn kineto_takes_the_callbacks_and_loses_the_earlier_clients_buffer() {
    let _t = serial();
    cuptiActivityRegisterCallbacks(Some(request_a), Some(complete_a));
    enable(&[KIND_RUNTIME, KIND_CONCURRENT_KERNEL]);
    let mut other: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: a writable handle.
    unsafe { cuptiSubscribe(&mut other, None, std::ptr::null_mut()) };
    fakecupti_get_device();
    fakecupti_kineto_start();
    // SAFETY: null name allowed.
    unsafe { fakecupti_launch_kernel(1_000, std::ptr::null()) };
    std::thread::sleep(Duration::from_millis(1));
    fakecupti_kineto_stop();
    let mut stats = KinetoStats::default();
    // SAFETY: a writable KinetoStats.
    unsafe { fakecupti_kineto_stats(&mut stats) };
    assert_eq!(
        stats,
        KinetoStats {
            kernels: 0,
            records: 0,
            unknown_buffers: 1,
            subscribe_rc: ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
        }
    );
    assert!(delivered().is_empty());
    assert_eq!(counts().delivered_records, 3);
    assert_eq!(cuptiUnsubscribe(other), SUCCESS);

    // Its own buffers, the second time round: it subscribes now.
    fakecupti_kineto_start();
    // SAFETY: null name allowed.
    unsafe { fakecupti_launch_kernel(1_000, std::ptr::null()) };
    std::thread::sleep(Duration::from_millis(1));
    fakecupti_kineto_stop();
    unsafe { fakecupti_kineto_stats(&mut stats) };
    assert_eq!(
        (stats.kernels, stats.records, stats.subscribe_rc),
        (1, 2, SUCCESS)
    );
    // Kineto's stop switched off the kinds for every client.
    fakecupti_get_device();
    assert_eq!(counts().pending_records, 0);
}
