"""The child's side of an execution: waiting for the code, running it, and the report it sends; with the bounds
that report keeps to and the zygote's check of it (_checked), two sides of one contract.

Apart because this is what runs in the code's own process, just before and after the code (a stateless spare
and a session's runner alike): what a result may carry is decided here, and checked by the zygote whatever the
code forged.
"""
import ast
import json
import linecache
import os
import signal
import socket
import sys
import traceback
import types

from machinery.zygote_frame import _write_frame

# Bounds of what a result carries from the code's process (the child keeps to them, the zygote enforces them)
TEXT_MAX = 65536  # characters of a text: a longer exception text keeps its head and tail (exception_cut)
MAX_FRAMES = 64  # frames of a traceback: past it, the first and the last half (frames_omitted)
NAME_MAX = 1000  # characters of a frame's file or function name
FRAME_LINES_MAX = 200_000  # characters of the frames' source lines together; past it, each gets an equal share


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


def _std_streams() -> None:
    sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    # Line-buffered, so what was printed before a timeout kill is still shown.
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)


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
    and the innermost library frame (with a short path), never ours. A run of the same frame
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
