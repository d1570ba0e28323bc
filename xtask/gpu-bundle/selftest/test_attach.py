"""The GPU bundle's attach check, without a GPU: its judgements on known
figures, and its runner — start a training loop, wait until it says it is
warm, `gapscope attach` to it, collect both — on a CPU-only stand-in for
attach_train.py under the real gapscope (root and eBPF needed).

    GAPSCOPE=target/debug/gapscope python3 test_attach.py"""
import os
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLE = os.path.dirname(HERE)
sys.path.insert(0, BUNDLE)
import checks  # noqa: E402


def step(i, start, end):
    return {"name": f"step {i}", "start": start, "end": end, "kernels": None}


# Ten steps of 0.5 ms, one every millisecond.
STEPS = {"windows": [step(i, i * 1_000_000, i * 1_000_000 + 500_000) for i in range(10)]}


def report(kernels, blind_end=3_000_000, stop_ns=30_000):
    return {
        "window_ns": {"start": 2_500_000, "end": 8_700_000},
        "drops": {"gpu_blind": [{"pid": 9, "start_ns": 2_500_000, "end_ns": blind_end, "reason": "x"}]},
        "gpus": [{"kernels": {"count": kernels}, "unseen_ns": blind_end - 2_500_000,
                  "idle_by_cause_ns": {"startup": 0}}],
        "gpu_sources": [{"pid": 9, "kind": "cupti", "loaded_by": "ptrace",
                         "injection": {"longest_stop_ns": stop_ns, "took_ns": 3_000_000}}],
    }


class Judgements(unittest.TestCase):
    def test_kernels_per_step_skip_the_set_up_steps(self):
        spans = [[i * 1_000_000 + 10 + j, i * 1_000_000 + 20 + j] for i in range(10) for j in range(3 + (i == 0))]
        counts = checks.kernels_per_step(STEPS, {"connections": [{"kernel_spans": spans}]})
        self.assertEqual(counts, [3] * 8)
        self.assertTrue(checks.eval_steady(counts)[0])
        self.assertFalse(checks.eval_steady([3, 3, 4])[0])

    def test_every_whole_step_after_gpu_data_began(self):
        # Steps 3..8 lie whole in [3.0 ms, 8.7 ms]: 6 x 3 = 18, up to 24.
        for got, ok in ((17, False), (18, True), (24, True), (25, False)):
            self.assertEqual(checks.eval_attach_kernels(STEPS, report(got), 3)[0], ok, got)
        self.assertFalse(checks.eval_attach_kernels(STEPS, report(0), 0)[0])

    def test_the_time_before_is_unseen(self):
        self.assertTrue(checks.eval_attach_unseen(report(18))[0])
        r = report(18)
        r["gpus"][0]["unseen_ns"] = 0  # counted as idle instead
        self.assertFalse(checks.eval_attach_unseen(r)[0])
        r["drops"]["gpu_blind"] = []  # GPU data claimed from the start
        self.assertFalse(checks.eval_attach_unseen(r)[0])

    def test_the_source_is_the_injected_shim_with_a_short_stop(self):
        self.assertTrue(checks.eval_attach_source(9, report(18))[0])
        self.assertFalse(checks.eval_attach_source(10, report(18))[0])
        self.assertFalse(checks.eval_attach_source(9, report(18, stop_ns=checks.ATTACH_STOP_MAX_NS + 1))[0])
        r = report(18)
        r["gpu_sources"][0]["loaded_by"] = "uprobes"
        self.assertFalse(checks.eval_attach_source(9, r)[0])

    def test_losses_bit_for_bit(self):
        a = {"losses": [(1 / (i + 1)).hex() for i in range(5)]}
        self.assertTrue(checks.eval_same_losses(a, dict(a))[0])
        b = {"losses": list(a["losses"])}
        b["losses"][3] = (0.25 + 2 ** -50).hex()
        ok, figure = checks.eval_same_losses(a, b)
        self.assertFalse(ok)
        self.assertIn("step 3", figure)
        self.assertFalse(checks.eval_same_losses(a, {"losses": a["losses"][:4]})[0])


STAND_IN = textwrap.dedent("""\
    import os, sys, time
    sys.path.insert(0, %r)
    from _common import emit, now, spin, window
    steps = int(sys.argv[1])
    ready = sys.argv[2] if len(sys.argv) > 2 else None
    losses, windows = [], []
    for i in range(steps):
        if i == 30 and ready:
            with open(ready + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(ready + ".tmp", ready)
        t0 = now()
        spin(0.002)
        windows.append(window("step %%d" %% i, t0, now(), None))
        losses.append((1.0 / (i + 1)).hex())
        time.sleep(0.008)
    emit({"steps": steps, "losses": losses, "windows": windows})
    """) % os.path.join(BUNDLE, "workloads")


class Runner(unittest.TestCase):
    def test_attach_mid_flight(self):
        gapscope = os.environ.get("GAPSCOPE")
        if not gapscope:
            self.skipTest("GAPSCOPE (the gapscope binary) not set")
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "workloads"))
            with open(os.path.join(d, "workloads", "attach_train.py"), "w") as f:
                f.write(STAND_IN)
            checks.WORKLOADS, checks.GAPSCOPE = os.path.join(d, "workloads"), gapscope
            r = checks.Runner(os.path.join(d, "out"), 120)
            os.makedirs(r.out)
            bare = r.bare("attach_train", "attach_train.py", ["700"])
            truth, rep, a, pid = r.attach("attach_train", "attach_train.py", ["700"])
            self.assertEqual(a.rc, 0, a.stderr)
            self.assertIsNotNone(rep)
            # Attached after step 30 of 700 (~10 ms each), for ATTACH_SECONDS:
            # its window lies inside the loop, and the loop ran on to its end.
            # The loop outlasts attach's start-up (loading and verifying the
            # BPF programs: 0.4 s on a quiet 2-CPU machine, more under load;
            # when it took 1.3 s, 400 steps ended 27 ms before the window).
            first, last = truth["windows"][30]["start"], truth["windows"][-1]["end"]
            self.assertGreater(rep["window_ns"]["start"], first)
            self.assertLess(rep["window_ns"]["end"], last)
            span = rep["window_ns"]["end"] - rep["window_ns"]["start"]
            self.assertAlmostEqual(span / 1e9, checks.ATTACH_SECONDS, delta=0.5)
            self.assertEqual(rep["target"]["pid"], pid)
            self.assertTrue(checks.eval_same_losses(bare, truth)[0])
            # No GPU here: the check says so instead of passing.
            self.assertFalse(checks.eval_attach_source(pid, rep)[0])


if __name__ == "__main__":
    unittest.main()
