use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use super::{
    Footer, Record, SessionError, CHUNK_HEADER_LEN, FILE_HEADER_LEN, FORMAT_VERSION, MAGIC,
    MAX_CHUNK_COMPRESSED, MAX_CHUNK_RAW,
};

/// How many times the bytes read so far a session's chunks may unpack to,
/// all together. The writer's chunks (postcard records through zstd level
/// 3) unpack 5.0 times in the golden recording (5.6 its most compressible
/// chunk), 3.4 in gs-synth's sessions, and 9.7 for the most regular stream
/// a recorder could write (a wakeup every nanosecond). Only records that
/// repeat exactly, which no recording writes (each event has its own time),
/// go far past it: 32 Mi empty notes compress 12 000 times.
const MAX_RATIO: u64 = 64;
/// What any file may unpack to whatever its size: a small file's ratio
/// (one short chunk, zstd's fixed overhead) says little.
const FREE_RAW: u64 = 4 << 20;
/// Streams records out of a session file. A damaged or cut-off tail ends the
/// stream and is reported through [`SessionReader::truncated`], never as a
/// panic: everything before it is still good. A file that would unpack to
/// far more than a recording does ends it too, before the chunk is
/// unpacked, and is reported through [`SessionReader::refused`].
pub struct SessionReader {
    input: BufReader<File>,
    path: PathBuf,
    offset: u64,
    chunk: Vec<u8>,
    /// The chunk as stored, and zstd's context: both kept from chunk to
    /// chunk (a fresh context per chunk was a tenth of the unpacking).
    compressed: Vec<u8>,
    unzstd: Option<zstd::bulk::Decompressor<'static>>,
    pos: usize,
    truncated: Option<String>,
    refused: Option<String>,
    /// Raw bytes of the chunks read so far.
    pub(super) unpacked: u64,
    done: bool,
}

impl SessionReader {
    pub fn open(path: &Path) -> Result<Self, SessionError> {
        let io = |source| SessionError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = crate::output::open_regular(path).map_err(io)?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut header = [0u8; FILE_HEADER_LEN];
        let n = read_full(&mut input, &mut header).map_err(io)?;
        if n < FILE_HEADER_LEN || &header[..8] != MAGIC {
            return Err(SessionError::NotASession {
                path: path.to_path_buf(),
            });
        }
        let version = u16::from_le_bytes([header[8], header[9]]);
        if version > FORMAT_VERSION {
            return Err(SessionError::UnsupportedVersion {
                path: path.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        Ok(SessionReader {
            input,
            path: path.to_path_buf(),
            offset: FILE_HEADER_LEN as u64,
            chunk: Vec::new(),
            compressed: Vec::new(),
            unzstd: None,
            pos: 0,
            truncated: None,
            refused: None,
            unpacked: 0,
            done: false,
        })
    }

    /// Why the stream ended early, if it did.
    pub fn truncated(&self) -> Option<&str> {
        self.truncated.as_deref()
    }

    /// Why the stream was cut short on purpose, if it was: the file
    /// unpacks to more than any recording does.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// [`SessionReader::refused`] as the error a reader of the whole file
    /// returns.
    pub(super) fn refusal(&self) -> Option<SessionError> {
        self.refused
            .as_ref()
            .map(|why| refused(self.path.clone(), why.clone()))
    }

    /// Bytes of the file read so far (its header and whole chunks).
    pub fn bytes_read(&self) -> u64 {
        self.offset
    }

    fn stop(&mut self, why: String) {
        self.truncated = Some(why);
        self.done = true;
    }

    /// Loads the next chunk; false at a clean end or when the tail is bad.
    fn next_chunk(&mut self) -> bool {
        let mut head = [0u8; CHUNK_HEADER_LEN];
        match read_full(&mut self.input, &mut head) {
            Ok(0) => {
                self.done = true;
                return false;
            }
            Ok(n) if n < CHUNK_HEADER_LEN => {
                self.stop(format!(
                    "cut off inside a chunk header at byte {}",
                    self.offset
                ));
                return false;
            }
            Ok(_) => {}
            Err(e) => {
                self.stop(format!("read error at byte {}: {e}", self.offset));
                return false;
            }
        }
        let len = u32::from_le_bytes(head[0..4].try_into().unwrap());
        let raw_len = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let crc = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if len > MAX_CHUNK_COMPRESSED || raw_len > MAX_CHUNK_RAW {
            self.stop(format!(
                "implausible chunk length at byte {} ({len} / {raw_len} bytes)",
                self.offset
            ));
            return false;
        }
        let mut compressed = std::mem::take(&mut self.compressed);
        compressed.resize(len as usize, 0);
        let ok = self.unpack(&mut compressed, raw_len, crc);
        self.compressed = compressed;
        ok
    }

    /// The rest of [`SessionReader::next_chunk`]: the chunk's bytes read
    /// into `compressed` (sized to the chunk), checked and unpacked.
    fn unpack(&mut self, compressed: &mut [u8], raw_len: u32, crc: u32) -> bool {
        let len = compressed.len();
        match read_full(&mut self.input, compressed) {
            Ok(n) if n == len => {}
            Ok(_) => {
                self.stop(format!("cut off inside the chunk at byte {}", self.offset));
                return false;
            }
            Err(e) => {
                self.stop(format!("read error at byte {}: {e}", self.offset));
                return false;
            }
        }
        if crc32fast::hash(compressed) != crc {
            self.stop(format!(
                "checksum mismatch in the chunk at byte {}",
                self.offset
            ));
            return false;
        }
        // The frame states its own size: a chunk header that disagrees is
        // corrupt, refused before its claimed size is allocated.
        if !matches!(
            zstd::zstd_safe::get_frame_content_size(compressed),
            Ok(Some(n)) if n == raw_len as u64
        ) {
            self.stop(format!("undecodable chunk at byte {}", self.offset));
            return false;
        }
        // Checked once the size is known to be the frame's own (a flipped
        // bit in the header is damage, above, not a bomb), and before
        // anything is unpacked.
        let read = self.offset + (CHUNK_HEADER_LEN + len) as u64;
        let unpacked = self.unpacked + u64::from(raw_len);
        if unpacked > read.saturating_mul(MAX_RATIO).saturating_add(FREE_RAW) {
            self.refused = Some(format!(
                "refused: its first {read} bytes would unpack to {unpacked}, more than \
                 {MAX_RATIO} times as many (recordings unpack 3-10 times): a decompression \
                 bomb, not a recording"
            ));
            self.done = true;
            return false;
        }
        self.unpacked = unpacked;
        let unzstd = match self.unzstd.as_mut() {
            Some(d) => Ok(d),
            None => zstd::bulk::Decompressor::new().map(|d| self.unzstd.insert(d)),
        };
        self.chunk.clear();
        self.chunk.reserve(raw_len as usize);
        match unzstd.and_then(|d| d.decompress_to_buffer(compressed, &mut self.chunk)) {
            Ok(n) if n == raw_len as usize => {}
            _ => {
                self.stop(format!("undecodable chunk at byte {}", self.offset));
                return false;
            }
        }
        self.offset += (CHUNK_HEADER_LEN + len) as u64;
        self.pos = 0;
        true
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl SessionReader {
    /// How `path` ended, read from its last chunk alone: the chunks before
    /// are walked by their headers and not unpacked (a window's end says
    /// whether the next window continues it). None when it has no footer
    /// (still being written, or cut off) or cannot be read.
    pub fn footer(path: &Path) -> Option<Footer> {
        let mut reader = SessionReader::open(path).ok()?;
        let last = last_chunk_at(reader.input.get_ref())?;
        reader.input.seek(std::io::SeekFrom::Start(last)).ok()?;
        reader.offset = last;
        let mut footer = None;
        for record in reader {
            if let Record::End(f) = record {
                footer = Some(f);
            }
        }
        footer
    }
}

/// Where the last whole chunk of a session file begins, found from the
/// chunk headers alone (read where they lie, without the chunks between).
fn last_chunk_at(file: &File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let size = file.metadata().ok()?.len();
    let mut at = FILE_HEADER_LEN as u64;
    let mut last = None;
    let mut head = [0u8; CHUNK_HEADER_LEN];
    while file.read_exact_at(&mut head, at).is_ok() {
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let next = at + (CHUNK_HEADER_LEN as u64) + u64::from(len);
        if len > MAX_CHUNK_COMPRESSED || next > size {
            break;
        }
        last = Some(at);
        at = next;
    }
    last
}

impl SessionReader {
    /// The records of the next chunk (what is left of the current one, at
    /// first); None at the end of the stream.
    fn next_batch(&mut self) -> Option<Vec<Record>> {
        let mut out = Vec::new();
        while !self.done {
            while self.pos < self.chunk.len() {
                match postcard::take_from_bytes::<Record>(&self.chunk[self.pos..]) {
                    Ok((record, rest)) => {
                        self.pos = self.chunk.len() - rest.len();
                        out.push(record);
                    }
                    Err(e) => {
                        self.stop(format!(
                            "undecodable record in the chunk ending before byte {}: {e}",
                            self.offset
                        ));
                        break;
                    }
                }
            }
            if !out.is_empty() {
                return Some(out);
            }
            if !self.next_chunk() {
                break;
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// The same stream, read, checked, unpacked and decoded on a thread of
    /// its own a few chunks ahead of its reader: on a long recording that
    /// is a third of the report's time, and a second core can take it.
    pub fn in_background(self) -> Background {
        // Chunks decoded ahead: enough to keep both sides busy, and a bound
        // on what waits in memory (a chunk unpacks to at most
        // MAX_CHUNK_RAW).
        const AHEAD: usize = 2;
        let (tx, rx) = std::sync::mpsc::sync_channel(AHEAD);
        let decode = move || {
            let mut reader = self;
            while let Some(batch) = reader.next_batch() {
                // The reader went away: stop reading.
                if tx.send(Ahead::Batch(batch, reader.bytes_read())).is_err() {
                    return;
                }
            }
            let _ = tx.send(Ahead::End(reader));
        };
        let spawned = std::thread::Builder::new()
            .name("gapscope-read".into())
            .spawn(decode);
        Background {
            lost: spawned
                .is_err()
                .then_some("no thread could be started to read it"),
            rx: spawned.ok().map(|_| rx),
            batch: Vec::new().into_iter(),
            bytes_read: 0,
            end: None,
        }
    }
}

/// What the decoding thread hands over: a chunk's records with the bytes
/// of the file read by then, and at the end the reader itself, which says
/// how the stream ended.
enum Ahead {
    Batch(Vec<Record>, u64),
    End(SessionReader),
}

/// A [`SessionReader`] running ahead on a thread of its own.
pub struct Background {
    /// None when no thread could be started: the stream then reads as cut
    /// off at its start.
    rx: Option<std::sync::mpsc::Receiver<Ahead>>,
    batch: std::vec::IntoIter<Record>,
    bytes_read: u64,
    end: Option<SessionReader>,
    /// Why the stream ended without its reader's word, if it did.
    lost: Option<&'static str>,
}

impl Background {
    /// [`SessionReader::bytes_read`] as of the last record handed out.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// [`SessionReader::truncated`], once the stream has ended.
    pub fn truncated(&self) -> Option<&str> {
        match &self.end {
            Some(r) => r.truncated(),
            None => self.lost,
        }
    }

    /// [`SessionReader::refusal`], once the stream has ended.
    pub(super) fn refusal(&self) -> Option<SessionError> {
        self.end.as_ref().and_then(SessionReader::refusal)
    }
}

impl Iterator for Background {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(r) = self.batch.next() {
                return Some(r);
            }
            match self.rx.as_ref()?.recv() {
                Ok(Ahead::Batch(batch, read)) => {
                    self.batch = batch.into_iter();
                    self.bytes_read = read;
                }
                Ok(Ahead::End(reader)) => {
                    self.bytes_read = reader.bytes_read();
                    self.end = Some(reader);
                    self.rx = None;
                    return None;
                }
                // The thread died (it does not panic by design): what came
                // before stands, and the stream reads as cut off.
                Err(_) => {
                    self.rx = None;
                    self.lost = Some("its reading thread stopped");
                    return None;
                }
            }
        }
    }
}

impl Iterator for SessionReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        while !self.done {
            if self.pos < self.chunk.len() {
                match postcard::take_from_bytes::<Record>(&self.chunk[self.pos..]) {
                    Ok((record, rest)) => {
                        self.pos = self.chunk.len() - rest.len();
                        return Some(record);
                    }
                    Err(e) => {
                        self.stop(format!(
                            "undecodable record in the chunk ending before byte {}: {e}",
                            self.offset
                        ));
                        return None;
                    }
                }
            }
            if !self.next_chunk() {
                return None;
            }
        }
        None
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A session error saying why `path` is not read further.
pub(super) fn refused(path: PathBuf, why: String) -> SessionError {
    SessionError::Io {
        path,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    }
}
