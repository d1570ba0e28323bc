/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The one definition of every record the kernel side hands to userspace.
 *
 * The Rust mirror lives in profiler/src/collect/bpf/abi.rs. Both sides assert
 * the same sizes and offsets (GS_LAYOUT below and `const _` asserts in Rust),
 * and a unit test parses this file's GS_LAYOUT lines and checks them against
 * the Rust structs, so a change on one side that is not made on the other
 * fails the build or the tests instead of silently misreading events.
 *
 * Rules: fixed-width fields only, explicit padding, no bool, variable-length
 * data last with its count in front.
 */
#ifndef GAPSCOPE_H
#define GAPSCOPE_H

#define GS_COMM_LEN 16
#define GS_PATH_LEN 256
#define GS_MAX_STACK_DEPTH 127
/* Words of the tracked-process bitmap: a bit for every tgid below
 * PID_MAX_LIMIT (2^22 on 64-bit). */
#define GS_TRACKED_WORDS 65536

enum gs_event_kind {
	GS_EV_SWITCH = 1,
	GS_EV_WAKEUP = 2,
	GS_EV_SYSCALL = 3,
	GS_EV_SAMPLE = 4,
	GS_EV_FAULT = 5,
	GS_EV_FORK = 6,
	GS_EV_EXEC = 7,
	GS_EV_EXIT = 8,
	GS_EV_STACK = 9,
	GS_EV_OPEN = 10,
	GS_EV_CUDA = 11,
	GS_EV_PYCODE = 12,
	GS_EV_RETRANSMIT = 13,
	/* Not an event: the size of the per-kind drop counter array. */
	GS_EV_KIND_MAX = 16,
};

/* What an fd refers to, decided in the kernel from the inode at syscall entry. */
enum gs_fd_kind {
	GS_FD_NONE = 0,
	GS_FD_FILE = 1,      /* regular file or directory on a real filesystem */
	GS_FD_BLOCK = 2,     /* block device */
	GS_FD_SOCK_INET = 3, /* AF_INET / AF_INET6 socket */
	GS_FD_SOCK_UNIX = 4, /* AF_UNIX socket */
	GS_FD_SOCK_OTHER = 5,
	GS_FD_PIPE = 6,  /* pipe or FIFO */
	GS_FD_ANON = 7,  /* eventfd, epoll, timerfd, signalfd, ... */
	GS_FD_GPU = 8,   /* /dev/nvidia* */
	GS_FD_CHAR = 9,  /* any other character device (tty, /dev/null, ...) */
	GS_FD_PSEUDO = 10, /* procfs, sysfs, cgroupfs, debugfs, tracefs */
	GS_FD_SOCK_ACCEPTED = 11, /* an INET socket the kernel made by accepting a connection */
};

/* Slots of the `neighbours` map: the CPU time the machine's unrecorded
 * tasks ran, by whether they share the recorded job's scheduling group
 * (the task_group of its cgroup or autogroup). The fair class divides a
 * group's CPUs thread by thread and the machine's group by group, so more
 * threads of the job win CPU from neighbours in its own group only. */
enum gs_neighbours {
	GS_NEIGHBOURS_SAME_GROUP = 0,
	GS_NEIGHBOURS_ELSEWHERE = 1,
	GS_NEIGHBOURS_MAX = 2,
};

/* Every record starts with this. */
struct gs_header {
	__u64 ts;   /* CLOCK_MONOTONIC ns (bpf_ktime_get_ns) */
	__u32 pid;  /* tgid of the thread the record is about */
	__u32 tid;
	__u16 kind; /* enum gs_event_kind */
	__u16 cpu;
	__u32 size; /* bytes of the whole record, header included */
};

#define GS_SW_PREV_TRACKED 1
#define GS_SW_NEXT_TRACKED 2
#define GS_SW_PREEMPT 4 /* prev stays runnable: it was preempted, not blocked */
#define GS_SW_CHARGED 8 /* prev_charged holds what the kernel charged prev's run */

/* sched_switch where prev or next (or both) belong to the tracked tree.
 * header.pid/tid = prev when prev is tracked, else next. */
struct gs_switch {
	struct gs_header h;
	__u32 prev_pid;
	__u32 prev_tid;
	__u32 next_pid;
	__u32 next_tid;
	__u64 prev_state; /* TASK_* bits of prev at switch-out */
	__u64 ustack;     /* hash of prev's user stack when it blocked, 0 = none */
	__u64 kstack;     /* hash of prev's kernel stack when it blocked, 0 = none */
	__s32 syscall;    /* syscall prev was in when it switched out, -1 = none */
	__s32 fd;         /* that syscall's fd argument, -1 = none */
	__u8 fd_kind;     /* enum gs_fd_kind of that fd */
	__u8 flags;       /* GS_SW_* */
	__u8 _pad[2];
	__u32 count;      /* bytes a blocked read asked for (--syscalls blocking), 0 = none */
	/* CPU time the kernel charged prev for the run that ends here (valid
	 * with GS_SW_CHARGED). Less than the run's wall time when the CPU was
	 * taken from it: the hypervisor ran another guest (steal), or, with
	 * IRQ time accounting, interrupts were handled on it. */
	__u64 prev_charged;
};

#define GS_WK_NEW 1 /* sched_wakeup_new: first wakeup of a new task */

/* A tracked thread was made runnable. header = the wakee; waker = current. */
struct gs_wakeup {
	struct gs_header h;
	__u32 waker_pid;
	__u32 waker_tid;
	__u32 target_cpu;
	__u8 flags; /* GS_WK_* */
	__u8 _pad[3];
};

/* One completed syscall of a tracked thread. header.ts = entry. */
struct gs_syscall {
	struct gs_header h;
	__u64 duration;
	__s64 ret;
	__s32 nr;
	__s32 fd;
	__u8 fd_kind;
	__u8 _pad[7];
};

/* perf_event cpu-clock sample of a tracked thread. */
struct gs_sample {
	struct gs_header h;
	__u64 ustack;
	__u64 kstack;
};

/* exceptions:page_fault_user of a tracked thread. */
struct gs_fault {
	struct gs_header h;
	__u64 address;
	__u64 error_code;
};

/* tcp:tcp_retransmit_skb on a TCP socket a tracked thread was seen using
 * (blocked on it, or connecting it). header = that thread. */
struct gs_retransmit {
	struct gs_header h;
	__u8 daddr[16]; /* the peer's address: AF_INET's in the first 4 bytes */
	__u16 family;   /* AF_INET or AF_INET6 */
	__u16 dport;    /* the peer's port, host order */
	__u16 sport;    /* the local port, host order */
	__u16 _pad;
};

#define GS_FORK_THREAD 1 /* the child is a new thread, not a new process */

/* sched_process_fork with a tracked parent. header = the child. */
struct gs_fork {
	struct gs_header h;
	__u32 parent_pid;
	__u32 parent_tid;
	__u32 flags; /* GS_FORK_* */
	__u32 _pad;
	char comm[GS_COMM_LEN];
};

/* sched_process_exec of a tracked process. */
struct gs_exec {
	struct gs_header h;
	__u32 old_tid;
	__u32 _pad;
	char comm[GS_COMM_LEN];
	char filename[GS_PATH_LEN];
};

/* The kernel's I/O accounting of one thread (struct task_io_accounting). */
struct gs_io {
	__u64 rchar;       /* bytes returned by read-family calls, any fd */
	__u64 wchar;       /* bytes passed to write-family calls, any fd */
	__u64 syscr;       /* read-family calls */
	__u64 syscw;       /* write-family calls */
	__u64 read_bytes;  /* bytes this thread caused to be fetched from storage */
	__u64 write_bytes; /* bytes this thread caused to be sent to storage */
};

/* sched_process_exit of a tracked thread. */
struct gs_exit {
	struct gs_header h;
	__s32 exit_code;  /* wait(2)-style status of the thread */
	__u8 group_dead;  /* last thread of its process */
	__u8 has_io;      /* io is filled: the kernel keeps I/O accounting */
	__u8 _pad[2];
	char comm[GS_COMM_LEN];
	struct gs_io io;  /* its I/O accounting as it exits */
};

/* path holds the names of the file's dentries, leaf first, each ending in
 * NUL, read as the thread blocked on it (no per-syscall hooks); a second
 * NUL in a row ends the list. GS_OPEN_ROOTED: the walk reached the root. */
#define GS_OPEN_DENTRIES 1
#define GS_OPEN_ROOTED 2

/* A successful open/openat/openat2/creat of a tracked thread, or (flags
 * GS_OPEN_DENTRIES) the first time it blocked on a file. */
struct gs_open {
	struct gs_header h;
	__s32 fd;
	__s32 flags;      /* GS_OPEN_* */
	char path[GS_PATH_LEN];
};

/* A stack seen for the first time (per LRU window). header.pid = owning
 * process for user stacks, 0 for kernel stacks. Only the first nr_frames
 * entries of frames are sent: the record is truncated to fit them. */
struct gs_stack {
	struct gs_header h;
	__u64 hash;
	__u32 nr_frames;
	__u8 kernel;
	__u8 _pad[3];
	__u64 frames[GS_MAX_STACK_DEPTH];
};

/*
 * CPython frames in user stacks. A process userspace found to be a CPython
 * gets a gs_py_proc (collect/python.rs); its stacks then carry, after the
 * native frames, its Python frames, innermost first, each the address of
 * its code object tagged GS_PY_FRAME, and GS_PY_ENTRY on the outermost
 * frame of each call of the eval loop (where userspace puts them among the
 * native frames); GS_PY_FRAME alone, outermost, when more frames were left
 * than were walked. A code object is described once per process (gs_pycode),
 * again if its address comes to hold another one.
 */
#define GS_PY_FRAME (1ULL << 63)
#define GS_PY_ENTRY (1ULL << 62)
#define GS_PY_ADDR_MASK ((1ULL << 56) - 1)
#define GS_PY_MAX_FRAMES 64
/* Native frames kept in a stack that has Python frames too: room is left
 * for GS_PY_MAX_FRAMES of them and the mark of a walk cut short (a Python
 * frame with no code object, GS_PY_FRAME alone). */
#define GS_PY_NATIVE_FRAMES 62
/* Thread states looked through for the current thread's. */
#define GS_PY_MAX_THREADS 64
#define GS_PY_NAME_LEN 128
#define GS_PY_FILE_LEN 256
/* An offset a version has no field for. */
#define GS_PY_NONE 0xffff

/* Where to find things in one CPython process (byte offsets into its
 * structs, the version's or its _Py_DebugOffsets'). */
struct gs_py_proc {
	__u64 runtime;            /* address of _PyRuntime */
	__u64 code_type;          /* address of PyCode_Type */
	__u16 interp_head;        /* _PyRuntime: interpreters.head */
	__u16 threads_head;       /* PyInterpreterState: its first thread state */
	__u16 ts_next;            /* PyThreadState: next */
	__u16 ts_thread_id;       /* PyThreadState: thread_id (pthread_self, the FS base) */
	__u16 ts_frame;           /* PyThreadState: frame, current_frame, or cframe */
	__u16 cframe_frame;       /* CFrame: current_frame (3.11, 3.12), else NONE */
	__u16 fr_back;            /* frame: f_back or previous */
	__u16 fr_code;            /* frame: f_code or f_executable (bit 0 a tag in 3.14) */
	__u16 fr_owner;           /* _PyInterpreterFrame: owner (3.11+), else NONE */
	__u16 fr_is_entry;        /* _PyInterpreterFrame: is_entry (3.11), else NONE */
	__u16 co_name;            /* PyCodeObject: co_qualname (3.11+) or co_name */
	__u16 co_file;            /* PyCodeObject: co_filename */
	__u16 co_firstlineno;     /* PyCodeObject: co_firstlineno (int) */
	__u16 str_state;          /* PyASCIIObject: state */
	__u16 str_length;         /* PyASCIIObject: length */
	__u16 str_ascii;          /* sizeof(PyASCIIObject): a compact ASCII string's bytes */
	__u16 str_compact;        /* sizeof(PyCompactUnicodeObject): other compact strings' */
	__u8 owner_cstack;        /* owner of a C-stack shim frame (3.12+), 0xff none */
	__u8 every_frame_entry;   /* 3.9, 3.10: every frame is its own call of the eval loop */
	__u8 _pad[4];
};

/* A code object seen for the first time in a process. The strings are the
 * first bytes of CPython's own (kind: bytes per character, 1, 2 or 4; 0:
 * not a string the unwinder can read). */
struct gs_pycode {
	struct gs_header h;
	__u64 code;
	__s32 firstlineno;
	__u16 name_len;
	__u16 file_len;
	__u8 name_kind;
	__u8 file_kind;
	__u8 _pad[6];
	char name[GS_PY_NAME_LEN];
	char file[GS_PY_FILE_LEN];
};

/* Uprobe cookie of a libcuda function: which function, and which argument
 * to capture (a stream handle or a byte count). */
#define GS_CUDA_FN(cookie) ((__u32)((cookie) & 0xffff))
#define GS_CUDA_ARG(cookie) ((__u32)(((cookie) >> 16) & 0xff))
#define GS_CUDA_NO_ARG 0xff

/* One outermost call into a libcuda function (uprobe fallback). */
struct gs_cuda {
	struct gs_header h; /* ts = entry */
	__u64 duration;
	__u64 arg;  /* the captured argument, 0 if none */
	__u32 fn;   /* index into the profiler's function table */
	__u32 _pad;
};

/*
 * Layout facts, checked by the compiler here and by the Rust test that
 * parses these lines (profiler/src/collect/bpf/abi.rs).
 */
#define GS_LAYOUT_SIZE(type, size) _Static_assert(sizeof(struct type) == size, #type " size")
#define GS_LAYOUT(type, field, off) \
	_Static_assert(__builtin_offsetof(struct type, field) == off, #type "." #field " offset")

GS_LAYOUT_SIZE(gs_header, 24);
GS_LAYOUT(gs_header, ts, 0);
GS_LAYOUT(gs_header, pid, 8);
GS_LAYOUT(gs_header, tid, 12);
GS_LAYOUT(gs_header, kind, 16);
GS_LAYOUT(gs_header, cpu, 18);
GS_LAYOUT(gs_header, size, 20);

GS_LAYOUT_SIZE(gs_switch, 88);
GS_LAYOUT(gs_switch, prev_pid, 24);
GS_LAYOUT(gs_switch, prev_tid, 28);
GS_LAYOUT(gs_switch, next_pid, 32);
GS_LAYOUT(gs_switch, next_tid, 36);
GS_LAYOUT(gs_switch, prev_state, 40);
GS_LAYOUT(gs_switch, ustack, 48);
GS_LAYOUT(gs_switch, kstack, 56);
GS_LAYOUT(gs_switch, syscall, 64);
GS_LAYOUT(gs_switch, fd, 68);
GS_LAYOUT(gs_switch, fd_kind, 72);
GS_LAYOUT(gs_switch, flags, 73);
GS_LAYOUT(gs_switch, count, 76);
GS_LAYOUT(gs_switch, prev_charged, 80);

GS_LAYOUT_SIZE(gs_wakeup, 40);
GS_LAYOUT(gs_wakeup, waker_pid, 24);
GS_LAYOUT(gs_wakeup, waker_tid, 28);
GS_LAYOUT(gs_wakeup, target_cpu, 32);
GS_LAYOUT(gs_wakeup, flags, 36);

GS_LAYOUT_SIZE(gs_syscall, 56);
GS_LAYOUT(gs_syscall, duration, 24);
GS_LAYOUT(gs_syscall, ret, 32);
GS_LAYOUT(gs_syscall, nr, 40);
GS_LAYOUT(gs_syscall, fd, 44);
GS_LAYOUT(gs_syscall, fd_kind, 48);

GS_LAYOUT_SIZE(gs_sample, 40);
GS_LAYOUT(gs_sample, ustack, 24);
GS_LAYOUT(gs_sample, kstack, 32);

GS_LAYOUT_SIZE(gs_fault, 40);
GS_LAYOUT(gs_fault, address, 24);
GS_LAYOUT(gs_fault, error_code, 32);

GS_LAYOUT_SIZE(gs_retransmit, 48);
GS_LAYOUT(gs_retransmit, daddr, 24);
GS_LAYOUT(gs_retransmit, family, 40);
GS_LAYOUT(gs_retransmit, dport, 42);
GS_LAYOUT(gs_retransmit, sport, 44);

GS_LAYOUT_SIZE(gs_fork, 56);
GS_LAYOUT(gs_fork, parent_pid, 24);
GS_LAYOUT(gs_fork, parent_tid, 28);
GS_LAYOUT(gs_fork, flags, 32);
GS_LAYOUT(gs_fork, comm, 40);

GS_LAYOUT_SIZE(gs_exec, 304);
GS_LAYOUT(gs_exec, old_tid, 24);
GS_LAYOUT(gs_exec, comm, 32);
GS_LAYOUT(gs_exec, filename, 48);

GS_LAYOUT_SIZE(gs_io, 48);
GS_LAYOUT(gs_io, rchar, 0);
GS_LAYOUT(gs_io, wchar, 8);
GS_LAYOUT(gs_io, syscr, 16);
GS_LAYOUT(gs_io, syscw, 24);
GS_LAYOUT(gs_io, read_bytes, 32);
GS_LAYOUT(gs_io, write_bytes, 40);

GS_LAYOUT_SIZE(gs_exit, 96);
GS_LAYOUT(gs_exit, exit_code, 24);
GS_LAYOUT(gs_exit, group_dead, 28);
GS_LAYOUT(gs_exit, has_io, 29);
GS_LAYOUT(gs_exit, comm, 32);
GS_LAYOUT(gs_exit, io, 48);

GS_LAYOUT_SIZE(gs_open, 288);
GS_LAYOUT(gs_open, fd, 24);
GS_LAYOUT(gs_open, flags, 28);
GS_LAYOUT(gs_open, path, 32);

GS_LAYOUT_SIZE(gs_cuda, 48);
GS_LAYOUT(gs_cuda, duration, 24);
GS_LAYOUT(gs_cuda, arg, 32);
GS_LAYOUT(gs_cuda, fn, 40);

GS_LAYOUT_SIZE(gs_stack, 1056);
GS_LAYOUT(gs_stack, hash, 24);
GS_LAYOUT(gs_stack, nr_frames, 32);
GS_LAYOUT(gs_stack, kernel, 36);
GS_LAYOUT(gs_stack, frames, 40);

GS_LAYOUT_SIZE(gs_py_proc, 56);
GS_LAYOUT(gs_py_proc, runtime, 0);
GS_LAYOUT(gs_py_proc, code_type, 8);
GS_LAYOUT(gs_py_proc, interp_head, 16);
GS_LAYOUT(gs_py_proc, threads_head, 18);
GS_LAYOUT(gs_py_proc, ts_next, 20);
GS_LAYOUT(gs_py_proc, ts_thread_id, 22);
GS_LAYOUT(gs_py_proc, ts_frame, 24);
GS_LAYOUT(gs_py_proc, cframe_frame, 26);
GS_LAYOUT(gs_py_proc, fr_back, 28);
GS_LAYOUT(gs_py_proc, fr_code, 30);
GS_LAYOUT(gs_py_proc, fr_owner, 32);
GS_LAYOUT(gs_py_proc, fr_is_entry, 34);
GS_LAYOUT(gs_py_proc, co_name, 36);
GS_LAYOUT(gs_py_proc, co_file, 38);
GS_LAYOUT(gs_py_proc, co_firstlineno, 40);
GS_LAYOUT(gs_py_proc, str_state, 42);
GS_LAYOUT(gs_py_proc, str_length, 44);
GS_LAYOUT(gs_py_proc, str_ascii, 46);
GS_LAYOUT(gs_py_proc, str_compact, 48);
GS_LAYOUT(gs_py_proc, owner_cstack, 50);
GS_LAYOUT(gs_py_proc, every_frame_entry, 51);

GS_LAYOUT_SIZE(gs_pycode, 432);
GS_LAYOUT(gs_pycode, code, 24);
GS_LAYOUT(gs_pycode, firstlineno, 32);
GS_LAYOUT(gs_pycode, name_len, 36);
GS_LAYOUT(gs_pycode, file_len, 38);
GS_LAYOUT(gs_pycode, name_kind, 40);
GS_LAYOUT(gs_pycode, file_kind, 41);
GS_LAYOUT(gs_pycode, name, 48);
GS_LAYOUT(gs_pycode, file, 176);

#endif /* GAPSCOPE_H */
