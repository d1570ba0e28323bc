//! Where a session's records are kept: one file, or the windows of one
//! recording (`run --window`, the agent's), read as one session by merging
//! them as they are read — no copy on disk, and no more memory than one
//! file of the same events.

use std::path::{Path, PathBuf};

use super::merge::Merging;
use super::reader::Background;
use super::{Record, SessionError, SessionReader};

#[derive(Clone, Debug)]
pub enum Stored {
    File(PathBuf),
    /// Of one recording, in time order (one of [`super::recordings`]).
    Windows(Vec<PathBuf>),
}

impl Stored {
    /// The file errors name: the session's, or its first window's.
    pub fn path(&self) -> PathBuf {
        match self {
            Stored::File(p) => super::resolve_path(p),
            Stored::Windows(w) => w
                .first()
                .map(|p| super::resolve_path(p))
                .unwrap_or_default(),
        }
    }

    /// Its records from the start, read on the caller's thread (one that
    /// is itself a reader's, as the events' ordering is).
    pub fn records_here(&self) -> Result<Records, SessionError> {
        Ok(match self {
            Stored::File(p) => {
                Records::Here(Box::new(SessionReader::open(&super::resolve_path(p))?))
            }
            Stored::Windows(w) => Records::Windows(Box::new(Merging::open(w)?)),
        })
    }

    /// Its records from the start, read ahead on a thread of their own.
    pub fn records(&self) -> Result<Records, SessionError> {
        Ok(match self {
            Stored::File(p) => Records::File(Box::new(
                SessionReader::open(&super::resolve_path(p))?.in_background(),
            )),
            Stored::Windows(w) => Records::Windows(Box::new(Merging::open(w)?)),
        })
    }
}

impl From<&Path> for Stored {
    fn from(p: &Path) -> Stored {
        Stored::File(p.to_path_buf())
    }
}

/// The records of a [`Stored`] session, in the order written.
pub enum Records {
    File(Box<Background>),
    Here(Box<SessionReader>),
    Windows(Box<Merging>),
}

impl Records {
    /// Bytes of the file(s) read so far.
    pub fn bytes_read(&self) -> u64 {
        match self {
            Records::File(r) => r.bytes_read(),
            Records::Here(r) => r.bytes_read(),
            Records::Windows(m) => m.bytes_read(),
        }
    }

    /// Why the stream ended early, once it has, if it did.
    pub fn truncated(&self) -> Option<&str> {
        match self {
            Records::File(r) => r.truncated(),
            Records::Here(r) => r.truncated(),
            Records::Windows(m) => m.truncated(),
        }
    }

    /// The cap the stream broke, once it has ended, if it did.
    pub fn take_refusal(&mut self) -> Option<SessionError> {
        match self {
            Records::File(r) => r.refusal(),
            Records::Here(r) => r.refusal(),
            Records::Windows(m) => m.take_refusal(),
        }
    }
}

impl Iterator for Records {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        match self {
            Records::File(r) => r.next(),
            Records::Here(r) => r.next(),
            Records::Windows(m) => m.next(),
        }
    }
}
