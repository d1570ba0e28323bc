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
        let Some(packed) = self.next_packed() else {
            return false;
        };
        let mut chunk = std::mem::take(&mut self.chunk);
        let unzstd = &mut self.unzstd;
        let unpacked = packed.unpack(unzstd, &mut chunk);
        self.compressed = packed.compressed;
        self.chunk = chunk;
        match unpacked {
            Ok(()) => {
                self.pos = 0;
                true
            }
            Err(why) => {
                // The chunk is not read: the file so far ends before it.
                self.offset = packed.at;
                self.stop(why);
                false
            }
        }
    }

    /// Reads the next chunk as stored and checks it — its checksum, the
    /// size its frame states, what the file unpacks to so far — without
    /// unpacking it; None at a clean end or when the tail is bad.
    fn next_packed(&mut self) -> Option<PackedChunk> {
        if self.done {
            return None;
        }
        let mut head = [0u8; CHUNK_HEADER_LEN];
        match read_full(&mut self.input, &mut head) {
            Ok(0) => {
                self.done = true;
                return None;
            }
            Ok(n) if n < CHUNK_HEADER_LEN => {
                self.stop(format!(
                    "cut off inside a chunk header at byte {}",
                    self.offset
                ));
                return None;
            }
            Ok(_) => {}
            Err(e) => {
                self.stop(format!("read error at byte {}: {e}", self.offset));
                return None;
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
            return None;
        }
        let mut compressed = std::mem::take(&mut self.compressed);
        compressed.resize(len as usize, 0);
        if !self.check(&mut compressed, raw_len, crc) {
            self.compressed = compressed;
            return None;
        }
        let at = self.offset;
        self.offset += (CHUNK_HEADER_LEN + len as usize) as u64;
        Some(PackedChunk {
            compressed,
            raw_len,
            at,
            end: self.offset,
        })
    }

    /// The rest of [`SessionReader::next_packed`]: the chunk's bytes read
    /// into `compressed` (sized to the chunk) and checked.
    fn check(&mut self, compressed: &mut [u8], raw_len: u32, crc: u32) -> bool {
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
        true
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A chunk read and checked, still compressed: unpacked and decoded by
/// whichever thread takes it.
struct PackedChunk {
    compressed: Vec<u8>,
    raw_len: u32,
    /// Where it begins in the file, and where it ends.
    at: u64,
    end: u64,
}

impl PackedChunk {
    /// Unpacks it into `chunk` through zstd's context `unzstd` (made on
    /// first use, kept from chunk to chunk: a fresh one per chunk was a
    /// tenth of the unpacking).
    fn unpack(
        &self,
        unzstd: &mut Option<zstd::bulk::Decompressor<'static>>,
        chunk: &mut Vec<u8>,
    ) -> Result<(), String> {
        let unzstd = match unzstd.as_mut() {
            Some(d) => Ok(d),
            None => zstd::bulk::Decompressor::new().map(|d| unzstd.insert(d)),
        };
        chunk.clear();
        chunk.reserve(self.raw_len as usize);
        match unzstd.and_then(|d| d.decompress_to_buffer(&self.compressed, chunk)) {
            Ok(n) if n == self.raw_len as usize => Ok(()),
            _ => Err(format!("undecodable chunk at byte {}", self.at)),
        }
    }
}

/// The records of an unpacked chunk, in order; with why they stop short
/// of its end, if they do.
fn decode(chunk: &[u8], end: u64) -> (Vec<Record>, Option<String>) {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < chunk.len() {
        match postcard::take_from_bytes::<Record>(&chunk[pos..]) {
            Ok((record, rest)) => {
                pos = chunk.len() - rest.len();
                out.push(record);
            }
            Err(e) => {
                return (out, Some(undecodable(end, e)));
            }
        }
    }
    (out, None)
}

fn undecodable(end: u64, e: postcard::Error) -> String {
    format!("undecodable record in the chunk ending before byte {end}: {e}")
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
    /// The same stream, read and checked on a thread of its own, its chunks
    /// unpacked and decoded a few ahead of its reader by as many more
    /// threads as there are CPUs to spare (up to [`DECODERS`]), and handed
    /// over in order: on a long recording that is a third of the report's
    /// time.
    pub fn in_background(self) -> Background {
        // One CPU is left to the thread that takes the records: on two,
        // a second decoder made the first pass of a 10 M-event report
        // slower (1.03 s against 0.97).
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.in_background_with(n.saturating_sub(1).clamp(1, DECODERS))
    }

    /// [`SessionReader::in_background`] with `decoders` threads decoding.
    fn in_background_with(mut self, decoders: usize) -> Background {
        // What is left of the chunk already unpacked comes first.
        let (left, failed) = match self.pos < self.chunk.len() {
            true => decode(&self.chunk[self.pos..], self.offset),
            false => (Vec::new(), None),
        };
        self.pos = self.chunk.len();
        let mut background = Background {
            rxs: Vec::new(),
            turn: 0,
            batch: left.into_iter(),
            bytes_read: self.offset,
            end: None,
            failed,
            lost: None,
        };
        if background.failed.is_some() {
            return background;
        }
        let mut txs = Vec::new();
        for _ in 0..decoders {
            // A chunk is handed to a decoder as it takes it, and its
            // records wait for the reader one chunk deep: a bound on what
            // waits in memory (a chunk unpacks to at most MAX_CHUNK_RAW).
            let (tx, jobs) = std::sync::mpsc::sync_channel::<Job>(0);
            let (done, rx) = std::sync::mpsc::sync_channel::<Ahead>(1);
            let decoder = move || {
                let (mut unzstd, mut chunk) = (None, Vec::new());
                for job in jobs {
                    let ahead = match job {
                        Job::Chunk(packed) => match packed.unpack(&mut unzstd, &mut chunk) {
                            Ok(()) => {
                                let (records, failed) = decode(&chunk, packed.end);
                                Ahead::Chunk(records, packed.end, failed)
                            }
                            Err(why) => Ahead::Chunk(Vec::new(), packed.at, Some(why)),
                        },
                        Job::End(reader) => Ahead::End(reader),
                    };
                    // The reader went away: stop.
                    if done.send(ahead).is_err() {
                        return;
                    }
                }
            };
            match std::thread::Builder::new()
                .name("gapscope-decode".into())
                .spawn(decoder)
            {
                Ok(_) => {
                    txs.push(tx);
                    background.rxs.push(rx);
                }
                Err(_) => break,
            }
        }
        // Chunks go to the decoders in turn, and are taken back in the
        // same turn: in the order read.
        let read = move || {
            let mut reader = self;
            for turn in 0.. {
                let tx = &txs[turn % txs.len()];
                let Some(packed) = reader.next_packed() else {
                    let _ = tx.send(Job::End(Box::new(reader)));
                    return;
                };
                // The reader went away: stop reading.
                if tx.send(Job::Chunk(packed)).is_err() {
                    return;
                }
            }
        };
        let spawned = !background.rxs.is_empty()
            && std::thread::Builder::new()
                .name("gapscope-read".into())
                .spawn(read)
                .is_ok();
        if !spawned {
            background.rxs.clear();
            background.lost = Some("no thread could be started to read it");
        }
        background
    }
}

/// Threads that unpack and decode a session's chunks at most: past a few,
/// the thread that takes their records is the slower.
const DECODERS: usize = 3;

/// What the reading thread hands a decoder.
enum Job {
    Chunk(PackedChunk),
    /// The stream ended: the reader says how.
    End(Box<SessionReader>),
}

/// What a decoder hands over: a chunk's records, the bytes of the file
/// read by then, and why the records stop short of the chunk's end if they
/// do; at the end the reader itself, which says how the stream ended.
enum Ahead {
    Chunk(Vec<Record>, u64, Option<String>),
    End(Box<SessionReader>),
}

/// A [`SessionReader`] running ahead on threads of its own.
pub struct Background {
    /// The decoders' hand-overs, taken in turn; empty once the stream has
    /// ended (or when no thread could be started: the stream then reads as
    /// cut off at its start).
    rxs: Vec<std::sync::mpsc::Receiver<Ahead>>,
    turn: usize,
    batch: std::vec::IntoIter<Record>,
    bytes_read: u64,
    end: Option<Box<SessionReader>>,
    /// Why the records stopped inside a chunk, if they did: the stream ends
    /// there.
    failed: Option<String>,
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
        if let Some(why) = &self.failed {
            return Some(why);
        }
        match &self.end {
            Some(r) => r.truncated(),
            None => self.lost,
        }
    }

    /// [`SessionReader::refusal`], once the stream has ended.
    pub(super) fn refusal(&self) -> Option<SessionError> {
        self.end.as_deref().and_then(SessionReader::refusal)
    }
}

impl Iterator for Background {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(r) = self.batch.next() {
                return Some(r);
            }
            if self.failed.is_some() || self.rxs.is_empty() {
                // Its threads stop as their next hand-over finds no taker.
                self.rxs.clear();
                return None;
            }
            let turn = self.turn % self.rxs.len();
            self.turn += 1;
            match self.rxs[turn].recv() {
                Ok(Ahead::Chunk(records, read, failed)) => {
                    self.batch = records.into_iter();
                    self.bytes_read = read;
                    self.failed = failed;
                }
                Ok(Ahead::End(reader)) => {
                    self.bytes_read = reader.bytes_read();
                    self.end = Some(reader);
                    self.rxs.clear();
                    return None;
                }
                // A thread died (they do not panic by design): what came
                // before stands, and the stream reads as cut off.
                Err(_) => {
                    self.rxs.clear();
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
                        self.stop(undecodable(self.offset, e));
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

#[cfg(test)]
mod tests {
    use super::super::{wrap_records, Event, SessionWriter};
    use super::*;

    fn wakeup(ts: u64) -> Record {
        Record::Event(Event::Wakeup {
            ts,
            pid: 42,
            tid: 42,
            waker_pid: 1,
            waker_tid: 1,
            new_task: false,
        })
    }

    /// A session of `chunks` chunks of a varying number of events (a few
    /// empty), as the writer frames them.
    fn write(path: &Path, chunks: u64) {
        let mut w = SessionWriter::create(path).unwrap();
        w.push(&Record::Header(crate::session::tests::header()))
            .unwrap();
        let mut ts = 0;
        for c in 0..chunks {
            for _ in 0..(c * 37 % 500) {
                ts += 1;
                w.push(&wakeup(ts)).unwrap();
            }
            w.flush().unwrap();
        }
        w.finish().unwrap();
    }

    /// Where each chunk of a session file begins, from its headers.
    fn chunk_starts(bytes: &[u8]) -> Vec<usize> {
        let mut at = FILE_HEADER_LEN;
        let mut starts = Vec::new();
        while at + CHUNK_HEADER_LEN <= bytes.len() {
            starts.push(at);
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            at += CHUNK_HEADER_LEN + len;
        }
        starts
    }

    /// The records, how the stream ended and the bytes read, read on the
    /// caller's thread and then by each number of decoders: all the same.
    fn read_alike(path: &Path) -> (usize, Option<String>) {
        let mut inline = SessionReader::open(path).unwrap();
        let records: Vec<Record> = inline.by_ref().collect();
        let encode = |r: &Vec<Record>| {
            r.iter()
                .map(|x| postcard::to_allocvec(x).unwrap())
                .collect::<Vec<_>>()
        };
        for decoders in [1, 2, 3, 5] {
            let mut background = SessionReader::open(path)
                .unwrap()
                .in_background_with(decoders);
            let got: Vec<Record> = background.by_ref().collect();
            assert_eq!(encode(&got), encode(&records), "{decoders} decoders");
            assert_eq!(background.truncated(), inline.truncated(), "{decoders}");
            assert_eq!(background.bytes_read(), inline.bytes_read(), "{decoders}");
        }
        (records.len(), inline.truncated().map(str::to_owned))
    }

    #[test]
    fn decoders_hand_the_records_over_in_the_order_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.gsz");
        write(&path, 40);
        let (n, truncated) = read_alike(&path);
        assert_eq!(n, 1 + (0..40).map(|c| c * 37 % 500).sum::<usize>());
        assert_eq!(truncated, None);
    }

    #[test]
    fn decoders_end_the_stream_where_a_chunk_is_damaged_as_one_reader_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.gsz");
        write(&path, 40);
        let bytes = std::fs::read(&path).unwrap();
        let starts = chunk_starts(&bytes);
        // A flipped bit in the 17th chunk (found by the reading thread),
        // and a chunk whose records do not decode (found by a decoder).
        let mut flipped = bytes.clone();
        flipped[starts[17] + CHUNK_HEADER_LEN + 2] ^= 1;
        let garbage = wrap_records(&[0xff; 64]);
        let mut undecodable = bytes[..starts[23]].to_vec();
        undecodable.extend_from_slice(&garbage[FILE_HEADER_LEN..]);
        undecodable.extend_from_slice(&bytes[starts[23]..]);
        for (damaged, why) in [(flipped, "checksum"), (undecodable, "undecodable record")] {
            std::fs::write(&path, &damaged).unwrap();
            let (n, truncated) = read_alike(&path);
            assert!(
                truncated.as_deref().is_some_and(|t| t.contains(why)),
                "{truncated:?}"
            );
            assert!(n > 1, "{n}");
        }
    }

    #[test]
    fn a_reader_taken_to_the_background_goes_on_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.gsz");
        write(&path, 12);
        let all: Vec<Record> = SessionReader::open(&path).unwrap().collect();
        let mut reader = SessionReader::open(&path).unwrap();
        let first: Vec<Record> = reader.by_ref().take(100).collect();
        let rest: Vec<Record> = reader.in_background_with(2).collect();
        assert_eq!(first.len() + rest.len(), all.len());
        let encode = |r: &Record| postcard::to_allocvec(r).unwrap();
        assert!(first
            .iter()
            .chain(&rest)
            .map(encode)
            .eq(all.iter().map(encode)));
    }
}
