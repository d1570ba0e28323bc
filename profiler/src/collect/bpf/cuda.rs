//! The libcuda functions watched with uprobes when a process runs without
//! the CUPTI shim: CPU-side intervals of launches, copies, syncs and
//! allocations, with the stream handle or byte count they were given.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Launch,
    Copy,
    Memset,
    Sync,
    Alloc,
}

pub struct Function {
    pub symbol: &'static str,
    pub role: Role,
    /// Zero-based argument captured: the stream handle, or bytes for copies.
    pub arg: Option<u8>,
}

const fn f(symbol: &'static str, role: Role, arg: Option<u8>) -> Function {
    Function { symbol, role, arg }
}

/// Indexes are the uprobe cookies: append only.
pub const FUNCTIONS: &[Function] = &[
    f("cuLaunchKernel", Role::Launch, Some(8)),
    f("cuLaunchKernel_ptsz", Role::Launch, Some(8)),
    f("cuLaunchKernelEx", Role::Launch, None),
    f("cuLaunchKernelEx_ptsz", Role::Launch, None),
    f("cuGraphLaunch", Role::Launch, Some(1)),
    f("cuGraphLaunch_ptsz", Role::Launch, Some(1)),
    f("cuMemcpy", Role::Copy, Some(2)),
    f("cuMemcpy_ptds", Role::Copy, Some(2)),
    f("cuMemcpyAsync", Role::Copy, Some(3)),
    f("cuMemcpyAsync_ptsz", Role::Copy, Some(3)),
    f("cuMemcpyHtoD_v2", Role::Copy, Some(2)),
    f("cuMemcpyHtoD_v2_ptds", Role::Copy, Some(2)),
    f("cuMemcpyDtoH_v2", Role::Copy, Some(2)),
    f("cuMemcpyDtoH_v2_ptds", Role::Copy, Some(2)),
    f("cuMemcpyDtoD_v2", Role::Copy, Some(2)),
    f("cuMemcpyHtoDAsync_v2", Role::Copy, Some(3)),
    f("cuMemcpyHtoDAsync_v2_ptsz", Role::Copy, Some(3)),
    f("cuMemcpyDtoHAsync_v2", Role::Copy, Some(3)),
    f("cuMemcpyDtoHAsync_v2_ptsz", Role::Copy, Some(3)),
    f("cuMemcpyDtoDAsync_v2", Role::Copy, Some(3)),
    f("cuMemsetD8_v2", Role::Memset, None),
    f("cuMemsetD32_v2", Role::Memset, None),
    f("cuMemsetD8Async", Role::Memset, Some(3)),
    f("cuMemsetD32Async", Role::Memset, Some(3)),
    f("cuStreamSynchronize", Role::Sync, Some(0)),
    f("cuStreamSynchronize_ptsz", Role::Sync, Some(0)),
    f("cuCtxSynchronize", Role::Sync, None),
    f("cuEventSynchronize", Role::Sync, Some(0)),
    f("cuStreamWaitEvent", Role::Sync, Some(0)),
    f("cuStreamWaitEvent_ptsz", Role::Sync, Some(0)),
    f("cuMemAlloc_v2", Role::Alloc, Some(1)),
    f("cuMemAllocAsync", Role::Alloc, Some(1)),
    f("cuMemAllocHost_v2", Role::Alloc, Some(1)),
    f("cuMemFree_v2", Role::Alloc, None),
    f("cuMemFreeAsync", Role::Alloc, Some(1)),
    f("cuMemFreeHost", Role::Alloc, None),
];

pub fn role_of(symbol: &str) -> Option<Role> {
    FUNCTIONS
        .iter()
        .find(|f| f.symbol == symbol)
        .map(|f| f.role)
}
