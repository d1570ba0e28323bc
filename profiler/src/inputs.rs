//! What `gapscope report` accepts: a session file, a run directory, the
//! agent's folder of windows of one job, or PyTorch profiler (Kineto)
//! traces — one, several, or a directory of them (one per rank). Told
//! apart by content, not by name.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::kineto::{self, KinetoError};
use crate::session::{self, SessionError};

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
    /// An imported trace in memory, or a session file's outline (its
    /// events are streamed when it is analysed).
    pub source: session::Source,
}

impl Loaded {
    /// What reading it left out that a user should hear of on stderr
    /// (events of an imported trace gapscope does not read).
    pub fn warnings(&self) -> Vec<String> {
        match &self.source {
            session::Source::InMemory(s) => kineto::warnings(s)
                .map(|w| format!("{}: {w}", self.label))
                .collect(),
            session::Source::Stored(_) => Vec::new(),
        }
    }
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
    let source = if !is_session(path) && kineto::looks_like_trace(path) {
        kineto::import(path)?.into()
    } else {
        session::check(path)?;
        path.to_path_buf().into()
    };
    Ok(Loaded { label, source })
}

/// A folder of windows of one recording — the agent's of one job
/// (`<workload>-<pid>/`), or `run --window`'s run directory —, a run
/// directory per window: read as one session, the windows merged as they
/// are read (the latest recording's, when the job was recorded more than
/// once). None when the folder holds no windows.
fn load_windows(dir: &Path) -> Result<Option<Loaded>, LoadError> {
    let recordings = session::recordings(&session::windows_in(dir));
    let Some(last) = recordings.last() else {
        return Ok(None);
    };
    let mode = session::SessionReader::open(&last[0].join(session::FILE_NAME))
        .ok()
        .and_then(|mut r| r.next())
        .and_then(|r| match r {
            session::Record::Header(h) => Some(h.mode),
            _ => None,
        });
    // The agent's windows, or the one recording `run --window` makes in
    // its folder (a folder of several runs named by number is not one).
    let windows = match mode {
        Some(session::Mode::Window) => true,
        Some(session::Mode::Run | session::Mode::Attach) => recordings.len() == 1,
        _ => false,
    };
    if !windows {
        return Ok(None);
    }
    let label = dir
        .canonicalize()
        .ok()
        .and_then(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    Ok(Some(Loaded {
        label,
        source: session::Stored::Windows(last.clone()).into(),
    }))
}

pub fn load(paths: &[PathBuf]) -> Result<Vec<Loaded>, LoadError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() && !p.join(session::FILE_NAME).exists() {
            if let Some(l) = load_windows(p)? {
                out.push(l);
                continue;
            }
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
            let mut l = load_file(&session::resolve_path(p))?;
            // A run directory goes by its name (every session file is
            // session.gsz): node1/, rank3/, gapscope-4242-…/.
            if p.is_dir() {
                if let Some(name) = p
                    .canonicalize()
                    .ok()
                    .and_then(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
                {
                    l.label = name;
                }
            }
            out.push(l);
        }
    }
    Ok(out)
}

/// Writes a session for each trace: `dir/session.gsz` for one trace,
/// `dir/<trace name>/session.gsz` for several. Returns the files written.
pub fn import_to(traces: &[PathBuf], dir: &Path) -> Result<Vec<Imported>, LoadError> {
    use crate::session::{GpuBatch, Record, SessionWriter};
    let files = kineto::trace_files(traces);
    let mut written = Vec::new();
    for f in &files {
        let s = kineto::import(f)?;
        let out = if files.len() == 1 {
            dir.to_path_buf()
        } else {
            let stem = f
                .file_name()
                .map(|n| {
                    n.to_string_lossy()
                        .trim_end_matches(".gz")
                        .trim_end_matches(".json")
                        .to_string()
                })
                .unwrap_or_default();
            dir.join(stem)
        };
        let out_dir = crate::output::OutDir::named(&out).map_err(|source| {
            crate::session::SessionError::Io {
                path: out.clone(),
                source,
            }
        })?;
        let path = out.join(crate::session::FILE_NAME);
        let mut w =
            SessionWriter::create_in(std::sync::Arc::new(out_dir), crate::session::FILE_NAME)?;
        w.push(&Record::Header(s.header().clone()))?;
        for g in &s.gpu_sources {
            w.push(&Record::GpuSource(g.clone()))?;
        }
        for chunk in s.gpu.chunks(4096) {
            // Records keep the pid of the process they belong to.
            let mut by_pid: BTreeMap<u32, Vec<gapscope_wire::GpuRecord>> = BTreeMap::new();
            for (pid, r) in chunk {
                by_pid.entry(*pid).or_default().push(r.clone());
            }
            for (pid, records) in by_pid {
                w.push(&Record::Gpu(GpuBatch { pid, records }))?;
            }
        }
        for o in &s.host_ops {
            w.push(&Record::HostOp(o.clone()))?;
        }
        for n in &s.notes {
            w.push(&Record::Note(n.clone()))?;
        }
        if let Some(r) = s.rank {
            w.push(&Record::Rank(r))?;
        }
        if let Some(f) = &s.footer {
            w.push(&Record::End(f.clone()))?;
        }
        w.finish()?;
        let label = f.file_name().map_or_else(
            || f.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        written.push(Imported {
            warnings: kineto::warnings(&s)
                .map(|w| format!("{label}: {w}"))
                .collect(),
            path,
        });
    }
    Ok(written)
}

/// A session [`import_to`] wrote.
pub struct Imported {
    pub path: PathBuf,
    /// What its trace held that gapscope does not read, as
    /// [`Loaded::warnings`] says it.
    pub warnings: Vec<String>,
}
