"""Exits while the GPU still runs queued kernels: no synchronize at the end.

    exit_nosync.py [K] [exit|os_exit]

After a warm-up, K adds on a 1 GiB tensor (about 0.5 ms each on an H200)
are queued and the process leaves at once: by falling off the end of the
script (atexit handlers run), or with os._exit (they do not). Every kernel
must be recorded, or reported as lost: never silently missing."""
import os
import sys

import torch

from _common import emit, now, window

k = int(sys.argv[1]) if len(sys.argv) > 1 else 300
how = sys.argv[2] if len(sys.argv) > 2 else "exit"

x = torch.empty(1 << 28, device="cuda")  # 1 GiB, no kernel
t_warm = now()
x.add_(1.0)
torch.cuda.synchronize()
t0 = now()
for _ in range(k):
    x.add_(1.0)
t1 = now()
emit({
    "kernels": 1 + k,
    "queued_kernels": k,
    "exit": how,
    "launched_ns": t1 - t0,
    "windows": [window("warm-up", t_warm, t0, 1), window("queued", t0, None, k)],
})
if how == "os_exit":
    os._exit(0)
