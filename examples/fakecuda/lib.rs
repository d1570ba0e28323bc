//! libfakecuda.so: NOT a CUDA driver. It exports a few libcuda symbols with
//! the driver's signatures and does nothing but take a known amount of time,
//! so tests can check gapscope's uprobe fallback against ground truth:
//!
//! - `cuLaunchKernel`: spins `gridDimX` µs (a launch-bound host);
//! - `cuLaunchKernelEx`: calls `cuLaunchKernel` for 100 µs (nested exported
//!   calls must count once, as the outer call);
//! - `cuStreamSynchronize`: sleeps as many µs as the stream handle's value;
//! - `cuMemcpyHtoD_v2`: spins one ns per byte.
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
    cuLaunchKernel(
        f,
        100,
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
