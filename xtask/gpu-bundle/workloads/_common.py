"""What every bundle workload shares: the CPU clock the checks compare
kernels against, and one line of ground truth on stdout."""
import json
import sys
import time


def now():
    """CLOCK_MONOTONIC ns: the clock the shim puts CUPTI's timestamps on."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def window(name, start, end, kernels):
    """Kernels launched between `start` and `end` (CLOCK_MONOTONIC ns): each
    must start at or after `start` and end by `end` (+ 1 ms) when the shim's
    clock is right. `end` None: the process did not wait for them."""
    return {"name": name, "start": start, "end": end, "kernels": kernels}


def emit(truth):
    """The ground truth, as the last line of stdout."""
    sys.stdout.write(json.dumps(truth) + "\n")
    sys.stdout.flush()


def spin(seconds):
    """CPU work on the calling thread (not a sleep: the thread stays on-CPU)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x
