//! Finding the CPython interpreter inside a process, for the kernel side's
//! Python unwinder (`gapscope.bpf.c`, `py_frames`): where `_PyRuntime` and
//! `PyCode_Type` are, which version runs, and the offsets of the few fields
//! a stack walk reads — thread states, frames, code objects, strings.
//!
//! Nothing is asked of the process: no environment variable, no restart,
//! no code run in it. The interpreter is the mapped file (the executable,
//! or a `libpython3.*`) that defines `_PyRuntime` in its dynamic symbols;
//! its version is `Py_Version` (3.11+) read from the process's memory, or
//! the file's name (3.9, 3.10). Offsets come from the interpreter itself
//! where it publishes them (`_Py_DebugOffsets` at the start of
//! `_PyRuntime`, 3.13+), else from a table per minor version, read off the
//! real interpreters' debug information and checked by the tests that
//! name functions on each.

use std::fs::File;

use super::bpf::abi::{PyProc, PY_NONE};
use crate::session::MapRange;

/// What was found in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// A CPython the unwinder can walk.
    Python { version: (u8, u8), proc: PyProc },
    /// A CPython it cannot, and why (one line, for the report).
    Unsupported {
        version: Option<(u8, u8)>,
        why: String,
    },
}

/// The oldest and newest minor versions walked.
pub const OLDEST: u8 = 9;
pub const NEWEST: u8 = 14;

/// Looks for the interpreter in process `pid`, whose executable mappings
/// are `ranges`; `file` gives the file a range maps, held open (see
/// `symbolize::ProcFiles`). None when the process runs no CPython.
pub fn discover(
    pid: u32,
    ranges: &[MapRange],
    file: impl Fn(&MapRange) -> Option<std::sync::Arc<File>>,
) -> Option<Found> {
    for r in ranges.iter().filter(|r| candidate(&r.path)) {
        let Some(f) = file(r) else { continue };
        let Ok(image) = Image::map(&f) else { continue };
        let Some(elf) = Elf::parse(image.bytes()) else {
            continue;
        };
        let syms = elf.symbols(&["_PyRuntime", "PyCode_Type", "Py_Version"]);
        let Some(runtime) = syms[0] else { continue };
        let Some(bias) = elf.bias(r.start, r.offset) else {
            continue;
        };
        let at = |v: u64| v.wrapping_add(bias);
        let version = match syms[2] {
            Some(v) => read_u32(pid, at(v)).map(|hex| ((hex >> 24) as u8, (hex >> 16) as u8)),
            None => version_in_name(&r.path),
        };
        return Some(found(
            pid,
            version,
            at(runtime),
            syms[1].map(at).unwrap_or(0),
        ));
    }
    None
}

/// Whether a process's maps show a `python3*` executable whose interpreter
/// is in a libpython the loader has not mapped yet (right after its exec).
pub fn awaits_libpython(ranges: &[MapRange]) -> bool {
    let name = |r: &MapRange| r.path.rsplit('/').next().unwrap_or("").to_owned();
    ranges.iter().any(|r| name(r).starts_with("python3"))
        && !ranges.iter().any(|r| name(r).starts_with("libpython3"))
}

/// Files that may hold an interpreter: a `libpython3*` or a `python3*`
/// executable (distributions link theirs statically).
fn candidate(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    let name = name.trim_end_matches(" (deleted)");
    name.starts_with("libpython3") || name.starts_with("python3")
}

/// "3.X" in a file's name (`libpython3.10.so.1.0`, `python3.9`).
fn version_in_name(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = &name[name.find("python3.")? + "python3.".len()..];
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((3, minor.parse().ok()?))
}

fn found(pid: u32, version: Option<(u8, u8)>, runtime: u64, code_type: u64) -> Found {
    let unsupported = |why: String| Found::Unsupported { version, why };
    let Some((3, minor)) = version else {
        return unsupported("its version could not be read".into());
    };
    let proc = match minor {
        9 | 10 => Some(v3_9(minor)),
        11 => Some(V3_11),
        12 => Some(V3_12),
        13 | 14 => {
            return match debug_offsets(pid, runtime, minor) {
                Ok(mut p) => {
                    p.runtime = runtime;
                    p.code_type = code_type;
                    Found::Python {
                        version: (3, minor),
                        proc: p,
                    }
                }
                Err(why) => unsupported(why),
            }
        }
        _ => None,
    };
    match proc {
        Some(mut p) => {
            p.runtime = runtime;
            p.code_type = code_type;
            Found::Python {
                version: (3, minor),
                proc: p,
            }
        }
        None => unsupported(format!(
            "Python 3.{minor}: its frames can be walked on 3.{OLDEST} to 3.{NEWEST}"
        )),
    }
}

/// Offsets that do not depend on the version.
const fn base() -> PyProc {
    PyProc {
        runtime: 0,
        code_type: 0,
        interp_head: 0,
        threads_head: 0,
        ts_next: 8,
        ts_thread_id: 0,
        ts_frame: 0,
        cframe_frame: PY_NONE,
        fr_back: 0,
        fr_code: 0,
        fr_owner: PY_NONE,
        fr_is_entry: PY_NONE,
        co_name: 0,
        co_file: 0,
        co_firstlineno: 0,
        str_state: 32,
        str_length: 16,
        str_ascii: 48,
        str_compact: 72,
        owner_cstack: 0xff,
        every_frame_entry: 0,
        _pad: [0; 4],
    }
}

/// 3.9 and 3.10 (pyenv 3.9.18, 3.10.13): frames are PyFrameObjects, one per
/// call of the eval loop; the code object's name is `co_name`.
const fn v3_9(minor: u8) -> PyProc {
    let _ = minor; // the fields read are where they are in both
    PyProc {
        interp_head: 32,
        threads_head: 8,
        ts_thread_id: 176,
        ts_frame: 24,
        fr_back: 24,
        fr_code: 32,
        co_name: 112,
        co_file: 104,
        co_firstlineno: 40,
        every_frame_entry: 1,
        ..base()
    }
}

/// 3.11 (pyenv 3.11.7): `_PyInterpreterFrame`s reached through the thread's
/// CFrame, `is_entry` on the frame a C call entered.
const V3_11: PyProc = PyProc {
    interp_head: 40,
    threads_head: 16,
    ts_thread_id: 152,
    ts_frame: 56,
    cframe_frame: 8,
    fr_back: 48,
    fr_code: 32,
    fr_owner: 69,
    fr_is_entry: 68,
    co_name: 128,
    co_file: 112,
    co_firstlineno: 72,
    ..base()
};

/// 3.12 (pyenv 3.12.1): a C call pushes a shim frame owned by the C stack;
/// strings lost their `wstr` fields.
const V3_12: PyProc = PyProc {
    interp_head: 40,
    threads_head: 72,
    ts_thread_id: 136,
    ts_frame: 56,
    cframe_frame: 0,
    fr_back: 8,
    fr_code: 0,
    fr_owner: 70,
    co_name: 128,
    co_file: 112,
    co_firstlineno: 68,
    str_ascii: 40,
    str_compact: 56,
    owner_cstack: 3,
    ..base()
};

/// Where each field the unwinder reads sits in `_Py_DebugOffsets` (3.13 and
/// 3.14 lay it out differently; within a minor version it is fixed), in
/// bytes from its start.
struct DebugLayout {
    interpreters_head: usize,
    threads_head: usize,
    ts_next: usize,
    ts_current_frame: usize,
    ts_thread_id: usize,
    fr_previous: usize,
    fr_executable: usize,
    fr_owner: usize,
    co_filename: usize,
    co_qualname: usize,
    co_firstlineno: usize,
    str_state: usize,
    str_length: usize,
    str_ascii_size: usize,
    /// Its whole size (what is read).
    size: usize,
    owner_cstack: u8,
}

/// CPython 3.13's `pycore_runtime.h`.
const DEBUG_3_13: DebugLayout = DebugLayout {
    interpreters_head: 40,
    threads_head: 72,
    ts_next: 168,
    ts_current_frame: 184,
    ts_thread_id: 192,
    fr_previous: 232,
    fr_executable: 240,
    fr_owner: 264,
    co_filename: 280,
    co_qualname: 296,
    co_firstlineno: 312,
    str_state: 544,
    str_length: 552,
    str_ascii_size: 560,
    size: 584,
    owner_cstack: 3,
};

/// CPython 3.14's `pycore_debug_offsets.h`.
const DEBUG_3_14: DebugLayout = DebugLayout {
    interpreters_head: 40,
    threads_head: 72,
    ts_next: 192,
    ts_current_frame: 208,
    ts_thread_id: 216,
    fr_previous: 256,
    fr_executable: 264,
    fr_owner: 288,
    co_filename: 320,
    co_qualname: 336,
    co_firstlineno: 352,
    str_state: 624,
    str_length: 632,
    str_ascii_size: 640,
    size: 648,
    owner_cstack: 4,
};

/// The offsets 3.13+ publishes at the start of `_PyRuntime`.
fn debug_offsets(pid: u32, runtime: u64, minor: u8) -> Result<PyProc, String> {
    let l = if minor == 13 {
        &DEBUG_3_13
    } else {
        &DEBUG_3_14
    };
    let mut raw = vec![0u8; l.size];
    super::procfs::read_memory(pid, runtime, &mut raw)
        .map_err(|e| format!("its _PyRuntime could not be read ({e})"))?;
    parse_debug_offsets(&raw, l, minor)
}

fn parse_debug_offsets(raw: &[u8], l: &DebugLayout, minor: u8) -> Result<PyProc, String> {
    let word = |at: usize| -> u64 {
        raw.get(at..at + 8)
            .map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if raw.get(..8) != Some(b"xdebugpy") {
        return Err("its _PyRuntime does not start with _Py_DebugOffsets".into());
    }
    let version = word(8);
    if (version >> 24, (version >> 16) & 0xff) != (3, u64::from(minor)) {
        return Err(format!(
            "its _Py_DebugOffsets say version {:#x}, its library 3.{minor}",
            version
        ));
    }
    if word(16) != 0 {
        return Err("free-threaded builds (3.13t, 3.14t) are not walked yet".into());
    }
    // Offsets of fields in small structs: anything larger is not one.
    let field = |at: usize| -> Result<u16, String> {
        let v = word(at);
        (v < u64::from(PY_NONE))
            .then_some(v as u16)
            .ok_or_else(|| format!("its _Py_DebugOffsets hold {v:#x} at byte {at}"))
    };
    let ascii = field(l.str_ascii_size)?;
    Ok(PyProc {
        interp_head: field(l.interpreters_head)?,
        threads_head: field(l.threads_head)?,
        ts_next: field(l.ts_next)?,
        ts_thread_id: field(l.ts_thread_id)?,
        ts_frame: field(l.ts_current_frame)?,
        fr_back: field(l.fr_previous)?,
        fr_code: field(l.fr_executable)?,
        fr_owner: field(l.fr_owner)?,
        co_name: field(l.co_qualname)?,
        co_file: field(l.co_filename)?,
        co_firstlineno: field(l.co_firstlineno)?,
        str_state: field(l.str_state)?,
        str_length: field(l.str_length)?,
        str_ascii: ascii,
        // PyCompactUnicodeObject adds utf8_length and utf8 to it.
        str_compact: ascii + 16,
        owner_cstack: l.owner_cstack,
        ..base()
    })
}

fn read_u32(pid: u32, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    super::procfs::read_memory(pid, addr, &mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

/// A file mapped read-only into gapscope: only the pages read are read.
struct Image {
    at: *mut libc::c_void,
    len: usize,
}

impl Image {
    fn map(f: &File) -> std::io::Result<Image> {
        use std::os::fd::AsRawFd;
        let len = crate::safe_fs::regular(f)?.len() as usize;
        if len == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: a private read-only mapping of a regular file we hold,
        // unmapped on drop; its bytes are only read.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Image { at, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes and lives as long as self. A
        // file truncated meanwhile would fault: it is the process's own
        // mapped file, which it cannot truncate without crashing itself.
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.len) }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: unmapping what map() mapped.
        unsafe { libc::munmap(self.at, self.len) };
    }
}

use super::elf::Elf;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_file_names() {
        assert_eq!(
            version_in_name("/usr/lib/libpython3.10.so.1.0"),
            Some((3, 10))
        );
        assert_eq!(version_in_name("/usr/bin/python3.9"), Some((3, 9)));
        assert_eq!(version_in_name("/usr/bin/python3"), None);
        assert!(candidate("/opt/py/lib/libpython3.12.so.1.0"));
        assert!(candidate("/usr/bin/python3.11"));
        assert!(!candidate("/usr/lib/libc.so.6"));
    }

    /// The published offsets are taken where 3.13 puts them, and a layout
    /// that is not one (a field past any struct) is refused, not used.
    #[test]
    fn debug_offsets_are_read_and_checked() {
        let l = &DEBUG_3_13;
        let mut raw = vec![0u8; l.size];
        raw[..8].copy_from_slice(b"xdebugpy");
        raw[8..16].copy_from_slice(&0x030d_00f0u64.to_le_bytes());
        let put = |raw: &mut Vec<u8>, at: usize, v: u64| {
            raw[at..at + 8].copy_from_slice(&v.to_le_bytes())
        };
        put(&mut raw, l.interpreters_head, 40);
        put(&mut raw, l.threads_head, 73_440);
        put(&mut raw, l.ts_next, 8);
        put(&mut raw, l.ts_current_frame, 72);
        put(&mut raw, l.ts_thread_id, 152);
        put(&mut raw, l.fr_previous, 8);
        put(&mut raw, l.fr_executable, 0);
        put(&mut raw, l.fr_owner, 70);
        put(&mut raw, l.co_filename, 112);
        put(&mut raw, l.co_qualname, 128);
        put(&mut raw, l.co_firstlineno, 68);
        put(&mut raw, l.str_state, 32);
        put(&mut raw, l.str_length, 16);
        put(&mut raw, l.str_ascii_size, 40);
        let p = parse_debug_offsets(&raw, l, 13);
        let e = p.unwrap_err();
        assert!(e.contains("0x11ee0"), "{e}");
        put(&mut raw, l.threads_head, 7344);
        let p = parse_debug_offsets(&raw, l, 13).unwrap();
        assert_eq!((p.ts_frame, p.fr_owner, p.str_compact), (72, 70, 56));
        assert_eq!(p.owner_cstack, 3);
        assert!(parse_debug_offsets(&raw, l, 14).is_err(), "another version");
        put(&mut raw, 16, 1);
        let e = parse_debug_offsets(&raw, l, 13).unwrap_err();
        assert!(e.contains("free-threaded"), "{e}");
    }
}
