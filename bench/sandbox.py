"""
Benchmark of sandbox.py against a fresh interpreter per call, measured side by side in one run.

For trivial, numpy and sympy code it times three ways of running the same snippet:
  fresh   - subprocess.run([python, "-c", code]) with the interpreter the project runs on
  fork    - Sandbox.run: a fork of a warm zygote per execution (stateless)
  session - Session.run: a cell in a stateful session (a fork of the session's holder)
Each uses as many concurrent callers as the sandbox has slots (the core count), and reports
executions per second, median latency, and the speed-up over `fresh` (ratio of executions per
second). Every timed execution checks the exit status and the exact expected output, so a failing
import cannot pass for a fast run. The snippet changes on every call (different numbers), so no run
is a cache hit of an earlier one.

Back to back, the sandbox pays on the caller's clock for what it otherwise does between calls:
forking the next stateless child; for a session, settling the committed cell, forking its next
runner and copying ahead the pages the next cell will write (see sandbox.py, "copy-on-write ahead
of a cell"). In a rollout the model generates between two calls of a trajectory and that work
happens meanwhile: the `+think` rows are the median latency as a rollout sees it, every caller
pausing 50 ms before each call, and their `x fresh` is the ratio of median latencies (fresh
median / that median, the same number of callers).

Usage: python bench/sandbox.py [--calls 40] [--fresh-calls 16] [--slots N]
Ends with one line: bench: sandbox <figure>=<value> ...
"""

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox import Sandbox  # noqa: E402

CASES = {
    "trivial": (lambda i: f"print({i} * 7)",
                lambda i: f"{i * 7}"),
    "numpy": (lambda i: f"import numpy as np\nprint(int(np.arange({i + 10}).sum()))",
              lambda i: f"{sum(range(i + 10))}"),
    "sympy": (lambda i: f"import sympy as sp\nx = sp.Symbol('x')\nprint(sp.solve(x**2 - {2 * i + 1}*x + {i * (i + 1)}, x))",
              lambda i: f"[{i}, {i + 1}]"),
}


def fresh(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"fresh interpreter failed (exit {p.returncode}): {p.stderr[-500:]}"
    return p.stdout


def timed(call, codes: list, expected: list, callers: int, think: float = 0.0) -> tuple:
    """Run the codes with `callers` concurrent callers, caller j taking codes j, j+callers, ...
    (and, for sessions, always its own session), each pausing `think` seconds before each call.
    Returns (executions/s, median latency in s)."""
    latencies = []

    def caller(j):
        for k in range(j, len(codes), callers):
            time.sleep(think)
            t0 = time.perf_counter()
            out = call(j, codes[k])
            latencies.append(time.perf_counter() - t0)
            assert out.strip() == expected[k], f"wrong output {out!r}, expected {expected[k]!r}"

    t0 = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(caller, range(callers)))
    wall = time.perf_counter() - t0
    return len(codes) / wall, statistics.median(latencies)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calls", type=int, default=40, help="timed sandbox executions per case and mode")
    ap.add_argument("--fresh-calls", type=int, default=16, help="timed fresh-interpreter executions per case")
    ap.add_argument("--slots", type=int, default=None, help="sandbox slots (default: the core count)")
    args = ap.parse_args()

    sb = Sandbox(slots=args.slots, timeout_s=60.0)
    n = sb.slots
    sessions = [sb.session() for _ in range(n)]

    def run_fork(j, code):
        r = sb.run(code)
        assert r.ok, f"sandbox run failed: {r}"
        return r.stdout

    def run_cell(j, code):
        r = sessions[j].run(code)
        assert r.ok, f"session cell failed: {r}"
        return r.stdout

    print(f"python {sys.executable}, {n} slots = concurrent callers, sandbox layers: {', '.join(sb.layers)}")
    print(f"{'case':8s} {'mode':14s} {'exec/s':>9s} {'median ms':>10s} {'x fresh':>8s}")
    figures = {}
    for name, (make, want) in CASES.items():
        # Warm-up, untimed: the first cell of each session, the first fork, one fresh start.
        for k in range(n):
            run_cell(k, make(10_000 + k))
        run_fork(0, make(20_000))
        fresh(make(30_000))
        rows = {
            "fresh": timed(lambda k, c: fresh(c), [make(i) for i in range(args.fresh_calls)],
                           [want(i) for i in range(args.fresh_calls)], n),
            "fork": timed(run_fork, [make(i) for i in range(100, 100 + args.calls)],
                          [want(i) for i in range(100, 100 + args.calls)], n),
            "session": timed(run_cell, [make(i) for i in range(200, 200 + args.calls)],
                             [want(i) for i in range(200, 200 + args.calls)], n),
        }
        base = rows["fresh"][0]
        for mode, (eps, med) in rows.items():
            print(f"{name:8s} {mode:14s} {eps:9.1f} {med * 1000:10.1f} {eps / base:8.1f}")
            if mode != "fresh":
                figures[f"{name}_{mode}_x"] = eps / base
            figures[f"{name}_{mode}_ms"] = med * 1000
        for mode, call, first in (("fork", run_fork, 300), ("session", run_cell, 400)):
            _, med = timed(call, [make(i) for i in range(first, first + args.calls)],
                           [want(i) for i in range(first, first + args.calls)], n, think=0.05)
            figures[f"{name}_{mode}_think_ms"] = med * 1000
            figures[f"{name}_{mode}_think_x"] = rows["fresh"][1] / med
            print(f"{name:8s} {mode + '+think':14s} {'':9s} {med * 1000:10.1f} {figures[f'{name}_{mode}_think_x']:8.1f}"
                  "   (after 50 ms of generation; ratio of median latencies)")
    for s in sessions:
        s.close()
    sb.close()
    keys = ["numpy_fork_x", "sympy_fork_x", "sympy_session_x", "trivial_fork_x", "numpy_session_x",
            "trivial_fresh_ms", "numpy_fresh_ms", "sympy_fresh_ms", "numpy_fork_ms", "sympy_fork_ms", "sympy_session_ms",
            "trivial_fork_think_ms", "numpy_fork_think_ms", "sympy_fork_think_ms", "numpy_fork_think_x", "sympy_fork_think_x",
            "trivial_session_think_ms", "sympy_session_think_ms", "numpy_session_think_x", "sympy_session_think_x"]
    print("bench: sandbox " + " ".join(f"{k}={figures[k]:.1f}" for k in keys))


if __name__ == "__main__":
    main()
