"""Tests for data/problems.py (real files in ../shared/data), data/synth.py and data/download.py's converters."""

import base64
import contextlib
import csv
import io
import json
import pickle
import re
import subprocess
import sys
import zlib
from decimal import ROUND_FLOOR, Decimal
from math import gcd
from pathlib import Path

import pytest
import sympy

from data import download as dl  # the repo root is on sys.path via tests/conftest.py
from data.benchmarks import decode_lcb_tests, gpqa_problem
from data.problems import (FILES, DataError, Problem, default_data_dir, load_jsonl,
                           load_named, problem_from_row)
from data.synth import KINDS, make_problems, make_sft_conversations
from machinery.lcb import LEETCODE_PRELUDE

ROOT = Path(__file__).resolve().parents[1]

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "README.md").is_file(), reason=f"no shared data at {SHARED}")


def run_py(src: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", src], input=stdin, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------------------------------------
# problems.py on the real files


def readme_counts() -> dict[str, int]:
    counts = {}
    for line in (SHARED / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*([\w.]+\.jsonl)\s*\|\s*(\d+)\s*\|", line)
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


@needs_shared
def test_readme_lists_every_named_file():
    counts = readme_counts()
    assert set(counts) == set(list(FILES.values())[:6]), counts
    assert set(counts) == {p.name for p in SHARED.glob("*.jsonl")}


@needs_shared
@pytest.mark.parametrize("name", ["aime24", "aime25", "aime_train", "leetcode_train", "codeforces_test"])
def test_real_file_counts_and_shapes(name):
    ps = load_named(name, data_dir=SHARED)
    assert len(ps) == readme_counts()[FILES[name]]
    assert len({p.id for p in ps}) == len(ps)
    for p in ps:
        assert p.problem.strip() and p.meta["file"] == FILES[name]
        if name.startswith("aime"):
            assert p.task == "math" and p.tests is None
            assert p.answer.isdigit() and 0 <= int(p.answer) <= 999
        elif name == "leetcode_train":
            assert p.task == "code" and set(p.tests) == {"functional"} and "def check(candidate)" in p.tests["functional"]
            assert p.meta["reference_solution"].strip()
        else:
            assert p.task == "code" and isinstance(p.tests, list) and p.tests
            assert all(set(t) == {"input", "output"} and isinstance(t["input"], str) for t in p.tests)
    if name.startswith("aime"):
        # README says "without leading zeros"; true for the eval sets, but 8 AIME 2023 train rows have them
        padded = [p.id for p in ps if p.answer != str(int(p.answer))]
        assert len(padded) == (8 if name == "aime_train" else 0) and all(i.startswith("aime2023") for i in padded)


@needs_shared
def test_real_math_train_has_two_empty_answers():
    # the real file has two multiple-choice rows whose answer is empty: raise names the first one
    path = SHARED / FILES["math_train"]
    with pytest.raises(DataError, match=re.escape(f"{path}:5055: field 'answer' is empty")):
        load_named("math_train", data_dir=SHARED)
    with pytest.warns(UserWarning, match=r"skipped 2 malformed row\(s\): line 5055: .*line 5159: "):
        ps = load_named("math_train", data_dir=SHARED, on_error="skip")
    assert len(ps) == readme_counts()[FILES["math_train"]] - 2
    assert {p.meta["level"] for p in ps} == {3, 4, 5} and all(p.meta["subject"] for p in ps)
    assert ps[5053].meta["line"] == 5054 and ps[5054].meta["line"] == 5056  # the gap where line 5055 was


@needs_shared
def test_leetcode_tests_pass_with_reference_solutions_and_prelude():
    # the documented meaning of {"functional": src}: PRELUDE + solution + src exits cleanly
    ps = load_named("leetcode_train", data_dir=SHARED)[::12]
    runner = (
        "import io, contextlib, json, sys\n"
        "progs = json.load(sys.stdin)\n"
        "bad = []\n"
        "for pid, src in progs:\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(io.StringIO()):\n"
        "            exec(compile(src, pid, 'exec'), {'__name__': '__main__'})\n"
        "    except ModuleNotFoundError as e:\n"
        "        if e.name != 'sortedcontainers': bad.append(pid)\n"  # a third-party import of 12 rows
        "    except BaseException:\n"
        "        bad.append(pid)\n"
        "print(json.dumps(bad))\n")
    progs = [[p.id, LEETCODE_PRELUDE + "\n" + p.meta["reference_solution"] + "\n\n" + p.tests["functional"]]
             for p in ps]
    r = run_py(runner, json.dumps(progs))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [] and len(progs) > 150
    # and a wrong solution fails the same tests
    wrong = ps[0].meta["reference_solution"].replace("return", "return None and", 1)
    assert run_py(LEETCODE_PRELUDE + wrong + "\n\n" + ps[0].tests["functional"]).returncode != 0


@needs_shared
def test_task_forcing_and_limit():
    path = SHARED / FILES["leetcode_train"]
    assert len(load_jsonl(path, task="code", limit=7)) == 7
    assert load_jsonl(path, limit=0) == []
    with pytest.raises(DataError, match=re.escape(f"{path}:1: expected a math row, but this row has 'tests'")):
        load_jsonl(path, task="math")
    with pytest.raises(ValueError, match="task must be"):
        load_jsonl(path, task="science")


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEANER_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "aime24.jsonl"))):
        load_named("aime24")
    with pytest.raises(ValueError, match="unknown data set 'aime23'"):
        load_named("aime23")
    monkeypatch.delenv("CLEANER_DATA")
    if SHARED.is_dir():
        assert default_data_dir() == SHARED
        assert len(load_named("aime25")) == 30
    else:
        assert default_data_dir().name == "data_cache"


GOOD = '{"id": "a", "problem": "1+1?", "answer": "2"}'


@pytest.mark.parametrize("bad,reason", [
    ('{"id": "b", "problem": "x", "answer": "3"', "bad JSON"),
    ('{"id": "b", "problem": "x"}', "missing field 'answer'"),
    ('{"id": "b", "problem": "   ", "answer": "3"}', "field 'problem' is empty"),
    ('{"id": "b", "problem": "x", "answer": ["3"]}', "field 'answer' must be a string, got list"),
    ('{"id": "b", "problem": "x", "answer": 3.5}', "field 'answer' must be a string, got float"),
    ('{"problem": "x", "answer": "3"}', "missing field 'id'"),
    ('["b", "x", "3"]', "expected a JSON object, got list"),
    ('{"id": "a", "problem": "x", "answer": "3"}', "duplicate id 'a' (first seen on line 1)"),
    ('{"id": "b", "problem": "x", "tests": {"unit": "assert 1"}}', "keys ['functional'] or ['call', 'cases']"),
    ('{"id": "b", "problem": "x", "tests": {"call": "f()", "cases": []}}', "'tests.call' must be a Python identifier"),
    ('{"id": "b", "problem": "x", "tests": {"call": "f", "cases": []}}', "field 'tests.cases' is an empty list"),
    ('{"id": "b", "problem": "x", "tests": []}', "field 'tests' is an empty list"),
    ('{"id": "b", "problem": "x", "tests": [{"input": "1", "output": 2}]}', "field 'tests[0].output' must be a string"),
    ('{"id": "b", "problem": "x", "tests": "assert f(1) == 2"}', "field 'tests' must be an object or a list"),
])
def test_malformed_row_names_file_and_line(tmp_path, bad, reason):
    path = tmp_path / "set.jsonl"
    path.write_text(GOOD + "\n\n" + bad + "\n")  # the bad row is on line 3 (blank line 2 still counts)
    with pytest.raises(DataError) as e:
        load_jsonl(path)
    assert str(e.value).startswith(f"{path}:3: ") and reason in str(e.value)


def test_bad_utf8_names_line(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_bytes(GOOD.encode() + b'\n{"id": "b", "problem": "\xff", "answer": "1"}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}:2: not valid UTF-8")):
        load_jsonl(path)


def test_skip_mode_warns_with_lines(tmp_path):
    path = tmp_path / "set.jsonl"
    rows = [GOOD, '{"id": "b"', '{"id": "c", "problem": "x", "answer": 7}', '{"id": "d", "problem": "", "answer": "1"}',
            '{"id": "e", "problem": "y", "tests": [{"input": "1\\n", "output": "2"}], "extra": 1}']
    path.write_text("\n".join(rows) + "\n")
    with pytest.warns(UserWarning) as w:
        ps = load_jsonl(path, on_error="skip")
    msg = str(w[0].message)
    assert str(path) in msg and "skipped 2 malformed row(s)" in msg and "line 2: bad JSON" in msg
    assert "line 4: field 'problem' is empty" in msg
    assert [p.id for p in ps] == ["a", "c", "e"]
    assert ps[1].answer == "7"  # ints convert losslessly
    assert ps[2].task == "code" and ps[2].answer is None and ps[2].tests == [{"input": "1\n", "output": "2"}]
    assert ps[2].meta == {"extra": 1, "file": "set.jsonl", "line": 5}
    with pytest.raises(ValueError, match="on_error"):
        load_jsonl(path, on_error="ignore")


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"problem file {tmp_path / 'nope.jsonl'} not found")):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        load_jsonl(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="file has no rows"):
        load_jsonl(tmp_path / "empty.jsonl")


def test_problem_from_row_copies_tests_into_normal_form():
    tests = [{"input": "1", "output": "2"}]
    p = problem_from_row({"id": 5, "problem": "p", "tests": tests, "answer": None})
    assert p == Problem(id="5", problem="p", answer=None, task="code", tests=tests, meta={})
    assert p.tests is not tests
    with pytest.raises(DataError, match=r"tests\[0\]' must be an object with keys 'input' and 'output'"):
        problem_from_row({"id": "x", "problem": "p", "tests": [{"input": "1", "output": "2", "testtype": "stdin"}]})
    call = {"call": "add", "cases": [{"input": "1\n2", "output": "3"}]}
    assert problem_from_row({"id": "y", "problem": "p", "tests": call}).tests == call
    with pytest.raises(DataError, match=r"'tests.cases\[0\].output' must be a string, got int"):
        problem_from_row({"id": "y", "problem": "p", "tests": {"call": "add", "cases": [{"input": "1", "output": 3}]}})


# ---------------------------------------------------------------------------------------------
# synth.py


def test_synth_deterministic_and_prefix_stable():
    a, b = make_problems(24, seed=3), make_problems(24, seed=3)
    assert a == b
    assert make_problems(7, seed=3) == a[:7]
    c = make_problems(24, seed=4)
    assert [p.answer for p in a] != [p.answer for p in c]
    w = make_problems(24, seed=3, difficulty="warmup")
    assert not {p.id for p in a} & {p.id for p in w}
    for ps in (a, w):
        assert all(p.task == "math" and p.tests is None and p.answer == str(int(p.answer)) for p in ps)
        assert {p.meta["kind"] for p in ps[:6]} == set(KINDS)  # any 6 in a row cover all kinds
    with pytest.raises(ValueError, match="difficulty"):
        make_problems(3, 0, difficulty="hard")


def _collatz_shortcut(n):
    # different method from synth: an odd step and the halving after it are taken together
    steps = 0
    while n != 1:
        if n % 2:
            n, steps = (3 * n + 1) // 2, steps + 2
        else:
            n, steps = n // 2, steps + 1
    return steps


def independent_answer(p: Problem) -> int:
    k, a = p.meta["kind"], p.meta["params"]
    if k == "primes":
        return int(sympy.primepi(a["hi"]) - sympy.primepi(a["lo"] - 1))
    if k == "digit_sum":
        return sum(int(c) for c in str(a["base"] ** a["exp"]))
    if k == "recurrence":
        xs = [a["x0"], a["x1"]]
        for _ in range(2, a["n"] + 1):
            xs = [xs[1], (a["p"] * xs[1] + a["q"] * xs[0] + a["r"]) % a["m"]]
        return xs[1] if a["n"] >= 1 else xs[0]
    if k == "shopping":
        total = Decimal(0)
        for _, q, c in a["items"]:
            line = q * Decimal(c) / 100
            if a["min_qty"] is not None and q >= a["min_qty"]:
                line = (line * (100 - a["pct"]) / 100).quantize(Decimal("0.01"), rounding=ROUND_FLOOR)
            total += line
        if a["free_over"] is not None and total * 100 < a["free_over"]:
            total += Decimal(a["ship"]) / 100
        return int(total * 100)
    if k == "collatz":
        return sum(_collatz_shortcut(n) for n in range(a["lo"], a["hi"] + 1))
    if k == "coprime":
        n, m = a["n"], a["m"]
        return n // m * int(sympy.totient(m)) + sum(1 for j in range(1, n % m + 1) if gcd(j, m) == 1)
    raise AssertionError(k)


def numbers_in_text(p: Problem) -> list[str]:
    a = p.meta["params"]
    if p.meta["kind"] == "shopping":
        return [f"{q} " for _, q, _ in a["items"]] + [f"${c // 100}.{c % 100:02d}" for _, _, c in a["items"]]
    return [str(v) for v in a.values()]


@pytest.mark.parametrize("difficulty,n", [("warmup", 60), ("rl", 18)])
def test_synth_answers_match_independent_computation(difficulty, n):
    for p in make_problems(n, seed=11, difficulty=difficulty):
        assert p.answer == str(independent_answer(p)), p
        for s in numbers_in_text(p):
            assert s in p.problem, (s, p.problem)


def test_synth_reference_code_prints_answer():
    cheap = [p for p in make_problems(24, seed=5, difficulty="rl") if p.meta["kind"] not in ("primes", "recurrence")]
    for p in make_problems(24, seed=5, difficulty="warmup") + cheap:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(p.meta["reference_code"], {})
        assert buf.getvalue().strip() == p.answer, p.id


def test_warmup_is_smaller_than_rl():
    def size(p):
        a = p.meta["params"]
        return {"primes": a.get("hi"), "digit_sum": a.get("exp", 0) * len(str(a.get("base"))),
                "recurrence": a.get("n"), "shopping": len(a.get("items", [])), "collatz": a.get("lo"),
                "coprime": a.get("n")}[p.meta["kind"]]

    warm, rl = make_problems(60, 1, "warmup"), make_problems(60, 1, "rl")
    for k in KINDS:
        assert max(size(p) for p in warm if p.meta["kind"] == k) < min(size(p) for p in rl if p.meta["kind"] == k), k
    assert any("% off" in p.problem for p in rl) and not any("% off" in p.problem for p in warm)


@pytest.mark.parametrize("fmt", ["markdown", "hermes"])
def test_sft_conversations_carry_real_tool_output(fmt):
    convs = make_sft_conversations(12, seed=2, tool_format=fmt, prompt_fn=lambda t: f"<<{t}>>")
    probs = make_problems(12, seed=2, difficulty="warmup")
    finals = set()
    for conv, p in zip(convs, probs):
        msgs = conv["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
        assert conv["id"] == p.id and conv["answer"] == p.answer
        assert msgs[0]["content"] == f"<<{p.problem}>>"
        call = msgs[1]["content"]
        if fmt == "markdown":
            code = re.fullmatch(r"(?s)(.+?)\n\n```python\n(.*)```", call).group(2)
            assert "<tool_call>" not in call
        else:
            payload = json.loads(re.fullmatch(r"(?s)(.+?)\n\n<tool_call>\n(.*)\n</tool_call>", call).group(2))
            assert payload["name"] == "code_interpreter" and set(payload["arguments"]) == {"code"}
            code = payload["arguments"]["code"]
            assert "```" not in call
        r = run_py(code)  # run again, in a separate interpreter
        assert r.returncode == 0 and r.stdout.strip() == msgs[2]["content"] == p.answer
        assert f"\\boxed{{{p.answer}}}" in msgs[3]["content"]
        finals.add(re.sub(r"\d+", "N", msgs[3]["content"]))
    assert len(finals) >= 2  # several phrasings
    assert make_sft_conversations(12, seed=2, tool_format=fmt, prompt_fn=lambda t: f"<<{t}>>") == convs
    with pytest.raises(ValueError, match="tool_format"):
        make_sft_conversations(1, 0, tool_format="xml")


# ---------------------------------------------------------------------------------------------
# download.py converters on fixture rows with the hub sets' real column names


def test_convert_aime():
    maxwell = [{"ID": "2024-I-1", "Problem": " Find x. ", "Solution": "...", "Answer": 204},
               {"ID": "2024-I-2", "Problem": "Find y.", "Solution": "...", "Answer": "025"}]
    yentinglin = [{"id": 3, "problem": "Angle?", "solution": "", "answer": "336^\\circ", "url": "u", "year": 2025},
                  {"id": 4, "problem": "Ratio?", "solution": "", "answer": "3/4", "url": "u", "year": 2025}]
    assert dl.convert_aime(maxwell, "aime24") == [
        {"id": "aime24-0", "problem": "Find x.", "answer": "204", "source_id": "2024-I-1"},
        {"id": "aime24-1", "problem": "Find y.", "answer": "25", "source_id": "2024-I-2"}]
    with pytest.warns(UserWarning, match=r"aime25: dropped 1 row\(s\): row 1"):
        rows = dl.convert_aime(yentinglin, "aime25")
    assert [(r["id"], r["answer"]) for r in rows] == [("aime25-0", "336")]


def test_convert_math_levels_and_boxed():
    rows = [
        {"problem": "Half?", "level": "Level 3", "type": "Algebra", "solution": "So $\\boxed{\\frac{1}{2}}$."},
        {"problem": "Easy", "level": "Level 2", "type": "Algebra", "solution": "$\\boxed{1}$"},
        {"problem": "Box", "level": "Level 5", "type": "Geometry", "solution": "a \\boxed{2} then \\fbox{3}"},
        {"problem": "None", "level": "Level 4", "type": "Prealgebra", "solution": "no answer here"},
        {"problem": "Odd", "level": "Level ?", "type": "Precalculus", "solution": "\\boxed{9}"},
        {"problem": "Sp", "level": "Level 4", "type": "Number Theory", "solution": "is $\\boxed 7$."},
    ]
    with pytest.warns(UserWarning, match=r"math: dropped 2 row\(s\)"):
        out = dl.convert_math(rows)
    assert [(r["id"], r["answer"], r["level"], r["subject"]) for r in out] == [
        ("math35-0", "\\frac{1}{2}", 3, "Algebra"), ("math35-1", "3", 5, "Geometry"), ("math35-2", "7", 4, "Number Theory")]


DAPO_HEAD = ("Solve the following math problem step by step. The last line of your response should be of the form "
             "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'


def test_convert_dapo_strips_template_and_dedups():
    def row(text, gt, idx):
        return {"data_source": "math_dapo", "prompt": [{"content": DAPO_HEAD + text + DAPO_TAIL, "role": "user"}],
                "ability": "MATH", "reward_model": {"ground_truth": gt, "style": "rule-lighteval/MATH_v2"},
                "extra_info": {"index": idx}}

    out = dl.convert_dapo([row("What is 2+2?", "4", "u1"), row("What is 2+2?", "4", "u2"), row("Find $n$.", "34", "u3")])
    assert out == [{"id": "dapo-u1", "problem": "What is 2+2?", "answer": "4", "data_source": "math_dapo"},
                   {"id": "dapo-u3", "problem": "Find $n$.", "answer": "34", "data_source": "math_dapo"}]


def passes_call_tests(solution: str, tests: dict) -> bool:
    # the documented meaning of {"call", "cases"}, run on our own trusted fixture solutions
    ns = {}
    exec(LEETCODE_PRELUDE + solution, ns)
    fn = getattr(ns["Solution"](), tests["call"]) if "Solution" in ns else ns[tests["call"]]
    for c in tests["cases"]:
        args = [json.loads(line) for line in c["input"].split("\n") if line.strip()]
        if json.loads(json.dumps(fn(*args))) != json.loads(c["output"]):
            return False
    return True


def test_convert_open_agentrl_rows_and_run_their_tests():
    def row(source, content, gt):
        return {"data_source": source, "prompt": [{"content": content, "role": "user"}], "ability": "x",
                "reward_model": {"ground_truth": gt, "style": "rule"}, "extra_info": {"index": 0}}

    rows = [
        row("math_dapo", DAPO_HEAD + "Compute 6*7." + DAPO_TAIL, "42"),
        row("train-math-numinamath", "Solve x+1=3. Let's think step by step and output the final answer within \\boxed{}.",
            json.dumps(["2"])),
        row("train-code-leetcode-Easy", "Implement add.", json.dumps({
            "import_prefix": "import math\n", "entry_point": "Solution().add",
            "test_code": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"})),
        row("train-code-taco-easy", "Echo the sum.", json.dumps({"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]})),
        row("train-code-taco-medium", "Write add.", {"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"}),
        row("train-code-bad", "Broken.", "not json at all"),
        row("mega-science", "Interval?", "[1, 2]"),
        row("mega-science", "Price?", "1.50"),
    ]
    with pytest.warns(UserWarning, match=r"open_agentrl: dropped 1 row\(s\): row 5 \(train-code-bad\)"):
        out = dl.convert_open_agentrl(rows)
    assert [problem_from_row(r).task for r in out] == ["math", "math", "code", "code", "code", "math", "math"]
    assert out[0]["problem"] == "Compute 6*7." and out[0]["answer"] == "42"
    assert out[1]["problem"] == "Solve x+1=3." and out[1]["answer"] == "2"
    assert [out[5]["answer"], out[6]["answer"]] == ["[1, 2]", "1.50"]  # answers stay as written
    leet, stdio, call = out[2]["tests"], out[3]["tests"], out[4]["tests"]
    assert stdio == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    good_cls = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
    bad_cls = good_cls.replace("a + b", "a * b")
    assert run_py(good_cls + leet["functional"]).returncode == 0
    assert run_py(bad_cls + leet["functional"]).returncode != 0
    assert call == {"call": "add", "cases": [{"input": "1\n2", "output": "3"}, {"input": "3\n4", "output": "7"}]}
    assert passes_call_tests("def add(a, b):\n    return a + b\n", call) and passes_call_tests(good_cls, call)
    assert not passes_call_tests("def add(a, b):\n    return a - b\n", call)


def lcb_encode(cases) -> str:
    # how code_generation_lite stores private tests: base64(zlib(pickle(json string)))
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def lcb_rows():
    std = {"question_title": "Sum", "question_content": "Read a and b; print a+b.", "platform": "atcoder",
           "question_id": "abc999_a", "contest_id": "abc999", "contest_date": "2025-02-01T12:00:00",
           "starter_code": "", "difficulty": "easy",
           "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
           "private_test_cases": lcb_encode([{"input": "10 20\n", "output": "30\n", "testtype": "stdin"}]),
           "metadata": "{}"}
    fn = {"question_title": "Two Sum", "question_content": "Return indices of two numbers adding to target.",
          "platform": "leetcode", "question_id": "9999", "contest_id": "weekly-999",
          "contest_date": "2025-03-01T00:00:00",
          "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
          "difficulty": "medium",
          "public_test_cases": json.dumps([{"input": "[2,7,11,15]\n9", "output": "[0,1]", "testtype": "functional"}]),
          "private_test_cases": lcb_encode([{"input": "[3,3]\n6", "output": "[0,1]", "testtype": "functional"}]),
          "metadata": json.dumps({"func_name": "twoSum"})}
    old = dict(std, question_id="abc001_a", contest_date="2023-05-01T00:00:00")
    return [std, fn, old]


def test_convert_livecodebench():
    out = dl.convert_livecodebench(lcb_rows(), start="2025-01-01")
    assert [r["id"] for r in out] == ["abc999_a", "9999"]  # as eval.py names them (data/benchmarks.py)
    assert out[0]["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "10 20\n", "output": "30\n"}]
    assert "```python\nclass Solution:" in out[1]["problem"] and out[1]["tests"]["call"] == "twoSum"
    tests = problem_from_row(out[1]).tests
    assert tests == {"call": "twoSum", "cases": [{"input": "[2,7,11,15]\n9", "output": "[0,1]"},
                                                 {"input": "[3,3]\n6", "output": "[0,1]"}]}
    sol = ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
           "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
           "                return (seen[target - x], i)\n            seen[x] = i\n")
    assert passes_call_tests(sol, tests)  # a tuple result equals the JSON list
    assert not passes_call_tests(sol.replace("(seen[target - x], i)", "[i, 0]"), tests)
    assert len(dl.convert_livecodebench(lcb_rows())) == 3
    # month bounds are inclusive: 2025-02-01 is in "..2025-02", 2025-03-01 is not
    assert [r["id"] for r in dl.convert_livecodebench(lcb_rows(), start="2025-02", end="2025-02")] == ["abc999_a"]
    bad = dict(lcb_rows()[1], metadata="{}")  # functional tests without a function name: skipped, named
    with pytest.warns(UserWarning, match=r"livecodebench: .*row 0 \(9999\): functional problem without"):
        assert dl.convert_livecodebench([bad]) == []


def test_lcb_decoder_refuses_non_string_pickles():
    evil = base64.b64encode(zlib.compress(pickle.dumps(print))).decode()  # any global lookup is refused
    with pytest.raises(ValueError, match="refusing"):
        decode_lcb_tests(evil)
    assert decode_lcb_tests(lcb_encode([{"input": "1", "output": "1"}])) == [{"input": "1", "output": "1"}]


def gpqa_rows(n=6):
    # synthetic rows in GPQA's column layout (never real GPQA text)
    return [{"Record ID": f"rec{i:03d}", "Question": f"Synthetic question {i}: which option is right?",
             "Correct Answer": f"right {i}", "Incorrect Answer 1": f"wrong {i}a", "Incorrect Answer 2": f"wrong {i}b",
             "Incorrect Answer 3": f"wrong {i}c", "High-level domain": "Physics", "Subdomain": "Optics"}
            for i in range(n)]


def test_convert_gpqa():
    out = dl.convert_gpqa(gpqa_rows())
    assert out == dl.convert_gpqa(gpqa_rows())  # stable letters
    for i, r in enumerate(out):
        assert f"\n{r['answer']}) right {i}\n" in r["problem"] + "\n"
        choices = [line[3:] for line in r["problem"].split("\n\n")[1].split("\n")]
        assert sorted(choices) == sorted([f"right {i}", f"wrong {i}a", f"wrong {i}b", f"wrong {i}c"])
        assert problem_from_row(r).task == "math" and r["id"] == f"rec{i:03d}"
    assert len({r["answer"] for r in out}) > 1
    assert [r["answer"] for r in dl.convert_gpqa(gpqa_rows(), seed=1)] != [r["answer"] for r in out]
    # one converter: the file download.py writes and the raw rows give eval.py the same problems
    assert [(r["id"], r["problem"], r["answer"]) for r in out] == \
        [(p.id, p.problem, p.answer) for p in (gpqa_problem(row, 0, i) for i, row in enumerate(gpqa_rows(), 1))]


def test_download_offline_paths_write_loadable_files(tmp_path, capsys):
    csv_path = tmp_path / "gpqa_diamond.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(gpqa_rows()[0]))
        w.writeheader()
        w.writerows(gpqa_rows())
    out = tmp_path / "out"
    dl.main(["--sets", "gpqa", "--gpqa-file", str(csv_path), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "gpqa: wrote 6 problems" in printed and "Synthetic question" not in printed
    assert len(load_named("gpqa_diamond", data_dir=out)) == 6

    lcb_dir = tmp_path / "lcb"
    lcb_dir.mkdir()
    (lcb_dir / "test6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lcb_rows()))
    dl.download("livecodebench", out, lcb_dir=str(lcb_dir))  # default window 2025-02..2025-05
    assert [p.id for p in load_named("livecodebench", data_dir=out)] == ["abc999_a", "9999"]
    assert (out / "livecodebench" / "test6.jsonl").read_text() == (lcb_dir / "test6.jsonl").read_text()

    with pytest.raises(SystemExit):
        dl.main(["--sets", "aime24,bogus"])
    with pytest.raises(SystemExit, match="refusing to write GPQA"):
        dl.check_gpqa_destination(ROOT / "data" / "gpqa_diamond.jsonl")
    with pytest.raises(DataError, match="converted row 0: missing field 'answer'"):
        dl.write_jsonl([{"id": "x", "problem": "p"}], tmp_path / "bad.jsonl")


def test_download_script_runs_from_repo_root():
    r = subprocess.run([sys.executable, "data/download.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "--sets" in r.stdout


# --------------------------------------------------------------------------------------------
# --templates: the official prompt code turned into --prompt-template files (our own stand-in wording here)

def prompt_source(tool: bool) -> str:
    """A dataset module shaped like the official recipe's: named strings joined around the problem."""
    hint = " + hint" if tool else ""
    return f'''
import json
lead = "Work it out.\\n\\n"
hint = "\\n\\nA calculator is there."
end = "\\nEnd with \\\\boxed{{}}."


class Base:
    pass


class CustomRLHFDataset{"" if tool else "_notool"}(Base):
    def map_fn(self, row: dict, *, data_source: str = None):
        if data_source == "A":
            problem, answer = row["Problem"], row["Answer"]
        prompt = lead + problem{hint} + end
        return {{"prompt": [{{"role": "user", "content": prompt}}]}}

    def map_fn_gpqa(self, row: dict, *, data_source: str = None):
        problem, answer, domain = row["problem"], row["solution"], row["domain"]
        head = f"A {{domain}} question.\\n\\n"
        prompt = head + problem{hint} + end + "\\nA letter."
        return {{"prompt": [{{"role": "user", "content": prompt}}]}}

    def map_lcb(self, row: dict, *, data_source: str = None):
        problem = row["problem"]
        start = "Write a program.\\n\\n"
        reward_model = json.loads(row["reward_model"])
        public_examples = "\\nExamples: " + str(reward_model["inputs"])
        prompt = start + problem + public_examples{hint} + "\\nSubmit it."
        return {{"prompt": [{{"role": "user", "content": prompt}}]}}

    def map_fn_skywork(self, row: dict):
        content = row["prompt"][0]["content"]
        if "code" in row["data_source"]:
            row["prompt"][0]["content"] = content{hint} + "\\nIn one block."
        else:
            row["prompt"][0]["content"] = lead + content{hint} + end
        return row
'''


def test_official_templates_become_prompt_template_files(tmp_path, monkeypatch):
    import rollout
    source = prompt_source(True) + prompt_source(False).split("class Base:\n    pass\n")[1]
    t = dl.official_templates(source)
    assert t == {
        "eval": {"math": "Work it out.\n\n{problem}\n\nA calculator is there.\nEnd with \\boxed{}.",
                 "gpqa": "A {domain} question.\n\n{problem}\n\nA calculator is there.\nEnd with \\boxed{}.\nA letter.",
                 "code": "Write a program.\n\n{problem}\n\nA calculator is there.\nSubmit it."},
        "train": {"math": "Work it out.\n\n{problem}\n\nA calculator is there.\nEnd with \\boxed{}.",
                  "code": "{problem}\n\nA calculator is there.\nIn one block."},
        "eval_notool": {"math": "Work it out.\n\n{problem}\nEnd with \\boxed{}.",
                        "gpqa": "A {domain} question.\n\n{problem}\nEnd with \\boxed{}.\nA letter.",
                        "code": "Write a program.\n\n{problem}\nSubmit it."},
        "train_notool": {"math": "Work it out.\n\n{problem}\nEnd with \\boxed{}.", "code": "{problem}\nIn one block."}}

    # the CLI fetches the file at the pinned commit (faked here: no network in tests) and writes one file a set
    seen = []

    def urlopen(url, timeout):
        seen.append(url)
        return contextlib.closing(io.BytesIO(source.encode()))
    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    dl.main(["--templates", "--out", str(tmp_path)])
    assert seen == [f"https://raw.githubusercontent.com/Tianshi-Xu/Open-CLEANER/{dl.OFFICIAL_COMMIT}/"
                    "recipe/cleaner/reward.py"]
    assert sorted(p.name for p in (tmp_path / "prompts").iterdir()) == [
        "official_eval.json", "official_eval_notool.json", "official_train.json", "official_train_notool.json"]
    loaded = rollout.load_prompt_template(str(tmp_path / "prompts" / "official_eval.json"))
    assert loaded == t["eval"]
    assert rollout.make_prompt("Which? A) x B) y", "gpqa", templates=loaded, meta={"domain": "Physics"}) == \
        "A Physics question.\n\nWhich? A) x B) y\n\nA calculator is there.\nEnd with \\boxed{}.\nA letter."

    # a changed official file fails loudly, naming what it could not read
    with pytest.raises(ValueError, match=r"CustomRLHFDataset.map_fn: unknown name 'suffix'"):
        dl.official_templates(source.replace("prompt = lead + problem + hint + end", "prompt = lead + problem + suffix"))
    with pytest.raises(ValueError, match=r"no CustomRLHFDataset\.map_lcb"):
        dl.official_templates(source.replace("def map_lcb", "def map_other"))
    with pytest.raises(ValueError, match="map_fn builds no prompt around the problem"):
        dl.official_templates(source.replace("prompt = lead + problem + hint + end", "prompt = lead + hint"))
