"""Watching one execution, a stateless run's or a session cell's: its pipes, the time limit (wall or CPU), the
output flood, and the verdict the zygote sends back.

Apart because runs and cells share it: whatever forked the code, the zygote drains its streams (keeping head
and tail), kills it at its limits, and words how it ended from what it saw, not from what the code claims.
"""
import json
import os
import select
import signal
import socket
import time

from machinery.zygote_exec import _checked
from machinery.zygote_frame import _frame_complete
from machinery.zygote_state import _ParentGone, _Zygote
from machinery.zygote_tree import _signal


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


def _pipes() -> tuple:
    """(out_r, out_w), (err_r, err_w), (res_r, res_w): the zygote's read ends are non-blocking."""
    pairs = [os.pipe() for _ in range(3)]
    for r, _ in pairs:
        os.set_blocking(r, False)
    return pairs


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
