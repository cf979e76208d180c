"""machinery/lcb.py, through reward.py's code grader, in the real sandbox: LiveCodeBench's official harness
beside ours (each difference pinned in both modes), LeetCode checks turned into call cases (and the reward
hacks that used to pass them), and graded code kept away from the benchmark files (bwrap's `hide=`)."""
import json
import shutil
import tempfile
from pathlib import Path

import pytest

import config
import reward
from machinery import lcb
from machinery.lcb import extract_code_lcb, functional_cases
from reward import grade_code
from sandbox import Sandbox


@pytest.fixture(scope="module")
def sb():
    with Sandbox(slots=2) as s:
        yield s


def fenced(code):
    return f"Here is my solution.\n```python\n{code}\n```\n"


# --- LiveCodeBench: strict (ours) vs official (LiveCodeBench's harness) -------------------------------
# Every verdict in the official column was checked against upstream's testing_util.run_test itself
# (the copy vendored in Open-CLEANER), run outside this repository.

SUM = [{"input": "3\n1 2 3\n", "output": "6\n"}, {"input": "2\n5 5\n", "output": "10"}]
READ = "n = int(input())\nxs = list(map(int, input().split()))\n"
ADD = {"call": "addUp", "cases": [{"input": "[1, 2]\n1", "output": "[2, 3]"}, {"input": "[5]\n2", "output": "[7]"}]}
PAIRS = {"call": "addUp", "cases": [{"input": "[1, 2]\n1", "output": "[[2, 1], [3, 1]]"}]}


def sol(body):
    return "class Solution:\n    def addUp(self, nums, k):\n" + "".join(f"        {ln}\n" for ln in body.split("\n"))


@pytest.mark.parametrize("why, tests, response, strict, official", [
    ("a correct program", SUM, fenced(READ + "print(sum(xs))"), True, True),
    ("a wrong program", SUM, fenced(READ + "print(sum(xs) + 1)"), False, False),
    # the official harness runs a stdin program as the body of a function: `total` is its local, so the
    # helper's `global total` finds no such global
    ("global", SUM, fenced("n = int(input())\ntotal = 0\ndef add(k):\n    global total\n    total += k\n"
                           "for x in map(int, input().split()):\n    add(x)\nprint(total)"), True, False),
    ("quit() at the end (reliability_guard sets quit = None)", SUM, fenced(READ + "print(sum(xs))\nquit()"), True, False),
    ("sys.stdin.buffer (official stdin is a StringIO)", SUM,
     fenced("import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))"), True, False),
    ("os._exit(0) after printing ends the official worker", SUM,
     fenced("import os\n" + READ + "print(sum(xs), flush=True)\nos._exit(0)"), True, False),
    ("sys.exit(1) after a correct output: SystemExit ends the test normally there", SUM,
     fenced("import sys\n" + READ + "print(sum(xs))\nsys.exit(1)"), False, True),
    ("an if __name__ == '__main__' block is unwrapped", SUM,
     fenced("def main():\n    " + READ.replace("\n", "\n    ") + "print(sum(xs))\nif __name__ == '__main__':\n    main()"),
     True, True),
    ("a correct Solution", ADD, fenced(sol("return [x + k for x in nums]")), True, True),
    ("state kept on the one Solution instance of the problem", ADD,
     fenced("class Solution:\n    calls = 0\n    def addUp(self, nums, k):\n        self.calls += 1\n"
            "        return [x + k * self.calls for x in nums]"), True, False),
    ("a numpy array", ADD, fenced("import numpy as np\n" + sol("return np.array(nums) + k")), True, False),
    ("a top-level tuple counts as a list", ADD, fenced(sol("return tuple(x + k for x in nums)")), True, True),
    ("tuples inside a list are not lists", PAIRS, fenced(sol("return [(x + k, k) for x in nums]")), True, False),
    ("exit inside a call-style solution", ADD, fenced(sol("exit()")), False, False),
    # extraction: both grade the last block, whatever the first says (NVIDIA's runner would grade the first)
    ("first block wrong, last right", SUM,
     fenced(READ + "print(0)") + "Wait, fix:\n" + fenced(READ + "print(sum(xs))"), True, True),
    # ...but the official one takes the last fenced block whatever its language; ours the last python one
    ("a sample output block after the code", SUM, fenced(READ + "print(sum(xs))") + "Output:\n```\n6\n```\n", True, False),
])
def test_lcb_strict_and_official_verdicts(why, tests, response, strict, official, sb):
    assert grade_code(response, tests, sandbox=sb, per_test_s=2.0) is strict, why
    assert grade_code(response, tests, sandbox=sb, per_test_s=2.0, lcb_grader="official") is official, why
    assert reward.grade("code", response, tests=tests, sandbox=sb, lcb_grader="official") is official, why


def test_lcb_official_timeouts_are_per_test_in_one_process(sb):
    # a timeout the program swallows still fails: the official alarm handler prints into the captured output
    swallow = READ + "while n == 2:\n    try:\n        while True: pass\n    except Exception:\n        break\nprint(sum(xs))"
    assert not grade_code(fenced(swallow), SUM, sandbox=sb, per_test_s=0.3, lcb_grader="official")
    assert grade_code(fenced(READ + "print(sum(xs))"), SUM, sandbox=sb, per_test_s=0.3, lcb_grader="official")


def test_lcb_official_grades_on_the_fallback_layers_too():
    # without bwrap the code runs as a uid that may not read the interpreter's folder (a pyenv Python under a 0700
    # /root): what the harness imports must be preloaded, or every program fails
    with Sandbox(slots=1, use_bwrap=False) as fallback:
        assert grade_code(fenced(READ + "print(sum(xs))"), SUM, sandbox=fallback, lcb_grader="official")


def test_leetcode_entry_point():
    assert lcb.leetcode_entry_point("def check(candidate):\n    assert 1\n\n\ncheck(Solution().twoSum)\n") == \
        "Solution().twoSum"
    with pytest.raises(ValueError, match="check"):
        lcb.leetcode_entry_point("def check(candidate):\n    assert 1\n")


def test_extract_code_lcb_is_upstreams_last_fence_pair():
    assert extract_code_lcb("a\n```python\nx = 1\n```\nb\n```py\ny = 2\n```") == "y = 2"
    assert extract_code_lcb("```python\nx = 1\n```\nsee ```this``` note\n") == ""  # any line with ``` is a fence
    assert extract_code_lcb("```python\nx = 1\n```\nthen\n```") == "then"  # odd fences: the text between the last two
    assert extract_code_lcb("no code") == "" and extract_code_lcb("```python\nx = 1") == ""
    with pytest.raises(ValueError, match="lcb_grader"):
        grade_code(fenced("print(1)"), SUM, lcb_grader="nvidia")


def test_official_call_results_cannot_be_faked(sb):
    # the child never holds an expected value: a spy that searches everything it can reach finds nothing
    spy = ("import sys, gc\n"
           "def _find():\n"
           "    seen = []\n"
           "    f = sys._getframe()\n"
           "    while f is not None:\n"
           "        seen += [c for c in f.f_code.co_consts if isinstance(c, str)]\n"
           "        seen += [repr(v) for v in list(f.f_locals.values()) + list(f.f_globals.values())]\n"
           "        f = f.f_back\n"
           "    return any(str(2 * 212121) in s for s in seen)\n"  # the answer, never spelled out in this code
           "class Solution:\n    def addUp(self, nums, k):\n        return [2 * 212121] if _find() else None\n")
    tests = {"call": "addUp", "cases": [{"input": "[1]\n1", "output": "[424242]"}]}
    for mode in reward.LCB_GRADERS:
        assert not grade_code(fenced(spy), tests, sandbox=sb, lcb_grader=mode), mode


# --- LeetCode check(candidate) -> call cases --------------------------------------------------------

def test_every_leetcode_train_check_converts(shared_data):
    kinds = {}
    with open(shared_data / "leetcode_train.jsonl") as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        entry, cases = functional_cases(row["tests"]["functional"])
        assert entry.startswith("Solution().")
        for c in cases:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
    assert len(rows) == 1889 and kinds == {"eq": 4638, "list": 59, "tree": 53}


def check(*asserts, entry="Solution().f"):
    return "def check(candidate):\n" + "".join(f"    {a}\n" for a in asserts) + f"\n\ncheck({entry})\n"


def f_of(body):
    return "class Solution:\n    def f(self, x):\n" + "".join(f"        {ln}\n" for ln in body.split("\n"))


@pytest.mark.parametrize("src, right, wrong", [
    (check("assert abs(candidate(x = 2) - 1.41421356) < 1e-6"), "return x ** 0.5", "return 1.4142"),
    (check("assert math.isclose(candidate(x = 2), 1.41421356, rel_tol=1e-6)"), "return x ** 0.5", "return 1.5"),
    (check("assert candidate(x = 0) is None", "assert candidate(x = 1) == 1"), "return x or None", "return x"),
    (check("assert candidate(3)", "assert not candidate(4)"), "return x % 2 == 1", "return True"),
    (check("assert candidate(x = -1) == {1: (2, 3), 'a': {4}}"), "return {1: (2, 3), 'a': {4}}",
     "return {1: [2, 3], 'a': {4}}"),                                       # a tuple is not a list
    (check("assert candidate(x = inf) == [inf, -2]"), "return [x, -2]", "return [x, 2]"),
    (check("assert candidate(x = 1) == 1"), "import numpy as np\nreturn np.int64(1)", "return '1'"),
])
def test_converted_shapes_grade_right_and_wrong(src, right, wrong, sb):
    assert lcb.run_check_tests(f_of(right), src, sb)
    assert not lcb.run_check_tests(f_of(wrong), src, sb)


@pytest.mark.parametrize("src, what", [
    (check("assert candidate(x = 1) in [1, 2]"), "line 2"),
    (check("assert candidate(x = 1) == 1", "y = 3"), "line 3: cannot grade `y = 3`"),
    (check("assert candidate(x = y) == 1"), "`y` is not a literal"),
    (check("assert candidate(*[1]) == 1"), "args"),
    ("import os\ndef check(candidate):\n    assert candidate() == 1\n\n\ncheck(Solution().f)\n", "nothing else"),
])
def test_unconvertible_checks_are_errors_never_run(src, what, sb):
    with pytest.raises(lcb.UnsupportedCheck, match=what):
        grade_code(fenced(f_of("return 1")), {"functional": src}, sandbox=sb)


def _rows(path, want):
    out = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if want(row):
                out[row["id"]] = row
    return out


def test_real_list_and_tree_rows_grade_right_and_wrong(shared_data, sb):
    rows = _rows(shared_data / "leetcode_train.jsonl", lambda r: r["id"] in ("leetcode-1", "leetcode-76"))
    add, build = rows["leetcode-1"], rows["leetcode-76"]  # add two numbers (linked lists), tree from pre/inorder
    assert grade_code(fenced(add["reference_solution"]), add["tests"], sandbox=sb)
    as_python_list = add["reference_solution"].replace("return dummy.next", "out = []\n        node = dummy.next\n"
                                                       "        while node:\n            out.append(node.val)\n"
                                                       "            node = node.next\n        return out")
    assert not grade_code(fenced(as_python_list), add["tests"], sandbox=sb)  # values right, but not a ListNode
    assert grade_code(fenced(build["reference_solution"]), build["tests"], sandbox=sb)
    mirrored = build["reference_solution"] + ("\n_orig = Solution.buildTree\n"
                                              "def _mirror(self, *a, **k):\n    root = _orig(self, *a, **k)\n"
                                              "    stack = [root]\n    while stack:\n        n = stack.pop()\n"
                                              "        if n:\n            n.left, n.right = n.right, n.left\n"
                                              "            stack += [n.left, n.right]\n    return root\n"
                                              "Solution.buildTree = _mirror\n")
    assert not grade_code(fenced(mirrored), build["tests"], sandbox=sb)


# The old grader ran the asserts in the child and trusted a random marker printed after them. The marker
# was a constant of the child's own program, readable from its code objects or its callers' frames.
CO_CONSTS = ("import sys, os\n"
             "for c in sys._getframe().f_code.co_consts:\n"
             "    if isinstance(c, str) and len(c) == 32:\n"
             "        print(c)\n"
             "os._exit(0)\n")
PARENT_FRAMES = ("import sys, os, re\n"
                 "class Solution:\n"
                 "    def twoSum(self, nums, target):\n"
                 "        f = sys._getframe()\n"
                 "        while f is not None:\n"
                 "            texts = [c for c in f.f_code.co_consts if isinstance(c, str)]\n"
                 "            texts += [v for v in f.f_locals.values() if isinstance(v, str)]\n"
                 "            for t in texts:\n"
                 "                for m in re.findall(r'[0-9a-f]{32}', t):\n"
                 "                    print(m)\n"
                 "                    os.write(1, (m + '\\n').encode())\n"
                 "            f = f.f_back\n"
                 "        sys.stdout.flush()\n"
                 "        os._exit(0)\n")


def test_marker_tricks_fail(shared_data, sb):
    tests = _rows(shared_data / "leetcode_train.jsonl", lambda r: r["id"] == "leetcode-0")["leetcode-0"]["tests"]
    # the trick works on a program that holds a marker...
    res = sb.run(CO_CONSTS + "print('0123456789abcdef0123456789abcdef')\n")
    assert res.ok and res.stdout.strip() == "0123456789abcdef0123456789abcdef"
    # ...and gains nothing now: there is no marker, and the verdict is made outside on the returned values
    for code in (CO_CONSTS, PARENT_FRAMES):
        assert not grade_code(fenced(code), tests, sandbox=sb)


# --- graded code cannot read the benchmark files ------------------------------------------------------

def _readable_secret(sb, tests, cheat_for):
    """A folder with an answers file that a sandbox without hide= can read (the control), or None. Not under
    /tmp or /var/tmp: the sandbox gives the code private ones, so those would prove nothing."""
    for base in (Path(__file__).resolve().parents[2], Path.home()):
        try:
            d = Path(tempfile.mkdtemp(prefix="cleaner-lcb-", dir=base))
        except OSError:
            continue
        d.chmod(0o755)
        (d / "answers.txt").write_text("secret-answer-31337\n")
        (d / "answers.txt").chmod(0o644)
        if grade_code(cheat_for(d / "answers.txt"), tests, sandbox=sb):
            return d
        shutil.rmtree(d)
    return None


def test_graded_code_cannot_read_the_benchmark_files(sb):
    import eval as ev
    if "bwrap" not in sb.layers:
        # without bwrap nothing can be hidden: the modules must say so plainly
        assert "answers included" in lcb.__doc__ and "readable" in ev.__doc__
        pytest.skip("bubblewrap is not available here")
    tests = [{"input": "", "output": "secret-answer-31337"}]
    cheat_for = lambda path: fenced(f"print(open({str(path)!r}).read())")  # noqa: E731
    d = _readable_secret(sb, tests, cheat_for)
    if d is None:
        pytest.skip("no folder here that an unhidden sandbox can read, so hiding cannot be shown")
    try:
        args = config.Bench(lcb_dir=str(d), grade_workers=1)
        assert str(d) in ev.data_folders(args)
        with ev.judge_sandbox(args) as judge:  # the sandbox eval.py grades code in
            assert not grade_code(cheat_for(d / "answers.txt"), tests, sandbox=judge)
            assert grade_code(fenced("print('secret-answer-31337')"), tests, sandbox=judge)
    finally:
        shutil.rmtree(d)


def test_eval_passes_the_lcb_grader_through(sb, monkeypatch):
    import eval as ev
    from data.problems import Problem
    prob = Problem(id="s1", problem="sum", answer=None, task="code", tests=SUM)
    exit1 = fenced("import sys\n" + READ + "print(sum(xs))\nsys.exit(1)") + "Output:\n```\n6\n```\n"
    for grader, correct, pred in (("strict", False, "import sys"), ("official", False, "6")):
        rec = ev.grade_record(dict(benchmark="lcb", problem_id="s1", response=exit1), prob, sb, 2.0, grader)
        assert rec["correct"] is correct and rec["pred"].startswith(pred), grader
    rec = ev.grade_record(dict(benchmark="lcb", problem_id="s1", response=fenced("import sys\n" + READ +
                                                                               "print(sum(xs))\nsys.exit(1)")),
                          prob, sb, 2.0, "official")
    assert rec["correct"] is True
    monkeypatch.setattr(ev, "evaluate", lambda args: args)
    assert ev.main(["--faithful", "--benchmarks", "lcb"]).bench.lcb_grader == "official"
    with pytest.raises(SystemExit) as e:
        ev.main(["--lcb-grader", "nvidia", "--benchmarks", "lcb"])
    assert e.value.code == 2


def test_official_output_too_big_for_the_sandbox_is_a_grader_error(sb):
    tests = [{"input": "", "output": "7\n" * 40000}]
    with pytest.raises(ValueError, match="do not fit the sandbox's max_output_bytes"):
        grade_code(fenced("print('7\\n' * 40000)"), tests, sandbox=sb, lcb_grader="official")
    with Sandbox(slots=1, max_output_bytes=1 << 20) as big:
        assert grade_code(fenced("print('7\\n' * 40000)"), tests, sandbox=big, lcb_grader="official")
