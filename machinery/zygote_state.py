"""The zygote's state: the one record (_Zygote) that every room of the zygote's program is handed, and the
exception (_ParentGone) by which a room tells the loop that the trainer is gone.

Apart so that the rooms (the run, the sessions, the supervision, the sweep, the scratch) can name them without
importing the loop that makes and catches them (machinery/zygote.py), which imports every room.
"""
from dataclasses import dataclass, field

BACKGROUND_NICE = 10  # session processes between cells: copying ahead yields to the cells of other sessions


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
