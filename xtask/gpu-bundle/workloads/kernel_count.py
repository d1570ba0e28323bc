"""A GPU loop whose every kernel is known: N in-place adds on a tensor that
was never initialised on the GPU (torch.empty runs no kernel), timed with
torch.cuda.Event. Prints its ground truth as JSON."""
import json, sys, time
import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
x = torch.empty(64 << 20, device="cuda")  # 256 MiB, no kernel
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize()
t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
start.record()
for _ in range(n):
    x.add_(1.0)
end.record()
torch.cuda.synchronize()
t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
print(json.dumps({"kernels": n, "event_ms": start.elapsed_time(end),
                  "loop_start_ns": t0, "loop_end_ns": t1}))
