//! Kernel records (abi) to session records. The only place that knows both.

use super::abi::{self, kind};
use crate::session::{Event, FdKind, IoCounters, Peer, Record, Stack, SwitchOut, ThreadIo};

/// A code object the kernel side described (`GS_EV_PYCODE`): its process,
/// its address, and what it is. None for another kind of record, or one
/// too short.
/// A code object of a CPython process, as its record describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyCode {
    pub name: String,
    pub file: String,
    pub firstlineno: i32,
}

pub fn decode_pycode(bytes: &[u8]) -> Option<(u32, u64, PyCode)> {
    let c: abi::PyCode = abi::read(bytes)?;
    if c.h.kind != kind::PYCODE {
        return None;
    }
    let text = |b: &[u8], len: u16, kind: u8| -> String {
        let b = &b[..usize::from(len).min(b.len())];
        match kind {
            1 => b.iter().map(|&c| char::from(c)).collect(),
            2 => char::decode_utf16(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
            4 => b
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
            _ => "?".into(),
        }
    };
    Some((
        c.h.pid,
        c.code,
        PyCode {
            name: text(&c.name, c.name_len, c.name_kind),
            file: text(&c.file, c.file_len, c.file_kind),
            firstlineno: c.firstlineno,
        },
    ))
}

/// Decodes one ring-buffer record into one session record and, for some
/// kinds, a second that the kernel sent in the same record. None when it is
/// too short or of an unknown kind (counted by the caller as malformed,
/// never trusted).
pub fn decode(bytes: &[u8]) -> Option<(Record, Option<Record>)> {
    let h: abi::Header = abi::read(bytes)?;
    let mut extra = None;
    let event = match h.kind {
        kind::SWITCH => {
            let e: abi::Switch = abi::read(bytes)?;
            let out = (e.flags & abi::SW_PREV_TRACKED != 0).then(|| SwitchOut {
                pid: e.prev_pid,
                tid: e.prev_tid,
                state: e.prev_state,
                preempted: e.flags & abi::SW_PREEMPT != 0,
                ustack: e.ustack,
                kstack: e.kstack,
                syscall: (e.syscall >= 0).then_some(e.syscall),
                fd: e.fd,
                fd_kind: FdKind::from_raw(e.fd_kind),
                next: (e.next_pid, e.next_tid),
            });
            let in_ = (e.flags & abi::SW_NEXT_TRACKED != 0).then_some((e.next_pid, e.next_tid));
            if let (Some(out), true) = (&out, e.count > 0) {
                extra = Some(Record::Event(Event::BlockedRead {
                    ts: h.ts,
                    pid: out.pid,
                    tid: out.tid,
                    nr: e.syscall,
                    fd: e.fd,
                    fd_kind: out.fd_kind,
                    size: e.count.into(),
                }));
            }
            if out.is_some() && e.flags & abi::SW_CHARGED != 0 {
                Event::ChargedSwitch {
                    ts: h.ts,
                    cpu: h.cpu,
                    out,
                    in_,
                    charged: e.prev_charged,
                }
            } else {
                Event::Switch {
                    ts: h.ts,
                    cpu: h.cpu,
                    out,
                    in_,
                }
            }
        }
        kind::WAKEUP => {
            let e: abi::Wakeup = abi::read(bytes)?;
            Event::Wakeup {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                waker_pid: e.waker_pid,
                waker_tid: e.waker_tid,
                new_task: e.flags & abi::WK_NEW != 0,
            }
        }
        kind::SYSCALL => {
            let e: abi::Syscall = abi::read(bytes)?;
            Event::Syscall {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                dur: e.duration,
                nr: e.nr,
                fd: e.fd,
                fd_kind: FdKind::from_raw(e.fd_kind),
                ret: e.ret,
            }
        }
        kind::SAMPLE => {
            let e: abi::Sample = abi::read(bytes)?;
            Event::Sample {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                cpu: h.cpu,
                ustack: e.ustack,
                kstack: e.kstack,
            }
        }
        kind::FAULT => {
            let e: abi::Fault = abi::read(bytes)?;
            Event::Fault {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                address: e.address,
                error_code: e.error_code,
            }
        }
        kind::RETRANSMIT => {
            let e: abi::Retransmit = abi::read(bytes)?;
            Event::Retransmit {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                peer: Peer {
                    addr: e.daddr,
                    v6: e.family == 10,
                    port: e.dport,
                },
                local_port: e.sport,
            }
        }
        kind::FORK => {
            let e: abi::Fork = abi::read(bytes)?;
            Event::Fork {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                parent_pid: e.parent_pid,
                parent_tid: e.parent_tid,
                thread: e.flags & abi::FORK_THREAD != 0,
                comm: abi::cstr(&e.comm),
            }
        }
        kind::EXEC => {
            let e: abi::Exec = abi::read(bytes)?;
            Event::Exec {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                old_tid: e.old_tid,
                comm: abi::cstr(&e.comm),
                filename: abi::cstr(&e.filename),
            }
        }
        kind::EXIT => {
            let e: abi::Exit = abi::read(bytes)?;
            if e.has_io != 0 {
                extra = Some(Record::ThreadIo(ThreadIo {
                    pid: h.pid,
                    tid: h.tid,
                    ts: h.ts,
                    start: false,
                    io: IoCounters {
                        rchar: e.io.rchar,
                        wchar: e.io.wchar,
                        syscr: e.io.syscr,
                        syscw: e.io.syscw,
                        read_bytes: e.io.read_bytes,
                        write_bytes: e.io.write_bytes,
                    },
                }));
            }
            Event::Exit {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                status: e.exit_code,
                group_dead: e.group_dead != 0,
                comm: abi::cstr(&e.comm),
            }
        }
        kind::OPEN => {
            let e: abi::Open = abi::read(bytes)?;
            Event::Open {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                fd: e.fd,
                path: if e.flags & abi::OPEN_DENTRIES != 0 {
                    dentry_path(&e.path, e.flags & abi::OPEN_ROOTED != 0)
                } else {
                    abi::cstr(&e.path)
                },
            }
        }
        kind::CUDA => {
            let e: abi::Cuda = abi::read(bytes)?;
            let function = super::cuda::FUNCTIONS.get(e.fn_ as usize)?;
            Event::CudaCall {
                ts: h.ts,
                pid: h.pid,
                tid: h.tid,
                dur: e.duration,
                function: function.symbol.to_string(),
                arg: e.arg,
            }
        }
        kind::STACK => {
            let e: abi::StackHead = abi::read(bytes)?;
            let n = (e.nr_frames as usize).min(abi::MAX_STACK_DEPTH);
            let frames = bytes.get(abi::STACK_FRAMES_OFFSET..abi::STACK_FRAMES_OFFSET + 8 * n)?;
            let addrs = frames
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            return Some((
                Record::Stack(Stack {
                    hash: e.hash,
                    pid: h.pid,
                    kernel: e.kernel != 0,
                    addrs,
                }),
                None,
            ));
        }
        _ => return None,
    };
    Some((Record::Event(event), extra))
}

/// A path from the dentry names the kernel walked, leaf first, each ending
/// in NUL, the list ending in an empty name. A walk that stopped short of
/// the root keeps what it saw, marked as partial.
fn dentry_path(bytes: &[u8], rooted: bool) -> String {
    let names: Vec<String> = bytes
        .split(|&b| b == 0)
        .take_while(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    let mut path = if rooted {
        String::new()
    } else {
        "…".to_string()
    };
    for name in names.iter().rev() {
        path.push('/');
        path.push_str(name);
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A code object's strings, as wide as CPython stored them.
    #[test]
    fn a_code_object_is_described_in_any_width() {
        let mut c: abi::PyCode = bytemuck::Zeroable::zeroed();
        c.h.kind = kind::PYCODE;
        c.h.pid = 7;
        c.code = 0x7f00_0000_1000;
        c.firstlineno = 12;
        c.name[..5].copy_from_slice(b"outer");
        (c.name_len, c.name_kind) = (5, 1);
        // "é.py" in 2-byte characters.
        for (i, ch) in "é.py".encode_utf16().enumerate() {
            c.file[2 * i..2 * i + 2].copy_from_slice(&ch.to_le_bytes());
        }
        (c.file_len, c.file_kind) = (8, 2);
        let (pid, code, d) = decode_pycode(bytemuck::bytes_of(&c)).unwrap();
        assert_eq!((pid, code, d.firstlineno), (7, 0x7f00_0000_1000, 12));
        assert_eq!((d.name.as_str(), d.file.as_str()), ("outer", "é.py"));
        c.name_kind = 0;
        assert_eq!(decode_pycode(bytemuck::bytes_of(&c)).unwrap().2.name, "?");
        c.h.kind = kind::STACK;
        assert!(decode_pycode(bytemuck::bytes_of(&c)).is_none());
    }
    use bytemuck::Zeroable;

    fn header(kind: u16, size: usize) -> abi::Header {
        abi::Header {
            ts: 1_000,
            pid: 10,
            tid: 11,
            kind,
            cpu: 1,
            size: size as u32,
        }
    }

    #[test]
    fn switch_with_blocked_prev() {
        let mut e = abi::Switch::zeroed();
        e.h = header(kind::SWITCH, std::mem::size_of::<abi::Switch>());
        e.prev_pid = 10;
        e.prev_tid = 11;
        e.prev_state = 1;
        e.syscall = 0;
        e.fd = 3;
        e.fd_kind = 1;
        e.ustack = 77;
        e.flags = abi::SW_PREV_TRACKED;
        let Some((Record::Event(Event::Switch { out, in_, ts, .. }), None)) =
            decode(bytemuck::bytes_of(&e))
        else {
            panic!("not a switch");
        };
        assert_eq!(ts, 1_000);
        assert_eq!(in_, None);
        let out = out.unwrap();
        assert_eq!(
            (out.pid, out.tid, out.syscall, out.fd),
            (10, 11, Some(0), 3)
        );
        assert_eq!(out.fd_kind, FdKind::File);
        assert!(!out.preempted);
        assert_eq!(out.ustack, 77);
    }

    #[test]
    fn a_switch_says_what_the_kernel_charged_when_it_knows() {
        let mut e = abi::Switch::zeroed();
        e.h = header(kind::SWITCH, std::mem::size_of::<abi::Switch>());
        (e.prev_pid, e.prev_tid, e.prev_charged) = (10, 11, 12_345);
        e.flags = abi::SW_PREV_TRACKED | abi::SW_PREEMPT | abi::SW_CHARGED;
        let Some((Record::Event(Event::ChargedSwitch { out, charged, .. }), None)) =
            decode(bytemuck::bytes_of(&e))
        else {
            panic!("not a charged switch");
        };
        assert_eq!((out.unwrap().tid, charged), (11, 12_345));
        // Without the flag (another scheduling class) it is not known.
        e.flags &= !abi::SW_CHARGED;
        assert!(matches!(
            decode(bytemuck::bytes_of(&e)),
            Some((Record::Event(Event::Switch { .. }), None))
        ));
    }

    #[test]
    fn a_blocked_read_carries_its_request() {
        let mut e = abi::Switch::zeroed();
        e.h = header(kind::SWITCH, std::mem::size_of::<abi::Switch>());
        (e.prev_pid, e.prev_tid, e.prev_state) = (10, 11, 1);
        (e.syscall, e.fd, e.fd_kind, e.count) = (17, 5, 1, 65536);
        e.flags = abi::SW_PREV_TRACKED;
        let Some((Record::Event(Event::Switch { .. }), Some(Record::Event(read)))) =
            decode(bytemuck::bytes_of(&e))
        else {
            panic!("no blocked read");
        };
        assert_eq!(
            read,
            Event::BlockedRead {
                ts: 1_000,
                pid: 10,
                tid: 11,
                nr: 17,
                fd: 5,
                fd_kind: FdKind::File,
                size: 65536
            }
        );
    }

    #[test]
    fn an_exit_carries_the_threads_io_accounting() {
        let mut e = abi::Exit::zeroed();
        e.h = header(kind::EXIT, std::mem::size_of::<abi::Exit>());
        e.io.rchar = 4096;
        e.io.syscw = 3;
        let Some((Record::Event(Event::Exit { .. }), None)) = decode(bytemuck::bytes_of(&e)) else {
            panic!("not an exit without accounting");
        };
        e.has_io = 1;
        let Some((_, Some(Record::ThreadIo(io)))) = decode(bytemuck::bytes_of(&e)) else {
            panic!("no accounting");
        };
        assert_eq!((io.pid, io.tid, io.start), (10, 11, false));
        assert_eq!((io.io.rchar, io.io.syscw), (4096, 3));
    }

    #[test]
    fn dentry_names_make_a_path() {
        let mut raw = [0u8; abi::PATH_LEN];
        let names = b"x.jpg\0train\0data\0\0junk";
        raw[..names.len()].copy_from_slice(names);
        assert_eq!(dentry_path(&raw, true), "/data/train/x.jpg");
        assert_eq!(dentry_path(&raw, false), "…/data/train/x.jpg");
        assert_eq!(dentry_path(&[0u8; 4], true), "/");
    }

    #[test]
    fn short_and_unknown_records_are_rejected() {
        let e = abi::Switch::zeroed();
        let mut bytes = bytemuck::bytes_of(&e).to_vec();
        bytes[16] = kind::SWITCH as u8;
        assert!(decode(&bytes[..40]).is_none());
        bytes[16] = 200;
        assert!(decode(&bytes).is_none());
        assert!(decode(&[]).is_none());
    }

    #[test]
    fn stack_reads_only_sent_frames() {
        let mut bytes = vec![0u8; abi::STACK_FRAMES_OFFSET + 16];
        let mut head = abi::StackHead::zeroed();
        head.h = header(kind::STACK, bytes.len());
        head.hash = 5;
        head.nr_frames = 2;
        bytes[..abi::STACK_FRAMES_OFFSET].copy_from_slice(bytemuck::bytes_of(&head));
        bytes[40..48].copy_from_slice(&0x1234u64.to_le_bytes());
        bytes[48..56].copy_from_slice(&0x5678u64.to_le_bytes());
        let Some((Record::Stack(s), None)) = decode(&bytes) else {
            panic!("not a stack")
        };
        assert_eq!(s.addrs, vec![0x1234, 0x5678]);
        // A frame count larger than what was sent is refused, not over-read.
        head.nr_frames = 3;
        bytes[..abi::STACK_FRAMES_OFFSET].copy_from_slice(bytemuck::bytes_of(&head));
        assert!(decode(&bytes).is_none());
    }
}
