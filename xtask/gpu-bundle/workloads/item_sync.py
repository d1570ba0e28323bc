"""A training-like loop that calls .item() every step: the GPU waits on the
host at each step (sync-bound)."""
import json, sys, time
import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 2048, device="cuda")
t0 = time.time()
for _ in range(steps):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()  # a host-device sync every step
    time.sleep(0.002)  # host work between steps
print(json.dumps({"steps": steps, "wall_s": time.time() - t0}))
