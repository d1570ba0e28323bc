"""Kernels whose number, timing and CPU-clock windows are known.

    kernel_count.py [N] [M] [MIB]

One warm-up add_ (timed with its own CUDA events), then N in-place adds on a
MIB-MiB float tensor (default 1 GiB: about 0.5 ms each on an H200, so launch
gaps are not what the events measure), bracketed by torch.cuda.Event and by
CLOCK_MONOTONIC; then M adds on a 4 KiB tensor (launch-bound: what tracing
costs per launch). torch.empty runs no kernel, so the adds are every kernel
of the process: 1 + N + M. Prints the ground truth as JSON."""
import sys

import torch

from _common import emit, now, window

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
m = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
mib = int(sys.argv[3]) if len(sys.argv) > 3 else 1024

x = torch.empty(mib << 18, device="cuda")  # MIB MiB of float32, no kernel
small = torch.empty(1024, device="cuda")
ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
w0, w1, start, end = ev(), ev(), ev(), ev()
torch.cuda.synchronize()

t_warm = now()
w0.record()
x.add_(1.0)  # warm-up: module loading happens here, outside the window
w1.record()
torch.cuda.synchronize()

t0 = now()
start.record()
for _ in range(n):
    x.add_(1.0)
end.record()
torch.cuda.synchronize()
t1 = now()

t2 = now()
for _ in range(m):
    small.add_(1.0)
torch.cuda.synchronize()
t3 = now()

windows = [window("warm-up", t_warm, t0, 1), window("loop", t0, t1, n)]
if m:
    windows.append(window("launch-bound", t2, t3, m))
emit({
    "kernels": 1 + n + m,
    "warmup_kernels": 1,
    "loop_kernels": n,
    "launch_kernels": m,
    "tensor_mib": mib,
    "warmup_ms": w0.elapsed_time(w1),
    "event_ms": start.elapsed_time(end),
    "loop_start_ns": t0,
    "loop_end_ns": t1,
    "loop_wall_ns": t1 - t0,
    "launch_wall_ns": t3 - t2,
    "windows": windows,
})
