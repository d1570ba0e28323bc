//! libfakecuda.so: NOT a CUDA driver. It exports a few libcuda symbols with
//! the driver's signatures and does nothing but take a known amount of time,
//! so tests can check gapscope's uprobe fallback against ground truth:
//!
//! - `cuLaunchKernel`: spins `gridDimX` µs (a launch-bound host);
//! - `cuLaunchKernelEx`: calls `cuLaunchKernel` for 1 ms (nested exported
//!   calls must count once, as the outer call);
//! - `cuStreamSynchronize`: sleeps as many µs as the stream handle's value;
//! - `cuMemcpyHtoD_v2`: spins one ns per byte;
//! - `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`,
//!   `cuDeviceGetUuid_v2`: two devices, "Stand-in GPU N", UUID bytes
//!   0x10·(N+1) + i (what the CUPTI shim asks a driver once CUDA works).
#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::c_void;
use std::time::{Duration, Instant};

fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn cuLaunchKernel(
    _f: *mut c_void,
    grid_x: u32,
    _grid_y: u32,
    _grid_z: u32,
    _block_x: u32,
    _block_y: u32,
    _block_z: u32,
    _shared: u32,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> i32 {
    spin(Duration::from_micros(grid_x as u64));
    0
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn cuLaunchKernelEx(
    _config: *const c_void,
    f: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> i32 {
    // A millisecond: a caller's own clock around the call also takes in the
    // uprobes' traps and whatever stalls the thread in them, which no uprobe
    // can see — 68 µs once under a loaded test suite, 12% of five calls of
    // 100 µs, 1.4% of five of 1 ms.
    cuLaunchKernel(
        f,
        1000,
        1,
        1,
        1,
        1,
        1,
        0,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> i32 {
    std::thread::sleep(Duration::from_micros(stream as u64));
    0
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn cuMemcpyHtoD_v2(_dst: u64, _src: *const c_void, bytes: usize) -> i32 {
    spin(Duration::from_nanos(bytes as u64));
    0
}

const DEVICES: i32 = 2;

/// # Safety
/// Pointers as the driver API takes them: valid, and the buffer as long
/// as said.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> i32 {
    // SAFETY: the caller passes a valid pointer, as the driver API requires.
    *count = DEVICES;
    0
}

/// # Safety
/// Pointers as the driver API takes them: valid, and the buffer as long
/// as said.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut i32, ordinal: i32) -> i32 {
    if !(0..DEVICES).contains(&ordinal) {
        return 101; // CUDA_ERROR_INVALID_DEVICE
    }
    // SAFETY: as above.
    *device = ordinal;
    0
}

/// # Safety
/// Pointers as the driver API takes them: valid, and the buffer as long
/// as said.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(
    name: *mut std::ffi::c_char,
    len: i32,
    device: i32,
) -> i32 {
    let text = format!("Stand-in GPU {device}\0");
    if len <= 0 || text.len() > len as usize {
        return 1; // CUDA_ERROR_INVALID_VALUE
    }
    // SAFETY: the caller's buffer holds `len` bytes.
    std::ptr::copy_nonoverlapping(text.as_ptr(), name as *mut u8, text.len());
    0
}

/// # Safety
/// Pointers as the driver API takes them: valid, and the buffer as long
/// as said.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], device: i32) -> i32 {
    let bytes: [u8; 16] = std::array::from_fn(|i| 0x10 * (device as u8 + 1) + i as u8);
    // SAFETY: CUuuid is 16 bytes, the caller's.
    *uuid = bytes;
    0
}
