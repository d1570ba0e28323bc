//! Python in the recording, and whether its functions were named.
//!
//! A native stack through CPython shows the interpreter's C functions
//! (`_PyEval_EvalFrameDefault`…), not the Python functions it ran. The
//! recorder walks the interpreter's own frames (CPython 3.9–3.14) and puts
//! them in the stacks as `py::Dataset.__getitem__:…/data.py`, where the
//! eval loop ran them. When a process that ran Python was sampled and none
//! of its stacks names a Python function, the report says so, and why it
//! may be, rather than leave people wondering where their functions went
//! (a version the unwinder cannot walk is said by the recording itself).

use std::collections::BTreeMap;

use super::Names;
use crate::session::ProcMaps;

/// The CPython version a mapped file names: `python3.11`,
/// `libpython3.12.so.1.0`, `libpython3.13t.so`.
fn version_of(path: &str) -> Option<(u32, u32)> {
    let file = path.rsplit('/').next()?;
    let rest = file
        .strip_prefix("libpython")
        .or_else(|| file.strip_prefix("python"))?;
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Each process that ran CPython, with its version (from what it mapped).
fn interpreters(maps: &[ProcMaps]) -> BTreeMap<u32, (u32, u32)> {
    let mut out = BTreeMap::new();
    for m in maps {
        if let Some(v) = m.ranges.iter().find_map(|r| version_of(&r.path)) {
            out.insert(m.pid, v);
        }
    }
    out
}

/// Whether any stack of `pid` names a Python function (a perf map entry of
/// CPython's trampoline).
fn named(names: &Names, pid: u32) -> bool {
    names.stacks.values().filter(|s| s.pid == pid).any(|s| {
        names
            .frames(s.hash)
            .is_some_and(|f| f.iter().any(|f| f.function.starts_with("py::")))
    })
}

/// What the report says about Python frames: per version, which processes
/// ran it and why their functions are or are not in the stacks.
pub fn notes(maps: &[ProcMaps], names: &Names) -> Vec<String> {
    let mut by_version: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
    for (pid, v) in interpreters(maps) {
        by_version.entry(v).or_default().push(pid);
    }
    let sampled = |pid: u32| names.stacks.values().any(|s| s.pid == pid && !s.kernel);
    let mut out = Vec::new();
    for ((major, minor), pids) in by_version {
        if !pids.iter().any(|&p| sampled(p)) || pids.iter().any(|&p| named(names, p)) {
            continue;
        }
        let list = pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        out.push(format!(
            "Python {major}.{minor} (pid {list}): no Python function was named in its stacks, \
             only the interpreter's C functions: it was recorded with --no-python-frames, or \
             its interpreter could not be walked (the notes say why)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_what_was_mapped() {
        assert_eq!(version_of("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(
            version_of("/root/.pyenv/versions/3.12.4/lib/libpython3.12.so.1.0"),
            Some((3, 12))
        );
        assert_eq!(version_of("/opt/py/lib/libpython3.13t.so"), Some((3, 13)));
        assert_eq!(version_of("/usr/bin/python3"), None);
        assert_eq!(version_of("/usr/lib/libpythonista.so"), None);
        assert_eq!(version_of("/usr/bin/bash"), None);
    }
}
