// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * gapscope's kernel side: follows one process tree and reports, for each of
 * its threads, when it ran, waited to run, and blocked (and on what), plus its
 * syscalls, page faults and cpu-clock samples with stacks.
 *
 * Only tracepoints, raw tracepoints and perf_event are used: kprobes and
 * fentry/fexit are not available on every kernel this must run on.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "gapscope.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Load-time configuration, set by the loader. */
/* Wake the reader only once this many bytes wait in the ring buffer: the
 * reader also polls on a short timer, so small batches are never stuck. */
const volatile __u64 gs_wakeup_bytes = 256 * 1024;
/* Capture user and kernel stacks when a tracked thread blocks. */
const volatile __u8 gs_offcpu_stacks = 1;
/* Whether sys_enter/sys_exit are attached: without them a thread's
 * switch-out reads what it blocked in from its registers. */
const volatile __u8 gs_syscall_hooks = 1;

/* Tracked processes: one bit per possible tgid (PID_MAX_LIMIT, 2^22, in
 * 512 KiB), seeded by userspace with the target, grown on fork, shrunk when
 * a process's last thread exits. Asked at every switch and wakeup on the
 * machine, recorded or not: an array lookup is a load the JIT inlines,
 * where a hash of pids cost ~37 ns a question. Mappable, so that userspace
 * sets its bits with the same atomic OR the kernel side uses (a word
 * written whole would lose a bit set beside it by a fork). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GS_TRACKED_WORDS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} tracked SEC(".maps");

/* The syscall each tracked thread is in, if any. */
struct inflight {
	__u64 ts;
	__u64 path; /* user pointer to the path of an open-family call */
	__s32 nr;   /* -1: not in a syscall */
	__s32 fd;
	__u8 fd_kind;
	/* Passed sched_process_exit as a tracked thread: its final switch-out
	 * is reported even after its process left `tracked`. */
	__u8 exiting;
	__u8 _pad[6];
	/* se.prev_sum_exec_runtime at the exit: the final switch-out's charge
	 * is the exiting run's only while it is unchanged (an unreported
	 * preemption in between starts another run). */
	__u64 exit_run_base;
	/* The last file classified and its kind: threads call on the same
	 * files over and over. Keyed by file and inode together, so a struct
	 * file freed and reused for another file is not taken for the old. */
	__u64 last_file;
	__u64 last_inode;
	__u8 last_kind;
	/* The file whose path was last sent (--syscalls blocking), keyed the
	 * same way. */
	__u64 named_file;
	__u64 named_inode;
	/* The kernel stack of its last blocking wait (see gs_wait_kstack): the
	 * wait it was walked for, and when. */
	__u64 wait_kstack;
	__u64 wait_kstack_at;
	__u64 wait_state;
	/* Its syscall's number and fd (see gs_wait_kstack). */
	__u64 wait_call;
	__u8 wait_kind;
	/* The user stack of its last blocking wait, the fingerprint of the
	 * code it was walked in, and when (see gs_wait_ustack). */
	__u64 wait_ustack;
	__u64 wait_ukey;
	__u64 wait_ustack_at;
};

/* Task-local: no hashing on the syscall path, freed with the task. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* TCP sockets the kernel made by accepting a connection (passive opens,
 * seen going from SYN_RECV to ESTABLISHED), by their struct sock: a thread
 * blocked reading one waits on a client, not on a source it chose. Let go
 * when the socket closes (its address is reused); LRU for those never seen
 * closing. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} accepted SEC(".maps");

/* TCP sockets a tracked thread was seen using — blocked on one, or
 * connecting it — and that thread, by their struct sock: a retransmission
 * happens in no process's context, and is the job's when its socket is. */
struct sock_owner {
	__u32 pid;
	__u32 tid;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct sock_owner);
} sock_owners SEC(".maps");

/* The current (tracked) thread uses socket `sk`. */
static __always_inline void note_sock_owner(__u64 sk)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct sock_owner o = { .pid = id >> 32, .tid = (__u32)id };
	struct sock_owner *was = bpf_map_lookup_elem(&sock_owners, &sk);
	if (!was || was->pid != o.pid || was->tid != o.tid)
		bpf_map_update_elem(&sock_owners, &sk, &o, BPF_ANY);
}

/* Stack hashes already sent to userspace. LRU: an evicted stack is simply
 * sent again, userspace deduplicates by hash. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} known_stacks SEC(".maps");

/* Per-CPU scratch for stack capture. Slot 0 serves sched_switch (task
 * context), slot 1 the perf_event sampler, which can interrupt it. */
#define SCRATCH_SWITCH 0
#define SCRATCH_SAMPLE 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct gs_stack);
} scratch SEC(".maps");

/* CPython processes of the tree (tgid -> where things are), set by
 * userspace when it finds one; a forked child inherits its parent's. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct gs_py_proc);
} py_procs SEC(".maps");

/* The thread state last found for a thread (tid -> its address), checked
 * at each use: thread states are freed and made again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} py_threads SEC(".maps");

/* Code objects described to userspace, per process, with the name object
 * they had: a code object freed and another made at its address has
 * another name object, and is described again. */
struct py_code_key {
	__u32 pid;
	__u32 _pad;
	__u64 code;
};
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct py_code_key);
	__type(value, __u64);
} py_codes SEC(".maps");

/* Per-CPU scratch for a code object's description (slots as `scratch`). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct gs_pycode);
} py_scratch SEC(".maps");

/* Records lost because the ring buffer was full, per enum gs_event_kind. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GS_EV_KIND_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

/* enum gs_neighbours -> ns, per CPU: what unrecorded tasks of the fair
 * class ran, charged as the kernel charged it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GS_NEIGHBOURS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} neighbours SEC(".maps");

/* How far the sampling program has charged the run on this CPU (the
 * task, and the run's prev_sum_exec_runtime and sum_exec_runtime then):
 * a task alone on a CPU runs for seconds without switching out, and its
 * time would reach its slot only then — a reading of the counters between
 * would miss it (a busy loop with a CPU to itself read as 0.75 of one). */
struct neighbour_mark {
	__u64 task;
	__u64 from;
	__u64 sum;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct neighbour_mark);
} neighbour_marks SEC(".maps");

/* The recorded job's scheduling group: the task_group the last tracked
 * task switched out of (a job's processes share one as a rule). */
__u64 gs_job_group = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 32 * 1024 * 1024); /* resized by the loader */
} events SEC(".maps");

/* Raw tracepoint arguments. Read through a plain u64 array, not
 * ctx->args[i]: bpf_raw_tracepoint_args declares a flexible array, and
 * indexing it emits a CO-RE relocation that not every loader accepts. */
#define TP_ARG(ctx, i) (((const __u64 *)(ctx))[i])
/* include/linux/sched.h: the state a task switches out in for good. */
#define TASK_DEAD 0x00000080

static __always_inline void count_drop(__u32 kind)
{
	__u64 *n = bpf_map_lookup_elem(&drops, &kind);
	if (n)
		*n += 1;
}

/* The fair class starts prev_sum_exec_runtime afresh each time it puts a
 * task on a CPU and has charged prev up to now before sched_switch fires
 * (dequeue or put_prev), so the difference is what this run cost in the
 * kernel's own accounting. Other classes (RT, deadline, ext) leave
 * prev_sum_exec_runtime stale: not known. */
static __always_inline int fair_charge(__u64 *charged, __u64 *from)
{
	/* Of the current task (prev, in sched_switch), through the pointer
	 * the verifier trusts: plain loads, not a helper call per field —
	 * this runs at every switch of every task on the machine. Fetched
	 * here, not passed: a trusted pointer alive across the whole switch
	 * program multiplies the states the verifier walks. */
	struct task_struct *p = bpf_get_current_task_btf();
	__u32 policy = p->policy;
	if (policy != 0 /* NORMAL */ && policy != 3 /* BATCH */ && policy != 5 /* IDLE */)
		return 0;
	__u64 sum = p->se.sum_exec_runtime;
	*from = p->se.prev_sum_exec_runtime;
	if (sum < *from)
		return 0;
	*charged = sum - *from;
	return 1;
}

static __always_inline __u64 current_task_group(void)
{
	/* The current task, as above. */
	struct task_struct *p = bpf_get_current_task_btf();
	if (!bpf_core_field_exists(p->sched_task_group))
		return 0;
	return (__u64)p->sched_task_group;
}

/* The current task's run, unrecorded, to its neighbours slot: as much of
 * it as the sampling program has not charged yet. `running`: the run goes
 * on (a sample), and the mark keeps how far it was charged; else it ends
 * here (the switch-out). */
static __always_inline void count_neighbour(int running)
{
	__u64 charged, from;
	if (!fair_charge(&charged, &from))
		return;
	__u32 zero = 0;
	struct neighbour_mark *m = bpf_map_lookup_elem(&neighbour_marks, &zero);
	if (!m)
		return;
	__u64 task = (__u64)bpf_get_current_task_btf();
	__u64 sum = from + charged;
	if (m->task == task && m->from == from) {
		if (m->sum >= sum)
			return;
		charged = sum - m->sum;
	}
	m->task = running ? task : 0;
	m->from = from;
	m->sum = sum;
	__u64 group = current_task_group();
	__u32 slot = group && group == gs_job_group ? GS_NEIGHBOURS_SAME_GROUP
						      : GS_NEIGHBOURS_ELSEWHERE;
	__u64 *n = bpf_map_lookup_elem(&neighbours, &slot);
	if (n)
		*n += charged;
}

static __always_inline __u64 rb_flags(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= gs_wakeup_bytes ?
		       BPF_RB_FORCE_WAKEUP :
		       BPF_RB_NO_WAKEUP;
}

/* A task's tgid and pid (its thread id), from a raw tracepoint's untyped
 * task pointer: one read where the kernel keeps them side by side, as
 * every kernel so far does (each bpf_probe_read_kernel costs ~35 ns, and
 * this runs at every switch and wakeup on the machine). */
static __always_inline void task_ids(struct task_struct *p, __u32 *tgid, __u32 *tid)
{
	__u32 pid_at = bpf_core_field_offset(struct task_struct, pid);
	if (bpf_core_field_offset(struct task_struct, tgid) == pid_at + 4) {
		__u32 ids[2] = {};
		bpf_probe_read_kernel(ids, sizeof(ids), (void *)p + pid_at);
		*tid = ids[0];
		*tgid = ids[1];
	} else {
		*tgid = BPF_CORE_READ(p, tgid);
		*tid = BPF_CORE_READ(p, pid);
	}
}

/* The word of `tracked` that holds tgid's bit, or NULL past the end. */
static __always_inline __u64 *tracked_word(__u32 tgid)
{
	__u32 w = tgid >> 6;
	return bpf_map_lookup_elem(&tracked, &w);
}

static __always_inline int is_tracked(__u32 tgid)
{
	__u64 *word = tracked_word(tgid);
	return tgid != 0 && word && ((*word >> (tgid & 63)) & 1);
}

static __always_inline void set_tracked(__u32 tgid, int on)
{
	__u64 *word = tracked_word(tgid);
	if (!word)
		return;
	if (on)
		__sync_fetch_and_or(word, 1ULL << (tgid & 63));
	else
		__sync_fetch_and_and(word, ~(1ULL << (tgid & 63)));
}

static __always_inline void fill_header(struct gs_header *h, __u16 kind, __u32 size, __u32 pid,
					__u32 tid, __u64 ts)
{
	h->ts = ts;
	h->pid = pid;
	h->tid = tid;
	h->kind = kind;
	h->cpu = bpf_get_smp_processor_id();
	h->size = size;
}

/* ------------------------------------------------------------ python */

static __always_inline int read_u64(__u64 *v, __u64 addr)
{
	return bpf_probe_read_user(v, sizeof(*v), (const void *)addr);
}

/* A search of an interpreter's thread states for the current thread's
 * (bpf_loop's callback state). */
struct py_find {
	__u64 ts;      /* the thread state to look at next, then the one found */
	__u64 self;    /* the current thread's pthread_self (FS base) */
	__u32 pid;
	__u32 found;
};

static long py_find_step(__u32 i, void *arg)
{
	struct py_find *f = arg;
	__u32 pid = f->pid;
	struct gs_py_proc *py = bpf_map_lookup_elem(&py_procs, &pid);
	__u64 id = 0;
	if (!py || !f->ts || read_u64(&id, f->ts + py->ts_thread_id))
		return 1;
	if (id == f->self) {
		f->found = 1;
		return 1;
	}
	if (read_u64(&f->ts, f->ts + py->ts_next))
		return 1;
	return 0;
}

/* The current thread's PyThreadState in `py`'s process, or 0: the one
 * whose thread_id is this thread's pthread_self (its FS base). */
static __always_inline __u64 py_thread_state(struct gs_py_proc *py, __u32 pid, __u32 tid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct py_find f = {.self = BPF_CORE_READ(task, thread.fsbase), .pid = pid};
	__u64 id = 0;
	__u64 *cached = bpf_map_lookup_elem(&py_threads, &tid);
	if (cached) {
		__u64 ts = *cached;
		if (read_u64(&id, ts + py->ts_thread_id) == 0 && id == f.self)
			return ts;
	}
	__u64 interp = 0;
	if (read_u64(&interp, py->runtime + py->interp_head) || !interp)
		return 0;
	if (read_u64(&f.ts, interp + py->threads_head))
		return 0;
	bpf_loop(GS_PY_MAX_THREADS, py_find_step, &f, 0);
	if (!f.found)
		return 0;
	bpf_map_update_elem(&py_threads, &tid, &f.ts, BPF_ANY);
	return f.ts;
}

/* The first bytes of a compact str object, and how wide its characters
 * are; kind 0 when it is none (or not readable). */
static __always_inline void py_str(struct gs_py_proc *py, __u64 obj, char *buf, __u32 cap,
				   __u16 *len, __u8 *kind)
{
	__u32 state = 0;
	__u64 length = 0;
	*len = 0;
	*kind = 0;
	if (!obj || bpf_probe_read_user(&state, sizeof(state), (const void *)(obj + py->str_state)) ||
	    read_u64(&length, obj + py->str_length))
		return;
	__u32 k = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
	if (!compact || !(k == 1 || k == 2 || k == 4))
		return;
	__u64 data = obj + (ascii ? py->str_ascii : py->str_compact);
	__u64 bytes = length * k;
	if (bytes > cap - 1)
		bytes = cap - 1;
	bytes &= cap - 1;
	if (bytes && bpf_probe_read_user(buf, bytes, (const void *)data))
		return;
	*len = bytes;
	*kind = k;
}

/* Describes code object `code` of process `pid` to userspace unless it
 * already was (with the same name object). Returns whether it is a code
 * object at all: a frame can hold something else (3.14's frames owned by
 * the interpreter itself), which is no Python function. */
static __always_inline int py_describe(struct gs_py_proc *py, __u32 pid, __u64 code, __u32 slot)
{
	struct py_code_key key = {.pid = pid, .code = code};
	__u64 name = 0;
	if (read_u64(&name, code + py->co_name))
		return 0;
	__u64 *known = bpf_map_lookup_elem(&py_codes, &key);
	if (known && *known == name)
		return 1;
	__u64 type = 0;
	if (py->code_type && (read_u64(&type, code + 8) || type != py->code_type))
		return 0;
	struct gs_pycode *c = bpf_map_lookup_elem(&py_scratch, &slot);
	if (!c)
		return 1;
	__u64 file = 0;
	read_u64(&file, code + py->co_file);
	c->firstlineno = 0;
	bpf_probe_read_user(&c->firstlineno, sizeof(c->firstlineno),
			    (const void *)(code + py->co_firstlineno));
	py_str(py, name, c->name, GS_PY_NAME_LEN, &c->name_len, &c->name_kind);
	py_str(py, file, c->file, GS_PY_FILE_LEN, &c->file_len, &c->file_kind);
	fill_header(&c->h, GS_EV_PYCODE, sizeof(*c), pid, 0, bpf_ktime_get_ns());
	c->code = code;
	__builtin_memset(c->_pad, 0, sizeof(c->_pad));
	if (bpf_ringbuf_output(&events, c, sizeof(*c), rb_flags()) != 0) {
		count_drop(GS_EV_PYCODE);
		return 1;
	}
	bpf_map_update_elem(&py_codes, &key, &name, BPF_ANY);
	return 1;
}

/* One step of a Python frame walk (bpf_loop's callback state: the
 * callback is verified once, however many frames it walks). */
struct py_walk {
	__u64 frame;  /* the next frame to look at, 0 at the end */
	__u32 pid;
	__u32 slot;   /* which scratch stack (SCRATCH_*) */
	__u32 n;      /* frames in the stack so far */
	__u32 first;  /* where the Python frames start */
	__u32 cut;    /* frames were left when the walk stopped */
};

static long py_step(__u32 i, void *arg)
{
	struct py_walk *w = arg;
	__u32 pid = w->pid, slot = w->slot;
	struct gs_py_proc *py = bpf_map_lookup_elem(&py_procs, &pid);
	struct gs_stack *s = bpf_map_lookup_elem(&scratch, &slot);
	__u64 f = w->frame;
	if (!py || !s || !f)
		return 1;
	if (w->n >= GS_MAX_STACK_DEPTH || w->n - w->first >= GS_PY_MAX_FRAMES) {
		w->cut = 1;
		return 1;
	}
	__u8 owner = 0;
	if (py->fr_owner != GS_PY_NONE)
		bpf_probe_read_user(&owner, 1, (const void *)(f + py->fr_owner));
	if (owner == py->owner_cstack) {
		/* The frame below a C-stack shim was called from C: the
		 * outermost of its eval-loop call. */
		__u32 last = w->n - 1;
		if (w->n > w->first && last < GS_MAX_STACK_DEPTH)
			s->frames[last] |= GS_PY_ENTRY;
	} else {
		__u64 code = 0;
		if (read_u64(&code, f + py->fr_code))
			return 1;
		code &= ~1ULL;
		if (code && py_describe(py, pid, code, slot)) {
			__u64 v = GS_PY_FRAME | (code & GS_PY_ADDR_MASK);
			__u8 entry = py->every_frame_entry;
			if (py->fr_is_entry != GS_PY_NONE)
				bpf_probe_read_user(&entry, 1, (const void *)(f + py->fr_is_entry));
			if (entry)
				v |= GS_PY_ENTRY;
			__u32 at = w->n;
			if (at < GS_MAX_STACK_DEPTH)
				s->frames[at] = v;
			w->n = at + 1;
		}
	}
	if (read_u64(&w->frame, f + py->fr_back)) {
		w->cut = 1;
		return 1;
	}
	return 0;
}

/* Appends the current thread's Python frames, innermost first, to the
 * scratch stack `slot` after its `depth` native frames; returns the new
 * depth. A global function: the verifier checks it once, on its own, not
 * once per path of every program that captures a stack. */
__attribute__((noinline)) int gs_py_append(__u32 pid, __u32 slot, __u32 depth)
{
	struct gs_py_proc *py = bpf_map_lookup_elem(&py_procs, &pid);
	if (!py)
		return depth;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 ts = py_thread_state(py, pid, tid);
	__u64 f = 0;
	if (!ts || read_u64(&f, ts + py->ts_frame))
		return depth;
	if (py->cframe_frame != GS_PY_NONE && (!f || read_u64(&f, f + py->cframe_frame)))
		return depth;
	struct py_walk w = {.frame = f, .pid = pid, .slot = slot, .n = depth, .first = depth};
	/* Room for shim frames, which are walked but not kept. */
	long steps = bpf_loop(GS_PY_MAX_FRAMES * 2, py_step, &w, 0);
	if (steps == GS_PY_MAX_FRAMES * 2 && w.frame)
		w.cut = 1;
	if (w.cut && w.n < GS_MAX_STACK_DEPTH) {
		struct gs_stack *s = bpf_map_lookup_elem(&scratch, &slot);
		__u32 at = w.n;
		if (s && at < GS_MAX_STACK_DEPTH) {
			s->frames[at] = GS_PY_FRAME;
			w.n = at + 1;
		}
	}
	return w.n;
}

/* ---------------------------------------------------------------- stacks */

/*
 * Capture a stack, send it once, return its hash (0 when there is none).
 * User stacks hash in the pid: the same addresses in two processes may be
 * different code, and userspace resolves them per process. A CPython
 * process's user stacks carry its Python frames after the native ones.
 */
static __always_inline __u64 capture_stack(void *ctx, __u32 slot, __u32 pid, int kernel)
{
	struct gs_stack *s = bpf_map_lookup_elem(&scratch, &slot);
	if (!s)
		return 0;
	struct gs_py_proc *py = kernel ? NULL : bpf_map_lookup_elem(&py_procs, &pid);
	long n;
	if (py)
		n = bpf_get_stack(ctx, s->frames, GS_PY_NATIVE_FRAMES * sizeof(__u64),
				  BPF_F_USER_STACK);
	else
		n = bpf_get_stack(ctx, s->frames, sizeof(s->frames),
				  kernel ? 0 : BPF_F_USER_STACK);
	if (n < 0)
		n = 0;
	__u32 depth = n / sizeof(__u64);
	if (depth > GS_MAX_STACK_DEPTH)
		depth = GS_MAX_STACK_DEPTH;
	if (py && depth <= GS_PY_NATIVE_FRAMES)
		depth = gs_py_append(pid, slot, depth);
	if (depth > GS_MAX_STACK_DEPTH)
		depth = GS_MAX_STACK_DEPTH;
	if (depth == 0)
		return 0;

	/* FNV-1a over the frames (and the pid for user stacks). */
	__u64 h = 0xcbf29ce484222325ULL;
	if (!kernel)
		h = (h ^ pid) * 0x100000001b3ULL;
	for (__u32 i = 0; i < GS_MAX_STACK_DEPTH; i++) {
		if (i >= depth)
			break;
		/* A frame-pointer walk through code built without them reads
		 * what is no return address, sometimes with the Python tag's
		 * bit (no user code is up there): it goes, not misread. */
		h = (h ^ s->frames[i]) * 0x100000001b3ULL;
	}
	h |= 1; /* never 0, which means "no stack" */

	if (bpf_map_lookup_elem(&known_stacks, &h))
		return h;

	__u32 size = __builtin_offsetof(struct gs_stack, frames) + depth * sizeof(__u64);
	/* Kept from the compiler, which knows depth's bound; the verifier
	 * does not, after a global function returned it. */
	asm volatile("" : "+r"(size));
	if (size > sizeof(struct gs_stack))
		size = sizeof(struct gs_stack);
	fill_header(&s->h, GS_EV_STACK, size, kernel ? 0 : pid, 0, bpf_ktime_get_ns());
	s->hash = h;
	s->nr_frames = depth;
	s->kernel = kernel ? 1 : 0;
	if (bpf_ringbuf_output(&events, s, size, rb_flags()) != 0) {
		count_drop(GS_EV_STACK);
		/* Not marked known: the next capture tries again. */
		return h;
	}
	__u8 one = 1;
	bpf_map_update_elem(&known_stacks, &h, &one, BPF_ANY);
	return h;
}

/* ------------------------------------------------------------ fd kinds */

#define S_IFMT 00170000
#define S_IFSOCK 0140000
#define S_IFLNK 0120000
#define S_IFREG 0100000
#define S_IFBLK 0060000
#define S_IFDIR 0040000
#define S_IFCHR 0020000
#define S_IFIFO 0010000

#define ANON_INODE_FS_MAGIC 0x09041934
#define PROC_SUPER_MAGIC 0x9fa0
#define SYSFS_MAGIC 0x62656572
#define CGROUP_SUPER_MAGIC 0x27e0eb
#define CGROUP2_SUPER_MAGIC 0x63677270
#define DEBUGFS_MAGIC 0x64626720
#define TRACEFS_MAGIC 0x74726163

#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10

/* The open file behind one of current's fds, or NULL. Walked from the
 * trusted current task with plain loads (the verifier makes them faulting
 * loads), not a helper call per field: each bpf_probe_read_kernel costs
 * about 35 ns, and this runs at every blocking switch-out. Only the fd
 * array's slot, an index the verifier cannot bound, takes a helper. */
static __always_inline struct file *fd_file(int fd)
{
	if (fd < 0)
		return NULL;
	struct task_struct *task = bpf_get_current_task_btf();
	struct files_struct *files = task->files;
	if (!files)
		return NULL;
	struct fdtable *fdt = files->fdt;
	if (!fdt)
		return NULL;
	if ((unsigned int)fd >= fdt->max_fds)
		return NULL;
	struct file **fds = fdt->fd;
	struct file *file = NULL;
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]))
		return NULL;
	return file;
}

static __always_inline __u8 file_kind(struct file *file)
{
	if (!file)
		return GS_FD_NONE;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	if (!inode)
		return GS_FD_NONE;
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	switch (magic) {
	case ANON_INODE_FS_MAGIC:
		return GS_FD_ANON;
	case PROC_SUPER_MAGIC:
	case SYSFS_MAGIC:
	case CGROUP_SUPER_MAGIC:
	case CGROUP2_SUPER_MAGIC:
	case DEBUGFS_MAGIC:
	case TRACEFS_MAGIC:
		return GS_FD_PSEUDO;
	}
	umode_t mode = BPF_CORE_READ(inode, i_mode);
	switch (mode & S_IFMT) {
	case S_IFREG:
	case S_IFDIR:
	case S_IFLNK:
		return GS_FD_FILE;
	case S_IFBLK:
		return GS_FD_BLOCK;
	case S_IFIFO:
		return GS_FD_PIPE;
	case S_IFSOCK: {
		struct socket *sock = BPF_CORE_READ(file, private_data);
		__u16 family = BPF_CORE_READ(sock, sk, __sk_common.skc_family);
		if (family == AF_INET || family == AF_INET6) {
			__u64 sk = (__u64)BPF_CORE_READ(sock, sk);
			/* Only ever asked for a tracked thread's fd. */
			note_sock_owner(sk);
			if (bpf_map_lookup_elem(&accepted, &sk))
				return GS_FD_SOCK_ACCEPTED;
			return GS_FD_SOCK_INET;
		}
		if (family == AF_UNIX)
			return GS_FD_SOCK_UNIX;
		return GS_FD_SOCK_OTHER;
	}
	case S_IFCHR: {
		char name[8] = {};
		const unsigned char *dname = BPF_CORE_READ(file, f_path.dentry, d_name.name);
		bpf_probe_read_kernel_str(name, sizeof(name), dname);
		if (name[0] == 'n' && name[1] == 'v' && name[2] == 'i' && name[3] == 'd' &&
		    name[4] == 'i' && name[5] == 'a')
			return GS_FD_GPU;
		return GS_FD_CHAR;
	}
	}
	return GS_FD_NONE;
}

/* ------------------------------------------------------------- syscalls */

/* x86_64 syscall numbers of the calls whose arguments matter here. */
#if defined(__TARGET_ARCH_x86)
enum {
	NR_read = 0, NR_write = 1, NR_open = 2, NR_poll = 7, NR_ioctl = 16,
	NR_pread64 = 17, NR_pwrite64 = 18, NR_readv = 19, NR_writev = 20,
	NR_sendfile = 40, NR_connect = 42, NR_accept = 43, NR_sendto = 44,
	NR_recvfrom = 45, NR_sendmsg = 46, NR_recvmsg = 47, NR_fcntl = 72,
	NR_flock = 73, NR_fsync = 74, NR_fdatasync = 75, NR_ftruncate = 77,
	NR_creat = 85, NR_readahead = 187, NR_getdents64 = 217,
	NR_fadvise64 = 221, NR_epoll_wait = 232, NR_openat = 257,
	NR_ppoll = 271, NR_splice = 275, NR_tee = 276, NR_sync_file_range = 277,
	NR_epoll_pwait = 281, NR_fallocate = 285, NR_accept4 = 288,
	NR_preadv = 295, NR_pwritev = 296, NR_recvmmsg = 299, NR_syncfs = 306,
	NR_sendmmsg = 307, NR_copy_file_range = 326, NR_preadv2 = 327,
	NR_pwritev2 = 328, NR_io_uring_enter = 426, NR_openat2 = 437,
	NR_epoll_pwait2 = 441,
};
#else
#error "gapscope's syscall table is x86_64-only for now"
#endif

/* Which argument holds the fd that says what the call waits on. */
static __always_inline int fd_arg_index(long nr)
{
	switch (nr) {
	case NR_read: case NR_write: case NR_ioctl: case NR_pread64:
	case NR_pwrite64: case NR_readv: case NR_writev: case NR_connect:
	case NR_accept: case NR_sendto: case NR_recvfrom: case NR_sendmsg:
	case NR_recvmsg: case NR_fcntl: case NR_flock: case NR_fsync:
	case NR_fdatasync: case NR_ftruncate: case NR_readahead:
	case NR_getdents64: case NR_fadvise64: case NR_epoll_wait:
	case NR_splice: case NR_tee: case NR_sync_file_range:
	case NR_epoll_pwait: case NR_fallocate: case NR_accept4: case NR_preadv:
	case NR_pwritev: case NR_recvmmsg: case NR_syncfs: case NR_sendmmsg:
	case NR_copy_file_range: case NR_preadv2: case NR_pwritev2:
	case NR_io_uring_enter: case NR_epoll_pwait2:
		return 0;
	case NR_sendfile: /* the source: what a sendfile waits on is its input */
		return 1;
	}
	return -1;
}

/* `regs` is current's, from bpf_task_pt_regs: plain loads (see fd_file). */
static __always_inline __u64 syscall_arg(struct pt_regs *regs, int i)
{
	switch (i) {
	case 0: return regs->di;
	case 1: return regs->si;
	case 2: return regs->dx;
	}
	return 0;
}

/* The saved user registers of the current task (its syscall's arguments,
 * where it will return to), as a pointer the verifier knows the type of. */
static __always_inline struct pt_regs *current_regs(void)
{
	return (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
}

/* The fd syscall `nr` (arguments in `regs`) waits on, or -1. */
static __always_inline int waited_fd(struct pt_regs *regs, long nr)
{
	int idx = fd_arg_index(nr);
	if (idx >= 0)
		return (int)syscall_arg(regs, idx);
	if (nr == NR_poll || nr == NR_ppoll) {
		/* The first polled fd says what kind of wait this is. */
		struct pollfd pfd = {};
		void *ufds = (void *)syscall_arg(regs, 0);
		if (ufds && syscall_arg(regs, 1) > 0 &&
		    bpf_probe_read_user(&pfd, sizeof(pfd), ufds) == 0)
			return pfd.fd;
	}
	return -1;
}

SEC("raw_tp/sys_enter")
int gs_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	/* Only tracked threads ever get task storage: finding it answers
	 * "tracked?" without the hash lookup, on the hottest path there is. */
	struct task_struct *task = bpf_get_current_task_btf();
	struct inflight *fp = bpf_task_storage_get(&inflight, task, 0, 0);
	if (!fp) {
		if (!is_tracked(bpf_get_current_pid_tgid() >> 32))
			return 0;
		fp = bpf_task_storage_get(&inflight, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!fp)
			return 0;
	}
	/* The tracepoint's regs are current's; taken typed. */
	struct pt_regs *regs = current_regs();
	long nr = (long)TP_ARG(ctx, 1);

	fp->ts = bpf_ktime_get_ns();
	fp->nr = nr;
	fp->fd = -1;
	fp->path = 0;
	fp->fd_kind = GS_FD_NONE;
	fp->fd = waited_fd(regs, nr);
	if (nr == NR_open || nr == NR_creat) {
		fp->path = syscall_arg(regs, 0);
	} else if (nr == NR_openat || nr == NR_openat2) {
		fp->path = syscall_arg(regs, 1);
	}
	struct file *file = fd_file(fp->fd);
	if (file) {
		__u64 inode = (__u64)BPF_CORE_READ(file, f_inode);
		if ((__u64)file != fp->last_file || inode != fp->last_inode) {
			fp->last_file = (__u64)file;
			fp->last_inode = inode;
			fp->last_kind = file_kind(file);
		}
		fp->fd_kind = fp->last_kind;
	}
	return 0;
}

SEC("raw_tp/sys_exit")
int gs_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	/* No task storage: not a tracked thread (see gs_sys_enter). */
	struct inflight *f = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
	if (!f || f->nr < 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	__u64 now = bpf_ktime_get_ns();
	long ret = (long)TP_ARG(ctx, 1);

	struct gs_syscall *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (e) {
		fill_header(&e->h, GS_EV_SYSCALL, sizeof(*e), tgid, tid, f->ts);
		e->duration = now - f->ts;
		e->ret = ret;
		e->nr = f->nr;
		e->fd = f->fd;
		e->fd_kind = f->fd_kind;
		__builtin_memset(e->_pad, 0, sizeof(e->_pad));
		bpf_ringbuf_submit(e, rb_flags());
	} else {
		count_drop(GS_EV_SYSCALL);
	}

	if (f->path && ret >= 0) {
		struct gs_open *o = bpf_ringbuf_reserve(&events, sizeof(*o), 0);
		if (o) {
			fill_header(&o->h, GS_EV_OPEN, sizeof(*o), tgid, tid, now);
			o->fd = ret;
			o->flags = 0;
			if (bpf_probe_read_user_str(o->path, sizeof(o->path), (void *)f->path) < 0)
				o->path[0] = 0;
			bpf_ringbuf_submit(o, rb_flags());
		} else {
			count_drop(GS_EV_OPEN);
		}
	}
	f->nr = -1;
	f->path = 0;
	return 0;
}

/* The bytes a read-family call asked for, 0 when it is not one. */
static __always_inline __u32 read_request(struct pt_regs *regs, long nr)
{
	if (nr == NR_read || nr == NR_pread64 || nr == NR_recvfrom) {
		__u64 n = syscall_arg(regs, 2);
		return n > 0xffffffffULL ? 0xffffffffU : (__u32)n;
	}
	return 0;
}

/* Components of a path walked from its leaf; enough for dataset layouts. */
#define GS_PATH_DEPTH 16

/* Sends the names on the path of `file` (current's `fd`), leaf first, so a
 * file opened before or without the per-syscall hooks still has a name.
 * Crosses mounts towards the root of current's mount namespace. */
static __always_inline void emit_dentries(__u32 tgid, __u32 tid, __u64 now, int fd,
					  struct file *file)
{
	struct gs_open *o = bpf_ringbuf_reserve(&events, sizeof(*o), 0);
	if (!o) {
		count_drop(GS_EV_OPEN);
		return;
	}
	fill_header(&o->h, GS_EV_OPEN, sizeof(*o), tgid, tid, now);
	o->fd = fd;
	o->flags = GS_OPEN_DENTRIES;
	__u64 mnt_off = bpf_core_field_offset(struct mount, mnt);
	struct dentry *d = BPF_CORE_READ(file, f_path.dentry);
	struct vfsmount *vmnt = BPF_CORE_READ(file, f_path.mnt);
	struct mount *mnt = (struct mount *)((void *)vmnt - mnt_off);
	__u32 off = 0;
	for (int i = 0; i < GS_PATH_DEPTH; i++) {
		if (d == BPF_CORE_READ(vmnt, mnt_root)) {
			struct mount *parent = BPF_CORE_READ(mnt, mnt_parent);
			if (!parent || parent == mnt) {
				o->flags |= GS_OPEN_ROOTED;
				break;
			}
			d = BPF_CORE_READ(mnt, mnt_mountpoint);
			mnt = parent;
			vmnt = (struct vfsmount *)((void *)parent + mnt_off);
			continue;
		}
		struct dentry *up = BPF_CORE_READ(d, d_parent);
		if (!up || up == d) {
			o->flags |= GS_OPEN_ROOTED;
			break;
		}
		if (off >= GS_PATH_LEN / 2)
			break;
		const unsigned char *name = BPF_CORE_READ(d, d_name.name);
		long n = bpf_probe_read_kernel_str(o->path + (off & (GS_PATH_LEN / 2 - 1)),
						   GS_PATH_LEN / 2, name);
		if (n <= 0)
			break;
		off += n;
		d = up;
	}
	/* The list ends with an empty name. */
	o->path[off & (GS_PATH_LEN - 1)] = 0;
	bpf_ringbuf_submit(o, rb_flags());
}

/* ---------------------------------------------------------- scheduler */

/* A blocked thread's kernel stack is walked again after this long even if
 * it blocks the same way. */
#define GS_KSTACK_REUSE_NS 10000000ULL

/*
 * The kernel half of the current thread's blocked-time stack. Walking it
 * (the ORC unwinder, from the tracepoint down to the syscall's entry) is
 * the dearest part of a switch-out: on a pipeline that blocks 100 k times
 * a second it costs more than the user half and the switch record
 * together. A thread that blocks again in the same syscall, on the same
 * fd of the same kind, in the same state, takes the same path to
 * schedule(): that walk is reused for up to GS_KSTACK_REUSE_NS. The user
 * half, which says which code waited, is walked every time.
 *
 * A global function: the verifier checks it once, on its own. Inlined in
 * the switch program, its branches multiplied the paths after it (757 k
 * instructions verified against 109 k, loading 0.6 s instead of 0.15).
 */
__attribute__((noinline)) __u64 gs_wait_kstack(struct bpf_raw_tracepoint_args *ctx, __s32 nr,
						__s32 fd, __u64 kind_state, __u64 now)
{
	struct inflight *f = 0;
	/* (Five arguments at most: the fd's kind rides in the state's top
	 * byte, which no task state reaches.) */
	__u8 kind = kind_state >> 56;
	__u64 state = kind_state & ((1ULL << 56) - 1);
	__u64 call = ((__u64)(__u32)nr << 32) | (__u32)fd;
	/* Not in a syscall (a page fault): no key that says the path. */
	if (nr >= 0)
		f = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0,
					 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (f && f->wait_kstack && f->wait_call == call && f->wait_kind == kind &&
	    f->wait_state == state && now - f->wait_kstack_at < GS_KSTACK_REUSE_NS &&
	    bpf_map_lookup_elem(&known_stacks, &f->wait_kstack))
		return f->wait_kstack;
	__u64 h = capture_stack(ctx, SCRATCH_SWITCH, 0, 1);
	if (f) {
		f->wait_kstack = h;
		f->wait_kstack_at = now;
		f->wait_state = state;
		f->wait_call = call;
		f->wait_kind = kind;
	}
	return h;
}

/* A blocked thread's user stack is walked again after this long even if
 * it blocks from the same code. */
#define GS_USTACK_REUSE_NS 10000000ULL

static __always_inline __u64 fnv(__u64 h, __u64 v)
{
	return (h ^ v) * 0x100000001b3ULL;
}

/* The fingerprint of the code the current thread blocks in (see
 * gs_wait_ustack); 1 when it cannot be taken. A function of its own so
 * that its locals are off the stack while the walk runs below it. */
__attribute__((noinline)) __u64 gs_wait_ukey(__u32 pid, __s32 nr, __s32 fd)
{
	if (nr < 0)
		return 1;
	struct pt_regs *regs = current_regs();
	__u64 bp = regs->bp;
	__u64 up[2] = {}, ret2 = 0;
	__u64 key = fnv(0xcbf29ce484222325ULL, ((__u64)(__u32)nr << 32) | (__u32)fd);
	key = fnv(key, regs->ip);
	key = fnv(key, regs->sp);
	key = fnv(key, bp);
	/* A chain that cannot be read gives 0s where the return addresses go:
	 * its walk would stop there too. */
	if (bp && bpf_probe_read_user(up, sizeof(up), (const void *)bp) == 0) {
		if (up[0] && read_u64(&ret2, up[0] + 8))
			ret2 = 0;
	} else {
		up[1] = 0;
	}
	key = fnv(fnv(key, up[1]), ret2);
	struct gs_py_proc *py = bpf_map_lookup_elem(&py_procs, &pid);
	if (py) {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		/* Only a thread whose state was found before: finding it is the
		 * walk's business, not the key's. */
		__u64 *ts = bpf_map_lookup_elem(&py_threads, &tid);
		__u64 fr = 0, code = 0, back = 0;
		if (!ts || read_u64(&fr, *ts + py->ts_frame))
			return 1;
		if (py->cframe_frame != GS_PY_NONE && fr && read_u64(&fr, fr + py->cframe_frame))
			return 1;
		key = fnv(key, fr);
		if (fr) {
			if (read_u64(&code, fr + py->fr_code) || read_u64(&back, fr + py->fr_back))
				return 1;
			key = fnv(key, code);
			if (back && read_u64(&code, back + py->fr_code))
				return 1;
			key = fnv(key, back ? code : 0);
		}
	}
	return key | 1;
}

/*
 * The user half of the current thread's blocked-time stack: which code
 * waited. A pipeline that blocks 100 k times a second blocks from the same
 * few places, and walking the whole chain each time was most of what a
 * switch-out cost once the kernel half was reused. So the walk is reused
 * for up to GS_USTACK_REUSE_NS while a fingerprint of the code is the
 * same: the syscall and its fd, the saved instruction, stack and frame
 * pointers, the two return addresses above them on the frame-pointer
 * chain, and in a CPython process its innermost two Python frames and
 * their code. Two call paths that reach the same wait from code differing
 * only three frames or more up, with identical frame sizes on the way,
 * share a walk for those 10 ms; anything nearer reads as its own.
 *
 * A global function (see gs_wait_kstack).
 */
__attribute__((noinline)) __u64 gs_wait_ustack(struct bpf_raw_tracepoint_args *ctx, __u32 pid,
						__s32 nr, __s32 fd, __u64 now)
{
	struct inflight *f = 0;
	__u64 key = gs_wait_ukey(pid, nr, fd);
	if (key != 1)
		f = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0,
					 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (f && f->wait_ustack && f->wait_ukey == key && now - f->wait_ustack_at < GS_USTACK_REUSE_NS &&
	    bpf_map_lookup_elem(&known_stacks, &f->wait_ustack))
		return f->wait_ustack;
	__u64 h = capture_stack(ctx, SCRATCH_SWITCH, pid, 0);
	if (f) {
		f->wait_ustack = h;
		f->wait_ukey = key;
		f->wait_ustack_at = now;
	}
	return h;
}

SEC("raw_tp/sched_switch")
int gs_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev,
	 *          struct task_struct *next, unsigned int prev_state) */
	__u8 preempt = (__u8)TP_ARG(ctx, 0);
	struct task_struct *next = (struct task_struct *)TP_ARG(ctx, 2);
	__u64 prev_state = TP_ARG(ctx, 3);

	/* prev (argument 1) is current: read as such below, without a helper
	 * call per field. */
	__u64 current_ids = bpf_get_current_pid_tgid();
	__u32 prev_tgid = current_ids >> 32, prev_tid = (__u32)current_ids;
	__u32 next_tgid, next_tid;
	task_ids(next, &next_tgid, &next_tid);
	__u8 flags = 0;
	/* Set for a task reported after its process was untracked. */
	__u64 *exit_run_base = 0;
	if (prev_tid != 0 && is_tracked(prev_tgid)) {
		flags |= GS_SW_PREV_TRACKED;
	} else if (prev_tid != 0 && (prev_state & TASK_DEAD)) {
		/* The last thread of a process switches out for good after
		 * its exit untracked it: what the kernel charged its last run
		 * is still wanted (a thread that ran to its end without a
		 * switch-out has its steal only there). current is prev. */
		struct inflight *f = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
		if (f && f->exiting) {
			flags |= GS_SW_PREV_TRACKED;
			exit_run_base = &f->exit_run_base;
		}
	}
	if (next_tid != 0 && is_tracked(next_tgid))
		flags |= GS_SW_NEXT_TRACKED;
	if (flags & GS_SW_PREV_TRACKED) {
		__u64 group = current_task_group();
		if (group != gs_job_group)
			gs_job_group = group;
	} else if (prev_tid != 0) {
		count_neighbour(0);
	}
	if (!flags)
		return 0;
	/* The moment of the switch, before any stack walking below (taken
	 * only for switches that are reported: most are not). */
	__u64 now = bpf_ktime_get_ns();
	/* A task preempted before it could block stays on the runqueue. */
	int blocked = !preempt && prev_state != 0;
	if (!blocked)
		flags |= GS_SW_PREEMPT;

	/* What prev was in: the syscall, the fd it waits on and its kind, and
	 * for a blocked read the size asked for. */
	__s32 syscall = -1, fd = -1;
	__u8 fd_kind = GS_FD_NONE;
	__u32 count = 0;
	if (flags & GS_SW_PREV_TRACKED) {
		/* current is still prev here. */
		struct task_struct *task = bpf_get_current_task_btf();
		if (gs_syscall_hooks) {
			struct inflight *f = bpf_task_storage_get(&inflight, task, 0, 0);
			if (f && f->nr >= 0) {
				syscall = f->nr;
				fd = f->fd;
				fd_kind = f->fd_kind;
			}
		} else if (blocked) {
			/* Without the per-syscall hooks it is all in prev's saved
			 * registers. */
			struct pt_regs *regs = current_regs();
			long nr = regs->orig_ax;
			if (nr >= 0) {
				syscall = nr;
				fd = waited_fd(regs, nr);
				count = read_request(regs, nr);
				struct file *file = fd_file(fd);
				struct inflight *f = 0;
				__u64 inode = 0;
				if (file) {
					/* Threads block on the same files over and over:
					 * the kind of the last one is kept, keyed as in
					 * gs_sys_enter. Not an inet socket's, whose
					 * classing also notes the thread as its user. */
					f = bpf_task_storage_get(&inflight, task, 0,
								 BPF_LOCAL_STORAGE_GET_F_CREATE);
					inode = (__u64)BPF_CORE_READ(file, f_inode);
					if (f && (__u64)file == f->last_file && inode == f->last_inode) {
						fd_kind = f->last_kind;
					} else {
						fd_kind = file_kind(file);
						if (f && fd_kind != GS_FD_SOCK_INET &&
						    fd_kind != GS_FD_SOCK_ACCEPTED) {
							f->last_file = (__u64)file;
							f->last_inode = inode;
							f->last_kind = fd_kind;
						}
					}
				}
				if (fd_kind == GS_FD_FILE || fd_kind == GS_FD_BLOCK) {
					if (f && ((__u64)file != f->named_file || inode != f->named_inode)) {
						f->named_file = (__u64)file;
						f->named_inode = inode;
						/* Before the switch: the reader names the
						 * fd before it sees the wait on it. */
						emit_dentries(prev_tgid, prev_tid, now, fd, file);
					}
				}
			}
		}
	}

	__u64 ustack = 0, kstack = 0;
	if ((flags & GS_SW_PREV_TRACKED) && blocked && !(prev_state & TASK_DEAD) && gs_offcpu_stacks) {
		/* current is still prev here. */
		ustack = gs_wait_ustack(ctx, prev_tgid, syscall, fd, now);
		kstack = gs_wait_kstack(ctx, syscall, fd, ((__u64)fd_kind << 56) | prev_state, now);
	}

	/* What the kernel charged prev's run (see fair_charge). */
	__u64 charged = 0, from = 0;
	if ((flags & GS_SW_PREV_TRACKED) && fair_charge(&charged, &from)) {
		if (!exit_run_base || from == *exit_run_base)
			flags |= GS_SW_CHARGED;
		else
			charged = 0;
	}

	struct gs_switch *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_SWITCH);
		return 0;
	}
	if (flags & GS_SW_PREV_TRACKED)
		fill_header(&e->h, GS_EV_SWITCH, sizeof(*e), prev_tgid, prev_tid, now);
	else
		fill_header(&e->h, GS_EV_SWITCH, sizeof(*e), next_tgid, next_tid, now);
	e->prev_pid = prev_tgid;
	e->prev_tid = prev_tid;
	e->next_pid = next_tgid;
	e->next_tid = next_tid;
	e->prev_state = prev_state;
	e->ustack = ustack;
	e->kstack = kstack;
	e->syscall = syscall;
	e->fd = fd;
	e->fd_kind = fd_kind;
	e->flags = flags;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	e->count = count;
	e->prev_charged = charged;
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}

static __always_inline int emit_wakeup(struct task_struct *p, __u8 wflags)
{
	__u32 tgid, tid;
	task_ids(p, &tgid, &tid);
	if (!is_tracked(tgid))
		return 0;
	struct gs_wakeup *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_WAKEUP);
		return 0;
	}
	__u64 id = bpf_get_current_pid_tgid();
	fill_header(&e->h, GS_EV_WAKEUP, sizeof(*e), tgid, tid, bpf_ktime_get_ns());
	e->waker_pid = id >> 32;
	e->waker_tid = (__u32)id;
	e->target_cpu = BPF_CORE_READ(p, wake_cpu);
	e->flags = wflags;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}

/* sched_waking, not sched_wakeup: it fires in the waker's context, so
 * `current` is the waker even when the wakee is activated on another CPU. */
SEC("raw_tp/sched_waking")
int gs_sched_waking(struct bpf_raw_tracepoint_args *ctx)
{
	return emit_wakeup((struct task_struct *)TP_ARG(ctx, 0), 0);
}

SEC("raw_tp/sched_wakeup_new")
int gs_sched_wakeup_new(struct bpf_raw_tracepoint_args *ctx)
{
	return emit_wakeup((struct task_struct *)TP_ARG(ctx, 0), GS_WK_NEW);
}

/* ----------------------------------------------------- process lifetime */

SEC("raw_tp/sched_process_fork")
int gs_sched_process_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)TP_ARG(ctx, 0);
	struct task_struct *child = (struct task_struct *)TP_ARG(ctx, 1);
	__u32 parent_tgid = BPF_CORE_READ(parent, tgid);
	if (!is_tracked(parent_tgid))
		return 0;
	__u32 child_tgid = BPF_CORE_READ(child, tgid);
	__u32 child_tid = BPF_CORE_READ(child, pid);
	__u32 flags = 0;
	if (child_tgid == parent_tgid) {
		flags |= GS_FORK_THREAD;
	} else {
		set_tracked(child_tgid, 1);
		/* A forked child is the same interpreter at the same addresses
		 * (a DataLoader worker): its frames are found from the first. */
		struct gs_py_proc *py = bpf_map_lookup_elem(&py_procs, &parent_tgid);
		if (py)
			bpf_map_update_elem(&py_procs, &child_tgid, py, BPF_ANY);
		else /* left by a process that had this pid before */
			bpf_map_delete_elem(&py_procs, &child_tgid);
	}
	struct gs_fork *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_FORK);
		return 0;
	}
	fill_header(&e->h, GS_EV_FORK, sizeof(*e), child_tgid, child_tid, bpf_ktime_get_ns());
	e->parent_pid = parent_tgid;
	e->parent_tid = BPF_CORE_READ(parent, pid);
	e->flags = flags;
	e->_pad = 0;
	BPF_CORE_READ_STR_INTO(&e->comm, child, comm);
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}

SEC("raw_tp/sched_process_exec")
int gs_sched_process_exec(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm) */
	struct task_struct *p = (struct task_struct *)TP_ARG(ctx, 0);
	struct linux_binprm *bprm = (struct linux_binprm *)TP_ARG(ctx, 2);
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (!is_tracked(tgid))
		return 0;
	/* Another program: userspace finds out whether it is a CPython. */
	bpf_map_delete_elem(&py_procs, &tgid);
	struct gs_exec *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_EXEC);
		return 0;
	}
	fill_header(&e->h, GS_EV_EXEC, sizeof(*e), tgid, BPF_CORE_READ(p, pid),
		    bpf_ktime_get_ns());
	e->old_tid = (__u32)TP_ARG(ctx, 1);
	e->_pad = 0;
	BPF_CORE_READ_STR_INTO(&e->comm, p, comm);
	const char *filename = BPF_CORE_READ(bprm, filename);
	if (bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), filename) < 0)
		e->filename[0] = 0;
	/* Userspace is woken at once: a CPython must be found before its
	 * first Python frames run. */
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

SEC("raw_tp/sched_process_exit")
int gs_sched_process_exit(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *p = (struct task_struct *)TP_ARG(ctx, 0);
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u32 tid = BPF_CORE_READ(p, pid);
	if (!is_tracked(tgid))
		return 0;
	/* signal->live is decremented before this tracepoint in do_exit(). */
	int group_dead = BPF_CORE_READ(p, signal, live.counter) == 0;
	struct gs_exit *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (e) {
		fill_header(&e->h, GS_EV_EXIT, sizeof(*e), tgid, tid, bpf_ktime_get_ns());
		e->exit_code = BPF_CORE_READ(p, exit_code);
		if (group_dead) {
			int group_code = BPF_CORE_READ(p, signal, group_exit_code);
			if (group_code)
				e->exit_code = group_code;
		}
		e->group_dead = group_dead;
		__builtin_memset(e->_pad, 0, sizeof(e->_pad));
		BPF_CORE_READ_STR_INTO(&e->comm, p, comm);
		/* Bytes moved are counted by the kernel whatever is hooked:
		 * read them once, as the thread leaves. */
		__builtin_memset(&e->io, 0, sizeof(e->io));
		e->has_io = bpf_core_field_exists(p->ioac);
		if (e->has_io) {
			e->io.rchar = BPF_CORE_READ(p, ioac.rchar);
			e->io.wchar = BPF_CORE_READ(p, ioac.wchar);
			e->io.syscr = BPF_CORE_READ(p, ioac.syscr);
			e->io.syscw = BPF_CORE_READ(p, ioac.syscw);
			e->io.read_bytes = BPF_CORE_READ(p, ioac.read_bytes);
			e->io.write_bytes = BPF_CORE_READ(p, ioac.write_bytes);
		}
		bpf_ringbuf_submit(e, rb_flags());
	} else {
		count_drop(GS_EV_EXIT);
	}
	/* Its final switch-out is still wanted (gs_sched_switch). */
	struct inflight *f =
		bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (f) {
		f->exiting = 1;
		f->exit_run_base = BPF_CORE_READ(p, se.prev_sum_exec_runtime);
	}
	/* inflight is task storage: freed with the task. */
	if (group_dead) {
		set_tracked(tgid, 0);
		bpf_map_delete_elem(&py_procs, &tgid);
	}
	return 0;
}

/* ------------------------------------------------------------- sockets */

SEC("raw_tp/inet_sock_set_state")
int gs_inet_sock_set_state(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(const struct sock *sk, const int oldstate, const int newstate) */
	__u64 sk = TP_ARG(ctx, 0);
	int oldstate = TP_ARG(ctx, 1), newstate = TP_ARG(ctx, 2);
	if (oldstate == TCP_SYN_RECV && newstate == TCP_ESTABLISHED) {
		__u8 yes = 1;
		bpf_map_update_elem(&accepted, &sk, &yes, BPF_ANY);
	} else if (oldstate == TCP_CLOSE && newstate == TCP_SYN_SENT) {
		/* connect(), in the connecting thread's context. */
		if (is_tracked(bpf_get_current_pid_tgid() >> 32))
			note_sock_owner(sk);
	} else if (newstate == TCP_CLOSE) {
		bpf_map_delete_elem(&accepted, &sk);
		bpf_map_delete_elem(&sock_owners, &sk);
	}
	return 0;
}

SEC("raw_tp/tcp_retransmit_skb")
int gs_tcp_retransmit_skb(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(const struct sock *sk, const struct sk_buff *skb, int err) */
	__u64 key = TP_ARG(ctx, 0);
	struct sock_owner *o = bpf_map_lookup_elem(&sock_owners, &key);
	if (!o || !is_tracked(o->pid))
		return 0;
	struct sock *sk = (struct sock *)key;
	struct gs_retransmit *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_RETRANSMIT);
		return 0;
	}
	fill_header(&e->h, GS_EV_RETRANSMIT, sizeof(*e), o->pid, o->tid, bpf_ktime_get_ns());
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	__builtin_memset(e->daddr, 0, sizeof(e->daddr));
	if (family == AF_INET6) {
		BPF_CORE_READ_INTO(&e->daddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	} else {
		__u32 addr = BPF_CORE_READ(sk, __sk_common.skc_daddr);
		__builtin_memcpy(e->daddr, &addr, 4);
	}
	e->family = family;
	e->dport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
	e->sport = BPF_CORE_READ(sk, __sk_common.skc_num);
	e->_pad = 0;
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}

/* ------------------------------------------------------ faults, samples */

SEC("raw_tp/page_fault_user")
int gs_page_fault_user(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long error_code) */
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!is_tracked(tgid))
		return 0;
	struct gs_fault *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_FAULT);
		return 0;
	}
	fill_header(&e->h, GS_EV_FAULT, sizeof(*e), tgid, (__u32)id, bpf_ktime_get_ns());
	e->address = TP_ARG(ctx, 0);
	e->error_code = TP_ARG(ctx, 2);
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}

SEC("perf_event")
int gs_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (tid == 0)
		return 0;
	if (!is_tracked(tgid)) {
		/* A neighbour's run so far, read with the counters: see
		 * neighbour_marks. */
		count_neighbour(1);
		return 0;
	}
	__u64 ustack = capture_stack(ctx, SCRATCH_SAMPLE, tgid, 0);
	__u64 kstack = capture_stack(ctx, SCRATCH_SAMPLE, 0, 1);
	struct gs_sample *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_SAMPLE);
		return 0;
	}
	fill_header(&e->h, GS_EV_SAMPLE, sizeof(*e), tgid, tid, bpf_ktime_get_ns());
	e->ustack = ustack;
	e->kstack = kstack;
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}

/* ------------------------------------------- libcuda uprobes (fallback) */

struct cuda_call {
	__u64 ts;
	__u64 arg;
	__u32 fn;
	__u32 depth; /* exported functions calling each other: keep the outermost */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct cuda_call);
} cuda_calls SEC(".maps");

static __always_inline __u64 call_arg(struct pt_regs *ctx, __u32 i)
{
	switch (i) {
	case 0: return PT_REGS_PARM1(ctx);
	case 1: return PT_REGS_PARM2(ctx);
	case 2: return PT_REGS_PARM3(ctx);
	case 3: return PT_REGS_PARM4(ctx);
	case 4: return PT_REGS_PARM5(ctx);
	case 5: return ctx->r9; /* x86_64: the sixth argument */
	}
	if (i >= GS_CUDA_NO_ARG || i > 16)
		return 0;
	/* Stack arguments: at entry, sp points at the return address. */
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (i - 5)));
	return v;
}

SEC("uprobe")
int gs_cuda_enter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!is_tracked(tgid))
		return 0;
	struct cuda_call *c = bpf_map_lookup_elem(&cuda_calls, &tid);
	if (c && c->depth > 0) {
		c->depth++;
		return 0;
	}
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct cuda_call n = {
		.ts = bpf_ktime_get_ns(),
		.arg = call_arg(ctx, GS_CUDA_ARG(cookie)),
		.fn = GS_CUDA_FN(cookie),
		.depth = 1,
	};
	bpf_map_update_elem(&cuda_calls, &tid, &n, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int gs_cuda_exit(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct cuda_call *c = bpf_map_lookup_elem(&cuda_calls, &tid);
	if (!c || c->depth == 0)
		return 0;
	if (--c->depth > 0)
		return 0;
	struct gs_cuda *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(GS_EV_CUDA);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	fill_header(&e->h, GS_EV_CUDA, sizeof(*e), tgid, tid, c->ts);
	e->duration = now - c->ts;
	e->arg = c->arg;
	e->fn = c->fn;
	e->_pad = 0;
	bpf_ringbuf_submit(e, rb_flags());
	return 0;
}
