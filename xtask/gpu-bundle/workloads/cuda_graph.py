"""A CUDA graph: K adds captured once (torch.cuda.CUDAGraph), replayed R
times. Every replayed kernel must be recorded, inside the replay window.

    cuda_graph.py [K] [R]

The K adds are first run eagerly on a side stream (the warm-up capture
needs); capture itself runs nothing. Kernels: K + K*R."""
import sys

import torch

from _common import emit, now, window

k = int(sys.argv[1]) if len(sys.argv) > 1 else 20
r = int(sys.argv[2]) if len(sys.argv) > 2 else 50
x = torch.empty(16 << 20, device="cuda")  # 64 MiB, no kernel
torch.cuda.synchronize()
t_warm = now()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(k):
        x.add_(1.0)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(k):
        x.add_(1.0)
torch.cuda.synchronize()
t0 = now()
for _ in range(r):
    g.replay()
torch.cuda.synchronize()
t1 = now()
emit({
    "kernels": k + k * r,
    "graph_kernels": k,
    "replays": r,
    "windows": [window("eager + capture", t_warm, t0, k), window("replays", t0, t1, k * r)],
})
