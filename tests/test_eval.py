"""eval.py: pass@k / mean@n / maj@n, the loaders (on synthetic GPQA and LiveCodeBench fixtures),
the JSONL round trip of --score, the error messages, the settings (config.Eval, scripts/eval_*.sh), and the
held-out evaluation of a training run (held_out, summary). Only the model is faked."""
import base64
import dataclasses
import itertools
import json
import os
import pickle
import zlib
from pathlib import Path

import pytest

import config
import eval as ev
from data.benchmarks import decode_lcb_tests
from data.problems import DataError, Problem

# gpqa_synthetic.csv: eight made-up toy questions in the official GPQA CSV columns (no GPQA content).
# gpqa_synthetic.zip: the same CSV as dataset/gpqa_diamond.csv, encrypted like GPQA's dataset.zip
# (`zip -P deserted-untie-orchid`, the password the GPQA README publishes).
FIXTURES = Path(__file__).parent / "fixtures"


# --- pass@k, mean@n, maj@n ---------------------------------------------------------------------------

def brute_pass_at_k(n, c, k):
    """Fraction of all k-subsets of n samples (c correct) that contain a correct one."""
    subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_hand_cases():
    assert ev.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert ev.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert ev.pass_at_k(5, 2, 4) == 1.0                          # every 4-subset holds a correct one
    assert ev.pass_at_k(16, 0, 8) == 0.0
    assert ev.pass_at_k(16, 16, 1) == 1.0
    for n, c, k in [(4, 1, 2), (6, 3, 2), (8, 2, 4), (7, 5, 3), (10, 1, 8)]:
        assert ev.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))
    for n in range(1, 9):
        for c in range(n + 1):
            assert ev.pass_at_k(n, c, 1) == pytest.approx(c / n)
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 2, 5)


def rec(pid, idx, correct, pred="1", bench="aime24", calls=0, errors=0):
    return {"benchmark": bench, "problem_id": pid, "sample_idx": idx, "response": "", "pred": pred,
            "gold": "1", "correct": correct, "num_tool_calls": calls, "num_tool_errors": errors, "saar": False}


def test_summarize_mean_equals_pass1_and_pass_k():
    # p0: 3 of 4 correct, p1: 0 of 4, p2: 1 of 4
    pattern = {"p0": [1, 1, 0, 1], "p1": [0, 0, 0, 0], "p2": [0, 0, 1, 0]}
    records = [rec(p, i, bool(c), pred=str(c), calls=i, errors=int(i == 3)) for p, cs in pattern.items()
               for i, c in enumerate(cs)]
    s = ev.summarize(records)["aime24"]
    assert s["problems"] == 3 and s["n"] == 4
    assert s["mean@n"] == pytest.approx((3 / 4 + 0 + 1 / 4) / 3)
    assert s["pass@k"][1] == pytest.approx(s["mean@n"])
    assert list(s["pass@k"]) == [1, 2, 4]
    assert s["pass@k"][4] == pytest.approx(2 / 3)
    assert s["pass@k"][2] == pytest.approx((ev.pass_at_k(4, 3, 2) + 0 + ev.pass_at_k(4, 1, 2)) / 3)
    assert s["maj@n"] == pytest.approx(1 / 3)  # only p0's majority answer is right
    assert s["tool_calls_per_response"] == pytest.approx(1.5)
    assert s["tool_use_rate"] == pytest.approx(9 / 12)
    assert s["tool_error_rate"] == pytest.approx(3 / 18)


def test_pass_k_list_includes_n_when_not_a_power_of_two():
    records = [rec("p", i, i == 0) for i in range(10)]
    assert list(ev.summarize(records)["aime24"]["pass@k"]) == [1, 2, 4, 8, 10]


def test_maj_at_n_merges_equivalent_answers_and_breaks_ties_by_first_seen():
    # "033" and "33" are one answer (2 votes) and beat "12" (1 vote), although "12" comes first
    samples = [rec("p", 0, False, pred="12"), rec("p", 1, True, pred="033"), rec("p", 2, True, pred="33")]
    assert ev.maj_at_n("aime24", samples)
    tie = [rec("p", 0, False, pred="12"), rec("p", 1, True, pred="33")]
    assert not ev.maj_at_n("aime24", tie)
    assert not ev.maj_at_n("aime24", [rec("p", 0, False, pred=None)])


# --- GPQA loader --------------------------------------------------------------------------------------

def test_gpqa_csv_and_zip_load_the_same_shuffled_problems():
    csv_problems = ev.load_gpqa(str(FIXTURES / "gpqa_synthetic.csv"), seed=0)
    zip_problems = ev.load_gpqa(str(FIXTURES / "gpqa_synthetic.zip"), seed=0)
    assert [(p.id, p.problem, p.answer) for p in csv_problems] == [(p.id, p.problem, p.answer) for p in zip_problems]
    assert len(csv_problems) == 8
    golds = [p.answer for p in csv_problems]
    assert len(set(golds)) > 1 and set(golds) <= set("ABCD")  # the correct answer does not always come first
    first = csv_problems[0]  # synth-001: "what is 2 + 2?", correct answer "4"
    assert f"{first.answer}) 4\n" in first.problem + "\n"
    assert first.task == "gpqa" and first.meta["benchmark"] == "gpqa"
    # the shuffle is fixed by the seed
    assert [p.answer for p in ev.load_gpqa(str(FIXTURES / "gpqa_synthetic.csv"), seed=0)] == golds
    assert len(ev.load_gpqa(str(FIXTURES / "gpqa_synthetic.csv"), limit=3)) == 3


def test_gpqa_errors_name_the_problem_and_never_show_questions(tmp_path):
    with pytest.raises(DataError, match="needs --gpqa-path"):
        ev.load_gpqa("")
    with pytest.raises(DataError, match="GPQA file not found: .*nope.csv"):
        ev.load_gpqa(str(tmp_path / "nope.csv"))
    with pytest.raises(DataError, match="check --gpqa-zip-password"):
        ev.load_gpqa(str(FIXTURES / "gpqa_synthetic.zip"), password="wrong")
    bad = tmp_path / "bad.csv"
    bad.write_text("Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2\nSecret toy question?,1,2,3\n")
    with pytest.raises(DataError, match=r"row 1: missing or empty column 'Incorrect Answer 3'") as e:
        ev.load_gpqa(str(bad))
    assert "Secret toy question" not in str(e.value)


def test_missing_gpqa_file_on_the_command_line(tmp_path):
    with pytest.raises(SystemExit, match="GPQA file not found"):
        ev.main(["--benchmarks", "gpqa", "--gpqa-path", str(tmp_path / "gpqa_diamond.csv")])


# --- LiveCodeBench loader (synthetic rows in the code_generation_lite schema) --------------------------

def pickled(cases) -> str:
    """How LiveCodeBench stores private tests: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def lcb_row(qid, date, public, private, func_name=None, starter=""):
    return {"question_title": f"toy {qid}", "question_content": f"Synthetic toy problem {qid}.",
            "platform": "leetcode" if func_name else "atcoder", "question_id": qid, "contest_id": "toy",
            "contest_date": date, "starter_code": starter, "difficulty": "easy",
            "public_test_cases": json.dumps(public), "private_test_cases": private,
            "metadata": json.dumps({"func_name": func_name} if func_name else {})}


def write_lcb(folder: Path, rows, name="test.jsonl"):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return folder


def stdin_case(i, o):
    return {"input": i, "output": o, "testtype": "stdin"}


def func_case(i, o):
    return {"input": i, "output": o, "testtype": "functional"}


@pytest.fixture()
def lcb_dir(tmp_path):
    d = tmp_path / "lcb"
    write_lcb(d, [
        lcb_row("s1", "2025-03-10T00:00:00", [stdin_case("2 3\n", "5\n")],
                pickled([stdin_case("10 20\n", "30\n"), stdin_case("-1 1\n", "0\n")])),
        lcb_row("old", "2024-11-01T00:00:00", [stdin_case("1\n", "1\n")], json.dumps([])),
        # ~100 KB of output: more than a default Sandbox keeps, so grading must not cut it
        lcb_row("b1", "2025-04-15T00:00:00", [stdin_case("50000\n", "7\n" * 50000)], pickled([])),
    ])
    write_lcb(d, [
        lcb_row("f1", "2025-05-31T00:00:00", [func_case("[1, 2]\n3", "[4, 5]")],
                json.dumps([func_case("[]\n1", "[]")]), func_name="addUp",
                starter="class Solution:\n    def addUp(self, nums: List[int], k: int) -> List[int]:\n        "),
        lcb_row("late", "2025-06-01T00:00:00", [stdin_case("1\n", "1\n")], json.dumps([])),
    ], name="test2.jsonl")
    return d


def test_lcb_loader_window_and_tests(lcb_dir):
    problems = ev.load_lcb(str(lcb_dir), "2025-02", "2025-05")
    assert [p.id for p in problems] == ["s1", "b1", "f1"]
    s1, _, f1 = problems
    assert s1.tests == [{"input": "2 3\n", "output": "5\n"}, {"input": "10 20\n", "output": "30\n"},
                        {"input": "-1 1\n", "output": "0\n"}]  # public + unpickled private
    assert f1.tests == {"call": "addUp", "cases": [{"input": "[1, 2]\n3", "output": "[4, 5]"},
                                                   {"input": "[]\n1", "output": "[]"}]}
    assert "def addUp" in f1.problem and "stdin" in s1.problem
    assert [p.id for p in ev.load_lcb(str(lcb_dir), "2024-01", "2025-12")] == ["s1", "old", "b1", "f1", "late"]
    assert [p.id for p in ev.load_lcb(str(lcb_dir), ids={"late"})] == ["late"]


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.flag}",))


def test_lcb_restricted_unpickler_refuses_code(tmp_path):
    evil = _Evil()
    evil.flag = tmp_path / "pwned"
    payload = base64.b64encode(zlib.compress(pickle.dumps(evil))).decode()
    d = write_lcb(tmp_path / "lcb", [lcb_row("x1", "2025-03-01T00:00:00", [stdin_case("1\n", "1\n")], payload)])
    with pytest.raises(DataError, match=r"test.jsonl:1: private test cases: refusing to unpickle global (posix|os)\.system"):
        ev.load_lcb(str(d))
    assert not evil.flag.exists()
    # plain containers are fine, pickled directly or as a JSON string
    plain = base64.b64encode(zlib.compress(pickle.dumps([{"input": "1", "output": "1"}]))).decode()
    assert decode_lcb_tests(plain) == [{"input": "1", "output": "1"}]


def test_lcb_errors(tmp_path):
    with pytest.raises(DataError, match="needs --lcb-dir"):
        ev.load_lcb("")
    with pytest.raises(DataError, match="no LiveCodeBench test\\*.jsonl files"):
        ev.load_lcb(str(tmp_path))
    d = write_lcb(tmp_path / "x", [lcb_row("f", "2025-03-01T00:00:00", [func_case("1", "1")], "[]")])
    with pytest.raises(DataError, match="test.jsonl:1: functional problem without metadata.func_name"):
        ev.load_lcb(str(d))


# --- records, --score, CLI errors -----------------------------------------------------------------------

def test_unknown_benchmark_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown benchmark 'aime26'; known: aime24, aime25, gpqa, lcb"):
        ev.main(["--benchmarks", "aime24,aime26"])


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_malformed_jsonl_lines_are_named(tmp_path):
    good = {"benchmark": "aime24", "problem_id": "a", "sample_idx": 0, "response": r"\boxed{1}", "gold": "1",
            "num_tool_calls": 0, "num_tool_errors": 0, "saar": False}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"r.jsonl:2: malformed JSON line"):
        ev.main(["--score", str(path)])
    write_jsonl(path, [good, {k: v for k, v in good.items() if k != "response"}])
    with pytest.raises(SystemExit, match=r"r.jsonl:2: missing field 'response'"):
        ev.main(["--score", str(path)])
    write_jsonl(path, [dict(good, sample_idx="0")])
    with pytest.raises(SystemExit, match=r"r.jsonl:1: field 'sample_idx' must be int, got str"):
        ev.main(["--score", str(path)])
    write_jsonl(path, [dict(good, benchmark="mmlu")])
    with pytest.raises(SystemExit, match=r"r.jsonl:1: unknown benchmark 'mmlu'"):
        ev.main(["--score", str(path)])
    with pytest.raises(SystemExit, match="responses file not found"):
        ev.main(["--score", str(tmp_path / "missing.jsonl")])


def fake_generate(args, problems):
    """Stands in for the model: sample 0 answers right (with a leading zero), sample 1 answers 0;
    every other problem gets one failed tool call. Graded as generate's records are (eval's own grader)."""
    records = []
    for j, p in enumerate(problems):
        for i in range(ev.BENCHMARKS[p.meta["benchmark"]].n(args.bench)):
            text = rf"Thinking... \boxed{{0{p.answer}}}" if i == 0 else r"I give up: \boxed{0}"
            records.append({"benchmark": p.meta["benchmark"], "problem_id": p.id, "sample_idx": i, "response": text,
                            "num_tool_calls": j % 2, "num_tool_errors": j % 2, "saar": args.saar.saar == "on",
                            "meta": {"finish_reason": "stop"}})
    return ev.grade_records(records, {(p.meta["benchmark"], p.id): p for p in problems}, args.bench)


def test_eval_then_score_reproduces_the_numbers(shared_data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run.jsonl"
    monkeypatch.setattr(ev, "generate", fake_generate)
    first = ev.main(["--model", "smollm2-135m", "--benchmarks", "aime24", "--n", "2", "--limit", "3",
                     "--data-dir", str(shared_data), "--out", str(out)])
    printed = capsys.readouterr().out
    s = first["aime24"]
    assert (s["problems"], s["n"]) == (3, 2)
    assert s["mean@n"] == pytest.approx(0.5) and s["pass@k"][2] == pytest.approx(1.0)
    assert s["tool_use_rate"] == pytest.approx(1 / 3) and s["tool_error_rate"] == pytest.approx(1.0)
    assert "aime24: 3 problems x 2 samples" in printed and "mean@2" in printed and "maj@2" in printed

    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6
    assert set(lines[0]) == {"benchmark", "problem_id", "sample_idx", "response", "pred", "gold", "correct",
                             "num_tool_calls", "num_tool_errors", "saar", "meta"}
    assert lines[0]["pred"] == "0" + lines[0]["gold"] and lines[0]["correct"] is True
    assert lines[1]["correct"] is False

    # --score re-grades from response + gold alone, even after pred/correct are tampered with
    for r in lines:
        r["correct"], r["pred"] = not r["correct"], None
    write_jsonl(out, lines)
    again = ev.main(["--score", str(out)])
    assert again == first
    assert capsys.readouterr().out.strip() == printed.split("responses:")[0].strip()


def test_lcb_records_are_scored_in_the_sandbox(lcb_dir, tmp_path, capsys):
    right_stdin = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    right_func = "```python\nclass Solution:\n    def addUp(self, nums, k):\n        return [x + k for x in nums]\n```"
    wrong = "```python\nprint(0)\n```"
    right_big = "```python\nprint('\\n'.join(['7'] * int(input())))\n```"
    records = [
        {"benchmark": "lcb", "problem_id": "s1", "sample_idx": 0, "response": right_stdin},
        {"benchmark": "lcb", "problem_id": "s1", "sample_idx": 1, "response": wrong},
        {"benchmark": "lcb", "problem_id": "f1", "sample_idx": 0, "response": right_func},
        {"benchmark": "lcb", "problem_id": "f1", "sample_idx": 1, "response": right_func},
        {"benchmark": "lcb", "problem_id": "b1", "sample_idx": 0, "response": right_big},
        {"benchmark": "lcb", "problem_id": "b1", "sample_idx": 1, "response": right_big},
    ]
    for r in records:
        r.update(gold=None, num_tool_calls=0, num_tool_errors=0, saar=True)
    path = tmp_path / "lcb.jsonl"
    write_jsonl(path, records)
    s = ev.main(["--score", str(path), "--lcb-dir", str(lcb_dir), "--out", str(tmp_path / "graded.jsonl")])["lcb"]
    assert s["problems"] == 3
    assert s["mean@n"] == pytest.approx((0.5 + 1 + 1) / 3) and s["pass@k"][2] == pytest.approx(1.0) and s["maj@n"] is None
    graded = [json.loads(x) for x in (tmp_path / "graded.jsonl").read_text().splitlines()]
    assert [g["correct"] for g in graded] == [True, False, True, True, True, True]
    assert graded[0]["pred"].startswith("a, b = map") and graded[0]["gold"] is None
    write_jsonl(path, [dict(records[0], problem_id="zzz")])
    with pytest.raises(SystemExit, match="lcb problems not found"):
        ev.main(["--score", str(path), "--lcb-dir", str(lcb_dir)])


# --- settings: config.Eval, the scripts' flags ------------------------------------------------------------

def script_flags(path: Path) -> list[str]:
    """The eval.py arguments of a scripts/eval_*.sh, its ${VAR:-default}s at their defaults."""
    import re
    import shlex
    text = path.read_text().replace("\\\n", " ")
    line = re.search(r"python eval\.py (.*)", text).group(1)
    return shlex.split(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", line).replace('"$@"', ""))


def test_the_eval_scripts_flags_parse_to_the_papers_settings():
    root = Path(__file__).resolve().parents[1] / "scripts"
    scripts = {p.name: p for p in root.glob("eval_*.sh")}
    assert "python eval.py" not in scripts.pop("eval_demyagent_4b.sh").read_text()  # it runs the cleaner one
    assert len(scripts) == 4
    for name, path in scripts.items():
        a = config.cli(config.Eval, "", script_flags(path))
        assert (a.bench.n, a.bench.lcb_n) == ((32 if "7b" in name else 16), 10), name
        r = a.rollout
        assert (r.temperature, r.top_p, r.max_turns, r.max_response_tokens, a.saar.saar) == (1.0, 0.6, 16, 20480, "paper")
        # hermes, as the training scripts write it: a checkpoint is evaluated in the format it was trained in
        assert r.tool_format == ("none" if "notool" in name else "hermes") and a.engine.engine == "sglang"
        # --faithful: every official choice eval.py has
        assert r.tool_echo and r.tool_header and r.repair_json and not r.tool_cap_ends and not r.last_turn_calls
        assert a.saar.sim_eos and a.bench.lcb_grader == "official" and a.common.model.endswith("/hf")


def test_bad_choices_get_tyros_error(capsys):
    for argv in (["--saar", "maybe"], ["--lcb-grader", "nvidia"], ["--tool-format", "json"], ["--sim-on", "text"]):
        with pytest.raises(SystemExit) as e:
            ev.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and argv[0] in err, (argv, err[-500:])


def test_faithful_sets_the_official_rollout(monkeypatch):
    monkeypatch.setattr(ev, "evaluate", lambda args: args)
    faithful = config.flat(ev.main(["--faithful", "--benchmarks", "aime24"]))
    mine = {k: v for k, v in config.FAITHFUL.items() if k in faithful}
    assert set(mine) == {"tool_echo", "tool_header", "repair_json", "tool_cap_ends", "last_turn_calls", "sim_eos",
                         "lcb_grader", "tool_clock"}
    assert {k: faithful[k] for k in mine} == mine
    assert {k: config.flat(ev.main(["--benchmarks", "aime24"]))[k] for k in mine} != mine  # the control: not set


# --- generation -------------------------------------------------------------------------------------------

def test_generate_passes_its_settings_to_the_rollout(monkeypatch):
    """Every rollout, SAAR and sandbox setting of eval.py reaches the rollout: the config.Rollout with its tool
    format and budget resolved, the config.Saar when test-time SAAR is on (rollback_p 1.0), the sandbox's limits."""
    import rollout
    seen = []

    async def capture(engine, sandbox, tok, problems, cfg, saar=None, **kw):
        seen.append(dict(cfg=cfg, saar=saar, sandbox=(sandbox.slots, sandbox.timeout_s, sandbox.memory_mb), **kw))
        return [], []

    monkeypatch.setattr(rollout, "rollout_and_grade", capture)
    prob = Problem(id="p", problem="What is 1 + 1?", answer="2", task="math", tests=None, meta={"benchmark": "aime24"})
    argv = ["--model", "tiny-qwen3", "--benchmarks", "aime24", "--n", "3", "--saar", "both", "--gamma", "0.7",
            "--max-retries", "2", "--sim-eos", "--tool-echo", "--repair-json", "--no-tool-cap-ends",
            "--max-tool-calls", "7", "--max-new-tokens", "64", "--tool-timeout-s", "3", "--sandbox-slots", "1",
            "--tool-memory-mb", "512", "--error-format", "last_line", "--seed", "5"]
    assert ev.generate(config.cli(config.Eval, "", argv), [prob]) == []
    assert [s["saar"] is None for s in seen] == [True, False]  # --saar both: off, then on
    cfg, s = seen[1]["cfg"], seen[1]["saar"]
    assert (s.gamma, s.max_retries, s.sim_eos, s.sim_on) == (0.7, 2, True, "call") and s.rollback_p == 1.0
    assert cfg.tool_echo and cfg.repair_json and cfg.tool_cap_ends is False and cfg.max_tool_calls == 7
    assert (cfg.tool_format, cfg.max_response_tokens, cfg.error_format) == ("hermes", 64, "last_line")
    assert (cfg.temperature, cfg.top_p, cfg.max_turns) == (1.0, 0.6, 16)  # the paper's evaluation
    assert seen[0]["sandbox"] == (1, 3.0, 512) and seen[0]["n"] == 3 and seen[0]["seeds"] == [5_000_015, 5_000_016, 5_000_017]
    seen.clear()
    ev.generate(config.cli(config.Eval, "", ["--model", "tiny-qwen3", "--tool-format", "none", "--saar", "off"]), [prob])
    import torch
    budget = 20480 if torch.cuda.is_available() else 1024  # --max-new-tokens 0: by device
    assert (seen[0]["cfg"].tool_format, seen[0]["cfg"].max_response_tokens) == ("none", budget)


def test_generate_rolls_out_and_grades_each_sample_as_score_does(monkeypatch):
    """generate rolls out with the scripted model (the only fake) and grades every sample with eval's own
    grader: the records hold pred, gold and correct, the same as --score's re-grading gives."""
    from machinery import engines
    from fakes import ScriptedEngine
    script = ["So \\boxed{2}.<|im_end|>", "\\boxed{3}<|im_end|>", "\\boxed{007}<|im_end|>", "no answer<|im_end|>"]
    monkeypatch.setattr(engines, "build_engine", lambda kind, tok, **kw: ScriptedEngine(tok, script))
    monkeypatch.setitem(ev.BENCHMARKS, "toy", ev.Benchmark("math", lambda b: [], lambda b: 2, True))
    probs = [Problem(id=i, problem=q, answer=a, task="math", meta={"benchmark": "toy"})
             for i, q, a in (("t1", "What is 1 + 1?", "2"), ("t2", "What is 3 + 4?", "7"))]
    args = config.cli(config.Eval, "", ["--model", "tiny-qwen3", "--benchmarks", "toy", "--saar", "paper",
                                        "--max-new-tokens", "64", "--grade-workers", "2"])
    records = ev.generate(args, probs)
    assert [(r["problem_id"], r["sample_idx"]) for r in records] == [("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)]
    assert [r["pred"] for r in records] == ["2", "3", "007", None]
    assert [r["correct"] for r in records] == [True, False, True, False]
    assert [r["gold"] for r in records] == ["2", "2", "7", "7"] and all(r["saar"] for r in records)
    assert records[0]["response"] == "So \\boxed{2}." and records[0]["meta"]["finish_reason"] == "answer"
    again = [{k: v for k, v in r.items() if k not in ("pred", "correct")} for r in records]
    assert ev.grade_records(again, {}, args.bench) == records


def test_a_benchmark_is_one_registry_entry(monkeypatch, tmp_path, capsys):
    """Adding a benchmark is one entry of eval.BENCHMARKS: parsing, samples per problem, the paper's test-time
    SAAR setting, grading and the tables all follow it; nothing else names benchmarks."""
    prob = Problem(id="t1", problem="What is 1 + 1?", answer="2", task="math", tests=None, meta={"benchmark": "toy"})
    monkeypatch.setitem(ev.BENCHMARKS, "toy", ev.Benchmark("math", lambda b: [prob], lambda b: 3, False))
    b = config.Bench(benchmarks="toy")
    assert ev.parse_benchmarks("toy") == ["toy"] and ev.BENCHMARKS["toy"].load(b) == [prob]
    assert ev.BENCHMARKS["toy"].n(b) == 3 and ev.saar_settings(config.EvalSaar(saar="paper"), "toy") == [False]
    path = tmp_path / "toy.jsonl"
    recs = [dict(benchmark="toy", problem_id="t1", sample_idx=i, response=r, gold="2", num_tool_calls=0,
                 num_tool_errors=0, saar=False) for i, r in enumerate(["\\boxed{2}", "\\boxed{3}", "\\boxed{2}"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = ev.main(["--score", str(path)])
    assert summary["toy"]["mean@n"] == pytest.approx(2 / 3) and summary["toy"]["maj@n"] == 1.0


# --- the held-out evaluation of a training run (train.py calls held_out, format_eval, summary) ---------------

# (tok and sb: tests/conftest.py)

def call(code: str) -> str:
    return "Let me compute.\n<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + \
        "\n</tool_call>"


HELD_OUT = [Problem(id="a", problem="What is 1 + 1?", answer="2", task="math"),
            Problem(id="b", problem="What is 3 + 4?", answer="7", task="math")]


def held_out(tok, sb, script, out_dir, step=0, **settings):
    """eval.held_out as train.py calls it, on one process, with the scripted model; returns (metrics, engine)."""
    import asyncio

    import reward
    from fakes import ScriptedEngine

    class Recording(ScriptedEngine):  # the scripted model, noting each request's temperature
        temps: list = []

        async def generate(self, input_ids, params):
            self.temps.append(params.temperature)
            return await super().generate(input_ids, params)

    args = config.replace(config.Train(), model="tiny-qwen3", **settings)
    cfg = dataclasses.replace(args.rollout, tool_format="hermes")
    grade = lambda p, tr: reward.grade(p.task, tr.final_text(tok), answer=p.answer, sandbox=sb)  # noqa: E731
    eng, loop = Recording(tok, script), asyncio.new_event_loop()
    try:
        m = ev.held_out(loop, eng, sb, tok, HELD_OUT, args, step=step, out_dir=out_dir, rollout_cfg=cfg,
                        templates=None, grade=grade, rank=0, world=1)
    finally:
        loop.close()
    assert not eng.turns, "the script has turns left"
    return m, eng


def eval_rows(folder: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (folder / f"eval_step{step:06d}.jsonl").read_text().splitlines()]


def test_held_out_greedy_with_and_without_test_time_saar(tok, sb, tmp_path):
    """--eval-saar both: problem b's call fails; without SAAR the model calls it again, fails again and answers
    wrong, with SAAR the failed call is purified and the retried one leads to the right answer. The records are per
    problem, the tool errors those of first attempts (SAAR's retries excluded), and every request is greedy."""
    off = ["\\boxed{2}<|im_end|>", call("print(1/0)"), call("print(1/0)"), "So \\boxed{0}.<|im_end|>"]
    on = ["\\boxed{2}<|im_end|>", call("print(1/0)"), call("print(3 + 4)"), "So \\boxed{7}.<|im_end|>"]
    m, eng = held_out(tok, sb, off + on, str(tmp_path), eval_saar="both")
    assert (m["eval_greedy_acc"], m["eval_greedy_saar_acc"]) == (0.5, 1.0)
    assert m["eval_greedy_tool_err"] == m["eval_greedy_saar_tool_err"] == 1.0  # the purified call's first attempt
    assert (m["eval_greedy_tool_calls"], m["eval_greedy_saar_tool_calls"]) == (1.0, 0.5) and m["t_eval"] > 0
    assert set(eng.temps) == {0.0}
    rows = eval_rows(tmp_path, 0)
    assert [{k: r[k] for k in ("id", "ok", "calls", "errors", "eval")} for r in rows] == [
        dict(id="a", ok=True, calls=0, errors=0, eval="eval_greedy"), dict(id="b", ok=False, calls=2, errors=2, eval="eval_greedy"),
        dict(id="a", ok=True, calls=0, errors=0, eval="eval_greedy_saar"),
        dict(id="b", ok=True, calls=1, errors=1, eval="eval_greedy_saar")]
    # each record holds the trajectory a reader (machinery/report.py) shows: its text, the masked ranges, SAAR's events
    assert rows[0]["response"] == "\\boxed{2}<|im_end|>" and rows[0]["masked"] == [] and rows[0]["saar_events"] == []
    assert [e["kind"] for e in rows[3]["saar_events"]] == ["shallow"] and rows[1]["saar_events"] == []
    assert "Error" in rows[1]["response"] and len(rows[1]["masked"]) == 2  # both failed calls' errors stay
    assert ev.format_eval(m) == "greedy acc 0.500 tool_err 1.00 | greedy_saar acc 1.000 tool_err 1.00"
    # a later evaluation of the same step (--eval-only --eval-saar on) replaces its own kind and keeps the others
    m2, _ = held_out(tok, sb, ["\\boxed{5}<|im_end|>", "\\boxed{5}<|im_end|>"], str(tmp_path), eval_saar="on")
    assert set(m2) == {"eval_greedy_saar_acc", "eval_greedy_saar_tool_err", "eval_greedy_saar_tool_calls", "t_eval"}
    assert [(r["eval"], r["ok"]) for r in eval_rows(tmp_path, 0)] == [
        ("eval_greedy", True), ("eval_greedy", False), ("eval_greedy_saar", False), ("eval_greedy_saar", False)]


def test_held_out_sampled_at_the_rollout_temperature(tok, sb, tmp_path):
    m, eng = held_out(tok, sb, ["\\boxed{2}<|im_end|>", "\\boxed{1}<|im_end|>"] * 2, None, eval_sampled=True,
                      temperature=0.8)
    assert eng.temps == [0.0, 0.0, 0.8, 0.8]
    assert m["eval_greedy_acc"] == m["eval_sampled_acc"] == 0.5 and not list(tmp_path.iterdir())  # no out_dir: no file


def test_paired_ci():
    # 20 problems: 6 gained, 1 lost, 13 unchanged -> +25 pts; sd of d over n-1
    before = [False] * 6 + [True] + [True] * 5 + [False] * 8
    after = [True] * 6 + [False] + [True] * 5 + [False] * 8
    mean, lo, hi = ev.paired_ci(before, after)
    d = [1.0] * 6 + [-1.0] + [0.0] * 13
    sd = (sum((x - 0.25) ** 2 for x in d) / 19) ** 0.5
    assert mean == pytest.approx(0.25) and hi - mean == pytest.approx(mean - lo) == pytest.approx(1.96 * sd / 20 ** 0.5)
    assert ev.paired_ci([True] * 5, [True] * 5) == (0.0, 0.0, 0.0)


def test_summary_lines_and_file(tmp_path):
    """The run's closing lines, to the character: the held-out gain per kind with its paired CI, over the problems
    evaluated at both ends, and the training reward's first and last thirds (a step repeated by --resume counts
    once, with its last line). A kind evaluated at one end only has no line."""
    before = [False] * 6 + [True] * 6 + [False] * 8
    after = [True] * 6 + [False] + [True] * 5 + [False] * 8
    write = lambda step, oks, kind, errs: (tmp_path / f"eval_step{step:06d}.jsonl").open("a").writelines(  # noqa: E731
        json.dumps(dict(id=f"p{i}", ok=ok, calls=2, errors=e, eval=kind)) + "\n" for i, (ok, e) in enumerate(zip(oks, errs)))
    write(0, before, "eval_greedy", [1] * 20)
    write(0, before[:4], "eval_greedy_saar", [0] * 4)
    write(6, after, "eval_greedy", [0] * 19 + [1])
    write(6, after[:3], "eval_greedy_saar", [0] * 3)
    write(6, after, "eval_sampled", [0] * 20)  # at the end only
    rewards = {1: -0.5, 2: 9.0, 3: 0.25, 4: 0.0, 5: 0.125, 6: 0.5}
    rows = [dict(step=0, eval_greedy_acc=0.3)] + [dict(step=s, reward=r) for s, r in rewards.items()] + \
        [dict(step=2, reward=-0.25)]  # step 2 again, after a --resume
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ev.summary(str(tmp_path), 6)
    assert lines == [
        "held-out accuracy 0.30 -> 0.55 (+25 pts, 95% CI +1..+49, 20 problems, greedy); tool errors per call 0.50 -> 0.03",
        "held-out accuracy 0.00 -> 1.00 (+100 pts, 95% CI +100..+100, 3 problems, greedy, test-time SAAR); tool errors "
        "per call 0.00 -> 0.00",
        "training reward, mean of the first 2 steps -0.375 -> of the last 2 +0.312"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["lines"] == lines and set(saved) == {"eval_greedy", "eval_greedy_saar", "train_reward", "lines"}
    assert saved["eval_greedy"]["n"] == 20 and saved["train_reward"] == dict(first_third=-0.375, last_third=0.3125, steps=6)
    assert ev.summary(str(tmp_path), 0) == [] and ev.summary(str(tmp_path), 5) == []  # nothing to compare


def test_score_reads_both_test_time_saar_settings_and_refuses_a_duplicate(tmp_path):
    """--saar both writes each sample twice, SAAR off and on: --score re-grades both tables; the same sample twice
    in one setting is refused."""
    good = {"benchmark": "aime24", "problem_id": "a", "sample_idx": 0, "response": r"\boxed{1}", "gold": "1",
            "num_tool_calls": 0, "num_tool_errors": 0, "saar": False}
    path = tmp_path / "both.jsonl"
    write_jsonl(path, [good, dict(good, saar=True, response=r"\boxed{2}")])
    s = ev.main(["--score", str(path)])
    assert (s["aime24 saar=off"]["mean@n"], s["aime24 saar=on"]["mean@n"]) == (1.0, 0.0)
    write_jsonl(path, [good, dict(good, response=r"\boxed{2}")])
    with pytest.raises(SystemExit, match=r"both.jsonl:2: duplicate sample \('aime24', 'a', 0, False\)"):
        ev.main(["--score", str(path)])
