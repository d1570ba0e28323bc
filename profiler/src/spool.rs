//! Spools: long runs of small fixed-size records that an analysis writes
//! once and reads back, in order or near where it last read — the feeder's
//! account, the GPU's work and the CUDA calls of an hours-long recording.
//! The first [`RAW_BYTES`] of blocks stay in memory as they are; the rest
//! are compressed into an unnamed temporary file, so that what a report
//! holds in memory does not grow with the recording's length. They are
//! compressed and written on a thread of the spool's own, a few blocks
//! behind the caller: on a 10 M-event report the feeder's account was a
//! tenth of the thread that replays the events, and that pass took 2.09 s
//! with the caller compressing, 1.90 s without (medians of seven).
//!
//! A compressed block is [`BLOCK`] records with their bytes laid out by
//! position (every record's first byte, then every second byte…):
//! neighbouring records differ in their low bytes only, so the high ones
//! compress to almost nothing (the feeder's account: 16 bytes a moment to
//! under 0.5).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use bytemuck::Pod;

/// Records per block.
pub const BLOCK: usize = 1 << 14;
/// Bytes of a spool kept in memory uncompressed, in whole blocks: up to
/// that, a spool costs nothing to read back (most recordings' spools never
/// leave them).
const RAW_BYTES: usize = 8 << 20;
/// zstd's level: its fastest that still finds the runs the position-wise
/// layout makes.
const LEVEL: i32 = 1;
/// Full blocks waiting for the packing thread: past them the caller waits,
/// so that a spool filled faster than it is packed stays bounded.
const QUEUED: usize = 2;

/// Where a sealed block lies.
#[derive(Clone, Copy)]
enum Sealed {
    /// In [`Spool::raw`], by index.
    Raw(usize),
    /// Handed to the packing, by its place in [`Away::placed`].
    Away(usize),
}

/// Where a packed block went.
#[derive(Clone)]
enum Placed {
    /// In the file at this offset, this long.
    File(u64, u32),
    /// In memory: no file could be made or written.
    Memory(Arc<[u8]>),
}

/// The blocks past the raw ones, shared by the spool, its readers and the
/// thread packing them.
#[derive(Default)]
struct Away {
    /// Where each block went, in the order sealed; a block not yet in it
    /// is still being packed.
    placed: Mutex<Packed>,
    /// Signalled as each block is placed, and when the packing ends.
    progress: Condvar,
    /// An unnamed file (`O_TMPFILE`): nobody can open it, and it is gone
    /// when the spool and its packing are.
    file: OnceLock<File>,
    /// Why compressed blocks stayed in memory, if they did.
    no_file: OnceLock<String>,
}

#[derive(Default)]
struct Packed {
    /// By the order sealed.
    blocks: Vec<Option<Placed>>,
    /// The packing thread is gone: blocks still missing never come.
    ended: bool,
}

impl Packed {
    fn has(&self, a: usize) -> bool {
        matches!(self.blocks.get(a), Some(Some(_)))
    }
}

/// Packs blocks and puts them in place: on the spool's packing thread, or
/// on the caller's where no thread could be started.
struct Packer {
    away: Arc<Away>,
    /// Bytes in the file so far.
    size: u64,
    /// Kept between blocks: the records laid out by position, and zstd's
    /// context.
    planes: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl Packer {
    fn new(away: &Arc<Away>, size: u64) -> Packer {
        Packer {
            away: Arc::clone(away),
            size,
            planes: Vec::new(),
            zstd: None,
        }
    }

    /// Packs the `a`th block handed to the packing and puts it in place.
    fn place<T: Pod>(&mut self, a: usize, records: &[T]) {
        let packed = pack(records, &mut self.planes, &mut self.zstd);
        let placed = self.write(&packed);
        let away = &*self.away;
        let placed = match placed {
            Ok(at) => Placed::File(at, packed.len() as u32),
            Err(e) => {
                let _ = away.no_file.set(e);
                Placed::Memory(packed.into())
            }
        };
        let mut all = lock(&away.placed);
        if all.blocks.len() <= a {
            all.blocks.resize(a + 1, None);
        }
        all.blocks[a] = Some(placed);
        drop(all);
        away.progress.notify_all();
    }

    /// Appends `packed` to the file, made on first use; where it went.
    fn write(&mut self, packed: &[u8]) -> Result<u64, String> {
        let away = &*self.away;
        // Once the disk has filled, the blocks already there stay there,
        // the rest in memory.
        if away.no_file.get().is_some() {
            return Err(String::new());
        }
        let file = match away.file.get() {
            Some(f) => f,
            None => {
                let f = unnamed_file().map_err(|e| e.to_string())?;
                away.file.get_or_init(|| f)
            }
        };
        file.write_all_at(packed, self.size)
            .map_err(|e| e.to_string())?;
        let at = self.size;
        self.size += packed.len() as u64;
        Ok(at)
    }
}

impl Drop for Packer {
    fn drop(&mut self) {
        lock(&self.away.placed).ended = true;
        self.away.progress.notify_all();
    }
}

/// A lock whose holder cannot have left its data half-changed (each
/// holder pushes or reads one entry): taken back from a panic elsewhere.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records of type `T`, appended and read back by index.
pub struct Spool<T: Pod> {
    fill: Vec<T>,
    sealed: Vec<Sealed>,
    raw: Vec<Box<[T]>>,
    away: Arc<Away>,
    /// Blocks handed to the packing so far.
    sent: usize,
    /// The packing thread, started with the first block it takes; or the
    /// packer itself, run inline, where no thread could be started.
    packing: Option<Packing<T>>,
}

enum Packing<T> {
    Thread(SyncSender<(usize, Vec<T>)>),
    Inline(Packer),
}

impl<T: Pod> Default for Spool<T> {
    fn default() -> Self {
        Spool {
            fill: Vec::new(),
            sealed: Vec::new(),
            raw: Vec::new(),
            away: Arc::default(),
            sent: 0,
            packing: None,
        }
    }
}

impl<T: Pod> Spool<T> {
    pub fn len(&self) -> usize {
        self.sealed.len() * BLOCK + self.fill.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why the spool kept compressed blocks in memory (no temporary file
    /// could be made or written), if it did. Blocks still being packed are
    /// waited for.
    pub fn kept_in_memory(&self) -> Option<&str> {
        if let Some(last) = self.sent.checked_sub(1) {
            // Placed in order: the last placed, all are.
            self.placed(last);
        }
        self.away.no_file.get().map(String::as_str)
    }

    /// Where block `a` handed to the packing went, once it is placed;
    /// None if the packing ended without placing it.
    fn placed(&self, a: usize) -> Option<Placed> {
        let mut placed = lock(&self.away.placed);
        while !placed.has(a) && !placed.ended {
            placed = self
                .away
                .progress
                .wait(placed)
                .unwrap_or_else(|e| e.into_inner());
        }
        placed.blocks.get(a).cloned().flatten()
    }

    /// A reader of the records written so far.
    pub fn reader(&self) -> Reader<'_, T> {
        Reader {
            spool: self,
            cache: std::array::from_fn(|_| (usize::MAX, Vec::new())),
            next_slot: 0,
            scratch: Scratch::default(),
            failed: None,
        }
    }

    /// Every record written so far, in order.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        let mut r = self.reader();
        (0..self.len()).map_while(move |i| r.get(i))
    }

    /// Unpacks sealed block `b` into `out`, through `scratch`; a block
    /// still being packed is waited for.
    fn unpack(&self, b: usize, out: &mut Vec<T>, scratch: &mut Scratch) -> std::io::Result<()> {
        let a = match self.sealed[b] {
            Sealed::Raw(i) => {
                out.clear();
                out.extend_from_slice(&self.raw[i]);
                return Ok(());
            }
            Sealed::Away(a) => a,
        };
        match self.placed(a) {
            Some(Placed::File(at, len)) => {
                let file = self.away.file.get().expect("a block in the file");
                scratch.read.resize(len as usize, 0);
                file.read_exact_at(&mut scratch.read, at)?;
                unpack_into(
                    &scratch.read,
                    out,
                    &mut scratch.planes,
                    &mut scratch.unpacker,
                )
            }
            Some(Placed::Memory(packed)) => {
                unpack_into(&packed, out, &mut scratch.planes, &mut scratch.unpacker)
            }
            None => Err(std::io::Error::other(
                "its packing stopped before the block was written",
            )),
        }
    }
}

impl<T: Pod + Send> Spool<T> {
    pub fn push(&mut self, record: T) {
        if self.fill.capacity() == 0 {
            self.fill.reserve_exact(BLOCK);
        }
        self.fill.push(record);
        if self.fill.len() == BLOCK {
            self.seal();
        }
    }

    fn seal(&mut self) {
        let block = std::mem::take(&mut self.fill);
        if (self.raw.len() + 1) * BLOCK * std::mem::size_of::<T>()
            <= RAW_BYTES.max(BLOCK * std::mem::size_of::<T>())
        {
            self.sealed.push(Sealed::Raw(self.raw.len()));
            self.raw.push(block.into_boxed_slice());
            return;
        }
        let a = self.sent;
        self.sealed.push(Sealed::Away(a));
        self.sent += 1;
        let packing = self.packing.get_or_insert_with(|| start(&self.away));
        let block = match packing {
            Packing::Thread(tx) => match tx.send((a, block)) {
                Ok(()) => return,
                // The thread is gone (it does not panic by design): the
                // blocks it had not placed read as lost, the rest are
                // packed here.
                Err(e) => e.0 .1,
            },
            Packing::Inline(_) => block,
        };
        if let Packing::Thread(_) = packing {
            let size = file_size(&self.away);
            *packing = Packing::Inline(Packer::new(&self.away, size));
        }
        if let Packing::Inline(packer) = packing {
            packer.place(a, &block);
        }
    }
}

/// Bytes in `away`'s file so far (its packing thread gone).
fn file_size(away: &Away) -> u64 {
    lock(&away.placed)
        .blocks
        .iter()
        .flatten()
        .map(|p| match p {
            Placed::File(at, len) => at + u64::from(*len),
            Placed::Memory(_) => 0,
        })
        .max()
        .unwrap_or(0)
}

/// The packing of `away`'s blocks: on a thread of its own, or where none
/// could be started, inline.
fn start<T: Pod + Send>(away: &Arc<Away>) -> Packing<T> {
    let (tx, rx) = sync_channel::<(usize, Vec<T>)>(QUEUED);
    let shared = Arc::clone(away);
    let spawned = std::thread::Builder::new()
        .name("gapscope-spool".into())
        .spawn(move || {
            let mut packer = Packer::new(&shared, 0);
            // Ends when the spool is dropped (its sender with it), after
            // the blocks it handed over.
            for (a, block) in rx {
                packer.place(a, &block);
            }
        });
    match spawned {
        Ok(_) => Packing::Thread(tx),
        Err(_) => Packing::Inline(Packer::new(away, 0)),
    }
}

/// An unnamed file in the temporary directory, readable by its owner only:
/// it has no name that anything could open, link or replace.
fn unnamed_file() -> std::io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let dir = std::env::temp_dir();
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid C string; the fd returned is owned by the File.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Records laid out by byte position (through `planes`), then compressed
/// (by `packer`, made on first use).
fn pack<T: Pod>(
    records: &[T],
    planes: &mut Vec<u8>,
    packer: &mut Option<zstd::bulk::Compressor<'static>>,
) -> Box<[u8]> {
    let raw: &[u8] = bytemuck::cast_slice(records);
    planes.resize(raw.len(), 0);
    shuffle(raw, std::mem::size_of::<T>(), planes);
    let mut out = (records.len() as u32).to_le_bytes().to_vec();
    if packer.is_none() {
        *packer = zstd::bulk::Compressor::new(LEVEL).ok();
    }
    let compressed = packer.as_mut().and_then(|p| p.compress(planes).ok());
    match compressed {
        Some(c) => {
            out.push(1);
            out.extend_from_slice(&c);
        }
        // Compressing into memory does not fail; if it did, kept as it is.
        None => {
            out.push(0);
            out.extend_from_slice(planes);
        }
    }
    out.into_boxed_slice()
}

/// Buffers a reader unpacks blocks through, kept between blocks.
#[derive(Default)]
struct Scratch {
    read: Vec<u8>,
    planes: Vec<u8>,
    unpacker: Option<zstd::bulk::Decompressor<'static>>,
}

/// Unpacks `packed` into `out`, through `planes`.
fn unpack_into<T: Pod>(
    packed: &[u8],
    out: &mut Vec<T>,
    planes: &mut Vec<u8>,
    unpacker: &mut Option<zstd::bulk::Decompressor<'static>>,
) -> std::io::Result<()> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "a damaged spool block");
    let size = std::mem::size_of::<T>();
    let (n, rest) = packed.split_at_checked(4).ok_or_else(bad)?;
    let n = u32::from_le_bytes(n.try_into().expect("4 bytes")) as usize;
    let (&kind, body) = rest.split_first().ok_or_else(bad)?;
    if n > BLOCK {
        return Err(bad());
    }
    planes.resize(n * size, 0);
    match kind {
        1 => {
            if unpacker.is_none() {
                *unpacker = Some(zstd::bulk::Decompressor::new()?);
            }
            let got = unpacker
                .as_mut()
                .expect("made above")
                .decompress_to_buffer(body, planes.as_mut_slice())?;
            if got != n * size {
                return Err(bad());
            }
        }
        _ if body.len() == n * size => planes.copy_from_slice(body),
        _ => return Err(bad()),
    }
    out.clear();
    out.resize(n, T::zeroed());
    unshuffle(planes, size, bytemuck::cast_slice_mut(out));
    Ok(())
}

#[cfg(test)]
fn unpack_from<T: Pod>(packed: &[u8]) -> std::io::Result<Vec<T>> {
    let mut out = Vec::new();
    unpack_into(packed, &mut out, &mut Vec::new(), &mut None)?;
    Ok(out)
}

/// `raw`, records of `size` bytes, laid out by byte position into `planes`.
fn shuffle(raw: &[u8], size: usize, planes: &mut [u8]) {
    let n = raw.len() / size;
    walk(n, size, |k, j, width| match width {
        #[cfg(target_arch = "x86_64")]
        16 => sse2::shuffle16(raw, size, n, k, j, planes),
        8 => transpose8_between(raw, |i| (k + i) * size + j, planes, |b| (j + b) * n + k),
        _ => planes[j * n + k] = raw[k * size + j],
    });
}

/// [`shuffle`] undone.
fn unshuffle(planes: &[u8], size: usize, raw: &mut [u8]) {
    let n = raw.len() / size;
    walk(n, size, |k, j, width| match width {
        #[cfg(target_arch = "x86_64")]
        16 => sse2::unshuffle16(planes, size, n, k, j, raw),
        8 => transpose8_between(planes, |b| (j + b) * n + k, raw, |i| (k + i) * size + j),
        _ => raw[k * size + j] = planes[j * n + k],
    });
}

/// The layout's walk over `n` records of `size` bytes, the same both ways:
/// `step(k, j, width)` moves bytes `j..j + 8` of records `k..k + width`
/// (width 16 where SSE2 is there, as it is on every x86_64: twice as fast
/// as 8, one 8x8 transpose of u64s), or byte `j` of record `k` (width 1)
/// where the records are not whole u64s or for the last few.
fn walk(n: usize, size: usize, mut step: impl FnMut(usize, usize, usize)) {
    let mut k = 0;
    if size % 8 == 0 {
        let widths: &[usize] = if cfg!(target_arch = "x86_64") {
            &[16, 8]
        } else {
            &[8]
        };
        for &width in widths {
            while k + width <= n {
                for j in (0..size).step_by(8) {
                    step(k, j, width);
                }
                k += width;
            }
        }
    }
    for k in k..n {
        for j in 0..size {
            step(k, j, 1);
        }
    }
}

/// Eight u64s read from `src` at `from(0..8)`, transposed as an 8x8
/// matrix of bytes (its own inverse), written to `dst` at `to(0..8)`.
fn transpose8_between(
    src: &[u8],
    from: impl Fn(usize) -> usize,
    dst: &mut [u8],
    to: impl Fn(usize) -> usize,
) {
    let x: [u64; 8] = std::array::from_fn(|i| {
        let at = from(i);
        u64::from_le_bytes(src[at..at + 8].try_into().expect("8 bytes"))
    });
    for (b, w) in transpose8(x).iter().enumerate() {
        let at = to(b);
        dst[at..at + 8].copy_from_slice(&w.to_le_bytes());
    }
}

/// The layout's 16x8 byte transposes in SSE2: records `k..k + 16` (each
/// `size` bytes) against rows of `n` bytes, eight bytes of each record
/// (from `j`) at a time. Every load and store goes through a slice
/// checked first.
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::*;

    /// Bytes `j..j + 8` of records `k..k + 16` in `raw` into rows
    /// `j..j + 8` of `planes`, at `k`.
    pub(super) fn shuffle16(
        raw: &[u8],
        size: usize,
        n: usize,
        k: usize,
        j: usize,
        planes: &mut [u8],
    ) {
        let load = |i: usize| -> __m128i {
            let at = (k + i) * size + j;
            let src: &[u8; 8] = raw[at..at + 8].try_into().expect("8 bytes");
            // SAFETY: SSE2 is part of x86_64; `src` is the 8 bytes read.
            unsafe { _mm_loadl_epi64(src.as_ptr().cast()) }
        };
        let mut store = |b: usize, v: __m128i| {
            let dst: &mut [u8; 16] = (&mut planes[(j + b) * n + k..][..16])
                .try_into()
                .expect("16 bytes");
            // SAFETY: as above; `dst` is the 16 bytes written.
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), v) }
        };
        // SAFETY: SSE2 is part of x86_64; these only move register bytes.
        unsafe {
            // Records 2p and 2p+1 byte by byte.
            let a: [__m128i; 8] =
                std::array::from_fn(|p| _mm_unpacklo_epi8(load(2 * p), load(2 * p + 1)));
            // Records 4m..4m+4, bytes 0-3 (lo) and 4-7 (hi).
            let lo: [__m128i; 4] =
                std::array::from_fn(|m| _mm_unpacklo_epi16(a[2 * m], a[2 * m + 1]));
            let hi: [__m128i; 4] =
                std::array::from_fn(|m| _mm_unpackhi_epi16(a[2 * m], a[2 * m + 1]));
            // Records 8q..8q+8, bytes 2t and 2t+1 in c(q)[t].
            let c = |q: usize| {
                [
                    _mm_unpacklo_epi32(lo[2 * q], lo[2 * q + 1]),
                    _mm_unpackhi_epi32(lo[2 * q], lo[2 * q + 1]),
                    _mm_unpacklo_epi32(hi[2 * q], hi[2 * q + 1]),
                    _mm_unpackhi_epi32(hi[2 * q], hi[2 * q + 1]),
                ]
            };
            let (c0, c1) = (c(0), c(1));
            for t in 0..4 {
                store(2 * t, _mm_unpacklo_epi64(c0[t], c1[t]));
                store(2 * t + 1, _mm_unpackhi_epi64(c0[t], c1[t]));
            }
        }
    }

    /// [`shuffle16`] undone.
    pub(super) fn unshuffle16(
        planes: &[u8],
        size: usize,
        n: usize,
        k: usize,
        j: usize,
        raw: &mut [u8],
    ) {
        let row = |b: usize| -> __m128i {
            let src: &[u8; 16] = planes[(j + b) * n + k..][..16]
                .try_into()
                .expect("16 bytes");
            // SAFETY: SSE2 is part of x86_64; `src` is the 16 bytes read.
            unsafe { _mm_loadu_si128(src.as_ptr().cast()) }
        };
        let mut store = |i: usize, v: __m128i| {
            let at = (k + i) * size + j;
            let dst: &mut [u8; 8] = (&mut raw[at..at + 8]).try_into().expect("8 bytes");
            // SAFETY: as above; `dst` is the 8 bytes written.
            unsafe { _mm_storel_epi64(dst.as_mut_ptr().cast(), v) }
        };
        // SAFETY: SSE2 is part of x86_64; these only move register bytes.
        unsafe {
            // Bytes 2p and 2p+1 of records 8h..8h+8 in s[p][h].
            let s: [[__m128i; 2]; 4] = std::array::from_fn(|p| {
                let (x, y) = (row(2 * p), row(2 * p + 1));
                [_mm_unpacklo_epi8(x, y), _mm_unpackhi_epi8(x, y)]
            });
            for h in [0, 1] {
                // Bytes 0-3 (t0) and 4-7 (t1) of records 8h..8h+4 ([0])
                // and 8h+4..8h+8 ([1]).
                let t0 = [
                    _mm_unpacklo_epi16(s[0][h], s[1][h]),
                    _mm_unpackhi_epi16(s[0][h], s[1][h]),
                ];
                let t1 = [
                    _mm_unpacklo_epi16(s[2][h], s[3][h]),
                    _mm_unpackhi_epi16(s[2][h], s[3][h]),
                ];
                for l in 0..2 {
                    let first = 8 * h + 4 * l;
                    for (i, v) in [
                        (first, _mm_unpacklo_epi32(t0[l], t1[l])),
                        (first + 2, _mm_unpackhi_epi32(t0[l], t1[l])),
                    ] {
                        store(i, v);
                        store(i + 1, _mm_srli_si128::<8>(v));
                    }
                }
            }
        }
    }
}

/// An 8x8 matrix of bytes transposed, each row a little-endian u64: byte
/// `b` of row `i` becomes byte `i` of row `b`.
fn transpose8(mut x: [u64; 8]) -> [u64; 8] {
    const M1: u64 = 0x00ff_00ff_00ff_00ff;
    const M2: u64 = 0x0000_ffff_0000_ffff;
    const M4: u64 = 0x0000_0000_ffff_ffff;
    for i in (0..8).step_by(2) {
        let t = ((x[i] >> 8) ^ x[i + 1]) & M1;
        x[i + 1] ^= t;
        x[i] ^= t << 8;
    }
    for i in [0, 1, 4, 5] {
        let t = ((x[i] >> 16) ^ x[i + 2]) & M2;
        x[i + 2] ^= t;
        x[i] ^= t << 16;
    }
    for i in 0..4 {
        let t = ((x[i] >> 32) ^ x[i + 4]) & M4;
        x[i + 4] ^= t;
        x[i] ^= t << 32;
    }
    x
}

/// Reads a spool by index, keeping the last blocks it unpacked: reads in
/// order, or a little back and forth, unpack each block once.
pub struct Reader<'s, T: Pod> {
    spool: &'s Spool<T>,
    /// Blocks unpacked, by index (usize::MAX: none), their buffers reused.
    cache: [(usize, Vec<T>); 3],
    next_slot: usize,
    scratch: Scratch,
    failed: Option<String>,
}

impl<T: Pod> Reader<'_, T> {
    /// Record `i`; None past the end, or when its block could not be read
    /// back (see [`Reader::failed`]).
    pub fn get(&mut self, i: usize) -> Option<T> {
        let spool = self.spool;
        let (b, k) = (i / BLOCK, i % BLOCK);
        match spool.sealed.get(b) {
            None if b == spool.sealed.len() => return spool.fill.get(k).copied(),
            None => return None,
            Some(Sealed::Raw(r)) => return spool.raw[*r].get(k).copied(),
            Some(_) => {}
        }
        if let Some((_, v)) = self.cache.iter().find(|(at, _)| *at == b) {
            return v.get(k).copied();
        }
        let slot = &mut self.cache[self.next_slot];
        slot.0 = usize::MAX;
        match spool.unpack(b, &mut slot.1, &mut self.scratch) {
            Ok(()) => {
                slot.0 = b;
                self.next_slot = (self.next_slot + 1) % 3;
                slot.1.get(k).copied()
            }
            Err(e) => {
                self.failed.get_or_insert_with(|| e.to_string());
                None
            }
        }
    }

    /// Why a block could not be read back, if one could not.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Rec {
        t: u64,
        v: u32,
        k: u32,
    }

    fn rec(i: usize) -> Rec {
        Rec {
            t: 1_000_000_000_000 + i as u64 * 977,
            v: (i * 7 % 1000) as u32,
            k: (i % 3) as u32,
        }
    }

    #[test]
    fn records_read_back_as_written_in_order_and_out_of_it() {
        let raw_blocks = RAW_BYTES / (BLOCK * std::mem::size_of::<Rec>());
        let n = BLOCK * (raw_blocks + 3) + 17;
        let mut s = Spool::default();
        for i in 0..n {
            s.push(rec(i));
        }
        assert_eq!(s.len(), n);
        // Past the raw blocks, into the file (or compressed in memory).
        assert!(s.sent > 0);
        assert!(s.iter().eq((0..n).map(rec)));
        let mut r = s.reader();
        let last_raw = BLOCK * raw_blocks - 1;
        for i in [n - 1, 0, last_raw, last_raw + 1, n - BLOCK - 3, n - 17, 5] {
            assert_eq!(r.get(i), Some(rec(i)), "record {i}");
        }
        assert_eq!(r.get(n), None);
        assert!(r.failed().is_none());
    }

    #[test]
    fn blocks_no_file_takes_stay_in_memory_and_read_back() {
        // As after the disk filled: the packing keeps the blocks in memory.
        let raw_blocks = RAW_BYTES / (BLOCK * std::mem::size_of::<Rec>());
        let n = BLOCK * (raw_blocks + 4) + 5;
        let mut s = Spool::default();
        s.away.no_file.set("no space left".into()).unwrap();
        for i in 0..n {
            s.push(rec(i));
        }
        assert_eq!(s.kept_in_memory(), Some("no space left"));
        assert!(s.away.file.get().is_none());
        let placed = lock(&s.away.placed);
        assert_eq!(placed.blocks.len(), 4);
        assert!(placed
            .blocks
            .iter()
            .all(|b| matches!(b, Some(Placed::Memory(_)))));
        drop(placed);
        assert!(s.iter().eq((0..n).map(rec)));
    }

    #[test]
    fn neighbouring_records_compress_well() {
        let records: Vec<Rec> = (0..BLOCK).map(rec).collect();
        let packed = pack(&records, &mut Vec::new(), &mut None);
        // 16 bytes a record, laid out by position: well under 4.
        assert!(packed.len() < BLOCK * 4, "{} bytes", packed.len());
        assert_eq!(unpack_from::<Rec>(&packed).unwrap(), records);
    }

    #[test]
    fn records_laid_out_by_position_eight_or_sixteen_at_a_time_are_laid_out_byte_by_byte() {
        for size in [8, 16, 24, 40, 72, 12] {
            for n in [1, 7, 8, 9, 15, 16, 17, 24, 33, 64, 67] {
                let raw: Vec<u8> = (0..size * n).map(|i| (i * 31 + i / 7) as u8).collect();
                let mut planes = vec![0u8; raw.len()];
                shuffle(&raw, size, &mut planes);
                for k in 0..n {
                    for j in 0..size {
                        assert_eq!(planes[j * n + k], raw[k * size + j], "{size} {n} {k} {j}");
                    }
                }
                let mut back = vec![0u8; raw.len()];
                unshuffle(&planes, size, &mut back);
                assert_eq!(back, raw);
            }
        }
    }

    #[test]
    fn a_damaged_block_reads_as_missing_not_as_garbage() {
        let records: Vec<Rec> = (0..BLOCK).map(rec).collect();
        let mut packed = pack(&records, &mut Vec::new(), &mut None).to_vec();
        let mid = packed.len() / 2;
        packed.truncate(mid);
        assert!(unpack_from::<Rec>(&packed).is_err());
        assert!(unpack_from::<Rec>(&[1, 0]).is_err());
    }
}
