//! The structs of the stand-in's control API (`fakecupti_*`), shared by the
//! library and by gs-cuda-host, which includes this file by path: the host
//! must reach the one copy of the stand-in that the CUPTI shim also uses,
//! through dlopen, so it cannot link the library's code itself.

/// What the emulated torch.profiler (Kineto) client saw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KinetoStats {
    /// Kernel records its completed-callback read.
    pub kernels: u64,
    /// All records its completed-callback read.
    pub records: u64,
    /// Buffers delivered to it that it had not handed out (another client's).
    pub unknown_buffers: u64,
    /// What its cuptiSubscribe returned (39: another subscriber held CUPTI).
    pub subscribe_rc: u32,
}

/// Ground truth kept by the stand-in, over the life of the process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Kernels launched through `fakecupti_launch_kernel`.
    pub launched: u64,
    /// Records dropped for want of a buffer (never reset, unlike
    /// cuptiActivityGetNumDroppedRecords).
    pub dropped: u64,
    /// Records handed to a completed-callback, whichever client it was.
    pub delivered_records: u64,
    /// Records written into buffers not yet delivered.
    pub pending_records: u64,
    /// Calls into the CUPTI API (cupti* entry points), by any client.
    pub client_calls: u64,
}
