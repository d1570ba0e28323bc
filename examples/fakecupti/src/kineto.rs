//! torch.profiler's CUPTI client (Kineto), as it behaves at trace start and
//! stop, driving CUPTI only through the library's exported entry points.
//! It is the other client gapscope's shim has to live with: it subscribes,
//! re-registers the buffer callbacks (so the shim's outstanding buffers are
//! delivered to it), and installs its own TSC clock as the timestamp
//! callback, which it never takes back.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, MutexGuard};

use cudarc::cupti::sys;

use crate::{
    cuptiActivityDisable, cuptiActivityEnable, cuptiActivityFlushAll, cuptiActivityGetNextRecord,
    cuptiActivityRegisterCallbacks, cuptiActivityRegisterTimestampCallback, cuptiSubscribe,
    guarded, KinetoStats, KIND_CONCURRENT_KERNEL, KIND_DRIVER, KIND_KERNEL, KIND_MEMCPY,
    KIND_MEMSET, KIND_RUNTIME, KIND_SYNCHRONIZATION, SUCCESS,
};

const KINDS: &[u32] = &[
    KIND_CONCURRENT_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    KIND_DRIVER,
    KIND_SYNCHRONIZATION,
];
const BUFFER_SIZE: usize = 4 << 20;

struct Kineto {
    /// Addresses of the buffers it handed to CUPTI.
    allocated: HashSet<usize>,
    /// Its subscription, once it has one (it subscribes once per process).
    handle: Option<usize>,
    stats: KinetoStats,
}

static KINETO: LazyLock<Mutex<Kineto>> = LazyLock::new(|| {
    Mutex::new(Kineto {
        allocated: HashSet::new(),
        handle: None,
        stats: KinetoStats::default(),
    })
});

fn kineto() -> MutexGuard<'static, Kineto> {
    KINETO.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kineto's clock on x86: the TSC, in cycles, not CLOCK_MONOTONIC.
extern "C" fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc is available on every x86_64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        crate::realtime_ns().wrapping_mul(3)
    }
}

extern "C" fn on_callback(_: *mut c_void, _: sys::CUpti_CallbackDomain, _: u32, _: *const c_void) {}

extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    guarded((), || {
        let storage = vec![0u64; BUFFER_SIZE / 8].into_boxed_slice();
        let p = Box::into_raw(storage) as *mut u64 as *mut u8;
        kineto().allocated.insert(p as usize);
        // SAFETY: CUPTI passes valid out-pointers.
        unsafe {
            *buffer = p;
            *size = BUFFER_SIZE;
            *max_records = 0;
        }
    })
}

extern "C" fn buffer_completed(_: *mut c_void, _: u32, buffer: *mut u8, _: usize, valid: usize) {
    guarded((), || {
        if buffer.is_null() || !kineto().allocated.remove(&(buffer as usize)) {
            // Kineto logs "bufferCompleted called with unknown buffer" and
            // leaves it alone: another client's records are lost to both.
            kineto().stats.unknown_buffers += 1;
            return;
        }
        let (mut records, mut kernels) = (0, 0);
        let mut cur: *mut sys::CUpti_Activity = std::ptr::null_mut();
        // Like Kineto, it stops at the first record CUPTI will not return.
        // SAFETY: walking a buffer CUPTI filled, with CUPTI's own cursor.
        while unsafe { cuptiActivityGetNextRecord(buffer, valid, &mut cur) } == SUCCESS {
            records += 1;
            // SAFETY: `cur` points at a record CUPTI just returned.
            let kind = unsafe { std::ptr::read_unaligned(cur as *const u32) };
            if kind == KIND_CONCURRENT_KERNEL || kind == KIND_KERNEL {
                kernels += 1;
            }
        }
        {
            let mut k = kineto();
            k.stats.records += records;
            k.stats.kernels += kernels;
        }
        // SAFETY: allocated by `buffer_requested` as a boxed [u64] of this
        // size, and CUPTI has given it back.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                buffer as *mut u64,
                BUFFER_SIZE / 8,
            ))
        });
    })
}

/// Trace start: subscribe (once), take over the buffer and timestamp
/// callbacks, enable its activity kinds.
#[no_mangle]
pub extern "C" fn fakecupti_kineto_start() {
    guarded((), || {
        if kineto().handle.is_none() {
            let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
            // SAFETY: a writable handle, a callback with CUPTI's signature.
            let rc =
                unsafe { cuptiSubscribe(&mut handle, Some(on_callback), std::ptr::null_mut()) };
            let mut k = kineto();
            k.stats.subscribe_rc = rc;
            if rc == SUCCESS {
                k.handle = Some(handle as usize);
            }
        }
        cuptiActivityRegisterCallbacks(Some(buffer_requested), Some(buffer_completed));
        cuptiActivityRegisterTimestampCallback(Some(tsc));
        for &kind in KINDS {
            cuptiActivityEnable(kind);
        }
    })
}

/// Trace stop: a forced flush, then its kinds off; it keeps its
/// subscription and its callbacks.
#[no_mangle]
pub extern "C" fn fakecupti_kineto_stop() {
    guarded((), || {
        cuptiActivityFlushAll(1);
        for &kind in KINDS {
            cuptiActivityDisable(kind);
        }
    })
}

/// # Safety
/// `out` is null or points to a writable `KinetoStats`.
#[no_mangle]
pub unsafe extern "C" fn fakecupti_kineto_stats(out: *mut KinetoStats) {
    guarded((), || {
        if !out.is_null() {
            let s = kineto().stats;
            // SAFETY: checked non-null.
            unsafe { *out = s };
        }
    })
}

#[cfg(test)]
pub(crate) fn reset() {
    let mut k = kineto();
    k.handle = None;
    k.stats = KinetoStats::default();
}
