"""Graders shared by the training reward (train.py) and the benchmarks (eval.py).

Paper: CLEANER trains with a binary outcome reward (+1 correct, -1 wrong) on math and code problems
and reports AIME24/25, GPQA-Diamond and LiveCodeBench-v6 accuracy. This module decides "correct":

- math: the LAST balanced `\\boxed{...}` (or `\\fbox{...}`) of the response, compared with the gold
  answer by math-verify, `verify(parse("$gold$"), parse("$pred$"))`, gold first. Exact/numeric
  matches are settled here without math-verify (training grades hundreds of responses a step).
  Departures from the official code (verl's `math_dapo`, a string normaliser): math-verify decides
  symbolic equality, and it runs in a persistent worker process with a per-comparison timeout, because
  its own timeouts use signal.alarm, which breaks in threads. A timed-out comparison counts as wrong.
- gpqa: the letter in the last `\\boxed{}` (`\\text{}` stripped), else the last `Answer: X` line.
- code: the final fenced python block, run in the sandbox (sandbox.py) against every test; a problem
  passes only if all tests pass. Three test shapes (data/problems.py documents the first two):
    {"functional": src}            LeetCode-style `check(candidate)` asserts (leetcode_train).
    [{"input", "output"}, ...]     stdin/stdout pairs (codeforces, LiveCodeBench stdin problems),
                                   compared as LiveCodeBench does: stripped lines, then tokens as Decimal.
    {"call": name, "cases": [...]} LiveCodeBench functional problems: `Solution().<name>(*args)` with
                                   JSON args (one per input line); the result is compared JSON-decoded,
                                   tuples as lists.
  Per-test timeout and a total limit follow LiveCodeBench (6 s a test, min((6+1)*tests+5, 300) s in
  all). Departure: each test is its own sandbox run (the official harness execs all tests in one
  process under signal.alarm), so a crash or hang in one test cannot touch the next.

Reward hacking: the candidate runs in the same program as the asserts, so the grader also (a) requires
a per-run random marker printed after the last assert (an early `exit(0)` fails), (b) accepts only
built-in value types and the prelude's ListNode/TreeNode as return values (an object whose __eq__
always says True fails), and (c) redefines the list/tree helpers after the candidate code. This raises
the bar; it is not a proof. The sandbox is what protects the machine.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import secrets
import select
import subprocess
import sys
import threading
import time
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent

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


class _MathVerifyWorker:
    """One persistent `python` child that runs math-verify; a comparison that outlives its timeout
    kills the child (a fresh one starts on the next call). One request at a time."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def _start(self):
        code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
                "import reward; reward._math_worker_main()")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buf = b""
        if self._read_line(timeout_s=300.0) != b"ready":  # importing sympy is slow on a cold cache
            self.close()
            raise RuntimeError("reward.py: the math-verify worker failed to start "
                               "(is math-verify installed? `pip install math-verify==0.9.0`)")

    def _read_line(self, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.strip()

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def verify(self, gold: str, pred: str, timeout_s: float) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return False
        line = self._read_line(timeout_s)
        if line is None:
            self.close()
            return False
        return line == b"1"


def _math_worker_main():
    """Loop of the worker child: one JSON request a line in, "1" or "0" a line out."""
    import functools
    import logging
    logging.disable(logging.WARNING)  # math-verify warns that its timeouts are off: we bound time outside
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # nothing math-verify prints may corrupt the protocol
    from math_verify import parse, verify

    @functools.lru_cache(maxsize=4096)  # a GRPO group shares its gold, and samples often agree
    def parsed(s):
        return parse(f"${s}$", parsing_timeout=None)

    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            ok = bool(verify(parsed(req["gold"]), parsed(req["pred"]), timeout_seconds=None))
        except Exception:
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


# Idle workers; callers in several threads each take one, so grading scales with threads up to
# _MAX_WORKERS children (each holds its own sympy, ~150 MB).
_MAX_WORKERS = max(1, min(4, os.cpu_count() or 1))
_IDLE: "queue.LifoQueue[_MathVerifyWorker]" = queue.LifoQueue()
_ALL_WORKERS: list[_MathVerifyWorker] = []
_POOL_LOCK = threading.Lock()


def _math_verify(gold: str, pred: str, timeout_s: float) -> bool:
    with _POOL_LOCK:
        if _IDLE.empty() and len(_ALL_WORKERS) < _MAX_WORKERS:
            _ALL_WORKERS.append(_MathVerifyWorker())
            _IDLE.put(_ALL_WORKERS[-1])
    worker = _IDLE.get()
    try:
        return worker.verify(gold, pred, timeout_s)
    finally:
        _IDLE.put(worker)


@atexit.register
def _close_workers():
    for w in _ALL_WORKERS:
        w.close()


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
    return _math_verify(gold, pred, timeout_s)


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


MATH_GRADERS = ("math-verify", "strict-box")


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


# What LeetCode-style graders put in front of a solution (LeetCodeDataset / rllm do the same), so a
# solution may use List, deque, inf, ... without importing them.
_IMPORTS = """\
from typing import *
from functools import *
from collections import *
from itertools import *
from heapq import *
from bisect import *
from string import *
from operator import *
from math import *
import math, datetime, collections, heapq, bisect, itertools, functools, string, re, sys, random
inf = float('inf')
sys.setrecursionlimit(100000)
"""

_NODE_HELPERS = """\
def list_node(values):
    head = cur = _LN()
    for v in values:
        cur.next = _LN(v)
        cur = cur.next
    return head.next

def tree_node(values):  # LeetCode's level order, None for a missing child
    if not values or values[0] is None:
        return None
    level, i = [_TN(values[0])], 1
    for node in level:  # grows while we walk it
        for side in ("left", "right"):
            if i < len(values) and values[i] is not None:
                child = _TN(values[i])
                setattr(node, side, child)
                level.append(child)
            i += 1
        if i >= len(values):
            break
    return level[0]

def is_same_list(a, b):
    while a is not None and b is not None:
        if a.val != b.val:
            return False
        a, b = a.next, b.next
    return a is None and b is None

def is_same_tree(a, b):
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x.val != y.val:
            return False
        stack += [(x.left, y.left), (x.right, y.right)]
    return True
"""

# LiveCodeBench's harness puts these star-imports (this order: builtins last restores pow, open, ...)
# in front of every solution; scoring must match, so we do the same.
_LCB_MODULES = ("string re datetime collections heapq bisect copy math random statistics itertools "
                "functools operator io sys json builtins typing").split()
_LCB_IMPORTS = "".join(f"from {m} import *\n" for m in _LCB_MODULES) + \
    "".join(f"import {m}\n" for m in _LCB_MODULES if m not in ("builtins", "typing")) + \
    "sys.setrecursionlimit(50000)\n"

LEETCODE_PRELUDE = _IMPORTS + """
class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next

class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right

_LN, _TN = ListNode, TreeNode
""" + _NODE_HELPERS

# Appended after the candidate: fresh helpers (the candidate may have rebound them) and a return-value
# check that only lets plain values through, so `==` inside the asserts is the built-in one.
_LEETCODE_GUARD = _NODE_HELPERS + """
_PLAIN = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset,
          Counter, defaultdict, OrderedDict, deque, _LN, _TN)

def _vet(x):
    stack, seen = [x], set()
    while stack:
        y = stack.pop()
        if type(y) not in _PLAIN:
            raise TypeError(f"returned a {type(y).__name__}; only plain values are graded")
        if id(y) in seen:
            continue
        seen.add(id(y))
        if type(y) in (_LN, _TN):
            stack += [y.val] + [c for c in ((y.next,) if type(y) is _LN else (y.left, y.right)) if c is not None]
        elif isinstance(y, dict):
            stack += list(y.keys()) + list(y.values())
        elif isinstance(y, (list, tuple, set, frozenset, deque)):
            stack += list(y)
    return x

def _guarded(fn):
    return lambda *a, **k: _vet(fn(*a, **k))
"""

_CHECK_CALL_RE = re.compile(r"^check\(\s*((?:Solution\(\)\.)?([A-Za-z_]\w*))\s*\)\s*$")


def leetcode_entry_point(check_src: str) -> str:
    """The candidate expression of a `check(candidate)` test source, e.g. "Solution().twoSum",
    read from its final `check(...)` line. Raises ValueError if the source has no such line."""
    lines = [ln.strip() for ln in check_src.strip().splitlines() if ln.strip()]
    m = _CHECK_CALL_RE.match(lines[-1]) if lines else None
    if not m or "def check(" not in check_src:
        raise ValueError("functional tests must define check(candidate) and end with a call like "
                         "`check(Solution().name)`; got a last line "
                         f"{(lines[-1] if lines else '')[:80]!r}")
    return m.group(1)


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


def run_check_tests(code: str, check_src: str, sandbox=None, timeout_s: float = 6.0) -> bool:
    """LeetCode-style: solution + `check(candidate)` asserts in one program; passes iff every assert
    holds and the program reaches its end (proved by a random marker printed last)."""
    entry = leetcode_entry_point(check_src)
    body = check_src.strip().splitlines()
    while body and not body[-1].strip():
        body.pop()
    body = "\n".join(body[:-1])  # the test source without its own final check(...) call
    marker = secrets.token_hex(16)
    program = "\n".join([LEETCODE_PRELUDE, code, _LEETCODE_GUARD, body,
                         f"check(_guarded({entry}))", f"print({marker!r})", ""])
    res = _get_sandbox(sandbox).run(program, timeout_s=timeout_s)
    return bool(res.ok) and res.stdout.rstrip().endswith(marker)


def _stripped_lines(s: str) -> list[str]:
    return [ln.strip() for ln in s.strip().split("\n")]


def _decimal_tokens(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def stdout_matches(got: str, expected: str) -> bool:
    """LiveCodeBench's stdout rule: same number of stripped lines; each line equal, or equal as a
    list of Decimal tokens (so "0.50" matches "0.5", but "0.5000001" does not)."""
    a, b = _stripped_lines(got), _stripped_lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        dx, dy = _decimal_tokens(x), _decimal_tokens(y)
        if dx is None or dy is None or dx != dy:
            return False
    return True


def _check_room(sb, expected: str) -> None:
    """A stdout longer than the sandbox keeps is cut in the middle and can never match: that is a
    grader misconfiguration, not a wrong answer, so say so instead of failing the response."""
    room = getattr(sb, "max_output_bytes", None)
    if room is not None and len(expected.encode()) + 1024 > room:
        raise ValueError(f"an expected output of {len(expected.encode()):,} bytes does not fit the sandbox's "
                         f"max_output_bytes={room:,}; grade with Sandbox(max_output_bytes=...) above the largest output")


def _budget(n_tests: int, per_test_s: float, total_s: float | None) -> float:
    # LiveCodeBench's global limit for a whole problem: (timeout + 1) per test + 5 s, at most 300 s
    return total_s if total_s is not None else min((per_test_s + 1) * n_tests + 5, 300.0)


def _run_cases(sb, program: str, cases: list[dict], per_test_s: float, total_s: float | None, passed) -> bool:
    """Run `program` once per case, case["input"] on stdin, within the problem's time budget; every
    result must satisfy passed(result, case)."""
    deadline = time.monotonic() + _budget(len(cases), per_test_s, total_s)
    for case in cases:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _check_room(sb, case["output"])
        if not passed(sb.run(program, stdin=case["input"], timeout_s=min(per_test_s, left)), case):
            return False
    return True


def run_stdio_tests(code: str, cases: list[dict], sandbox=None, per_test_s: float = 6.0,
                    total_s: float | None = None) -> bool:
    """Run `code` once per case with case["input"] on stdin; all outputs must match (stdout_matches)."""
    return _run_cases(_get_sandbox(sandbox), _LCB_IMPORTS + "\n" + code, cases, per_test_s, total_s,
                      lambda res, case: res.ok and stdout_matches(res.stdout, case["output"]))


_CALL_HARNESS = """\
import json as _json, sys as _sys
_ARGS = [_json.loads(_l) for _l in _sys.stdin.read().split("\\n") if _l.strip()]
{imports}
{code}

def _plain(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{{type(o).__name__}} is not JSON serializable")

_fn = Solution().{name} if "Solution" in globals() else {name}
_res = _fn(*_ARGS)
print({marker!r} + _json.dumps(_res, default=_plain))
"""


def run_call_tests(code: str, func_name: str, cases: list[dict], sandbox=None, per_test_s: float = 6.0,
                   total_s: float | None = None) -> bool:
    """LiveCodeBench functional problems: per case, call `Solution().<func_name>(*args)` (args: one
    JSON value per input line) and compare its JSON-encoded result with the JSON expected output.
    The result line carries a random marker the code cannot know, so it cannot print a fake one."""
    if not re.fullmatch(r"[A-Za-z_]\w*", func_name or ""):
        raise ValueError(f"functional tests need a Python identifier as func_name, got {func_name!r}")
    marker = secrets.token_hex(16)
    program = _CALL_HARNESS.format(imports=_LCB_IMPORTS, code=code, name=func_name, marker=marker)

    def passed(res, case) -> bool:
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(marker)]
        if not res.ok or not lines:
            return False
        try:
            return json.loads(lines[-1][len(marker):]) == json.loads(case["output"])
        except json.JSONDecodeError:
            return False

    return _run_cases(_get_sandbox(sandbox), program, cases, per_test_s, total_s, passed)


def grade_code(response: str, tests, sandbox=None, per_test_s: float = 6.0, total_s: float | None = None) -> bool:
    """True iff the final python block of `response` passes every test (shapes: module docstring).
    A malformed `tests` value raises ValueError; a response without code is simply wrong."""
    code = extract_code(response)
    if isinstance(tests, dict) and set(tests) == {"functional"}:
        leetcode_entry_point(tests["functional"])  # validate before deciding the response is wrong
        return code is not None and run_check_tests(code, tests["functional"], sandbox, timeout_s=per_test_s)
    if isinstance(tests, dict) and set(tests) == {"call", "cases"}:
        return code is not None and run_call_tests(code, tests["call"], tests["cases"], sandbox, per_test_s, total_s)
    if isinstance(tests, list) and tests and all(isinstance(t, dict) and {"input", "output"} <= set(t) for t in tests):
        return code is not None and run_stdio_tests(code, tests, sandbox, per_test_s, total_s)
    shape = sorted(tests) if isinstance(tests, dict) else type(tests).__name__
    raise ValueError(f"unknown code tests shape {shape}: expected {{'functional': src}}, "
                     "{'call': name, 'cases': [...]} or a non-empty list of {'input', 'output'}")


# ---------------------------------------------------------------------------------------------------
# One entry point for training and eval
# ---------------------------------------------------------------------------------------------------

def grade(problem_task: str, response: str, answer=None, tests=None, sandbox=None,
          math_grader: str = "math-verify") -> bool:
    """Grade one final response. problem_task: "math" | "gpqa" | "code". math_grader: math-verify (ours) or
    strict-box (the official training reward)."""
    if problem_task == "math":
        if math_grader == "strict-box":
            return grade_math_strict_box(response, answer)
        if math_grader != "math-verify":
            raise ValueError(f"unknown math_grader {math_grader!r}; choose one of {MATH_GRADERS}")
        return grade_math(response, answer)
    if problem_task == "gpqa":
        return grade_gpqa(response, answer)
    if problem_task == "code":
        return grade_code(response, tests, sandbox=sandbox)
    raise ValueError(f"unknown task {problem_task!r}: expected 'math', 'gpqa' or 'code'")
