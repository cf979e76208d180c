"""Sessions (`Sandbox.session`, stateful like a Jupyter kernel): holders, runners, commit and rollback.

A session is a holder process H, the checkpoint that holds the namespace, and a runner R, a fork
of H made ahead of time that waits for the next cell. Everything a cell needs that does not
depend on its code is done before it arrives, while the model generates: the zygote hands H the
cell's output pipes and R's own socket ("go"), H forks R, R closes H's socket, points its stdout and
stderr at the pipes and copies ahead the pages the last cell wrote, and the zygote checks R (its
parent is H) and opens a pidfd on it. A request then costs one message, on R's socket, which only
the zygote can write to: the cell and its forks cannot reach the zygote but through their pipes.
R runs the cell. To commit it the zygote kills the cell's forks, hands R a control socket of its
own ("ctl"), kills H, and R becomes the holder; to roll back the zygote kills R and H is untouched.
Either way, once the answer is
sent, the zygote sweeps the cell's leftovers and says "go" again. Idle holders stop themselves,
so their threads do not run. H and R are as untrusted as the code (they ran it), so the zygote
checks everything they say, and a session they break only fails its own later cells.

Apart because this protocol (both its sides: the zygote's and the session processes') is the largest and most
delicate part of the zygote, and a stateless run needs none of it.
"""
import fcntl
import functools
import gc
import itertools
import os
import select
import signal
import socket
import time
from dataclasses import dataclass

from machinery.zygote_contain import _enter_sandbox, _lock_down, _remove_ipc, _set_cpu_limit
from machinery.zygote_copyahead import _copy_ahead, _written_pages
from machinery.zygote_exec import (_await_message, _exec_code, _fresh_main, _internal_failure, _orphaned,
                                   _std_streams, _take_request)
from machinery.zygote_scratch import _make_scratch, _rmtree, _wipe_shm
from machinery.zygote_state import BACKGROUND_NICE, _Zygote
from machinery.zygote_supervise import (_cpu_limit, _drain, _new_state, _pipes, _read_ctl, _request_fds, _supervise,
                                        _verdict)
from machinery.zygote_tree import _killpg, _proc_entry, _setpriority, _signal, _spared, _stat_fields, _sweep


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
