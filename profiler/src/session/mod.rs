//! The recorded session: a versioned, chunked, checksummed binary file
//! (`session.gsz`) that is written incrementally while recording, so that a
//! crash leaves a readable prefix, and re-read offline with no privileges.
//!
//! Layout: an 16-byte file header (magic, format version), then chunks. Each
//! chunk is `[compressed len: u32][raw len: u32][crc32 of compressed: u32]`
//! followed by a zstd frame holding postcard-encoded [`Record`]s back to back.

mod model;
mod reader;
mod writer;

pub use model::*;
pub use reader::{read_session, Session, SessionReader};
pub use writer::SessionWriter;

use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"GAPSCOPE";
pub const FILE_NAME: &str = "session.gsz";
const FILE_HEADER_LEN: usize = 16;
const CHUNK_HEADER_LEN: usize = 12;
/// Chunks are cut well below these; a length above them is corruption, and
/// is refused before anything of that size is allocated.
const MAX_CHUNK_COMPRESSED: u32 = 64 << 20;
const MAX_CHUNK_RAW: u32 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a gapscope session (no GAPSCOPE header)")]
    NotASession { path: PathBuf },
    #[error(
        "{path}: session format version {found} is newer than this gapscope understands ({supported}); upgrade gapscope"
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: u16,
        supported: u16,
    },
    #[error("{path}: session holds no records (recording ended before it started)")]
    Empty { path: PathBuf },
    #[error("{path}: first record is not a session header")]
    NoHeader { path: PathBuf },
    #[error("encoding a session record: {0}")]
    Encode(#[from] postcard::Error),
}

/// A session path as given by the user: the file itself or a run directory.
pub fn resolve_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(FILE_NAME)
    } else {
        path.to_path_buf()
    }
}
