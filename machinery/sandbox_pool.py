"""The trainer's side of the sandbox: the pool of zygotes behind a Sandbox (sandbox.py), and how they are started.

sandbox.py says what a call returns; this file picks the zygote a call takes, (re)starts zygotes (bwrap's
command, the clean environment, where a zygote sees its files), sends each request and reads its answer. It runs
in the trainer only, never in a zygote: it is apart from the zygote's program (machinery/zygote*.py) so that the
program stays what a zygote runs and nothing more. It uses the program's framing, process-tree, containment and
scratch helpers (the same code on both sides of the pipe); the program never imports this file.
"""
import itertools
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from machinery.zygote_contain import PROGRAM, PROGRAM_FILES, _remove_ipc, _zygote_needs
# what a result carries (sandbox.py's, from here: the pool is sandbox.py's one way into machinery/)
from machinery.zygote_exec import FRAME_LINES_MAX, MAX_FRAMES, NAME_MAX, TEXT_MAX  # noqa: F401
from machinery.zygote_frame import _read_frame, _write_frame
from machinery.zygote_scratch import _rmtree
from machinery.zygote_tree import _kill_tree

UIDS_PER_SANDBOX = 10_000  # one uid per slot, the rest recycled for sessions
WATCHDOG_GRACE_S = 30.0  # a zygote that misses timeout + this is hung (it never should be)
PLACED = "/run/sandbox"  # where a zygote sees its interpreter's venv and its program when they sit in a hidden folder
START_TIMEOUT_S = 180.0  # a zygote imports numpy + sympy; slow on a loaded 2-core machine


def _placed(hide: list) -> dict:
    """Where the zygote sees what it needs from a hidden folder (a venv in the checkout, its program): in a
    folder of its own (PLACED), so that nothing it holds (its argv, sys.prefix, a module's path, the
    libraries in /proc/self/maps) names the checkout. The program's files go to PLACED/machinery/, a package
    as in the checkout (zygote.py imports the others as machinery.zygote_*). Host path -> the zygote's path."""
    inside = lambda p: any(p == h or p.startswith(h + "/") for h in hide)  # noqa: E731
    if not os.path.isdir("/run") or os.path.islink("/run"):  # PLACED lives in the private /run
        return {}
    moved = {}
    if sys.prefix != sys.base_prefix and inside(os.path.realpath(sys.prefix)):
        moved[os.path.realpath(sys.prefix)] = PLACED + "/venv"
    for path in PROGRAM_FILES:
        if inside(os.path.realpath(path)):
            moved[os.path.realpath(path)] = PLACED + "/machinery/" + os.path.basename(path)
    return moved


def _zygote_command(moved: dict) -> tuple:
    """The interpreter and the program's entry (zygote.py) as the zygote sees them (_placed)."""
    exe, prefix = sys.executable, os.path.realpath(sys.prefix)
    if prefix in moved and exe.startswith(sys.prefix.rstrip("/") + "/"):
        exe = moved[prefix] + exe[len(sys.prefix.rstrip("/")):]
    return exe, moved.get(os.path.realpath(PROGRAM), PROGRAM)


@dataclass
class _Worker:
    index: int
    uid: int | None
    proc: subprocess.Popen | None = None
    busy: bool = False
    generation: int = 0  # bumped on every respawn: sessions on older generations are lost
    layers: list = field(default_factory=list)
    n_sessions: int = 0
    last_used: int = 0
    pending_closes: list = field(default_factory=list)  # (sid, uid) closed while the worker was busy


class Pool:
    """A Sandbox's zygotes: which one a call takes, (re)starting them, one request and its answer, the uids
    of sessions and the closes queued for a busy worker."""

    def __init__(self, slots: int, limits: dict, use_bwrap: bool, use_netns: bool, use_uid: bool,
                 max_threads: int, hide: list, refused: dict):
        """hide: the folders the code must not see; refused: the syscalls it may not make (sandbox.py's policy)."""
        self.limits = limits  # memory_mb, keep, flood, fsize: the zygotes' config
        self._closed = False
        self._cond = threading.Condition()
        self._sids = itertools.count()
        self._ticks = itertools.count()
        uid_base = None
        if use_uid and os.geteuid() == 0:
            # Random per Sandbox so two trainers on one machine never share uids (nor NPROC counts).
            uid_base = 10_000_000 + random.randrange(100_000) * UIDS_PER_SANDBOX
            self._free_uids = list(range(uid_base + UIDS_PER_SANDBOX - 1, uid_base + slots - 1, -1))
        self._hide, self._refused = hide, refused
        self._moved = _placed(self._hide)
        self._bwrap = _bwrap_argv(limits["fsize"] >> 20, self._hide, self._moved) if use_bwrap else None
        self._root = None
        if self._bwrap is None:
            self._root = tempfile.mkdtemp(prefix="cleaner-sandbox-")
            os.chmod(self._root, 0o711)  # slot uids may enter, not list
        self._use_netns = use_netns
        self._env = _clean_env("/tmp" if self._bwrap else self._root, self._moved if self._bwrap else {})
        self.workers = [_Worker(i, None if uid_base is None else uid_base + i) for i in range(slots)]
        self.executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="sandbox")
        uids = None if uid_base is None else range(uid_base, uid_base + UIDS_PER_SANDBOX)
        self._finalizer = weakref.finalize(self, _shutdown, self.workers, self._root, self.executor, uids)
        try:
            for w in self.workers:
                self._spawn(w)
            for w in self.workers:
                self._await_ready(w)
        except BaseException:
            self.close()
            raise
        self.layers = self.workers[0].layers

    def run(self, req: dict, timeout: float) -> dict | None:
        """A stateless run on a free worker: the zygote's answer, None when it died or hung."""
        w = self._acquire(None)
        try:
            return self._request(w, req, timeout)
        finally:
            self._release(w)

    def cell(self, s: "Session", req: dict, timeout: float) -> dict:
        """A session's cell on the session's worker; the answer says when the session's state was lost."""
        w = self._acquire(s._worker)
        try:
            alive = self._revive(w)  # first, so that a respawn shows in the generation
            lost = s._generation is not None and s._generation != w.generation
            s._generation = w.generation
            s._opened[0] = True
            resp = self._request(w, req, timeout) if alive else None  # a failed respawn is not retried here
        finally:
            self._release(w)
        if resp is None:
            resp = {"kind": "sandbox_internal", "detail": "the sandbox worker died during this cell",
                    "state_lost": "worker_died"}
        elif lost:
            resp["state_lost"] = "restarted"
        return resp

    def open_session(self) -> tuple:
        """(sid, worker index, uid) of a new session: the worker with the fewest sessions."""
        with self._cond:
            if self._closed:
                raise RuntimeError("Sandbox is closed")
            w = min(self.workers, key=lambda w: w.n_sessions)
            w.n_sessions += 1
            uid = self._free_uids.pop() if self.workers[0].uid is not None else None
        return next(self._sids), w.index, uid

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._finalizer()

    def _acquire(self, index: int | None) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("Sandbox is closed")
                free = [w for w in self.workers if not w.busy and (index is None or w.index == index)]
                if free:
                    # Leave session-heavy workers to their sessions, then round-robin.
                    w = min(free, key=lambda w: (w.n_sessions, w.last_used))
                    w.busy = True
                    w.last_used = next(self._ticks)
                    return w
                self._cond.wait()

    def _release(self, w: _Worker) -> None:
        while True:
            with self._cond:
                closes, w.pending_closes = w.pending_closes, []
                if not closes or self._closed:
                    w.busy = False
                    self._cond.notify_all()
                    return
            for sid, uid in closes:
                self._close_session(w, sid, uid)

    def _close_session(self, w: _Worker, sid: int, uid: int | None) -> None:
        self._request(w, {"op": "close", "sid": sid}, 0.0)
        with self._cond:
            self._forget_session(w, uid)

    def _forget_session(self, w: _Worker, uid: int | None) -> None:
        """With self._cond held: the worker has one session less, and its uid is free again."""
        w.n_sessions -= 1
        if uid is not None:
            self._free_uids.append(uid)

    def _spawn(self, w: _Worker) -> None:
        # Under bwrap the zygote starts where it sees its files (_placed); the fallback's zygote starts from the
        # host's paths and runs itself again from there once its mount namespace is made (_enter_placed).
        exe, path = _zygote_command(self._moved) if self._bwrap else (sys.executable, PROGRAM)
        argv = (self._bwrap or []) + [exe, "-I", "-B", path, "--zygote"]
        w.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env, bufsize=0,
                                  cwd="/" if self._bwrap else self._root, start_new_session=True, close_fds=True)
        cfg = {"bwrap": self._bwrap is not None, "use_netns": self._use_netns, "uid": w.uid, "hide": self._hide,
               "moved": self._moved, "refused": self._refused, "placed": _zygote_command(self._moved),
               "root": "/tmp" if self._bwrap else os.path.join(self._root, f"w{w.index}"), **self.limits}
        _write_frame(w.proc.stdin.fileno(), cfg)

    def _await_ready(self, w: _Worker) -> None:
        try:
            ready = _read_frame(w.proc.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
        except (EOFError, TimeoutError, OSError) as e:
            raise RuntimeError(f"sandbox worker {w.index} failed to start ({e}); its stderr is above") from None
        w.layers = ready["layers"]

    def _respawn(self, w: _Worker) -> bool:
        _stop_worker(w, grace_s=0.0)
        w.generation += 1
        with self._cond:
            if self._closed:
                return False
        try:
            self._spawn(w)
            self._await_ready(w)
            return True
        except (RuntimeError, OSError):
            _stop_worker(w, grace_s=0.0)
            return False

    def _revive(self, w: _Worker) -> bool:
        """Respawn a zygote that died while idle (an idle zygote never writes: readable means EOF)."""
        if w.proc is not None:
            poller = select.poll()
            poller.register(w.proc.stdout.fileno(), select.POLLIN)
            if not poller.poll(0):
                return True
        return self._respawn(w)

    def _request(self, w: _Worker, msg: dict, timeout: float) -> dict | None:
        """One request/answer with the zygote. None when it died or hung (it is then respawned)."""
        if not self._revive(w):
            return None
        try:
            _write_frame(w.proc.stdin.fileno(), msg)
            return _read_frame(w.proc.stdout.fileno(), time.monotonic() + timeout + WATCHDOG_GRACE_S)
        except (OSError, EOFError, TimeoutError, ValueError):
            self._respawn(w)
            return None


def end_session(pool: Pool, index: int, sid: int, uid: int | None, opened: list, queue_only: bool) -> None:
    with pool._cond:
        w = pool.workers[index]
        if pool._closed:
            return
        if not opened[0]:  # never ran a cell: nothing exists in the zygote
            pool._forget_session(w, uid)
            return
        if w.busy or queue_only:
            w.pending_closes.append((sid, uid))  # done by whoever releases the worker next
            return
        w.busy = True
    try:
        pool._close_session(w, sid, uid)
    finally:
        pool._release(w)


def _clean_env(home: str, moved: dict) -> dict:
    # Built from scratch, so nothing of the trainer's environment (tokens, keys) reaches the code.
    threads = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")}
    path = os.path.dirname(_zygote_command(moved)[0]) + ":/usr/local/bin:/usr/bin:/bin"
    # Python's own allocator (pymalloc). glibc malloc on transparent huge pages forks faster (fewer
    # page-table entries), but the fork happens while the model generates (the spare child, a
    # session's runner), and under pymalloc a sympy solve in a fork is faster and writes fewer pages
    # (docs/speed.md, the sandbox).
    return {"PATH": path, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "TERM": "dumb", "MPLBACKEND": "Agg",
            **threads}


_BWRAP_PROBED: dict = {}


def _bwrap_argv(scratch_mb: int, hide: list = (), moved: dict | None = None) -> list | None:
    """The bwrap prefix for a zygote, or None when bwrap is missing or cannot create namespaces here."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    argv = [exe, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
            "--new-session", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--size", str(scratch_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp",
            # multiprocessing needs a writable /dev/shm; wiped after every execution
            "--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/dev/shm"]
    # The host's other world-writable folders (files left for later executions) and its sockets (/run):
    # empty, and writable by root only.
    covered = [p for p in ("/var/tmp", "/run", "/var/crash") if os.path.isdir(p) and not os.path.islink(p)]
    for path in covered:
        argv += ["--size", str(16 << 20), "--tmpfs", path]
    # Python may live below a directory an unprivileged uid cannot enter (pyenv in /root): hide the
    # rest of that directory behind an empty tmpfs and re-expose the interpreter read-only.
    # The hidden folders become empty; what the zygote needs below them (a venv in the checkout, its program:
    # the zygote runs `python -I machinery/zygote.py`, which imports nothing of the project but the
    # machinery/zygote*.py beside it, PROGRAM_FILES) is bound back.
    for path in hide:
        argv += ["--tmpfs", path]
    moved = moved or {}
    if moved:  # at their place (_placed), inside the private /run; its folders open to the slot uids
        for folder in sorted({PLACED} | {os.path.dirname(p) for p in moved.values()}):  # PLACED/machinery too
            argv += ["--perms", "0755", "--dir", folder]
    for path, placed in sorted(moved.items()):
        argv += ["--ro-bind", path, placed]
    needed = _zygote_needs()
    masked, bound = {"/tmp", *covered, *hide}, list(moved)  # the private /tmp hides a checkout or venv there, too
    for path in sorted({os.path.realpath(p) for p in needed}):
        if any(path == b or path.startswith(b + "/") for b in bound):
            continue
        parts = path.split("/")
        for depth in range(2, len(parts) + 1):
            above = "/".join(parts[:depth])
            if above in masked or not os.stat(above).st_mode & 0o001:
                if above not in masked:
                    argv += ["--tmpfs", above]
                    masked.add(above)
                for d in range(depth + 1, len(parts)):  # bwrap would create these 0700
                    argv += ["--perms", "0755", "--dir", "/".join(parts[:d])]
                argv += ["--ro-bind", path, path]
                bound.append(path)
                break
    key = tuple(argv)
    if key not in _BWRAP_PROBED:
        try:
            probe = subprocess.run(argv + [_zygote_command(moved)[0], "-I", "-S", "-c", ""], capture_output=True,
                                   timeout=60)
            _BWRAP_PROBED[key] = probe.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_PROBED[key] = False
        if not _BWRAP_PROBED[key]:
            print("sandbox: bwrap is installed but cannot create a sandbox here; using the fallback layers", file=sys.stderr)
    return argv if _BWRAP_PROBED[key] else None


def _stop_worker(w: _Worker, grace_s: float) -> None:
    proc, w.proc = w.proc, None
    if proc is None:
        return
    try:
        proc.stdin.close()  # EOF: the zygote kills its children and exits
    except OSError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        proc.wait()
    proc.stdout.close()


def _shutdown(workers: list, root: str | None, executor: ThreadPoolExecutor, uids: range | None) -> None:
    for w in workers:
        _stop_worker(w, grace_s=5.0)
    if root is not None:
        _rmtree(root)
    if uids is not None:  # a zygote killed before it could clean up (without bwrap: the host's IPC namespace)
        _remove_ipc(uids)
    executor.shutdown(wait=False)
