"""Containment inside the zygote: the seccomp filter, the fallback's mount namespace, hidepid, SysV IPC clean-up,
and what a child does to itself before any model code (rlimits, uid, no_new_privs, then the filter).

sandbox.py holds the policy (what to hide, which syscalls to refuse) and says what each layer stops; this file
applies it, and is apart so that the layers can be read, and checked, in one place. It also names the zygote's
program (PROGRAM, PROGRAM_FILES): what a zygote must still see below a hidden folder (_zygote_needs), which the
pool binds back under bwrap and the fallback's mount namespace binds back itself.
"""
import ctypes
import errno
import os
import random
import resource
import socket
import struct
import sys
import tempfile

from machinery.zygote_state import _Zygote

NPROC_LIMIT = 128  # processes + threads per uid: room for a Pool, not for a fork bomb
NOFILE_LIMIT = 512
HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "zygote.py")  # the zygote's program: run by path (sandbox_pool.Pool._spawn)
# ...and the files it runs: zygote.py imports machinery.zygote_* (and so the package's __init__.py, a docstring),
# nothing else of the project (the import rule). Every one must be visible to a zygote, wherever it is bound.
PROGRAM_FILES = sorted([os.path.join(HERE, "__init__.py")] + [os.path.join(HERE, n) for n in os.listdir(HERE)
                                                               if n.startswith("zygote") and n.endswith(".py")])


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
    a venv, its program's files) is bound back read-only, as bwrap binds it: held open before it is covered, and bound
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
    """What a zygote reads after it starts: the interpreter's folders (a venv's too) and its program's files."""
    return {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.realpath(sys.executable)), *(os.path.realpath(p) for p in PROGRAM_FILES)}


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
