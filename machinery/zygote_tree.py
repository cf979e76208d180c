"""The process tree: reading /proc, signalling, and the zygote's sweep of whatever the code left running.

Apart because both sides use it (the pool kills a zygote's whole tree, _kill_tree) and because a sweep's rules
(which processes to spare, _spared) are the same for a stateless run and a session's cell.
"""
import os
import signal
import time

from machinery.zygote_state import _Zygote


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


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _proc_entry(pid: int) -> tuple | None:
    """(ppid, state letter) of a live process, None when it is gone or a zombie."""
    rest = _stat_fields(f"/proc/{pid}/stat")
    return None if rest is None or rest[0] == b"Z" else (int(rest[1]), rest[0])


def _setpriority(pid: int, nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass  # gone, or not allowed: only speed depends on it


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
