"""Multi-turn tool-calling rollouts, token-in token-out (the paper's agentic RL setting, Sec. 2).

A trajectory is one growing list of token ids. The model's tokens are appended exactly as sampled (loss mask 1,
with the engine's log-probs); tool responses and turn scaffolding are tokenized once, on their own, and appended
with loss mask 0. The conversation is never re-templated. Each trajectory is an asyncio task, so the sandbox runs
one trajectory's code while the engine generates for others. A trajectory's tool environment (ToolEnv) generates
its turns, runs its calls with the tools of tools.py and builds the tool turns; SAAR (saar.py) works through it.
`rollout_and_grade` rolls out and grades n samples of each problem, for train.py, eval.py and sft.py's check.
Settings: a config.Rollout (and config.Saar). Sampling seeds are mixed from their parts by `seed_of`.

Tool-call formats (`tool_format`); a call names one of the offered tools (tools.TOOLS):
  hermes    Qwen3 and the paper: <tool_call>{"name": "code_interpreter", "arguments": {"code": ...}}</tool_call>,
            answered by a user turn wrapping <tool_response>...</tool_response> (Qwen's ChatML layout).
  markdown  a fenced block whose info string names the tool (```python for the interpreter), as small models
            such as SmolLM2 write naturally; answered by a user turn holding a ```output block.
  none      no tool at all (the paper's no-tool baseline).
Both tool formats assume a ChatML template (<|im_start|>/<|im_end|>), as Qwen2.5, Qwen3 and SmolLM2 use.

Departures from the official veRL loop, and why:
  * generation stops at the call's end marker (</tool_call> or the closing fence) instead of running on to
    <|im_end|>; the scaffolding then closes the turn with <|im_end|> (mask 0). The model never has to learn
    to end a turn after a call, and no tokens are sampled after a call that nobody reads.
  * the "\\n" after <|im_end|> is kept, as the chat template writes it (veRL's slicing drops it).
  * a malformed call (bad JSON, an unknown tool, no code, unterminated block) is a tool error the model sees,
    and SAAR can roll it back; the official code treats unparseable JSON as a final answer.
  * tool output is cut to 256 characters in the middle; its wording is the tool's (tools.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import config
import tools
from data import models
from data.prompts import NO_TOOL_PROMPTS, PROMPTS, load_prompt_template  # noqa: F401  (rollout.load_prompt_template)
from machinery.engine import SamplingParams
from saar import SaarState, retry_failed_call


def seed_of(*parts: int) -> int:
    """A sampling seed mixed from its parts (run seed, step, group, sample; a trajectory's turn)."""
    return functools.reduce(lambda s, p: s * 1_000_003 + p, parts)


def truncate_middle(text: str, limit: int = 256) -> str:
    """Cut a tool output to `limit` characters, keeping head and tail (the paper's 256, middle side)."""
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


def resolve_tool_format(tokenizer, fmt: str) -> str:
    """auto: hermes when the tokenizer has a one-token <tool_call> (Qwen), else markdown; others as they are."""
    if fmt != "auto":
        return fmt
    return "hermes" if len(tokenizer.encode("<tool_call>", add_special_tokens=False)) == 1 else "markdown"


def make_prompt(problem: str, task: str = "math", tool_format: str = "hermes", templates: dict | None = None,
                meta: dict | None = None) -> str:
    if task not in PROMPTS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(PROMPTS)}")
    if templates and task in templates:  # a user's file: plain placeholders, other braces as written (\\boxed{})
        text = templates[task]
        for name, value in (meta or {}).items():  # e.g. {domain}
            if isinstance(value, str) and name not in ("problem", "tool"):
                text = text.replace("{" + name + "}", value)
        return text.replace("{problem}", problem.strip()).replace("{tool}", tools.sentence(tool_format))
    prompts = NO_TOOL_PROMPTS if tool_format == "none" else PROMPTS
    return prompts[task].format(problem=problem.strip(), tool=tools.sentence(tool_format), **tools.pronouns())


def prompt_ids(tokenizer, problem: str, task: str = "math", tool_format: str = "hermes",
               system: str | None = None, templates: dict | None = None, meta: dict | None = None) -> list[int]:
    """Template the first user turn once; everything after it is appended token by token. templates: from
    load_prompt_template (its "system" is used when no system is given); meta: the problem's, for a template's
    {name} fields."""
    system = system or (templates or {}).get("system")
    msgs = ([{"role": "system", "content": system}] if system else []) + \
           [{"role": "user", "content": make_prompt(problem, task, tool_format, templates, meta)}]
    return list(tokenizer.apply_chat_template(msgs, tools=tools.schemas() if tool_format == "hermes" else None,
                                              add_generation_prompt=True, tokenize=True, return_dict=False))


# --------------------------------------------------------------------------- tool-call formats

@dataclass
class Call:
    """The first call of a turn: the tool it names and its arguments, or why it is malformed (all None: no call)."""
    name: str | None = None       # the tool called, a key of tools.TOOLS
    args: dict | None = None      # its arguments; None when there is no call or it is malformed
    error: str | None = None      # why a call is malformed; None for a good call or no call

    @property
    def present(self) -> bool:
        return self.args is not None or self.error is not None

    @property
    def code(self) -> str | None:
        """The text of its main argument (the Python tool's code; what a markdown block's body holds)."""
        return None if self.args is None else self.args[tools.TOOLS[self.name].arg]


def _fence(text: str, pos: int = 0):
    """(the first ```<info> line at or after pos that calls an offered tool, that tool), or (None, None)."""
    by_info = {info: t for t in tools.TOOLS.values() for info in t.fences}
    m = re.compile("```(" + "|".join(map(re.escape, by_info)) + r")[ \t]*\n").search(text, pos)
    return (m, by_info[m.group(1)]) if m else (None, None)


def find_call_start(text: str, tool_format: str) -> int | None:
    """Character offset where a call begins in a decoded turn (what SAAR splits on)."""
    if tool_format == "hermes":
        i = text.find("<tool_call>")
        return None if i < 0 else i
    if tool_format == "markdown":
        m, _ = _fence(text)
        return m.start() if m else None
    return None


def parse_call(text: str, tool_format: str, repair: bool = False) -> Call:
    """The first call of a turn (only one call runs per turn, as in the paper's code).

    repair: read hermes JSON as the official parser does, with json_repair, so that e.g. a literal newline
    inside the code string is taken as one instead of being a malformed call (ours: strict json.loads)."""
    start = find_call_start(text, tool_format)
    if start is None:
        return Call()
    if tool_format == "markdown":
        m, tool = _fence(text, start)
        end = text.find("```", m.end())
        if end < 0:
            return Call(error=f"malformed code block: the ```{tool.fences[0]} block is never closed")
        if not text[m.end():end].strip():
            return Call(error="malformed code block: the block is empty")
        return Call(tool.name, {tool.arg: text[m.end():end]})
    end = text.find("</tool_call>", start)
    if end < 0:
        return Call(error="malformed tool call: <tool_call> is never closed by </tool_call>")
    if repair:
        import json_repair  # only in this mode
    loads = json_repair.loads if repair else json.loads
    try:
        obj = loads(text[start + len("<tool_call>"):end].strip())
    except json.JSONDecodeError as e:
        return Call(error=f"malformed tool call: invalid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict):
        return Call(error="malformed tool call: expected a JSON object with name and arguments")
    name = obj.get("name")
    tool = tools.TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        return Call(error=f"malformed tool call: unknown tool {name!r}; the tool"
                          f"{' is' if len(tools.TOOLS) == 1 else 's are'} {', '.join(tools.TOOLS)}")
    args = obj.get("arguments")
    if isinstance(args, str):
        try:
            args = loads(args)
        except json.JSONDecodeError:
            return Call(error="malformed tool call: arguments are not valid JSON")
    value = args.get(tool.arg) if isinstance(args, dict) else None
    if not isinstance(value, str) or not value.strip():
        return Call(error=f"malformed tool call: no {tool.arg} in arguments")
    return Call(tool.name, args)


def call_text(call: Call, tool_format: str) -> str:
    """A good call as the model writes it, up to the marker where generation stops (parse_call reads it back)."""
    tool = tools.TOOLS[call.name]
    if tool_format == "markdown":
        body = call.args[tool.arg]
        return f"```{tool.fences[0]}\n{body}" + ("" if body.endswith("\n") else "\n") + "```\n"
    payload = json.dumps({"name": call.name, "arguments": call.args}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


@dataclass(frozen=True)
class CallSyntax:
    """A tool format's calls as SAAR's split needs them (saar.py imports no project module, so the rollout
    hands this over): where a call begins in a decoded turn, and the text of its main argument (its code)."""
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
        return [], ["```\n"]  # a closing fence; the opening one is ```python (```<tool>)
    return [], []


def tool_turn_text(text: str, tool_format: str, ended: bool) -> str:
    """The scaffolding around a tool result: close the assistant turn, a user turn, open the next turn."""
    close = "" if ended else "<|im_end|>"
    body = f"<tool_response>\n{text}\n</tool_response>" if tool_format == "hermes" else f"```output\n{text}\n```"
    return f"{close}\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------------------- the trajectory record

@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)      # 1 where the policy sampled the token
    logprobs: list[float] = field(default_factory=list)     # rollout log-prob (0.0 where mask is 0)
    spliced: list[int] = field(default_factory=list)       # 1 where SAAR spliced the token in: sampled with an
                                                            # error in context that the final sequence lacks
    turns: list[dict] = field(default_factory=list)         # calls left in the final sequence, with results
    saar: bool = False                                      # did this trajectory draw SAAR
    saar_events: list[dict] = field(default_factory=list)
    finish_reason: str = ""                                 # answer | length | max_turns | max_tool_calls
    truncated: bool = False                                 # hit the response budget (overlong penalty)
    num_tool_calls: int = 0                                 # executions, rolled-back ones included
    num_tool_errors: int = 0
    num_first_calls: int = 0                                # executions that were not a SAAR retry
    num_first_errors: int = 0                               # ... and failed: the policy's own error rate
    tool_use: dict = field(default_factory=dict)            # [executions, errors] by tool ("malformed": no tool)
    meta: dict = field(default_factory=dict)
    text: str = ""                                          # decoded response, for logs
    masked: list = field(default_factory=list)              # [c0, c1]: text's character ranges of mask-0 tokens

    def extend(self, ids, mask: int, logprobs=None, spliced=None):
        n = len(ids)
        self.response_ids += list(ids)
        self.loss_mask += [mask] * n
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * n
        self.spliced += list(spliced) if spliced is not None else [0] * n
        assert len(self.logprobs) == len(self.response_ids), "logprobs must match the tokens"

    def truncate(self, n: int):
        """Drop everything after response position n (SAAR's restore)."""
        del self.response_ids[n:], self.loss_mask[n:], self.logprobs[n:], self.spliced[n:]

    def final_text(self, tokenizer) -> str:
        """The last assistant turn: the sampled tokens after the last tool response (what is graded)."""
        i = len(self.loss_mask)
        while i > 0 and self.loss_mask[i - 1] == 1:
            i -= 1
        return tokenizer.decode(self.response_ids[i:], skip_special_tokens=True)


# --------------------------------------------------------------------------- the loop

class ToolEnv:
    """One trajectory's tool environment: it generates the trajectory's turns (its seeds, its response budget),
    runs its calls (tools.TOOLS) in the sandbox or its session against the call cap, and builds the tool turns
    the model reads. SAAR calls back into it (saar.retry_failed_call's `env`)."""

    def __init__(self, engine, sandbox, tokenizer, cfg: config.Rollout, *, seed: int | None, prompt_len: int):
        self.engine, self.sandbox, self.tokenizer, self.cfg = engine, sandbox, tokenizer, cfg
        self.session = sandbox.session() if (cfg.stateful and sandbox is not None) else None
        self.syntax = CallSyntax(cfg.tool_format, cfg.repair_json)
        self.stop_ids, self.stop_strs = stop_conditions(tokenizer, cfg.tool_format)
        self.seed, self.n_gen, self.eos_ids, self.prompt_len = seed, 0, {tokenizer.eos_token_id}, prompt_len
        self.calls, self.errors, self.turn = 0, 0, 0
        self.first_calls, self.first_errors = 0, 0  # not counting SAAR's re-executions
        self.tool, self.by_tool = "", {}  # the last call's tool; [calls, errors] by tool

    def left(self, full_ids: list[int]) -> int:
        """Response tokens still allowed after full_ids (prompt + response so far, whatever it holds)."""
        return self.cfg.max_response_tokens - (len(full_ids) - self.prompt_len)

    async def generate(self, full_ids: list[int]):
        # per-trajectory seeds: what a trajectory samples can't depend on what else is in flight
        seed = None if self.seed is None else seed_of(self.seed, self.n_gen) % (2**63)
        self.n_gen += 1
        left = self.left(full_ids)
        cap = min(left, self.cfg.max_turn_tokens) if self.cfg.max_turn_tokens else left
        cap = min(cap, getattr(self.engine, "max_len", 1 << 62) - len(full_ids))  # the model's context window
        p = SamplingParams(max_new_tokens=max(cap, 1), stop_token_ids=list(self.stop_ids), stop=list(self.stop_strs),
                           seed=seed, temperature=self.cfg.temperature, top_p=self.cfg.top_p)
        return await self.engine.generate(full_ids, p)

    async def score(self, full_ids: list[int], start: int) -> list[float]:
        return await self.engine.score(full_ids, start)

    def parse(self, turn_ids: list[int]) -> Call:
        return parse_call(self.tokenizer.decode(turn_ids, skip_special_tokens=False), self.cfg.tool_format,
                          self.cfg.repair_json)

    def can_call(self) -> bool:
        return self.calls < self.cfg.max_tool_calls

    async def execute(self, call: Call, retry: bool = False) -> tools.ToolResult:
        """Run a call with its tool; retry=True for SAAR's re-execution of a corrected call."""
        self.calls += 1
        if call.error is not None:
            r = tools.ToolResult(ok=False, error_kind="malformed",
                                 text=tools.tool_text(call.error, header=self.cfg.tool_header))
        else:
            r = await tools.TOOLS[call.name].call(call.args, self)
        self.tool = call.name or "malformed"  # per tool: a malformed call names none
        used = self.by_tool.setdefault(self.tool, [0, 0])
        used[0] += 1
        used[1] += not r.ok
        self.errors += not r.ok
        if not retry:
            self.first_calls += 1
            self.first_errors += not r.ok
        return r

    def ended(self, turn_ids: list[int]) -> bool:
        return bool(turn_ids) and turn_ids[-1] in self.eos_ids

    def truncate(self, text: str) -> str:
        return truncate_middle(text, self.cfg.tool_output_chars)

    def tool_turn_ids(self, text: str, ended: bool) -> list[int]:
        return self.tokenizer.encode(tool_turn_text(text, self.cfg.tool_format, ended), add_special_tokens=False)

    def close(self):
        if self.session is not None:
            self.session.close()


async def rollout_one(engine, sandbox, tokenizer, prompt: list[int], cfg: config.Rollout,
                      saar: config.Saar | None = None, *, seed: int | None = None,
                      meta: dict | None = None) -> Trajectory:
    """Roll out one trajectory: generate, call a tool, append its result, until an answer or a cap.
    cfg: the rollout's settings, its tool_format resolved (resolve_tool_format); saar: SAAR's settings, None for
    SAAR off; each trajectory uses it with probability saar.rollback_p (curriculum mixing)."""
    if cfg.tool_format == "auto":
        raise ValueError("tool_format 'auto' must be resolved first (rollout.resolve_tool_format)")
    check(cfg, saar)
    traj = Trajectory(prompt_ids=list(prompt), meta=dict(meta or {}))
    # curriculum mixing: each trajectory draws SAAR with probability p (seeded per trajectory)
    traj.saar = saar is not None and random.Random(seed).random() < saar.rollback_p
    state = SaarState(on=traj.saar, events=traj.saar_events)
    env = ToolEnv(engine, sandbox, tokenizer, cfg, seed=seed, prompt_len=len(traj.prompt_ids))
    budget = cfg.max_response_tokens

    async def handle_turn(start: int, gen_finish: str) -> str | None:
        """Process the assistant turn at response_ids[start:]: None to go on, else a finish reason."""
        call = env.parse(traj.response_ids[start:])
        budget_hit = len(traj.response_ids) >= budget
        if not call.present:
            traj.truncated = budget_hit and gen_finish == "length"
            return "length" if traj.truncated else "answer"
        if budget_hit:
            traj.truncated = True
            return "length"
        if not env.can_call() and cfg.tool_cap_ends:
            return "max_tool_calls"
        if not cfg.last_turn_calls and env.turn == cfg.max_turns - 1:
            return "max_turns"  # the official loop stops at the last turn without running its call
        result = await env.execute(call)
        note = ""
        if not result.ok and state.on:
            out = await retry_failed_call(traj, start, result, cfg=saar, state=state, env=env)
            if out.next_turn is not None:  # the failed turn and its error stay, and a regenerated turn follows them
                _record(traj, start, out.result, env)
                return await handle_turn(out.next_turn, out.next_finish)
            result, note = out.result, out.note
        _record(traj, start, result, env)
        tool = env.tool_turn_ids(env.truncate(result.text) + note, env.ended(traj.response_ids[start:]))
        if len(traj.response_ids) + len(tool) >= budget:
            traj.truncated = True  # no room left for the result, let alone an answer
            return "length"
        traj.extend(tool, mask=0)
        return None

    try:
        finish = "max_turns"
        for turn in range(cfg.max_turns):
            env.turn = turn
            if len(traj.response_ids) >= budget:
                traj.truncated, finish = True, "length"
                break
            out = await env.generate(traj.prompt_ids + traj.response_ids)
            start = len(traj.response_ids)
            traj.extend(out.token_ids, mask=1, logprobs=out.logprobs)
            if (done := await handle_turn(start, out.finish_reason)) is not None:
                finish = done
                break
    finally:
        env.close()
    traj.finish_reason, traj.tool_use = finish, env.by_tool
    traj.num_tool_calls, traj.num_tool_errors = env.calls, env.errors
    traj.num_first_calls, traj.num_first_errors = env.first_calls, env.first_errors
    readable(traj, tokenizer)
    return traj


def readable(traj: Trajectory, tokenizer) -> None:
    """traj.text, the response decoded, with character offsets for a reader (run report, JSONL): traj.masked,
    the ranges of the tokens not trained on, and each SAAR event's `at`, the range of its `span` (`superseded`:
    a later retry of the turn replaced that text again). The text is decoded piece by piece between those token
    positions, so that each offset is exact."""
    ids, mask = traj.response_ids, traj.loss_mask
    cuts = {0, len(ids)} | {i for i in range(1, len(ids)) if mask[i] != mask[i - 1]}
    cuts |= {min(p, len(ids)) for e in traj.saar_events for p in e.get("span", ())}  # a later retry may be shorter
    cuts = sorted(cuts)
    pieces, at, traj.masked = [], {0: 0}, []
    for a, b in zip(cuts, cuts[1:]):
        pieces.append(tokenizer.decode(ids[a:b], skip_special_tokens=False))
        at[b] = at[a] + len(pieces[-1])
        if mask[a] == 0 and traj.masked and traj.masked[-1][1] == at[a]:
            traj.masked[-1][1] = at[b]  # one range, cut by an event's span
        elif mask[a] == 0:
            traj.masked.append([at[a], at[b]])
    traj.text = "".join(pieces)
    later = set()  # a later retry of the same turn spliced again where this event's replacement was
    for e in reversed(traj.saar_events):
        if "span" in e:
            e["at"] = [at[min(p, len(ids))] for p in e["span"]]
            if e["span"][0] in later:
                e["superseded"] = True
            later.add(e["span"][0])


def settle(model: str, cfg: config.Rollout, saar: config.Saar | None) -> config.Rollout:
    """The settings train.py and eval.py check before a model loads (the tools, the model, built here if offline, and
    `check`'s), returned with the tool format resolved (auto: by the tokenizer); ValueError or OSError if bad."""
    tools.offer(cfg.tools)
    models.resolve(model)
    cfg = dataclasses.replace(cfg, tool_format=resolve_tool_format(models.load_tokenizer(model), cfg.tool_format)
                              if cfg.tool_format == "auto" else cfg.tool_format)
    check(cfg, saar)
    return cfg


def check(cfg: config.Rollout, saar: config.Saar | None) -> None:
    """Settings that cannot go together (train.py checks them before any model loads)."""
    if saar is not None and saar.is_mode != "none" and cfg.temperature not in (0.0, 1.0):
        # engine.score gives log-probs at temperature 1, as greedy requests do; sampled ones are at `temperature`
        raise ValueError(f"SAAR importance correction (is_mode={saar.is_mode!r}) needs temperature 1.0, "
                         f"got {cfg.temperature}")


def _record(traj: Trajectory, start: int, result: tools.ToolResult, env: ToolEnv):
    traj.turns.append(dict(turn=env.turn, start=start, tool=env.tool, ok=result.ok, error_kind=result.error_kind,
                           exception_type=result.exception_type, output=env.truncate(result.text)))


async def rollout_batch(engine, sandbox, tokenizer, prompts: list[list[int]], cfg: config.Rollout,
                        saar: config.Saar | None = None, *, seeds: list[int | None] | None = None,
                        metas: list[dict] | None = None, progress: bool = False) -> list[Trajectory]:
    """Roll out all prompts concurrently (one asyncio task each); results keep the input order."""
    tasks = [asyncio.ensure_future(rollout_one(engine, sandbox, tokenizer, p, cfg, saar, seed=s, meta=m)) for p, s, m
             in zip(prompts, seeds or [None] * len(prompts), metas or [{}] * len(prompts))]
    if getattr(engine, "lockstep", False):  # HFEngine(lockstep=True): it decodes while all of them wait on it
        engine.track(tasks)
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


async def rollout_and_grade(engine, sandbox, tokenizer, problems: list, cfg: config.Rollout,
                            saar: config.Saar | None = None, *, grade, n: int = 1,
                            seeds: list[int | None], metas: list[dict] | None = None, templates: dict | None = None,
                            grade_workers: int = 1, progress: bool = False,
                            times: dict | None = None) -> tuple[list[Trajectory], list]:
    """Roll out n samples of each problem and grade each one (train.py's steps and held-out eval, eval.py, sft.py).

    problems: anything with .problem and .task (data/problems.py's Problem), each prompted once (prompt_ids, with
    `templates` and its .meta) and sampled n times, problem-major. seeds, metas: one per trajectory.
    grade(problem, trajectory) -> its grade, once every rollout is done, in grade_workers threads (1: in order).
    times: each phase's seconds are added to times["rollout"] and times["reward"]. Returns (trajectories, grades)."""
    t0 = time.perf_counter()
    prompts = [prompt_ids(tokenizer, p.problem, p.task, cfg.tool_format, templates=templates,
                          meta=getattr(p, "meta", None)) for p in problems]
    trajs = await rollout_batch(engine, sandbox, tokenizer, [ids for ids in prompts for _ in range(n)], cfg, saar,
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
