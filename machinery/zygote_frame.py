"""The wire between the trainer and a zygote, and between a child and its zygote: a 4-byte big-endian length,
then JSON.

Apart because both sides speak it: the pool (machinery/sandbox_pool.py) in the trainer, and the zygote's program,
which also reads the frame a child writes with its result (_frame_complete: that one comes from the code's own
process, so it may be garbled).
"""
import json
import os
import select
import struct
import time


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
