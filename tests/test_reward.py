"""reward.py: answer extraction, math/GPQA grading, and code grading in the real sandbox."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import reward
from sandbox import Sandbox
from reward import extract_boxed, extract_choice, extract_code, grade, grade_code, grade_gpqa, grade_math


# --- boxed extraction -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),                       # nested braces
    (r"\boxed{\sqrt{\frac{a}{b^{2}}}}", r"\sqrt{\frac{a}{b^{2}}}"),        # deeper nesting
    (r"first \boxed{12}, wait, correction: \boxed{13}", "13"),           # several boxes: the last wins
    (r"The answer is \boxed 5.", "5"),                                    # \boxed without braces
    (r"\fbox{7}", "7"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),                                   # escaped braces are content
    (r"\boxed{\boxed{9}}", "9"),
    (r"\boxed{4} (remember to use \boxed{})", "4"),                      # an empty box is not an answer
    ("no box at all, the answer is 4", None),
    (r"\boxed{4} and then \boxed{5", None),                              # truncated last box: no answer
    (r"\boxedfoo{3}", None),
])
def test_extract_boxed(text, want):
    assert extract_boxed(text) == want


# --- math -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pred, gold", [
    (r"\frac{3}{4}", "0.75"),                    # fraction vs decimal
    (r"\dfrac{3}{4}", r"\frac{3}{4}"),
    (r"\frac34", "3/4"),
    ("0.50", r"\frac{1}{2}"),
    ("033", "33"),                               # AIME leading zeros
    (r"336^\circ", "336"),                       # degrees
    (r"336^{\circ}", "336"),
    ("1,000", "1000"),                           # thousands separators
    (r"1{,}000", "1000"),
    (r"1\,000", "1000"),
    ("[1, 5)", "[1,5)"),                         # intervals
    (r"(-\infty, 2]", r"(-\infty,2]"),
    (r"\text{(A)}", "A"),                        # LaTeX text
    (r"\text{Monday}", r"\text{Monday}"),
    (r"\sqrt{18}", r"3\sqrt{2}"),                # symbolic: needs math-verify
    ("-7", "-7"),
])
def test_math_equivalent(pred, gold):
    assert grade_math(rf"... so the answer is \boxed{{{pred}}}.", gold), (pred, gold)


@pytest.mark.parametrize("pred, gold", [
    ("34", "33"),
    ("0.76", "0.75"),
    ("[1, 5]", "[1,5)"),                         # closed vs half-open interval
    (r"\sqrt{19}", r"3\sqrt{2}"),
    (r"\text{Tuesday}", r"\text{Monday}"),
])
def test_math_not_equivalent(pred, gold):
    assert not grade_math(rf"\boxed{{{pred}}}", gold)


def test_math_uses_last_box_and_needs_one():
    assert grade_math(r"I think \boxed{12}. No wait, it is \boxed{13}.", "13")
    assert not grade_math(r"I think \boxed{13}. No wait, it is \boxed{12}.", "13")
    assert not grade_math("The answer is 13.", "13")


def test_math_grading_works_from_threads():
    # math-verify's own timeouts use signal.alarm, which raises outside the main thread
    cases = [(r"\boxed{\sqrt{18}}", r"3\sqrt{2}", True), (r"\boxed{\frac{2}{4}}", "0.5", True),
             (r"\boxed{[1,2]}", "[1,2)", False), (r"\boxed{x^2+2x+1}", "(x+1)^2", True)] * 3
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: grade_math(c[0], c[1]), cases))
    assert got == [c[2] for c in cases]


def test_math_verify_timeout_counts_as_wrong_and_worker_recovers():
    # sympy does not finish this; the worker is killed and a fresh one serves the next call
    assert reward.math_equal("5", r"(10^{10^{10}})!", timeout_s=1.0) is False
    assert reward.math_equal(r"\sqrt{8}", r"2\sqrt{2}") is True


# --- GPQA -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    (r"Therefore \boxed{B}", "B"),
    (r"\boxed{\text{C}}", "C"),
    (r"\boxed{\textbf{(D)}}", "D"),
    (r"\boxed{(A)}", "A"),
    (r"\boxed{\text{Option B}}", "B"),
    (r"\boxed{B) 42 m/s}", "B"),
    (r"first \boxed{A}, but on reflection \boxed{C}", "C"),
    ("Answer: D", "D"),
    ("**Answer:** (B)", "B"),
    ("The correct answer is option C.", "C"),
    ("The answer is a bit subtle.\nAnswer: A", "A"),
    (r"\boxed{42}" + "\nAnswer: B", "B"),         # a non-letter box falls back to the Answer line
    ("I am not sure.", None),
    (r"\boxed{Apple}", None),
])
def test_gpqa_letters(text, want):
    assert extract_choice(text) == want
    assert grade_gpqa(text, want or "A") == (want is not None)


def test_gpqa_wrong_letter():
    assert not grade_gpqa(r"\boxed{B}", "C")


# --- grade / reward entry points ---------------------------------------------------------------------

def test_grade_dispatch():
    assert grade("math", r"\boxed{033}", answer="33")
    assert grade("gpqa", "Answer: C", answer="C")
    assert not grade("math", r"\boxed{4}", answer="5")
    with pytest.raises(ValueError, match="unknown task 'poetry'"):
        grade("poetry", "x", answer="y")
    with pytest.raises(ValueError, match="needs a gold answer"):
        grade("math", r"\boxed{1}")
    with pytest.raises(ValueError, match="needs a gold letter"):
        grade("gpqa", r"\boxed{A}", answer="E")


# --- code extraction --------------------------------------------------------------------------------

def test_extract_code_takes_final_python_block():
    text = ("Try:\n```python\nprint(1)\n```\nOutput:\n```\n1\n```\nFinal:\n```python\nprint(2)\n```\n"
            "Explanation ```py")  # an unclosed trailing fence is ignored
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nx = 3\n```") == "x = 3\n"
    assert extract_code("no code here") is None


def test_unknown_tests_shape_is_an_error():
    with pytest.raises(ValueError, match="unknown code tests shape"):
        grade_code("```python\nprint(1)\n```", {"weird": 1})


# --- code grading in the sandbox ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def sb():
    with Sandbox(slots=2) as s:
        yield s


def _rows(path, ids):
    out = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row["id"] in ids:
                out[row["id"]] = row
    return out


def fenced(code):
    return f"Here is my solution.\n```python\n{code}\n```\n"


def test_leetcode_reference_solutions_pass_and_wrong_ones_fail(shared_data, sb):
    # real rows: a list problem, a linked-list problem (list_node/is_same_list) and a tree problem
    rows = _rows(shared_data / "leetcode_train.jsonl", {"leetcode-0", "leetcode-1"})
    tree = next(r for r in map(json.loads, open(shared_data / "leetcode_train.jsonl"))
                if "tree_node" in r["tests"]["functional"])
    for row in [*rows.values(), tree]:
        assert grade("code", fenced(row["reference_solution"]), tests=row["tests"], sandbox=sb), row["id"]
    wrong = "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"
    assert not grade("code", fenced(wrong), tests=rows["leetcode-0"]["tests"], sandbox=sb)
    assert not grade("code", "I could not solve it.", tests=rows["leetcode-0"]["tests"], sandbox=sb)


def test_leetcode_reward_hacks_fail(shared_data, sb):
    tests = _rows(shared_data / "leetcode_train.jsonl", {"leetcode-0"})["leetcode-0"]["tests"]
    always_equal = ("class Yes(list):\n    def __eq__(self, other):\n        return True\n"
                    "class Solution:\n    def twoSum(self, nums, target):\n        return Yes()\n")
    early_exit = "import os\nos._exit(0)\nclass Solution:\n    pass\n"
    for code in (always_equal, early_exit):
        assert not grade_code(fenced(code), tests, sandbox=sb)


def test_codeforces_stdin_real_row(shared_data, sb):
    row = _rows(shared_data / "codeforces_test.jsonl", {"cf-0"})["cf-0"]  # print min and max of x, y
    right = "t = int(input())\nfor _ in range(t):\n    x, y = map(int, input().split())\n    print(min(x, y), max(x, y))\n"
    wrong = "t = int(input())\nfor _ in range(t):\n    x, y = map(int, input().split())\n    print(x, y)\n"
    assert grade("code", fenced(right), tests=row["tests"], sandbox=sb)
    assert not grade("code", fenced(wrong), tests=row["tests"], sandbox=sb)


STDIN_TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}]


@pytest.mark.parametrize("code, ok", [
    ("a, b = map(int, input().split())\nprint(a + b)", True),
    ("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n\n\n", True),
    ("a, b = map(int, input().split())\nprint(a * b)", False),                      # wrong answer
    ("a, b = map(int, input().split())\nprint(a + b)\nraise ValueError('late')", False),  # runtime error
    ("while True:\n    pass", False),                                               # timeout
    ("a, b = map(int, input().split())\nprint(a + b, 'extra')", False),
])
def test_stdin_problems(code, ok, sb):
    assert grade_code(fenced(code), STDIN_TESTS, sandbox=sb, per_test_s=2.0) is ok


def test_stdin_float_tokens_compare_as_decimal(sb):
    tests = [{"input": "1 2\n", "output": "0.5 2\n"}]
    assert grade_code(fenced("print('0.50000', '2.0')"), tests, sandbox=sb)       # same value, other spelling
    assert not grade_code(fenced("print('0.5000001', '2')"), tests, sandbox=sb)   # Decimal is exact
    assert not grade_code(fenced("print('0.5')\nprint('2')"), tests, sandbox=sb)  # line structure matters


FUNC_TESTS = {"call": "addUp", "cases": [{"input": "[1, 2, 3]\n4", "output": "[5, 6, 7]"},
                                         {"input": "[]\n0", "output": "[]"}]}


@pytest.mark.parametrize("code, ok", [
    ("class Solution:\n    def addUp(self, nums: List[int], k: int) -> List[int]:\n        return [x + k for x in nums]", True),
    ("class Solution:\n    def addUp(self, nums, k):\n        return tuple(x + k for x in nums)", True),  # tuples as lists
    ("class Solution:\n    def addUp(self, nums, k):\n        print('debug', nums)\n        return [x + k for x in nums]", True),
    ("class Solution:\n    def addUp(self, nums, k):\n        return [x - k for x in nums]", False),
    ("class Solution:\n    def addUp(self, nums, k):\n        return nums[10]", False),
    ("class Solution:\n    def addUp(self, nums, k):\n        while True: pass", False),
    ("class Solution:\n    def other(self, nums, k):\n        return nums", False),
])
def test_functional_problems(code, ok, sb):
    assert grade_code(fenced(code), FUNC_TESTS, sandbox=sb, per_test_s=2.0) is ok


def test_output_too_big_for_the_sandbox_is_a_grader_error(sb):
    # the default sandbox keeps 64 KB of stdout; a longer expected output could never match
    tests = [{"input": "", "output": "7\n" * 40000}]
    with pytest.raises(ValueError, match="does not fit the sandbox's max_output_bytes"):
        grade_code(fenced("print('7\\n' * 40000)"), tests, sandbox=sb)


def test_strict_box_is_the_official_exact_match():
    """--math-grader strict-box (veRL math_dapo, strict box verification): the last box in the last 100
    characters, compared as a string; math-verify (ours) is more lenient."""
    grade = lambda text, gold, g: reward.grade("math", text, answer=gold, math_grader=g)  # noqa: E731
    assert grade("So the answer is \\boxed{42}.", "42", "strict-box")
    for text in ("\\boxed{42.0}", "\\boxed{ 42}", "\\boxed{42}" + " and that is all." * 8, "42"):
        assert not grade(text, "42", "strict-box"), text
    assert grade("\\boxed{42.0}", "42", "math-verify") and grade("\\boxed{ 42}", "42", "math-verify")
    assert grade("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "strict-box")
    with pytest.raises(ValueError, match="math_grader"):
        grade("\\boxed{1}", "1", "exact")
