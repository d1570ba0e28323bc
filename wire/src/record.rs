//! What the GPU did, as the shim reports it: one record per kernel, copy,
//! memset, synchronization, CUDA API call or NVTX marker. Timestamps are
//! CLOCK_MONOTONIC nanoseconds, the clock of the eBPF timeline.

use serde::{Deserialize, Serialize};

/// `CUpti_ActivityMemcpyKind`, kept as the raw value plus names.
pub mod copy_kind {
    pub const HTOD: u8 = 1;
    pub const DTOH: u8 = 2;
    pub const HTOA: u8 = 3;
    pub const ATOH: u8 = 4;
    pub const ATOA: u8 = 5;
    pub const ATOD: u8 = 6;
    pub const DTOA: u8 = 7;
    pub const DTOD: u8 = 8;
    pub const HTOH: u8 = 9;
    pub const PTOP: u8 = 10;

    pub fn name(k: u8) -> &'static str {
        match k {
            HTOD => "HtoD",
            DTOH => "DtoH",
            HTOA => "HtoA",
            ATOH => "AtoH",
            ATOA => "AtoA",
            ATOD => "AtoD",
            DTOA => "DtoA",
            DTOD => "DtoD",
            HTOH => "HtoH",
            PTOP => "PtoP",
            _ => "unknown",
        }
    }
}

/// `CUpti_ActivityMemoryKind`: where copied memory lives.
pub mod memory_kind {
    pub const PAGEABLE: u8 = 1;
    pub const PINNED: u8 = 2;
    pub const DEVICE: u8 = 3;
    pub const ARRAY: u8 = 4;
    pub const MANAGED: u8 = 5;
    pub const DEVICE_STATIC: u8 = 6;
    pub const MANAGED_STATIC: u8 = 7;

    pub fn name(k: u8) -> &'static str {
        match k {
            PAGEABLE => "pageable",
            PINNED => "pinned",
            DEVICE => "device",
            ARRAY => "array",
            MANAGED => "managed",
            DEVICE_STATIC => "device-static",
            MANAGED_STATIC => "managed-static",
            _ => "unknown",
        }
    }
}

/// `CUpti_ActivitySynchronizationType`.
pub mod sync_type {
    pub const EVENT_SYNCHRONIZE: u8 = 1;
    pub const STREAM_WAIT_EVENT: u8 = 2;
    pub const STREAM_SYNCHRONIZE: u8 = 3;
    pub const CONTEXT_SYNCHRONIZE: u8 = 4;

    pub fn name(k: u8) -> &'static str {
        match k {
            EVENT_SYNCHRONIZE => "cudaEventSynchronize",
            STREAM_WAIT_EVENT => "cudaStreamWaitEvent",
            STREAM_SYNCHRONIZE => "cudaStreamSynchronize",
            CONTEXT_SYNCHRONIZE => "cudaDeviceSynchronize",
            _ => "unknown",
        }
    }
}

/// Which CUDA API an `Api` record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApiDomain {
    Runtime,
    Driver,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GpuRecord {
    Kernel {
        start: u64,
        end: u64,
        device: u32,
        context: u32,
        stream: u32,
        correlation: u32,
        grid: [i32; 3],
        block: [i32; 3],
        /// As CUPTI gives it (mangled for C++); demangled for display.
        /// Shared: the same few names repeat for millions of launches.
        name: std::sync::Arc<str>,
    },
    Memcpy {
        start: u64,
        end: u64,
        device: u32,
        context: u32,
        stream: u32,
        correlation: u32,
        bytes: u64,
        copy_kind: u8,
        src_kind: u8,
        dst_kind: u8,
    },
    Memset {
        start: u64,
        end: u64,
        device: u32,
        context: u32,
        stream: u32,
        correlation: u32,
        bytes: u64,
        value: u32,
        memory_kind: u16,
    },
    /// A synchronization the host waited in (CPU-side interval).
    Sync {
        start: u64,
        end: u64,
        context: u32,
        stream: u32,
        correlation: u32,
        sync_type: u8,
        event: u32,
    },
    /// A CUDA runtime or driver API call (CPU-side interval of a thread).
    Api {
        domain: ApiDomain,
        cbid: u32,
        start: u64,
        end: u64,
        pid: u32,
        tid: u32,
        correlation: u32,
    },
    /// An NVTX marker or range end point.
    Marker {
        ts: u64,
        id: u32,
        flags: u32,
        name: String,
        domain: String,
    },
    /// A GPU the process uses.
    Device { id: u32, name: String },
    /// An NVTX range (push/pop or start/end) of host thread `tid`, or an
    /// NVTX mark when `start == end`. Kept in the session: training steps
    /// are often NVTX ranges.
    Range {
        start: u64,
        end: u64,
        tid: u32,
        name: String,
        domain: String,
    },
    /// Which physical GPU the process's device `id` (its CUDA ordinal) is:
    /// its UUID as NVML and nvidia-smi write it (`GPU-…`). Processes that
    /// see different GPUs under one ordinal (CUDA_VISIBLE_DEVICES per rank)
    /// are told apart by it. (Last: sessions store these records, and an
    /// older file's variants keep their numbers.)
    DeviceUuid { id: u32, uuid: String },
}

impl GpuRecord {
    /// The moment the record starts (or happens), for ordering.
    pub fn start(&self) -> u64 {
        match self {
            GpuRecord::Kernel { start, .. }
            | GpuRecord::Memcpy { start, .. }
            | GpuRecord::Memset { start, .. }
            | GpuRecord::Sync { start, .. }
            | GpuRecord::Api { start, .. }
            | GpuRecord::Range { start, .. } => *start,
            GpuRecord::Marker { ts, .. } => *ts,
            GpuRecord::Device { .. } | GpuRecord::DeviceUuid { .. } => 0,
        }
    }

    /// The time the record covers, `(start, end)`; None for a device
    /// description, which happens at no time.
    pub fn span(&self) -> Option<(u64, u64)> {
        match self {
            GpuRecord::Kernel { start, end, .. }
            | GpuRecord::Memcpy { start, end, .. }
            | GpuRecord::Memset { start, end, .. }
            | GpuRecord::Sync { start, end, .. }
            | GpuRecord::Api { start, end, .. }
            | GpuRecord::Range { start, end, .. } => Some((*start, *end)),
            GpuRecord::Marker { ts, .. } => Some((*ts, *ts)),
            GpuRecord::Device { .. } | GpuRecord::DeviceUuid { .. } => None,
        }
    }
}
