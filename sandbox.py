"""
Contained, fast execution of model-written Python: the code-interpreter tool of CLEANER.

In CLEANER (Xu, Chen, Li, 2026) the policy writes Python inside its reasoning, the environment runs
it and shows the output or the error back to the model, and SAAR later rewrites the failed calls.
The paper runs code in an external sandbox service. Here it runs locally, in a pool of warm
processes, because an RL step makes thousands of calls and most of the cost of a naive sandbox is
starting Python with numpy and sympy (docs/speed.md). nanochat's execution.py has the same
job; we keep its plain tone, but not its design (a multiprocessing.Process per call, os functions
patched to None). Nothing here is copied from it.

This file reads top down: this docstring (what a call returns, what each layer stops, what is not
covered), what a call returns (ExecResult), the API (Sandbox, Session) and the containment policy
(what is hidden, which syscalls are refused). How code runs, in a pool of zygotes that fork a ready
child per call and a holder process per session (the checkpoint a failed cell rolls back to), is
machinery/: sandbox_pool.py, the trainer's side (the pool), and zygote.py with its rooms zygote_*.py, the zygote's
whole program; zygote.py's docstring says what runs where and which file holds what.

What a call returns
- An ExecResult: facts, not text. The kind (ERROR_KINDS), the streams (head and tail), the exception's
  type and Python's own text for it, the frames of the code (the innermost library frame too, with
  a path below sys.path; a run of repeats folded into a count), the limits, the signal of a crash,
  why a session's state was lost. The words the model reads are tools.tool_text's, in tools.py,
  and nowhere else.
- Never in a result: frames of this file, anything of the trainer (its environment, its processes),
  anything of another execution. The report about an exception comes from the code's own process, so
  the zygote keeps only known fields, each of its type and bounded (`_checked`); a forged report can
  lie about its own execution, nothing else.
- A failure of the sandbox itself is retried once and then reported as `sandbox_internal`, never as
  an error of the code; a `sandbox_internal` report from the code's own process (ours only before the
  code starts, but the code can write one) is never retried, so code cannot get itself run twice.

What is covered (layers used when available; `Sandbox.layers` lists the active ones)
- bwrap: bubblewrap with private network, pid, ipc and uts namespaces, a read-only root, a private
  size-capped /tmp holding the scratch dirs, and a fresh /dev and /proc. /var/tmp, /run and /var/crash
  are empty root-owned tmpfs (no host sockets, nothing left for a later execution), /dev/shm a 64 MB
  tmpfs wiped after every execution. Directories that an
  unprivileged uid cannot enter (e.g. /root holding a pyenv Python) are masked with an empty tmpfs
  and only the interpreter's own directories are re-exposed, read-only. So are the folders the code
  must not read (`_hidden`: this checkout with its graders, tests and run folders, the problem sets
  beside it, the caches, the caller's `hide=`, and the host's top-level folders but the system's). What the
  zygote needs from them, a venv and its program (machinery/zygote*.py), is bound at /run/sandbox
  (`sandbox_pool._placed`) and run from there, so
  that no path the code can find (argv, sys.path, the environment, /proc/self/maps) names the checkout.
- netns / mountns: without bwrap, root unshares a network namespace (no interfaces up) and a mount
  namespace in which /tmp (scratch_mb, holding the scratch dirs), /var/tmp, /run and /var/crash are
  root-owned tmpfs and /dev/shm a 64 MB tmpfs wiped after every execution; the folders of `_hidden` are
  empty there too, and what the zygote needs below any of them (the interpreter, a venv, its program) is
  bound back read-only, as under bwrap; then the zygote runs itself again from /run/sandbox (`zygote._enter_placed`).
- hidepid: with bwrap or mountns, /proc is a new instance with hidepid=invisible: the code sees only
  the processes of its own uid (its own run or session), not the trainer's, the zygote's or another
  session's, nor their command lines.
- seccomp, in every mode, installed last in each child's set-up (see _REFUSED_SYSCALLS): no socket()
  bind() connect(), nor sendto() to an address or sendmsg() (socketpair() and send() to its peer stay:
  multiprocessing and asyncio work), so no host socket (pathname or abstract) is reachable and no session
  can name a socket another could reach; no unshare/setns, and no clone with namespace flags (clone3
  gets ENOSYS so libc falls back to clone; threads, fork and subprocess work); no ptrace,
  process_vm_*, pidfd_getfd, kcmp; no keyctl/add_key/request_key; no mount API, pivot_root, chroot;
  no bpf, perf_event_open, userfaultfd, io_uring, kexec or module loading; no memfd_create or
  memfd_secret, and no SysV IPC (shmget, semget, msgget) or POSIX message queues: each holds memory
  outside RLIMIT_AS and outlives a run. 32-bit and x32 syscalls are refused. (x86_64 and aarch64.)
- uid: as root, code runs under an unprivileged uid per slot and per session (RLIMIT_NPROC is not
  enforced for root), with no_new_privs, so it cannot signal other slots, the zygote or
  the trainer, nor write anything it does not own. Processes are made dumpable again (to see their own
  children under hidepid and read /proc/self/pagemap); ptrace is refused anyway, and a uid serves one
  execution or one session at a time. SysV IPC objects a uid owns or created (were the filter missing)
  are removed after each run of a slot, when a session closes, before a uid is given to a new session,
  when a zygote starts and exits, and by Sandbox.close() (a zygote killed before it could clean up).
- rlimits: address space (preloaded libraries plus memory_mb), CPU (a backstop for the zygote's
  kill), file size, open files, processes (with a uid), core dumps off.
- a scrubbed environment (no secrets from the trainer), stdin from /dev/null unless given.
- the zygote is a child subreaper: setsid and double-fork escapees are reparented to it and killed
  after every execution; fork bombs are capped by the uid's RLIMIT_NPROC and killed the same way.
- session control: a cell, and whatever it forks, holds no socket the zygote reads: its runner's
  socket is receive-only (the zygote shut its own reading side), the holder's is closed in the runner,
  and a committed runner gets a fresh one only after the cell's forks are killed. The zygote reads
  what session processes send a bounded number of messages at a time, checking the deadline between.

What is not covered
- Kernel exploits: this is namespaces, uids, rlimits and seccomp, not a VM (gVisor/Firecracker).
- Without bwrap: the filesystem is the host's (less the tmpfs above, with root). A slot uid cannot write
  root-owned files, but it can read world-readable files, and cannot import modules not preloaded
  from directories it cannot enter (e.g. /root/.pyenv). Without root (no mount namespace) the
  checkout, problem sets and caches are not hidden.
- Without root and without bwrap (the bare mode: seccomp and rlimits only): no uid separation, so code
  can signal or read other processes of the same user (including the trainer), read every process's
  command line in /proc, write the host's /tmp, /var/tmp and /dev/shm (files there are memory outside
  memory_mb when they are tmpfs, and stay after the run), kill its own zygote (the pool respawns it) and
  fork without a process cap; escapees survive if the zygote itself is killed. Sandbox() says so on
  stderr when it starts like this.
- Memory is an address-space limit, not a cgroup (cgroup v2 is not assumed): it bounds each process,
  not a tree of them. Memory outside it is capped, not counted: the tmpfs above (/tmp at scratch_mb,
  /dev/shm 64 MB, 16 MB for each of the others) per slot; memfd, SysV and POSIX queues are refused.
- Threads a committed cell leaves in a session's holder run in the process that talks to the zygote,
  so they can write to its control socket: the bounded reads keep the zygote on time, and a session
  they break only fails its own later cells.
- Scratch files of a session persist across its cells and are not rolled back with a failed cell;
  threads started in a cell do not survive into the next cell (each cell is a new process).
- `ok` follows the process: `sys.exit(0)` and `os._exit(0)` count as success. Graders that must
  know the tests ran to the end should print a sentinel after them and check stdout.
"""

import asyncio
import functools
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

from machinery import sandbox_pool
from machinery.sandbox_pool import FRAME_LINES_MAX, MAX_FRAMES, NAME_MAX, TEXT_MAX  # noqa: F401  (a result's bounds)

ERROR_KINDS = ("none", "exception", "syntax", "timeout", "memory", "output_limit", "crash", "sandbox_internal")
# Why a session cell's result says the session's state was lost (ExecResult.state_lost): its process had died
# before the cell, stopped responding, or was killed by the cell; the sandbox worker died during the cell, or
# restarted since the last one.
STATE_LOSSES = ("holder_died", "holder_hung", "holder_killed", "worker_died", "restarted")
WALL_BACKSTOP = 3.0  # clock="cpu": the wall-clock limit, as a multiple of the CPU-time limit
SYSTEM_TOP = ("bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "nix", "proc", "run", "sbin", "sys", "tmp", "usr",
              "var")  # the top-level folders the code sees; _hidden empties the others


# -----------------------------------------------------------------------------
# What a call returns

class Frame(NamedTuple):
    """One frame of the code's traceback (outermost first)."""
    filename: str  # "<cell>" (a run), "<cell N>" (a session's Nth cell), or a library file, by its path below sys.path
    lineno: int | None
    name: str  # the function, or "<module>"
    line: str  # its source line, stripped ("" when there is none)
    repeats: int = 0  # how many times more it came right after itself (recursion), folded into this one


@dataclass
class ExecResult:
    """What one execution did, as facts; tools.tool_text words them for the model. The only text in it is the
    code's own (its output) and Python's (its text for an exception)."""
    ok: bool
    error_kind: str  # one of ERROR_KINDS
    stdout: str  # what the code printed; when longer than max_output_bytes, its head and tail with
    # "... [N bytes cut] ..." between them, so that a cut stream never equals a whole one (graders rely on it)
    stderr: str  # the same
    bytes_cut: int = 0  # bytes dropped from the middle of stdout + stderr
    duration_s: float = 0.0  # wall time of the execution itself, not of waiting for a slot
    timeout_s: float = 0.0  # the limits it ran under: time (on the Sandbox's clock), memory, output
    memory_mb: int = 0
    flood_bytes: int = 0
    exception_type: str | None = None  # exception, syntax, memory: the class name, e.g. "ZeroDivisionError"
    # exception, syntax: the exception as a Python traceback ends with it, e.g. "numpy.linalg.LinAlgError: Singular
    # matrix" (with its notes; for a SyntaxError, the line and a caret above), and the characters dropped from its
    # middle when longer than TEXT_MAX
    exception_text: str = ""
    exception_cut: int = 0
    frames: list = field(default_factory=list)  # exception: [Frame] of the code, and the innermost library frame
    frames_omitted: int = 0  # frames left out between the first and the last MAX_FRAMES // 2
    message: str = ""  # memory: the MemoryError's own message ("" for a bare one)
    line: int | None = None  # memory: the line of the cell that ran out
    signal: int | None = None  # crash: the signal that killed the process
    exit_status: int | None = None  # crash: the status the process exited with before the code finished
    sandbox_killed: bool = False  # crash: the code killed the sandbox process running it (twice)
    detail: str = ""  # sandbox_internal: what failed, for the logs
    state_lost: str = ""  # session cells: why the session's state was lost (one of STATE_LOSSES); "" when kept


# -----------------------------------------------------------------------------
# The API

class Sandbox:
    """A pool of warm zygotes running model-written Python. See the module docstring."""

    def __init__(self, slots: int | None = None, timeout_s: float = 4.0, memory_mb: int = 1024,
                 max_output_bytes: int = 65536, flood_bytes: int = 4_000_000, scratch_mb: int = 512,
                 use_bwrap: bool = True, use_netns: bool = True, use_uid: bool = True,
                 max_threads: int = 64, hide: tuple = (), clock: str = "wall"):
        """slots: zygotes, i.e. cells executing at once (default: the core count).
        timeout_s: time limit per call (per-call `timeout_s=` overrides it), on `clock`.
        clock: "wall", the wall clock; or "cpu", the CPU time of the code's process (its threads, and the children
        it waited for), with the wall clock at WALL_BACKSTOP times the limit for code that sleeps or forks. A
        CPU-time limit gives the same verdicts on a loaded machine as on a quiet one.
        memory_mb: address space a call may add on top of the preloaded libraries.
        max_output_bytes: stdout and stderr each keep this many bytes (half head, half tail).
        flood_bytes: a call printing more than this in total is killed (kind output_limit).
        scratch_mb: size of the private /tmp (bwrap) and largest file a call may write.
        use_bwrap / use_netns / use_uid: allow that layer when available (False forces the
        weaker fallbacks, for tests); use_netns covers the namespaces root makes without bwrap (network
        and mount). max_threads: threads serving arun() callers.
        hide: more folders the code must not see (a run's output folder), besides this checkout, the
        problem sets beside it and the caches (`_hidden`); with bwrap each becomes an empty tmpfs."""
        if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes < 2 or flood_bytes <= 0 or scratch_mb <= 0:
            raise ValueError("Sandbox: timeout_s, memory_mb, flood_bytes, scratch_mb must be > 0 and max_output_bytes >= 2")
        if slots is not None and slots < 1:
            raise ValueError(f"Sandbox: slots must be >= 1, got {slots}")
        if clock not in ("wall", "cpu"):
            raise ValueError(f"Sandbox: clock must be 'wall' or 'cpu', got {clock!r}")
        self.clock = clock
        self.slots = int(slots or os.cpu_count() or 1)
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.flood_bytes = max(int(flood_bytes), self.max_output_bytes)
        self.scratch_mb = int(scratch_mb)
        limits = {"memory_mb": self.memory_mb, "keep": self.max_output_bytes, "flood": self.flood_bytes,
                  "fsize": self.scratch_mb << 20}
        self._pool = sandbox_pool.Pool(self.slots, limits, use_bwrap, use_netns, use_uid, max_threads,
                                       _hidden(hide), _REFUSED_SYSCALLS)
        self.layers = list(self._pool.layers)
        if "bwrap" not in self.layers and "hidepid" not in self.layers:
            print("sandbox: without bwrap, and without root for a mount namespace, the code can read other processes'"
                  " command lines (/proc/*/cmdline) and write the host's /tmp, /var/tmp and /dev/shm", file=sys.stderr)

    def run(self, code: str, *, timeout_s: float | None = None, stdin: str | None = None,
            echo: bool = False) -> ExecResult:
        """Run `code` in a fresh namespace and process. Never raises for anything the code does.

        echo: print the repr of a final bare expression when it is not None, as the official CLEANER tool does
        (off: the code is a plain script)."""
        timeout = _call_timeout(code, timeout_s, stdin, self.timeout_s)
        req = {"op": "run", "code": code, "stdin": stdin, "echo": bool(echo), **_time_limits(timeout, self.clock)}
        resp, deaths = None, 0
        for _ in range(2):  # one retry of the sandbox's own failures
            resp = self._pool.run(req, req["wall"])
            if resp is None:
                deaths += 1
            elif resp["kind"] != "sandbox_internal" or resp.get("retry") is False:
                break
        if resp is None and deaths == 2:
            # The worker died under this code twice running: the code kills its own sandbox
            # (possible only without a separate uid), which is the code's failure, not ours.
            resp = {"kind": "crash", "sandbox_killed": True}
        return _exec_result(resp, timeout, self)

    async def arun(self, code: str, *, timeout_s: float | None = None, stdin: str | None = None,
                   echo: bool = False) -> ExecResult:
        """`run` for asyncio callers: the event loop keeps generating while the code runs."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool.executor, functools.partial(self.run, code, timeout_s=timeout_s,
                                                                                 stdin=stdin, echo=echo))

    def session(self, rollback: bool = True) -> "Session":
        """A stateful session. rollback=False keeps partial effects of cells that raise."""
        sid, worker, uid = self._pool.open_session()
        return Session(self, sid, worker, uid, rollback)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Session:
    """Variables persist across cells; a failing cell leaves them as they were (see the module docstring)."""

    def __init__(self, sb: Sandbox, sid: int, worker: int, uid: int | None, rollback: bool):
        self._sb, self.sid, self._worker, self._uid, self.rollback = sb, sid, worker, uid, rollback
        self._generation = None  # worker generation the holder was created in; None before the first cell
        self._opened = [False]  # shared with the finalizer: does the zygote hold processes for us?
        self.closed = False
        # A session dropped without close() is closed at the next use of its worker (never from GC itself).
        self._finalizer = weakref.finalize(self, sandbox_pool.end_session, sb._pool, worker, sid, uid, self._opened,
                                           True)

    def run(self, code: str, *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        if self.closed:
            raise RuntimeError(f"session {self.sid} is closed")
        timeout = _call_timeout(code, timeout_s, stdin, self._sb.timeout_s)
        req = {"op": "cell", "sid": self.sid, "uid": self._uid, "rollback": self.rollback,
               "code": code, "stdin": stdin, **_time_limits(timeout, self._sb.clock)}
        return _exec_result(self._sb._pool.cell(self, req, req["wall"]), timeout, self._sb)

    async def arun(self, code: str, *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._sb._pool.executor,
                                          functools.partial(self.run, code, timeout_s=timeout_s, stdin=stdin))

    def close(self) -> None:
        """Kill the session's processes. Never blocks on a busy worker: then the close is queued."""
        if self.closed:
            return
        self.closed = True
        self._finalizer.detach()
        sandbox_pool.end_session(self._sb._pool, self._worker, self.sid, self._uid, self._opened, False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _call_timeout(code, timeout_s, stdin, default: float) -> float:
    """The timeout of a call, once its arguments are checked."""
    if not isinstance(code, str):
        raise TypeError(f"Sandbox.run: code must be str, got {type(code).__name__}")
    if stdin is not None and not isinstance(stdin, str):
        raise TypeError(f"Sandbox.run: stdin must be str or None, got {type(stdin).__name__}")
    timeout = default if timeout_s is None else float(timeout_s)
    if timeout <= 0:
        raise ValueError(f"Sandbox.run: timeout_s must be > 0, got {timeout_s}")
    return timeout


def _time_limits(timeout: float, clock: str) -> dict:
    """A request's limits: `timeout` on its clock, and the wall-clock deadline the zygote enforces."""
    return {"timeout": timeout, "cpu": clock == "cpu", "wall": timeout * (WALL_BACKSTOP if clock == "cpu" else 1)}


def _exec_result(resp: dict | None, timeout: float, sb: Sandbox) -> ExecResult:
    """The zygote's answer (checked there: _verdict) as an ExecResult; None when the zygote died or hung."""
    if resp is None:
        resp = {"kind": "sandbox_internal", "detail": "the sandbox worker died or stopped answering"}
    kind = resp["kind"]
    return ExecResult(ok=kind == "none", error_kind=kind, stdout=resp.get("stdout", ""), stderr=resp.get("stderr", ""),
                      bytes_cut=resp.get("cut", 0), duration_s=resp.get("duration", 0.0), timeout_s=timeout,
                      memory_mb=sb.memory_mb, flood_bytes=sb.flood_bytes, exception_type=resp.get("exception_type"),
                      exception_text=resp.get("exception_text", ""), exception_cut=resp.get("exception_cut", 0),
                      frames=[Frame(*f) for f in resp.get("frames", ())], frames_omitted=resp.get("frames_omitted", 0),
                      message=resp.get("message", ""), line=resp.get("line"), signal=resp.get("signal"),
                      exit_status=resp.get("exit_status"), sandbox_killed=resp.get("sandbox_killed", False),
                      detail=resp.get("detail", ""), state_lost=resp.get("state_lost", ""))


# -----------------------------------------------------------------------------
# Containment policy: what the code must not see, and the syscalls it may not make (the rest of the
# layers, and what they leave open, are in the module docstring)

def _hidden(extra=()) -> list:
    """Folders the code must not read although the host may show them to anyone: this checkout (the graders,
    tests and run folders), the problem sets beside it (their answers: a policy could learn to read them),
    the caches, the caller's own, and the host's top-level folders but the system's (SYSTEM_TOP: the home
    folders, /opt, /srv, /mnt, ...). bwrap hides them, and so does the fallback's mount namespace (mountns)."""
    repo = os.path.dirname(os.path.abspath(__file__))
    cands = [repo, os.path.join(os.path.dirname(repo), "shared"), os.environ.get("CLEANER_DATA"),
             os.environ.get("CLEANER_CACHE"), os.path.join(os.path.expanduser("~"), ".cache", "cleaner"), *extra]
    # and every top-level folder but the system's, so that no listing shows where the checkout lives
    cands += [os.path.join("/", n) for n in os.listdir("/") if n not in SYSTEM_TOP]
    found = {os.path.realpath(p) for p in cands if p and os.path.isdir(p) and not os.path.islink(p)}
    found -= {"/", "/tmp", "/usr", "/etc"}
    return sorted(p for p in found if not any(p.startswith(q + "/") for q in found))  # the outermost


# Syscalls model code never needs, each a way out of the sandbox, into another execution, or onto kernel
# attack surface (x86_64, aarch64 numbers). Refused with EPERM in every mode once the sandbox's own set-up
# is done (see _lock_down). clone is refused only with namespace flags, and clone3 (its flags sit in a
# struct seccomp cannot read) with ENOSYS, so that libc falls back to clone: threads, fork and
# subprocess keep working. Sockets: socket(), bind() and connect() are refused outright, and so are
# sendto() with an address and sendmsg() (whose address seccomp cannot read): so no listener, abstract or
# pathname, can exist, and no socket can reach one (a datagram socketpair() end could otherwise send to
# any named socket of the host or of another session); SO_PASSCRED, whose autobind names a socket, is
# refused too. socketpair() itself (multiprocessing.Pipe, asyncio) and send() to its peer stay. SysV IPC
# and POSIX message queues would outlive a run and hold memory outside RLIMIT_AS, as
# would memfd_create (the sandbox's own memfds are made by the zygote, never in the code's process).
_REFUSED_SYSCALLS = {
    "socket": (41, 198), "bind": (49, 200), "connect": (42, 203), "sendmsg": (46, 211), "sendmmsg": (307, 269),
    "unshare": (272, 97), "setns": (308, 268),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "kcmp": (312, 272),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "shmget": (29, 194), "semget": (64, 190), "msgget": (68, 186), "mq_open": (240, 180),
}
