//! Rust mirror of `ebpf/gapscope.h`, the one definition of every record the
//! kernel side sends. Layout is asserted here at compile time and checked
//! against the header's `GS_LAYOUT` lines by a test, so the two cannot drift.

use bytemuck::{Pod, Zeroable};

pub const COMM_LEN: usize = 16;
pub const PATH_LEN: usize = 256;
pub const MAX_STACK_DEPTH: usize = 127;

/// `enum gs_event_kind`.
pub mod kind {
    pub const SWITCH: u16 = 1;
    pub const WAKEUP: u16 = 2;
    pub const SYSCALL: u16 = 3;
    pub const SAMPLE: u16 = 4;
    pub const FAULT: u16 = 5;
    pub const FORK: u16 = 6;
    pub const EXEC: u16 = 7;
    pub const EXIT: u16 = 8;
    pub const STACK: u16 = 9;
    pub const OPEN: u16 = 10;
    pub const CUDA: u16 = 11;
    pub const PYCODE: u16 = 12;
    pub const RETRANSMIT: u16 = 13;
    /// Size of the per-kind drop counter array.
    pub const MAX: usize = 16;

    pub fn name(kind: usize) -> &'static str {
        match kind as u16 {
            SWITCH => "switch",
            WAKEUP => "wakeup",
            SYSCALL => "syscall",
            SAMPLE => "sample",
            FAULT => "fault",
            FORK => "fork",
            EXEC => "exec",
            EXIT => "exit",
            STACK => "stack",
            OPEN => "open",
            CUDA => "cuda",
            PYCODE => "python code",
            RETRANSMIT => "tcp retransmit",
            _ => "other",
        }
    }
}

/// `enum gs_neighbours`: slots of the `neighbours` map.
pub mod neighbours {
    pub const SAME_GROUP: u32 = 0;
    pub const ELSEWHERE: u32 = 1;
}

pub const SW_PREV_TRACKED: u8 = 1;
pub const SW_NEXT_TRACKED: u8 = 2;
pub const SW_PREEMPT: u8 = 4;
pub const SW_CHARGED: u8 = 8;
pub const WK_NEW: u8 = 1;
pub const FORK_THREAD: u32 = 1;
pub const OPEN_DENTRIES: i32 = 1;
pub const OPEN_ROOTED: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Header {
    pub ts: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: u16,
    pub cpu: u16,
    pub size: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Switch {
    pub h: Header,
    pub prev_pid: u32,
    pub prev_tid: u32,
    pub next_pid: u32,
    pub next_tid: u32,
    pub prev_state: u64,
    pub ustack: u64,
    pub kstack: u64,
    pub syscall: i32,
    pub fd: i32,
    pub fd_kind: u8,
    pub flags: u8,
    pub _pad: [u8; 2],
    pub count: u32,
    pub prev_charged: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Wakeup {
    pub h: Header,
    pub waker_pid: u32,
    pub waker_tid: u32,
    pub target_cpu: u32,
    pub flags: u8,
    pub _pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Syscall {
    pub h: Header,
    pub duration: u64,
    pub ret: i64,
    pub nr: i32,
    pub fd: i32,
    pub fd_kind: u8,
    pub _pad: [u8; 7],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Sample {
    pub h: Header,
    pub ustack: u64,
    pub kstack: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Fault {
    pub h: Header,
    pub address: u64,
    pub error_code: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Retransmit {
    pub h: Header,
    pub daddr: [u8; 16],
    pub family: u16,
    pub dport: u16,
    pub sport: u16,
    pub _pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Fork {
    pub h: Header,
    pub parent_pid: u32,
    pub parent_tid: u32,
    pub flags: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Exec {
    pub h: Header,
    pub old_tid: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
    pub filename: [u8; PATH_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Exit {
    pub h: Header,
    pub exit_code: i32,
    pub group_dead: u8,
    pub has_io: u8,
    pub _pad: [u8; 2],
    pub comm: [u8; COMM_LEN],
    pub io: Io,
}

/// `struct gs_io`: the kernel's I/O accounting of one thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Io {
    pub rchar: u64,
    pub wchar: u64,
    pub syscr: u64,
    pub syscw: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Open {
    pub h: Header,
    pub fd: i32,
    pub flags: i32,
    pub path: [u8; PATH_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Cuda {
    pub h: Header,
    pub duration: u64,
    pub arg: u64,
    pub fn_: u32,
    pub _pad: u32,
}

/// Uprobe cookie: function index, and which argument to capture.
pub fn cuda_cookie(function: usize, arg: Option<u8>) -> u64 {
    function as u64 | (arg.unwrap_or(0xff) as u64) << 16
}

/// Python frames in user stacks (see gapscope.h).
pub const PY_FRAME: u64 = 1 << 63;
pub const PY_ENTRY: u64 = 1 << 62;
pub const PY_ADDR_MASK: u64 = (1 << 56) - 1;
pub const PY_NAME_LEN: usize = 128;
pub const PY_FILE_LEN: usize = 256;
pub const PY_NONE: u16 = 0xffff;

/// `struct gs_py_proc`: where the unwinder finds things in one CPython
/// process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct PyProc {
    pub runtime: u64,
    pub code_type: u64,
    pub interp_head: u16,
    pub threads_head: u16,
    pub ts_next: u16,
    pub ts_thread_id: u16,
    pub ts_frame: u16,
    pub cframe_frame: u16,
    pub fr_back: u16,
    pub fr_code: u16,
    pub fr_owner: u16,
    pub fr_is_entry: u16,
    pub co_name: u16,
    pub co_file: u16,
    pub co_firstlineno: u16,
    pub str_state: u16,
    pub str_length: u16,
    pub str_ascii: u16,
    pub str_compact: u16,
    pub owner_cstack: u8,
    pub every_frame_entry: u8,
    pub _pad: [u8; 4],
}

// SAFETY: plain old data (checked by bytemuck's derive), as aya requires
// of a map value.
unsafe impl aya::Pod for PyProc {}

/// `struct gs_pycode`: a code object seen for the first time in a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct PyCode {
    pub h: Header,
    pub code: u64,
    pub firstlineno: i32,
    pub name_len: u16,
    pub file_len: u16,
    pub name_kind: u8,
    pub file_kind: u8,
    pub _pad: [u8; 6],
    pub name: [u8; PY_NAME_LEN],
    pub file: [u8; PY_FILE_LEN],
}

/// Variable length: only `nr_frames` frames are sent, the record is cut short.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct StackHead {
    pub h: Header,
    pub hash: u64,
    pub nr_frames: u32,
    pub kernel: u8,
    pub _pad: [u8; 3],
}

/// Offset of `frames` in `struct gs_stack`; also `size_of::<StackHead>()`.
pub const STACK_FRAMES_OFFSET: usize = 40;
pub const STACK_MAX_SIZE: usize = STACK_FRAMES_OFFSET + 8 * MAX_STACK_DEPTH;

macro_rules! layout {
    ($t:ty, $size:expr; $($field:ident @ $off:expr),* $(,)?) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $size);
        $(const _: () = assert!(std::mem::offset_of!($t, $field) == $off);)*
    };
}

layout!(Header, 24; ts @ 0, pid @ 8, tid @ 12, kind @ 16, cpu @ 18, size @ 20);
layout!(Switch, 88; prev_pid @ 24, prev_tid @ 28, next_pid @ 32, next_tid @ 36,
    prev_state @ 40, ustack @ 48, kstack @ 56, syscall @ 64, fd @ 68, fd_kind @ 72, flags @ 73,
    count @ 76, prev_charged @ 80);
layout!(Wakeup, 40; waker_pid @ 24, waker_tid @ 28, target_cpu @ 32, flags @ 36);
layout!(Syscall, 56; duration @ 24, ret @ 32, nr @ 40, fd @ 44, fd_kind @ 48);
layout!(Sample, 40; ustack @ 24, kstack @ 32);
layout!(Fault, 40; address @ 24, error_code @ 32);
layout!(Retransmit, 48; daddr @ 24, family @ 40, dport @ 42, sport @ 44);
layout!(Fork, 56; parent_pid @ 24, parent_tid @ 28, flags @ 32, comm @ 40);
layout!(Exec, 304; old_tid @ 24, comm @ 32, filename @ 48);
layout!(Io, 48; rchar @ 0, wchar @ 8, syscr @ 16, syscw @ 24, read_bytes @ 32, write_bytes @ 40);
layout!(Exit, 96; exit_code @ 24, group_dead @ 28, has_io @ 29, comm @ 32,
    io @ 48);
layout!(Open, 288; fd @ 24, flags @ 28, path @ 32);
layout!(Cuda, 48; duration @ 24, arg @ 32, fn_ @ 40);
layout!(StackHead, STACK_FRAMES_OFFSET; hash @ 24, nr_frames @ 32, kernel @ 36);
layout!(PyProc, 56; runtime @ 0, code_type @ 8, interp_head @ 16, threads_head @ 18,
    ts_next @ 20, ts_thread_id @ 22, ts_frame @ 24, cframe_frame @ 26, fr_back @ 28,
    fr_code @ 30, fr_owner @ 32, fr_is_entry @ 34, co_name @ 36, co_file @ 38,
    co_firstlineno @ 40, str_state @ 42, str_length @ 44, str_ascii @ 46, str_compact @ 48,
    owner_cstack @ 50, every_frame_entry @ 51);
layout!(PyCode, 432; code @ 24, firstlineno @ 32, name_len @ 36, file_len @ 38,
    name_kind @ 40, file_kind @ 41, name @ 48, file @ 176);

/// Reads a record of type `T` from the front of `bytes`, or None if too short.
pub fn read<T: Pod>(bytes: &[u8]) -> Option<T> {
    bytes
        .get(..std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
}

/// A NUL-terminated C string field as UTF-8 (lossy).
pub fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// (C struct name, C field) -> Rust (size, offset), for every GS_LAYOUT line.
    fn rust_layout(ty: &str, field: Option<&str>) -> Option<usize> {
        macro_rules! table {
            ($($c:literal => $t:ty { $($f:ident),* }),* $(,)?) => {
                match (ty, field) {
                    // The C struct carries the frames; the Rust head stops before them.
                    ("gs_stack", None) => Some(STACK_MAX_SIZE),
                    ("gs_stack", Some("frames")) => Some(STACK_FRAMES_OFFSET),
                    ("gs_stack", Some("hash")) => Some(offset_of!(StackHead, hash)),
                    ("gs_stack", Some("nr_frames")) => Some(offset_of!(StackHead, nr_frames)),
                    ("gs_stack", Some("kernel")) => Some(offset_of!(StackHead, kernel)),
                    ("gs_cuda", Some("fn")) => Some(offset_of!(Cuda, fn_)),
                    $(
                        ($c, None) => Some(size_of::<$t>()),
                        $(($c, Some(stringify!($f))) => Some(offset_of!($t, $f)),)*
                    )*
                    _ => None,
                }
            };
        }
        table! {
            "gs_header" => Header { ts, pid, tid, kind, cpu, size },
            "gs_switch" => Switch { prev_pid, prev_tid, next_pid, next_tid, prev_state,
                                    ustack, kstack, syscall, fd, fd_kind, flags, count,
                                    prev_charged },
            "gs_wakeup" => Wakeup { waker_pid, waker_tid, target_cpu, flags },
            "gs_syscall" => Syscall { duration, ret, nr, fd, fd_kind },
            "gs_sample" => Sample { ustack, kstack },
            "gs_fault" => Fault { address, error_code },
            "gs_retransmit" => Retransmit { daddr, family, dport, sport },
            "gs_fork" => Fork { parent_pid, parent_tid, flags, comm },
            "gs_exec" => Exec { old_tid, comm, filename },
            "gs_exit" => Exit { exit_code, group_dead, has_io, comm, io },
            "gs_io" => Io { rchar, wchar, syscr, syscw, read_bytes, write_bytes },
            "gs_open" => Open { fd, flags, path },
            "gs_cuda" => Cuda { duration, arg },
            "gs_py_proc" => PyProc { runtime, code_type, interp_head, threads_head, ts_next,
                                     ts_thread_id, ts_frame, cframe_frame, fr_back, fr_code,
                                     fr_owner, fr_is_entry, co_name, co_file, co_firstlineno,
                                     str_state, str_length, str_ascii, str_compact,
                                     owner_cstack, every_frame_entry },
            "gs_pycode" => PyCode { code, firstlineno, name_len, file_len, name_kind,
                                    file_kind, name, file },
        }
    }

    #[test]
    fn header_layout_matches_rust_mirror() {
        let header = include_str!("../../../../ebpf/gapscope.h");
        let mut checked = 0;
        for line in header.lines() {
            let line = line.trim();
            let (args, is_size) = if let Some(rest) = line.strip_prefix("GS_LAYOUT_SIZE(") {
                (rest, true)
            } else if let Some(rest) = line.strip_prefix("GS_LAYOUT(") {
                (rest, false)
            } else {
                continue;
            };
            let args: Vec<&str> = args
                .trim_end_matches(");")
                .split(',')
                .map(str::trim)
                .collect();
            let (ty, field, value) = if is_size {
                (args[0], None, args[1])
            } else {
                (args[0], Some(args[1]), args[2])
            };
            let expected: usize = value.parse().expect("numeric layout value");
            let actual = rust_layout(ty, field)
                .unwrap_or_else(|| panic!("{ty}.{field:?} has no Rust mirror"));
            assert_eq!(
                actual, expected,
                "{ty}.{field:?}: Rust {actual}, C {expected}"
            );
            checked += 1;
        }
        assert!(
            checked > 50,
            "only {checked} layout lines found in gapscope.h"
        );
    }

    #[test]
    fn neighbour_slots_match_the_header() {
        let header = include_str!("../../../../ebpf/gapscope.h");
        for (name, slot) in [
            ("GS_NEIGHBOURS_SAME_GROUP", neighbours::SAME_GROUP),
            ("GS_NEIGHBOURS_ELSEWHERE", neighbours::ELSEWHERE),
        ] {
            assert!(
                header.contains(&format!("{name} = {slot},")),
                "{name} is not {slot} in gapscope.h"
            );
        }
    }

    #[test]
    fn cstr_stops_at_nul() {
        assert_eq!(cstr(b"python3\0garbage"), "python3");
        assert_eq!(cstr(b"no-nul"), "no-nul");
    }

    #[test]
    fn kind_names_cover_every_kind() {
        for k in 1..=11usize {
            assert_ne!(kind::name(k), "other", "kind {k}");
        }
    }
}
