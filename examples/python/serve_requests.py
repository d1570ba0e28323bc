"""An inference server on a SIMULATED GPU, and the client that loads it.

Everything on the host is real: a socketserver TCP server on loopback (or
with --plain a loop of its own over a socket it accepted) reads requests,
one line each, from a client process over one connection;
for each it runs --kernel-ms of kernels on the simulated GPU
(libgs_simgpu.so, gapscope's simulated device: it says so to gapscope, and
reports show `source: "simulated"`), synchronizes, and writes the answer
back. The client sends --requests requests, each a random 10-50 ms after
the previous answer (--interval-ms 0: back to back, a flooded server).

Ground truth, written as JSON to --truth: the server's GPU idle between its
first and last work, and of it the time the server spent waiting for the
next request (blocked reading it); the requests answered, and the time
from each one's arrival (read) to its answer (written), p50 and p99.

    python serve_requests.py --lib libgs_simgpu.so --truth T.json
"""

import argparse
import ctypes
import json
import os
import random
import socket
import socketserver
import subprocess
import sys
import time


def client(port, requests, interval_ms):
    rng = random.Random(11)
    with socket.create_connection(("127.0.0.1", port)) as s:
        f = s.makefile("rwb")
        for i in range(requests):
            if interval_ms > 0:
                time.sleep(rng.uniform(interval_ms / 5, interval_ms) / 1000)
            f.write(b"request %d\n" % i)
            f.flush()
            assert f.readline().startswith(b"answer")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="libgs_simgpu.so")
    p.add_argument("--truth", required=True)
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--kernel-ms", type=float, default=4.0)
    p.add_argument("--interval-ms", type=float, default=50.0)
    p.add_argument(
        "--plain",
        action="store_true",
        help="serve from a plain socket loop instead of socketserver",
    )
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.client:
        client(a.client, a.requests, a.interval_ms)
        return

    gpu = ctypes.CDLL(a.lib)
    gpu.gs_simgpu_launch.restype = ctypes.c_uint64
    gpu.gs_simgpu_launch.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    now = time.monotonic_ns
    kernels, waits, answers = [], [], []

    def serve(rfile, wfile):
        # One connection's requests, until the client hangs up.
        while True:
            w0 = now()
            line = rfile.readline()
            arrived = now()
            waits.append((w0, arrived))
            if not line:
                return
            end = gpu.gs_simgpu_launch(int(a.kernel_ms * 1e6), 20_000)
            kernels.append((end - int(a.kernel_ms * 1e6), end))
            gpu.gs_simgpu_synchronize()
            wfile.write(b"answer\n")
            wfile.flush()
            answers.append(now() - arrived)

    def client_of(port):
        return subprocess.Popen([sys.executable, __file__, "--client", str(port)] + sys.argv[1:])

    if a.plain:
        # A server of its own making: no framework's code on its stack.
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            c = client_of(listener.getsockname()[1])
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as rfile, conn.makefile("wb") as wfile:
                serve(rfile, wfile)
    else:

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                serve(self.rfile, self.wfile)

        with socketserver.TCPServer(("127.0.0.1", 0), Handler) as server:
            c = client_of(server.server_address[1])
            # The one connection the client opens, served until it closes.
            server.handle_request()
    if c.wait():
        sys.exit("serve_requests: the client failed")
    gpu.gs_simgpu_close()

    busy = []
    for s, e in sorted(kernels):
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e])
    idle = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]
    waiting = sum(max(0, min(e, b) - max(s, a)) for s, e in idle for a, b in waits)
    answers.sort()
    truth = {
        "simulated": True,
        "pid": os.getpid(),
        "requests": len(kernels),
        # Each request from its arrival (read) to its answer (written).
        "latency_p50_ns": answers[len(answers) // 2],
        "latency_p99_ns": answers[min(len(answers) - 1, len(answers) * 99 // 100)],
        "kernel_ns": int(a.kernel_ms * 1e6),
        "idle_between_ns": sum(e - s for s, e in idle),
        "idle_waiting_for_requests_ns": waiting,
    }
    with open(a.truth, "w") as f:
        json.dump(truth, f)
    print(
        f"serve_requests: SIMULATED GPU, {len(kernels)} requests: "
        f"{100 * waiting / max(truth['idle_between_ns'], 1):.1f}% of the GPU's idle waiting for the next",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
