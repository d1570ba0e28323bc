"""The TensorBoard profiler plugin's overview of one PyTorch profiler trace,
as JSON on stdout: its steps (names and times) and its step time breakdown
(Kernel, Memcpy, Memset, Communication, Runtime, DataLoader, CPU Exec,
Other; µs per step on average, and the total). The Kineto tests compare
gapscope's report with it (torch-tb-profiler from PyPI, put in the test
venv by `cargo xtask setup`).

usage: tb_overview.py TRACE
"""

import json
import logging
import sys
import tempfile

from torch_tb_profiler.profiler import trace
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.event_parser import ProfileRole

# The plugin's last release predates two of torch's category names, and
# reads traces of today's torch as it read those of its day only when told
# them:
# - `cuda_runtime` (it knows the runtime as `Runtime`, PyTorch 1.8-1.10's
#   name): without it, it sees no launches, cannot tie steps to their GPU
#   work and times them by their host spans alone;
# - `user_annotation` for record_function ranges, the DataLoader's
#   `enumerate(DataLoader)#...__next__` among them (it reads them as ops,
#   as torch wrote them then, and otherwise keeps only ProfilerStep#N of
#   them): without it, its DataLoader share is 0 on every trace.
trace.EventTypeMap.setdefault("cuda_runtime", trace.EventTypes.RUNTIME)
trace.EventTypeMap["user_annotation"] = trace.EventTypes.OPERATOR


def main():
    # Its warnings about overlapping ranges go to stderr, not into the JSON.
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as cache:
        profile = RunProfileData.parse("worker", "span", sys.argv[1], cache)
    costs = profile.avg_costs.costs
    json.dump(
        {
            "steps": [
                {"name": name, "us": c.costs[ProfileRole.Total]}
                for name, c in zip(profile.steps_names, profile.steps_costs)
            ],
            "avg_us": {role.name: costs[role] for role in ProfileRole},
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
