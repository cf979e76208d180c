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
import re
from fractions import Fraction
from typing import NamedTuple, get_args

import config
from machinery import lcb, mathverify

# ---------------------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _box_content(text: str, start: int) -> str | None:
    """Content of the box whose command ends at `start`; None if its braces never close."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        depth, j = 0, i
        while j < len(text):
            c = text[j]
            if c == "\\":  # \{ and \} are literal braces: skip the escaped character
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1:j]
            j += 1
        return None
    # `\boxed 5` (no braces): the next token, up to whitespace or a closing `$`
    m = re.match(r"[^\s$]+", text[i:])
    return m.group(0).rstrip(".,;") if m else None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\boxed X` in text, braces balanced.

    The last box is the model's final word (it overrides earlier boxes, e.g. a late correction).
    Empty boxes are skipped (a restated instruction "put it in \\boxed{}" is not an answer); a last box
    whose braces never close (a truncated response) gives None rather than an older box.
    """
    if not isinstance(text, str):
        return None
    for m in reversed(list(_BOX_RE.finditer(text))):
        content = _box_content(text, m.end())
        if content is None:
            return None
        content = content.strip()
        if not content:
            continue
        inner = extract_boxed(content) if _BOX_RE.match(content) else None  # \boxed{\boxed{5}}
        return inner if inner else content
    return None


# ---------------------------------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------------------------------

_DEGREE_RE = re.compile(r"(\^\s*\{?\s*\\circ\s*\}?|°|\\degree)$")
_FRAC_RE = re.compile(r"^([+-]?)\\[dt]?frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))$")


def _as_number(s: str) -> Fraction | None:
    """Exact value of a plain numeric answer ("033", "1,000", "0.5", "\\frac{3}{4}", "336^\\circ"), else None."""
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\[!,;: ]|~", "", s)  # LaTeX spacing, also used as a thousands separator
    s = s.replace("{,}", ",")
    s = _DEGREE_RE.sub("", s).strip()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)", s):
        return Fraction(s[:-1] if s.endswith(".") else s)
    m = re.fullmatch(r"([+-]?\d+)\s*/\s*(\d+)", s)
    if m:
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    m = _FRAC_RE.match(s)
    if m:
        num, den = int(m.group(2) or m.group(3)), int(m.group(4) or m.group(5))
        if den == 0:
            return None
        return (-1 if m.group(1) == "-" else 1) * Fraction(num, den)
    return None


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").strip("$")


def answer_key(pred: str) -> str:
    """One key for equivalent plain answers, so that they vote together (eval.py's maj@n): "033" and "33"
    share one, as do "0.5" and "\\frac12"."""
    v = _as_number(pred)
    return str(v) if v is not None else _squash(pred)


def math_equal(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Is the extracted answer `pred` equivalent to `gold`? Cheap exact checks first, then math-verify."""
    if _squash(pred) == _squash(gold):
        return True
    p, g = _as_number(pred), _as_number(gold)
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
    pred = extract_boxed(response)
    if pred is None:
        return False
    gold = str(gold)
    gold = extract_boxed(gold) or gold
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
        content = _box_content(rest, 0)
    elif rest.startswith(" "):  # `\\boxed 5`: up to the next `$`
        content = rest[1:].split("$")[0]
    else:
        return False
    return content is not None and content == str(gold)


MATH_GRADERS = get_args(config.MathGrader)


# ---------------------------------------------------------------------------------------------------
# GPQA (multiple choice)
# ---------------------------------------------------------------------------------------------------

_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*\{([^{}]*)\}")
_BOXED_LETTER_RE = re.compile(r"(?:(?:option|choice)\s*)?[\(\[]?\s*([A-Da-d])\s*[\)\]]?(?![A-Za-z])", re.IGNORECASE)
_ANSWER_LINE_RE = re.compile(
    r"answer\s*(?:is)?\s*[:：]?\s*\**\s*(?:option|choice)?\s*[\(\[]?\s*([A-D])(?![A-Za-z])", re.IGNORECASE)


def extract_choice(text: str) -> str | None:
    """The option letter (A-D) the response chose: the letter in the last \\boxed{} (\\text{} and
    parentheses stripped), else the last `Answer: X` (upper-case X, so "answer is a bit" is not A)."""
    if not isinstance(text, str):
        return None
    boxed = extract_boxed(text)
    if boxed is not None:
        s = boxed
        for _ in range(3):  # nested wrappers, e.g. \text{\textbf{B}}
            s = _TEXT_WRAP_RE.sub(r"\1", s)
        m = _BOXED_LETTER_RE.match(s.strip().strip("$").strip())
        if m:
            return m.group(1).upper()
    hits = [m.group(1) for m in _ANSWER_LINE_RE.finditer(text) if m.group(1).isupper()]
    return hits[-1] if hits else None


def grade_gpqa(response: str, gold_letter: str) -> bool:
    """True iff the chosen letter equals the gold letter (after the loader's shuffle)."""
    if str(gold_letter).strip().upper() not in ("A", "B", "C", "D"):
        raise ValueError(f"grade_gpqa needs a gold letter A-D, got {gold_letter!r}")
    choice = extract_choice(response)
    return choice is not None and choice == str(gold_letter).strip().upper()


# ---------------------------------------------------------------------------------------------------
# Code
# ---------------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The final fenced python block of text (```python / ```py / ```python3), else the final
    unlabeled block; None if there is none. An unclosed final fence (a truncated response) is ignored."""
    if not isinstance(text, str):
        return None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text)]
    for wanted in (("python", "py", "python3"), ("",)):
        for lang, body in reversed(blocks):
            if lang in wanted and body.strip():
                return body
    return None


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
    return extract_code(response)


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
            return Judged(extract_boxed(response), grade_math_strict_box(response, answer))
        if math_grader != "math-verify":
            raise ValueError(f"unknown math_grader {math_grader!r}; choose one of {MATH_GRADERS}")
        return Judged(extract_boxed(response), grade_math(response, answer))
    if problem_task == "gpqa":
        return Judged(extract_choice(response), grade_gpqa(response, answer))
    if problem_task == "code":
        return Judged(graded_code(response, tests, lcb_grader),
                      grade_code(response, tests, sandbox=sandbox, per_test_s=per_test_s, lcb_grader=lcb_grader))
    raise ValueError(f"unknown task {problem_task!r}: expected 'math', 'gpqa' or 'code'")


def grade(problem_task: str, response: str, **kw) -> bool:
    """Right or wrong (the training reward's +1/-1): judge's verdict; kw: judge's settings."""
    return judge(problem_task, response, **kw).correct
