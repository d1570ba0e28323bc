"""NVTX ranges around training-like steps (torch.cuda.nvtx.range_push/pop).

    nvtx_ranges.py [STEPS]

Each step is a range named gs-step-<i> around four adds; one mark at the
end. The ranges must reach gapscope (NVTX_INJECTION64_PATH)."""
import sys

import torch

from _common import emit, now, window

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
x = torch.empty(16 << 20, device="cuda")  # 64 MiB, no kernel
t_warm = now()
x.add_(1.0)
torch.cuda.synchronize()
t0 = now()
for i in range(steps):
    torch.cuda.nvtx.range_push(f"gs-step-{i}")
    for _ in range(4):
        x.add_(1.0)
    torch.cuda.nvtx.range_pop()
torch.cuda.nvtx.mark("gs-mark")
torch.cuda.synchronize()
t1 = now()
emit({
    "kernels": 1 + 4 * steps,
    "ranges": steps,
    "range_prefix": "gs-step-",
    "ranges_ns": [t0, t1],
    "windows": [window("warm-up", t_warm, t0, 1), window("steps", t0, t1, 4 * steps)],
})
