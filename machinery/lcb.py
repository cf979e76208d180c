"""machinery/lcb.py: code answers run against their tests in the sandbox, and the verdict made outside it.

reward.py's code grader (`grade_code`) picks the code a response submits and calls `passes`, the one entry
here. Three test shapes (data/problems.py documents them):
    {"functional": src}            LeetCode-style `check(candidate)` asserts (leetcode_train).
    [{"input", "output"}, ...]     stdin/stdout pairs (codeforces, LiveCodeBench stdin problems),
                                   compared as LiveCodeBench does: stripped lines, then tokens as Decimal.
    {"call": name, "cases": [...]} LiveCodeBench functional problems: `Solution().<name>(*args)` with
                                   JSON args (one per input line); the result is compared JSON-decoded,
                                   tuples as lists.
A problem passes only if all its tests pass. LiveCodeBench-shaped tests (the last two) have two graders:
  strict (default, ours): each test in a fresh process (a crash or hang in one cannot touch the next),
    the program run as a script on real stdin, 6 s a test and min((6+1)*tests+5, 300) s in all.
  official: LiveCodeBench's own harness (lcb_runner/evaluation/testing_util.py run_test, as vendored in
    Open-CLEANER), rebuilt in run_lcb_official: its code extraction, a stdin program wrapped in a
    function, stdin as text, all tests in one process with one Solution instance, its exit rules and
    its comparisons. The notes above _LCB_OFFICIAL_HARNESS list each rule and the departures. The two
    differ both ways: e.g. a correct output followed by sys.exit(1) fails strict and passes official;
    a program that reads sys.stdin.buffer, ends with quit() or os._exit(0), shares top-level names
    through `global`, or returns a numpy array or tuples inside a list passes strict and fails official.
LeetCode checks: every `assert` of check(candidate) is turned into a call case with `ast`
(functional_cases): `candidate(...) == literal`, `is_same_list(candidate(...), list_node([...]))`,
`is_same_tree(..., tree_node([...]))`, `candidate(...) is None`, `abs(candidate(...) - x) < tol`,
`math.isclose(...)`, `assert candidate(...)` / `assert not candidate(...)`. All 1,889 checks of
leetcode_train convert. A check with any other statement is never run: `passes` raises UnsupportedCheck
(a ValueError naming the line) before grading, so a data set with such rows fails loudly instead of being
trusted; functional_cases lets a loader screen rows ahead.

Reward hacking: the verdict is made here, outside the sandbox. The child (the candidate and a small
harness in one process) gets only the call arguments or test inputs, never an expected value; it sends
back each test's result as a value (JSON with type tags) or its captured stdout, and this process
compares. So nothing the candidate can read (its own constants, its callers' frames, its stdin) says what
would pass, and exiting early or printing a fake record gains nothing. Results travel as plain values:
a subclass that overrides `==` (an object that equals everything) arrives opaque and equals nothing.
ListNode/TreeNode results travel as their values (LeetCode's level order for trees). The sandbox is what
protects the machine; with bwrap it also hides this checkout, the problem sets beside it and the folders a
caller passes as `hide=` (eval.py passes its benchmark files'), and without bwrap graded code can read
any file the user can, answers included (sandbox.py).

A leaf: the sandbox comes in as an argument (anything with sandbox.Sandbox's `run`); this module imports no
project module.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import secrets
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from machinery.lcb_wire import (_WIRE_SRC, _Chain, _Opaque, _Tree, _decode_result, _read_records,  # noqa: F401
                                _record_cap, _tree_of, _wire_dec, _wire_enc)


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

# ---------------------------------------------------------------------------------------------------
# LeetCode-style check(candidate) tests -> call cases
# ---------------------------------------------------------------------------------------------------

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


class UnsupportedCheck(ValueError):
    """A check(candidate) statement the converter cannot turn into a call case (it is never trusted)."""


@dataclass(frozen=True)
class CallCase:
    """One assert of a check function as a call: the candidate gets args/kwargs (wire-encoded; `ln`/`tn`
    tags build linked lists / trees in the child) and its result must satisfy `kind` against `expected`:
    eq (==), list / tree (is_same_list / is_same_tree: expected is a _Chain / _Tree), none (is None),
    truthy / falsy (assert f(...) / assert not f(...)), close (abs(f(...) - expected) < or <= tol[1],
    tol[0] the operator) and isclose (math.isclose with tol = (rel_tol, abs_tol))."""
    args: list
    kwargs: dict
    kind: str
    expected: object = None
    tol: tuple = ()
    line: int = 0


_NUMBER_NAMES = {"inf": float("inf")}  # the prelude defines `inf`


def _literal(node):
    """The value of a literal expression of a check function (Python literals, unary signs, `inf`)."""
    if isinstance(node, ast.Constant) and node.value is not Ellipsis:
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise UnsupportedCheck("a starred element")
        items = [_literal(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise UnsupportedCheck("a ** in a dict literal")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand)
        if type(v) not in (int, float, complex):
            raise UnsupportedCheck(f"a sign on {type(v).__name__}")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.Name) and node.id in _NUMBER_NAMES:
        return _NUMBER_NAMES[node.id]
    raise UnsupportedCheck(f"`{ast.unparse(node)}` is not a literal")


def _builder(node, name: str):
    """The literal list of `name(<list>)` (list_node / tree_node), else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and len(node.args) == 1 and not node.keywords):
        values = _literal(node.args[0])
        if not isinstance(values, list):
            raise UnsupportedCheck(f"{name} of a {type(values).__name__}")
        return values
    return None


def _arg(node):
    """A candidate argument, wire-encoded: a literal, list_node([...]) or tree_node([...])."""
    for name, tag in (("list_node", "ln"), ("tree_node", "tn")):
        values = _builder(node, name)
        if values is not None:
            return {tag: _wire_enc(values)}
    return _wire_enc(_literal(node))


def _candidate_call(node, param: str):
    """(args, kwargs) of `param(...)`, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == param):
        return None
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise UnsupportedCheck("*args or **kwargs in the call")
    return [_arg(a) for a in node.args], {k.arg: _arg(k.value) for k in node.keywords}


def _assert_case(test, param: str, line: int) -> CallCase:
    """The call case of one `assert <test>`; UnsupportedCheck for shapes we do not grade."""
    def call(node):
        return _candidate_call(node, param)

    def case(got, kind, expected=None, tol=()):
        return CallCase(got[0], got[1], kind, expected, tol, line)

    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq):
            for a, b in ((left, right), (right, left)):
                if (got := call(a)) is not None:
                    return case(got, "eq", _literal(b))
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value is None:
            if (got := call(left)) is not None:
                return case(got, "none")
        if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name) \
                and left.func.id == "abs" and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp) \
                and isinstance(left.args[0].op, ast.Sub):
            diff, tol = left.args[0], _literal(right)
            for a, b in ((diff.left, diff.right), (diff.right, diff.left)):
                if (got := call(a)) is not None:
                    return case(got, "close", _literal(b), ("<" if isinstance(op, ast.Lt) else "<=", tol))
    if isinstance(test, ast.Call) and isinstance(test.func, (ast.Name, ast.Attribute)):
        fname = test.func.id if isinstance(test.func, ast.Name) else test.func.attr
        if fname in ("is_same_list", "is_same_tree") and len(test.args) == 2 and not test.keywords:
            builder = "list_node" if fname == "is_same_list" else "tree_node"
            for a, b in ((test.args[0], test.args[1]), (test.args[1], test.args[0])):
                if (got := call(a)) is not None:
                    values = [] if isinstance(b, ast.Constant) and b.value is None else _builder(b, builder)
                    if values is None:
                        raise UnsupportedCheck(f"{fname} against `{ast.unparse(b)}`")
                    if fname == "is_same_list":
                        return case(got, "list", _Chain(tuple(values)))
                    return case(got, "tree", _tree_of(values))
        if fname == "isclose" and len(test.args) == 2 and all(k.arg in ("rel_tol", "abs_tol") for k in test.keywords):
            if isinstance(test.func, ast.Attribute) and ast.unparse(test.func.value) != "math":
                raise UnsupportedCheck(f"`{ast.unparse(test.func)}`")
            tols = {"rel_tol": 1e-9, "abs_tol": 0.0, **{k.arg: _literal(k.value) for k in test.keywords}}
            for a, b in ((test.args[0], test.args[1]), (test.args[1], test.args[0])):
                if (got := call(a)) is not None:
                    return case(got, "isclose", _literal(b), (tols["rel_tol"], tols["abs_tol"]))
    if (got := call(test)) is not None:
        return case(got, "truthy")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and (got := call(test.operand)) is not None:
        return case(got, "falsy")
    raise UnsupportedCheck("not a shape the grader converts (candidate(...) == literal, is None, "
                           "is_same_list/is_same_tree, abs(... - x) < tol, math.isclose, or a bare call)")


@functools.lru_cache(maxsize=4096)  # a GRPO group shares its tests
def functional_cases(check_src: str) -> tuple[str, tuple[CallCase, ...]]:
    """A `check(candidate)` test source -> (entry expression, its asserts as call cases).

    Raises UnsupportedCheck (a ValueError) naming the first statement it cannot convert: a check is
    converted whole or not at all, never run as code whose verdict the candidate could fake."""
    entry = leetcode_entry_point(check_src)
    try:
        tree = ast.parse(check_src)
    except SyntaxError as e:
        raise UnsupportedCheck(f"functional tests: not Python ({e.msg}, line {e.lineno})") from None
    fn = tree.body[0]
    if len(tree.body) != 2 or not isinstance(fn, ast.FunctionDef) or fn.name != "check" or fn.decorator_list:
        raise UnsupportedCheck("functional tests: expected exactly `def check(candidate): ...` and the "
                               "final check(...) call, nothing else at the top level")
    if len(fn.args.args) != 1 or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        raise UnsupportedCheck("functional tests: check must take exactly one argument (the candidate)")
    param, cases = fn.args.args[0].arg, []
    for stmt in fn.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue  # a docstring
        try:
            if not isinstance(stmt, ast.Assert):
                raise UnsupportedCheck(f"a {type(stmt).__name__} statement (only asserts are converted)")
            cases.append(_assert_case(stmt.test, param, stmt.lineno))
        except UnsupportedCheck as e:
            raise UnsupportedCheck(f"functional tests, line {stmt.lineno}: cannot grade "
                                   f"`{ast.unparse(stmt)[:120]}`: {e}") from None
    if not cases:
        raise UnsupportedCheck("functional tests: check has no asserts")
    return entry, tuple(cases)


def _case_holds(case: CallCase, value) -> bool:
    """Does the decoded result satisfy the case? Python's own operators on plain values, as the assert
    would have used; an opaque result satisfies nothing."""
    if isinstance(value, _Opaque):
        return False
    try:
        if case.kind in ("eq", "list", "tree"):
            return bool(value == case.expected)
        if case.kind == "none":
            return value is None
        if case.kind in ("truthy", "falsy"):
            return bool(value) == (case.kind == "truthy")
        if case.kind == "close":
            op, tol = case.tol
            diff = abs(value - case.expected)
            return bool(diff < tol if op == "<" else diff <= tol)
        if case.kind == "isclose":
            return math.isclose(value, case.expected, rel_tol=case.tol[0], abs_tol=case.tol[1])
    except (TypeError, ValueError, OverflowError, RecursionError):
        return False
    raise ValueError(f"unknown call case kind {case.kind!r}")


# The child's program: read the cases, move its own stdout out of the way (the code's prints go to
# /dev/null; the results leave on a duplicate of the old stdout), the prelude, the prelude's builders
# saved before the code can rebind them, the code, then the calls. Any exception (or exit) ends the run.
_CHECK_HEAD = """\
import json as _clnr_json, os as _clnr_os, sys as _clnr_sys
_clnr_todo = _clnr_json.loads(_clnr_sys.stdin.read())
_clnr_fd = _clnr_os.dup(1)
_clnr_null = _clnr_os.open(_clnr_os.devnull, _clnr_os.O_WRONLY)
_clnr_os.dup2(_clnr_null, 1)
_clnr_os.close(_clnr_null)
""" + _WIRE_SRC

_CHECK_MID = "_clnr_build = {'ln': list_node, 'tn': tree_node}\n"

_CHECK_TAIL = """
def _clnr_arg(tag, v):
    return _clnr_build[tag](_w_dec(v, None))

def _clnr_chain(x):
    vals = []
    while x is not None:
        if len(vals) >= 1000000:
            raise ValueError("the returned linked list does not end")
        vals.append(_w_enc(x.val))
        x = x.next
    return {"ln": vals}

def _clnr_tree(root):
    out, queue = [], [root]
    for node in queue:
        if node is None:
            out.append(None)
            continue
        if len(queue) > 2000000:
            raise ValueError("the returned tree does not end")
        out.append([_w_enc(node.val)])
        queue += [node.left, node.right]
    while out and out[-1] is None:
        out.pop()
    return {"tn": out}

def _clnr_run(fn):
    for i, case in enumerate(_clnr_todo["cases"]):
        try:
            got = fn(*_w_dec(case["args"], _clnr_arg), **{k: _w_dec(v, _clnr_arg) for k, v in case["kwargs"].items()})
            kind = case["kind"]
            out = _clnr_chain(got) if kind == "list" else _clnr_tree(got) if kind == "tree" else _w_enc(got)
        except BaseException as e:
            _w_emit(_clnr_fd, _clnr_todo["cap"], i, "error", type(e).__name__)
            return
        _w_emit(_clnr_fd, _clnr_todo["cap"], i, "ok", out)
"""


def run_check_tests(code: str, check_src: str, sb, timeout_s: float = 6.0) -> bool:
    """LeetCode-style tests: the asserts of check(candidate) become call cases (functional_cases); the
    child calls the candidate (one instance for all cases, as `check(Solution().f)` does) and sends back
    only the results, which are compared here. timeout_s bounds the whole run."""
    entry, cases = functional_cases(check_src)
    needs = [len(json.dumps(_wire_enc(c.expected.vals if isinstance(c.expected, _Chain) else
                                      list(c.expected.nodes) if isinstance(c.expected, _Tree) else c.expected)))
             for c in cases]
    todo = {"cap": _record_cap(sb, needs),
            "cases": [{"args": c.args, "kwargs": c.kwargs, "kind": c.kind} for c in cases]}
    program = "\n".join([_CHECK_HEAD, LEETCODE_PRELUDE, _CHECK_MID, code, _CHECK_TAIL, f"_clnr_run({entry})", ""])
    res = sb.run(program, stdin=json.dumps(todo), timeout_s=timeout_s)
    got = _read_records(res.stdout, len(cases))
    if got is None:
        return False
    try:
        return all(_case_holds(c, _decode_result(p)) for c, p in zip(cases, got))
    except (ValueError, TypeError, RecursionError):  # a record that does not decode: tampered with
        return False


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


def run_stdio_tests(code: str, cases: list[dict], sandbox, per_test_s: float = 6.0,
                    total_s: float | None = None) -> bool:
    """Run `code` once per case with case["input"] on stdin; all outputs must match (stdout_matches)."""
    return _run_cases(sandbox, _LCB_IMPORTS + "\n" + code, cases, per_test_s, total_s,
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


def run_call_tests(code: str, func_name: str, cases: list[dict], sandbox, per_test_s: float = 6.0,
                   total_s: float | None = None) -> bool:
    """LiveCodeBench functional problems: per case, call `Solution().<func_name>(*args)` (args: one
    JSON value per input line) and compare its JSON-encoded result with the JSON expected output.
    The comparison is made here: the child gets only the arguments. Its result line carries a random
    marker that tells it apart from the code's own prints; the code can read the marker (it is a constant
    of the program), but a line it forges holds a value that must still equal the expected output, which
    the child never sees."""
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

    return _run_cases(sandbox, program, cases, per_test_s, total_s, passed)


# ---------------------------------------------------------------------------------------------------
# LiveCodeBench as its official harness grades (lcb_grader="official")
# ---------------------------------------------------------------------------------------------------
# Semantics of lcb_runner/evaluation/testing_util.py run_test (upstream LiveCodeBench, also vendored in
# Open-CLEANER's veRL fork and used by NVIDIA's runner), rebuilt here:
# - stdin programs: a final `if __name__ == '__main__':` block is unwrapped, the top-level imports stay
#   at module level after the harness's star-imports, and every other statement becomes the body of a
#   function that is called once per test. Names assigned at the top level are that function's locals,
#   so a helper that declares them `global` fails. A program whose text holds "class Solution" fails.
# - the whole problem runs in one process: the module is executed once under a per-test alarm, then
#   each test under its own alarm; the first test that raises or times out ends the problem (code that
#   swallows the TimeoutException runs on, as there, but the handler's message lands in its captured
#   output). Call-style problems create ONE Solution() for all their tests, so state kept on it carries
#   over from test to test.
# - stdin is text: sys.stdin is a StringIO of the input (no .buffer; the copy in Open-CLEANER, and
#   upstream until 2025-05; upstream since gives a bytes .buffer), and read/readline/readlines of the
#   process's own stdin object (which names bound by `from sys import *` at import time still point at)
#   return the input; stdout is captured by swapping sys.stdout for a StringIO. `open` is patched too, but
#   the star-import of builtins bound the real one first, so open(0) reads the worker's empty stdin.
# - exits: SystemExit from a stdin program ends that test normally (sys.exit(1) after a correct output
#   passes); `quit` is None (reliability_guard), so quit() is a runtime error; os._exit ends the process
#   and so fails the problem; a call-style solution that exits fails.
# - comparison: stdout as stdout_matches; call results by `==` with the JSON expected value, after
#   turning a top-level tuple (only) into a list. Int-to-string conversion allows 50,000 digits.
# - reliability_guard's disabled functions (os.kill, os.remove, os.getcwd, shutil.rmtree,
#   subprocess.Popen, quit, help, ...) and blocked modules (resource, psutil, ...) are disabled too.
# - code extraction: the lines between the response's last two lines that contain ``` (whatever their
#   language; upstream extract_code). NVIDIA's runner takes the first block instead; not offered.
# Departures: the verdict is made in the parent on the values the child sends, so equality is Python's on
# plain values: a result object with its own __eq__ is never equal (the official harness would call that
# __eq__); a numpy array counts as its one element, and fails when larger (there, a runtime error). Tests
# after a wrong output still run (the child does not know the expected outputs), which changes no
# verdict. Time limits use setitimer, so they may be fractions of a second.
# Checked: 37 programs (each rule above, both ways) get the same verdict here as from the Open-CLEANER
# copy of run_test itself, run outside this repository.

_LCB_OFFICIAL_HARNESS = """\
import builtins as _b, contextlib as _ctx, io as _io, json as _json, os as _os, shutil as _shutil
import signal as _signal, subprocess as _subprocess, sys as _sys, types as _types
from unittest import mock as _mock
""" + _WIRE_SRC + r'''
_cfg = _json.loads(_sys.stdin.read())
_fd = _os.dup(1)
for _n, _mode in ((0, _os.O_RDONLY), (1, _os.O_WRONLY)):  # like the official worker process: stdin is
    _x = _os.open(_os.devnull, _mode)                       # /dev/null, and writes that bypass the captured
    _os.dup2(_x, _n)                                        # sys.stdout go nowhere
    _os.close(_x)
_sys.stdin = open(0, "r", closefd=False)
_sys.set_int_max_str_digits(50000)

_NULLED = {_b: ("quit", "help"),
           _os: ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
                 "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod",
                 "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"),
           _shutil: ("rmtree", "move", "chown"), _subprocess: ("Popen",)}
_BLOCKED = ("ipdb", "joblib", "resource", "psutil", "tkinter")
_NONE = object()


class TimeoutException(Exception):
    pass


def _on_alarm(signum, frame):
    print("timeout occured: alarm went off")  # as the official handler: into the captured output, so a
    raise TimeoutException                    # program that swallows the timeout still fails its test


def _arm(seconds):
    _signal.setitimer(_signal.ITIMER_REAL, seconds)


def _guard():
    saved = [(m, k, getattr(m, k, _NONE)) for m, names in _NULLED.items() for k in names]
    for m, k, _ in saved:
        setattr(m, k, None)
    mods = [(k, _sys.modules.get(k, _NONE)) for k in _BLOCKED]
    for k, _ in mods:
        _sys.modules[k] = None
    return saved, mods


def _unguard(saved, mods):
    for m, k, v in saved:
        if v is _NONE:
            delattr(m, k)
        else:
            setattr(m, k, v)
    for k, v in mods:
        if v is _NONE:
            _sys.modules.pop(k, None)
        else:
            _sys.modules[k] = v


def _one_stdin(fn, text, per):
    lines = iter(text.split("\n"))
    buf = _io.StringIO()
    buf.close = lambda x: 1
    saved = _sys.stdout
    try:
        _arm(per)
        _sys.stdout = buf
        with _ctx.ExitStack() as stack:
            # entered in the official order: the first three patch the process's own stdin object,
            # then sys.stdin itself is replaced
            for p in (_mock.patch("sys.stdin.read", lambda *a: text),
                      _mock.patch("sys.stdin.readlines", lambda *a: text.split("\n")),
                      _mock.patch("sys.stdin.readline", lambda *a: next(lines)),
                      _mock.patch("sys.stdin", _io.StringIO(text)),
                      _mock.patch("builtins.open", _mock.mock_open(read_data=text))):
                stack.enter_context(p)
            try:
                fn()
            except SystemExit:
                pass
        return "ok", buf.getvalue()
    except BaseException as e:
        return "error", type(e).__name__
    finally:
        _arm(0)
        _sys.stdout = saved


def _one_call(fn, args, per):
    try:
        _arm(per)
        got = fn(*args)
        _arm(0)
        if isinstance(got, tuple):
            got = list(got)
        return "ok", _w_enc(got)
    except BaseException as e:
        return "error", type(e).__name__
    finally:
        _arm(0)


def _main():
    per, cap = _cfg["per_test_s"], _cfg["cap"]
    _signal.signal(_signal.SIGALRM, _on_alarm)
    guard = _guard()
    try:
        try:
            _arm(per)
            mod = _types.ModuleType("tmp_sol", "")
            exec(_cfg["src"], mod.__dict__)
            sol = mod.Solution() if "class Solution" in _cfg["src"] else mod
            fn = getattr(sol, _cfg["name"])
            _arm(0)
            if _cfg["kind"] == "call":
                todo = [[_json.loads(line) for line in text.split("\n")] for text in _cfg["inputs"]]
            else:
                todo = _cfg["inputs"]
        except BaseException as e:
            _w_emit(_fd, cap, -1, "error", type(e).__name__)
            return
        finally:
            _arm(0)
        one = _one_call if _cfg["kind"] == "call" else _one_stdin
        for i, item in enumerate(todo):
            status, payload = one(fn, item, per)
            _w_emit(_fd, cap, i, status, payload)
            if status != "ok":
                return
    finally:
        _unguard(*guard)


_main()
'''


def extract_code_lcb(text: str) -> str:
    """The official LiveCodeBench extraction: the lines between the last two lines that contain ```
    (whatever the fence's language, even prose between two blocks); "" when there are fewer than two."""
    if not isinstance(text, str):
        return ""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1:fences[-1]])


def _lcb_stdin_source(code: str) -> str | None:
    """A stdin program as the official harness runs it (see above); None if it does not parse."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            tree = ast.parse(ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body))
    except (SyntaxError, ValueError, RecursionError):
        return None
    imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
    fn = ast.FunctionDef(name="wrapped_function", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                                      kw_defaults=[], defaults=[]),
                         body=body, decorator_list=[], returns=None, lineno=1)
    try:
        return _LCB_IMPORTS + "\n" + ast.unparse(imports) + "\n" + ast.unparse(fn)
    except (ValueError, RecursionError):
        return None


def _json_expected(s: str, where: str):
    # the official evaluator allows 50,000-digit ints; Decimal converts past this process's own cap
    try:
        return json.loads(s, parse_int=lambda d: int(d) if len(d) < 4000 else int(Decimal(d)))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where} is not JSON ({e})") from None


def run_lcb_official(code: str | None, tests, sb, per_test_s: float = 6.0,
                     total_s: float | None = None) -> bool:
    """Grade `code` on LiveCodeBench tests (stdin pairs, or {"call", "cases"}) as the official harness
    does (notes above); all tests in one sandbox run within the problem's time budget."""
    call = isinstance(tests, dict)
    cases = tests["cases"] if call else tests
    if call and not re.fullmatch(r"[A-Za-z_]\w*", tests["call"] or ""):
        raise ValueError(f"functional tests need a Python identifier as func_name, got {tests['call']!r}")
    if call:
        expected = [_json_expected(c["output"], f"functional test case {i} output") for i, c in enumerate(cases)]
    else:
        expected = [c["output"] for c in cases]
    cap = _record_cap(sb, [len(c["output"]) for c in cases])
    if not code or not code.strip():
        return False
    if call:
        src, name = _LCB_IMPORTS + "\n\n" + code, tests["call"]
    else:
        src, name = _lcb_stdin_source(code), "wrapped_function"
        if src is None:
            return False
    cfg = {"kind": "call" if call else "stdin", "src": src, "name": name, "cap": cap, "per_test_s": per_test_s,
           "inputs": [c["input"] for c in cases]}
    res = sb.run(_LCB_OFFICIAL_HARNESS, stdin=json.dumps(cfg), timeout_s=_budget(len(cases), per_test_s, total_s))
    got = _read_records(res.stdout, len(cases))
    if got is None:
        return False
    if not call:
        return all(isinstance(p, str) and stdout_matches(p, e) for p, e in zip(got, expected))
    try:
        return all(_case_holds(CallCase([], {}, "eq", e), _decode_result(p)) for p, e in zip(got, expected))
    except (ValueError, TypeError, RecursionError):
        return False


# ---------------------------------------------------------------------------------------------------
# The one entry: reward.grade_code's
# ---------------------------------------------------------------------------------------------------

def is_check(tests) -> bool:
    """A LeetCode check(candidate) function's source ({"functional": src}), the one shape no LiveCodeBench
    grader reads."""
    return isinstance(tests, dict) and set(tests) == {"functional"}


def shape(tests) -> str:
    """"check", "call" or "stdin": which of the shapes (module docstring) `tests` has; anything else, or a LeetCode
    check that cannot be converted, raises ValueError."""
    if is_check(tests):
        functional_cases(tests["functional"])
        return "check"
    if isinstance(tests, dict) and set(tests) == {"call", "cases"} and bool(tests["cases"]):
        return "call"
    if isinstance(tests, list) and bool(tests) and all(isinstance(t, dict) and {"input", "output"} <= set(t)
                                                       for t in tests):
        return "stdin"
    found = sorted(tests) if isinstance(tests, dict) else type(tests).__name__
    raise ValueError(f"unknown code tests shape {found}: expected {{'functional': src}}, "
                     "{'call': name, 'cases': [...]} (cases non-empty) or a non-empty list of {'input', 'output'}")


def passes(code: str | None, tests, sandbox, per_test_s: float = 6.0, total_s: float | None = None,
           official: bool = False) -> bool:
    """True iff `code` passes every test (shapes: module docstring); None (no code) passes nothing, but the
    tests are checked first, so that malformed tests raise ValueError whatever the response. official:
    LiveCodeBench-shaped tests by its own harness (run_lcb_official), else each test in a fresh process;
    LeetCode checks are graded one way. per_test_s, total_s: the time limits (total_s None: LiveCodeBench's
    budget for the problem)."""
    kind = shape(tests)  # validate before deciding the response is wrong
    if kind == "check":
        return code is not None and run_check_tests(code, tests["functional"], sandbox, timeout_s=per_test_s)
    if official:
        return run_lcb_official(code, tests, sandbox, per_test_s, total_s)
    if kind == "call":
        return code is not None and run_call_tests(code, tests["call"], tests["cases"], sandbox, per_test_s, total_s)
    return code is not None and run_stdio_tests(code, tests, sandbox, per_test_s, total_s)
