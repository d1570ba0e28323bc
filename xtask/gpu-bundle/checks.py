#!/usr/bin/env python3
"""Runs the bundle's PyTorch workloads bare and under `gapscope run`, and
checks the CUPTI path on a real GPU. Prints one short table."""
import json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
GAPSCOPE = os.path.join(HERE, "gapscope")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "out")
os.makedirs(OUT, exist_ok=True)
rows = []

def check(name, ok, figure):
    rows.append((name, "PASS" if ok else "FAIL", figure))

def run(args, rec=None):
    cmd = [sys.executable, os.path.join(HERE, "workloads", args[0])] + args[1:]
    if rec:
        cmd = [GAPSCOPE, "run", "-q", "-o", os.path.join(OUT, rec), "--"] + cmd
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{args[0]} failed ({p.returncode})")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    report = None
    if rec:
        report = json.loads(subprocess.run([GAPSCOPE, "report", "--format", "json",
                                            os.path.join(OUT, rec)],
                                           capture_output=True, text=True, check=True).stdout)
    return out, report, wall

# 1. Every kernel recorded, on the CPU clock, busy as CUDA events measure it.
truth, rep, wall = run(["kernel_count.py", "2000"], "kernel_count")
gpus = rep["gpus"]
check("GPU seen through CUPTI", bool(gpus) and gpus[0]["source"] == "cupti",
      f"{len(gpus)} GPU(s), source {gpus[0]['source'] if gpus else '-'}")
if gpus:
    g = gpus[0]
    check("every kernel recorded", g["kernels"]["count"] == truth["kernels"],
          f"{g['kernels']['count']} recorded / {truth['kernels']} launched")
    cc = g.get("clock_check", {})
    check("kernels start after their launch call (CUPTI API record)",
          cc.get("kernels_checked", 0) > 0 and cc.get("kernels_before_launch", 1) == 0,
          f"{cc.get('kernels_before_launch')} of {cc.get('kernels_checked')} before launch")
    check("launch calls happen while the thread is on-CPU (eBPF)",
          cc.get("launches_checked", 0) > 0 and cc.get("launches_while_off_cpu", 1) == 0,
          f"{cc.get('launches_while_off_cpu')} of {cc.get('launches_checked')} off-CPU")
    ev_ns = truth["event_ms"] * 1e6
    err = abs(g["busy_ns"] - ev_ns) / ev_ns
    check("busy within 2% of torch.cuda.Event", err < 0.02,
          f"busy {g['busy_ns']/1e6:.2f} ms vs events {truth['event_ms']:.2f} ms ({err*100:.2f}%)")
    check("busy + idle = allocated", g["busy_ns"] + g["idle_ns"] == g["allocated_ns"],
          f"{g['busy_ns']} + {g['idle_ns']} = {g['allocated_ns']}")
    src = rep["gpu_sources"][0]
    check("clock method", True, f"{src['clock']} (CUPTI {src['cupti_version']}, driver {src['driver_version']})")
    check("GPU records dropped", rep["drops"]["gpu_records"] == 0, str(rep["drops"]["gpu_records"]))

# 2. Slowdown against bare runs, and what each workload's report says.
for name, args in [("item_sync", ["item_sync.py", "300"]),
                   ("pageable_copy", ["pageable_copy.py", "100"]),
                   ("dataloader", ["dataloader_train.py", "2", "80"])]:
    _, _, bare = run(args)
    _, rep, traced = run(args, name)
    g = rep["gpus"][0] if rep["gpus"] else None
    figure = f"{traced / bare:.3f}x wall ({bare:.2f}s bare)"
    if g:
        figure += f"; busy {100 * g['busy_ns'] / g['allocated_ns']:.1f}% of allocated, NVML {g['nvml_util_pct']}"
    check(f"{name}: recorded, slowdown", g is not None, figure)

w = max(len(r[0]) for r in rows)
for name, verdict, figure in rows:
    print(f"{name:<{w}}  {verdict}  {figure}")
sys.exit(0 if all(r[1] == "PASS" for r in rows) else 1)
