//! Reading CUPTI activity records.
//!
//! CUPTI hands over buffers of variable-size records whose layout grows with
//! each CUDA release (CUpti_ActivityKernel9 in CUDA 12.x, Kernel10..13 in
//! 13.x, Memcpy5/6/7, Memset4/5, Synchronization/2). Every later version keeps
//! the earlier fields where they were and only appends, so this module reads
//! only the common prefix, at the offsets of cudarc's CUDA 12.9 bindings. The
//! tests pin those offsets to the values in CUDA's headers, which the 13.x
//! records share.

use std::ffi::CStr;
use std::mem::offset_of;

use cudarc::cupti::sys;

use crate::record::{ApiDomain, GpuRecord};

pub const KIND_MEMCPY: u32 = 1;
pub const KIND_MEMSET: u32 = 2;
pub const KIND_KERNEL: u32 = 3;
pub const KIND_DRIVER: u32 = 4;
pub const KIND_RUNTIME: u32 = 5;
pub const KIND_CONCURRENT_KERNEL: u32 = 10;
pub const KIND_MARKER: u32 = 12;
pub const KIND_SYNCHRONIZATION: u32 = 38;

type Kernel = sys::CUpti_ActivityKernel9;
type Memcpy = sys::CUpti_ActivityMemcpy5;
type Memset = sys::CUpti_ActivityMemset4;
type Sync = sys::CUpti_ActivitySynchronization;
type Api = sys::CUpti_ActivityAPI;
type Marker = sys::CUpti_ActivityMarker2;

/// What became of one activity record.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    Record(GpuRecord),
    /// A kind this module does not read (counted by the caller).
    Skipped(u32),
    /// A record CUPTI handed over before it was complete (a forced flush
    /// while the GPU still ran it): zero or reversed timestamps. Read as
    /// it stands it would claim time from the epoch, so it is counted
    /// instead.
    Incomplete(u32),
}

/// The raw (start, end) of a timed record, before any clock offset.
///
/// # Safety
/// As for [`decode`].
unsafe fn raw_span(rec: *const u8, kind: u32) -> Option<(u64, u64)> {
    let pair = |s: usize, e: usize| Some((at::<u64>(rec, s), at::<u64>(rec, e)));
    match kind {
        KIND_KERNEL | KIND_CONCURRENT_KERNEL => {
            pair(offset_of!(Kernel, start), offset_of!(Kernel, end))
        }
        KIND_MEMCPY => pair(offset_of!(Memcpy, start), offset_of!(Memcpy, end)),
        KIND_MEMSET => pair(offset_of!(Memset, start), offset_of!(Memset, end)),
        KIND_SYNCHRONIZATION => pair(offset_of!(Sync, start), offset_of!(Sync, end)),
        KIND_RUNTIME | KIND_DRIVER => pair(offset_of!(Api, start), offset_of!(Api, end)),
        KIND_MARKER => {
            let t = at::<u64>(rec, offset_of!(Marker, timestamp));
            Some((t, t))
        }
        _ => None,
    }
}

/// Reads a `T` at `offset` bytes into the record (records are packed).
///
/// # Safety
/// `rec + offset .. + size_of::<T>()` must be readable.
unsafe fn at<T: Copy>(rec: *const u8, offset: usize) -> T {
    std::ptr::read_unaligned(rec.add(offset) as *const T)
}

/// # Safety
/// `p` is null or points to a NUL-terminated string.
unsafe fn c_string(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Decodes one CUPTI activity record. `clock_offset` is added to every
/// timestamp (0 when CUPTI already timestamps with CLOCK_MONOTONIC).
///
/// # Safety
/// `rec` must point to a complete activity record as CUPTI delivers it (at
/// least as large as the prefix read for its kind), and any name pointers
/// in it must be valid.
pub unsafe fn decode(rec: *const u8, clock_offset: i64, pid: u32) -> Decoded {
    let ts = |t: u64| (t as i64).wrapping_add(clock_offset) as u64;
    let kind: u32 = at(rec, 0);
    if raw_span(rec, kind).is_some_and(|(s, e)| s == 0 || e < s) {
        return Decoded::Incomplete(kind);
    }
    let record = match kind {
        KIND_KERNEL | KIND_CONCURRENT_KERNEL => GpuRecord::Kernel {
            start: ts(at(rec, offset_of!(Kernel, start))),
            end: ts(at(rec, offset_of!(Kernel, end))),
            device: at(rec, offset_of!(Kernel, deviceId)),
            context: at(rec, offset_of!(Kernel, contextId)),
            stream: at(rec, offset_of!(Kernel, streamId)),
            correlation: at(rec, offset_of!(Kernel, correlationId)),
            grid: [
                at(rec, offset_of!(Kernel, gridX)),
                at(rec, offset_of!(Kernel, gridY)),
                at(rec, offset_of!(Kernel, gridZ)),
            ],
            block: [
                at(rec, offset_of!(Kernel, blockX)),
                at(rec, offset_of!(Kernel, blockY)),
                at(rec, offset_of!(Kernel, blockZ)),
            ],
            name: c_string(at(rec, offset_of!(Kernel, name))).into(),
        },
        KIND_MEMCPY => GpuRecord::Memcpy {
            start: ts(at(rec, offset_of!(Memcpy, start))),
            end: ts(at(rec, offset_of!(Memcpy, end))),
            device: at(rec, offset_of!(Memcpy, deviceId)),
            context: at(rec, offset_of!(Memcpy, contextId)),
            stream: at(rec, offset_of!(Memcpy, streamId)),
            correlation: at(rec, offset_of!(Memcpy, correlationId)),
            bytes: at(rec, offset_of!(Memcpy, bytes)),
            copy_kind: at(rec, offset_of!(Memcpy, copyKind)),
            src_kind: at(rec, offset_of!(Memcpy, srcKind)),
            dst_kind: at(rec, offset_of!(Memcpy, dstKind)),
        },
        KIND_MEMSET => GpuRecord::Memset {
            start: ts(at(rec, offset_of!(Memset, start))),
            end: ts(at(rec, offset_of!(Memset, end))),
            device: at(rec, offset_of!(Memset, deviceId)),
            context: at(rec, offset_of!(Memset, contextId)),
            stream: at(rec, offset_of!(Memset, streamId)),
            correlation: at(rec, offset_of!(Memset, correlationId)),
            bytes: at(rec, offset_of!(Memset, bytes)),
            value: at(rec, offset_of!(Memset, value)),
            memory_kind: at(rec, offset_of!(Memset, memoryKind)),
        },
        KIND_SYNCHRONIZATION => GpuRecord::Sync {
            start: ts(at(rec, offset_of!(Sync, start))),
            end: ts(at(rec, offset_of!(Sync, end))),
            context: at(rec, offset_of!(Sync, contextId)),
            stream: at(rec, offset_of!(Sync, streamId)),
            correlation: at(rec, offset_of!(Sync, correlationId)),
            sync_type: at::<u32>(rec, offset_of!(Sync, type_)) as u8,
            event: at(rec, offset_of!(Sync, cudaEventId)),
        },
        KIND_RUNTIME | KIND_DRIVER => GpuRecord::Api {
            domain: if kind == KIND_RUNTIME {
                ApiDomain::Runtime
            } else {
                ApiDomain::Driver
            },
            cbid: at(rec, offset_of!(Api, cbid)),
            start: ts(at(rec, offset_of!(Api, start))),
            end: ts(at(rec, offset_of!(Api, end))),
            pid: match at::<u32>(rec, offset_of!(Api, processId)) {
                0 => pid,
                p => p,
            },
            tid: at(rec, offset_of!(Api, threadId)),
            correlation: at(rec, offset_of!(Api, correlationId)),
        },
        KIND_MARKER => GpuRecord::Marker {
            ts: ts(at(rec, offset_of!(Marker, timestamp))),
            id: at(rec, offset_of!(Marker, id)),
            flags: at(rec, offset_of!(Marker, flags)),
            name: c_string(at(rec, offset_of!(Marker, name))),
            domain: c_string(at(rec, offset_of!(Marker, domain))),
        },
        other => return Decoded::Skipped(other),
    };
    Decoded::Record(record)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::mem::{size_of, zeroed};

    /// Offsets from cupti_activity.h (CUDA 12.x; identical in the 13.x
    /// records, which only append fields).
    #[test]
    fn prefix_offsets_match_cuptis_headers() {
        assert_eq!(offset_of!(Kernel, start), 16);
        assert_eq!(offset_of!(Kernel, end), 24);
        assert_eq!(offset_of!(Kernel, deviceId), 40);
        assert_eq!(offset_of!(Kernel, contextId), 44);
        assert_eq!(offset_of!(Kernel, streamId), 48);
        assert_eq!(offset_of!(Kernel, gridX), 52);
        assert_eq!(offset_of!(Kernel, blockZ), 72);
        assert_eq!(offset_of!(Kernel, correlationId), 92);
        assert_eq!(offset_of!(Kernel, name), 104);
        assert_eq!(offset_of!(Memcpy, copyKind), 4);
        assert_eq!(offset_of!(Memcpy, bytes), 8);
        assert_eq!(offset_of!(Memcpy, start), 16);
        assert_eq!(offset_of!(Memcpy, deviceId), 32);
        assert_eq!(offset_of!(Memcpy, correlationId), 44);
        assert_eq!(offset_of!(Memset, value), 4);
        assert_eq!(offset_of!(Memset, bytes), 8);
        assert_eq!(offset_of!(Memset, correlationId), 44);
        assert_eq!(offset_of!(Memset, memoryKind), 50);
        assert_eq!(offset_of!(Sync, start), 8);
        assert_eq!(offset_of!(Sync, cudaEventId), 36);
        assert_eq!(offset_of!(Api, cbid), 4);
        assert_eq!(offset_of!(Api, threadId), 28);
        assert_eq!(offset_of!(Api, correlationId), 32);
        assert_eq!(offset_of!(Marker, name), 40);
        // Record sizes of the oldest supported versions: the prefix read for
        // each kind fits in every version.
        assert!(size_of::<Kernel>() > offset_of!(Kernel, name) + 8);
        assert_eq!(size_of::<Api>(), 40);
    }

    /// A CUPTI-style buffer: records back to back, 8-byte aligned, each as
    /// large as its struct; walked the way the shim walks CUPTI's buffers.
    pub(crate) struct SyntheticBuffer {
        pub bytes: Vec<u64>, // u64 storage keeps 8-byte alignment
        pub len: usize,
        pub names: Vec<std::ffi::CString>,
    }

    impl SyntheticBuffer {
        pub fn new() -> Self {
            SyntheticBuffer {
                bytes: vec![0; 4096],
                len: 0,
                names: Vec::new(),
            }
        }

        pub fn push<T: Copy>(&mut self, rec: &T) {
            let size = size_of::<T>().div_ceil(8) * 8;
            assert!(self.len + size <= self.bytes.len() * 8);
            // SAFETY: copying a POD record into our aligned storage.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    rec as *const T as *const u8,
                    (self.bytes.as_mut_ptr() as *mut u8).add(self.len),
                    size_of::<T>(),
                );
            }
            self.len += size;
        }

        pub fn name(&mut self, s: &str) -> *const std::ffi::c_char {
            self.names.push(std::ffi::CString::new(s).unwrap());
            self.names.last().unwrap().as_ptr()
        }

        /// Record pointers, given each kind's size (CUPTI knows them itself).
        pub fn records(&self) -> Vec<*const u8> {
            let base = self.bytes.as_ptr() as *const u8;
            let mut out = Vec::new();
            let mut off = 0;
            while off < self.len {
                // SAFETY: within the written part of the buffer.
                let p = unsafe { base.add(off) };
                let kind: u32 = unsafe { at(p, 0) };
                let size = match kind {
                    KIND_KERNEL | KIND_CONCURRENT_KERNEL => size_of::<Kernel>(),
                    KIND_MEMCPY => size_of::<Memcpy>(),
                    KIND_MEMSET => size_of::<Memset>(),
                    KIND_SYNCHRONIZATION => size_of::<Sync>(),
                    KIND_RUNTIME | KIND_DRIVER => size_of::<Api>(),
                    KIND_MARKER => size_of::<Marker>(),
                    _ => size_of::<sys::CUpti_ActivityOverhead>(),
                };
                out.push(p);
                off += size.div_ceil(8) * 8;
            }
            out
        }
    }

    pub(crate) fn kernel(buf: &mut SyntheticBuffer, start: u64, end: u64, corr: u32) -> Kernel {
        // SAFETY: CUPTI records are plain data; zero is a valid pattern.
        let mut k: Kernel = unsafe { zeroed() };
        k.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.start = start;
        k.end = end;
        k.deviceId = 0;
        k.contextId = 1;
        k.streamId = 7;
        k.correlationId = corr;
        k.gridX = 1024;
        k.gridY = 2;
        k.gridZ = 1;
        k.blockX = 256;
        k.blockY = 1;
        k.blockZ = 1;
        k.name = buf.name("_Z10vector_addPfS_S_i");
        k
    }

    pub(crate) fn memcpy(start: u64, end: u64, corr: u32, src_kind: u8) -> Memcpy {
        // SAFETY: as above.
        let mut m: Memcpy = unsafe { zeroed() };
        m.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY;
        m.copyKind = crate::record::copy_kind::HTOD;
        m.srcKind = src_kind;
        m.dstKind = crate::record::memory_kind::DEVICE;
        m.bytes = 64 << 20;
        m.start = start;
        m.end = end;
        m.deviceId = 0;
        m.contextId = 1;
        m.streamId = 7;
        m.correlationId = corr;
        m
    }

    #[test]
    fn synthetic_buffer_decodes_with_every_field_intact() {
        let mut buf = SyntheticBuffer::new();
        let k = kernel(&mut buf, 1_000, 2_000, 11);
        buf.push(&k);
        buf.push(&memcpy(
            2_100,
            2_600,
            12,
            crate::record::memory_kind::PAGEABLE,
        ));
        buf.push(&memcpy(
            2_700,
            2_800,
            13,
            crate::record::memory_kind::PINNED,
        ));
        // SAFETY: zeroed plain-data records, fields set below.
        let mut ms: Memset = unsafe { zeroed() };
        ms.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET;
        ms.value = 0;
        ms.bytes = 4096;
        ms.start = 3_000;
        ms.end = 3_010;
        ms.streamId = 7;
        ms.correlationId = 14;
        ms.memoryKind = 3;
        buf.push(&ms);
        let mut sy: Sync = unsafe { zeroed() };
        sy.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
        sy.type_ = sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
        sy.start = 3_100;
        sy.end = 3_900;
        sy.contextId = 1;
        sy.streamId = 7;
        sy.correlationId = 15;
        sy.cudaEventId = 0;
        buf.push(&sy);
        for (kind, cbid) in [
            (sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_RUNTIME, 211u32),
            (sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER, 307),
        ] {
            let mut a: Api = unsafe { zeroed() };
            a.kind = kind;
            a.cbid = cbid;
            a.start = 900;
            a.end = 990;
            a.processId = 0; // CUPTI leaves it 0 on some versions
            a.threadId = 4243;
            a.correlationId = 11;
            buf.push(&a);
        }
        let mut ov: sys::CUpti_ActivityOverhead = unsafe { zeroed() };
        ov.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_OVERHEAD;
        buf.push(&ov);

        let decoded: Vec<Decoded> = buf
            .records()
            .into_iter()
            .map(|p| unsafe { decode(p, 100, 4242) })
            .collect();
        assert_eq!(decoded.len(), 8);
        assert_eq!(
            decoded[0],
            Decoded::Record(GpuRecord::Kernel {
                start: 1_100,
                end: 2_100,
                device: 0,
                context: 1,
                stream: 7,
                correlation: 11,
                grid: [1024, 2, 1],
                block: [256, 1, 1],
                name: "_Z10vector_addPfS_S_i".into(),
            })
        );
        assert_eq!(
            decoded[1],
            Decoded::Record(GpuRecord::Memcpy {
                start: 2_200,
                end: 2_700,
                device: 0,
                context: 1,
                stream: 7,
                correlation: 12,
                bytes: 64 << 20,
                copy_kind: crate::record::copy_kind::HTOD,
                src_kind: crate::record::memory_kind::PAGEABLE,
                dst_kind: crate::record::memory_kind::DEVICE,
            })
        );
        assert!(matches!(&decoded[2],
            Decoded::Record(GpuRecord::Memcpy { src_kind, .. }) if *src_kind == crate::record::memory_kind::PINNED));
        assert_eq!(
            decoded[3],
            Decoded::Record(GpuRecord::Memset {
                start: 3_100,
                end: 3_110,
                device: 0,
                context: 0,
                stream: 7,
                correlation: 14,
                bytes: 4096,
                value: 0,
                memory_kind: 3,
            })
        );
        assert_eq!(
            decoded[4],
            Decoded::Record(GpuRecord::Sync {
                start: 3_200,
                end: 4_000,
                context: 1,
                stream: 7,
                correlation: 15,
                sync_type: crate::record::sync_type::STREAM_SYNCHRONIZE,
                event: 0,
            })
        );
        assert_eq!(
            decoded[5],
            Decoded::Record(GpuRecord::Api {
                domain: ApiDomain::Runtime,
                cbid: 211,
                start: 1_000,
                end: 1_090,
                pid: 4242,
                tid: 4243,
                correlation: 11,
            })
        );
        assert!(matches!(
            &decoded[6],
            Decoded::Record(GpuRecord::Api {
                domain: ApiDomain::Driver,
                cbid: 307,
                ..
            })
        ));
        assert_eq!(decoded[7], Decoded::Skipped(17));
    }

    #[test]
    fn records_with_missing_timestamps_are_incomplete_not_read() {
        let mut buf = SyntheticBuffer::new();
        let k = kernel(&mut buf, 0, 0, 1); // a forced flush's unfinished kernel
        buf.push(&k);
        let k = kernel(&mut buf, 5_000, 4_000, 2); // end before start
        buf.push(&k);
        let k = kernel(&mut buf, 5_000, 6_000, 3);
        buf.push(&k);
        let decoded: Vec<Decoded> = buf
            .records()
            .into_iter()
            .map(|p| unsafe { decode(p, 0, 1) })
            .collect();
        assert_eq!(decoded[0], Decoded::Incomplete(KIND_CONCURRENT_KERNEL));
        assert_eq!(decoded[1], Decoded::Incomplete(KIND_CONCURRENT_KERNEL));
        assert!(matches!(
            decoded[2],
            Decoded::Record(GpuRecord::Kernel { start: 5_000, .. })
        ));
    }
}
