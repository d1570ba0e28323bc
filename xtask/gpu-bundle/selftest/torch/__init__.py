"""A stand-in for the few parts of PyTorch the bundle's workloads use, over
the stand-in libcupti (libcupti_standin.so, $GS_FAKE_CUPTI): kernels go to
its simulated GPU stream, torch.profiler is its emulated Kineto client, and
"cuInit" loads CUDA_INJECTION64_PATH and calls InitializeInjection. For the
bundle's self-test on machines without a GPU (selftest/run.sh); never part
of the bundle."""
import contextlib
import ctypes
import json
import os
import sys
import time
import types

__version__ = "0.0+standin"
version = types.SimpleNamespace(cuda="13.0 (stand-in)")
float32 = "float32"

_lib = None
_inited = False
_capturing = None
_last = 0


def _fake():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.environ["GS_FAKE_CUPTI"], mode=ctypes.RTLD_GLOBAL)
        _lib.fakecupti_launch_kernel.restype = ctypes.c_uint32
        _lib.fakecupti_launch_kernel.argtypes = [ctypes.c_uint64, ctypes.c_char_p]
        _lib.fakecupti_span.restype = ctypes.c_uint32
        _lib.fakecupti_span.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64),
                                        ctypes.POINTER(ctypes.c_uint64)]
    return _lib


_fake()  # mapped at import, as torch maps its libcupti


def _init():
    """cuInit's part: the injection library's InitializeInjection."""
    global _inited
    if not _inited:
        _inited = True
        inj = os.environ.get("CUDA_INJECTION64_PATH")
        if inj:
            ctypes.CDLL(inj).InitializeInjection()


def _launch(nbytes):
    global _last
    dur = max(2000, int(nbytes * 2 / 4e12 * 1e9))  # read + write at ~4 TB/s
    if _capturing is not None:
        _capturing.append(nbytes)
        return
    _init()
    _last = _fake().fakecupti_launch_kernel(dur, b"vectorized_elementwise_kernel_add")


def _stream_time():
    """When an event recorded now is reached: after the last kernel, or now."""
    now = time.clock_gettime_ns(time.CLOCK_REALTIME)
    if _last:
        s, e = ctypes.c_uint64(), ctypes.c_uint64()
        if _fake().fakecupti_span(_last, ctypes.byref(s), ctypes.byref(e)) == 0:
            return max(now, e.value)
    return now


class Tensor:
    def __init__(self, n, on_gpu):
        self.n, self.on_gpu = n, on_gpu

    def add_(self, _v):
        if self.on_gpu:
            _launch(self.n * 4)
        return self


def empty(n, device=None):
    if device == "cuda":
        _init()
    return Tensor(n, device == "cuda")


class _Cuda(types.ModuleType):
    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            _init()
            self.t = _stream_time()

        def elapsed_time(self, other):
            return (other.t - self.t) / 1e6

    class Stream:
        def wait_stream(self, _other):
            pass

    class CUDAGraph:
        def __init__(self):
            self.kernels = []

        def replay(self):
            for nbytes in self.kernels:
                _launch(nbytes)

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_name(_i=0):
        return "stand-in GPU (libcupti_standin)"

    @staticmethod
    def synchronize():
        _init()
        _fake().fakecupti_synchronize()

    @staticmethod
    def current_stream():
        return _Cuda.Stream()

    @staticmethod
    @contextlib.contextmanager
    def stream(_s):
        yield

    @staticmethod
    @contextlib.contextmanager
    def graph(g):
        global _capturing
        _capturing = g.kernels
        try:
            yield
        finally:
            _capturing = None


cuda = _Cuda("torch.cuda")
cuda.nvtx = types.SimpleNamespace(range_push=lambda _n: 0, range_pop=lambda: 0, mark=lambda _n: None)
sys.modules["torch.cuda"] = cuda


class _KinetoStats(ctypes.Structure):
    _fields_ = [("kernels", ctypes.c_uint64), ("records", ctypes.c_uint64),
                ("unknown_buffers", ctypes.c_uint64), ("subscribe_rc", ctypes.c_uint32)]


class ProfilerActivity:
    CPU, CUDA = "cpu", "cuda"


class profile:
    def __init__(self, activities=()):
        self.stats = _KinetoStats()

    def __enter__(self):
        _init()
        _fake().fakecupti_kineto_start()
        return self

    def __exit__(self, *exc):
        _fake().fakecupti_kineto_stop()
        _fake().fakecupti_kineto_stats(ctypes.byref(self.stats))
        return False

    def export_chrome_trace(self, path):
        ev = []
        for i in range(self.stats.kernels):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": i * 10.0,
                       "dur": 2.0, "args": {"correlation": i}})
            ev.append({"ph": "X", "cat": "kernel", "name": "add", "ts": i * 10.0 + 5,
                       "dur": 3.0, "args": {"correlation": i}})
        with open(path, "w") as f:
            json.dump({"traceEvents": ev}, f)


profiler = types.ModuleType("torch.profiler")
profiler.profile, profiler.ProfilerActivity = profile, ProfilerActivity
sys.modules["torch.profiler"] = profiler
