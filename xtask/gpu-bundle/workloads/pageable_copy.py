"""Host-to-device copies from pageable memory every step (memory-bound)."""
import json, sys, time
import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
host = torch.randn(32 << 20)  # 128 MiB, pageable
w = torch.randn(4096, 4096, device="cuda")
t0 = time.time()
for _ in range(steps):
    d = host.to("cuda")  # pageable: synchronous, staged copy
    (w @ w).sum()
torch.cuda.synchronize()
print(json.dumps({"steps": steps, "bytes": steps * host.numel() * 4, "wall_s": time.time() - t0}))
