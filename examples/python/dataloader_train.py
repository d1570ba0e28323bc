"""A training loop with a real PyTorch DataLoader feeding a SIMULATED GPU.

Everything on the host is real: torch's DataLoader with worker processes
that open and decode PNG files (PIL) and collate them into tensors, handed
to the trainer through torch's shared-memory queues. Only the GPU is
simulated (libgs_simgpu.so, gapscope's simulated device: it says so to
gapscope, and reports show `source: "simulated"`): each step launches
kernels on it and synchronizes, as `loss.item()` would.

Ground truth, written as JSON to --truth: the simulated GPU's busy spans'
total and, of its idle time between its first and last work, how much was
the input pipeline's: the trainer inside `next(DataLoader)`, and outside it
waiting for a CPU (the kernel's schedstat run delay) — spread evenly over
the span it was measured in, as simtrain's ground truth does. Those waits
are the loaders' where they held the CPUs and a busy neighbour's where it
did; which held them at each moment is not in any counter a process can
read, so they are given apart (inside next() and outside it), with the
CPUs the rest of the machine used over the loop (`others_cpus`): on a
quiet machine they are all the loaders'. Inside next(), the part it had
no CPU to load with is not the loading's: the hypervisor's steal (wall
time less CPU time and run delay where it never blocked inside; else
this machine's /proc/stat rate over its CPU time there) and, with
num_workers=0, its waits for a CPU (no loader holds one).
With --host-ms,
the trainer's own work between a batch's arrival and its launches (pure
Python): the idle spent running it, its waits for a CPU excepted (as
above) and a CPU the hypervisor took from it there
(steal: its CPU clock less the run delay; contention), and of that the part the synchronize before
it kept from overlapping the GPU's work (as long as the synchronize
waited), which is the synchronize's. With num_workers=0, the loading's own CPU
clock of its stages: decoding (PIL), the rest of `__getitem__` (fetch),
and collating. And how many of
the machine's CPUs sat idle during the loop (/proc/stat): what more
workers could have had; and how many the loader workers used (the
kernel's accounting of the joined workers). --trainer-cpu and --loader-cpu
pin the trainer and the workers to CPUs of their own: beside a neighbour
pinned to the trainer's, every wait of the trainer's for a CPU is the
neighbour's.

    python dataloader_train.py --prepare DIR          # the PNG dataset, once
    python dataloader_train.py --data DIR --lib libgs_simgpu.so --truth T.json
"""

import argparse
import ctypes
import functools
import json
import os
import resource
import sys
import time


def pin(cpu, _worker_id):
    """A DataLoader worker moves itself to `cpu` as it starts."""
    os.sched_setaffinity(0, {cpu})


def prepare(d, n, size):
    import numpy as np
    from PIL import Image

    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(n):
        p = os.path.join(d, f"{i:05d}.png")
        if os.path.exists(p):
            continue
        # Smooth noise: decoding costs what a photo's would, roughly.
        base = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((size, size), Image.BILINEAR)
        noise = rng.integers(0, 24, (size, size, 3), dtype=np.uint8)
        arr = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
        # Tests prepare the same directory at once: each writer its own temporary.
        tmp = f"{p}.{os.getpid()}.tmp"
        Image.fromarray(arr).save(tmp, format="PNG")
        os.replace(tmp, p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepare", metavar="DIR")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--data")
    ap.add_argument("--lib")
    ap.add_argument("--truth")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kernels", type=int, default=4)
    ap.add_argument("--kernel-us", type=int, default=2000)
    ap.add_argument(
        "--host-ms",
        type=float,
        default=0.0,
        help="the trainer's own CPU work per step, between a batch's arrival and its launches",
    )
    ap.add_argument(
        "--trainer-cpu",
        type=int,
        help="pin the trainer (and every thread and worker it starts) to this CPU",
    )
    ap.add_argument(
        "--loader-cpu",
        type=int,
        help="pin the DataLoader's workers to this CPU, as each starts",
    )
    a = ap.parse_args()
    if a.prepare:
        prepare(a.prepare, a.images, a.size)
        return
    if not (a.data and a.lib and a.truth):
        ap.error("--data, --lib and --truth are required (or --prepare DIR)")

    # Before torch starts any thread: they inherit the trainer's CPU.
    if a.trainer_cpu is not None:
        os.sched_setaffinity(0, {a.trainer_cpu})

    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    # The loading's own clock of its stages (CPU time, per thread): read
    # back only where it runs in this process (num_workers=0).
    stage_cpu = {"decode": 0, "fetch": 0, "collate": 0}
    cpu = time.thread_time_ns

    class PNGs(Dataset):
        def __init__(self, d):
            self.files = sorted(
                os.path.join(d, f) for f in os.listdir(d) if f.endswith(".png")
            )

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            c0 = cpu()
            with Image.open(self.files[i]) as img:
                rgb = img.convert("RGB")
            c1 = cpu()
            arr = np.asarray(rgb, dtype=np.float32) / 255.0
            out = torch.from_numpy(arr).permute(2, 0, 1)
            c2 = cpu()
            stage_cpu["decode"] += c1 - c0
            stage_cpu["fetch"] += c2 - c1
            return out

    from torch.utils.data import default_collate

    def collate(batch):
        c0 = cpu()
        out = default_collate(batch)
        stage_cpu["collate"] += cpu() - c0
        return out

    gpu = ctypes.CDLL(a.lib)
    gpu.gs_simgpu_launch.restype = ctypes.c_uint64
    gpu.gs_simgpu_launch.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    gpu.gs_simgpu_busy_ns.restype = ctypes.c_uint64

    loader = DataLoader(
        PNGs(a.data),
        batch_size=a.batch,
        num_workers=a.workers,
        shuffle=False,
        collate_fn=collate,
        worker_init_fn=None if a.loader_cpu is None else functools.partial(pin, a.loader_cpu),
    )
    now = time.monotonic_ns

    def sched():
        # This thread's CPU time as the kernel charged it, and its wait for
        # a CPU (runnable).
        with open("/proc/thread-self/schedstat") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])

    def run_delay():
        return sched()[1]

    def blocked_so_far():
        # How often this thread has given up its CPU to wait (a read, a
        # lock, a queue): unchanged over a span, it never blocked there.
        with open("/proc/thread-self/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
        return None

    def machine_steal_ns():
        # Time the hypervisor ran something else on this machine's vCPUs
        # (steal), all CPUs summed.
        with open("/proc/stat") as f:
            ticks = f.readline().split()[1:9]
        return int(ticks[7]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    def machine_idle_ns():
        # idle + iowait of every CPU, in clock ticks: CPUs a worker more
        # could have had (whatever else runs on the machine takes its share).
        with open("/proc/stat") as f:
            ticks = f.readline().split()[1:6]
        return (int(ticks[3]) + int(ticks[4])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    def host_work(cpu_ns):
        # The trainer's own work between batches (metrics, logging, a
        # model's Python-side bookkeeping): pure Python, until it has had
        # cpu_ns of CPU, however long a busy machine makes that take.
        end = time.thread_time_ns() + cpu_ns
        x = 0
        while time.thread_time_ns() < end:
            for i in range(200):
                x = (x * 31 + i) % 1000003
        return x

    waits = []  # the trainer inside next(DataLoader)
    delays = []  # (start, end, ns waiting for a CPU) outside it
    hosts = []  # (start, end, ns waiting for a CPU, behind sync, stolen) of its own host work
    launches = []  # (start, end, ns waiting for a CPU) of each step's launches
    kernels = []  # the simulated GPU's work
    it = iter(loader)
    def own_cpu_ns():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return int((r.ru_utime + r.ru_stime) * 1e9)

    loop = (now(), machine_idle_ns(), machine_steal_ns(), own_cpu_ns())
    for _ in range(a.steps):
        t0, (c0, r0), v0 = now(), sched(), blocked_so_far()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        t1, (c1, r1), v1 = now(), sched(), blocked_so_far()
        # Never blocked inside: what the kernel neither charged it nor had
        # it wait for a CPU is what the hypervisor took (steal), exactly;
        # otherwise that is not known, and the machine's rate stands in.
        stolen = max(0, (t1 - t0) - (c1 - c0) - (r1 - r0)) if v0 is not None and v0 == v1 else None
        waits.append((t0, t1, c1 - c0, r1 - r0, stolen))
        if a.host_ms > 0:
            h0, d0, c0 = now(), run_delay(), time.thread_time_ns()
            host_work(int(a.host_ms * 1e6))
            h1, d1, c1 = now(), run_delay(), time.thread_time_ns()
            # The synchronize before it waited this long for the GPU.
            hid = delays[-1][1] - delays[-1][0] if delays else 0
            # It never blocks there: of what the kernel did not charge it,
            # the run delay is a wait for a CPU (as the synchronize's), the
            # rest a CPU the hypervisor took (steal) — contention, no one's
            # here.
            stolen = max(0, (h1 - h0) - (c1 - c0) - (d1 - d0))
            hosts.append((h0, h1, d1 - d0, hid, stolen))
        # A forward and backward pass: kernels the batch feeds, then a
        # synchronize (loss.item()).
        assert batch.shape[1] == 3
        # Launching is CPU work too: its waits for a CPU the loaders held
        # are theirs, as the synchronize's are.
        l0, ld0 = now(), run_delay()
        for _ in range(a.kernels):
            end = gpu.gs_simgpu_launch(a.kernel_us * 1000, 20_000)
            kernels.append((end - a.kernel_us * 1000, end))
        launches.append((l0, now(), run_delay() - ld0))
        t1, d1 = now(), run_delay()
        gpu.gs_simgpu_synchronize()
        delays.append((t1, now(), run_delay() - d1))
    loop_ns = max(now() - loop[0], 1)
    idle_cpus = (machine_idle_ns() - loop[1]) / loop_ns
    # Of each vCPU's time, the share the hypervisor took.
    steal = min((machine_steal_ns() - loop[2]) / (loop_ns * (os.cpu_count() or 1)), 0.5)
    gpu.gs_simgpu_close()
    # The loaders' CPU time, as the kernel accounted it to the workers once
    # they were joined: how many CPUs they used (a worker more needs as
    # much again, from the idle ones).
    trainer_cpus = (own_cpu_ns() - loop[3]) / loop_ns
    del it
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    loader_cpus = (kids.ru_utime + kids.ru_stime) * 1e9 / loop_ns
    # What the rest of the machine ran meanwhile (the recorder included):
    # the most more workers could win from others, were all of it in the
    # job's own scheduling group.
    nr_cpus = os.cpu_count() or 1
    others_cpus = max(0.0, nr_cpus * (1 - steal) - idle_cpus - loader_cpus - trainer_cpus)

    # The GPU's idle between its first and last work, and the part of it
    # the trainer spent inside next(DataLoader).
    kernels.sort()
    busy = []
    for s, e in kernels:
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e])
    idle = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]
    idle_ns = sum(e - s for s, e in idle)
    in_next = 0
    # Inside next(), the time the trainer had no CPU to load with: the
    # hypervisor's steal (exact where it never blocked there; else the
    # machine's rate, over the CPU time it was charged there) and, with no
    # workers to hold the CPUs, its waits for one — not the loading's cost.
    without_cpu = 0
    waiting_in_next = 0
    for s, e in idle:
        for ws, we, cpu_ns, waited, stolen in waits:
            overlap = max(0, min(e, we) - max(s, ws))
            in_next += overlap
            if stolen is None:
                stolen = int(cpu_ns * steal / (1 - steal))
            lost = stolen + (waited if a.workers == 0 else 0)
            lost = min(lost, max(we - ws - cpu_ns, 0))
            without_cpu += overlap * lost // max(we - ws, 1)
            # With workers, its waits for a CPU there: the loaders' while
            # they held the CPUs, a busy neighbour's while it did.
            waits_all = min(stolen + waited, max(we - ws - cpu_ns, 0))
            waiting_in_next += overlap * (waits_all - lost) // max(we - ws, 1)
    held = 0
    in_host = 0
    hidden = 0
    for s, e in idle:
        for ds, de, waited, *_ in delays + hosts + launches:
            overlap = max(0, min(e, de) - max(s, ds))
            held += overlap * min(waited, de - ds) // max(de - ds, 1)
        for hs, he, waited, hid, stolen in hosts:
            overlap = max(0, min(e, he) - max(s, hs))
            own = overlap - overlap * min(waited + stolen, he - hs) // max(he - hs, 1)
            # As much of it as the synchronize before waited for the GPU
            # would have run beside the GPU's work without that wait: the
            # synchronize's; the rest outlasts the GPU, the work's own.
            h = min(own, hid)
            hidden += h
            in_host += own - h
    truth = {
        "simulated": True,
        "busy_ns": sum(e - s for s, e in busy),
        "idle_between_ns": idle_ns,
        "idle_in_next_ns": in_next,
        "idle_in_next_without_a_cpu_ns": without_cpu,
        "idle_in_next_waiting_for_cpu_ns": waiting_in_next,
        "steal": steal,
        "idle_waiting_for_cpu_ns": held,
        "idle_in_host_work_ns": in_host,
        "idle_host_work_behind_sync_ns": hidden,
        "workers": a.workers,
        "idle_cpus": idle_cpus,
        "loader_cpus": loader_cpus,
        "others_cpus": others_cpus,
        "nr_cpus": nr_cpus,
        "loop_ns": loop_ns,
        "torch": torch.__version__,
    }
    if a.workers == 0:
        truth["stage_cpu_ns"] = stage_cpu
    with open(a.truth, "w") as f:
        json.dump(truth, f)
    print(
        f"dataloader_train: SIMULATED GPU, {a.workers} workers: "
        f"{100 * in_next / max(idle_ns, 1):.1f}% of the GPU's idle inside next(DataLoader), "
        f"{100 * held / max(idle_ns, 1):.1f}% waiting for a CPU outside it, "
        f"{100 * in_host / max(idle_ns, 1):.1f}% in its own host work"
    )


if __name__ == "__main__":
    sys.exit(main())
