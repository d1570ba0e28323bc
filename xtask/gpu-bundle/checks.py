#!/usr/bin/env python3
"""gapscope's GPU proof: runs small PyTorch workloads whose kernels, times
and causes are known, first under gs-shim-listen (the CUPTI shim alone, no
eBPF), then, where eBPF works, under `gapscope run`, and checks what came
back against the workloads' own ground truth (kernel counts, CLOCK_MONOTONIC
windows, torch.cuda.Event timings, torch.profiler's own trace).

    checks.py [--out DIR] [--shim-only] [--only NAME[,NAME...]] [--budget SECS]

Prints the environment, one row per check (PASS / FAIL / SKIP and the
figure behind it) and writes results.json into DIR. Exit code 0 only when no
row FAILs. One scenario failing never stops the others, and nothing here
may end in a traceback: a crash is a FAIL row, its traceback in DIR."""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "workloads")
GAPSCOPE = os.path.join(HERE, "gapscope")
LISTEN = os.path.join(HERE, "gs-shim-listen")
SHIM = os.path.join(HERE, "libgapscope_cupti.so")
PY = sys.executable

# Thresholds.
LATE_NS = 1_000_000  # a kernel may end this long after its window's close
BUSY_TOLERANCE = 0.02  # kernel time vs torch.cuda.Event time
SLOWDOWN_LOOP_MAX = 1.10  # GPU-bound kernel loop, traced / bare
SLOWDOWN_LAUNCH_MAX = 1.50  # launch-bound loop (4 KiB adds), shim only
SLOWDOWN_JOB_MAX = 1.25  # the diagnosis workloads' loops under gapscope run
KINETO_LATE_US = 10e6  # a kernel this long after its launch call: wrong clock
ATTACH_STOP_MAX_NS = 100_000_000  # the longest the injection may hold a thread
ATTACH_SECONDS = 3  # how long gapscope attach records the training loop

# The kernel loop: N adds on a 1 GiB tensor (~0.5 ms each on an H200) and M
# launch-bound adds on 4 KiB.
LOOP_N, LAUNCH_M = 1000, 20000


class Missing(Exception):
    """A field the check needs is not in the report (yet)."""


class WorkloadFailed(Exception):
    pass


def field(obj, path):
    """obj["a"]["b"][0]... for path "a.b.0"; Missing when absent."""
    cur = obj
    for part in path.split("."):
        try:
            if isinstance(cur, list):
                cur = cur[int(part)]
            elif isinstance(cur, dict):
                cur = cur[part]
            else:
                raise KeyError(part)
        except (KeyError, IndexError, ValueError):
            raise Missing(path) from None
    return cur


def us(ns):
    return f"{ns / 1e3:+.0f} µs"


def ms(ns):
    return f"{ns / 1e6:.2f} ms"


# ------------------------------------------------------------------ rows


class Table:
    def __init__(self, out):
        self.rows = []
        self.out = out

    def add(self, scenario, name, status, figure):
        row = {"scenario": scenario, "name": name, "status": status, "figure": figure}
        self.rows.append(row)
        print(f"  {status}  {name}: {figure}", file=sys.stderr, flush=True)

    def check(self, scenario, name, fn):
        """fn() -> (ok, figure); ok None = SKIP. Never raises."""
        try:
            ok, figure = fn()
            status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        except Missing as e:
            status, figure = "SKIP", f"field {e} missing in report.json"
        except Exception as e:  # a check must never end the run
            status, figure = "FAIL", f"check crashed: {type(e).__name__}: {e}"
            log(self.out, f"{scenario}.check-crash.log", traceback.format_exc())
        self.add(scenario, name, status, figure)


def log(out, name, text):
    try:
        with open(os.path.join(out, name), "a") as f:
            f.write(text)
    except OSError:
        pass


# ------------------------------------------------------------------ running


class Proc:
    def __init__(self, rc, stdout, stderr, wall, timed_out):
        self.rc, self.stdout, self.stderr, self.wall, self.timed_out = rc, stdout, stderr, wall, timed_out


def run_proc(cmd, out, name, timeout, env=None):
    """Runs cmd in its own process group; kills the group on timeout. The
    output is kept in out/name.stdout and .stderr."""
    t = time.monotonic()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, errors="replace", start_new_session=True, env=env)
    except OSError as e:
        return Proc(None, "", f"cannot run {cmd[0]}: {e}", 0.0, False)
    timed_out = False
    try:
        so, se = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass
            try:
                so, se = p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                so, se = "", ""
    wall = time.monotonic() - t
    for ext, text in (("stdout", so), ("stderr", se)):
        log(out, f"{name}.{ext}", text or "")
    return Proc(p.returncode, so or "", se or "", wall, timed_out)


def tail(text, n=3):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-400:]


def truth_of(proc, name):
    if proc.timed_out:
        raise WorkloadFailed(f"{name} timed out after {proc.wall:.0f} s")
    if proc.rc != 0:
        raise WorkloadFailed(f"{name} exited {proc.rc}: {tail(proc.stderr)}")
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            v = json.loads(line)
            if isinstance(v, dict):
                return v
        except ValueError:
            continue
    raise WorkloadFailed(f"{name} printed no ground truth: {tail(proc.stderr)}")


def workload(script):
    return [PY, os.path.join(WORKLOADS, script)]


class Runner:
    def __init__(self, out, budget):
        self.out = out
        self.deadline = time.monotonic() + budget

    def left(self):
        return self.deadline - time.monotonic()

    def bare(self, name, script, args, timeout=120):
        p = run_proc(workload(script) + args, self.out, f"{name}.bare", timeout)
        return truth_of(p, f"{name} (bare)")

    def shim(self, name, script, args, timeout=120):
        summary_path = os.path.join(self.out, f"{name}.shim.json")
        try:
            os.unlink(summary_path)
        except OSError:
            pass
        cmd = [LISTEN, "--shim", SHIM, "--out", summary_path, "--kernels",
               "--timeout", str(timeout), "--"] + workload(script) + args
        p = run_proc(cmd, self.out, f"{name}.shim", timeout + 30)
        truth = truth_of(p, f"{name} (gs-shim-listen)")
        try:
            with open(summary_path) as f:
                summary = json.load(f)
        except (OSError, ValueError) as e:
            raise WorkloadFailed(f"{name}: no gs-shim-listen summary ({e}): {tail(p.stderr)}")
        return truth, summary

    def attach(self, name, script, args, timeout=180):
        """Starts the workload on its own and, once it has written its pid
        into the ready file (the last argument it gets), records it with
        `gapscope attach` for ATTACH_SECONDS. The workload's ground truth,
        the report (None when attach failed) and attach's Proc."""
        ready = os.path.join(self.out, f"{name}.ready")
        try:
            os.unlink(ready)
        except OSError:
            pass
        d = os.path.join(self.out, name)
        so_path, se_path = (os.path.join(self.out, f"{name}.attached.{x}") for x in ("stdout", "stderr"))
        with open(so_path, "w") as so, open(se_path, "w") as se:
            p = subprocess.Popen(workload(script) + args + [ready], stdout=so, stderr=se,
                                 start_new_session=True)
        t = time.monotonic()
        a = None
        try:
            while not os.path.exists(ready):
                if p.poll() is not None or time.monotonic() - t > 120:
                    raise WorkloadFailed(f"{name} never said it was training (exit {p.poll()})")
                time.sleep(0.05)
            a = run_proc([GAPSCOPE, "attach", "-q", "--no-exports", "--pid", str(p.pid),
                          "--duration", str(ATTACH_SECONDS), "-o", d], self.out, f"{name}.attach",
                         ATTACH_SECONDS + 120)
            p.wait(timeout=max(10, timeout - (time.monotonic() - t)))
        except subprocess.TimeoutExpired:
            pass
        finally:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
        with open(so_path) as so, open(se_path) as se:
            proc = Proc(p.returncode, so.read(), se.read(), time.monotonic() - t, False)
        truth = truth_of(proc, f"{name} (attached to)")
        rep = read_report(d, self.out, name) if a is not None and a.rc == 0 else None
        return truth, rep, a, p.pid

    def gapscope(self, name, script, args, timeout=180):
        d = os.path.join(self.out, name)
        cmd = [GAPSCOPE, "run", "-q", "--no-exports", "-o", d, "--"] + workload(script) + args
        p = run_proc(cmd, self.out, f"{name}.gapscope", timeout)
        truth = truth_of(p, f"{name} (gapscope run)")
        return truth, read_report(d, self.out, name)


def read_report(d, out, name):
    path = os.path.join(d, "report.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    p = run_proc([GAPSCOPE, "report", "--format", "json", d], out, f"{name}.report", 120)
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise WorkloadFailed(f"{name}: no report ({p.rc}): {tail(p.stderr)}")


# ------------------------------------------------------------------ evaluation
# Pure functions of (ground truth, summary or report): what the rows say.


def spans_of(summary):
    out = []
    for c in summary.get("connections", []):
        out.extend(tuple(s) for s in c.get("kernel_spans", []))
    return sorted(out)


def place(spans, windows):
    """Puts each kernel in the window its start falls in. A kernel belongs
    to window i when start in [w.start, min(w.end + LATE_NS, next.start));
    it is late when it ends after w.end + LATE_NS; outside when in none."""
    res = [{"name": w["name"], "expected": w["kernels"], "got": 0, "late": 0,
            "first": None, "last": None, "busy_ns": 0} for w in windows]
    outside = []
    for s, e in spans:
        for i, w in enumerate(windows):
            hi = float("inf") if w["end"] is None else w["end"] + LATE_NS
            if i + 1 < len(windows):
                hi = min(hi, windows[i + 1]["start"] - 1)
            if w["start"] <= s <= hi:
                r = res[i]
                r["got"] += 1
                r["busy_ns"] += max(0, e - s)
                if w["end"] is not None and e > w["end"] + LATE_NS:
                    r["late"] += 1
                r["first"] = s - w["start"] if r["first"] is None else min(r["first"], s - w["start"])
                if w["end"] is not None:
                    d = e - w["end"]
                    r["last"] = d if r["last"] is None else max(r["last"], d)
                break
        else:
            outside.append((s, e))
    return res, outside


def describe_outside(outside, windows):
    if not outside:
        return ""
    s, _ = outside[0]
    ref = windows[0]["start"]
    return f"; {len(outside)} outside every window (first at {(s - ref) / 1e6:+.3f} ms from the first window's start)"


def eval_clock(truth, summary):
    """Every recorded kernel inside the CLOCK_MONOTONIC window of the code
    that launched it (start >= window start, end <= window end + 1 ms)."""
    windows = truth["windows"]
    spans = spans_of(summary)
    if not spans:
        return False, "no kernel recorded"
    res, outside = place(spans, windows)
    bad = summary.get("totals", {}).get("bad_kernel_times", 0)
    late = sum(r["late"] for r in res)
    empty = [r["name"] for r in res if r["expected"] > 0 and r["got"] == 0]
    parts = []
    for r in res:
        if r["got"]:
            last = f", last end {us(r['last'])} from its close" if r["last"] is not None else ""
            parts.append(f"{r['name']}: first start {us(r['first'])} after its open{last}")
    figure = "; ".join(parts) + describe_outside(outside, windows)
    if late:
        figure += f"; {late} end more than 1 ms after their window"
    if bad:
        figure += f"; {bad} with zero/backwards times"
    if empty:
        figure += f"; nothing in {', '.join(empty)}"
    return not outside and not late and not bad and not empty, figure


def eval_counts(truth, summary):
    windows = truth["windows"]
    res, outside = place(spans_of(summary), windows)
    got = summary.get("totals", {}).get("kernels", 0)
    per = ", ".join(f"{r['name']} {r['got']}/{r['expected']}" for r in res)
    ok = got == truth["kernels"] and all(r["got"] == r["expected"] for r in res) and not outside
    return ok, f"{got} recorded / {truth['kernels']} launched ({per})"


def eval_busy(truth, summary, window="loop"):
    res, _ = place(spans_of(summary), truth["windows"])
    r = next(r for r in res if r["name"] == window)
    ev = truth["event_ms"] * 1e6
    err = (r["busy_ns"] - ev) / ev
    return abs(err) <= BUSY_TOLERANCE, (
        f"{r['got']} kernels {ms(r['busy_ns'])} vs events {ms(ev)} ({err * 100:+.2f}%, "
        f"{r['busy_ns'] / max(r['got'], 1) / 1e3:.0f} µs per kernel)")


def eval_hello(summary):
    conns = summary.get("connections", [])
    hellos = [c["hello"] for c in conns if c.get("hello")]
    errors = [c["error"] for c in conns if c.get("error")]
    if not hellos:
        return False, f"no Hello from {len(conns)} connection(s); exit {summary.get('exit_code')}" + (
            f"; protocol error {errors[0]}" if errors else "")
    h = hellos[0]
    infos = summary.get("totals", {}).get("infos", [])
    figure = (f"{len(hellos)} process(es); CUPTI {h.get('cupti_version')}, driver {h.get('driver_version')}, "
              f"clock {h.get('clock')}, {h.get('source')}; {len(infos)} note(s)")
    if errors:
        figure += f"; protocol error: {errors[0]}"
    return h.get("cupti_version", 0) > 0 and not errors, figure


def unknown_frames(summary):
    """(kind, text) of every frame gs-shim-listen did not know by name."""
    out = []
    for c in summary.get("connections", []):
        for text in c.get("unknown_frame_texts", []):
            out.append((re.match(r"\w*", text).group(0), text))
    return out


def first_int(text, key):
    m = re.search(key + r":\s*(\d+)", text)
    return int(m.group(1)) if m else None


def skipped_incomplete(summary):
    n = 0
    for c in summary.get("connections", []):
        last = None
        for text in c.get("unknown_frame_texts", []):
            if text.startswith("Skipped"):
                last = first_int(text, "incomplete") or 0
        n += last or 0
    return n


def losses(summary):
    t = summary.get("totals", {})
    return (t.get("lost_records", 0) + t.get("dropped_cupti", 0) + t.get("dropped_shim", 0),
            skipped_incomplete(summary))


def eval_dropped(summary):
    lost, incomplete = losses(summary)
    t = summary.get("totals", {})
    return lost == 0, (f"dropped cupti {t.get('dropped_cupti', 0)}, shim {t.get('dropped_shim', 0)}, "
                       f"lost {t.get('lost_records', 0)}; incomplete skipped {incomplete}")


BLIND_WORDS = re.compile(r"blind|cupti client|another (cupti|profiler|tool)|subscriber|took (cupti|over)|kineto|torch\.profiler", re.I)


def blind_spans(summary):
    """(start, end or None, reason) of the spans the shim said it could not
    see: Blind/Sighted frames (any frame kind named *blind* opens one, the
    next frame of another unknown kind with a time closes it)."""
    spans = []
    for c in summary.get("connections", []):
        open_ = None
        for kind, text in ((re.match(r"\w*", t).group(0), t) for t in c.get("unknown_frame_texts", [])):
            if "blind" in kind.lower():
                open_ = (first_int(text, "start") or first_int(text, r"\w+") or 0, text)
            elif open_ and re.search(r"sight|see|resum|unblind", kind, re.I):
                spans.append((open_[0], first_int(text, r"\w+"), open_[1]))
                open_ = None
        if open_:
            spans.append((open_[0], None, open_[1]))
    return spans


def eval_exit(truth, summary):
    launched = truth["kernels"]
    t = summary.get("totals", {})
    recorded = t.get("kernels", 0) - t.get("bad_kernel_times", 0)
    res, outside = place(spans_of(summary), truth["windows"])
    goodbye = t.get("goodbyes", 0) > 0
    lost, incomplete = losses(summary)
    reported = lost + incomplete + t.get("bad_kernel_times", 0)
    missing = launched - recorded
    if not any(c.get("hello", {}) and c["hello"].get("cupti_version", 0) > 0
               for c in summary.get("connections", [])):
        return False, f"CUPTI never attached (no Hello with a CUPTI version); {recorded} of {launched} recorded"
    fig = (f"{recorded} recorded / {launched} launched ({truth.get('queued_kernels')} queued at exit, "
           f"exit via {truth.get('exit')}); lost/dropped/incomplete reported {reported}; "
           f"Goodbye {'yes' if goodbye else 'no'}")
    if outside:
        return False, fig + describe_outside(outside, truth["windows"])
    if missing == 0:
        return True, fig
    if missing < 0:
        return False, fig + "; more kernels than launched"
    if reported >= missing:
        return True, fig + "; the missing ones are reported"
    if truth.get("exit") == "os_exit" and not goodbye:
        return None, fig + "; the stream ended without Goodbye, so a listener knows its tail is cut: marking it lost is gapscope run's part"
    return False, fig + f"; {missing - reported} silently missing"


def kineto_kernels(trace_path):
    """(kernels, kernels checked against their launch call, of which on a
    different clock) in torch.profiler's exported chrome trace."""
    with open(trace_path) as f:
        t = json.load(f)
    events = t.get("traceEvents", []) if isinstance(t, dict) else t
    launches = {}
    kernels = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        corr = (e.get("args") or {}).get("correlation")
        if cat == "kernel":
            kernels.append((float(e.get("ts", 0)), corr))
        elif cat in ("cuda_runtime", "cuda_driver") and corr is not None:
            launches[corr] = float(e.get("ts", 0))
    checked = wrong = 0
    for ts, corr in kernels:
        if corr in launches:
            checked += 1
            d = ts - launches[corr]
            if d < -1.0 or d > KINETO_LATE_US:
                wrong += 1
    return len(kernels), checked, wrong


def eval_kineto(truth, trace_path):
    if not os.path.exists(trace_path):
        return False, f"torch.profiler wrote no trace ({trace_path})"
    n, checked, wrong = kineto_kernels(trace_path)
    want = truth["profiler_kernels"]
    return n == want, f"{n} kernels in its chrome trace / {want} launched while it ran"


def eval_kineto_clock(trace_path):
    if not os.path.exists(trace_path):
        return False, "no trace"
    n, checked, wrong = kineto_kernels(trace_path)
    if checked == 0:
        return False, f"no kernel of {n} matched to its launch call (correlation)"
    return wrong == 0, f"{wrong} of {checked} kernels before their launch call or > 10 s after it (its own clock)"


def eval_profiler_shim(truth, summary):
    """Every phase's kernels recorded, or inside a blind span the shim
    reported: never silently missing."""
    res, outside = place(spans_of(summary), truth["windows"])
    blind = blind_spans(summary)

    def covered(w):
        return any(b[0] <= (w["end"] or float("inf")) and (b[1] is None or b[1] >= w["start"]) for b in blind)
    per = ", ".join(f"{r['name']} {r['got']}/{r['expected']}" for r in res)
    fig = f"{per}; blind spans reported: {len(blind)}"
    if outside:
        return False, fig + describe_outside(outside, truth["windows"])
    silent = [r["name"] for r, w in zip(res, truth["windows"]) if r["got"] != r["expected"] and not covered(w)]
    if silent:
        return False, fig + f"; silently missing in {', '.join(silent)} (would read as idle)"
    unseen = [r["name"] for r in res if r["got"] != r["expected"]]
    return True, fig + (f"; {', '.join(unseen)} inside the reported span" if unseen else "; saw everything")


def eval_profiler_recovers(truth, summary):
    res, _ = place(spans_of(summary), truth["windows"])
    after = next(r for r in res if r["name"] == "after")
    sighted = sum(1 for b in blind_spans(summary) if b[1] is not None)
    # Kineto keeps CUPTI's subscriber slot after its trace stops, and the
    # shim never takes CUPTI back from a client that holds it: staying blind
    # to the end is the documented outcome (SKIP, with what was seen), not a
    # failure. Seeing again means that client gave CUPTI back.
    figure = (f"after torch.profiler stopped: {after['got']}/{after['expected']} kernels; "
              f"blind spans closed (Sighted): {sighted}")
    if after["got"] == after["expected"]:
        return True, figure
    if sighted == 0 and after["got"] == 0:
        return None, figure + " (still held by torch.profiler: stays blind, as documented)"
    return False, figure


def report_strings(obj, out):
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(("key", str(k)))
            report_strings(v, out)
    elif isinstance(obj, list):
        for v in obj:
            report_strings(v, out)
    elif isinstance(obj, str):
        out.append(("str", obj))
    return out


def blind_evidence(obj, out):
    """Non-empty values of keys naming blind or unseen spans, anywhere."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if re.search(r"blind|unseen", str(k), re.I) and v not in (None, 0, [], {}, ""):
                out.append(f"{k}={json.dumps(v)[:100]}")
            blind_evidence(v, out)
    elif isinstance(obj, list):
        for v in obj:
            blind_evidence(v, out)
    return out


def eval_profiler_report(truth, rep):
    g = field(rep, "gpus.0")
    count = field(g, "kernels.count")
    launched = truth["kernels"]
    if count == launched:
        return True, f"{count} / {launched} kernels: saw everything"
    evidence = blind_evidence(rep, []) + [n for n in rep.get("notes", []) if BLIND_WORDS.search(n)]
    fig = f"{count} / {launched} kernels"
    if evidence:
        return True, fig + f"; the unseen span is reported ({evidence[0][:160]})"
    return False, fig + "; no note or field about another CUPTI client: the span reads as idle"


def eval_nvtx_shim(truth, summary):
    prefix = truth["range_prefix"]
    names = set()
    first = last = None
    for c in summary.get("connections", []):
        for m in ("marker_names", "unknown_record_names"):
            names.update(n for n in c.get(m, {}) if n.startswith(prefix))
        spans = [c.get("marker_span")] + list((c.get("unknown_record_spans") or {}).values())
        for s in spans:
            if s:
                first = s["first"] if first is None else min(first, s["first"])
                last = s["last"] if last is None else max(last, s["last"])
    kinds = {}
    for c in summary.get("connections", []):
        kinds.update({k: v for k, v in c.get("records", {}).items() if k not in ("Kernel", "Api", "Sync", "Memcpy", "Memset", "Device")})
    fig = f"{len(names)} of {truth['ranges']} ranges named {prefix}* arrived (records: {kinds or 'none'})"
    ok = len(names) == truth["ranges"]
    if first is not None:
        t0, t1 = truth["ranges_ns"]
        inside = t0 <= first and last <= t1 + LATE_NS
        fig += f"; times {us(first - t0)} after the first push, {us(last - t1)} from the end"
        ok = ok and inside
    return ok, fig


def eval_nvtx_report(truth, rep):
    prefix = truth["range_prefix"]
    strings = report_strings(rep, [])
    names = {s for k, s in strings if k == "str" and s.startswith(prefix)}
    if not names:
        if not any(("nvtx" in s.lower() or "range" in s.lower()) for k, s in strings if k == "key"):
            raise Missing("nvtx ranges (no key naming nvtx or ranges)")
    return len(names) == truth["ranges"], f"{len(names)} of {truth['ranges']} range names in report.json"


def top_cause(g):
    causes = {k: v for k, v in field(g, "idle_by_cause_ns").items()
              if k not in ("startup", "teardown", "unattributed")}
    if not causes:
        raise Missing("idle_by_cause_ns")
    top = max(causes, key=causes.get)
    return top, causes[top], sum(causes.values())


def eval_cause(truth, rep):
    want = truth["expected_cause"]
    g = field(rep, "gpus.0")
    top, ns, removable = top_cause(g)
    idle = field(g, "idle_ns")
    recs = field(rep, "recommendations")
    named = [r.get("cause", "") for r in recs]
    rec = any(c.startswith(want) for c in named)
    fig = (f"top removable idle cause {top} {ms(ns)} ({100 * ns / max(idle, 1):.0f}% of idle), "
           f"recommendations: {', '.join(named) or 'none'}")
    verdict = rep.get("verdict")
    if verdict:
        fig += f"; verdict: {verdict[:140]}"
    return top.startswith(want) and rec, fig


def eval_copies(truth, rep):
    copies = field(rep, "gpus.0.copies")
    key = next((k for k in copies if k.lower().startswith("htod") and "pageable" in k.lower()), None)
    if key is None:
        return False, f"no HtoD pageable copies (copies: {', '.join(copies) or 'none'})"
    c = copies[key]
    want_bytes = truth["copies"] * truth["bytes_per_copy"]
    return (c["count"] == truth["copies"] and c["bytes"] == want_bytes,
            f"{key}: {c['count']} copies / {truth['copies']}, {c['bytes']} bytes / {want_bytes}")


def eval_report_windows(truth, rep):
    """Without per-kernel times: first and last GPU activity (window start +
    startup idle, window end - teardown idle) against the workload's
    CLOCK_MONOTONIC windows."""
    w = truth["windows"]
    start, end = field(rep, "window_ns.start"), field(rep, "window_ns.end")
    idle = field(rep, "gpus.0.idle_by_cause_ns")
    first = start + field(idle, "startup")
    last = end - field(idle, "teardown")
    ok_first = w[0]["start"] <= first <= w[0]["end"]
    ok_last = w[-1]["start"] <= last <= w[-1]["end"] + LATE_NS
    return ok_first and ok_last, (f"first GPU activity {us(first - w[0]['start'])} after the warm-up's open, "
                                  f"last {us(last - w[-1]['end'])} from the loop's close")


def eval_report_busy(truth, rep):
    busy = field(rep, "gpus.0.busy_ns")
    ev = (truth["event_ms"] + truth["warmup_ms"]) * 1e6
    err = (busy - ev) / ev
    return abs(err) <= BUSY_TOLERANCE, f"busy {ms(busy)} vs events {ms(ev)} (loop + warm-up, {err * 100:+.2f}%)"


def eval_slowdown(traced_ns, bare_ns, limit, what):
    r = traced_ns / bare_ns
    return r <= limit, f"{r:.3f}x ({what}: {ms(traced_ns)} traced vs {ms(bare_ns)} bare; limit {limit:.2f}x)"


def kernels_per_step(truth, summary):
    """Kernels each step ran, from the shim's spans placed in the steps'
    windows; the first two steps aside (lazy set-up: optimizer state)."""
    res, _ = place(spans_of(summary), truth["windows"])
    return [r["got"] for r in res[2:]]


def eval_steady(counts):
    if not counts:
        return False, "no steps"
    lo, hi = min(counts), max(counts)
    return lo == hi and lo > 0, (f"{lo} kernels in each of {len(counts)} steps" if lo == hi
                                 else f"{lo} to {hi} kernels per step over {len(counts)} steps")


def seen_from(rep):
    """When this recording's GPU data begins: the window's start, or the end
    of the blind span at its start (kernels queued before the shim began
    recording run unrecorded)."""
    seen = field(rep, "window_ns.start")
    for b in rep.get("drops", {}).get("gpu_blind", []):
        if b["start_ns"] <= seen:
            seen = max(seen, b["end_ns"])
    return seen


def eval_attach_source(pid, rep):
    ours = [s for s in field(rep, "gpu_sources") if s.get("pid") == pid]
    if not ours:
        got = [(s.get("pid"), s.get("loaded_by")) for s in rep.get("gpu_sources", [])]
        return False, f"no GPU source for pid {pid} (sources: {got})"
    s = ours[0]
    inj = s.get("injection") or {}
    stop, took = inj.get("longest_stop_ns", 0), inj.get("took_ns", 0)
    ok = s.get("loaded_by") == "ptrace" and s.get("kind") == "cupti" and 0 < stop <= ATTACH_STOP_MAX_NS
    return ok, (f"kind {s.get('kind')}, loaded_by {s.get('loaded_by')}; its thread held {stop / 1e3:.0f} µs "
                f"at most (limit {ATTACH_STOP_MAX_NS / 1e6:.0f} ms), the shim loaded in {ms(took)}")


def eval_attach_kernels(truth, rep, k):
    """Every kernel of the steps after GPU data began: k per whole step
    inside it, and at most two steps' more (the steps cut by its ends)."""
    w0, w1 = field(rep, "window_ns.start"), field(rep, "window_ns.end")
    seen = seen_from(rep)
    steps = truth["windows"]
    inside = [i for i, w in enumerate(steps) if w["start"] >= seen and w["end"] <= w1]
    got = field(rep, "gpus.0.kernels.count")
    lo, hi = k * len(inside), k * (len(inside) + 2)
    where = f"steps {inside[0]}-{inside[-1]}" if inside else "no whole step"
    return bool(inside) and k > 0 and lo <= got <= hi, (
        f"{got} kernels recorded; GPU data from {ms(seen - w0)} into the recording, {where} whole after it: "
        f"{len(inside)} x {k} = {lo} (up to {hi} with the two steps its ends cut)")


def eval_attach_unseen(rep):
    """The time before GPU data began is unseen, never idle of a cause."""
    w0 = field(rep, "window_ns.start")
    seen = seen_from(rep)
    unseen = field(rep, "gpus.0.unseen_ns")
    startup = field(rep, "gpus.0.idle_by_cause_ns").get("startup", 0)
    return seen > w0 and unseen >= seen - w0, (
        f"GPU data from {ms(seen - w0)} into the recording; unseen {ms(unseen)}, start-up idle {ms(startup)}")


def eval_same_losses(bare, truth):
    a, b = bare["losses"], truth["losses"]
    if len(a) != len(b):
        return False, f"{len(b)} steps attached vs {len(a)} unattached"
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if diff:
        i = diff[0]
        return False, (f"{len(diff)} of {len(a)} losses differ; first at step {i}: "
                       f"{float.fromhex(a[i])!r} unattached vs {float.fromhex(b[i])!r} attached")
    return True, f"all {len(a)} losses identical, bit for bit (last {float.fromhex(a[-1]):.6g})"


def eval_uuid(rep):
    """The UUID the shim asked the driver for, against nvidia-smi's list."""
    got = field(rep, "gpus.0.uuid")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"nvidia-smi: {e}"
    listed = [l.strip() for l in out.splitlines() if l.strip()]
    return got in listed, f"{got} ({'listed' if got in listed else 'not among ' + ', '.join(listed)})"


def eval_report_drops(rep):
    d = field(rep, "drops.gpu_records")
    lossy = rep.get("drops", {}).get("lossy_windows_ns", [])
    return d == 0, f"{d} GPU records dropped, {len(lossy)} lossy window(s)"


def eval_exit_report(truth, rep):
    launched = truth["kernels"]
    # No GPU in the report: nothing at all arrived.
    count = field(rep, "gpus.0.kernels.count") if field(rep, "gpus") else 0
    dropped = field(rep, "drops.gpu_records")
    lossy = rep.get("drops", {}).get("lossy_windows_ns", [])
    q0 = truth["windows"][-1]["start"]
    tail = [w for w in lossy if w.get("end", 0) >= q0]
    notes = [n for n in rep.get("notes", []) if re.search(r"lost|goodbye|incomplete|without", n, re.I)]
    missing = launched - count
    fig = (f"{count} / {launched} kernels (exit via {truth.get('exit')}); GPU records dropped {dropped}, "
           f"lossy windows over the queued kernels {len(tail)}")
    if missing == 0:
        return True, fig
    if missing < 0:
        return False, fig + "; more kernels than launched"
    unseen = (rep.get("gpus") or [{}])[0].get("unseen_ns", 0)
    if unseen:
        fig += f", unseen {ms(unseen)}"
    if dropped >= missing or tail or unseen:
        return True, fig + "; the missing ones are reported as lost"
    if notes:
        return True, fig + f"; noted: {notes[0][:120]}"
    return False, fig + f"; {missing} silently missing (teardown idle instead)"


# ------------------------------------------------------------------ environment


TORCH_PROBE = r"""
import json, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import importlib.metadata as md
    seen = {}
    for d in md.distributions():
        n = (d.metadata["Name"] or "")
        l = n.lower()
        if "cupti" in l or l.startswith(("nvidia-cu13", "nvidia-cuda-runtime", "nvidia-nvtx")) or l == "torch":
            seen[l] = {"name": n, "version": d.version, "location": str(d.locate_file(""))}
    out["distributions"] = sorted(seen.values(), key=lambda d: d["name"].lower())
except Exception as e:
    out["distributions_error"] = repr(e)
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, torch_file=torch.__file__)
    maps = open("/proc/self/maps").read().splitlines()
    out["libcupti_mapped"] = sorted({l.split()[-1] for l in maps if "libcupti" in l})
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        out["device"] = torch.cuda.get_device_name(0)
except Exception as e:
    out["torch_error"] = repr(e)
print(json.dumps(out))
"""


def sh(cmd, timeout=30):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
        return p.returncode, p.stdout, p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "", str(e)


def version_tuple(s):
    return tuple(int(x) for x in re.findall(r"\d+", s))


def environment(out, bundle):
    env = {"bundle": bundle}
    lines = []
    rc, so, se = sh(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"])
    env["nvidia_smi"] = so.strip() if rc == 0 else f"failed: {tail(se)}"
    lines.append(f"GPU / driver     {env['nvidia_smi']}")
    rc, so, se = sh([PY, "-c", TORCH_PROBE], timeout=120)
    try:
        t = json.loads(so.strip().splitlines()[-1])
    except (ValueError, IndexError):
        t = {"probe_error": tail(se)}
    env["python"] = t
    lines.append(f"python           {PY} ({t.get('python_version', '?')})")
    lines.append(f"torch            {t.get('torch', t.get('torch_error', t.get('probe_error')))}, "
                 f"CUDA {t.get('cuda')}, {t.get('torch_file')}")
    lines.append(f"device           {t.get('device', '-')} (torch.cuda.is_available: {t.get('cuda_available')})")
    dists = t.get("distributions", [])
    cupti = [d for d in dists if "cupti" in d["name"].lower() or d["name"].lower().startswith("nvidia-cu13")]
    # pip show of what exists (pip may be missing in a venv: then the metadata above).
    if cupti:
        rc, so, _ = sh([PY, "-m", "pip", "show"] + [d["name"] for d in cupti], timeout=60)
        env["pip_show"] = so if rc == 0 else None
        for d in cupti:
            lines.append(f"CUPTI wheel      {d['name']}=={d['version']} ({d['location']})")
    else:
        lines.append("CUPTI wheel      none installed (nvidia-cuda-cupti*, nvidia-cu13*): the shim uses "
                     "a libcupti from CUDA_HOME or the loader path")
    lines.append(f"libcupti mapped  {', '.join(t.get('libcupti_mapped', [])) or 'none after import torch'}")
    rc, so, se = sh(["ldd", "--version"])
    first = (so or se).strip().splitlines()[0] if (so or se).strip() else "unknown"
    m = re.search(r"(\d+\.\d+)\s*$", first)
    glibc = m.group(1) if m else None
    floor = bundle.get("glibc_floor")
    env["glibc"], env["glibc_floor"] = glibc, floor
    verdict = ""
    if glibc and floor:
        below = version_tuple(glibc) < version_tuple(floor)
        env["glibc_below_floor"] = below
        verdict = f"BELOW the bundle's floor {floor}: its binaries will not load" if below else f"ok (bundle needs {floor})"
    lines.append(f"glibc            {glibc or first} {verdict}")
    btf = os.path.exists("/sys/kernel/btf/vmlinux")
    env["btf"] = btf
    lines.append(f"BTF              {'present' if btf else 'MISSING'} (/sys/kernel/btf/vmlinux); kernel {os.uname().release}")
    status = {}
    try:
        with open("/proc/self/status") as f:
            for l in f:
                k, _, v = l.partition(":")
                status[k] = v.strip()
    except OSError:
        pass
    cap = int(status.get("CapEff", "0"), 16)
    caps = {name: bool(cap >> bit & 1) for name, bit in (("CAP_SYS_ADMIN", 21), ("CAP_PERFMON", 38), ("CAP_BPF", 39))}
    env["root"] = os.geteuid() == 0
    env["caps"] = caps
    lines.append(f"root             {'yes' if env['root'] else 'no'} (euid {os.geteuid()}); "
                 + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in caps.items()))
    nspid = status.get("NSpid", "")
    env["nspid"] = nspid
    env["nested_pidns"] = len(nspid.split()) > 1
    lines.append(f"NSpid            {nspid or '?'}" + (
        "  <- nested PID namespace: eBPF sees other pids than the process does"
        if env["nested_pidns"] else " (not in a nested PID namespace)"))
    for k in ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "GAPSCOPE_CUPTI", "CUDA_MODULE_LOADING"):
        if os.environ.get(k):
            lines.append(f"{k:<17}{os.environ[k]}")
            env[k] = os.environ[k]
    return env, lines


def ebpf_probe(out, env):
    """Whether `gapscope run` can record here: the real thing, on `true`."""
    if not env.get("btf"):
        return False, "no BTF (/sys/kernel/btf/vmlinux)"
    caps = env.get("caps", {})
    if not (env.get("root") or caps.get("CAP_SYS_ADMIN") or (caps.get("CAP_BPF") and caps.get("CAP_PERFMON"))):
        return False, "neither root nor CAP_BPF + CAP_PERFMON"
    p = run_proc([GAPSCOPE, "run", "-q", "--no-gpu", "--no-exports", "-o",
                  os.path.join(out, "ebpf-probe"), "--", "true"], out, "ebpf-probe", 90)
    if p.rc == 0:
        return True, "gapscope run works"
    return False, f"gapscope run failed ({'timed out' if p.timed_out else p.rc}): {tail(p.stderr, 2)}"


# ------------------------------------------------------------------ scenarios


def shim_scenarios(t, r, ctx):
    """The CUPTI path alone, through gs-shim-listen."""

    def kernel_count():
        bare = r.bare("kernel_count", "kernel_count.py", [str(LOOP_N), str(LAUNCH_M)])
        ctx["bare"] = bare
        truth, s = r.shim("kernel_count", "kernel_count.py", [str(LOOP_N), str(LAUNCH_M)])
        ctx["shim_summaries"]["kernel_count"] = s
        t.check("shim", "shim: Hello (CUPTI attached)", lambda: eval_hello(s))
        t.check("shim", "clocks: every kernel inside its CLOCK_MONOTONIC window", lambda: eval_clock(truth, s))
        t.check("shim", "every kernel recorded (1 warm-up + loop + launch-bound)", lambda: eval_counts(truth, s))
        t.check("shim", "busy within 2% of torch.cuda.Event (1 GiB adds)", lambda: eval_busy(truth, s))
        t.check("shim", "slowdown, kernel loop (shim)", lambda: eval_slowdown(
            truth["loop_wall_ns"], bare["loop_wall_ns"], SLOWDOWN_LOOP_MAX, f"{LOOP_N} adds of 1 GiB"))
        t.check("shim", "slowdown, launch-bound loop (shim)", lambda: eval_slowdown(
            truth["launch_wall_ns"], bare["launch_wall_ns"], SLOWDOWN_LAUNCH_MAX, f"{LAUNCH_M} adds of 4 KiB"))

    def exits():
        for how in ("exit", "os_exit"):
            name = f"exit_nosync_{how}"
            try:
                truth, s = r.shim(name, "exit_nosync.py", ["300", how])
            except WorkloadFailed as e:
                t.add("shim", f"exit without synchronize ({how}, shim)", "FAIL", str(e))
                continue
            ctx["shim_summaries"][name] = s
            t.check("shim", f"exit without synchronize ({how}, shim): recorded or reported lost",
                    lambda: eval_exit(truth, s))

    def profiler():
        trace = os.path.join(r.out, "torch_profiler.shim.trace.json")
        truth, s = r.shim("torch_profiler", "torch_profiler.py", [trace])
        ctx["shim_summaries"]["torch_profiler"] = s
        t.check("shim", "torch.profiler (shim in): its own trace complete", lambda: eval_kineto(truth, trace))
        t.check("shim", "torch.profiler (shim in): its kernels after their launch calls", lambda: eval_kineto_clock(trace))
        t.check("shim", "torch.profiler: every kernel recorded or inside a reported blind span",
                lambda: eval_profiler_shim(truth, s))
        t.check("shim", "torch.profiler: the shim sees again after it stops", lambda: eval_profiler_recovers(truth, s))

    def nvtx():
        truth, s = r.shim("nvtx", "nvtx_ranges.py", [])
        ctx["shim_summaries"]["nvtx"] = s
        t.check("shim", "NVTX ranges arrive (shim), on the CPU clock", lambda: eval_nvtx_shim(truth, s))
        t.check("shim", "NVTX workload: every kernel recorded", lambda: eval_counts(truth, s))

    def graph():
        truth, s = r.shim("cuda_graph", "cuda_graph.py", [])
        ctx["shim_summaries"]["cuda_graph"] = s
        t.check("shim", "CUDA graph: every replayed kernel recorded", lambda: eval_counts(truth, s))
        t.check("shim", "CUDA graph: kernels inside their windows", lambda: eval_clock(truth, s))

    return [("kernel_count", kernel_count), ("exit_nosync", exits), ("torch_profiler", profiler),
            ("nvtx", nvtx), ("cuda_graph", graph)]


def gapscope_scenarios(t, r, ctx):
    """The same workloads, and the diagnosis ones, under `gapscope run`."""
    pidns = " (nested PID namespace: see the environment)" if ctx["env"].get("nested_pidns") else ""

    def kernel_count():
        truth, rep = r.gapscope("kernel_count", "kernel_count.py", [str(LOOP_N), "0"])
        ctx["reports"]["kernel_count"] = rep

        def seen():
            g = field(rep, "gpus")
            if not g:
                return False, "no GPU in the report"
            src = (rep.get("gpu_sources") or [{}])[0]
            return g[0].get("source") == "cupti", (
                f"{len(g)} GPU(s), source {g[0].get('source')}; clock {src.get('clock')}, "
                f"CUPTI {src.get('cupti_version')}, driver {src.get('driver_version')}")
        t.check("gapscope", "gapscope: GPU seen through CUPTI", seen)
        t.check("gapscope", "gapscope: every kernel recorded (1 warm-up + loop)", lambda: (
            field(rep, "gpus.0.kernels.count") == truth["kernels"],
            f"{field(rep, 'gpus.0.kernels.count')} recorded / {truth['kernels']} launched"))
        t.check("gapscope", "gapscope: first/last GPU activity inside the CLOCK_MONOTONIC windows",
                lambda: eval_report_windows(truth, rep))
        t.check("gapscope", "gapscope: busy within 2% of torch.cuda.Event", lambda: eval_report_busy(truth, rep))
        def partition():
            g = field(rep, "gpus.0")
            busy, idle, alloc = field(g, "busy_ns"), field(g, "idle_ns"), field(g, "allocated_ns")
            unseen = g.get("unseen_ns", 0)
            return busy + idle + unseen == alloc, f"{busy} + {idle} + unseen {unseen} = {alloc}"
        t.check("gapscope", "gapscope: busy + idle + unseen = allocated", partition)
        t.check("gapscope", "gapscope: the GPU's UUID is one nvidia-smi lists", lambda: eval_uuid(rep))

        def launch_cpu():
            cc = field(rep, "gpus.0.clock_check")
            return (field(cc, "launches_checked") > 0 and field(cc, "launches_while_off_cpu") == 0
                    and field(cc, "kernels_before_launch") == 0,
                    f"{cc['kernels_before_launch']} of {cc['kernels_checked']} kernels before their launch call; "
                    f"{cc['launches_while_off_cpu']} of {cc['launches_checked']} launch calls while eBPF had "
                    f"the thread off-CPU{pidns}")
        t.check("gapscope", "gapscope: launch calls on-CPU in eBPF's timeline", launch_cpu)
        bare = ctx.get("bare")
        if bare:
            t.check("gapscope", "slowdown, kernel loop (gapscope run)", lambda: eval_slowdown(
                truth["loop_wall_ns"], bare["loop_wall_ns"], SLOWDOWN_LOOP_MAX, f"{LOOP_N} adds of 1 GiB"))

    def attach():
        """gapscope attach to a PyTorch training loop mid-flight: the shim
        injected with ptrace, every kernel after it recorded, the losses
        those of an unattached run."""
        steps = ["400"]
        bare = r.bare("attach_train", "attach_train.py", steps)
        k_truth, s = r.shim("attach_train", "attach_train.py", ["60"])
        ctx["shim_summaries"]["attach_train"] = s
        counts = kernels_per_step(k_truth, s)
        t.check("gapscope", "attach: kernels per step constant (shim run)", lambda: eval_steady(counts))
        truth, rep, a, pid = r.attach("attach_train", "attach_train.py", steps)
        if rep is None:
            why = "no attach" if a is None else f"exit {a.rc}: {tail(a.stderr)}"
            t.add("gapscope", "attach: gapscope attach mid-flight", "FAIL", why)
        else:
            ctx["reports"]["attach_train"] = rep
            t.check("gapscope", "attach: shim injected with ptrace, stop short",
                    lambda: eval_attach_source(pid, rep))
            t.check("gapscope", "attach: every kernel after GPU data began recorded",
                    lambda: eval_attach_kernels(truth, rep, min(counts) if counts else 0))
            t.check("gapscope", "attach: the time before it unseen, not idle", lambda: eval_attach_unseen(rep))
        t.check("gapscope", "attach: losses identical to an unattached run", lambda: eval_same_losses(bare, truth))

    def diagnosis(name, script, args, label, timeout=180):
        def go():
            bare = r.bare(name, script, args, timeout)
            truth, rep = r.gapscope(name, script, args, timeout)
            ctx["reports"][name] = rep
            want = truth["expected_cause"]
            want = want + "*" if want.endswith(".") else want
            t.check("gapscope", f"{label}: cause {want} named", lambda: eval_cause(truth, rep))
            if name == "pageable_copy":
                t.check("gapscope", "pageable copies recorded as HtoD pageable (count, bytes)",
                        lambda: eval_copies(truth, rep))
            t.check("gapscope", f"slowdown, {label} (gapscope run)", lambda: eval_slowdown(
                truth["loop_wall_ns"], bare["loop_wall_ns"], SLOWDOWN_JOB_MAX, "its loop"))
        return go

    def prepare_data():
        p = run_proc(workload("dataloader_train.py") + ["--prepare"], r.out, "dataloader.prepare", 120)
        if p.rc != 0:
            raise WorkloadFailed(f"preparing the DataLoader's file failed: {tail(p.stderr)}")
        diagnosis("dataloader", "dataloader_train.py", ["2", "80"], "DataLoader input-bound", 240)()

    def exits():
        for how in ("exit", "os_exit"):
            name = f"exit_nosync_{how}"
            try:
                truth, rep = r.gapscope(name, "exit_nosync.py", ["300", how])
            except WorkloadFailed as e:
                t.add("gapscope", f"exit without synchronize ({how}, gapscope)", "FAIL", str(e))
                continue
            ctx["reports"][name] = rep
            t.check("gapscope", f"exit without synchronize ({how}, gapscope): recorded or reported lost",
                    lambda: eval_exit_report(truth, rep))

    def profiler():
        trace = os.path.join(r.out, "torch_profiler.gapscope.trace.json")
        truth, rep = r.gapscope("torch_profiler", "torch_profiler.py", [trace])
        ctx["reports"]["torch_profiler"] = rep
        t.check("gapscope", "torch.profiler (gapscope run): its own trace complete", lambda: eval_kineto(truth, trace))
        t.check("gapscope", "torch.profiler (gapscope run): its kernels after their launch calls",
                lambda: eval_kineto_clock(trace))
        t.check("gapscope", "torch.profiler: gapscope reports the span it could not see, not idle",
                lambda: eval_profiler_report(truth, rep))

    def nvtx():
        truth, rep = r.gapscope("nvtx", "nvtx_ranges.py", [])
        ctx["reports"]["nvtx"] = rep
        t.check("gapscope", "NVTX ranges in the report", lambda: eval_nvtx_report(truth, rep))

    def graph():
        truth, rep = r.gapscope("cuda_graph", "cuda_graph.py", [])
        ctx["reports"]["cuda_graph"] = rep
        t.check("gapscope", "CUDA graph (gapscope run): every replayed kernel recorded", lambda: (
            field(rep, "gpus.0.kernels.count") == truth["kernels"],
            f"{field(rep, 'gpus.0.kernels.count')} recorded / {truth['kernels']} launched"))

    return [("kernel_count", kernel_count), ("attach", attach),
            ("item_sync", diagnosis("item_sync", "item_sync.py", ["300"], ".item() every step")),
            ("pageable_copy", diagnosis("pageable_copy", "pageable_copy.py", ["100"], "pageable copies")),
            ("dataloader", prepare_data),
            ("exit_nosync", exits), ("torch_profiler", profiler), ("nvtx", nvtx), ("cuda_graph", graph)]


EXPECTED_LOSS = ("exit_nosync_exit", "exit_nosync_os_exit", "torch_profiler")


def drops_rows(t, ctx):
    def shim():
        per = {k: eval_dropped(s) for k, s in ctx["shim_summaries"].items() if k not in EXPECTED_LOSS}
        if not per:
            return None, "no scenario ran"
        bad = [f"{k}: {fig}" for k, (ok, fig) in per.items() if not ok]
        return not bad, "; ".join(bad) if bad else f"0 in {', '.join(per)}"

    def report():
        per = {k: eval_report_drops(rep) for k, rep in ctx["reports"].items() if k not in EXPECTED_LOSS}
        if not per:
            return None, "no scenario ran under gapscope run"
        bad = [f"{k}: {fig}" for k, (ok, fig) in per.items() if not ok]
        return not bad, "; ".join(bad) if bad else f"0 in {', '.join(per)}"
    t.check("shim", "GPU records dropped = 0, every scenario (shim)", shim)
    if ctx["reports"]:
        t.check("gapscope", "GPU records dropped = 0, every scenario (gapscope run)", report)


# ------------------------------------------------------------------ main


def print_table(rows, file=sys.stdout):
    if not rows:
        return
    w = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{w}}  {r['status']:<4}  {r['figure']}", file=file)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--shim-only", action="store_true", help="skip gapscope run even where eBPF works")
    ap.add_argument("--only", default="", help="comma-separated scenarios (kernel_count, exit_nosync, "
                    "torch_profiler, nvtx, cuda_graph, attach, item_sync, pageable_copy, dataloader)")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds; scenarios that would start later are skipped (default 420)")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    try:
        with open(os.path.join(HERE, "bundle.json")) as f:
            bundle = json.load(f)
    except (OSError, ValueError):
        bundle = {}
    t = Table(out)
    r = Runner(out, a.budget)
    env, lines = environment(out, bundle)
    print("gapscope GPU proof bundle" + (f" ({bundle.get('commit', '?')[:12]})" if bundle else ""))
    for l in lines:
        print("  " + l)
    ctx = {"env": env, "shim_summaries": {}, "reports": {}}
    results = {"environment": env, "rows": t.rows, "out": out}

    def save(done=False):
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
        if done:
            fails = sum(1 for x in t.rows if x["status"] == "FAIL")
            results["exit_code"] = 0 if fails == 0 else 1
            results["counts"] = {s: sum(1 for x in t.rows if x["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
        try:
            with open(os.path.join(out, "results.json.tmp"), "w") as f:
                json.dump(results, f, indent=1)
            os.replace(os.path.join(out, "results.json.tmp"), os.path.join(out, "results.json"))
        except OSError as e:
            print(f"cannot write results.json: {e}", file=sys.stderr)

    if env.get("glibc_below_floor"):
        t.add("env", "glibc at or above the bundle's floor", "FAIL",
              f"{env.get('glibc')} < {env.get('glibc_floor')}: gapscope and the shim cannot load here")
    if a.shim_only:
        ebpf, why = False, "--shim-only"
    else:
        ebpf, why = ebpf_probe(out, env)
    results["mode"] = "full" if ebpf else "shim-only"
    results["mode_reason"] = why
    print(f"  mode             {'full: shim-only checks, then gapscope run' if ebpf else 'SHIM-ONLY'} ({why})")
    print(file=sys.stderr)
    only = {x for x in a.only.split(",") if x}

    phases = [("shim", shim_scenarios(t, r, ctx))]
    if ebpf:
        phases.append(("gapscope", gapscope_scenarios(t, r, ctx)))
    for phase, scenarios in phases:
        for name, fn in scenarios:
            if only and name not in only:
                continue
            label = f"{phase}/{name}"
            if r.left() <= 0:
                t.add(phase, f"{label}", "SKIP", f"out of time (--budget {a.budget:.0f} s)")
                continue
            print(f"[{label}] ...", file=sys.stderr, flush=True)
            try:
                fn()
            except WorkloadFailed as e:
                t.add(phase, f"{label} ran", "FAIL", str(e))
            except Exception as e:
                t.add(phase, f"{label} ran", "FAIL", f"crashed: {type(e).__name__}: {e}")
                log(out, f"{phase}.{name}.crash.log", traceback.format_exc())
            save()
    if not ebpf:
        t.add("gapscope", "diagnosis scenarios under gapscope run", "SKIP", f"no eBPF here: {why}")
    drops_rows(t, ctx)

    print()
    print_table(t.rows)
    notes = []
    for k, s in ctx["shim_summaries"].items():
        for i in s.get("totals", {}).get("infos", []):
            if (k, i) not in notes:
                notes.append((k, i))
        for kind, text in unknown_frames(s):
            if not text.startswith("Skipped"):
                notes.append((k, text[:300]))
    if notes:
        print("\nshim notes (Info and other frames):")
        for k, i in notes[:40]:
            print(f"  {k}: {i[:300]}")
    save(done=True)
    c = results["counts"]
    print(f"\n{c['PASS']} PASS, {c['FAIL']} FAIL, {c['SKIP']} SKIP in {results['elapsed_s']:.0f} s; "
          f"mode {results['mode']}; results.json and logs in {out}")
    return results["exit_code"]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # the last resort: one line, never a traceback
        print(f"checks.py: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
