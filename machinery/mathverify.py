"""math-verify behind a timeout: reward.math_equal's symbolic check (the grader is reward.py).

math-verify's own timeouts use signal.alarm, which works only in a process's main thread, and training
grades from threads. So each comparison runs in a persistent worker process (this file run as a script),
and one that outlives its timeout kills the worker: a fresh one starts on the next call. A leaf: it
imports no project module.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time


class _MathVerifyWorker:
    """One persistent `python` child that runs math-verify; a comparison that outlives its timeout
    kills the child (a fresh one starts on the next call). One request at a time."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-I", __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buf = b""
        if self._read_line(timeout_s=300.0) != b"ready":  # importing sympy is slow on a cold cache
            self.close()
            raise RuntimeError("the math-verify worker failed to start "
                               "(is math-verify installed? `pip install math-verify==0.9.0`)")

    def _read_line(self, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.strip()

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def verify(self, gold: str, pred: str, timeout_s: float) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return False
        line = self._read_line(timeout_s)
        if line is None:
            self.close()
            return False
        return line == b"1"


def _worker_main():
    """Loop of the worker child: one JSON request a line in, "1" or "0" a line out."""
    import functools
    import logging
    logging.disable(logging.WARNING)  # math-verify warns that its timeouts are off: we bound time outside
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # nothing math-verify prints may corrupt the protocol
    from math_verify import parse, verify

    @functools.lru_cache(maxsize=4096)  # a GRPO group shares its gold, and samples often agree
    def parsed(s):
        return parse(f"${s}$", parsing_timeout=None)

    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            ok = bool(verify(parsed(req["gold"]), parsed(req["pred"]), timeout_seconds=None))
        except Exception:
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


# Idle workers; callers in several threads each take one, so grading scales with threads up to
# _MAX_WORKERS children (each holds its own sympy, ~150 MB).
_MAX_WORKERS = max(1, min(4, os.cpu_count() or 1))
_IDLE: "queue.LifoQueue[_MathVerifyWorker]" = queue.LifoQueue()
_ALL_WORKERS: list[_MathVerifyWorker] = []
_POOL_LOCK = threading.Lock()


def verify(gold: str, pred: str, timeout_s: float) -> bool:
    """Does math-verify find `pred` equal to `gold` within timeout_s seconds? A timeout or a crash is False."""
    with _POOL_LOCK:
        if _IDLE.empty() and len(_ALL_WORKERS) < _MAX_WORKERS:
            _ALL_WORKERS.append(_MathVerifyWorker())
            _IDLE.put(_ALL_WORKERS[-1])
    worker = _IDLE.get()
    try:
        return worker.verify(gold, pred, timeout_s)
    finally:
        _IDLE.put(worker)


@atexit.register
def _close_workers():
    for w in _ALL_WORKERS:
        w.close()


if __name__ == "__main__":
    _worker_main()
