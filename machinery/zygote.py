"""The sandbox's zygote: the entry of its program (`python -I -B machinery/zygote.py --zygote`), its start and
its request loop.

sandbox.py says what a call returns and what each layer stops; machinery/sandbox_pool.py is the trainer's side
(the pool that starts zygotes and talks to them); the zygote's program is this file and the machinery/zygote_*.py
files it imports, one room each, and nothing else of the project (the import rule). It reads everything else it
needs (the folders to hide, the syscalls to refuse, the limits) from the config the pool sends it first.
Nothing of the paper is here: CLEANER's code interpreter is sandbox.py's API.

The rooms
  zygote.py            this file: the program's entry, the zygote's start (its layers, the preload) and its loop
  zygote_frame.py      the wire: length-prefixed JSON, spoken by both sides
  zygote_state.py      the zygote's state (_Zygote), which every room is handed
  zygote_contain.py    containment: seccomp, mounts, hidepid, SysV IPC, a child's limits and uid; the program's files
  zygote_scratch.py    the scratch dirs and /dev/shm, wiped between executions
  zygote_tree.py       the process tree: /proc, signals, the sweep of what the code left running
  zygote_supervise.py  watching one execution: its pipes, its time and flood limits, the verdict
  zygote_run.py        stateless runs: the spare child forked ahead
  zygote_session.py    sessions: holders and runners, commit and rollback
  zygote_copyahead.py  copy-on-write ahead of a cell
  zygote_exec.py       the child's side: waiting for the code, running it, its report and the bounds on it

What runs where
- One zygote per slot: a clean `python -I -B machinery/zygote.py --zygote`, started with subprocess (never by
  forking the trainer, which may hold torch threads), that has imported numpy and sympy with one
  BLAS thread and run a short warm-up. It speaks length-prefixed JSON over its stdin/stdout.
- `run(code)` (stateless): the code runs in a fresh namespace in a child of the zygote, forked
  ahead of time (the spare): it has dropped privileges, set up its streams and copied ahead the
  pages a typical run writes (learnt once by a probe run), and waits for the code (at nice 10, set
  back to 0 when the code arrives, where the zygote may lower a nice value). The zygote
  drains stdout/stderr (keeping head and tail), enforces the time limit and the
  output-flood limit with SIGKILL (`clock="cpu"`: the code's CPU time, read between polls, with the wall
  clock as a backstop), then kills whatever the code left running, wipes the scratch
  dir, answers, and forks the next spare while the model generates. Time spent waiting for a free
  slot does not count.
- `session()` (stateful, like a Jupyter kernel): the zygote forks a holder process that keeps the
  namespace; it is the checkpoint. Ahead of each cell the holder forks a runner that gets ready
  (its output pipes, streams and process group) and waits for the cell, so neither a fork nor any
  set-up sits between a request and the code. If the cell succeeds the runner becomes the holder
  and the old one is killed; if it fails the runner is killed and the holder is untouched, so a
  failed, timed-out or crashed cell leaves the state as it was. Every page a cell writes is copied
  first (copy-on-write): for a sympy solve that costs as much as the solve. So each runner lists
  the pages its cell wrote, and the next one copies them in bulk while the model generates
  (`_copy_ahead`). All of this happens after the cell's answer is sent. Waiting session processes
  run at nice 10 and a cell at 0 (when the zygote may lower a nice value), so the preparation of
  one session yields to the cells of others.
  `session(rollback=False)` keeps what a cell did before it raised (Jupyter-style); a timeout or a
  crash still rolls back, since the process that held those effects is gone. Idle holders stop
  themselves, so threads of idle sessions do not run. Session cells are named `<cell N>` in
  tracebacks and echo the value of a final expression like Jupyter; stateless runs are scripts unless
  `run(..., echo=True)` (the official CLEANER tool echoes it).
"""
import gc
import os
import sys
import traceback

if __name__ == "__main__":
    # Run by path under -I, which puts no folder of ours on sys.path: the rooms are imported as machinery.zygote_*
    # from the folder holding machinery/ (the checkout's, or PLACED's where the pool binds them: sandbox_pool._placed),
    # which leaves sys.path again below, once they are in, so that the code finds neither it nor our files there.
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, _ROOT)

from machinery.zygote_contain import (CLONE_NEWNET, PR_SET_CHILD_SUBREAPER, _hide_pids, _libc,  # noqa: E402
                                      _mount_tmpfs, _prctl, _private_mounts, _remove_ipc, _seccomp_program,
                                      _seccomp_works)
from machinery.zygote_copyahead import _learn_hot_pages  # noqa: E402
from machinery.zygote_frame import _read_frame, _write_frame  # noqa: E402
from machinery.zygote_run import _fork_spare, _run_stateless  # noqa: E402
from machinery.zygote_scratch import _make_scratch, _rmtree  # noqa: E402
from machinery.zygote_session import _close_holder, _run_cell  # noqa: E402
from machinery.zygote_state import BACKGROUND_NICE, _ParentGone, _Zygote  # noqa: E402
from machinery.zygote_tree import _sweep  # noqa: E402

if __name__ == "__main__":
    sys.path.remove(_ROOT)


def _zygote_main(entered: bool) -> None:
    # The protocol pipes move away from fds 0/1, so a stray print can never corrupt a frame.
    req_fd, resp_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    if entered:  # run again by _enter_placed, in the namespaces made below
        cfg = _read_frame(3)
        os.close(3)
        layers = cfg.pop("layers")
    else:
        cfg = _read_frame(req_fd)
        layers = ["bwrap"] if cfg["bwrap"] else []
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the code (setsid, double fork) come back to us
    if not entered and not cfg["bwrap"] and cfg["use_netns"] and os.geteuid() == 0:
        if _libc.unshare(CLONE_NEWNET) == 0:
            layers.append("netns")
        if _private_mounts(cfg):
            layers.append("mountns")
            if cfg["moved"]:
                _enter_placed(cfg, layers, req_fd, resp_fd)
    if (cfg["bwrap"] or "mountns" in layers) and _hide_pids():  # bwrap's mount namespace is ours already
        layers.append("hidepid")
    seccomp = _seccomp_program(cfg["refused"])
    if seccomp is not None and _seccomp_works(seccomp):
        layers.append("seccomp")
    else:
        seccomp = None
    uid = cfg["uid"] if cfg["uid"] is not None and os.geteuid() == 0 else None
    if uid is not None:
        layers.append("uid")
    layers += ["rlimits", "clean_env", "subreaper"]
    os.makedirs(os.path.dirname(cfg["root"]), mode=0o711, exist_ok=True)  # the trainer's, unless mountns hid it
    os.makedirs(cfg["root"], mode=0o711, exist_ok=True)
    if "mountns" in layers and not any(cfg["root"].startswith(p + "/") for p in ("/tmp", "/var/tmp")):
        _mount_tmpfs(cfg["root"], cfg["fsize"], 0o711)  # the scratch tree, capped, wherever the trainer's temp dir is
    z = _Zygote(cfg, req_fd, uid, os.path.join(cfg["root"], "run"), seccomp, _can_renice(),
                private_shm=cfg["bwrap"] or "mountns" in layers)
    _make_scratch(z.scratch, uid)
    _preload()
    gc.freeze()  # forks never walk (and so never copy) the preloaded heap in their collections
    z.hot = _learn_hot_pages()
    z.spare = _fork_spare(z)
    _write_frame(resp_fd, {"layers": layers})
    try:
        while True:
            try:
                req = _read_frame(req_fd)
            except EOFError:
                break
            try:
                if req["op"] == "run":
                    resp = _run_stateless(z, req)
                elif req["op"] == "cell":
                    resp = _run_cell(z, req)
                else:
                    resp = _close_holder(z, req["sid"])
            except _ParentGone:
                break
            except Exception as e:
                traceback.print_exc()  # the full story goes to the trainer's stderr, one line to the model
                resp = {"kind": "sandbox_internal", "detail": f"{type(e).__name__}: {e}"[:300]}
            _write_frame(resp_fd, resp)
            if z.after is not None:  # off the caller's clock, before the next request
                after, z.after = z.after, None
                try:
                    after()
                except Exception:
                    traceback.print_exc()
            z.reaped.clear()
    finally:
        for sid in list(z.sessions):
            _close_holder(z, sid)
        _sweep(z, set())
        if uid is not None:
            _remove_ipc({uid})
        if not cfg["bwrap"]:
            _rmtree(cfg["root"])


def _enter_placed(cfg: dict, layers: list, req_fd: int, resp_fd: int) -> None:
    """The fallback's zygote, once its mount namespace shows its venv and its program at their place (_placed):
    run again from there (exec keeps the namespaces), so that no path it holds names the checkout. The
    config goes on fd 3, the protocol pipes on 0 and 1."""
    r, w = os.pipe()
    _write_frame(w, dict(cfg, layers=layers))  # a few KiB: the pipe holds it
    os.close(w)
    for fd, to in ((req_fd, 0), (resp_fd, 1), (r, 3)):
        os.dup2(fd, to)
    exe, path = cfg["placed"]
    os.environ["PATH"] = os.path.dirname(exe) + ":/usr/local/bin:/usr/bin:/bin"
    os.execv(exe, [exe, "-I", "-B", path, "--zygote", "--entered"])


def _preload() -> None:
    """Import and exercise what model code usually needs, so forks find it warm (caches included), and so a
    fallback uid that cannot read the interpreter's folder still has it (unittest.mock: the LCB harness)."""
    import numpy
    import sympy
    for name in ("cmath", "fractions", "decimal", "statistics", "heapq", "bisect", "datetime", "typing",
                 "dataclasses", "copy", "textwrap", "array", "hashlib", "string", "pprint", "enum", "numbers",
                 "unicodedata", "csv", "glob", "base64", "collections.abc", "itertools", "queue", "calendar", "secrets",
                 "uuid", "gzip", "timeit", "unittest.mock", "encodings.idna", "multiprocessing.pool",
                 "multiprocessing.popen_fork", "multiprocessing.queues", "multiprocessing.synchronize",
                 "multiprocessing.shared_memory", "concurrent.futures.process", "sympy.abc", "sympy.parsing.sympy_parser",
                 "mpmath"):
        __import__(name)
    x, y = sympy.symbols("x y")
    sympy.solve(x ** 2 - 2, x)
    sympy.solve([x + y - 3, x - y - 1], [x, y])
    sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2)
    sympy.factor(x ** 3 - y ** 3)
    sympy.expand((x + 1) ** 5)
    sympy.integrate(x * sympy.exp(x), x)
    sympy.diff(sympy.sin(x) * x, x)
    sympy.limit(sympy.sin(x) / x, x, 0)
    sympy.nsimplify(0.5) + sympy.Rational(3, 7) + sympy.sqrt(8)
    sympy.isprime(97), sympy.factorint(360), sympy.binomial(10, 3)
    str(sympy.Matrix([[1, 2], [3, 4]]).inv()), sympy.latex(x ** 2), sympy.N(sympy.pi, 20)
    numpy.linalg.solve(numpy.eye(3), numpy.ones(3))
    numpy.linalg.eigvals(numpy.eye(3)), numpy.fft.fft(numpy.ones(4)), numpy.random.default_rng(0).random(3)
    str(numpy.arange(6).reshape(2, 3))


def _can_renice() -> bool:
    """Whether this process may lower a nice value again (a forked child tries)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
            os.setpriority(os.PRIO_PROCESS, 0, 0)
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


if __name__ == "__main__" and sys.argv[1:2] == ["--zygote"]:
    _zygote_main(entered=sys.argv[2:] == ["--entered"])
