"""Rollout and SAAR with a scripted model against the real sandbox: every path of the loop."""
import asyncio
import dataclasses
import json

import pytest

import config
import rollout
import saar
from fakes import ScriptedEngine
from sandbox import Sandbox


@pytest.fixture(scope="module")
def sb():
    """Two slots and a 2 s limit, unlike conftest's (tok comes from conftest)."""
    with Sandbox(slots=2, timeout_s=2.0) as s:
        yield s


def call(code, reasoning="Let me compute.\n"):
    return reasoning + "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def tool_ids(tok, text, ended=False):
    return ids(tok, rollout.tool_turn_text(text, "hermes", ended))


# the paper's rollout: hermes calls, 16 turns, a 20480-token budget, temperature 1
PAPER = config.Rollout(tool_format="hermes", max_turns=16, max_response_tokens=20480, temperature=1.0)


def run(tok, sb, turns, saar=None, **kw):
    """One scripted trajectory; kw: fields of config.Rollout replacing PAPER's; saar: a config.Saar (SAAR on)."""
    eng = ScriptedEngine(tok, turns)
    prompt = rollout.prompt_ids(tok, "What is 6*7?", "math", "hermes")
    traj = asyncio.run(rollout.rollout_one(eng, sb, tok, prompt, dataclasses.replace(PAPER, **kw), saar, seed=1))
    return traj, eng, prompt


def segments(traj):
    """(mask, ids) runs of the response."""
    out, cur = [], None
    for t, m in zip(traj.response_ids, traj.loss_mask):
        if cur is None or cur[0] != m:
            cur = (m, [])
            out.append(cur)
        cur[1].append(t)
    return out


def test_success_token_in_token_out(tok, sb):
    turns = [call("print(6*7)"), "So the answer is \\boxed{42}.<|im_end|>"]
    traj, eng, prompt = run(tok, sb, turns)
    t1, t2 = ids(tok, turns[0]), ids(tok, turns[1])
    tr = tool_ids(tok, "42\n")
    assert traj.response_ids == t1 + tr + t2  # exactly what the engine returned plus what the tool appended
    assert traj.loss_mask == [1] * len(t1) + [0] * len(tr) + [1] * len(t2)
    assert traj.logprobs == [-0.25] * len(t1) + [0.0] * len(tr) + [-0.25] * len(t2)
    assert eng.inputs[1] == prompt + t1 + tr  # the second turn saw the appended tokens, not a re-template
    assert traj.finish_reason == "answer" and not traj.truncated
    assert traj.num_tool_calls == 1 and traj.num_tool_errors == 0
    assert tok.decode(traj.response_ids) == traj.text
    assert "<tool_response>\n42\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in traj.text
    assert traj.turns[0]["ok"] and traj.turns[0]["error_kind"] == "none"


def test_exception_is_shown_and_kept_without_saar(tok, sb):
    turns = [call("x = 1/0"), "\\boxed{0}<|im_end|>"]
    traj, _, _ = run(tok, sb, turns)
    assert traj.turns[0]["error_kind"] == "exception" and traj.turns[0]["exception_type"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in traj.text and traj.num_tool_errors == 1
    assert len(traj.turns[0]["output"]) <= 256 + len("...(truncated)...")


def test_timeout(tok, sb):
    traj, _, _ = run(tok, sb, [call("while True:\n    pass"), "\\boxed{1}<|im_end|>"])
    assert traj.turns[0]["error_kind"] == "timeout"


def test_malformed_call_is_a_tool_error(tok, sb):
    bad = "Let me compute.\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(1)\"\n</tool_call>"
    traj, _, _ = run(tok, sb, [bad, "\\boxed{1}<|im_end|>"])
    assert traj.turns[0]["error_kind"] == "malformed"
    assert "invalid JSON" in traj.turns[0]["output"]
    assert "<tool_response>\nmalformed tool call: invalid JSON" in traj.text


def test_turn_cap(tok, sb):
    traj, _, _ = run(tok, sb, [call("print(1)"), call("print(2)"), call("print(3)")], max_turns=2)
    assert traj.finish_reason == "max_turns" and traj.num_tool_calls == 2


def test_tool_call_cap(tok, sb):
    traj, _, _ = run(tok, sb, [call("print(1)"), call("print(2)"), call("print(3)")], max_tool_calls=2)
    assert traj.finish_reason == "max_tool_calls" and traj.num_tool_calls == 2


def test_length_cap(tok, sb):
    traj, _, _ = run(tok, sb, [call("print(" + "1+" * 200 + "1)")], max_response_tokens=40)
    assert traj.finish_reason == "length" and traj.truncated
    assert len(traj.response_ids) <= 40


# --------------------------------------------------------------------------- SAAR

SAAR = config.Saar()


def test_error_fix_success_is_purified(tok, sb):
    reasoning = "Sum 0..9 with code.\n"
    bad = call("print(sum(range(10))", reasoning)
    fixed = call("print(sum(range(10)))", "I forgot a parenthesis.\n")
    turns = [bad, fixed, "\\boxed{45}<|im_end|>"]
    traj, eng, prompt = run(tok, sb, turns, saar=SAAR)
    assert traj.saar and [e["kind"] for e in traj.saar_events] == ["shallow"]
    assert traj.saar_events[0]["error_kind"] == "syntax"
    # the regeneration saw the failed turn and the error
    assert eng.inputs[1][:len(prompt) + len(ids(tok, bad))] == prompt + ids(tok, bad)
    assert "SyntaxError" in tok.decode(eng.inputs[1])
    # the final trajectory holds neither: it is the purified conversation, token for token
    purified_call = call("print(sum(range(10)))", reasoning)
    k = saar.split_turn(ids(tok, bad), tokenizer=tok, syntax=rollout.CallSyntax('hermes'))
    want = ids(tok, bad)[:k] + ids(tok, fixed)[saar.split_turn(ids(tok, fixed), tokenizer=tok, syntax=rollout.CallSyntax('hermes')):]
    assert tok.decode(want) == purified_call
    assert traj.response_ids == want + tool_ids(tok, "45\n") + ids(tok, turns[2])
    assert "SyntaxError" not in traj.text and "range(10))\"" not in traj.text
    assert [m for m, _ in segments(traj)] == [1, 0, 1]
    assert len(traj.loss_mask) == len(traj.response_ids) == len(traj.logprobs)
    assert traj.num_tool_calls == 2 and traj.num_tool_errors == 1
    assert traj.num_first_calls == 1 and traj.num_first_errors == 1  # the re-execution is SAAR's, not a first try
    assert len(traj.turns) == 1 and traj.turns[0]["ok"]


def test_each_purification_is_on_record_with_what_it_removed_and_where_its_replacement_sits(tok, sb):
    """A reader of the dumped rollouts sees what SAAR removed (the failed turn, the error the model saw), what it
    regenerated and spliced in, and where that sits in the purified text; and which characters were trained on."""
    reasoning = "Sum 0..9 with code.\n"
    bad = call("print(sum(range(10))", reasoning)
    fixed = call("print(sum(range(10)))", "I forgot a parenthesis.\n")
    traj, eng, _ = run(tok, sb, [bad, fixed, "\\boxed{45}<|im_end|>"], saar=SAAR)
    e = traj.saar_events[0]
    assert (e["kind"], e["gamma"], e["failed"], e["regenerated"]) == ("shallow", 0.5, bad, fixed)
    assert "SyntaxError" in e["error"] and e["error"] in tok.decode(eng.inputs[1])  # what the model saw
    assert e["replacement"] == call("print(sum(range(10)))", reasoning)  # old reasoning, new call
    assert traj.text[e["at"][0]:e["at"][1]] == e["replacement"] and e["at"][0] == 0
    assert traj.text == tok.decode(traj.response_ids)
    masked = "".join(traj.text[a:b] for a, b in traj.masked)  # exactly the tool turn
    assert masked == tok.decode(tool_ids(tok, "45\n")) and len(traj.masked) == 1
    # a deep purification, and a given-up one whose failed attempt and error stay in the text
    deep = call("import math\nprint(math.factorial(4))", "A whole other way, from scratch.\n")
    traj, _, _ = run(tok, sb, [call("print(undefined_x)"), deep, "\\boxed{24}<|im_end|>"], saar=config.Saar(gamma=0.99))
    e = traj.saar_events[0]
    assert e["kind"] == "deep" and e["replacement"] == deep and traj.text[e["at"][0]:e["at"][1]] == deep
    fails = [call(f"print(undefined_{i})") for i in range(4)]
    traj, _, _ = run(tok, sb, fails + ["\\boxed{0}<|im_end|>"], saar=SAAR)
    gave_up = traj.saar_events[-1]
    assert gave_up["kind"] == "given_up" and gave_up["failed"] == fails[3] and "at" not in gave_up
    # the three shallow retries spliced at one place: only the last one's text is still there
    assert [e.get("superseded", False) for e in traj.saar_events[:3]] == [True, True, False]
    last = traj.saar_events[2]
    assert traj.text[last["at"][0]:last["at"][1]] == last["replacement"]
    assert "undefined_3" in gave_up["error"] and gave_up["error"] in traj.text
    assert [traj.text[a:b] for a, b in traj.masked] == [tok.decode(traj.response_ids[i:j]) for i, j in
                                                         mask_runs(traj)]


def mask_runs(traj):
    """[start, end) token ranges of the loss-mask-0 runs."""
    runs, i = [], 0
    for m, part in segments(traj):
        if m == 0:
            runs.append((i, i + len(part)))
        i += len(part)
    return runs


def test_three_failures_give_up_and_keep_error(tok, sb):
    fails = [call(f"print(undefined_{i})") for i in range(4)]
    turns = fails + [call("print(also_undefined)"), "\\boxed{0}<|im_end|>"]
    traj, eng, _ = run(tok, sb, turns, saar=SAAR)
    kinds = [e["kind"] for e in traj.saar_events]
    assert kinds == ["shallow", "shallow", "shallow", "given_up"]
    assert "NameError" in traj.text and "undefined_3" in traj.text
    # the give-up note follows the last error and counts SAAR's regenerations of the turn, as the official
    # note does: 3 retries (4 failed attempts in all)
    note = saar.GIVE_UP_NOTE.format(n=3)
    assert "retried 3 times" in note and f"undefined_3' is not defined{note}\n</tool_response>" in traj.text
    # SAAR is off afterwards: the next failure stays in context, unrolled
    assert "also_undefined" in traj.text and traj.text.count("NameError") == 2
    assert traj.num_tool_calls == 5 and not traj.saar_events[-1]["similarity"]
    assert traj.num_first_calls == 2 and traj.num_first_errors == 2  # the first call and the one after giving up
    assert [m for m, _ in segments(traj)] == [1, 0, 1, 0, 1]


def test_regenerated_answer_keeps_error_and_turns_saar_off(tok, sb):
    turns = [call("print(1/0)"), "I'll just answer: \\boxed{7}<|im_end|>"]
    traj, _, _ = run(tok, sb, turns, saar=SAAR)
    assert [e["kind"] for e in traj.saar_events] == ["answered"]
    assert "ZeroDivisionError" in traj.text and traj.text.endswith("\\boxed{7}<|im_end|>")
    assert traj.finish_reason == "answer"
    assert [m for m, _ in segments(traj)] == [1, 0, 1]


def test_rollback_p0_is_bit_identical_to_plain(tok, sb):
    turns = [call("print(1/0)"), call("print(1/1)"), "\\boxed{1}<|im_end|>"]
    plain, _, _ = run(tok, sb, list(turns))
    off, _, _ = run(tok, sb, list(turns), saar=config.Saar(rollback_p=0.0))
    assert not off.saar and off.saar_events == []
    for f in ("response_ids", "loss_mask", "logprobs", "finish_reason", "turns", "text"):
        assert getattr(off, f) == getattr(plain, f), f


def test_stateful_session_rollback_restores_state(tok, sb):
    turns = [call("x = 5\nprint(x)"), call("x = 100\nprint(1/0)"), call("print(x)", "Retry.\n"),
             "\\boxed{5}<|im_end|>"]
    traj, _, _ = run(tok, sb, turns, saar=SAAR, stateful=True)
    outputs = [t["output"] for t in traj.turns]
    assert outputs == ["5\n", "5\n"]  # the failed cell's assignment was rolled back with it
    assert "ZeroDivisionError" not in traj.text


def test_saar_marks_the_tokens_it_splices_in(tok, sb):
    """Trajectory.spliced is 1 exactly on the tokens sampled with an error in context that the final sequence
    lacks: a shallow fix's new call (its reasoning was sampled on the clean context), a deep fix's whole turn."""
    bad, fixed = call("print(sum(range(10))"), call("print(sum(range(10)))", "fix\n")
    traj, _, _ = run(tok, sb, [bad, fixed, "\\boxed{45}<|im_end|>"], saar=SAAR)
    assert [e["kind"] for e in traj.saar_events] == ["shallow"]
    first = ids(tok, bad)
    k = saar.split_turn(first, tokenizer=tok, syntax=rollout.CallSyntax("hermes"))
    new_call = ids(tok, fixed)[saar.split_turn(ids(tok, fixed), tokenizer=tok, syntax=rollout.CallSyntax("hermes")):]
    assert traj.response_ids[:k + len(new_call)] == first[:k] + new_call
    assert traj.spliced[:k + len(new_call)] == [0] * k + [1] * len(new_call)
    assert sum(traj.spliced) == len(new_call) and len(traj.spliced) == len(traj.response_ids)
    deep = call("import math\nprint(math.factorial(4))", "A whole other way, from scratch.\n")
    traj, _, _ = run(tok, sb, [call("print(undefined_x)"), deep, "\\boxed{24}<|im_end|>"],
                     saar=config.Saar(gamma=0.99))  # the calls share their JSON wrapper: deep only above it
    assert [e["kind"] for e in traj.saar_events] == ["deep"]
    n = len(ids(tok, deep))
    assert traj.spliced[:n] == [1] * n and sum(traj.spliced) == n
    plain, _, _ = run(tok, sb, [call("print(undefined_x)"), deep, "\\boxed{24}<|im_end|>"])  # SAAR off: none
    assert set(plain.spliced) == {0} and len(plain.spliced) == len(plain.response_ids)


def test_gated_retries_stay_within_the_response_budget(tok, sb):
    # The gate keeps each error and lets the regenerated turn follow it. When that turn fails too,
    # its retry must be capped by what is left after everything already in the sequence.
    cfg = config.Saar(is_mode="gate", is_gate=2.0)  # the scripted ratio is 1: always gated
    bad = call("print(undefined_a)")
    long_answer = "word " * 400 + "\\boxed{42}<|im_end|>"
    traj, eng, prompt = run(tok, sb, [bad, bad, long_answer], saar=cfg, max_response_tokens=200)
    assert [e["kind"] for e in traj.saar_events] == ["gated", "answered"]
    assert len(traj.response_ids) <= 200 and traj.truncated
    for inp, out in zip(eng.inputs, eng.outputs):
        assert len(inp) - len(prompt) + len(out) <= 200


def test_importance_correction_refuses_a_temperature_it_cannot_match(tok, sb):
    cfg = config.Saar(is_mode="gate")
    with pytest.raises(ValueError, match="needs temperature 1.0, got 0.7"):
        run(tok, sb, [call("print(1)")], saar=cfg, temperature=0.7)


@pytest.mark.parametrize("echo,shown", [(False, "[no output]"), (True, "42\n")])
def test_tool_echo_shows_a_final_expression(tok, sb, echo, shown):
    """--tool-echo: a stateless call ending in a bare expression shows its value (the official tool's wrapper)."""
    turns = [call("x = 6 * 7\nx"), "So \\boxed{42}.<|im_end|>"]
    traj, _, _ = run(tok, sb, turns, tool_echo=echo)
    assert traj.turns[0]["ok"] and traj.turns[0]["output"] == shown


def test_repair_json_reads_a_call_the_strict_parser_rejects(tok, sb):
    """A literal newline inside the JSON code string: strict JSON fails the call; --repair-json (the official
    parser, json_repair) runs it."""
    turn = 'Let me compute.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "x = 6*7\nprint(x)"}}\n</tool_call>'
    assert rollout.parse_call(turn, "hermes").error.startswith("malformed tool call: invalid JSON")
    assert rollout.parse_call(turn, "hermes", repair=True).code == "x = 6*7\nprint(x)"
    assert rollout.parse_call(turn.replace("code_interpreter", "shell"), "hermes", repair=True).error.startswith(
        "malformed tool call: unknown tool")
    traj, _, _ = run(tok, sb, [turn, "So \\boxed{42}.<|im_end|>"], repair_json=True)
    assert traj.turns[0]["ok"] and traj.turns[0]["output"] == "42\n"


def test_tool_call_cap_that_only_stops_saar(tok, sb):
    """--no-tool-cap-ends (the official code): past the cap the trajectory goes on and calls still run, but a
    failed call is no longer purified."""
    turns = [call("print(1)"), call("print(2)"), call("print(undefined_b)"), call("print(4)"), "\\boxed{4}<|im_end|>"]
    traj, _, _ = run(tok, sb, turns, max_tool_calls=2, tool_cap_ends=False, saar=SAAR)
    assert traj.finish_reason == "answer" and traj.num_tool_calls == 4
    assert [t["ok"] for t in traj.turns] == [True, True, False, True]  # the failure stays in the sequence
    assert [e["kind"] for e in traj.saar_events] == ["given_up"] and traj.saar_events[0]["retry"] == 0


def test_saar_never_appends_an_error_past_the_response_budget(tok, sb):
    """A failed call that leaves no room for its error turn: SAAR gives up instead of appending it, and the
    response stays within max_response_tokens (it once came out 57 tokens long on a budget of 34)."""
    bad = call("print(undefined_c)")
    budget = len(ids(tok, bad)) + 4  # the error turn alone is longer than what is left
    traj, eng, prompt = run(tok, sb, [bad, "\\boxed{1}<|im_end|>"], saar=SAAR,
                            max_response_tokens=budget)
    assert len(traj.response_ids) <= budget and traj.finish_reason == "length" and traj.truncated
    assert [(e["kind"], e.get("reason")) for e in traj.saar_events] == [("given_up", "budget")]
    assert len(eng.inputs) == 1  # nothing was generated after the failed call


@pytest.mark.parametrize("runs", [True, False])
def test_a_call_in_the_last_allowed_turn(tok, sb, runs):
    """--no-last-turn-calls (the official loop): the last allowed turn ends the trajectory with its call unrun."""
    traj, _, _ = run(tok, sb, [call("print(1)"), call("print(2)")], max_turns=2, last_turn_calls=runs)
    assert traj.finish_reason == "max_turns" and traj.num_tool_calls == (2 if runs else 1)


@pytest.mark.parametrize("max_retries,n", [(2, 2), (1, None)])
def test_the_give_up_note_counts_the_retries(tok, sb, max_retries, n):
    """The note's count is the turn's regenerations (the official retry count, no +1); after fewer than 2 there
    is no note, as in the official code."""
    fails = [call(f"print(undefined_{i})") for i in range(max_retries + 1)]
    traj, _, _ = run(tok, sb, fails + ["\\boxed{0}<|im_end|>"], saar=config.Saar(max_retries=max_retries))
    assert [e["kind"] for e in traj.saar_events][-1] == "given_up" and traj.saar_events[-1]["retry"] == max_retries
    if n is None:
        assert "Note:" not in traj.text
    else:
        assert traj.text.count("Note:") == 1 and saar.GIVE_UP_NOTE.format(n=n) in traj.text


def test_tool_header_is_the_official_layout(tok, sb):
    """--tool-header: a success line and the labelled stdout; a failure line, the reason as the official code
    server names it ("" for an exception, worker_timeout for a timeout) and the error as stderr."""
    turns = [call("print(6*7)"), call("print('a')\nx = 1/0"), call("while True:\n    pass"),
             "\\boxed{42}<|im_end|>"]
    traj, _, _ = run(tok, sb, turns, tool_header=True)
    assert [t["output"] for t in traj.turns] == [
        "Tool call success\nstdout: 42\n",
        "Tool call failure\nreason: \nstdout: a\n\nstderr: Traceback (most recent call last):\n"
        '  File "<cell>", line 2, in <module>\n    x = 1/0\nZeroDivisionError: division by zero',
        "Tool call failure\nreason: worker_timeout\n"
        "stderr: TimeoutError: the code ran longer than the 2 s time limit and was stopped"]
    assert "<tool_response>\nTool call success\nstdout: 42\n\n</tool_response>" in traj.text
    quiet, _, _ = run(tok, sb, [call("x = 1"), "\\boxed{1}<|im_end|>"], tool_header=True)
    assert quiet.turns[0]["output"] == "Tool call success"  # no "[no output]": the header says it ran
    plain, _, _ = run(tok, sb, [call("print(6*7)"), "\\boxed{42}<|im_end|>"])
    assert plain.turns[0]["output"] == "42\n"  # off by default


def test_tool_header_on_a_malformed_call_and_in_saar_feedback(tok, sb):
    bad = "Let me compute.\n<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"code\": \"ls\"}}\n</tool_call>"
    traj, eng, _ = run(tok, sb, [bad, call("print(1)"), "\\boxed{1}<|im_end|>"], tool_header=True,
                       saar=SAAR)
    # the regeneration saw the headed error; the purified trajectory keeps only the headed success
    assert ("<tool_response>\nTool call failure\nreason: \nstderr: malformed tool call: unknown tool 'shell'"
            in tok.decode(eng.inputs[1]))
    assert [t["output"] for t in traj.turns] == ["Tool call success\nstdout: 1\n"]


def test_rollout_and_grade_samples_each_problem_n_times_then_grades(tok, sb):
    """The one "roll out, then grade": n samples per problem, problem-major, each prompted from its own
    problem, seeds and metas per trajectory, grade(problem, trajectory) on each, the phases timed."""
    from data.problems import Problem
    probs = [Problem(id="a", problem="What is 6*7?", answer="42", task="math"),
             Problem(id="b", problem="What is 2+3?", answer="5", task="math")]
    eng = ScriptedEngine(tok, ["\\boxed{42}<|im_end|>", "\\boxed{41}<|im_end|>", "\\boxed{5}<|im_end|>",
                               "\\boxed{5}<|im_end|>"])
    cfg = PAPER
    times = {"rollout": 1.0}
    trajs, grades = asyncio.run(rollout.rollout_and_grade(
        eng, sb, tok, probs, cfg, grade=lambda p, t: (p.id, f"\\boxed{{{p.answer}}}" in t.final_text(tok)), n=2,
        seeds=[10, 11, 12, 13], metas=[dict(k=k) for k in range(4)], times=times))
    assert grades == [("a", True), ("a", False), ("b", True), ("b", True)]
    assert [t.prompt_ids for t in trajs] == [rollout.prompt_ids(tok, p.problem, "math", "hermes")
                                             for p in probs for _ in range(2)]
    assert [t.meta["k"] for t in trajs] == [0, 1, 2, 3]
    assert times["rollout"] > 1.0 and times["reward"] >= 0.0
    eng = ScriptedEngine(tok, ["\\boxed{42}<|im_end|>", "\\boxed{5}<|im_end|>"])
    _, threaded = asyncio.run(rollout.rollout_and_grade(eng, sb, tok, probs, cfg, grade=lambda p, t: p.id,
                                                        seeds=[1, 2], grade_workers=2))
    assert threaded == ["a", "b"]  # graded in threads, kept in order
