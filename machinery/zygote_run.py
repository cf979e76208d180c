"""Stateless runs (`Sandbox.run`): the code runs in a fresh namespace in a child of the zygote, forked ahead of time.

Apart from the sessions because the life of a stateless child is short and simple: forked while the model
generates (the spare), it enters the sandbox and copies ahead the pages a typical run writes, takes one piece of
code, and is killed with whatever it started; the scratch dir is wiped and the next spare forked after the answer.
"""
import fcntl
import functools
import os
import select
import signal
import socket
import time
from dataclasses import dataclass

from machinery.zygote_contain import (PR_SET_PDEATHSIG, _enter_sandbox, _lock_down, _prctl, _remove_ipc,
                                      _set_cpu_limit)
from machinery.zygote_copyahead import _copy_ahead
from machinery.zygote_exec import (_await_message, _exec_code, _fresh_main, _internal_failure, _std_streams,
                                   _take_request)
from machinery.zygote_scratch import _wipe_scratch, _wipe_shm
from machinery.zygote_state import BACKGROUND_NICE, _Zygote
from machinery.zygote_supervise import _cpu_limit, _drain, _new_state, _pipes, _request_fds, _supervise, _verdict
from machinery.zygote_tree import _killpg, _setpriority, _spared, _sweep


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
