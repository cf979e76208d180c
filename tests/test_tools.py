"""The tool seam (tools.py): the Python tool's wording, and a second tool, a calculator, defined here as one class
plus one line making it available (AVAILABLE), offered with --tools, end to end through rollout_one with SAAR on
(the model is scripted); each call's record names its tool, and a tool that hangs is cut off by its time limit."""
import ast
import asyncio
import dataclasses
import json
import operator

import pytest

import config
import rollout
import saar
import tools
from data.models import load_tokenizer
from fakes import ScriptedEngine
from sandbox import Sandbox


class Calculator(tools.Tool):
    """Evaluates an arithmetic expression (numbers, + - * / // % **, parentheses), nothing else."""
    name = "calculator"
    schema = {"type": "function", "function": {
        "name": name, "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
    sentence = {"hermes": "You can do arithmetic with the calculator tool. ",
                "markdown": "You can do arithmetic: write an expression in a ```calculator block. "}
    OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg}

    timeout_s = 1.0

    async def run(self, args: dict, env):
        try:
            return self.value(ast.parse(args["expression"].strip(), mode="eval").body)
        except (SyntaxError, ValueError, ArithmeticError) as e:
            return e

    def value(self, node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in self.OPS:
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 1000:  # it computes on the event loop: keep it short
                raise ValueError(f"exponent too large: {right}")
            return self.OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in self.OPS:
            return self.OPS[type(node.op)](self.value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    def reply(self, raw, cfg) -> tools.ToolResult:
        if isinstance(raw, Exception):
            return tools.ToolResult(ok=False, error_kind="exception", text=f"{type(raw).__name__}: {raw}",
                                    exception_type=type(raw).__name__)
        return tools.ToolResult(ok=True, error_kind="none", text=str(raw))


class Hang(tools.Tool):
    """A tool that never answers (a service that hangs): its time limit cuts it off."""
    name = "hang"
    schema = {"type": "function", "function": {"name": name, "description": "Wait.", "parameters": {
        "type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]}}}
    timeout_s = 0.5

    async def run(self, args: dict, env):
        await asyncio.sleep(3600)


@pytest.fixture
def calculator(monkeypatch):
    monkeypatch.setitem(tools.AVAILABLE, "calculator", Calculator())  # the one line that makes it available
    monkeypatch.setitem(tools.AVAILABLE, "hang", Hang())
    tools.offer("python,calculator")  # --tools python,calculator
    yield
    tools.offer("python")


@pytest.fixture(scope="module")
def sb():
    with Sandbox(slots=2, timeout_s=2.0) as s:
        yield s


def hermes(name: str, args: dict, reasoning: str) -> str:
    return reasoning + "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def markdown(info: str, body: str, reasoning: str) -> str:
    return f"{reasoning}```{info}\n{body}\n```\n"


# the failed call, its correction, then a Python call in the same trajectory, and the answer, in each format
SCRIPTS = {
    "hermes": ("tiny-qwen3", [hermes("calculator", {"expression": "(17 + 25) * 3)"}, "Multiply it out.\n"),
                              hermes("calculator", {"expression": "(17 + 25) * 3"}, "One parenthesis too many.\n"),
                              hermes("code_interpreter", {"code": "print(126 % 7)"}, "Check it with Python.\n")]),
    "markdown": ("smollm2-135m", [markdown("calculator", "(17 + 25) * 3)", "Multiply it out.\n"),
                                  markdown("calculator", "(17 + 25) * 3", "One parenthesis too many.\n"),
                                  markdown("python", "print(126 % 7)", "Check it with Python.\n")]),
}


@pytest.mark.parametrize("fmt", ["hermes", "markdown"])
def test_a_failed_calculator_call_is_purified_by_saar(fmt, sb, calculator):
    tok = load_tokenizer(SCRIPTS[fmt][0])
    bad, fixed, python = SCRIPTS[fmt][1]
    answer = "So \\boxed{126}.<|im_end|>"
    prompt = rollout.prompt_ids(tok, "What is (17 + 25) * 3?", "math", fmt)
    text = tok.decode(prompt)
    assert Calculator.sentence[fmt] in text  # the prompt tells the model about both tools
    assert ('"name": "calculator"' in text and '"name": "code_interpreter"' in text) == (fmt == "hermes")
    eng = ScriptedEngine(tok, [bad, fixed, python, answer])
    cfg = config.Rollout(tool_format=fmt, max_turns=4, max_response_tokens=1024, temperature=1.0)
    traj = asyncio.run(rollout.rollout_one(eng, sb, tok, prompt, cfg, config.Saar(), seed=0))
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    tool_ids = lambda out: enc(rollout.tool_turn_text(out, fmt, ended=False))  # noqa: E731
    # the regeneration saw the failed call and the calculator's error
    assert eng.inputs[1] == prompt + enc(bad) + tool_ids("SyntaxError: unmatched ')' (<unknown>, line 1)")
    assert [(e["kind"], e["error_kind"]) for e in traj.saar_events] == [("shallow", "exception")]
    # the final tokens: the old reasoning and the corrected call, its result, the Python call and its output
    syntax = rollout.CallSyntax(fmt)
    k_old, k_new = (saar.split_turn(enc(t), tokenizer=tok, syntax=syntax) for t in (bad, fixed))
    purified = enc(bad)[:k_old] + enc(fixed)[k_new:]
    assert tok.decode(purified) == "Multiply it out.\n" + fixed[len("One parenthesis too many.\n"):]
    assert traj.response_ids == purified + tool_ids("126") + enc(python) + tool_ids("0\n") + enc(answer)
    assert "SyntaxError" not in traj.text and "3)" not in traj.text and "too many" not in traj.text
    assert [(t["ok"], t["output"]) for t in traj.turns] == [(True, "126"), (True, "0\n")]
    assert traj.finish_reason == "answer" and traj.num_tool_calls == 3 and traj.num_first_errors == 1


def test_tools_flag_offers_the_named_tools_and_the_prompt_follows(tok, calculator):
    """--tools picks from tools.AVAILABLE; the prompt is made from the offered tools' sentences, in their number;
    an unknown name is an error that lists the tools."""
    assert list(tools.TOOLS) == ["code_interpreter", "calculator"]
    two = rollout.make_prompt("What is 1 + 1?", "math", "markdown")
    assert Calculator.sentence["markdown"] in two and "Use them for exact" in two and "stop calling the tools" in two
    tools.offer("python")
    one = rollout.make_prompt("What is 1 + 1?", "math", "markdown")
    assert "Use it for exact" in one and "stop calling the tool and" in one and "calculator" not in one
    with pytest.raises(ValueError, match="unknown 'shell'; the tools are python, calculator, hang"):
        tools.offer("python,shell")
    assert config.cli(config.Train, "", ["--tools", "python,calculator"]).rollout.tools == "python,calculator"


def test_each_call_is_recorded_with_its_tool_and_a_hanging_tool_is_cut_off(tok, sb, calculator):
    """A call's record names its tool, the trajectory counts calls and errors by tool (the step's per-tool
    figures), and a tool that hangs is cut off after its time limit, an error the model reads (and SAAR may fix)."""
    import time
    tools.offer("python,calculator,hang")
    turns = [hermes("hang", {"what": "forever"}, "Wait.\n"), hermes("calculator", {"expression": "2 ** 10"}, "Then.\n"),
             hermes("code_interpreter", {"code": "print(1/0)"}, "And.\n"), "\\boxed{1024}<|im_end|>"]
    eng = ScriptedEngine(tok, turns)
    cfg = config.Rollout(tool_format="hermes", max_turns=4, max_response_tokens=2048, temperature=1.0)
    t0 = time.monotonic()
    traj = asyncio.run(rollout.rollout_one(eng, sb, tok, rollout.prompt_ids(tok, "2^10?", "math", "hermes"), cfg))
    assert time.monotonic() - t0 < 30
    assert [(t["tool"], t["ok"], t["error_kind"]) for t in traj.turns] == [
        ("hang", False, "timeout"), ("calculator", True, "none"), ("code_interpreter", False, "exception")]
    assert traj.turns[0]["output"] == "TimeoutError: the hang tool took longer than 0.5 s and was stopped"
    assert traj.tool_use == {"hang": [1, 1], "calculator": [1, 0], "code_interpreter": [1, 1]}
    # the calculator is under its limit too, and refuses what would block the event loop
    slow = asyncio.run(Calculator().call({"expression": "9 ** 9 ** 9"}, type("Env", (), {"cfg": cfg})()))
    assert not slow.ok and "exponent too large" in slow.text


def test_calls_name_their_tool(calculator):
    """A hermes call names its tool and a markdown block's info string does; an unknown name is a malformed call
    that lists the offered tools; the call's main argument is what SAAR's --sim-on code compares."""
    call = rollout.parse_call(hermes("calculator", {"expression": "1 + 2"}, "Add.\n"), "hermes")
    assert (call.name, call.args, call.code) == ("calculator", {"expression": "1 + 2"}, "1 + 2")
    block = rollout.parse_call(markdown("calculator", "1 + 2", "Add.\n"), "markdown")
    assert (block.name, block.args) == ("calculator", {"expression": "1 + 2\n"})  # a block's body, as it is
    assert rollout.parse_call(markdown("python", "print(1)", ""), "markdown").name == "code_interpreter"
    assert rollout.parse_call(hermes("shell", {"code": "ls"}, ""), "hermes").error == \
        "malformed tool call: unknown tool 'shell'; the tools are code_interpreter, calculator"
    assert rollout.parse_call(hermes("calculator", {"code": "1"}, ""), "hermes").error == \
        "malformed tool call: no expression in arguments"
    assert rollout.parse_call("```calculator\n1 + 2\n", "markdown").error == \
        "malformed code block: the ```calculator block is never closed"
    for fmt in ("hermes", "markdown"):  # call_text writes what parse_call reads
        assert rollout.parse_call(rollout.call_text(block, fmt), fmt) == block
    assert tools.schemas() == [tools.PythonTool.schema, Calculator.schema]


def test_the_python_tool_alone_is_what_the_model_always_read():
    """With only the Python tool, the prompt's schema and sentences and the parser's messages are today's, byte
    for byte: the demo's tokens do not move."""
    assert list(tools.TOOLS) == ["code_interpreter"]
    schema = {"type": "function", "function": {  # as the chat template writes it: the keys' order counts too
        "name": "code_interpreter", "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code to run."}},
                       "required": ["code"]}}}
    assert json.dumps(tools.schemas()) == json.dumps([schema])
    assert tools.sentence("hermes") == "You can run Python with the code_interpreter tool. "
    assert tools.sentence("markdown") == \
        "You can run Python: write code in a ```python block and its output will be shown to you. "
    assert tools.sentence("none") == ""
    assert rollout.parse_call(hermes("shell", {"code": "ls"}, ""), "hermes").error == \
        "malformed tool call: unknown tool 'shell'; the tool is code_interpreter"
    assert rollout.parse_call("```py\nprint(1)\n", "markdown").error == \
        "malformed code block: the ```python block is never closed"


def test_tool_text_words_the_sandboxs_facts():
    """Every string the model reads from a tool comes from tools.tool_text, built from the sandbox's facts
    (sandbox.ExecResult): here from hand-made results of each kind, in both error formats."""
    from sandbox import STATE_LOSSES, ExecResult, Frame
    limits = dict(timeout_s=2.0, memory_mb=512, flood_bytes=4_000_000)
    exc = ExecResult(ok=False, error_kind="exception", stdout="hi", stderr="warn\n", exception_type="NameError",
                     exception_text="NameError: name 'y' is not defined",
                     frames=[Frame("<cell>", 3, "<module>", "f()"), Frame("<cell>", 2, "f", "return y", 2)], **limits)
    assert tools.tool_text(exc) == (
        "hi\nwarn\nTraceback (most recent call last):\n  File \"<cell>\", line 3, in <module>\n    f()\n"
        "  File \"<cell>\", line 2, in f\n    return y\n  [Previous line repeated 2 more times]\n"
        "NameError: name 'y' is not defined")
    assert tools.tool_text(exc, "last_line") == "hi\nwarn\nNameError: name 'y' is not defined"
    assert tools.tool_text(exc, header=True).startswith("Tool call failure\nreason: \nstdout: hi\nstderr: warn\n")
    # long tracebacks keep 7 + 9 lines (a frame the sandbox left out counts as two), long exceptions 1000 + 1000 chars
    deep = ExecResult(ok=False, error_kind="exception", stdout="", stderr="", exception_type="E",
                      exception_text="E: " + "x" * 2997, frames=[Frame("<cell>", i, "f", f"g({i})") for i in range(10)],
                      frames_omitted=5, **limits)
    lines = tools.tool_text(deep).splitlines()
    assert lines[7] == "  ... (15 lines omitted)" and len(lines) == 18 and lines[-2] == "    g(9)"
    assert lines[-1] == "E: " + "x" * 997 + " ... [1000 chars cut] ... " + "x" * 1000
    one_line = {  # kind and facts -> the error, one line in both formats
        ("timeout", ()): "TimeoutError: the code ran longer than the 2 s time limit and was stopped",
        ("memory", (("message", ""), ("line", 4))): "MemoryError: out of memory at line 4 (the memory limit is 512 MB)",
        ("output_limit", ()): "OutputLimitError: the code printed more than 4,000,000 bytes and was stopped",
        ("crash", (("signal", 11),)): "Crash: the process was killed by signal SIGSEGV (segmentation fault)",
        ("crash", (("exit_status", 5),)): "Crash: the process exited with status 5 before the code finished",
        ("crash", (("sandbox_killed", True),)): "Crash: the code killed the sandbox process running it",
        ("crash", ()): "Crash: the process died before the code finished",
        ("sandbox_internal", (("detail", "OSError: x"),)): "SandboxError: the sandbox itself failed, not the code "
                                                           "(OSError: x)",
    }
    for (kind, facts), text in one_line.items():
        r = ExecResult(ok=False, error_kind=kind, stdout="out\n", stderr="", **limits, **dict(facts))
        assert tools.tool_text(r) == tools.tool_text(r, "last_line") == "out\n" + text
    ok = ExecResult(ok=True, error_kind="none", stdout="", stderr="", state_lost="restarted", **limits)
    assert tools.tool_text(ok) == f"[{tools.STATE_LOST['restarted']}]"
    assert tools.tool_text(dataclasses.replace(ok, state_lost="")) == tools.NO_OUTPUT
    assert set(tools.STATE_LOST) == set(STATE_LOSSES)  # every way a state is lost has its words
    assert tools.tool_text("malformed tool call: no code in arguments", header=True) == \
        "Tool call failure\nreason: \nstderr: malformed tool call: no code in arguments"
