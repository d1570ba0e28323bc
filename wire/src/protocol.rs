//! The wire protocol between the shim (inside the CUDA process) and the
//! profiler: little-endian, length-prefixed frames over a Unix socket.
//!
//! ```text
//! frame   = len:u32  type:u8  payload[len]
//! Hello   = magic "GSCU"  version:u16  pid:u32  driver:u32  cupti:u32  clock:u8  shim:str
//! Records = count:u32  record*            record = tag:u8  fields (see `put_record`)
//! Dropped = cupti:u64  shim:u64          (cumulative counts)
//! Lost    = start:u64  end:u64  records:u64  (records the shim dropped, and
//!                                            the time they covered)
//! Info    = str                           (a line for the session's notes)
//! Goodbye = (empty)                       (the process is flushing and leaving)
//! Blind   = start:u64  reason:str         (from start on, the shim sees nothing:
//!                                          another CUPTI client took CUPTI)
//! Sighted = at:u64                        (the shim sees from `at`: when it begins
//!                                          recording, and again after a Blind)
//! Skipped = incomplete:u64  unknown:u64   (cumulative: records CUPTI delivered
//!                                          incomplete, records of kinds not read)
//! str     = len:u32  utf8[len]
//! ```
//!
//! Decoding never trusts a length: every read is bounds-checked and frames
//! above [`MAX_FRAME`] are refused before anything is allocated for them.

use crate::record::{ApiDomain, GpuRecord};

pub const MAGIC: &[u8; 4] = b"GSCU";
/// 2 added the Lost frame; 3 the Blind, Sighted and Skipped frames and the
/// Range record. A profiler reads every version up to its own and refuses a
/// newer shim at its hello, rather than at a frame it does not know halfway
/// through a run.
pub const VERSION: u16 = 3;
/// Largest payload accepted. Batches are cut well below it.
pub const MAX_FRAME: usize = 16 << 20;
/// Longest string accepted in a frame (kernel names can be long).
const MAX_STR: usize = 64 << 10;

/// How the shim put CUPTI's timestamps on CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ClockMethod {
    /// `cuptiActivityRegisterTimestampCallback` with CLOCK_MONOTONIC: exact.
    TimestampCallback,
    /// CUPTI's own clock shifted by an offset measured against
    /// CLOCK_MONOTONIC at start-up (older CUPTI).
    MeasuredOffset,
    /// A source that timestamps with CLOCK_MONOTONIC itself (the simulated device).
    Native,
}

impl ClockMethod {
    fn to_u8(self) -> u8 {
        match self {
            ClockMethod::TimestampCallback => 1,
            ClockMethod::MeasuredOffset => 2,
            ClockMethod::Native => 3,
        }
    }
    fn from_u8(v: u8) -> Option<ClockMethod> {
        match v {
            1 => Some(ClockMethod::TimestampCallback),
            2 => Some(ClockMethod::MeasuredOffset),
            3 => Some(ClockMethod::Native),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hello {
    pub version: u16,
    pub pid: u32,
    /// cuDriverGetVersion, e.g. 12090; 0 when unknown.
    pub driver_version: u32,
    /// cuptiGetVersion (the CUPTI API version); 0 when there is no CUPTI.
    pub cupti_version: u32,
    pub clock: ClockMethod,
    /// Who is speaking: "gapscope-cupti 0.1.0", "simulated device ...".
    pub source: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    Hello(Hello),
    Records(Vec<GpuRecord>),
    Dropped {
        cupti: u64,
        shim: u64,
    },
    /// `records` records covering `[start, end]` (CLOCK_MONOTONIC ns) that
    /// the shim had to drop: the profiler's view of that span is partial.
    Lost {
        start: u64,
        end: u64,
        records: u64,
    },
    Info(String),
    Goodbye,
    /// From `start` (CLOCK_MONOTONIC ns) on, the shim sees nothing, for
    /// `reason` (another CUPTI client took CUPTI over): the span is lost,
    /// never idle. Open until a `Sighted` frame or the end of the stream.
    Blind {
        start: u64,
        reason: String,
    },
    /// The shim sees again from `at`: closes the open `Blind` span.
    Sighted {
        at: u64,
    },
    /// Cumulative counts of records the shim did not pass on: delivered
    /// incomplete by CUPTI (zero timestamps, an error mid-buffer), or of
    /// kinds it does not read.
    Skipped {
        incomplete: u64,
        unknown: u64,
    },
}

const T_HELLO: u8 = 1;
const T_RECORDS: u8 = 2;
const T_DROPPED: u8 = 3;
const T_INFO: u8 = 4;
const T_GOODBYE: u8 = 5;
const T_LOST: u8 = 6;
const T_BLIND: u8 = 7;
const T_SIGHTED: u8 = 8;
const T_SKIPPED: u8 = 9;

const R_KERNEL: u8 = 1;
const R_MEMCPY: u8 = 2;
const R_MEMSET: u8 = 3;
const R_SYNC: u8 = 4;
const R_API: u8 = 5;
const R_MARKER: u8 = 6;
const R_DEVICE: u8 = 7;
const R_RANGE: u8 = 8;
const R_DEVICE_UUID: u8 = 9;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("unknown frame type {0}")]
    UnknownFrame(u8),
    #[error("unknown record tag {0}")]
    UnknownRecord(u8),
    #[error("frame ends inside a field")]
    Short,
    #[error("{0} bytes left over after the frame's fields")]
    Trailing(usize),
    #[error("not a gapscope GPU stream (bad magic)")]
    BadMagic,
    #[error("protocol version {0} is newer than this profiler understands ({VERSION})")]
    Version(u16),
    #[error("invalid UTF-8 in a string field")]
    Utf8,
    #[error("string of {0} bytes exceeds the limit")]
    LongString(usize),
    #[error("unknown clock method {0}")]
    Clock(u8),
}

// ---------------------------------------------------------------- encoding

fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(MAX_STR)];
    // Cut on a char boundary so the result stays valid UTF-8.
    let mut n = b.len();
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    put_u32(out, n as u32);
    out.extend_from_slice(&s.as_bytes()[..n]);
}

/// Appends one record's encoding.
pub fn put_record(out: &mut Vec<u8>, r: &GpuRecord) {
    match r {
        GpuRecord::Kernel {
            start,
            end,
            device,
            context,
            stream,
            correlation,
            grid,
            block,
            name,
        } => {
            put_u8(out, R_KERNEL);
            put_u64(out, *start);
            put_u64(out, *end);
            put_u32(out, *device);
            put_u32(out, *context);
            put_u32(out, *stream);
            put_u32(out, *correlation);
            for v in grid.iter().chain(block) {
                put_i32(out, *v);
            }
            put_str(out, name);
        }
        GpuRecord::Memcpy {
            start,
            end,
            device,
            context,
            stream,
            correlation,
            bytes,
            copy_kind,
            src_kind,
            dst_kind,
        } => {
            put_u8(out, R_MEMCPY);
            put_u64(out, *start);
            put_u64(out, *end);
            put_u32(out, *device);
            put_u32(out, *context);
            put_u32(out, *stream);
            put_u32(out, *correlation);
            put_u64(out, *bytes);
            put_u8(out, *copy_kind);
            put_u8(out, *src_kind);
            put_u8(out, *dst_kind);
        }
        GpuRecord::Memset {
            start,
            end,
            device,
            context,
            stream,
            correlation,
            bytes,
            value,
            memory_kind,
        } => {
            put_u8(out, R_MEMSET);
            put_u64(out, *start);
            put_u64(out, *end);
            put_u32(out, *device);
            put_u32(out, *context);
            put_u32(out, *stream);
            put_u32(out, *correlation);
            put_u64(out, *bytes);
            put_u32(out, *value);
            put_u16(out, *memory_kind);
        }
        GpuRecord::Sync {
            start,
            end,
            context,
            stream,
            correlation,
            sync_type,
            event,
        } => {
            put_u8(out, R_SYNC);
            put_u64(out, *start);
            put_u64(out, *end);
            put_u32(out, *context);
            put_u32(out, *stream);
            put_u32(out, *correlation);
            put_u8(out, *sync_type);
            put_u32(out, *event);
        }
        GpuRecord::Api {
            domain,
            cbid,
            start,
            end,
            pid,
            tid,
            correlation,
        } => {
            put_u8(out, R_API);
            put_u8(
                out,
                match domain {
                    ApiDomain::Runtime => 1,
                    ApiDomain::Driver => 2,
                },
            );
            put_u32(out, *cbid);
            put_u64(out, *start);
            put_u64(out, *end);
            put_u32(out, *pid);
            put_u32(out, *tid);
            put_u32(out, *correlation);
        }
        GpuRecord::Marker {
            ts,
            id,
            flags,
            name,
            domain,
        } => {
            put_u8(out, R_MARKER);
            put_u64(out, *ts);
            put_u32(out, *id);
            put_u32(out, *flags);
            put_str(out, name);
            put_str(out, domain);
        }
        GpuRecord::Device { id, name } => {
            put_u8(out, R_DEVICE);
            put_u32(out, *id);
            put_str(out, name);
        }
        GpuRecord::DeviceUuid { id, uuid } => {
            put_u8(out, R_DEVICE_UUID);
            put_u32(out, *id);
            put_str(out, uuid);
        }
        GpuRecord::Range {
            start,
            end,
            tid,
            name,
            domain,
        } => {
            put_u8(out, R_RANGE);
            put_u64(out, *start);
            put_u64(out, *end);
            put_u32(out, *tid);
            put_str(out, name);
            put_str(out, domain);
        }
    }
}

/// Starts a frame in `out`; returns where its length goes.
fn begin(out: &mut Vec<u8>, ty: u8) -> usize {
    let at = out.len();
    put_u32(out, 0);
    put_u8(out, ty);
    at
}

fn end(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 5) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends the encoding of `frame` to `out`.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    match frame {
        Frame::Hello(h) => {
            let at = begin(out, T_HELLO);
            out.extend_from_slice(MAGIC);
            put_u16(out, h.version);
            put_u32(out, h.pid);
            put_u32(out, h.driver_version);
            put_u32(out, h.cupti_version);
            put_u8(out, h.clock.to_u8());
            put_str(out, &h.source);
            end(out, at);
        }
        Frame::Records(records) => {
            let mut enc = RecordsFrame::begin(out);
            for r in records {
                enc.push(out, r);
            }
            enc.finish(out);
        }
        Frame::Dropped { cupti, shim } => {
            let at = begin(out, T_DROPPED);
            put_u64(out, *cupti);
            put_u64(out, *shim);
            end(out, at);
        }
        Frame::Lost {
            start,
            end: stop,
            records,
        } => {
            let at = begin(out, T_LOST);
            put_u64(out, *start);
            put_u64(out, *stop);
            put_u64(out, *records);
            end(out, at);
        }
        Frame::Info(s) => {
            let at = begin(out, T_INFO);
            put_str(out, s);
            end(out, at);
        }
        Frame::Goodbye => {
            let at = begin(out, T_GOODBYE);
            end(out, at);
        }
        Frame::Blind { start, reason } => {
            let at = begin(out, T_BLIND);
            put_u64(out, *start);
            put_str(out, reason);
            end(out, at);
        }
        Frame::Sighted { at: when } => {
            let at = begin(out, T_SIGHTED);
            put_u64(out, *when);
            end(out, at);
        }
        Frame::Skipped {
            incomplete,
            unknown,
        } => {
            let at = begin(out, T_SKIPPED);
            put_u64(out, *incomplete);
            put_u64(out, *unknown);
            end(out, at);
        }
    }
}

/// Builds a Records frame in place, record by record, without collecting
/// the records first (the shim encodes straight out of CUPTI's buffers).
pub struct RecordsFrame {
    at: usize,
    count: u32,
    span: Option<(u64, u64)>,
}

impl RecordsFrame {
    pub fn begin(out: &mut Vec<u8>) -> RecordsFrame {
        let at = begin(out, T_RECORDS);
        put_u32(out, 0);
        RecordsFrame {
            at,
            count: 0,
            span: None,
        }
    }

    pub fn push(&mut self, out: &mut Vec<u8>, r: &GpuRecord) {
        put_record(out, r);
        self.count += 1;
        if let Some((s, e)) = r.span() {
            self.span = Some(match self.span {
                Some((a, b)) => (a.min(s), b.max(e)),
                None => (s, e),
            });
        }
    }

    /// The time the records so far cover, for accounting a frame that is
    /// dropped.
    pub fn span(&self) -> Option<(u64, u64)> {
        self.span
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of payload so far, to cut batches below [`MAX_FRAME`].
    pub fn len(&self, out: &[u8]) -> usize {
        out.len() - self.at - 5
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn finish(self, out: &mut [u8]) {
        let c = self.at + 5;
        out[c..c + 4].copy_from_slice(&self.count.to_le_bytes());
        end(out, self.at);
    }
}

// ---------------------------------------------------------------- decoding

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.b.len() < n {
            return Err(ProtocolError::Short);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> Result<i32, ProtocolError> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn str(&mut self) -> Result<String, ProtocolError> {
        let n = self.u32()? as usize;
        if n > MAX_STR {
            return Err(ProtocolError::LongString(n));
        }
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| ProtocolError::Utf8)
    }
    fn done(&self) -> Result<(), ProtocolError> {
        match self.b.len() {
            0 => Ok(()),
            n => Err(ProtocolError::Trailing(n)),
        }
    }
}

fn get_record(r: &mut Reader) -> Result<GpuRecord, ProtocolError> {
    Ok(match r.u8()? {
        R_KERNEL => GpuRecord::Kernel {
            start: r.u64()?,
            end: r.u64()?,
            device: r.u32()?,
            context: r.u32()?,
            stream: r.u32()?,
            correlation: r.u32()?,
            grid: [r.i32()?, r.i32()?, r.i32()?],
            block: [r.i32()?, r.i32()?, r.i32()?],
            name: r.str()?.into(),
        },
        R_MEMCPY => GpuRecord::Memcpy {
            start: r.u64()?,
            end: r.u64()?,
            device: r.u32()?,
            context: r.u32()?,
            stream: r.u32()?,
            correlation: r.u32()?,
            bytes: r.u64()?,
            copy_kind: r.u8()?,
            src_kind: r.u8()?,
            dst_kind: r.u8()?,
        },
        R_MEMSET => GpuRecord::Memset {
            start: r.u64()?,
            end: r.u64()?,
            device: r.u32()?,
            context: r.u32()?,
            stream: r.u32()?,
            correlation: r.u32()?,
            bytes: r.u64()?,
            value: r.u32()?,
            memory_kind: r.u16()?,
        },
        R_SYNC => GpuRecord::Sync {
            start: r.u64()?,
            end: r.u64()?,
            context: r.u32()?,
            stream: r.u32()?,
            correlation: r.u32()?,
            sync_type: r.u8()?,
            event: r.u32()?,
        },
        R_API => GpuRecord::Api {
            domain: match r.u8()? {
                1 => ApiDomain::Runtime,
                2 => ApiDomain::Driver,
                other => return Err(ProtocolError::UnknownRecord(other)),
            },
            cbid: r.u32()?,
            start: r.u64()?,
            end: r.u64()?,
            pid: r.u32()?,
            tid: r.u32()?,
            correlation: r.u32()?,
        },
        R_MARKER => GpuRecord::Marker {
            ts: r.u64()?,
            id: r.u32()?,
            flags: r.u32()?,
            name: r.str()?,
            domain: r.str()?,
        },
        R_DEVICE => GpuRecord::Device {
            id: r.u32()?,
            name: r.str()?,
        },
        R_DEVICE_UUID => GpuRecord::DeviceUuid {
            id: r.u32()?,
            uuid: r.str()?,
        },
        R_RANGE => GpuRecord::Range {
            start: r.u64()?,
            end: r.u64()?,
            tid: r.u32()?,
            name: r.str()?,
            domain: r.str()?,
        },
        other => return Err(ProtocolError::UnknownRecord(other)),
    })
}

/// Decodes one frame's payload.
pub fn decode_payload(ty: u8, payload: &[u8]) -> Result<Frame, ProtocolError> {
    let mut r = Reader { b: payload };
    let frame = match ty {
        T_HELLO => {
            if r.take(4)? != MAGIC {
                return Err(ProtocolError::BadMagic);
            }
            let version = r.u16()?;
            if version > VERSION {
                return Err(ProtocolError::Version(version));
            }
            let hello = Hello {
                version,
                pid: r.u32()?,
                driver_version: r.u32()?,
                cupti_version: r.u32()?,
                clock: {
                    let c = r.u8()?;
                    ClockMethod::from_u8(c).ok_or(ProtocolError::Clock(c))?
                },
                source: r.str()?,
            };
            Frame::Hello(hello)
        }
        T_RECORDS => {
            let n = r.u32()? as usize;
            // Each record is at least 5 bytes: never pre-allocate a claimed
            // count the payload cannot hold.
            let mut records = Vec::with_capacity(n.min(payload.len() / 5));
            for _ in 0..n {
                records.push(get_record(&mut r)?);
            }
            Frame::Records(records)
        }
        T_DROPPED => Frame::Dropped {
            cupti: r.u64()?,
            shim: r.u64()?,
        },
        T_LOST => Frame::Lost {
            start: r.u64()?,
            end: r.u64()?,
            records: r.u64()?,
        },
        T_INFO => Frame::Info(r.str()?),
        T_GOODBYE => Frame::Goodbye,
        T_BLIND => Frame::Blind {
            start: r.u64()?,
            reason: r.str()?,
        },
        T_SIGHTED => Frame::Sighted { at: r.u64()? },
        T_SKIPPED => Frame::Skipped {
            incomplete: r.u64()?,
            unknown: r.u64()?,
        },
        other => return Err(ProtocolError::UnknownFrame(other)),
    };
    r.done()?;
    Ok(frame)
}

/// Incremental decoder: feed bytes as they arrive, take frames as they
/// complete. After an error the stream is unusable.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
    pos: usize,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet part of a complete frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let avail = &self.buf[self.pos..];
        if avail.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(avail[..4].try_into().unwrap()) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge(len));
        }
        if avail.len() < 5 + len {
            return Ok(None);
        }
        let ty = avail[4];
        let frame = decode_payload(ty, &avail[5..5 + len])?;
        self.pos += 5 + len;
        if self.pos > (1 << 20) && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hello() -> Frame {
        Frame::Hello(Hello {
            version: VERSION,
            pid: 4242,
            driver_version: 12090,
            cupti_version: 26,
            clock: ClockMethod::TimestampCallback,
            source: "gapscope-cupti test".into(),
        })
    }

    fn arb_record() -> impl Strategy<Value = GpuRecord> {
        prop_oneof![
            (
                any::<(u64, u64, u32, u32, u32, u32)>(),
                any::<[i32; 3]>(),
                any::<[i32; 3]>(),
                ".{0,40}"
            )
                .prop_map(
                    |((start, end, device, context, stream, correlation), grid, block, name)| {
                        GpuRecord::Kernel {
                            start,
                            end,
                            device,
                            context,
                            stream,
                            correlation,
                            grid,
                            block,
                            name: name.into(),
                        }
                    }
                ),
            (
                any::<(u64, u64, u32, u32, u32, u32)>(),
                any::<(u64, u8, u8, u8)>()
            )
                .prop_map(
                    |(
                        (start, end, device, context, stream, correlation),
                        (bytes, copy_kind, src_kind, dst_kind),
                    )| {
                        GpuRecord::Memcpy {
                            start,
                            end,
                            device,
                            context,
                            stream,
                            correlation,
                            bytes,
                            copy_kind,
                            src_kind,
                            dst_kind,
                        }
                    }
                ),
            (
                any::<(u64, u64, u32, u32, u32, u32)>(),
                any::<(u64, u32, u16)>()
            )
                .prop_map(
                    |(
                        (start, end, device, context, stream, correlation),
                        (bytes, value, memory_kind),
                    )| {
                        GpuRecord::Memset {
                            start,
                            end,
                            device,
                            context,
                            stream,
                            correlation,
                            bytes,
                            value,
                            memory_kind,
                        }
                    }
                ),
            any::<(u64, u64, u32, u32, u32, u8, u32)>().prop_map(
                |(start, end, context, stream, correlation, sync_type, event)| GpuRecord::Sync {
                    start,
                    end,
                    context,
                    stream,
                    correlation,
                    sync_type,
                    event
                }
            ),
            (any::<bool>(), any::<(u32, u64, u64, u32, u32, u32)>()).prop_map(
                |(rt, (cbid, start, end, pid, tid, correlation))| GpuRecord::Api {
                    domain: if rt {
                        ApiDomain::Runtime
                    } else {
                        ApiDomain::Driver
                    },
                    cbid,
                    start,
                    end,
                    pid,
                    tid,
                    correlation
                }
            ),
            (any::<(u64, u32, u32)>(), ".{0,20}", ".{0,20}").prop_map(
                |((ts, id, flags), name, domain)| {
                    GpuRecord::Marker {
                        ts,
                        id,
                        flags,
                        name,
                        domain,
                    }
                }
            ),
            (any::<u32>(), ".{0,30}").prop_map(|(id, name)| GpuRecord::Device { id, name }),
            (any::<u32>(), ".{0,40}").prop_map(|(id, uuid)| GpuRecord::DeviceUuid { id, uuid }),
            (any::<(u64, u64, u32)>(), ".{0,20}", ".{0,20}").prop_map(
                |((start, end, tid), name, domain)| GpuRecord::Range {
                    start,
                    end,
                    tid,
                    name,
                    domain,
                }
            ),
        ]
    }

    fn decode_all(bytes: &[u8], chunk: usize) -> Result<Vec<Frame>, ProtocolError> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            d.push(piece);
            while let Some(f) = d.next_frame()? {
                out.push(f);
            }
        }
        assert_eq!(d.pending(), 0);
        Ok(out)
    }

    proptest! {
        #[test]
        fn frames_roundtrip_in_any_chunking(records in proptest::collection::vec(arb_record(), 0..40),
                                            chunk in 1usize..300,
                                            cupti in any::<u64>(), shim in any::<u64>(),
                                            info in ".{0,50}") {
            let frames = vec![
                hello(),
                Frame::Records(records),
                Frame::Dropped { cupti, shim },
                Frame::Lost { start: shim, end: cupti, records: cupti ^ shim },
                Frame::Blind { start: cupti, reason: info.clone() },
                Frame::Sighted { at: shim },
                Frame::Skipped { incomplete: shim, unknown: cupti },
                Frame::Info(info),
                Frame::Goodbye,
            ];
            let mut bytes = Vec::new();
            for f in &frames {
                encode(f, &mut bytes);
            }
            prop_assert_eq!(decode_all(&bytes, chunk).unwrap(), frames);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let mut d = Decoder::new();
            d.push(&bytes);
            // Errors are fine; panics and runaway allocations are not.
            for _ in 0..100 {
                match d.next_frame() {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
        }

        #[test]
        fn every_truncation_is_incomplete_or_an_error(records in proptest::collection::vec(arb_record(), 1..10),
                                                       cut in any::<prop::sample::Index>()) {
            let mut bytes = Vec::new();
            encode(&Frame::Records(records), &mut bytes);
            let cut = cut.index(bytes.len());
            let mut d = Decoder::new();
            d.push(&bytes[..cut]);
            prop_assert_eq!(d.next_frame(), Ok(None));
            // A frame whose length says less than its fields need is an error.
            let mut short = bytes.clone();
            let payload = (bytes.len() - 5) as u32;
            let fake = payload.saturating_sub(1 + (cut as u32 % payload.max(1)));
            short[..4].copy_from_slice(&fake.to_le_bytes());
            let mut d = Decoder::new();
            d.push(&short);
            prop_assert!(d.next_frame().is_err());
        }
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let mut d = Decoder::new();
        d.push(&u32::MAX.to_le_bytes());
        d.push(&[T_RECORDS]);
        assert_eq!(
            d.next_frame(),
            Err(ProtocolError::TooLarge(u32::MAX as usize))
        );
        let mut d = Decoder::new();
        d.push(&[0, 0, 0, 0, 99]);
        assert_eq!(d.next_frame(), Err(ProtocolError::UnknownFrame(99)));
        // A records frame claiming four billion records in a few bytes.
        let mut bytes = Vec::new();
        let at = begin(&mut bytes, T_RECORDS);
        put_u32(&mut bytes, u32::MAX);
        end(&mut bytes, at);
        let mut d = Decoder::new();
        d.push(&bytes);
        assert_eq!(d.next_frame(), Err(ProtocolError::Short));
    }

    #[test]
    fn hello_checks_magic_and_version() {
        let mut bytes = Vec::new();
        encode(&hello(), &mut bytes);
        let mut bad = bytes.clone();
        bad[5] = b'X';
        let mut d = Decoder::new();
        d.push(&bad);
        assert_eq!(d.next_frame(), Err(ProtocolError::BadMagic));
        let mut newer = bytes.clone();
        newer[9..11].copy_from_slice(&(VERSION + 1).to_le_bytes());
        let mut d = Decoder::new();
        d.push(&newer);
        assert_eq!(d.next_frame(), Err(ProtocolError::Version(VERSION + 1)));
    }

    #[test]
    fn long_strings_are_cut_on_a_char_boundary() {
        let name = "é".repeat(MAX_STR);
        let mut bytes = Vec::new();
        encode(&Frame::Info(name), &mut bytes);
        let mut d = Decoder::new();
        d.push(&bytes);
        let Some(Frame::Info(s)) = d.next_frame().unwrap() else {
            panic!()
        };
        assert!(s.len() <= MAX_STR && s.chars().all(|c| c == 'é'));
    }
}
