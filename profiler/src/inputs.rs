//! What `gapscope report` accepts: a session file, a run directory, or
//! PyTorch profiler (Kineto) traces — one, several, or a directory of them
//! (one per rank). Told apart by content, not by name.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::kineto::{self, KinetoError};
use crate::session::{self, Session, SessionError};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Kineto(#[from] KinetoError),
    #[error("{0}: no session.gsz and no trace files (*.json, *.json.gz) in this directory")]
    EmptyDir(PathBuf),
}

pub struct Loaded {
    /// The file it came from, for multi-rank tables.
    pub label: String,
    pub session: Session,
}

fn is_session(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == session::MAGIC
}

fn load_file(path: &Path) -> Result<Loaded, LoadError> {
    let label = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let session = if !is_session(path) && kineto::looks_like_trace(path) {
        kineto::import(path)?
    } else {
        session::read_session(path)?
    };
    Ok(Loaded { label, session })
}

pub fn load(paths: &[PathBuf]) -> Result<Vec<Loaded>, LoadError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() && !p.join(session::FILE_NAME).exists() {
            let traces = kineto::trace_files(std::slice::from_ref(p));
            if traces.is_empty() {
                return Err(LoadError::EmptyDir(p.clone()));
            }
            let before = out.len();
            for t in traces {
                match load_file(&t) {
                    Ok(l) => out.push(l),
                    // Other JSON beside the traces (a reference file, a
                    // config) is not an error in a directory of traces.
                    Err(LoadError::Kineto(KinetoError::Format { .. })) => {}
                    Err(e) => return Err(e),
                }
            }
            if out.len() == before {
                return Err(LoadError::EmptyDir(p.clone()));
            }
        } else {
            out.push(load_file(&session::resolve_path(p))?);
        }
    }
    Ok(out)
}
