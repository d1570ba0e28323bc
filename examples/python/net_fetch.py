"""A training loop on a SIMULATED GPU that fetches each batch over TCP from
a data service (a process of its own, on loopback), for a network that
loses segments.

Everything on the host is real: the service's socket, the batches it sends
(16 KiB each, one TCP segment on loopback), the kernel's retransmissions
when a segment is lost. Losing them is the caller's to arrange (the tests
run it in a network namespace of its own, with an nftables rule that drops
some of the service's data segments). Only the GPU is simulated
(libgs_simgpu.so, gapscope's simulated device: it says so to gapscope, and
reports show `source: "simulated"`).

Ground truth, written as JSON to --truth: the segments TCP sent again while
the loop ran, as the kernel counts them for the network namespace it runs
in (RetransSegs in /proc/net/snmp), and the GPU's idle spent fetching.

    python net_fetch.py --lib libgs_simgpu.so --truth T.json --port P
"""

import argparse
import ctypes
import json
import os
import socket
import sys
import time

BATCH = 16 << 10


def retrans_segs():
    # The kernel's count for this network namespace.
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("RetransSegs")])


def service(listener):
    # One client, one batch per request byte.
    conn, _ = listener.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while conn.recv(1):
            conn.sendall(b"\0" * BATCH)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="libgs_simgpu.so")
    p.add_argument("--truth", required=True)
    p.add_argument("--port", type=int, required=True, help="the service's port")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--kernel-ms", type=float, default=2.0)
    a = p.parse_args()

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.port))
    listener.listen(1)
    if os.fork() == 0:
        try:
            service(listener)
        finally:
            os._exit(0)
    listener.close()

    gpu = ctypes.CDLL(a.lib)
    gpu.gs_simgpu_launch.restype = ctypes.c_uint64
    gpu.gs_simgpu_launch.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    now = time.monotonic_ns
    before = retrans_segs()
    fetches, kernels = [], []
    with socket.create_connection(("127.0.0.1", a.port)) as conn:
        for _ in range(a.batches):
            f0 = now()
            conn.sendall(b"x")
            got = 0
            while got < BATCH:
                chunk = conn.recv(BATCH - got)
                if not chunk:
                    sys.exit("net_fetch: the data service went away")
                got += len(chunk)
            fetches.append((f0, now()))
            end = gpu.gs_simgpu_launch(int(a.kernel_ms * 1e6), 20_000)
            kernels.append((end - int(a.kernel_ms * 1e6), end))
            gpu.gs_simgpu_synchronize()
    os.wait()
    gpu.gs_simgpu_close()
    after = retrans_segs()

    idle = [(kernels[i][1], kernels[i + 1][0]) for i in range(len(kernels) - 1)]
    fetching = sum(max(0, min(e, b) - max(s, a)) for s, e in idle for a, b in fetches)
    truth = {
        "simulated": True,
        "pid": os.getpid(),
        "retrans_segs": after - before,
        "idle_between_ns": sum(e - s for s, e in idle),
        "idle_fetching_ns": fetching,
    }
    with open(a.truth, "w") as f:
        json.dump(truth, f)
    print(
        f"net_fetch: SIMULATED GPU, {a.batches} batches: {truth['retrans_segs']} segments sent again, "
        f"{100 * fetching / max(truth['idle_between_ns'], 1):.1f}% of the GPU's idle fetching",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
