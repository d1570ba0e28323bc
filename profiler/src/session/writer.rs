use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::output::OutDir;

use super::{Record, SessionError, CHUNK_HEADER_LEN, FILE_HEADER_LEN, FORMAT_VERSION, MAGIC};

/// Raw bytes gathered before a chunk is cut. Small enough that a crash loses
/// little, large enough that zstd compresses well.
const CHUNK_TARGET: usize = 256 << 10;
const ZSTD_LEVEL: i32 = 3;

fn file_header() -> [u8; FILE_HEADER_LEN] {
    let mut header = [0u8; FILE_HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header
}

/// One chunk: compressed length, raw length, CRC32 of the compressed bytes,
/// then the zstd frame.
fn encode_chunk(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let compressed = zstd::bulk::compress(raw, ZSTD_LEVEL)?;
    let mut chunk = Vec::with_capacity(CHUNK_HEADER_LEN + compressed.len());
    chunk.extend_from_slice(&(compressed.len() as u32).to_le_bytes());
    chunk.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    chunk.extend_from_slice(&crc32fast::hash(&compressed).to_le_bytes());
    chunk.extend_from_slice(&compressed);
    Ok(chunk)
}

/// A whole session file holding `raw` (encoded records) as its one chunk:
/// valid framing around arbitrary content, for fuzzing the record decoder.
pub fn wrap_records(raw: &[u8]) -> Vec<u8> {
    let mut out = file_header().to_vec();
    if let Ok(chunk) = encode_chunk(raw) {
        out.extend_from_slice(&chunk);
    }
    out
}

/// Appends records to a session file, one self-checking chunk at a time.
pub struct SessionWriter {
    file: File,
    path: PathBuf,
    /// The directory it is in, held open: what goes beside it goes there.
    dir: Arc<OutDir>,
    buf: Vec<u8>,
    records: u64,
}

impl SessionWriter {
    /// Creates the file (replacing one of that name), readable by its
    /// owner only; its directory is made if missing (see [`OutDir::named`]).
    pub fn create(path: &Path) -> Result<Self, SessionError> {
        let io = |source| SessionError::Io {
            path: path.to_path_buf(),
            source,
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let dir = OutDir::named(parent).map_err(io)?;
        Self::create_in(Arc::new(dir), name)
    }

    /// Creates `name` in `dir` (replacing one of that name, never writing
    /// through it), readable by its owner only.
    pub fn create_in(dir: Arc<OutDir>, name: &str) -> Result<Self, SessionError> {
        let path = dir.join(name);
        let io = |source| SessionError::Io {
            path: path.clone(),
            source,
        };
        let mut file = dir.create(name).map_err(io)?;
        file.write_all(&file_header()).map_err(io)?;
        Ok(SessionWriter {
            file,
            path,
            dir,
            buf: Vec::with_capacity(CHUNK_TARGET + 4096),
            records: 0,
        })
    }

    /// The directory the session is in.
    pub fn dir(&self) -> &Arc<OutDir> {
        &self.dir
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records pushed so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn push(&mut self, record: &Record) -> Result<(), SessionError> {
        postcard::to_io(record, &mut self.buf)?;
        self.records += 1;
        if self.buf.len() >= CHUNK_TARGET {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes what is buffered as one chunk. Called on a timer while
    /// recording so a crash loses at most the last interval.
    pub fn flush(&mut self) -> Result<(), SessionError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let io = |source| SessionError::Io {
            path: self.path.clone(),
            source,
        };
        let chunk = encode_chunk(&self.buf).map_err(io)?;
        self.file.write_all(&chunk).map_err(io)?;
        self.buf.clear();
        Ok(())
    }

    /// Flushes and syncs. Records pushed after the footer are not expected.
    pub fn finish(mut self) -> Result<(), SessionError> {
        self.flush()?;
        self.file.sync_all().map_err(|source| SessionError::Io {
            path: self.path.clone(),
            source,
        })
    }
}
