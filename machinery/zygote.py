"""sandbox.py's machinery inside the sandbox: the zygote's program. The trainer's side, the pool of zygotes behind a
Sandbox, is machinery/sandbox_pool.py, which this file never imports.

sandbox.py says what a call returns and what each layer stops; this file is how. It is the zygote's program:
`python -I -B zygote.py --zygote` imports nothing of the project but this file, and reads everything else it
needs (the folders to hide, the syscalls to refuse, the limits) from the config the pool sends it first.
Nothing of the paper is here: CLEANER's code interpreter is sandbox.py's API.

What runs where
- One zygote per slot: a clean `python -I -B zygote.py --zygote`, started with subprocess (never by
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
import ast
import ctypes
import errno
import fcntl
import functools
import gc
import itertools
import json
import linecache
import os
import random
import resource
import select
import signal
import socket
import stat
import struct
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, field

THIS_FILE = os.path.abspath(__file__)  # the zygote's program (sandbox_pool.Pool._spawn runs it by path)
NPROC_LIMIT = 128  # processes + threads per uid: room for a Pool, not for a fork bomb
NOFILE_LIMIT = 512
MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, breaking copy-on-write, in one call
BACKGROUND_NICE = 10  # session processes between cells: copying ahead yields to the cells of other sessions
COPY_AHEAD_MAX_PAGES = 4096  # 16 MiB: the most a session runner copies (and holds twice) before its cell
# Bounds of what a result carries from the code's process (the child keeps to them, the zygote enforces them)
TEXT_MAX = 65536  # characters of a text: a longer exception text keeps its head and tail (exception_cut)
MAX_FRAMES = 64  # frames of a traceback: past it, the first and the last half (frames_omitted)
NAME_MAX = 1000  # characters of a frame's file or function name
FRAME_LINES_MAX = 200_000  # characters of the frames' source lines together; past it, each gets an equal share


# -----------------------------------------------------------------------------
# Framing shared by the trainer (sandbox_pool.py) and the zygotes: 4-byte big-endian length, then JSON.

def _write_frame(fd: int, obj) -> None:
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while len(buf) < n:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not poller.poll(wait * 1000 + 1):
                raise TimeoutError("no answer from the sandbox worker")
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("sandbox worker closed its pipe")
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, deadline: float | None = None):
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    return json.loads(_read_exact(fd, n, deadline))


# -----------------------------------------------------------------------------
# Process-tree helpers, used by both sides (sandbox_pool.py: _kill_tree).

def _proc_table() -> dict:
    """pid -> (ppid, state letter, start time) for every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (rest := _stat_fields(f"/proc/{name}/stat")) is not None:
            table[int(name)] = (int(rest[1]), rest[0], rest[19])
    return table


def _stat_fields(path: str) -> list | None:
    """The fields of a /proc/.../stat file after the command name (the state letter first); None
    when it cannot be read (the process is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, 1024)
        finally:
            os.close(fd)
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def _descendants(table: dict, root: int, keep: set = frozenset(), keep_children_of: set = frozenset()) -> list:
    """Every process below `root`, minus the pids in `keep` and the direct children of the pids in
    `keep_children_of` (but not the children of either)."""
    children = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in keep and table[pid][0] not in keep_children_of:
            out.append(pid)
        todo += children.get(pid, [])
    return out


def _kill_tree(root: int) -> None:
    for _ in range(50):
        victims = [root] + _descendants(_proc_table(), root)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if len(victims) == 1:
            return
        time.sleep(0.01)


# -----------------------------------------------------------------------------
# Zygote side: runs in the clean interpreter started by sandbox_pool.Pool._spawn, never in the trainer.

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 22, 36
CLONE_NEWNET = 0x40000000


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column above
NR_CLONE, NR_CLONE3 = {"x86_64": 56, "aarch64": 220}, 435
NR_SETSOCKOPT, NR_SENDTO = {"x86_64": 54, "aarch64": 208}, {"x86_64": 44, "aarch64": 206}
CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
SO_PASSCRED, SO_PASSPIDFD = 16, 76


def _seccomp_program(refused: dict) -> bytes | None:
    """The BPF filter of the refused syscalls (sandbox.py's _REFUSED_SYSCALLS: name -> x86_64, aarch64 numbers);
    it also refuses every 32-bit and x32 syscall (a second ABI with other numbers). None on an architecture we
    have no numbers for."""
    machine = os.uname().machine
    if machine not in _ARCHES:
        return None
    audit_arch, col = _ARCHES[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    arg = lambda i: 16 + 8 * i  # the low 32 bits of args[i] in struct seccomp_data (little-endian)
    # (code, k, jump-if-true label, jump-if-false label); a label is resolved to an offset below
    prog = [(ld, 4, None, None), (jeq, audit_arch, "nr", "eperm"),
            ("nr", None, None, None), (ld, 0, None, None), (jge, 0x40000000, "eperm", None),  # x32
            (jeq, NR_CLONE[machine], "clone", None), (jeq, NR_CLONE3, "enosys", None),
            (jeq, NR_SETSOCKOPT[machine], "sockopt", None), (jeq, NR_SENDTO[machine], "sendto", None)]
    prog += [(jeq, nrs[col], "eperm", None) for nrs in refused.values()]
    prog += [(ret, allow, None, None),
             ("clone", None, None, None), (ld, arg(0), None, None), (jset, CLONE_NAMESPACES, "eperm", "allow"),
             ("sockopt", None, None, None), (ld, arg(1), None, None), (jeq, socket.SOL_SOCKET, None, "allow"),
             (ld, arg(2), None, None), (jeq, SO_PASSCRED, "eperm", None), (jeq, SO_PASSPIDFD, "eperm", "allow"),
             ("sendto", None, None, None), (ld, arg(4), None, None), (jeq, 0, None, "eperm"),  # dest_addr == NULL
             (ld, arg(4) + 4, None, None), (jeq, 0, "allow", "eperm"),
             ("allow", None, None, None), (ret, allow, None, None),
             ("eperm", None, None, None), (ret, eperm, None, None),
             ("enosys", None, None, None), (ret, enosys, None, None)]
    labels, code = {}, []
    for ins in prog:
        if isinstance(ins[0], str):
            labels[ins[0]] = len(code)
        else:
            code.append(ins)
    out = b""
    for i, (op, k, t, f) in enumerate(code):
        jt, jf = (0 if x is None else labels[x] - i - 1 for x in (t, f))
        assert 0 <= jt < 256 and 0 <= jf < 256
        out += struct.pack("HBBI", op, jt, jf, k)
    return out


def _install_seccomp(program: bytes) -> None:
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buf = ctypes.create_string_buffer(program)
    prog = Prog(len(program) // 8, ctypes.addressof(buf))
    if _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(prog), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


CLONE_NEWNS, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x20000, 0x2, 0x4, 0x8, 0x4000, 0x40000
MS_RDONLY, MS_REMOUNT, MS_BIND = 0x1, 0x20, 0x1000


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target} failed")


def _mount_tmpfs(path: str, size: int, mode: int) -> None:
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode:o}")


def _private_mounts(cfg: dict) -> bool:
    """Root without bwrap: a mount namespace of this zygote's own, so that what bwrap hides is hidden here
    too: the host's world-writable /tmp and /var/tmp (files the code could leave, memory outside its limit),
    the sockets in /run, and the host's /dev/shm, replaced by size-capped tmpfs (/dev/shm is wiped after
    every execution), and the folders of sandbox._hidden (cfg["hide"]: this checkout, the problem sets, the caches,
    the run folders), replaced by empty ones. What the zygote itself still needs below them (the interpreter,
    a venv, this file) is bound back read-only, as bwrap binds it: held open before it is covered, and bound
    from that descriptor after. Mounting nothing in the host's namespace: everything is private first."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        return False
    covered = [(path, size, mode) for path, size, mode in
               (("/tmp", cfg["fsize"], 0o755), ("/var/tmp", 16 << 20, 0o755), ("/run", 16 << 20, 0o755),
                ("/var/crash", 16 << 20, 0o755), ("/dev/shm", 64 << 20, 0o1777))
               if os.path.isdir(path) and not os.path.islink(path)]
    for path in sorted(cfg.get("hide", ())):  # one below a covered folder is hidden with it
        if os.path.isdir(path) and not any(path == c or path.startswith(c + "/") for c, _, _ in covered):
            covered.append((path, 1 << 20, 0o755))
    held, moved = {}, cfg.get("moved", {})  # where a held folder or file goes -> its descriptor
    try:
        _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing mounted below reaches the host
        hosts = []
        for path in sorted({os.path.realpath(p) for p in _zygote_needs()} | set(moved)):
            if any(path == c or path.startswith(c + "/") for c, _, _ in covered) and \
                    not any(path.startswith(h + "/") for h in hosts):
                hosts.append(path)
                held[moved.get(path, path)] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        for path, size, mode in covered:
            _mount_tmpfs(path, size, mode)
        for path, fd in held.items():
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, 0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
                open(path, "a").close()
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            _mount("none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError as e:
        print(f"sandbox: private mounts failed ({e}); the code sees the host's /tmp, /var/tmp, /run, /dev/shm", file=sys.stderr)
        return False
    finally:
        for fd in held.values():
            os.close(fd)
    return True


def _zygote_needs() -> set:
    """What a zygote reads after it starts: the interpreter's folders (a venv's too) and this file."""
    return {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.realpath(sys.executable)), os.path.realpath(THIS_FILE)}


def _hide_pids() -> bool:
    """In a mount namespace of our own: a new /proc (one instance per mount since Linux 5.8, so the
    host's /proc keeps its options) with hidepid=invisible: the code sees only the processes of its own
    uid, never the trainer's or another session's command lines. The zygote (root) still sees all."""
    release = tuple(int(v) for v in os.uname().release.split("-")[0].split(".")[:2] if v.isdigit())
    if release < (5, 8):  # an older kernel would change the options of the host's /proc itself
        return False
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    except OSError:
        return False
    return True


IPC_RMID = 0


def _remove_ipc(uids) -> int:
    """Remove the SysV shared memory segments, semaphore sets and message queues that one of `uids` owns
    or created (/proc/sysvipc lists those of our IPC namespace). The filter refuses to create them, so
    this guards what the filter cannot (an architecture without one): they outlive a run and a session,
    and a later execution of the same uid could read them. Returns how many were removed."""
    removed = 0
    for kind, rm in (("shm", lambda i: _libc.shmctl(i, IPC_RMID, None)), ("sem", lambda i: _libc.semctl(i, 0, IPC_RMID)),
                     ("msg", lambda i: _libc.msgctl(i, IPC_RMID, None))):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                head, *rows = f.read().splitlines()
        except (OSError, ValueError):
            continue
        cols = head.split()
        uid_col, cuid_col = cols.index("uid"), cols.index("cuid")
        for row in rows:
            fields = row.split()
            if int(fields[uid_col]) in uids or int(fields[cuid_col]) in uids:
                removed += rm(int(fields[1])) == 0
    return removed


def _seccomp_works(program: bytes) -> bool:
    """Whether this kernel takes the filter (a child tries), so that a kernel without seccomp loses the
    layer, not every execution."""
    pid = os.fork()
    if pid == 0:
        try:
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            _install_seccomp(program)
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


class _ParentGone(Exception):
    pass


@dataclass
class _Zygote:
    cfg: dict
    req_fd: int
    uid: int | None  # None when running without uid separation
    scratch: str  # the stateless scratch dir
    seccomp: bytes | None
    renice: bool  # may lower a session runner's nice value (CAP_SYS_NICE): its set-up runs in the background
    private_shm: bool = False  # /dev/shm is our own tmpfs (bwrap, mountns): wiped after every execution
    sessions: dict = field(default_factory=dict)  # sid -> _Holder
    reaped: dict = field(default_factory=dict)  # pid -> wait status, for children reaped by sweeps
    dying: dict = field(default_factory=dict)  # pid -> start time: SIGKILLed, maybe still tearing down
    after: object = None  # work left once the response is written (settling a cell, forking the spare)
    spare: "_Spare | None" = None
    hot: list = field(default_factory=list)  # [(address, length)]: what a stateless run writes, copied ahead


class _Capture:
    """Keeps the first and the last keep/2 bytes of a stream and counts what is cut between them."""

    def __init__(self, keep: int):
        self.half, self.head, self.tail, self.total = keep // 2, bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 4 * self.half:
                del self.tail[:-self.half]

    def render(self) -> tuple:
        tail = self.tail[-self.half:] if self.half else b""
        cut = self.total - len(self.head) - len(tail)
        text = self.head.decode("utf-8", "replace")
        if cut:
            text += f"\n... [{cut} bytes cut] ...\n"
        return text + tail.decode("utf-8", "replace"), cut


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
    """The fallback's zygote, once its mount namespace shows its venv and this file at their place (_placed):
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


PROBE_CODE = ("import sympy as sp, numpy as np\nx = sp.Symbol('x')\n"
              "print(sp.solve(x**2 - 7*x + 12, x), int(np.arange(10).sum()), np.linalg.norm(np.ones(4)))\n")


def _learn_hot_pages() -> list:
    """The pages a typical stateless run writes, for the spare children to copy ahead (see
    "copy-on-write ahead of a cell"): a child runs PROBE_CODE the way a run would and lists them."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            _std_streams()
            _exec_code(PROBE_CODE, _fresh_main(), "<cell>", echo=False, res_fd=null)
            data = json.dumps(_written_pages()).encode()
            with open(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(0)
    os.close(w)
    with open(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    try:
        return [(int(a), int(n)) for a, n in json.loads(data)]
    except (ValueError, TypeError):
        return []


def _setpriority(pid: int, nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass  # gone, or not allowed: only speed depends on it


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


def _make_scratch(path: str, uid: int | None) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    if uid is not None:
        os.chown(path, uid, uid)


def _wipe_scratch(path: str, uid: int | None) -> None:
    with os.scandir(path) as it:
        if next(it, None) is None:
            return
    _rmtree(path)
    if os.path.exists(path):  # something undeletable: leave it and start a new dir
        os.rename(path, f"{path}.trash{time.monotonic_ns()}")
    _make_scratch(path, uid)


def _rmtree(path: str) -> None:
    """shutil.rmtree(path, ignore_errors=True) without recursion, and with paths of one name only.

    The code can build a tree thousands of levels deep (mkdir + chdir in a loop): shutil's recursion then
    raises RecursionError, which would leave a worker that answers every later call with an internal
    error, and the tree's full paths outgrow PATH_MAX. This walks down and up with directory fds (one open
    at a time). Best effort, like ignore_errors: what cannot be removed stays, and the caller checks."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    stuck: set = set()  # (st_dev, st_ino) of directories that could not be entered or removed
    down: list = []  # (name, key) of the directories we are inside, below path
    while True:
        sub = None
        try:
            names = os.listdir(fd)
        except OSError:
            names = []
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):  # not a directory: unlink it
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
            elif (st.st_dev, st.st_ino) not in stuck:
                sub = (name, (st.st_dev, st.st_ino))
                break
        if sub is not None:
            try:
                os.chmod(sub[0], 0o700, dir_fd=fd)  # a directory the code made unreadable (0o000)
            except OSError:
                pass
            try:
                inner = os.open(sub[0], flags, dir_fd=fd)
            except OSError:
                stuck.add(sub[1])
                continue
            os.close(fd)
            fd = inner
            down.append(sub)
            continue
        if not down:
            break
        try:
            parent = os.open("..", flags, dir_fd=fd)
        except OSError:
            break
        finally:
            os.close(fd)
        fd = parent
        name, key = down.pop()
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            stuck.add(key)
    if down:  # lost our way up ("..": cannot happen unless the tree moves under us); the caller checks
        return
    os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _wipe_shm(z: _Zygote) -> None:
    """Our own /dev/shm (bwrap, mountns) must not carry anything from one execution to the next."""
    if not z.private_shm:
        return
    with os.scandir("/dev/shm") as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                _rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _pipes() -> tuple:
    """(out_r, out_w), (err_r, err_w), (res_r, res_w): the zygote's read ends are non-blocking."""
    pairs = [os.pipe() for _ in range(3)]
    for r, _ in pairs:
        os.set_blocking(r, False)
    return pairs


def _enter_sandbox(z: _Zygote, uid: int | None, scratch: str) -> None:
    """In a fresh child, before any model code: limits, uid, no_new_privs, environment (the filter
    comes last, once the child's own set-up is done: _lock_down)."""
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch)
    tempfile.tempdir = scratch
    vm_bytes = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    limit = vm_bytes + (z.cfg["memory_mb"] << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (z.cfg["fsize"], z.cfg["fsize"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE_LIMIT, NOFILE_LIMIT))
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # Changing uid cleared "dumpable", which hands /proc/<pid> to root: with hidepid the code would not
        # see its own children, and a session's _written_pages reads /proc/self/pagemap. A uid runs one
        # execution (a slot's) or one session at a time, and the filter refuses ptrace: this opens nothing.
        _prctl(PR_SET_DUMPABLE, 1)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # setuid binaries cannot give privileges back
    seed = int.from_bytes(os.urandom(4), "little")  # forks share the zygote's RNG state: reseed both
    random.seed(seed)
    sys.modules["numpy"].random.seed(seed)


def _lock_down(z: _Zygote) -> None:
    """The last step of a child's set-up, before it waits for code: the seccomp filter (see
    sandbox.py's _REFUSED_SYSCALLS). Installed once per process tree: a session's runners inherit their holder's, and
    stacking one per cell would slow every syscall and hit the kernel's limit on filter length."""
    if z.seccomp is not None:
        _install_seccomp(z.seccomp)


def _set_cpu_limit(timeout: float, hard: bool) -> None:
    # A backstop behind the zygote's SIGKILL. Sessions keep a looser hard limit (an hour of
    # CPU, never infinite: the code could raise its soft limit to it) so that a later cell with a longer
    # timeout can still raise the soft one.
    soft = int(timeout) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft if hard else max(soft, 3600)))


def _std_streams() -> None:
    sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    # Line-buffered, so what was printed before a timeout kill is still shown.
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)


def _memfd(name: str, data: bytes) -> int:
    """A file descriptor that reads `data` from its start."""
    fd = os.memfd_create(name)
    os.write(fd, data)  # memfd writes never block, whatever the size
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _request_fds(req: dict) -> list:
    """In the zygote: the two fds a waiting child gets with "run", a memfd of the request as JSON and the
    code's stdin (a memfd too, or /dev/null). Made here because the code's process may not make memfds."""
    payload = _memfd("code", json.dumps({k: req.get(k) for k in ("code", "timeout", "echo", "cell", "nice")}).encode())
    stdin = _memfd("stdin", req["stdin"].encode()) if req["stdin"] is not None else os.open(os.devnull, os.O_RDONLY)
    return [payload, stdin]


def _take_request(fds: list) -> dict:
    """In a waiting child: read the request the zygote sent (_request_fds), and give the code its stdin."""
    payload, stdin = fds
    with open(payload, "rb") as f:
        req = json.loads(f.read())
    os.dup2(stdin, 0)
    os.close(stdin)
    return req


def _fresh_main() -> dict:
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main  # so pickle and multiprocessing find functions defined by the code
    sys.argv = [""]
    return main.__dict__


def _internal_failure(res_fd: int) -> None:
    try:
        traceback.print_exc()
        e = sys.exc_info()[1]
        _write_frame(res_fd, {"kind": "sandbox_internal", "detail": f"{type(e).__name__}: {e}"[:300]})
    finally:
        os._exit(121)


@dataclass
class _Spare:
    """A child forked ahead for the next stateless run: in the sandbox, its streams set, waiting
    on `ctl` for the code."""
    pid: int
    pidfd: int
    ctl: socket.socket
    pipes: tuple  # (out_r, err_r, res_r); the child holds the write ends

    def close(self) -> None:
        for fd in (self.pidfd, *self.pipes):
            os.close(fd)
        self.ctl.close()


def _fork_spare(z: _Zygote) -> _Spare:
    """Fork the child of the next stateless run, which enters the sandbox and waits for its code,
    so that neither the fork nor the set-up sits between a request and the code."""
    if z.uid is not None:
        _remove_ipc({z.uid})  # what the slot's last run (or a dead zygote of ours) left: never seen by the next
    pairs = _pipes()
    ctl_z, ctl_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ctl_z.close()
            os.setsid()
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            fds = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64)
                   for fd in (os.open(os.devnull, os.O_RDONLY), pairs[0][1], pairs[1][1], pairs[2][1], ctl_c.fileno())]
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
            os.closerange(5, 1 << 16)  # the zygote's pipes and the other slots' fds are not the code's
            _enter_sandbox(z, z.uid, z.scratch)
            _std_streams()
            ns = _fresh_main()
            ctl = socket.socket(fileno=4)
            _lock_down(z)
            _copy_ahead(z.hot, ctl)
            fds = _await_message(ctl, b"run", 2, None)  # or leave, if the zygote lets us go
            ctl.close()  # the code never sees the zygote's socket
            req = _take_request(fds)
            _set_cpu_limit(req["timeout"], hard=True)
        except BaseException:
            _internal_failure(3)
        _exec_code(req["code"], ns, "<cell>", echo=req.get("echo", False), res_fd=3)
        os._exit(0)
    ctl_c.close()
    for _, w in pairs:
        os.close(w)
    if z.renice:  # by us, not by the child: a request may come before the child gets that far
        _setpriority(pid, BACKGROUND_NICE)
    return _Spare(pid, os.pidfd_open(pid), ctl_z, tuple(r for r, _ in pairs))


def _restock(z: _Zygote) -> None:
    """After a stateless run's answer is sent: wipe what the code left (a flood of files takes a while, which
    must not delay that answer), then fork the next spare, which finds an empty scratch dir."""
    _wipe_scratch(z.scratch, z.uid)
    _wipe_shm(z)
    z.spare = _fork_spare(z)


def _run_stateless(z: _Zygote, req: dict) -> dict:
    t0 = time.monotonic()
    spare, z.spare = z.spare, None
    if spare is not None and select.select([spare.pidfd], [], [], 0)[0]:
        spare.close()  # it died waiting (it never should)
        spare = None
    if spare is None:
        spare = _fork_spare(z)
    pid, pidfd, (out_r, err_r, res_r) = spare.pid, spare.pidfd, spare.pipes
    fds = _request_fds(dict(req, echo=bool(req.get("echo"))))
    state = None
    try:
        try:
            if z.renice:
                _setpriority(pid, 0)
            socket.send_fds(spare.ctl, [b"run"], fds)
        except OSError as e:  # it never got the code: the sandbox failed, not the code
            raise RuntimeError(f"the waiting child did not take the code ({e})") from None
        finally:
            for fd in fds:
                os.close(fd)
            spare.ctl.close()
        state = _supervise(z, out_r, err_r, res_r, t0 + req["wall"], pidfd, cpu=_cpu_limit(req, pid))
    finally:
        os.close(pidfd)
        if z.renice:
            _setpriority(pid, BACKGROUND_NICE)  # its teardown (milliseconds) yields to other slots' code
        _killpg(pid)  # the child leads its own session: one atomic kill takes a fork bomb down with it
        if state is not None and state["reason"] == "exited":
            state["status"] = os.waitpid(pid, 0)[1]  # already dead: its status tells how
        if state is None:
            state = _new_state(z)
            state["reason"] = "exited"
        state["duration"] = time.monotonic() - t0
        _sweep(z, *_spared(z))
        _drain(z, state, out_r, err_r, res_r)
        for fd in (out_r, err_r, res_r):
            os.close(fd)
    z.after = functools.partial(_restock, z)  # once the answer is sent: the wipe, then the next spare
    return _verdict(z, state)


def _new_state(z: _Zygote) -> dict:
    return {"out": _Capture(z.cfg["keep"]), "err": _Capture(z.cfg["keep"]), "res": bytearray(),
            "reason": None, "status": None}


def _cpu_limit(req: dict, pid: int) -> tuple | None:
    return (pid, req["timeout"]) if req.get("cpu") else None


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process: its threads', and that of the children it has waited for (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / _CLK_TCK  # utime, stime, cutime, cstime


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _supervise(z: _Zygote, out_r: int, err_r: int, res_r: int, deadline: float, pidfd: int,
               h: "_Holder | None" = None, runner: int | None = None, cpu: tuple | None = None) -> dict:
    """Drain output until the code finishes, times out or floods. Returns the state for _verdict.
    For a session cell, `pidfd` is the runner's; when it dies we wake its holder to report how.
    cpu: (pid, seconds): a timeout too when that process has used that much CPU time, read between polls."""
    state = _new_state(z)
    ctl = h.ctl if h is not None else None
    poller = select.poll()
    for fd in (out_r, err_r, res_r, z.req_fd):
        poller.register(fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    if ctl is not None:
        poller.register(ctl.fileno(), select.POLLIN)
    child_exit_seen = None
    while state["reason"] is None:
        wait = deadline - time.monotonic()
        if child_exit_seen is not None:  # the cell died; give its holder a moment to report how
            wait = min(wait, child_exit_seen + 0.5 - time.monotonic(), 0.05)
            if wait <= 0:
                state["reason"] = "exited"
                break
            _signal(h.pid, signal.SIGCONT)  # again: it may have stopped itself just after the last one
        if cpu is not None and child_exit_seen is None:
            left = cpu[1] - _cpu_seconds(cpu[0])
            if left <= 0:
                wait = 0
            else:  # its threads may use every core: look again before they could have used what is left
                wait = min(wait, max(left / (os.cpu_count() or 1), 0.01))
        if wait <= 0:
            state["reason"] = "timeout"
            break
        for fd, _ in poller.poll(wait * 1000 + 1):
            if fd == z.req_fd:
                raise _ParentGone()  # the trainer closed the pipe or died: stop everything
            if fd == pidfd:
                poller.unregister(fd)
                if h is None:
                    state["reason"] = "exited"
                else:
                    child_exit_seen = time.monotonic()
                    _signal(h.pid, signal.SIGCONT)  # the holder waitpid()s the runner and reports the status
            elif ctl is not None and fd == ctl.fileno():
                for kind, pid, value in _read_ctl(ctl, deadline=deadline):
                    if kind == "status" and pid == runner:
                        state["status"] = value
                        state["reason"] = "exited"
                    elif kind == "eof":
                        poller.unregister(fd)
            elif _pump(fd, out_r, err_r, res_r, state) is None:
                poller.unregister(fd)
            if state["reason"] is None and fd == res_r and (frame := _frame_complete(state["res"])) is not None:
                state["frame"], state["reason"] = frame, "result"
            if state["out"].total + state["err"].total > z.cfg["flood"]:
                state["reason"] = "flood"
    return state


def _pump(fd: int, out_r: int, err_r: int, res_r: int, state: dict) -> int | None:
    """Read what is there from one pipe into the state: the bytes read, None at EOF."""
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return 0
    if not data:
        return None
    if fd == res_r:
        if len(state["res"]) < (4 << 20):
            state["res"] += data
    else:
        state["out" if fd == out_r else "err"].add(data)
    return len(data)


def _drain(z: _Zygote, state: dict, out_r: int, err_r: int, res_r: int) -> None:
    """After the code is gone: collect what is still buffered in the pipes, without blocking."""
    for fd in (out_r, err_r, res_r):
        while state["out"].total + state["err"].total <= z.cfg["flood"] and _pump(fd, out_r, err_r, res_r, state):
            pass


def _frame_complete(buf: bytearray) -> dict | None:
    if len(buf) < 4:
        return None
    (n,) = struct.unpack(">I", buf[:4])
    if len(buf) < 4 + n:
        return None
    try:
        frame = json.loads(bytes(buf[4:4 + n]))
    except (ValueError, RecursionError):  # the code wrote it: 200 kB of "[" must not break the zygote
        return {"kind": "garbled"}
    return frame if isinstance(frame, dict) else {"kind": "garbled"}


def _read_ctl(ctl: socket.socket, most: int = 256, deadline: float | None = None) -> list:
    """Pending messages from a session's holder, parsed: [(kind, pid, value)]. They are untrusted
    (the holder ran earlier cells, and threads they left run in it), so the zygote checks every pid
    against /proc before use. At most `most` a call, and none past `deadline`: a flood must not keep the
    zygote here past a cell's deadline (the rest waits for the next call). Cells and what they fork
    never hold this socket (see _send_go); threads left in a holder by earlier cells do."""
    out = []
    for i in range(most):
        if deadline is not None and i % 16 == 15 and time.monotonic() > deadline:
            return out
        try:
            msg = ctl.recv(128)
        except (BlockingIOError, ConnectionError):
            return out
        if not msg:
            return out + [("eof", None, None)]  # every process of the session is gone
        parts = msg.decode(errors="replace").split()
        if len(parts) == 3 and parts[0] in ("runner", "status", "written") and all(p.lstrip("-").isdigit() for p in parts[1:]):
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _proc_entry(pid: int) -> tuple | None:
    """(ppid, state letter) of a live process, None when it is gone or a zombie."""
    rest = _stat_fields(f"/proc/{pid}/stat")
    return None if rest is None or rest[0] == b"Z" else (int(rest[1]), rest[0])


def _verdict(z: _Zygote, state: dict) -> dict:
    """The answer to the trainer: the streams, and how the code ended, from what the zygote saw (a flood, the
    deadline, the exit status) or else from the child's own report, checked (_checked)."""
    stdout, cut_out = state["out"].render()
    stderr, cut_err = state["err"].render()
    resp = {"stdout": stdout, "stderr": stderr, "cut": cut_out + cut_err, "duration": round(state["duration"], 6)}
    frame = state.get("frame") or _frame_complete(state["res"])  # it may have come in with _drain
    status = state["status"]
    if state["reason"] == "flood":
        resp["kind"] = "output_limit"
    elif state["reason"] == "timeout":
        resp["kind"] = "timeout"
    elif frame is not None and frame.get("kind") in ("none", "exception", "syntax", "memory", "sandbox_internal"):
        resp.update(_checked(frame))
        if resp["kind"] == "sandbox_internal":
            # ours only before the code starts, but the code can write this frame too: never run it again
            resp["retry"] = False
    elif status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        resp["kind"] = "timeout"  # the CPU rlimit fired before the wall clock
    elif status is not None and os.WIFSIGNALED(status):
        resp.update(kind="crash", signal=os.WTERMSIG(status))
    elif status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        resp["kind"] = "none"  # os._exit(0): a clean exit, as for a script
    elif status is not None and os.WIFEXITED(status):
        resp.update(kind="crash", exit_status=os.WEXITSTATUS(status))
    else:
        resp["kind"] = "crash"  # it died before the code finished, how is not known
    return resp


def _checked(report: dict) -> dict:
    """The child's report (_exec_code) as the zygote passes it on. It comes from the code's own process, so it
    may be forged: only the known fields, each of its type, every text bounded (TEXT_MAX, _bounded) and valid
    UTF-8. A forged report can lie about its own execution, and only within these bounds."""
    out = {"kind": report["kind"]}
    for key in ("exception_cut", "frames_omitted", "line"):
        if _count(report.get(key)) is not None:
            out[key] = report[key]
    for key in ("exception_type", "message", "detail"):
        if isinstance(report.get(key), str):
            out[key] = _utf8(report[key][:TEXT_MAX])
    if isinstance(report.get("exception_text"), str):
        text, cut = _clip(report["exception_text"], TEXT_MAX)
        out["exception_text"], out["exception_cut"] = _utf8(text), out.get("exception_cut", 0) + cut
    frames = report.get("frames")
    if isinstance(frames, list):
        frames = [[_utf8(f[0]), f[1], _utf8(f[2]), _utf8(f[3]), f[4]] for f in frames[:MAX_FRAMES]
                  if isinstance(f, list) and len(f) == 5 and all(isinstance(f[i], str) for i in (0, 2, 3))
                  and (f[1] is None or _count(f[1]) is not None) and _count(f[4]) is not None]
        out["frames"] = _bounded(frames)[0]
    return out


def _bounded(frames: list) -> tuple:
    """Frames [filename, lineno, name, line, repeats] within a report's bounds, and how many were left out: at
    most MAX_FRAMES (the first and the last half), names of NAME_MAX characters, source lines of TEXT_MAX and
    of FRAME_LINES_MAX together (past it, each line is cut to an equal share)."""
    omitted = max(len(frames) - MAX_FRAMES, 0)
    if omitted:
        frames = frames[:MAX_FRAMES // 2] + frames[len(frames) - MAX_FRAMES // 2:]
    frames = [[f[0][:NAME_MAX], f[1], f[2][:NAME_MAX], f[3][:TEXT_MAX], f[4]] for f in frames]
    if sum(len(f[3]) for f in frames) > FRAME_LINES_MAX:
        for f in frames:
            f[3] = f[3][:FRAME_LINES_MAX // len(frames)]
    return frames, omitted


def _count(v) -> int | None:
    """v when it is a plain int in [0, 2**62), else None."""
    return v if type(v) is int and 0 <= v < 1 << 62 else None


def _utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode()  # a lone surrogate (from os.fsdecode, say) becomes "?"


def _clip(text: str, keep: int) -> tuple:
    """(text, 0), or its first and last keep // 2 characters and how many were dropped between them."""
    if len(text) <= keep:
        return text, 0
    return text[:keep // 2] + text[len(text) - keep // 2:], len(text) - keep // 2 * 2


def _reap(z: _Zygote) -> bool:
    """Collect dead children. False when the zygote has no children left at all."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        z.reaped[pid] = status


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _holders(z: _Zygote) -> set:
    return {h.pid for h in z.sessions.values()}


def _spared(z: _Zygote) -> tuple:
    """What a sweep spares: the session holders, their runners once checked, the next stateless
    run's child; and the children of holders sent a "go" whose runner is not checked yet (one of
    them is that runner). Any other child of a holder was forked by a thread a cell left behind."""
    keep = _holders(z) | {h.runner for h in z.sessions.values() if h.runner is not None}
    if z.spare is not None:
        keep.add(z.spare.pid)
    return keep, {h.pid for h in z.sessions.values() if h.pipes is not None and h.pidfd is None}


def _sweep(z: _Zygote, keep: set, keep_children_of: set = frozenset()) -> None:
    """Kill every process below the zygote except those in `keep` and the direct children of those
    in `keep_children_of` (see _spared).
    A SIGKILLed process never runs code again, so we do not wait for its teardown (milliseconds
    for a process mapping numpy and sympy): it is remembered as dying and reaped later. A kill
    cannot race a fork (the kernel fails a fork with a fatal signal pending), so once a scan
    finds nothing new to kill, nothing is left."""
    for _ in range(10_000):
        if not _reap(z) and not keep:
            z.dying.clear()
            return  # nothing below us: the common case costs one waitpid
        table = _proc_table()
        for pid in list(z.dying):  # forget the reaped; start times guard against pid reuse
            if pid not in table or table[pid][1] == b"Z" or table[pid][2] != z.dying[pid]:
                del z.dying[pid]
        victims = [p for p in _descendants(table, os.getpid(), keep, keep_children_of)
                   if table[p][1] != b"Z" and p not in z.dying]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                z.dying[pid] = table[pid][2]
            except OSError:
                pass
    raise RuntimeError("could not kill the processes left by the code")


# ---- sessions
#
# A session is a holder process H, the checkpoint that holds the namespace, and a runner R, a fork
# of H made ahead of time that waits for the next cell. Everything a cell needs that does not
# depend on its code is done before it arrives, while the model generates: the zygote hands H the
# cell's output pipes and R's own socket ("go"), H forks R, R closes H's socket, points its stdout and
# stderr at the pipes and copies ahead the pages the last cell wrote, and the zygote checks R (its
# parent is H) and opens a pidfd on it. A request then costs one message, on R's socket, which only
# the zygote can write to: the cell and its forks cannot reach the zygote but through their pipes.
# R runs the cell. To commit it the zygote kills the cell's forks, hands R a control socket of its
# own ("ctl"), kills H, and R becomes the holder; to roll back the zygote kills R and H is untouched.
# Either way, once the answer is
# sent, the zygote sweeps the cell's leftovers and says "go" again. Idle holders stop themselves,
# so their threads do not run. H and R are as untrusted as the code (they ran it), so the zygote
# checks everything they say, and a session they break only fails its own later cells.

@dataclass
class _Holder:
    pid: int
    ctl: socket.socket  # the holder's control socket (the zygote's end)
    scratch: str
    rollback: bool
    uid: int | None
    cells: int = 0
    runner: int | None = None  # the runner waiting for the next cell, checked to be the holder's child
    pidfd: int | None = None  # the runner's
    pipes: tuple | None = None  # (out_r, err_r, res_r) of the next cell; the runner holds the write ends
    run: socket.socket | None = None  # the runner's own socket, on which the zygote only sends (see _send_go)

    def drop_runner(self) -> None:
        for fd in ([self.pidfd] if self.pidfd is not None else []) + list(self.pipes or ()):
            os.close(fd)
        if self.run is not None:
            self.run.close()
        self.runner = self.pidfd = self.pipes = self.run = None


def _holder_alive(z: _Zygote, h: _Holder) -> bool:
    if h.pid in z.reaped:
        return False
    try:
        pid, status = os.waitpid(h.pid, os.WNOHANG)
    except ChildProcessError:  # not ours yet: its old holder is still exiting, then it is reparented to us
        return _proc_entry(h.pid) is not None
    if pid:
        z.reaped[pid] = status
    return pid == 0


def _open_holder(z: _Zygote, sid: int, uid: int | None, rollback: bool) -> _Holder:
    uid = uid if z.uid is not None else None
    if uid is not None:
        _remove_ipc({uid})  # a recycled uid: nothing of the session that had it may reach this one
    scratch = os.path.join(z.cfg["root"], f"s{sid}")
    _make_scratch(scratch, uid)
    ctl_z, ctl_h = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ctl_z.close()
            os.setsid()
            ctl_fd = fcntl.fcntl(ctl_h.fileno(), fcntl.F_DUPFD, 64)
            null = os.open(os.devnull, os.O_RDWR)
            for i in range(3):
                os.dup2(null, i)
            os.dup2(ctl_fd, 3)
            os.closerange(4, 1 << 16)
            ctl = socket.socket(fileno=3)
            _enter_sandbox(z, uid, scratch)
            if z.renice:  # the zygote sets each runner back to 0 when its cell arrives
                os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
            ns = _fresh_main()
            gc.freeze()
            _lock_down(z)
        except BaseException:
            os._exit(121)
        _holder_loop(ctl, ns)
        os._exit(0)
    ctl_h.close()
    ctl_z.setblocking(False)
    return _Holder(pid, ctl_z, scratch, rollback, uid)


def _holder_loop(ctl: socket.socket, ns: dict) -> None:
    """The life of a session process: holder, runner, holder again if its cell is committed."""
    user_hup = signal.SIG_DFL
    # A holder's process group may be orphaned (by a killed holder) while it is stopped, which
    # makes the kernel send SIGHUP; ignored, it is dropped. Cells get the code's own disposition.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    written = []  # what this process's own cell wrote: its runners copy it ahead of their cells
    parent = None  # the holder this process was the runner of
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        # The next cell's stdout, stderr and result pipes, and the runner's own socket (_send_go)
        pipes = _await_message(ctl, b"go", 4, parent)
        holder = os.getpid()
        pid = os.fork()
        if pid == 0:
            parent = holder
            ctl.close()  # the cell never holds the holder's socket: what it forks cannot write to the zygote
            user_hup, nice, run = _runner(ns, holder, user_hup, written, pipes)
            _setpriority(0, nice)  # back in the background (raising it is always allowed)
            gc.freeze()  # if committed, later cells' collections skip this state, as in the zygote
            # Committed or not, list what the cell wrote while our holder lives (the zygote waits
            # for this line before it kills the holder); rolled back, we are killed meanwhile.
            written = _written_pages()
            # Committed, the zygote first kills what the cell forked, then hands this process (the next
            # holder) a control socket of its own on the runner's socket, which only it may write to.
            ctl = socket.socket(fileno=_await_message(run, b"ctl", 1, parent)[0])
            run.close()
            try:
                ctl.send(f"written {os.getpid()} {len(written)}".encode())
            except OSError:
                _orphaned(parent)
            continue
        for fd in pipes:
            os.close(fd)
        ctl.send(f"runner {pid} 0".encode())
        os.kill(os.getpid(), signal.SIGSTOP)  # idle until the zygote needs us again
        _, status = os.waitpid(pid, 0)  # the runner was rolled back or died: wait for the next "go"
        ctl.send(f"status {pid} {status}".encode())


def _await_message(ctl: socket.socket, word: bytes, n_fds: int, holder: int | None) -> list:
    """Wait for the zygote's `word` carrying n_fds file descriptors, and return them; anything else is
    not for us. If the zygote is gone, leave (see _orphaned)."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, n_fds)
        except OSError:
            msg, fds = b"", []
        if not msg:
            _orphaned(holder)
        if msg == word and len(fds) == n_fds:
            return fds
        for fd in fds:
            os.close(fd)


def _orphaned(holder: int | None) -> None:
    """The zygote is gone: take the stopped holder along, and go."""
    if holder is not None and os.getppid() == holder:
        os.kill(holder, signal.SIGKILL)
    os._exit(0)


def _runner(ns: dict, holder: int, user_hup, written: list, pipes: list):
    """Get ready for a cell, wait for it, run it in `ns`, report it. Returns the code's SIGHUP
    disposition, the nice value of the background and the runner's own socket (receive-only)."""
    out_w, err_w, res_w, run_fd = pipes
    run = socket.socket(fileno=run_fd)
    try:
        os.setpgid(0, 0)  # so a rollback kills the cell and its forks with one killpg
        for i, fd in enumerate((os.open(os.devnull, os.O_RDONLY), out_w, err_w)):
            os.dup2(fd, i)
            os.close(fd)
        _std_streams()
    except BaseException:
        _internal_failure(res_w)
    _copy_ahead(written, run)
    fds = _await_message(run, b"run", 2, holder)
    try:
        req = _take_request(fds)
        _set_cpu_limit(req["timeout"], hard=False)
        signal.signal(signal.SIGHUP, user_hup)
    except BaseException:
        _internal_failure(res_w)
    _exec_code(req["code"], ns, f"<cell {req['cell']}>", echo=True, res_fd=res_w)
    os.close(res_w)
    return signal.signal(signal.SIGHUP, signal.SIG_IGN), req["nice"], run


def _arm(z: _Zygote, h: _Holder, deadline: float) -> bool | None:
    """Give the holder the next cell's pipes and wait for the runner it forks (see _await_runner)."""
    return _await_runner(z, h, deadline) if _send_go(h) else False


def _send_go(h: _Holder) -> bool:
    """Give the holder the next cell's output pipes: "go". False when the session's processes are
    gone. Never while an earlier "go" is out: its runner, once forked, would take this one."""
    h.drop_runner()
    # Whatever the session said before this point is stale (a cell's fork may have posed as a
    # runner before the sweep killed it), and the runner is reported only after "go".
    if any(kind == "eof" for kind, _, _ in _read_ctl(h.ctl)):
        return False  # every process of the session is gone
    pairs = _pipes()
    # The runner's own socket: the zygote sends the cell on it and, once the cell is committed, the
    # runner's control socket as the next holder. Shut for reading on our side, it is shut for writing
    # on the runner's, for good: the cell and what it forks hold it, and can never write to us with it.
    run, run_r = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    run.shutdown(socket.SHUT_RD)
    try:
        socket.send_fds(h.ctl, [b"go"], [w for _, w in pairs] + [run_r.fileno()])
    except OSError:
        for fd in itertools.chain(*pairs):
            os.close(fd)
        run.close()
        return False
    finally:
        run_r.close()
    for _, w in pairs:
        os.close(w)
    h.pipes, h.run = tuple(r for r, _ in pairs), run
    return True


def _await_runner(z: _Zygote, h: _Holder, deadline: float) -> bool | None:
    """Wait for the runner the holder forks after "go": reported by the holder, checked in /proc to
    be its child, and watched through a pidfd from then on. True when ready, False when every
    process of the session is gone, None at the deadline."""
    while True:
        for kind, pid, _ in _read_ctl(h.ctl, deadline=deadline):
            if kind == "eof":  # every process of the session is gone
                return False
            if kind != "runner" or h.pidfd is not None:
                continue
            try:
                pidfd = os.pidfd_open(pid)  # first, so that the check below is about this very process
            except OSError:
                continue
            if (_proc_entry(pid) or (None,))[0] == h.pid:
                h.runner, h.pidfd = pid, pidfd
            else:
                os.close(pidfd)
        if h.pidfd is not None:
            _stop(h.pid)  # it stops itself after the report, but a SIGCONT of ours may come after that
            return True
        wait = deadline - time.monotonic()
        if wait <= 0:
            return None
        if not select.select([h.ctl], [], [], min(wait, 0.05))[0]:
            _signal(h.pid, signal.SIGCONT)  # a holder that stopped itself just after our last SIGCONT


def _stop(pid: int) -> None:
    """SIGSTOP a session process and wait (up to 50 ms) until all its threads have stopped, so that
    a thread left by a cell forks nothing after the sweep that follows."""
    _signal(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        try:
            states = [(_stat_fields(f"/proc/{pid}/task/{t}/stat") or [None])[0] for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return  # gone
        if all(st in (b"T", b"t", b"Z", b"X", None) for st in states):
            return
        time.sleep(0.0005)


def _runner_ready(h: _Holder) -> bool:
    return h.pidfd is not None and not select.select([h.pidfd], [], [], 0)[0]


def _run_cell(z: _Zygote, req: dict) -> dict:
    h, state_lost, lost = z.sessions.get(req["sid"]), None, False
    t0 = time.monotonic()
    for _ in range(2):
        if h is not None and not _holder_alive(z, h):
            _close_holder(z, req["sid"])
            h, state_lost = None, "holder_died"
        if h is None:
            h = z.sessions[req["sid"]] = _open_holder(z, req["sid"], req["uid"], req["rollback"])
        ready = _runner_ready(h)
        if not ready and h.pipes is not None and h.pidfd is None:  # a "go" is out: wait for its runner
            ready = _await_runner(z, h, t0 + req["wall"])
        elif not ready:  # a new session, or its runner died
            if h.pidfd is not None:  # its holder reports that, then waits for "go"
                _signal(h.pid, signal.SIGCONT)
            ready = _arm(z, h, t0 + req["wall"])
        if ready is not False:
            break
        _close_holder(z, req["sid"])  # gone, though one of its processes was still exiting when we looked
        h, state_lost = None, "holder_died"
    if not ready:  # earlier cells broke the holder (do not let it hang every cell), or a new one died at once
        _close_holder(z, req["sid"])
        state = _new_state(z)
        state.update(reason="timeout", duration=time.monotonic() - t0)
        resp = _verdict(z, state)
        resp["state_lost"] = "holder_hung"
        return resp
    h.cells += 1
    runner, pidfd, (out_r, err_r, res_r), run = h.runner, h.pidfd, h.pipes, h.run
    h.runner = h.pidfd = h.pipes = h.run = None
    fds = _request_fds(dict(req, cell=h.cells, nice=BACKGROUND_NICE if z.renice else 0))
    state = None
    old = h.pid
    try:
        try:
            if z.renice:  # the cell runs at the normal priority, ahead of background work
                _setpriority(runner, 0)
            socket.send_fds(run, [b"run"], fds)
        finally:
            for fd in fds:
                os.close(fd)
        state = _supervise(z, out_r, err_r, res_r, t0 + req["wall"], pidfd, h=h, runner=runner,
                           cpu=_cpu_limit(req, runner))
    finally:
        state = state or dict(_new_state(z), reason="exited")
        state["duration"] = time.monotonic() - t0
        frame = state.get("frame")
        good = frame is not None and (frame.get("kind") == "none" or (not h.rollback and frame.get("kind") == "exception"))
        # Alive, the runner is still ours: the holder's child, or the zygote's if the holder died.
        ours, holder_alive = not select.select([pidfd], [], [], 0)[0], _holder_alive(z, h)
        committed = False
        if good and ours:
            h.pid, committed = runner, True  # commit: the sweep kills the old holder
        elif holder_alive:  # rollback: the old holder is untouched
            if ours:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _killpg(runner)  # its forks (a group id is never reused while the group lives)
        elif frame is not None and ours:
            h.pid, committed = runner, True  # the cell killed its own checkpoint: this is the only state left
        else:
            lost = True
            state_lost = "holder_killed"
        _drain(z, state, out_r, err_r, res_r)
        for fd in (out_r, err_r, res_r):
            os.close(fd)
        if lost:
            os.close(pidfd)
            run.close()
            _close_holder(z, req["sid"])
        elif committed:  # the caller gets its answer first; the next runner is made ready after
            os.close(pidfd)
            z.after = functools.partial(_settle_commit, z, h, old, run)
        else:
            run.close()  # the runner is killed (a process with SIGKILL pending never sees the EOF)
            z.after = functools.partial(_settle_rollback, z, h, pidfd)
    resp = _verdict(z, state)
    if state_lost:
        resp["state_lost"] = state_lost
    return resp


def _settle_commit(z: _Zygote, h: _Holder, old: int, run: socket.socket) -> None:
    """After a committed cell's response: kill the cell's leftovers (after a commit, the new holder's
    children are leftovers), then give the new holder its own control socket (on `run`, which those
    leftovers shared), let it list the pages its cell wrote (that needs its old holder alive, see
    _written_pages), then kill the old holder `old` and make the next runner ready while the model
    generates."""
    keep, keep_children_of = _spared(z)
    _sweep(z, keep | {old}, keep_children_of)
    ctl, ctl_h = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        socket.send_fds(run, [b"ctl"], [ctl_h.fileno()])
    except OSError:
        pass  # the new holder is gone: its socket reads as closed at once, and the next cell finds out
    finally:
        ctl_h.close()
        run.close()
    ctl.setblocking(False)
    h.ctl.close()  # the old holder's: it is killed below
    h.ctl = ctl
    written, deadline = False, time.monotonic() + 0.25  # a hostile cell may never say it: then it only loses speed
    while not written and (wait := deadline - time.monotonic()) > 0:
        if select.select([h.ctl], [], [], wait)[0]:
            for kind, pid, _ in _read_ctl(h.ctl, deadline=deadline):
                written = written or kind == "eof" or (kind == "written" and pid == h.pid)
    _sweep(z, *_spared(z))
    _wipe_shm(z)
    _ready_next(z, h)


def _settle_rollback(z: _Zygote, h: _Holder, pidfd: int) -> None:
    """After a rolled-back cell's response: once the killed runner is gone (so it cannot take the
    holder's "go"), sweep what the cell left and make the holder's next runner ready."""
    try:
        select.select([pidfd], [], [], 1.0)
    finally:
        os.close(pidfd)
    _sweep(z, *_spared(z))
    _wipe_shm(z)
    _signal(h.pid, signal.SIGCONT)  # the holder reaps the runner, then waits for "go"
    _ready_next(z, h)


def _ready_next(z: _Zygote, h: _Holder) -> None:
    """Make the holder's next runner ready (not ready in a second: the next cell waits for it), then
    sweep what a thread left by an earlier cell forked while the holder ran."""
    if _arm(z, h, time.monotonic() + 1.0):
        _sweep(z, *_spared(z))


def _close_holder(z: _Zygote, sid: int) -> dict:
    h = z.sessions.pop(sid, None)
    if h is not None:
        _signal(h.pid, signal.SIGKILL)
        h.drop_runner()
        h.ctl.close()
        _sweep(z, *_spared(z))
        _wipe_shm(z)
        if h.uid is not None:
            _remove_ipc({h.uid})  # before the trainer gives the uid to another session
        _rmtree(h.scratch)
    return {"kind": "none"}


# ---- copy-on-write ahead of a cell
#
# A cell runs in a fork of the session's state, so every page it writes is first copied, one page
# fault at a time: for a sympy solve, as long as the solve itself (docs/speed.md). The
# pages a cell writes are mostly the same from one cell to the next (interpreter state, caches,
# reference counts of the library objects it uses). So a runner that just ran a cell lists the
# pages it wrote, and its own runner copies them in bulk while it waits for the next cell, which
# in a rollout is while the model generates. (A stateless spare copies, the same way, the pages a
# probe run of PROBE_CODE wrote.) The list is made after every cell, after the answer: it holds
# the pages copied ahead too, so it grows slowly towards the set the session's cells keep writing,
# capped at COPY_AHEAD_MAX_PAGES. Listing only after cells that faulted a lot let it go stale.
# Only speed depends on this: any failure skips it.

def _written_pages() -> list:
    """[(address, length)] of this process's private writable pages that it alone maps, while
    its parent (the holder it was forked from) is alive: the pages it wrote since the fork.
    From /proc/self/pagemap: bit 63 present, bit 56 exclusively mapped."""
    try:
        np = sys.modules["numpy"]
        spans = []
        with open("/proc/self/maps", "rb") as f:
            for line in f:
                addr, perms = line.split(None, 2)[:2]
                if perms[:2] == b"rw" and perms[3:4] == b"p":
                    a, b = addr.split(b"-")
                    spans.append((int(a, 16) >> 12, int(b, 16) >> 12))
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            words = np.frombuffer(b"".join(os.pread(fd, (b - a) * 8, a * 8) for a, b in spans), dtype=np.uint64)
        finally:
            os.close(fd)
        pages = np.concatenate([np.arange(a, b, dtype=np.uint64) for a, b in spans])[:len(words)]
        flags = np.uint64((1 << 63) | (1 << 56))
        hot = pages[(words & flags) == flags][:COPY_AHEAD_MAX_PAGES]
        if not len(hot):
            return []
        cut = np.flatnonzero(np.diff(hot) != 1) + 1
        starts = hot[np.concatenate(([0], cut))].astype(np.int64) << 12
        lengths = np.diff(np.concatenate(([0], cut, [len(hot)]))).astype(np.int64) << 12
        return list(zip(starts.tolist(), lengths.tolist()))
    except Exception:
        return []


def _copy_ahead(ranges: list, ctl: socket.socket) -> None:
    """Break copy-on-write on `ranges` now, in bulk; stop as soon as the cell arrives on ctl."""
    batch = 0
    for addr, length in ranges:
        if batch >= (256 << 10):
            batch = 0
            if select.select([ctl], [], [], 0)[0]:
                return
        if _libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), ctypes.c_int(MADV_POPULATE_WRITE)) != 0:
            if ctypes.get_errno() == errno.EINVAL:
                return  # a kernel older than 5.14; an unmapped or read-only range is just skipped
        batch += length


# ---- running the code itself (in the forked child)

def _exec_code(code: str, ns: dict, filename: str, echo: bool, res_fd: int) -> None:
    """Compile and run `code` in `ns`, then report to the zygote on res_fd: how it ended, as facts (_report)."""
    me = os.getpid()
    reserve = bytearray(1 << 16)  # freed on MemoryError so the report itself can be built
    result = {"kind": "none"}
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename)
        last = None
        if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), filename, "eval")
        body = compile(tree, filename, "exec")
    except (SyntaxError, ValueError) as e:
        if isinstance(e, ValueError):  # e.g. null bytes in the source
            e = SyntaxError(str(e))
        result = _report(e, "syntax")
    else:
        try:
            exec(body, ns)
            if last is not None:
                value = eval(last, ns)
                if value is not None:
                    print(repr(value))
        except SystemExit as e:
            if e.code not in (None, 0):
                result = _report(e)
        except MemoryError as e:
            del reserve
            result = {"kind": "memory", "exception_type": type(e).__name__, "message": str(e)[:TEXT_MAX]}
            cell_frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
            if cell_frames:
                result["line"] = cell_frames[-1].lineno
        except BaseException as e:
            result = _report(e)
    if os.getpid() != me:
        # A fork made by the code came back here: like a script's child, it just exits.
        _flush_streams()
        os._exit(0 if result["kind"] == "none" else 1)
    _flush_streams()
    try:
        _write_frame(res_fd, result)
    except OSError:
        os._exit(0 if result["kind"] == "none" else 1)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _report(e: BaseException, kind: str = "exception") -> dict:
    """An exception the code raised, as facts: its type, Python's own text for it, and the frames of the code
    and the innermost library frame (with a short path), never this file's. A run of the same frame
    (recursion) is one frame with a count. Within the bounds the zygote enforces (_clip, _bounded). A syntax
    error has no frames (it comes from compiling the code, not running it)."""
    try:
        text = "".join(traceback.format_exception_only(type(e), e)).rstrip()
    except Exception:
        text = type(e).__name__
    text, cut = _clip(text, TEXT_MAX)
    out = {"kind": kind, "exception_type": type(e).__name__, "exception_text": text, "exception_cut": cut}
    if kind == "syntax":
        return out
    summary = traceback.StackSummary.extract(traceback.walk_tb(e.__traceback__), lookup_lines=False)[1:]  # [0]: ours
    frames = []
    for i, f in enumerate(summary):
        if not (f.filename.startswith("<cell") or i == len(summary) - 1):
            continue
        where = [_short_path(f.filename), f.lineno, f.name]
        if frames and frames[-1][:3] == where:
            frames[-1][4] += 1
        else:
            frames.append(where + [(f.line or "").strip(), 0])
    out["frames"], out["frames_omitted"] = _bounded(frames)
    return out


def _short_path(path: str) -> str:
    if path.startswith("<"):
        return path
    for prefix in sorted({p for p in sys.path if p}, key=len, reverse=True):
        if path.startswith(prefix.rstrip("/") + "/"):
            return path[len(prefix.rstrip("/")) + 1:]
    return os.path.basename(path)


if __name__ == "__main__" and sys.argv[1:2] == ["--zygote"]:
    _zygote_main(entered=sys.argv[2:] == ["--entered"])
