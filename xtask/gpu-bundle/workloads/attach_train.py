"""A deterministic training loop to attach to mid-flight (`gapscope attach`
brings the shim in with ptrace): the same seed gives the same losses, bit
for bit, attached or not.

    attach_train.py [STEPS] [READY_FILE] [WARM]

After WARM steps (default 30) it writes its pid into READY_FILE, so that the
check attaches while it trains. Each step: forward, backward, an SGD step
and loss.item() (the step's kernels are done when it ends), then 10 ms of
host work. Prints the ground truth: each step's CLOCK_MONOTONIC window and
its loss exactly (float.hex)."""
import os
import sys

# cuBLAS picks the same kernels, and reduces in the same order, run to run.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

from _common import emit, now, spin, window  # noqa: E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
ready = sys.argv[2] if len(sys.argv) > 2 else None
warm = int(sys.argv[3]) if len(sys.argv) > 3 else 30

torch.manual_seed(0)
torch.use_deterministic_algorithms(True, warn_only=True)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 16)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
gen = torch.Generator(device="cuda")
gen.manual_seed(1)
xs = torch.randn(32, 512, 1024, device="cuda", generator=gen)
ys = torch.randn(32, 512, 16, device="cuda", generator=gen)
torch.cuda.synchronize()

losses, windows = [], []
t_start = now()
for i in range(steps):
    if i == warm and ready:
        with open(ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
    t0 = now()
    loss = (model(xs[i % 32]) - ys[i % 32]).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    v = loss.item()
    windows.append(window(f"step {i}", t0, now(), None))
    losses.append(v.hex())
    spin(0.01)
emit({"steps": steps, "warm": warm, "losses": losses, "windows": windows,
      "loop_wall_ns": now() - t_start})
