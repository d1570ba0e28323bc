"""A training-like loop that calls .item() every step, then does host work:
the GPU drains its queue and waits on the host each step (cause: sync).

    item_sync.py [STEPS]"""
import sys

import torch

from _common import emit, now, spin

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 2048, device="cuda")
torch.cuda.synchronize()
t0 = now()
for _ in range(steps):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()  # a host-device sync every step
    spin(0.002)  # host work between steps, on-CPU
t1 = now()
emit({"steps": steps, "loop_wall_ns": t1 - t0, "expected_cause": "sync"})
