"""Two ranks of a data-parallel job (torch.distributed over gloo, on
loopback), each feeding its own SIMULATED GPU.

Everything on the host is real: torch.distributed's process group, its
all-reduce of the gradients over TCP between the ranks' processes. Only the
GPUs are simulated (libgs_simgpu.so, gapscope's simulated device: it says
so to gapscope, and reports show `source: "simulated"`); rank R's is
device R. Each step a rank launches its kernels, synchronizes (as
`loss.item()` would), does its own host work, then all-reduces; the fast
one waits for the late one at every all-reduce. Both do 2 ms of host work
a step; the late rank is late by
- `--late-by host`: --late-ms of host work a step instead, or
- `--late-by input`: fetching its next batch over TCP from a data service
  (a process of its own, as a remote store or a feature server is) that
  answers each request after --late-ms.

Ground truth, written as JSON to --truth: for each rank, its GPU's idle
between its first and last work, and of it the time the rank spent inside
`all_reduce`, inside its own host work, fetching its batch, and inside the
synchronize before the host work (waking after the GPU's last kernel) — each less
the rank's waits for a CPU there, counted apart: in its host work, the time
the kernel did not charge it for (its CPU clock: run delay and steal); in
its waits, the kernel's schedstat run delay, and the steal while it ran
there (its perf task clock, time on a CPU, less its CPU clock: a vCPU the
hypervisor takes in the middle of gloo's work inside all_reduce is a wait
for a CPU, not for the other rank).

    python ddp_train.py --lib libgs_simgpu.so --truth T.json [--late-ms 22]
        [--late-by host|input]
"""

import argparse
import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time


def task_clock():
    """This thread's perf task clock (ns it held a CPU, stolen or not) as a
    function; without perf events, its CPU clock (no steal seen)."""
    # struct perf_event_attr: type (PERF_TYPE_SOFTWARE), size, config
    # (PERF_COUNT_SW_TASK_CLOCK); the rest zero: counting, enabled.
    attr = bytearray(136)
    struct.pack_into("IIQ", attr, 0, 1, len(attr), 1)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    # perf_event_open (x86_64's number) for this thread, on any CPU.
    fd = libc.syscall(298, buf, 0, -1, -1, 0)
    if fd < 0:
        return time.thread_time_ns
    base = time.thread_time_ns() - int.from_bytes(os.read(fd, 8), "little")
    return lambda: base + int.from_bytes(os.read(fd, 8), "little")


def host_work(cpu_ns):
    # The rank's own work (a model's Python-side bookkeeping, logging):
    # pure Python, until it has had cpu_ns of CPU.
    end = time.thread_time_ns() + cpu_ns
    x = 0
    while time.thread_time_ns() < end:
        for i in range(200):
            x = (x * 31 + i) % 1000003
    return x


BATCH = 64 << 10


def data_service(listener, delay_s):
    # The data service: one client, one batch per request byte, each after
    # delay_s (a remote store's latency). Sleeps, so it holds no CPU.
    conn, _ = listener.accept()
    with conn:
        while conn.recv(1):
            time.sleep(delay_s)
            conn.sendall(b"\0" * BATCH)


def connect_to_data_service(delay_s):
    # Started by the rank itself, so that the job launched either way (by
    # the launcher below, or rank by rank) has its data service.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    if os.fork() == 0:
        try:
            data_service(listener, delay_s)
        finally:
            os._exit(0)
    port = listener.getsockname()[1]
    listener.close()
    return socket.create_connection(("127.0.0.1", port))


def fetch(conn):
    conn.sendall(b"x")
    got = 0
    while got < BATCH:
        chunk = conn.recv(BATCH - got)
        if not chunk:
            sys.exit("ddp_train: the data service went away")
        got += len(chunk)


def rank_main(a):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    late = rank == a.late_rank
    # Forked before the process group starts its threads.
    data = connect_to_data_service(a.late_ms / 1e3) if late and a.late_by == "input" else None
    dist.init_process_group("gloo", rank=rank, world_size=2)
    gpu = ctypes.CDLL(a.lib)
    gpu.gs_simgpu_launch.restype = ctypes.c_uint64
    gpu.gs_simgpu_launch.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    grads = torch.ones(1 << 16)
    host_ms = a.late_ms if late and a.late_by == "host" else 2.0
    now = time.monotonic_ns
    on_cpu = task_clock()

    def run_delay():
        # This thread's wait for a CPU so far: runnable, as the kernel's
        # schedstat counts it, and on a CPU the hypervisor took (its time
        # on a CPU less its CPU clock) — on a busy machine, time in the
        # spans below that is neither the rank's own work nor its wait for
        # the other.
        with open("/proc/thread-self/schedstat") as f:
            runnable = int(f.read().split()[1])
        return runnable + max(0, on_cpu() - time.thread_time_ns())

    kernels, reduces, hosts, fetches, syncs = [], [], [], [], []
    delays = 0
    # Both ranks start their loop together.
    dist.barrier()
    for _ in range(a.steps):
        for _ in range(4):
            end = gpu.gs_simgpu_launch(a.kernel_us * 1000, 20_000)
            kernels.append((end - a.kernel_us * 1000, end))
        s0, sd0 = now(), run_delay()
        gpu.gs_simgpu_synchronize()
        h0, c0 = now(), time.thread_time_ns()
        # The GPU's idle before the synchronize returned (its wake-up
        # after the GPU's last kernel, late on a busy machine): the sync's.
        syncs.append((s0, h0, max(0, run_delay() - sd0)))
        host_work(int(host_ms * 1e6))
        h1, c1, d1 = now(), time.thread_time_ns(), run_delay()
        # It never blocks there: what of the span the kernel did not charge
        # it for is its wait for a CPU, and a CPU the hypervisor took from
        # it (steal, which the run delay leaves out).
        hosts.append((h0, h1, max(0, (h1 - h0) - (c1 - c0))))
        if data is not None:
            fetch(data)
            f1, e1 = now(), run_delay()
            fetches.append((h1, f1, max(0, e1 - d1)))
            h1, d1 = f1, e1
        dist.all_reduce(grads)
        reduces.append((h1, now(), max(0, run_delay() - d1)))
    gpu.gs_simgpu_close()
    if data is not None:
        data.close()
        os.wait()
    dist.destroy_process_group()

    kernels.sort()
    busy = []
    for s, e in kernels:
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e])
    idle = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]

    def inside(spans):
        # Of the GPU's idle, the time in these spans less their waits for a
        # CPU (spread evenly over each span).
        total = 0
        for a, b, delay in spans:
            ns = sum(max(0, min(e, b) - max(s, a)) for s, e in idle)
            total += ns - delay * ns // max(b - a, 1)
        return total

    def waiting_for_cpu(spans):
        total = 0
        for a, b, delay in spans:
            ns = sum(max(0, min(e, b) - max(s, a)) for s, e in idle)
            total += delay * ns // max(b - a, 1)
        return total

    with open(f"{a.truth}.{rank}", "w") as f:
        json.dump(
            {
                "rank": rank,
                "pid": os.getpid(),
                "device": rank,
                "late": rank == a.late_rank,
                "idle_between_ns": sum(e - s for s, e in idle),
                "idle_in_all_reduce_ns": inside(reduces),
                "idle_in_host_work_ns": inside(hosts),
                "idle_in_fetch_ns": inside(fetches),
                "idle_in_sync_ns": inside(syncs),
                "idle_waiting_for_cpu_ns": waiting_for_cpu(hosts)
                + waiting_for_cpu(reduces)
                + waiting_for_cpu(fetches)
                + waiting_for_cpu(syncs),
            },
            f,
        )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="libgs_simgpu.so")
    p.add_argument("--truth", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kernel-us", type=int, default=2000)
    p.add_argument("--late-ms", type=float, default=22.0)
    p.add_argument("--late-rank", type=int, default=1)
    p.add_argument("--late-by", choices=["host", "input"], default="host")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank:
        rank_main(a)
        return
    # The launcher, as torchrun is: one process per rank, rank R on GPU R.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GS_SIMGPU_DEVICE=str(rank),
        )
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank"] + sys.argv[1:], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"ddp_train: a rank failed: {codes}")
    ranks = []
    for rank in range(2):
        with open(f"{a.truth}.{rank}") as f:
            ranks.append(json.load(f))
        os.unlink(f"{a.truth}.{rank}")
    with open(a.truth, "w") as f:
        json.dump({"simulated": True, "ranks": ranks}, f)
    for r in ranks:
        idle = max(r["idle_between_ns"], 1)
        print(
            f"ddp_train: SIMULATED GPU {r['device']}, rank {r['rank']}: "
            f"{100 * r['idle_in_all_reduce_ns'] / idle:.1f}% of its idle in all_reduce, "
            f"{100 * r['idle_in_host_work_ns'] / idle:.1f}% in its own host work, "
            f"{100 * r['idle_in_fetch_ns'] / idle:.1f}% fetching its batch",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
