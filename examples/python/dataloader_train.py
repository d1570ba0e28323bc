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
waiting for a CPU (the kernel's schedstat run delay; nothing else of note
runs here, so the CPUs were held by the loaders) — spread evenly over the
span it was measured in, as simtrain's ground truth does. And how many of
the machine's CPUs sat idle during the loop (/proc/stat): what more
workers could have had; and how many the loader workers used (the
kernel's accounting of the joined workers).

    python dataloader_train.py --prepare DIR          # the PNG dataset, once
    python dataloader_train.py --data DIR --lib libgs_simgpu.so --truth T.json
"""

import argparse
import ctypes
import json
import os
import resource
import sys
import time


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
        tmp = p + ".tmp"
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
    a = ap.parse_args()
    if a.prepare:
        prepare(a.prepare, a.images, a.size)
        return
    if not (a.data and a.lib and a.truth):
        ap.error("--data, --lib and --truth are required (or --prepare DIR)")

    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    class PNGs(Dataset):
        def __init__(self, d):
            self.files = sorted(
                os.path.join(d, f) for f in os.listdir(d) if f.endswith(".png")
            )

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            with Image.open(self.files[i]) as img:
                arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
            return torch.from_numpy(arr).permute(2, 0, 1)

    gpu = ctypes.CDLL(a.lib)
    gpu.gs_simgpu_launch.restype = ctypes.c_uint64
    gpu.gs_simgpu_launch.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    gpu.gs_simgpu_busy_ns.restype = ctypes.c_uint64

    loader = DataLoader(
        PNGs(a.data), batch_size=a.batch, num_workers=a.workers, shuffle=False
    )
    now = time.monotonic_ns

    def run_delay():
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])

    def machine_idle_ns():
        # idle + iowait of every CPU, in clock ticks: CPUs a worker more
        # could have had (whatever else runs on the machine takes its share).
        with open("/proc/stat") as f:
            ticks = f.readline().split()[1:6]
        return (int(ticks[3]) + int(ticks[4])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    waits = []  # the trainer inside next(DataLoader)
    delays = []  # (start, end, ns waiting for a CPU) outside it
    kernels = []  # the simulated GPU's work
    it = iter(loader)
    loop = (now(), machine_idle_ns())
    for _ in range(a.steps):
        t0 = now()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        waits.append((t0, now()))
        # A forward and backward pass: kernels the batch feeds, then a
        # synchronize (loss.item()).
        assert batch.shape[1] == 3
        for _ in range(a.kernels):
            end = gpu.gs_simgpu_launch(a.kernel_us * 1000, 20_000)
            kernels.append((end - a.kernel_us * 1000, end))
        t1, d1 = now(), run_delay()
        gpu.gs_simgpu_synchronize()
        delays.append((t1, now(), run_delay() - d1))
    loop_ns = max(now() - loop[0], 1)
    idle_cpus = (machine_idle_ns() - loop[1]) / loop_ns
    gpu.gs_simgpu_close()
    # The loaders' CPU time, as the kernel accounted it to the workers once
    # they were joined: how many CPUs they used (a worker more needs as
    # much again, from the idle ones).
    del it
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    loader_cpus = (kids.ru_utime + kids.ru_stime) * 1e9 / loop_ns

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
    for s, e in idle:
        for ws, we in waits:
            in_next += max(0, min(e, we) - max(s, ws))
    held = 0
    for s, e in idle:
        for ds, de, waited in delays:
            overlap = max(0, min(e, de) - max(s, ds))
            held += overlap * min(waited, de - ds) // max(de - ds, 1)
    truth = {
        "simulated": True,
        "busy_ns": sum(e - s for s, e in busy),
        "idle_between_ns": idle_ns,
        "idle_in_next_ns": in_next,
        "idle_waiting_for_cpu_ns": held,
        "workers": a.workers,
        "idle_cpus": idle_cpus,
        "loader_cpus": loader_cpus,
        "torch": torch.__version__,
    }
    with open(a.truth, "w") as f:
        json.dump(truth, f)
    print(
        f"dataloader_train: SIMULATED GPU, {a.workers} workers: "
        f"{100 * in_next / max(idle_ns, 1):.1f}% of the GPU's idle inside next(DataLoader), "
        f"{100 * held / max(idle_ns, 1):.1f}% waiting for a CPU outside it"
    )


if __name__ == "__main__":
    sys.exit(main())
