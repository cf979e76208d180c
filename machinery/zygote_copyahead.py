"""Copy-on-write ahead of a cell: a speed-up, never a layer (any failure skips it).

A cell runs in a fork of the session's state, so every page it writes is first copied, one page
fault at a time: for a sympy solve, as long as the solve itself (docs/speed.md). The
pages a cell writes are mostly the same from one cell to the next (interpreter state, caches,
reference counts of the library objects it uses). So a runner that just ran a cell lists the
pages it wrote, and its own runner copies them in bulk while it waits for the next cell, which
in a rollout is while the model generates. (A stateless spare copies, the same way, the pages a
probe run of PROBE_CODE wrote.) The list is made after every cell, after the answer: it holds
the pages copied ahead too, so it grows slowly towards the set the session's cells keep writing,
capped at COPY_AHEAD_MAX_PAGES. Listing only after cells that faulted a lot let it go stale.
Only speed depends on this: any failure skips it.
"""
import ctypes
import errno
import json
import os
import select
import socket
import sys

from machinery.zygote_contain import _libc
from machinery.zygote_exec import _exec_code, _fresh_main, _std_streams

MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, breaking copy-on-write, in one call
COPY_AHEAD_MAX_PAGES = 4096  # 16 MiB: the most a session runner copies (and holds twice) before its cell


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
