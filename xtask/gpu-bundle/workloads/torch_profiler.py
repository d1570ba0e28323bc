"""torch.profiler (Kineto) inside a traced job: it takes CUPTI for a while.

    torch_profiler.py TRACE.json [N] [PAUSE_S]

Three phases of N adds each, synchronized between phases: before, during a
torch.profiler session (CPU + CUDA activities) whose chrome trace is
exported to TRACE.json, and after it. torch.profiler must still produce its
full trace (N kernels, each after its launch call on its own clock); the
shim must see the kernels before and after, and report the span it could
not see rather than let it pass for idle. PAUSE_S (0.6) of host time
before the profiler starts, as in a job that profiles a later step: the
shim has delivered what ran before by then (it flushes every 250 ms)."""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from _common import emit, now, window

trace = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.6

x = torch.empty(64 << 20, device="cuda")  # 256 MiB, no kernel
t_warm = now()
x.add_(1.0)
torch.cuda.synchronize()


def phase():
    t = now()
    for _ in range(n):
        x.add_(1.0)
    torch.cuda.synchronize()
    return t, now()


b0, b1 = phase()
time.sleep(pause)
p0 = now()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    d0, d1 = phase()
p1 = now()
prof.export_chrome_trace(trace)
a0, a1 = phase()
emit({
    "kernels": 1 + 3 * n,
    "profiler_kernels": n,
    "trace": trace,
    "profiler_ns": [p0, p1],
    "windows": [
        window("warm-up", t_warm, b0, 1),
        window("before", b0, b1, n),
        window("during", d0, d1, n),
        window("after", a0, a1, n),
    ],
})
