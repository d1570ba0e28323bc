//! The recorded session: a versioned, chunked, checksummed binary file
//! (`session.gsz`) that is written incrementally while recording, so that a
//! crash leaves a readable prefix, and re-read offline with no privileges.
//!
//! Layout: an 16-byte file header (magic, format version), then chunks. Each
//! chunk is `[compressed len: u32][raw len: u32][crc32 of compressed: u32]`
//! followed by a zstd frame holding postcard-encoded [`Record`]s back to back.

mod merge;
mod model;
mod read;
mod reader;
mod stored;
mod writer;

pub use merge::{merge, recordings, windows_in, Merged, Merging};
pub use model::*;
pub use read::{
    check, read_outline, read_session, span_within, within, EventStream, Outline, Session,
};
pub(crate) use read::{note_dropped, sanitize};
pub use reader::SessionReader;
pub use stored::{Records, Stored};
pub use writer::{wrap_records, SessionWriter};

use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"GAPSCOPE";
pub const FILE_NAME: &str = "session.gsz";
const FILE_HEADER_LEN: usize = 16;
const CHUNK_HEADER_LEN: usize = 12;
/// Chunks are cut well below these; a length above them is corruption, and
/// is refused before anything of that size is allocated.
const MAX_CHUNK_COMPRESSED: u32 = 64 << 20;
const MAX_CHUNK_RAW: u32 = 64 << 20;

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

/// A session to analyse: one in memory (imported, or built by a test), or
/// one stored (a file, or one recording's windows), read as it streams.
pub enum Source {
    InMemory(Box<Session>),
    Stored(Stored),
}

impl From<Session> for Source {
    fn from(s: Session) -> Source {
        Source::InMemory(Box::new(s))
    }
}

impl From<PathBuf> for Source {
    fn from(p: PathBuf) -> Source {
        Source::Stored(Stored::File(p))
    }
}

impl From<Stored> for Source {
    fn from(s: Stored) -> Source {
        Source::Stored(s)
    }
}

/// A session path as given by the user: the file itself or a run directory.
pub fn resolve_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(FILE_NAME)
    } else {
        path.to_path_buf()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// A header for sessions built in tests.
    pub(crate) fn header() -> SessionHeader {
        SessionHeader {
            gapscope_version: "test".into(),
            mode: Mode::Run,
            target_pid: 42,
            command: vec!["true".into()],
            hostname: "h".into(),
            kernel: "k".into(),
            nr_cpus: 2,
            start_ns: 1_000,
            start_unix_ns: 2_000,
            sample_hz: 99,
        }
    }

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

    /// A session of `chunks` flushed chunks of 1000 events each, finished.
    fn write(path: &Path, chunks: u64, footer: bool) {
        let mut w = SessionWriter::create(path).unwrap();
        w.push(&Record::Header(header())).unwrap();
        for c in 0..chunks {
            for i in 0..1000 {
                w.push(&wakeup(c * 1000 + i)).unwrap();
            }
            w.flush().unwrap();
        }
        if footer {
            w.push(&Record::End(Footer {
                end_ns: 5_000_000,
                reason: StopReason::TargetExited,
                exit_code: Some(0),
                events: chunks * 1000,
            }))
            .unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn events_come_back_in_time_order_stably() {
        // Ring-buffer order: each CPU's events in order, CPUs interleaved a
        // little late or early. Ties keep their written order (the waker
        // tid tells them apart); a reversed file takes the general sort.
        let ev = |ts: u64, n: u32| Event::Wakeup {
            ts,
            pid: 1,
            tid: 1,
            waker_pid: 1,
            waker_tid: n,
            new_task: false,
        };
        let key = |e: &Event| match e {
            Event::Wakeup { ts, waker_tid, .. } => (*ts, *waker_tid),
            _ => unreachable!(),
        };
        for reversed in [false, true] {
            let mut events: Vec<Event> = (0..5000u32)
                .map(|i| {
                    let jitter = [0, 7, 3, 0, 5][i as usize % 5];
                    let ts = if reversed {
                        10_000 - u64::from(i)
                    } else {
                        u64::from(i) + jitter
                    };
                    ev(ts, i)
                })
                .collect();
            let mut expected: Vec<(u64, u32)> = events.iter().map(key).collect();
            expected.sort_by_key(|&(ts, _)| ts);
            read::into_time_order(&mut events);
            let got: Vec<(u64, u32)> = events.iter().map(key).collect();
            assert_eq!(got, expected, "reversed: {reversed}");
        }
    }

    #[test]
    fn roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, 3, true);
        let s = read_session(dir.path()).unwrap(); // a run directory works too
        assert_eq!(s.header(), &header());
        assert_eq!(s.events.len(), 3000);
        assert_eq!(s.events[2999].ts(), 2999);
        assert!(s.truncated.is_none());
        assert_eq!(s.footer.unwrap().exit_code, Some(0));
    }

    #[test]
    fn a_cut_off_file_keeps_every_whole_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, 3, true);
        let full = std::fs::read(&path).unwrap();
        for cut in [full.len() - 1, full.len() / 2, FILE_HEADER_LEN + 5] {
            std::fs::write(&path, &full[..cut]).unwrap();
            match read_session(&path) {
                Ok(s) => {
                    assert!(s.truncated.is_some(), "cut at {cut} not reported");
                    assert_eq!(s.events.len() % 1000, 0, "a partial chunk was used");
                    assert!(s.footer.is_none());
                }
                Err(SessionError::Empty { .. }) => assert!(cut < full.len() / 4),
                Err(e) => panic!("cut at {cut}: {e}"),
            }
        }
    }

    #[test]
    fn a_corrupt_chunk_ends_the_stream_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, 3, true);
        let mut bytes = std::fs::read(&path).unwrap();
        // Walk the chunk headers to the second chunk and damage its payload.
        let first_len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        let second = FILE_HEADER_LEN + CHUNK_HEADER_LEN + first_len;
        bytes[second + CHUNK_HEADER_LEN + 3] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let s = read_session(&path).unwrap();
        assert!(s.truncated.as_deref().unwrap().contains("checksum"));
        // The header chunk held the first 1000 events; nothing after the damage.
        assert_eq!(s.events.len(), 1000);
        assert!(s.footer.is_none());
    }

    #[test]
    fn no_footer_means_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, 1, false);
        let s = read_session(&path).unwrap();
        assert_eq!(s.events.len(), 1000);
        assert!(s.truncated.unwrap().contains("did not finish"));
    }

    #[test]
    fn foreign_newer_and_empty_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, b"{\"traceEvents\": []}").unwrap();
        assert!(matches!(
            read_session(&path),
            Err(SessionError::NotASession { .. })
        ));
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            read_session(&path),
            Err(SessionError::NotASession { .. })
        ));
        let mut newer = MAGIC.to_vec();
        newer.extend_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        newer.extend_from_slice(&[0; 6]);
        std::fs::write(&path, &newer).unwrap();
        let err = read_session(&path).unwrap_err();
        assert!(matches!(err, SessionError::UnsupportedVersion { .. }));
        assert!(err.to_string().contains("upgrade gapscope"));
        newer[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        std::fs::write(&path, &newer).unwrap();
        assert!(matches!(
            read_session(&path),
            Err(SessionError::Empty { .. })
        ));
        assert!(matches!(
            read_session(&dir.path().join("missing")),
            Err(SessionError::Io { .. })
        ));
    }

    #[test]
    fn a_huge_claimed_length_is_refused_without_allocating_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, 1, true);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        // A chunk header claiming 4 GiB, then nothing.
        f.write_all(&u32::MAX.to_le_bytes()).unwrap();
        f.write_all(&u32::MAX.to_le_bytes()).unwrap();
        f.write_all(&0u32.to_le_bytes()).unwrap();
        drop(f);
        let s = read_session(&path).unwrap();
        assert_eq!(s.events.len(), 1000);
        assert!(s.truncated.unwrap().contains("implausible chunk length"));
    }

    #[test]
    fn first_record_must_be_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut w = SessionWriter::create(&path).unwrap();
        w.push(&wakeup(1)).unwrap();
        w.finish().unwrap();
        assert!(matches!(
            read_session(&path),
            Err(SessionError::NoHeader { .. })
        ));
    }
}
