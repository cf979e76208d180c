"""Multi-turn tool-calling rollouts, token-in token-out (the paper's agentic RL setting, Sec. 2).

A trajectory is one growing list of token ids. The model's tokens are appended exactly as sampled
(loss mask 1, with the engine's log-probs); tool responses and turn scaffolding are tokenized once,
on their own, and appended with loss mask 0. The conversation is never re-templated. Each trajectory
is an asyncio task, so the sandbox runs one trajectory's code while the engine generates for others. A
trajectory's tool environment (ToolEnv) generates its turns, runs its calls and builds the tool turns; SAAR
(saar.py) works through it. `rollout_and_grade` rolls out n samples of each of a list of problems and grades
them: train.py (training and held-out eval), eval.py and sft.py's check all go through it.

Tool-call formats (`tool_format`):
  hermes    Qwen3 and the paper: <tool_call>{"name": "code_interpreter", "arguments": {"code": ...}}</tool_call>,
            answered by a user turn wrapping <tool_response>...</tool_response> (Qwen's ChatML layout).
  markdown  a ```python fenced block, which small models such as SmolLM2 write naturally; answered by a
            user turn holding a ```output block.
  none      no tool at all (the paper's no-tool baseline).
Both tool formats assume a ChatML template (<|im_start|>/<|im_end|>), as Qwen2.5, Qwen3 and SmolLM2 use.

Departures from the official veRL loop, and why:
  * generation stops at the call's end marker (</tool_call> or the closing fence) instead of running on to
    <|im_end|>; the scaffolding then closes the turn with <|im_end|> (mask 0). The model never has to learn
    to end a turn after a call, and no tokens are sampled after a call that nobody reads.
  * the "\\n" after <|im_end|> is kept, as the chat template writes it (veRL's slicing drops it).
  * a malformed call (bad JSON, no code, unterminated block) is a tool error the model sees, and SAAR
    can roll it back; the official code treats unparseable JSON as a final answer.
  * tool output is stdout plus a compact traceback (tool_text, from the sandbox's facts); the official tool
    heads it with a success/failure line and labels the streams (`tool_header` gives that layout). Both are
    cut to 256 characters in the middle.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine import SamplingParams
import saar

TOOL_NAME = "code_interpreter"
TOOL_SCHEMA = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "Run Python code and return what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code to run."}},
                   "required": ["code"]}}}

# --------------------------------------------------------------------------- model-facing text (one place)
# {tool} is the per-format sentence on how to call the interpreter.
PROMPTS = {
    "math": ("Solve the following math problem step by step.\n\n{problem}\n\n"
             "{tool}Use it for exact calculation and to check your work before you answer. "
             "When you are sure, stop calling the tool and give the final answer as \\boxed{{answer}}."),
    "code": ("Solve the following programming problem.\n\n{problem}\n\n"
             "{tool}Use it to test your solution. When you are sure it is correct, stop calling the tool and "
             "give your final solution in one ```python block."),
    "gpqa": ("Answer the following multiple-choice question step by step.\n\n{problem}\n\n"
             "{tool}Use it for exact calculation. Give the letter of the final answer as \\boxed{{X}}."),
}
# What the model reads after a tool call: the result (tool_text, from the sandbox's facts or parse_call's
# message, cut by truncate_middle), then, from SAAR, the fix instruction (ToolEnv.feedback) or the give-up note
FIX_INSTRUCTION = "\nThe tool call above failed. Fix the error and call the tool again."
# {n}: how often SAAR regenerated the turn before giving up (its retries, as the official note counts them)
GIVE_UP_NOTE = ("\n\nNote: this approach was retried {n} times, failing with the same kind of error each time. "
                "Try another algorithm, method or approach instead.")
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
    """Every string the model reads from one tool call, before it is cut (truncate_middle): from the facts of
    a sandbox.ExecResult, or a malformed call's message (a str, from parse_call).
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


def truncate_middle(text: str, limit: int = 256) -> str:
    """Cut a tool output to `limit` characters, keeping head and tail (the paper's 256, middle side)."""
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


TOOL_SENTENCE = {
    "hermes": "You can run Python with the code_interpreter tool. ",
    "markdown": "You can run Python: write code in a ```python block and its output will be shown to you. ",
    "none": "",
}


def load_prompt_template(path: str) -> dict:
    """A prompt template file (--prompt-template): JSON {"math": ..., "code": ..., "gpqa": ..., "system": ...}, each
    optional; a task's template holds {problem}, and may hold {tool} (the tool sentence) and {name} for a text
    field of the problem's meta (e.g. {domain}, GPQA's). For users who want other wording, e.g. the official
    prompts, which the project does not carry (`data/download.py --templates` writes them)."""
    try:
        with open(path, encoding="utf-8") as f:
            t = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"--prompt-template {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--prompt-template {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
        raise ValueError(f"--prompt-template {path}: expected a JSON object of strings")
    unknown = set(t) - set(PROMPTS) - {"system"}
    if unknown:
        raise ValueError(f"--prompt-template {path}: unknown keys {sorted(unknown)}; known: {sorted(PROMPTS)} and system")
    for task, text in t.items():
        if task != "system" and "{problem}" not in text:
            raise ValueError(f"--prompt-template {path}: the {task!r} template has no {{problem}}")
    return t


def make_prompt(problem: str, task: str = "math", tool_format: str = "hermes", templates: dict | None = None,
                meta: dict | None = None) -> str:
    if task not in PROMPTS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(PROMPTS)}")
    if templates and task in templates:  # a user's file: plain placeholders, other braces as written (\\boxed{})
        text = templates[task]
        for name, value in (meta or {}).items():  # e.g. {domain}
            if isinstance(value, str) and name not in ("problem", "tool"):
                text = text.replace("{" + name + "}", value)
        return text.replace("{problem}", problem.strip()).replace("{tool}", TOOL_SENTENCE[tool_format])
    return PROMPTS[task].format(problem=problem.strip(), tool=TOOL_SENTENCE[tool_format])


def prompt_ids(tokenizer, problem: str, task: str = "math", tool_format: str = "hermes",
               system: str | None = None, templates: dict | None = None, meta: dict | None = None) -> list[int]:
    """Template the first user turn once; everything after it is appended token by token. templates: from
    load_prompt_template (its "system" is used when no system is given); meta: the problem's, for a template's
    {name} fields."""
    system = system or (templates or {}).get("system")
    msgs = ([{"role": "system", "content": system}] if system else []) + \
           [{"role": "user", "content": make_prompt(problem, task, tool_format, templates, meta)}]
    return list(tokenizer.apply_chat_template(msgs, tools=[TOOL_SCHEMA] if tool_format == "hermes" else None,
                                              add_generation_prompt=True, tokenize=True, return_dict=False))


# --------------------------------------------------------------------------- tool-call formats

@dataclass
class Call:
    code: str | None = None       # the code to run; None when there is no call or it is malformed
    error: str | None = None      # why a call is malformed; None for a good call or no call

    @property
    def present(self) -> bool:
        return self.code is not None or self.error is not None


_FENCE = re.compile(r"```(?:python|py)[ \t]*\n")


def find_call_start(text: str, tool_format: str) -> int | None:
    """Character offset where a call begins in a decoded turn (what SAAR splits on)."""
    if tool_format == "hermes":
        i = text.find("<tool_call>")
        return None if i < 0 else i
    if tool_format == "markdown":
        m = _FENCE.search(text)
        return m.start() if m else None
    return None


def parse_call(text: str, tool_format: str, repair: bool = False) -> Call:
    """The first call of a turn (only one call runs per turn, as in the paper's code).

    repair: read hermes JSON as the official parser does, with json_repair, so that e.g. a literal newline
    inside the code string is taken as one instead of being a malformed call (ours: strict json.loads)."""
    start = find_call_start(text, tool_format)
    if start is None:
        return Call()
    if tool_format == "hermes":
        end = text.find("</tool_call>", start)
        if end < 0:
            return Call(error="malformed tool call: <tool_call> is never closed by </tool_call>")
        body = text[start + len("<tool_call>"):end].strip()
        if repair:
            import json_repair  # only in this mode
            loads = json_repair.loads
        else:
            loads = json.loads
        try:
            obj = loads(body)
        except json.JSONDecodeError as e:
            return Call(error=f"malformed tool call: invalid JSON ({e.msg} at char {e.pos})")
        if not isinstance(obj, dict):
            return Call(error="malformed tool call: expected a JSON object with name and arguments")
        if obj.get("name") != TOOL_NAME:
            return Call(error=f"malformed tool call: unknown tool {obj.get('name')!r}; the tool is {TOOL_NAME}")
        args = obj.get("arguments")
        if isinstance(args, str):
            try:
                args = loads(args)
            except json.JSONDecodeError:
                return Call(error="malformed tool call: arguments are not valid JSON")
        code = args.get("code") if isinstance(args, dict) else None
        if not isinstance(code, str) or not code.strip():
            return Call(error="malformed tool call: no code in arguments")
        return Call(code=code)
    m = _FENCE.search(text, start)
    end = text.find("```", m.end())
    if end < 0:
        return Call(error="malformed code block: the ```python block is never closed")
    code = text[m.end():end]
    if not code.strip():
        return Call(error="malformed code block: the block is empty")
    return Call(code=code)


@dataclass(frozen=True)
class CallSyntax:
    """A tool format's calls as SAAR's split needs them (saar.py imports no project module, so the rollout
    hands this over): where a call begins in a decoded turn, and the code it runs."""
    tool_format: str
    repair: bool = False

    def start(self, text: str) -> int | None:
        return find_call_start(text, self.tool_format)

    def code(self, text: str) -> str | None:
        return parse_call(text, self.tool_format, self.repair).code


def stop_conditions(tokenizer, tool_format: str) -> tuple[list[int], list[str]]:
    """(stop_token_ids, stop strings) that end a turn at the end of a call; EOS is the engine's."""
    if tool_format == "hermes":
        ids = tokenizer.encode("</tool_call>", add_special_tokens=False)
        return (ids, []) if len(ids) == 1 else ([], ["</tool_call>"])
    if tool_format == "markdown":
        return [], ["```\n"]  # a closing fence; the opening one is ```python
    return [], []


def tool_turn_text(text: str, tool_format: str, ended: bool) -> str:
    """The scaffolding around a tool result: close the assistant turn, a user turn, open the next turn."""
    close = "" if ended else "<|im_end|>"
    if tool_format == "hermes":
        body = f"<tool_response>\n{text}\n</tool_response>"
    else:
        body = f"```output\n{text}\n```"
    return f"{close}\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------------------- the trajectory record

@dataclass
class ToolResult:
    """What a tool call produced, from the sandbox or from a malformed call."""
    ok: bool
    error_kind: str               # sandbox.py's kinds, plus "malformed"
    text: str                     # the full model-facing text (cut later, where it is appended)
    exception_type: str | None = None

    @classmethod
    def from_exec(cls, r, error_format: str = "full", header: bool = False):
        """From a sandbox.ExecResult; the text is tool_text's."""
        return cls(ok=r.ok, error_kind=r.error_kind, text=tool_text(r, error_format, header),
                   exception_type=r.exception_type)


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)      # 1 where the policy sampled the token
    logprobs: list[float] = field(default_factory=list)     # rollout log-prob (0.0 where mask is 0)
    is_weight: list[float] | None = None                    # SAAR importance weights (only with is_mode="token")
    turns: list[dict] = field(default_factory=list)         # calls left in the final sequence, with results
    saar: bool = False                                      # did this trajectory draw SAAR
    saar_events: list[dict] = field(default_factory=list)
    finish_reason: str = ""                                 # answer | length | max_turns | max_tool_calls
    truncated: bool = False                                 # hit the response budget (overlong penalty)
    num_tool_calls: int = 0                                 # executions, rolled-back ones included
    num_tool_errors: int = 0
    num_first_calls: int = 0                                # executions that were not a SAAR retry
    num_first_errors: int = 0                               # ... and failed: the policy's own error rate
    meta: dict = field(default_factory=dict)
    text: str = ""                                          # decoded response, for logs

    def extend(self, ids, mask: int, logprobs=None, is_weight=None):
        n = len(ids)
        self.response_ids += list(ids)
        self.loss_mask += [mask] * n
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * n
        if self.is_weight is not None:
            self.is_weight += list(is_weight) if is_weight is not None else [1.0] * n
        assert len(self.logprobs) == len(self.response_ids), "logprobs must match the tokens"

    def truncate(self, n: int):
        """Drop everything after response position n (SAAR's restore)."""
        del self.response_ids[n:], self.loss_mask[n:], self.logprobs[n:]
        if self.is_weight is not None:
            del self.is_weight[n:]

    def final_text(self, tokenizer) -> str:
        """The last assistant turn: the sampled tokens after the last tool response (what is graded)."""
        i = len(self.loss_mask)
        while i > 0 and self.loss_mask[i - 1] == 1:
            i -= 1
        return tokenizer.decode(self.response_ids[i:], skip_special_tokens=True)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


# --------------------------------------------------------------------------- the loop

@dataclass
class RolloutConfig:
    """Every rollout setting, in one place: an entry script builds it once from its Args, and rollout_one and
    the per-trajectory ToolEnv take it whole (keyword arguments of rollout_one/rollout_batch override fields)."""
    tool_format: str = "hermes"            # hermes (Qwen, the paper), markdown (```python blocks) or none
    max_turns: int = 16                    # assistant turns per trajectory (paper: 16)
    max_response_tokens: int = 20480       # response budget, tool tokens included (paper: 20480)
    max_turn_tokens: int | None = None     # cap on one assistant turn (None: the remaining budget)
    max_tool_calls: int = 30               # tool executions per trajectory, SAAR retries included
    cap_ends: bool = True                  # the call cap ends the trajectory (ours) or only stops SAAR (official)
    last_turn_calls: bool = True           # a call in the last allowed turn runs (ours); official: the turn ends it
    tool_output_chars: int = 256           # tool output shown to the model, cut in the middle (paper: 256)
    error_format: str = "full"             # model-facing error: full (stdout + compact traceback) or last_line
    tool_header: bool = False              # tool output laid out as the official tool's (headed_text)
    stateful: bool = False                 # a persistent Python session per trajectory (the paper's is stateless)
    echo: bool = False                     # stateless calls print a final bare expression's repr (official tool)
    repair_json: bool = False              # hermes calls parsed with json_repair (the official parser)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    saar_cfg: saar.SaarConfig | None = None  # SAAR's own settings; None: SAAR off
    saar_p: float = 0.0                    # curriculum mixing: the probability a trajectory uses SAAR
    eos_ids: tuple = ()                    # end-of-turn ids (default: the tokenizer's eos)


class ToolEnv:
    """One trajectory's tool environment: it generates the trajectory's turns (its seeds, its response budget),
    runs its calls in the sandbox (or its session) against the call cap, and builds the tool turns the model
    reads. SAAR calls back into it (saar.retry_failed_call's `env`)."""

    def __init__(self, engine, sandbox, tokenizer, cfg: RolloutConfig, *, seed: int | None, prompt_len: int):
        self.engine, self.sandbox, self.tokenizer, self.cfg = engine, sandbox, tokenizer, cfg
        self.tool_format = cfg.tool_format
        self.session = sandbox.session() if (cfg.stateful and sandbox is not None) else None
        self.syntax = CallSyntax(cfg.tool_format, cfg.repair_json)
        self.sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
        self.stop_ids, self.stop_strs = stop_conditions(tokenizer, cfg.tool_format)
        self.seed, self.n_gen, self.eos_ids = seed, 0, set(cfg.eos_ids) or {tokenizer.eos_token_id}
        self.prompt_len = prompt_len
        self.calls, self.errors = 0, 0
        self.first_calls, self.first_errors = 0, 0  # not counting SAAR's re-executions
        self.turn = 0

    def left(self, full_ids: list[int]) -> int:
        """Response tokens still allowed after full_ids (prompt + response so far, whatever it holds)."""
        return self.cfg.max_response_tokens - (len(full_ids) - self.prompt_len)

    async def generate(self, full_ids: list[int]):
        # per-trajectory seeds: what a trajectory samples can't depend on what else is in flight
        seed = None if self.seed is None else (self.seed * 1_000_003 + self.n_gen) % (2**63)
        self.n_gen += 1
        left = self.left(full_ids)
        cap = left if self.cfg.max_turn_tokens is None else min(left, self.cfg.max_turn_tokens)
        cap = min(cap, getattr(self.engine, "max_len", 1 << 62) - len(full_ids))  # the model's context window
        p = SamplingParams(max_new_tokens=max(cap, 1), stop_token_ids=list(self.stop_ids), stop=list(self.stop_strs),
                           seed=seed, **self.sampling)
        return await self.engine.generate(full_ids, p)

    async def score(self, full_ids: list[int], start: int) -> list[float]:
        return await self.engine.score(full_ids, start)

    def parse(self, turn_ids: list[int]) -> Call:
        return parse_call(self.tokenizer.decode(turn_ids, skip_special_tokens=False), self.tool_format,
                          self.cfg.repair_json)

    def can_call(self) -> bool:
        return self.calls < self.cfg.max_tool_calls

    async def execute(self, call: Call, retry: bool = False) -> ToolResult:
        """Run a call; retry=True for SAAR's re-execution of a corrected call."""
        self.calls += 1
        if call.error is not None:
            r = ToolResult(ok=False, error_kind="malformed", text=tool_text(call.error, header=self.cfg.tool_header))
        else:
            if self.session is not None:
                res = await self.session.arun(call.code)
            else:
                res = await self.sandbox.arun(call.code, echo=self.cfg.echo)
            r = ToolResult.from_exec(res, self.cfg.error_format, self.cfg.tool_header)
        self.errors += not r.ok
        if not retry:
            self.first_calls += 1
            self.first_errors += not r.ok
        return r

    def ended(self, turn_ids: list[int]) -> bool:
        return bool(turn_ids) and turn_ids[-1] in self.eos_ids

    def truncate(self, text: str) -> str:
        return truncate_middle(text, self.cfg.tool_output_chars)

    def feedback(self, result: "ToolResult", instruction: bool = False) -> str:
        """The error SAAR shows before a regeneration: the result as cut for the model, and with
        --feedback-instruction an explicit request to fix it."""
        return self.truncate(result.text) + (FIX_INSTRUCTION if instruction else "")

    def give_up_note(self, retries: int) -> str:
        """Appended to the last error when SAAR gives up after regenerating the turn `retries` times."""
        return GIVE_UP_NOTE.format(n=retries)

    def tool_turn_ids(self, text: str, ended: bool) -> list[int]:
        return self.tokenizer.encode(tool_turn_text(text, self.tool_format, ended), add_special_tokens=False)

    def close(self):
        if self.session is not None:
            self.session.close()


async def rollout_one(engine, sandbox, tokenizer, prompt: list[int], cfg: RolloutConfig | None = None, *,
                      seed: int | None = None, meta: dict | None = None, **overrides) -> Trajectory:
    """Roll out one trajectory: generate, call the tool, append its result, until an answer or a cap.
    cfg: the rollout's settings (default RolloutConfig()); overrides: fields of it, by name."""
    cfg = dataclasses.replace(cfg or RolloutConfig(), **overrides)
    saar_cfg, max_response_tokens = cfg.saar_cfg, cfg.max_response_tokens
    if saar_cfg is not None and saar_cfg.is_mode != "none" and cfg.temperature not in (0.0, 1.0):
        # engine.score gives log-probs at temperature 1, as greedy requests do; sampled ones are at `temperature`
        raise ValueError(f"SAAR importance correction (is_mode={saar_cfg.is_mode!r}) needs temperature 1.0, "
                         f"got {cfg.temperature}")
    traj = Trajectory(prompt_ids=list(prompt), meta=dict(meta or {}))
    # curriculum mixing: each trajectory draws SAAR with probability p (seeded per trajectory)
    traj.saar = saar_cfg is not None and random.Random(seed).random() < cfg.saar_p
    state = saar.SaarState(on=traj.saar, events=traj.saar_events)
    if traj.saar and saar_cfg.is_mode == "token":
        traj.is_weight = []
    env = ToolEnv(engine, sandbox, tokenizer, cfg, seed=seed, prompt_len=len(traj.prompt_ids))

    async def handle_turn(start: int, gen_finish: str) -> str | None:
        """Process the assistant turn at response_ids[start:]: None to go on, else a finish reason."""
        call = env.parse(traj.response_ids[start:])
        budget_hit = len(traj.response_ids) >= max_response_tokens
        if not call.present:
            traj.truncated = budget_hit and gen_finish == "length"
            return "length" if traj.truncated else "answer"
        if budget_hit:
            traj.truncated = True
            return "length"
        if not env.can_call() and cfg.cap_ends:
            return "max_tool_calls"
        if not cfg.last_turn_calls and env.turn == cfg.max_turns - 1:
            return "max_turns"  # the official loop stops at the last turn without running its call
        result = await env.execute(call)
        note = ""
        if not result.ok and state.on:
            out = await saar.retry_failed_call(traj, start, result, cfg=saar_cfg, state=state, env=env)
            if out.continues:  # the failed turn and its error stay, and a regenerated turn follows them
                _record(traj, start, out.result, env)
                return await handle_turn(out.next_turn, out.next_finish)
            result, note = out.result, out.note
        _record(traj, start, result, env)
        tool = env.tool_turn_ids(env.truncate(result.text) + note, env.ended(traj.response_ids[start:]))
        if len(traj.response_ids) + len(tool) >= max_response_tokens:
            traj.truncated = True  # no room left for the result, let alone an answer
            return "length"
        traj.extend(tool, mask=0)
        return None

    try:
        finish = "max_turns"
        for turn in range(cfg.max_turns):
            env.turn = turn
            if len(traj.response_ids) >= max_response_tokens:
                traj.truncated, finish = True, "length"
                break
            out = await env.generate(traj.prompt_ids + traj.response_ids)
            start = len(traj.response_ids)
            traj.extend(out.token_ids, mask=1, logprobs=out.logprobs)
            done = await handle_turn(start, out.finish_reason)
            if done is not None:
                finish = done
                break
    finally:
        env.close()
    traj.finish_reason = finish
    traj.num_tool_calls, traj.num_tool_errors = env.calls, env.errors
    traj.num_first_calls, traj.num_first_errors = env.first_calls, env.first_errors
    traj.text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    return traj


def _record(traj: Trajectory, start: int, result: ToolResult, env: ToolEnv):
    traj.turns.append(dict(turn=env.turn, start=start, ok=result.ok, error_kind=result.error_kind,
                           exception_type=result.exception_type, output=env.truncate(result.text)))


async def rollout_batch(engine, sandbox, tokenizer, prompts: list[list[int]], cfg: RolloutConfig | None = None, *,
                        seeds: list[int | None] | None = None, metas: list[dict] | None = None,
                        progress: bool = False, **overrides) -> list[Trajectory]:
    """Roll out all prompts concurrently (one asyncio task each); results keep the input order."""
    seeds = seeds or [None] * len(prompts)
    metas = metas or [{}] * len(prompts)
    cfg = dataclasses.replace(cfg or RolloutConfig(), **overrides)
    tasks = [asyncio.ensure_future(rollout_one(engine, sandbox, tokenizer, p, cfg, seed=s, meta=m))
             for p, s, m in zip(prompts, seeds, metas)]
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(tasks), desc="rollout", leave=False)
        for t in tasks:
            t.add_done_callback(lambda _: bar.update(1))
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        if progress:
            bar.close()


async def rollout_and_grade(engine, sandbox, tokenizer, problems: list, cfg: RolloutConfig, *, grade, n: int = 1,
                            seeds: list[int | None], metas: list[dict] | None = None, templates: dict | None = None,
                            grade_workers: int = 1, progress: bool = False,
                            times: dict | None = None) -> tuple[list[Trajectory], list]:
    """Roll out n samples of each problem and grade each one: the "roll out, then grade" of train.py (a step's
    rollouts and the held-out eval), eval.py and sft.py's check.

    problems: anything with .problem and .task (data/problems.py's Problem); each is prompted once
    (prompt_ids, with `templates` and its .meta) and sampled n times, problem-major (problem 0's n samples,
    then problem 1's).
    seeds, metas: one per trajectory. grade(problem, trajectory) -> its grade (train: right or wrong; eval.py:
    the graded record); grading starts when every rollout is done, in grade_workers threads (1: in order,
    here). times: the seconds of each phase are added to times["rollout"] and times["reward"].
    Returns (trajectories, grades), in the same order."""
    t0 = time.perf_counter()
    prompts = [prompt_ids(tokenizer, p.problem, p.task, cfg.tool_format, templates=templates,
                          meta=getattr(p, "meta", None)) for p in problems]
    trajs = await rollout_batch(engine, sandbox, tokenizer, [ids for ids in prompts for _ in range(n)], cfg,
                                seeds=seeds, metas=metas, progress=progress)
    t1 = time.perf_counter()
    each = [p for p in problems for _ in range(n)]  # the problem of each trajectory
    if grade_workers > 1:
        with ThreadPoolExecutor(grade_workers) as pool:
            grades = list(pool.map(grade, each, trajs))
    else:
        grades = [grade(p, tr) for p, tr in zip(each, trajs)]
    if times is not None:
        times["rollout"] = times.get("rollout", 0.0) + t1 - t0
        times["reward"] = times.get("reward", 0.0) + time.perf_counter() - t1
    return trajs, grades
