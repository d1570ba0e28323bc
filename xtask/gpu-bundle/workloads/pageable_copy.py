"""Host-to-device copies from pageable memory every step (cause: memory).

    pageable_copy.py [STEPS]"""
import sys

import torch

from _common import emit, now

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
host = torch.randn(32 << 20)  # 128 MiB, pageable
w = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
t0 = now()
for _ in range(steps):
    d = host.to("cuda")  # pageable: a staged copy
    (w @ w).sum()
torch.cuda.synchronize()
t1 = now()
emit({
    "steps": steps,
    "copies": steps,
    "bytes_per_copy": host.numel() * host.element_size(),
    "loop_wall_ns": t1 - t0,
    "expected_cause": "memory",
})
