"""Graders shared by the training reward (train.py) and the benchmarks (eval.py).

Paper: CLEANER trains with a binary outcome reward (+1 correct, -1 wrong) on math and code problems
and reports AIME24/25, GPQA-Diamond and LiveCodeBench-v6 accuracy. This module decides "correct", and
`judge` is the one dispatch by task that the training reward (`grade`) and eval.py both use:

- math: the LAST balanced `\\boxed{...}` (or `\\fbox{...}`) of the response, compared with the gold
  answer by math-verify, `verify(parse("$gold$"), parse("$pred$"))`, gold first. Exact/numeric
  matches are settled here without math-verify (training grades hundreds of responses a step).
  Departures from the official code (verl's `math_dapo`, a string normaliser): math-verify decides
  symbolic equality, in worker processes with a per-comparison timeout (machinery/mathverify.py). A
  timed-out comparison counts as wrong.
  `--math-grader strict-box` is the official training reward instead (grade_math_strict_box).
- gpqa: the letter in the last `\\boxed{}` (`\\text{}` stripped), else the last `Answer: X` line.
- code: the final fenced python block (with `--lcb-grader official`, on LiveCodeBench-shaped tests,
  LiveCodeBench's own extraction), run in the sandbox against every test; a problem passes only if all
  of them pass. The test shapes, the two LiveCodeBench graders, the LeetCode checks, and why nothing the
  candidate does can fake a verdict: machinery/lcb.py, behind one call (`lcb.passes`).
"""

from __future__ import annotations

import atexit
from typing import NamedTuple, get_args

import config
from machinery import answers, lcb, mathverify
from machinery.answers import answer_key, extract_boxed, extract_choice, extract_code  # noqa: F401  (reward.extract_boxed, ...)

# ---------------------------------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------------------------------

def math_equal(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Is the extracted answer `pred` equivalent to `gold`? Cheap exact checks first, then math-verify."""
    if answers.squash(pred) == answers.squash(gold):
        return True
    p, g = answers.as_number(pred), answers.as_number(gold)
    if p is not None and g is not None:
        if p == g:
            return True
        if p.denominator == 1 and g.denominator == 1:
            return False  # two different integers (every AIME answer): no need to ask math-verify
    return mathverify.verify(gold, pred, timeout_s)


def grade_math(response: str, gold: str, timeout_s: float = 5.0) -> bool:
    """True iff the last boxed answer of `response` equals `gold` (see math_equal)."""
    if gold is None:
        raise ValueError("grade_math needs a gold answer, got None")
    pred = answers.extract_boxed(response)
    if pred is None:
        return False
    gold = str(gold)
    gold = answers.extract_boxed(gold) or gold
    return math_equal(pred, gold, timeout_s=timeout_s)


def grade_math_strict_box(response: str, gold: str) -> bool:
    """The official training reward's math check (veRL's math_dapo with strict box verification): the last
    `\\boxed` within the response's last 100 characters, its content taken as it is, must equal the gold
    answer as a string. Stricter than grade_math: `\\boxed{42.0}` or `\\boxed{ 42}` fail for 42, and so does an
    answer boxed earlier than the last 100 characters."""
    if gold is None:
        raise ValueError("grade_math_strict_box needs a gold answer, got None")
    tail = response[-100:]
    at = tail.rfind("\\boxed")
    if at < 0:
        return False
    rest = tail[at + len("\\boxed"):]
    if rest.startswith("{"):
        content = answers.box_content(rest, 0)
    elif rest.startswith(" "):  # `\\boxed 5`: up to the next `$`
        content = rest[1:].split("$")[0]
    else:
        return False
    return content is not None and content == str(gold)


MATH_GRADERS = get_args(config.MathGrader)


# ---------------------------------------------------------------------------------------------------
# GPQA (multiple choice)
# ---------------------------------------------------------------------------------------------------

def grade_gpqa(response: str, gold_letter: str) -> bool:
    """True iff the chosen letter equals the gold letter (after the loader's shuffle)."""
    if str(gold_letter).strip().upper() not in ("A", "B", "C", "D"):
        raise ValueError(f"grade_gpqa needs a gold letter A-D, got {gold_letter!r}")
    choice = answers.extract_choice(response)
    return choice is not None and choice == str(gold_letter).strip().upper()


# ---------------------------------------------------------------------------------------------------
# Code
# ---------------------------------------------------------------------------------------------------

def _get_sandbox(sandbox):
    """The caller's sandbox, else one shared default (created on first use)."""
    global _DEFAULT_SANDBOX
    if sandbox is not None:
        return sandbox
    if _DEFAULT_SANDBOX is None:
        from sandbox import Sandbox
        _DEFAULT_SANDBOX = Sandbox()
        atexit.register(_DEFAULT_SANDBOX.close)
    return _DEFAULT_SANDBOX


_DEFAULT_SANDBOX = None


LCB_GRADERS = get_args(config.LcbGrader)


def graded_code(response: str, tests, lcb_grader: str = "strict") -> str | None:
    """The code that grade_code runs for these tests: LiveCodeBench's own extraction (lcb.extract_code_lcb) for
    LiveCodeBench-shaped tests under lcb_grader="official", else the final python block; None when there is
    none. eval.py records it as the prediction."""
    if lcb_grader == "official" and not lcb.is_check(tests):
        return lcb.extract_code_lcb(response) or None
    return answers.extract_code(response)


def grade_code(response: str, tests, sandbox=None, per_test_s: float = 6.0, total_s: float | None = None,
               lcb_grader: str = "strict") -> bool:
    """True iff the response's code passes every test (lcb.passes; the shapes: machinery/lcb.py). lcb_grader
    picks how LiveCodeBench-shaped tests (stdin pairs, call cases) are graded: "strict" (ours: the final python
    block, each test in a fresh process) or "official" (LiveCodeBench's harness); LeetCode check tests are
    graded one way. A malformed `tests` value raises ValueError; a response without code is simply wrong."""
    if lcb_grader not in LCB_GRADERS:
        raise ValueError(f"unknown lcb_grader {lcb_grader!r}; choose one of {LCB_GRADERS}")
    code = graded_code(response, tests, lcb_grader)
    if sandbox is None:
        lcb.shape(tests)  # malformed tests raise before the default sandbox starts
    return lcb.passes(code, tests, _get_sandbox(sandbox), per_test_s, total_s, official=lcb_grader == "official")


# ---------------------------------------------------------------------------------------------------
# One entry point for training and eval
# ---------------------------------------------------------------------------------------------------

def training_reward(correct: bool, length: int, max_len: int, g) -> float:
    """The training reward, all of it: the paper's +1/-1 on the outcome, plus DAPO's soft overlong penalty over the
    last g.overlong_buffer tokens of the max_len budget (g: a config.Grpo). train.sample_groups calls it."""
    return (1.0 if correct else -1.0) + overlong_penalty(length, max_len, g.overlong_buffer, g.overlong_penalty)


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 until max_len - buffer, then a linear ramp to -factor."""
    if buffer <= 0:
        return 0.0
    return min(0.0, -(length - (max_len - buffer)) / buffer * factor)


class Judged(NamedTuple):
    """A graded response: what the grader read of it (the last boxed answer, the letter, or the code it ran;
    None: nothing), and whether it is right."""
    pred: str | None
    correct: bool


def judge(problem_task: str, response: str, answer=None, tests=None, sandbox=None, math_grader: str = "math-verify",
          lcb_grader: str = "strict", per_test_s: float = 6.0) -> Judged:
    """Grade one final response: the one dispatch by task. problem_task: "math" | "gpqa" | "code".
    math_grader: math-verify (ours) or strict-box (the official training reward). lcb_grader: strict (ours)
    or official (LiveCodeBench's harness) for LiveCodeBench-shaped code tests (grade_code); per_test_s: their
    time limit per test."""
    if problem_task == "math":
        if math_grader == "strict-box":
            return Judged(answers.extract_boxed(response), grade_math_strict_box(response, answer))
        if math_grader != "math-verify":
            raise ValueError(f"unknown math_grader {math_grader!r}; choose one of {MATH_GRADERS}")
        return Judged(answers.extract_boxed(response), grade_math(response, answer))
    if problem_task == "gpqa":
        return Judged(answers.extract_choice(response), grade_gpqa(response, answer))
    if problem_task == "code":
        return Judged(graded_code(response, tests, lcb_grader),
                      grade_code(response, tests, sandbox=sandbox, per_test_s=per_test_s, lcb_grader=lcb_grader))
    raise ValueError(f"unknown task {problem_task!r}: expected 'math', 'gpqa' or 'code'")


def grade(problem_task: str, response: str, **kw) -> bool:
    """Right or wrong (the training reward's +1/-1): judge's verdict; kw: judge's settings."""
    return judge(problem_task, response, **kw).correct
