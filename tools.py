"""The tools the model can call in a rollout (the paper's code interpreter, Sec. 2), behind one seam.

A tool is one small object (`Tool`): its name, its JSON schema (the hermes prompt lists it), a sentence per
tool format telling the model how to call it, how to run a call's arguments, and what the model reads back.
`AVAILABLE` names every tool; `--tools` chooses the ones a run offers (`offer`, into `TOOLS`), whose sentences
and schemas make the prompt. rollout.py parses calls to them (a hermes call names its tool, a markdown block's
info string does: ```python), runs them through `Tool.call` (each under its time limit) and cuts their text.
Adding a tool is one class here plus one line in `AVAILABLE`.

The Python interpreter (`PythonTool`) runs code in the sandbox (sandbox.py), or in the trajectory's session
with --stateful, and words the sandbox's facts for the model (`tool_text`): stdout plus a compact traceback.
Departure: the official tool heads its output with a success or failure line and labels the streams; ours
does so with --tool-header (`headed_text`).
"""
from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass


@dataclass
class ToolResult:
    """What a tool call produced, from the tool or from a malformed call."""
    ok: bool
    error_kind: str               # sandbox.py's kinds, plus "malformed"
    text: str                     # the full model-facing text (cut later, where it is appended)
    exception_type: str | None = None

    @classmethod
    def from_exec(cls, r, error_format: str = "full", header: bool = False):
        """From a sandbox.ExecResult; the text is tool_text's."""
        return cls(ok=r.ok, error_kind=r.error_kind, text=tool_text(r, error_format, header),
                   exception_type=r.exception_type)


class Tool:
    """A tool the model can call. A subclass sets `name`, `schema` (an OpenAI function schema whose first
    required parameter is the one string a markdown block's body fills) and `sentence`, and defines `run`
    and `reply`."""
    name: str
    schema: dict
    sentence: dict[str, str] = {}  # by tool format: how the prompt's {tool} tells the model to call it
    timeout_s: float | None = 30.0  # a call still running after this is cut off (None: the tool limits itself)

    @property
    def arg(self) -> str:
        """The argument a markdown block's body holds (and SAAR's --sim-on code compares): the first required."""
        return self.schema["function"]["parameters"]["required"][0]

    @property
    def fences(self) -> tuple[str, ...]:
        """The info strings of a markdown block that calls it (```name); the first is the one named in errors."""
        return (self.name,)

    async def run(self, args: dict, env):
        """Run a call's arguments; env is the trajectory's rollout.ToolEnv (its sandbox, session and cfg)."""
        raise NotImplementedError

    def reply(self, raw, cfg) -> ToolResult:
        """What the model reads of run's result, before it is cut; cfg is the rollout's config.Rollout."""
        raise NotImplementedError

    async def call(self, args: dict, env) -> ToolResult:
        """run, then reply; a call that hangs is cut off after timeout_s, and the model reads why. (A tool that
        computes on the event loop blocks it: run such work elsewhere, as PythonTool does in the sandbox.)"""
        try:
            return self.reply(await asyncio.wait_for(self.run(args, env), self.timeout_s), env.cfg)
        except asyncio.TimeoutError:
            return ToolResult(ok=False, error_kind="timeout", text=f"TimeoutError: the {self.name} tool took longer "
                                                                   f"than {self.timeout_s:g} s and was stopped")


class PythonTool(Tool):
    """The paper's code interpreter: stateless calls in the sandbox, or the trajectory's session."""
    name = "code_interpreter"
    schema = {"type": "function", "function": {
        "name": name, "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code to run."}},
                       "required": ["code"]}}}
    sentence = {"hermes": "You can run Python with the code_interpreter tool. ",
                "markdown": "You can run Python: write code in a ```python block and its output will be shown to you. "}
    fences = ("python", "py")
    timeout_s = None  # the sandbox's own limit (--tool-timeout-s, on its clock), and its own error text

    async def run(self, args: dict, env):
        if env.session is not None:
            return await env.session.arun(args["code"])
        return await env.sandbox.arun(args["code"], echo=env.cfg.tool_echo)

    def reply(self, raw, cfg) -> ToolResult:
        return ToolResult.from_exec(raw, cfg.error_format, cfg.tool_header)


# Every tool, by its --tools name.
AVAILABLE: dict[str, Tool] = {
    "python": PythonTool(),
}
# The tools this run offers, by the name a call gives: the hermes prompt lists their schemas, and a call must
# name one of them. offer() sets them from --tools (config.Rollout.tools).
TOOLS: dict[str, Tool] = {}


def offer(names: str) -> None:
    """Offer the tools of a comma list of AVAILABLE's names, in its order; an unknown name raises."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in AVAILABLE]
    if unknown or not chosen:
        raise ValueError(f"--tools {names!r}: {'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'none named'}"
                         f"; the tools are {', '.join(AVAILABLE)}")
    TOOLS.clear()
    TOOLS.update({AVAILABLE[n].name: AVAILABLE[n] for n in chosen})


offer("python")


def schemas() -> list[dict]:
    """The offered tools' schemas, in order: the hermes prompt's tools= (the chat template lists them)."""
    return [t.schema for t in TOOLS.values()]


def sentence(tool_format: str) -> str:
    """The prompt's {tool}: the offered tools' sentences for the format ("" for none)."""
    return "".join(t.sentence.get(tool_format, "") for t in TOOLS.values())


def pronouns() -> dict[str, str]:
    """The prompt's {it} and {the_tool}, in the number of the offered tools."""
    return dict(it="it", the_tool="the tool") if len(TOOLS) == 1 else dict(it="them", the_tool="the tools")


# --------------------------------------------------------------------------- what the model reads of a Python call
# --tool-header: the official tool's layout, a first line saying whether the call worked, the failure's reason
# as its code server names it ("" for an ordinary error), then the streams, each labelled
TOOL_HEADER = {True: "Tool call success", False: "Tool call failure"}
TOOL_REASON = {"timeout": "worker_timeout", "sandbox_internal": "internal_error"}
NO_OUTPUT = "[no output]"
# A session cell whose state was lost says why (sandbox.STATE_LOSSES), in brackets after the error
STATE_LOST = {
    "holder_died": "the session's process had died and its state was lost; this cell ran in an empty namespace",
    "holder_hung": "the session's process stopped responding; its state was lost and the next cell starts from an "
                   "empty namespace",
    "holder_killed": "the cell killed the session's process; its state was lost and the next cell starts from an "
                     "empty namespace",
    "worker_died": "the session state was lost; the next cell starts from an empty namespace",
    "restarted": "the sandbox restarted and the session state was lost; this cell ran in an empty namespace",
}
TRACEBACK_LINES = 17  # a longer traceback keeps its first 7 lines and its last 9, and says how many it left out
EXCEPTION_CHARS = 2000  # a longer exception text keeps its first and last 1000 characters


def tool_text(r, error_format: str = "full", header: bool = False) -> str:
    """Every string the model reads from one tool call, before it is cut (rollout.truncate_middle): from the facts
    of a sandbox.ExecResult, or a malformed call's message (a str, from rollout.parse_call).
    The output, then stderr and the error: the compact traceback (full), or its last line (last_line; the
    sandbox's one-line errors are the same either way). header: the official tool's layout (headed_text)."""
    if isinstance(r, str):  # a malformed call: the message is the error
        return headed_text(False, "malformed", "", r) if header else r
    error = _join(r.stderr, _error_text(r, last_line=error_format == "last_line"))
    text = headed_text(r.ok, r.error_kind, r.stdout, error) if header else _join(r.stdout, error)
    return text if text.strip() else NO_OUTPUT


def _error_text(r, last_line: bool) -> str:
    """The error of a result ("" for a success): by kind, with the note of a lost session state."""
    kind = r.error_kind
    if kind == "exception":
        text = _traceback_text(r)
    elif kind == "syntax":  # Python's own text: where, the line with a caret, the message
        text = r.exception_text or r.exception_type or "Exception"
        if r.exception_cut:
            half = len(text) // 2
            text = f"{text[:half]}\n... [{r.exception_cut} chars cut] ...\n{text[half:]}"
    elif kind == "memory":
        where = f" at line {r.line}" if r.line else ""
        text = f"MemoryError: {r.message[:300] or 'out of memory'}{where} (the memory limit is {r.memory_mb} MB)"
    elif kind == "timeout":
        text = f"TimeoutError: the code ran longer than the {r.timeout_s:g} s time limit and was stopped"
    elif kind == "output_limit":
        text = f"OutputLimitError: the code printed more than {r.flood_bytes:,} bytes and was stopped"
    elif kind == "crash":
        if r.signal is not None:
            what = f"the process was killed by signal {_signal_name(r.signal)}"
        elif r.exit_status is not None:
            what = f"the process exited with status {r.exit_status} before the code finished"
        elif r.sandbox_killed:
            what = "the code killed the sandbox process running it"
        else:
            what = "the process died before the code finished"
        text = f"Crash: {what}"
    elif kind == "sandbox_internal":
        text = f"SandboxError: the sandbox itself failed, not the code ({r.detail or 'internal error'})"
    else:
        text = ""
    if last_line and text:
        text = text.splitlines()[-1]
    if r.state_lost:
        text = f"{text}\n[{STATE_LOST.get(r.state_lost, r.state_lost)}]".lstrip("\n")
    return text


def _traceback_text(r) -> str:
    """The compact traceback: the frames of the code and the innermost library frame (all the sandbox reports),
    a run of repeats as one frame and a note, at most TRACEBACK_LINES lines, then the exception."""
    lines = []
    for f in r.frames:
        lines.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line}")
        if f.repeats:
            lines.append(f"  [Previous line repeated {f.repeats} more times]")
    if lines:
        lines.insert(0, "Traceback (most recent call last):")
    n_lines = len(lines) + 2 * r.frames_omitted  # a frame the sandbox left out counts as two (itself, its source)
    if n_lines > TRACEBACK_LINES:
        lines = lines[:7] + [f"  ... ({n_lines - 16} lines omitted)"] + lines[-9:]
    exc = r.exception_text or r.exception_type or "Exception"
    n_chars = len(r.exception_text) + r.exception_cut
    if n_chars > EXCEPTION_CHARS:
        exc = exc[:1000] + f" ... [{n_chars - EXCEPTION_CHARS} chars cut] ... " + exc[-1000:]
    return "\n".join(lines + [exc])


def headed_text(ok: bool, error_kind: str, stdout: str, error: str) -> str:
    """A tool result laid out as the official tool lays it out (--tool-header): "Tool call success", or "Tool
    call failure" and "reason: ...", then "stdout: ..." and "stderr: ..." for the parts that are not empty.
    stdout: what the code printed; error: its stderr and the error (tool_text), or why a call is malformed (the
    official executor prints errors to stderr)."""
    lines = [TOOL_HEADER[ok]] + ([] if ok else ["reason: " + TOOL_REASON.get(error_kind, "")])
    lines += [f"{name}: {part}" for name, part in (("stdout", stdout), ("stderr", error)) if part]
    return "\n".join(lines)


def _signal_name(sig: int) -> str:
    """"SIGKILL (killed)"; real-time and unknown signals too (signal.Signals(40) raises)."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    what = signal.strsignal(sig)
    return f"{name} ({what.lower()})" if what else name


def _join(*parts: str) -> str:
    """The parts that are not empty, each on a line of its own."""
    out = ""
    for p in parts:
        if p:
            out += ("" if not out or out.endswith("\n") else "\n") + p
    return out
