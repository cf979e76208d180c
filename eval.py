"""eval.py: AIME24/25, GPQA-Diamond and LiveCodeBench-v6, scored as the CLEANER paper scores them.

    python eval.py --model M --benchmarks aime24,aime25,gpqa,lcb [--n 16] [--saar paper|on|off|both]
    python eval.py --score out/eval/M.jsonl          # re-grade saved responses, no model needed

Paper setup (official eval scripts): sampling temperature 1.0, top_p 0.6, 16 samples a problem (the
7B runs use 32, LiveCodeBench 10), tool calls on, up to 16 turns, SAAR at test time on or off. The
paper reports average pass@1 (mean@n); we also print the unbiased pass@k for k = 1, 2, 4, ..., n
(Chen et al. 2021), maj@n for answer benchmarks, and how often the model called the tool and how
often those calls failed. Grading is reward.py's, the same code as the training reward.

Per-record JSONL schema (one line per sampled response):
    benchmark        "aime24" | "aime25" | "gpqa" | "lcb"
    problem_id       str, the problem's id in its source (LiveCodeBench: question_id)
    sample_idx       int, 0..n-1
    response         str, the final assistant text (what the grader reads)
    pred             str | null, what the grader extracted: boxed answer / option letter / code block
    gold             str | null, gold answer or letter; null for lcb (tests are re-read by problem_id)
    correct          bool
    num_tool_calls   int, tool calls in the trajectory
    num_tool_errors  int, of those, calls whose execution failed
    saar             bool, whether SAAR was on while generating
    meta             object, free (finish reason, lengths, ...)
`--score FILE` recomputes pred and correct from response + gold (lcb: + tests from --lcb-dir) and
prints the same tables.

Data: AIME from JSONL (data/problems.py; ../shared/data or data/download.py). GPQA-Diamond from a
file the user provides (official CSV, hub parquet, the password-protected dataset.zip, or the JSONL
data/download.py writes): its authors ask that the questions never appear in plain text online, so
they are never logged, and tests use synthetic look-alikes. The four choices are shuffled per
question with a fixed seed, since the correct one comes first in the source. LiveCodeBench from a
directory of its release `test*.jsonl` files, kept to a contest-date window (v6 in the paper:
2025-02 to 2025-05). Both are converted by data/benchmarks.py, as data/download.py converts them.

Departures: the official code reads preformatted parquet files (Open-AgentRL-Eval) and grades math
with verl's math_dapo string normaliser; we read the public sources and grade with math-verify (see
reward.py). The response budget defaults to the paper's 20480 tokens on a GPU but 1024 on the CPU
(`--max-new-tokens` sets it; scripts/eval_*.sh pass 20480). LiveCodeBench is graded by our strict grader
unless `--lcb-grader official` (set by --faithful, so by scripts/eval_*.sh) asks for LiveCodeBench's own
harness rules (reward.py lists them).

Answers out of reach: the sandboxes that run the model's tool calls and grade its code hide this run's
data folders (data_folders: the LiveCodeBench dir, the GPQA file's folder, the data dir, the responses
files' folders) besides the checkout and ../shared/data; that takes bwrap. Without bwrap they stay
readable to the code, answers included (sandbox.py says what each layer covers).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import reward
from data.benchmarks import gpqa_problem, lcb_in_window, lcb_problem, read_gpqa_rows
from data.problems import DataError, Problem, load_named

REPO_ROOT = Path(__file__).resolve().parent


@dataclass
class Args:
    # --- what to evaluate
    model: str = "smollm2-135m"
    """model name or path (resolved by data/models.py)"""
    benchmarks: str = "aime24,aime25,gpqa,lcb"
    """comma-separated benchmarks, of BENCHMARKS: aime24, aime25, gpqa, lcb"""
    limit: int = 0
    """evaluate only the first N problems of each benchmark (0: all)"""
    score: str = ""
    """re-grade this saved JSONL of responses and print its tables (no model is loaded)"""
    out: str = ""
    """write graded responses here as JSONL (default out/eval/<model>.jsonl; with --score: none)"""
    # --- sampling (paper: temperature 1.0, top_p 0.6, n=16; 7B runs n=32; LiveCodeBench n=10)
    n: int = 16
    """samples per problem for aime24/aime25/gpqa"""
    lcb_n: int = 10
    """samples per problem for lcb"""
    temperature: float = 1.0
    """sampling temperature"""
    top_p: float = 0.6
    """nucleus sampling threshold"""
    max_new_tokens: int = 0
    """response token budget of one trajectory (0: the paper's 20480 on a GPU, 1024 on the CPU, where
    decoding a 135M model at 8k context runs at a few tokens/s)"""
    seed: int = 0
    """sampling seed"""
    # --- rollout
    faithful: bool = False
    """the official code's rollout wherever ours differs (FAITHFUL, below Args; README: Departures); it overrides them"""
    tools: bool = True
    """let the model call the Python tool"""
    saar: str = "paper"
    """test-time SAAR: paper (on for AIME/GPQA, off for LCB, as the official eval scripts), on, off, both"""
    tool_format: str = "auto"
    """hermes, markdown, or auto (hermes when the tokenizer has a <tool_call> token)"""
    prompt_template: str = ""
    """a JSON file of prompt templates by task and an optional system prompt (as train.py --prompt-template)"""
    max_turns: int = 16
    """most assistant turns in one trajectory"""
    max_tool_calls: int = 30
    """tool executions per trajectory, SAAR retries included"""
    tool_cap_ends: bool = True
    """reaching --max-tool-calls ends the trajectory; --no-tool-cap-ends: only SAAR stops (the official code)"""
    last_turn_calls: bool = True
    """a call in the last allowed turn runs; --no-last-turn-calls: the trajectory ends there (the official code)"""
    tool_echo: bool = False
    """a call also prints the repr of its final bare expression when not None (the official tool)"""
    tool_header: bool = False
    """tool output headed by a success or failure line, its streams labelled (the official tool's layout)"""
    repair_json: bool = False
    """parse hermes calls with json_repair, as the official parser does"""
    tool_timeout_s: float = 4.0
    """per-call time limit of the model's tool"""
    gamma: float = 0.5
    """test-time SAAR: similarity threshold, >= gamma shallow (keep the old reasoning), else deep"""
    max_retries: int = 3
    """test-time SAAR: regenerations per failed turn before giving up"""
    sim_on: str = "call"
    """test-time SAAR: similarity on the decoded call text (official code) or on the extracted code"""
    sim_eos: bool = False
    """test-time SAAR: the call text runs to the end of the turn, <|im_end|> included (official)"""
    engine: str = "hf"
    """hf (transformers) or sglang (GPU)"""
    engine_batch: int = 32
    """most sequences the HF engine decodes at once"""
    sglang_mem_fraction: float = 0.8
    """GPU memory share of the SGLang engine (the official eval: 0.8)"""
    device: str = "auto"
    """cpu, cuda, or auto"""
    # --- data
    data_dir: str = ""
    """folder with aime24.jsonl / aime25.jsonl (default: $CLEANER_DATA or ../shared/data)"""
    gpqa_path: str = ""
    """GPQA-Diamond file you provide: gpqa_diamond.csv, its hub parquet, or GPQA's dataset.zip"""
    gpqa_zip_password: str = "deserted-untie-orchid"
    """password of GPQA's dataset.zip, as published in the GPQA README"""
    gpqa_seed: int = 0
    """seed of the per-question choice shuffle"""
    lcb_dir: str = ""
    """folder with LiveCodeBench release files test*.jsonl (code_generation_lite)"""
    lcb_start: str = "2025-02"
    """first contest month (YYYY-MM) kept from LiveCodeBench"""
    lcb_end: str = "2025-05"
    """last contest month (YYYY-MM) kept from LiveCodeBench"""
    # --- grading
    code_timeout_s: float = 6.0
    """per-test time limit for code (LiveCodeBench's default)"""
    grade_workers: int = 4
    """responses graded in parallel (code runs in the sandbox)"""
    lcb_grader: str = "strict"
    """LiveCodeBench grading: strict (ours: each test in a fresh process) or official (LiveCodeBench's harness:
    its code extraction, exits, stdin and comparisons; reward.py)"""


SAAR_MODES = ("paper", "on", "off", "both")
# --faithful: the official code's rollout choices where our defaults differ (train.py has its own, with the update's)
FAITHFUL = dict(tool_echo=True, tool_header=True, repair_json=True, tool_cap_ends=False, last_turn_calls=False,
                sim_eos=True, lcb_grader="official")


class EvalError(ValueError):
    """Bad input to the evaluation (file, line, field named in the message)."""


def parse_benchmarks(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise EvalError("--benchmarks is empty; choose from " + ", ".join(BENCHMARKS))
    for name in names:
        if name not in BENCHMARKS:
            raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------------------
# Loaders: each returns Problems with meta["benchmark"] set; `problem` is the text the model sees
# (GPQA: question and lettered choices; LiveCodeBench: statement plus its I/O contract).
# ---------------------------------------------------------------------------------------------------

def load_aime(name: str, data_dir: str = "", limit: int = 0) -> list[Problem]:
    try:
        problems = load_named(name, data_dir or None, limit=limit or None, task="math")
    except (FileNotFoundError, DataError) as e:
        raise EvalError(f"{name}: {e}") from None
    for p in problems:
        p.meta["benchmark"] = name
    return problems


def load_gpqa(path: str, seed: int = 0, limit: int = 0, password: str = "deserted-untie-orchid") -> list[Problem]:
    """GPQA-Diamond with the choices of each question shuffled by Random(f"{seed}:{record id}")
    (data/benchmarks.py)."""
    if not path:
        raise EvalError("the gpqa benchmark needs --gpqa-path: the official gpqa_diamond.csv, the hub parquet, "
                        "or GPQA's password-protected dataset.zip (it is not bundled: its authors ask that "
                        "the questions not be redistributed)")
    try:
        rows = read_gpqa_rows(path, password)
    except (FileNotFoundError, DataError) as e:
        raise EvalError(str(e).replace("the zip password", "--gpqa-zip-password")) from None
    if not rows:
        raise EvalError(f"{path}: no rows")
    problems = []
    for i, row in enumerate(rows, start=1):
        try:
            problems.append(gpqa_problem(row, seed, index=i))
        except DataError as e:
            raise EvalError(f"{path}: row {i}: {e}") from None
        if limit and len(problems) >= limit:
            break
    return problems


def load_lcb(lcb_dir: str, start: str = "2025-02", end: str = "2025-05", limit: int = 0,
             ids: set[str] | None = None) -> list[Problem]:
    """LiveCodeBench problems with start <= contest month <= end (or exactly `ids`, for --score)."""
    if not lcb_dir:
        raise EvalError("the lcb benchmark needs --lcb-dir: a folder with LiveCodeBench's test*.jsonl "
                        "release files (livecodebench/code_generation_lite)")
    d = Path(lcb_dir)
    files = sorted(d.glob("test*.jsonl")) if d.is_dir() else []
    if not files:
        raise EvalError(f"no LiveCodeBench test*.jsonl files in {d}")
    for m in (start, end):
        if not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", m):
            raise EvalError(f"LiveCodeBench window bounds must look like 2025-02 or 2025-02-15, got {m!r}")
    problems, seen = [], set()
    for path in files:
        for where, row in _jsonl_rows(path):
            qid = str(row.get("question_id"))
            if qid in seen:
                continue
            if ids is not None:
                if qid not in ids:
                    continue
            elif not lcb_in_window(row, start, end):
                continue
            try:
                problems.append(lcb_problem(row))
            except DataError as e:
                raise EvalError(f"{where}: {e}") from None
            seen.add(qid)
            if limit and len(problems) >= limit:
                return problems
    return problems


def _jsonl_rows(path: Path):
    """(file:line, parsed value) for each non-blank line; a line that is not JSON is an EvalError naming it."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{path}:{lineno}: malformed JSON line ({e.msg} at column {e.colno})") from None


@dataclass(frozen=True)
class Benchmark:
    task: str            # the grader (reward.grade): math, gpqa or code
    load: Callable       # (args) -> list[Problem]
    n: Callable          # (args) -> samples per problem
    paper_saar: bool     # test-time SAAR in the official eval scripts (--saar paper)
    reload: Callable | None = None  # (args, ids) -> the Problems whose tests --score needs (records hold no gold)


# The benchmarks, in one table: adding one is one entry (and its loader)
BENCHMARKS = {
    "aime24": Benchmark("math", lambda a: load_aime("aime24", a.data_dir, a.limit), lambda a: a.n, True),
    "aime25": Benchmark("math", lambda a: load_aime("aime25", a.data_dir, a.limit), lambda a: a.n, True),
    "gpqa": Benchmark("gpqa", lambda a: load_gpqa(a.gpqa_path, a.gpqa_seed, a.limit, a.gpqa_zip_password),
                      lambda a: a.n, True),
    "lcb": Benchmark("code", lambda a: load_lcb(a.lcb_dir, a.lcb_start, a.lcb_end, a.limit), lambda a: a.lcb_n, False,
                     reload=lambda a, ids: load_lcb(a.lcb_dir, ids=ids)),
}


def load_benchmark(name: str, args: Args) -> list[Problem]:
    if name not in BENCHMARKS:
        raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name].load(args)


def samples_per_problem(args: Args, benchmark: str) -> int:
    return BENCHMARKS[benchmark].n(args)


# ---------------------------------------------------------------------------------------------------
# Generation: the training rollout (rollout.py), SAAR at test time as --saar says
# ---------------------------------------------------------------------------------------------------

def saar_settings(args: Args, benchmark: str) -> list[bool]:
    """Which test-time SAAR settings to run: the paper's eval scripts keep it on for AIME and GPQA and
    off for LiveCodeBench ("paper"); "both" runs each benchmark twice, so the two can be compared."""
    if args.saar not in SAAR_MODES:
        raise EvalError(f"--saar must be one of {', '.join(SAAR_MODES)}, got {args.saar!r}")
    return {"on": [True], "off": [False], "both": [False, True], "paper": [BENCHMARKS[benchmark].paper_saar]}[args.saar]


def generate(args: Args, problems: list[Problem]) -> list[dict]:
    """Sample samples_per_problem(args, benchmark) trajectories per problem with the training rollout and grade
    them (rollout.rollout_and_grade, grade_record); return one record per sample with benchmark, problem_id,
    sample_idx, response, pred, gold, correct, num_tool_calls, num_tool_errors, saar, meta."""
    import asyncio
    import contextlib

    import torch

    import rollout
    import saar
    from data import models
    from engine import build_engine, column_major
    from sandbox import Sandbox

    templates = rollout.load_prompt_template(args.prompt_template) if args.prompt_template else None
    tok = models.load_tokenizer(args.model)
    fmt = args.tool_format
    if not args.tools:
        fmt = "none"
    elif fmt == "auto":  # Qwen-style tokenizers carry a <tool_call> token; small models write fences
        fmt = "hermes" if len(tok.encode("<tool_call>", add_special_tokens=False)) == 1 else "markdown"
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    budget = args.max_new_tokens or (20480 if args.engine == "sglang" or device != "cpu" else 1024)
    print(f"eval: {args.model} on {'sglang' if args.engine == 'sglang' else device}, response budget {budget} tokens, "
          f"{args.max_turns} turns, tool format {fmt}", flush=True)
    sglang = args.engine == "sglang"
    model = None if sglang else models.load_model(args.model, device=device).eval()
    if model is not None and device == "cpu":
        column_major(model)  # linear weights column-major: MKL runs a decode step's few rows faster (engine.py)
    eng = build_engine(args.engine, tok, model=model,
                       model_path=models.resolve(args.model) if sglang else None, max_batch=args.engine_batch,
                       mem_fraction_static=args.sglang_mem_fraction, seed=args.seed)
    # the rollout's settings, once; test-time SAAR per benchmark below
    roll_cfg = rollout.RolloutConfig(
        tool_format=fmt, max_turns=args.max_turns, max_response_tokens=budget, max_tool_calls=args.max_tool_calls,
        cap_ends=args.tool_cap_ends, last_turn_calls=args.last_turn_calls, tool_output_chars=256, echo=args.tool_echo,
        tool_header=args.tool_header, repair_json=args.repair_json, temperature=args.temperature, top_p=args.top_p,
        saar_p=1.0, eos_ids=(tok.eos_token_id,))
    saar_cfg = saar.SaarConfig(gamma=args.gamma, max_retries=args.max_retries, sim_on=args.sim_on, sim_eos=args.sim_eos)
    records = []
    loop = asyncio.new_event_loop()
    code = any(BENCHMARKS[p.meta["benchmark"]].task == "code" for p in problems)
    with Sandbox(slots=args.grade_workers, timeout_s=args.tool_timeout_s, hide=data_folders(args)) as sb, \
            (judge_sandbox(args) if code else contextlib.nullcontext()) as judge:
        for bench in dict.fromkeys(p.meta["benchmark"] for p in problems):
            mine = [p for p in problems if p.meta["benchmark"] == bench]
            n = samples_per_problem(args, bench)
            for use_saar in saar_settings(args, bench):
                def graded(p: Problem, tr) -> dict:  # one sample's record, graded as --score grades it
                    rec = dict(benchmark=bench, problem_id=p.id, sample_idx=tr.meta["sample_idx"],
                               response=tr.final_text(tok), num_tool_calls=tr.num_tool_calls,
                               num_tool_errors=tr.num_tool_errors, saar=use_saar,
                               meta=dict(finish_reason=tr.finish_reason, response_tokens=len(tr.response_ids),
                                         truncated=tr.truncated, saar_events=len(tr.saar_events)))
                    if BENCHMARKS[bench].task != "code":
                        rec["gold"] = p.answer
                    return grade_record(rec, p, judge, args.code_timeout_s, args.lcb_grader)
                _, recs = loop.run_until_complete(rollout.rollout_and_grade(
                    eng, sb, tok, mine, dataclasses.replace(roll_cfg, saar_cfg=saar_cfg if use_saar else None),
                    grade=graded, n=n, seeds=[args.seed * 1_000_003 + k for k in range(len(mine) * n)],
                    metas=[dict(sample_idx=i) for _ in mine for i in range(n)], templates=templates,
                    grade_workers=args.grade_workers, progress=True))
                records += recs
    loop.close()
    eng.shutdown()
    return records


# ---------------------------------------------------------------------------------------------------
# Grading and scoring
# ---------------------------------------------------------------------------------------------------

def grade_record(rec: dict, problem: Problem | None, sandbox=None, code_timeout_s: float = 6.0,
                 lcb_grader: str = "strict") -> dict:
    """Fill in pred, gold and correct of one record (in place; also returned)."""
    task = BENCHMARKS[rec["benchmark"]].task
    if task == "math":
        rec["pred"] = reward.extract_boxed(rec["response"])
        rec["correct"] = rec["pred"] is not None and reward.math_equal(rec["pred"], str(rec["gold"]))
    elif task == "gpqa":
        rec["pred"] = reward.extract_choice(rec["response"])
        rec["correct"] = reward.grade_gpqa(rec["response"], rec["gold"])
    else:
        rec["gold"] = None
        rec["pred"] = reward.graded_code(rec["response"], problem.tests, lcb_grader)  # the code the grader runs
        rec["correct"] = reward.grade_code(rec["response"], problem.tests, sandbox=sandbox, per_test_s=code_timeout_s,
                                           lcb_grader=lcb_grader)
    return rec


def data_folders(args: Args) -> tuple[str, ...]:
    """The folders that hold this run's problems and answers (LiveCodeBench dir, the GPQA file's folder, the
    AIME data dir, the responses files'): every sandbox here hides them from the code it runs (with bwrap;
    sandbox.py hides the checkout and ../shared/data itself). Without bwrap they stay readable."""
    paths = [args.lcb_dir, args.data_dir] + [str(Path(f).resolve().parent) for f in (args.gpqa_path, args.score, args.out) if f]
    return tuple(dict.fromkeys(str(Path(p).resolve()) for p in paths if p))


def judge_sandbox(args: Args):
    """The sandbox that runs code answers against their tests (generate and --score)."""
    from sandbox import Sandbox
    # LiveCodeBench's harness allows 4 GB; expected outputs run to megabytes and must not be cut
    return Sandbox(slots=max(1, args.grade_workers), timeout_s=args.code_timeout_s, memory_mb=4096,
                   max_output_bytes=64 << 20, hide=data_folders(args))


def grade_records(records: list[dict], problems: dict[tuple[str, str], Problem], args: Args) -> list[dict]:
    """Grade every record; records of answer benchmarks take gold from their problem when one is given."""
    for rec in records:
        p = problems.get((rec["benchmark"], rec["problem_id"]))
        if p is not None and BENCHMARKS[rec["benchmark"]].task != "code":
            rec["gold"] = p.answer
    workers = max(1, args.grade_workers)
    code = [r for r in records if BENCHMARKS[r["benchmark"]].task == "code"]
    with ThreadPoolExecutor(workers) as pool:  # math-verify runs in reward.py's worker processes
        list(pool.map(lambda r: grade_record(r, None), [r for r in records if BENCHMARKS[r["benchmark"]].task != "code"]))
    if code:
        with judge_sandbox(args) as sb, ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda r: grade_record(r, problems[(r["benchmark"], r["problem_id"])], sb,
                                                 args.code_timeout_s, args.lcb_grader), code))
    return records


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _vote_key(benchmark: str, pred: str) -> str:
    """Equivalent answers vote together: "033" and "33" are one vote, as are "0.5" and "\\frac12"."""
    if BENCHMARKS[benchmark].task == "math":
        v = reward._as_number(pred)
        return str(v) if v is not None else reward._squash(pred)
    return pred


def maj_at_n(benchmark: str, samples: list[dict]) -> bool:
    """Is the most common extracted answer correct? Ties go to the answer seen first; no answer is wrong."""
    votes = Counter()
    first: dict[str, dict] = {}
    for rec in sorted(samples, key=lambda r: r["sample_idx"]):
        if rec.get("pred") is None:
            continue
        key = _vote_key(benchmark, rec["pred"])
        votes[key] += 1
        first.setdefault(key, rec)
    if not votes:
        return False
    best = max(votes.values())
    winner = next(k for k in first if votes[k] == best)  # dicts keep insertion order: first seen wins ties
    return bool(first[winner]["correct"])


def summarize(records: list[dict]) -> dict:
    """Per benchmark: problems, n, mean@n (= average pass@1), pass@k for k = 1, 2, 4, ..., n, maj@n
    (answer benchmarks), tool calls per response, share of responses that call a tool, and the share
    of tool calls that failed. n is the fewest samples any problem has (pass@k needs k <= n)."""
    out = {}
    for bench in [b for b in BENCHMARKS if any(r["benchmark"] == b for r in records)]:
        settings = sorted({bool(r["saar"]) for r in records if r["benchmark"] == bench})
        for use_saar in settings:  # one table per test-time SAAR setting
            label = bench if len(settings) == 1 else f"{bench} saar={'on' if use_saar else 'off'}"
            recs = [r for r in records if r["benchmark"] == bench and bool(r["saar"]) == use_saar]
            out[label] = _summarize_one(bench, recs)
    return out


def _summarize_one(bench: str, recs: list[dict]) -> dict:
    by_problem: dict[str, list[dict]] = {}
    for r in recs:
        by_problem.setdefault(r["problem_id"], []).append(r)
    n = min(len(v) for v in by_problem.values())
    ks = sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})
    counts = [(len(v), sum(bool(r["correct"]) for r in v)) for v in by_problem.values()]
    calls = sum(r["num_tool_calls"] for r in recs)
    s = {
        "problems": len(by_problem),
        "n": n,
        "mean@n": sum(c / m for m, c in counts) / len(counts),
        "pass@k": {k: sum(pass_at_k(m, c, k) for m, c in counts) / len(counts) for k in ks},
        "maj@n": None,
        "tool_calls_per_response": calls / len(recs),
        "tool_use_rate": sum(r["num_tool_calls"] > 0 for r in recs) / len(recs),
        "tool_error_rate": (sum(r["num_tool_errors"] for r in recs) / calls) if calls else None,
    }
    if BENCHMARKS[bench].task != "code":
        s["maj@n"] = sum(maj_at_n(bench, v) for v in by_problem.values()) / len(by_problem)
    return s


def format_tables(summary: dict) -> str:
    """One small table per benchmark; accuracies in percent."""
    lines = []
    for bench, s in summary.items():
        n = s["n"]
        cols = [(f"mean@{n}", s["mean@n"])] + [(f"pass@{k}", v) for k, v in s["pass@k"].items()]
        if s["maj@n"] is not None:
            cols.append((f"maj@{n}", s["maj@n"]))
        cols += [("tool-use", s["tool_use_rate"]), ("tool-err", s["tool_error_rate"])]
        cells = [("-" if v is None else f"{100 * v:.1f}") for _, v in cols]
        cols.append(("calls/resp", None))
        cells.append(f"{s['tool_calls_per_response']:.2f}")
        widths = [max(len(name), len(cell)) for (name, _), cell in zip(cols, cells)]
        lines.append(f"{bench}: {s['problems']} problems x {n} samples")
        lines.append("  ".join(name.rjust(w) for (name, _), w in zip(cols, widths)))
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(cells, widths)))
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Records on disk
# ---------------------------------------------------------------------------------------------------

_REQUIRED = {"benchmark": str, "problem_id": str, "sample_idx": int, "response": str,
             "num_tool_calls": int, "num_tool_errors": int, "saar": bool}


def read_records(path: str | Path) -> list[dict]:
    """Read a responses JSONL, checking every line against the schema in the module docstring."""
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"responses file not found: {path}")
    records, seen = [], {}
    for where, rec in _jsonl_rows(path):
        if not isinstance(rec, dict):
            raise EvalError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        for key, typ in _REQUIRED.items():
            if key not in rec:
                raise EvalError(f"{where}: missing field {key!r}")
            ok = isinstance(rec[key], typ) and (typ is bool or not isinstance(rec[key], bool))
            if not ok:
                raise EvalError(f"{where}: field {key!r} must be {typ.__name__}, got {type(rec[key]).__name__}")
        if rec["benchmark"] not in BENCHMARKS:
            raise EvalError(f"{where}: unknown benchmark {rec['benchmark']!r}; known: {', '.join(BENCHMARKS)}")
        if BENCHMARKS[rec["benchmark"]].task != "code" and not isinstance(rec.get("gold"), str):
            raise EvalError(f"{where}: field 'gold' must be a string for {rec['benchmark']}")
        if rec["num_tool_calls"] < 0 or not 0 <= rec["num_tool_errors"] <= rec["num_tool_calls"]:
            raise EvalError(f"{where}: need 0 <= num_tool_errors <= num_tool_calls")
        key = (rec["benchmark"], rec["problem_id"], rec["sample_idx"])
        if key in seen:
            raise EvalError(f"{where}: duplicate sample {key} (first at {seen[key]})")
        seen[key] = where
        rec.setdefault("meta", {})
        records.append(rec)
    if not records:
        raise EvalError(f"{path}: no records")
    return records


_FIELDS = ("benchmark", "problem_id", "sample_idx", "response", "pred", "gold", "correct",
           "num_tool_calls", "num_tool_errors", "saar", "meta")


def write_records(records: list[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps({k: rec.get(k) for k in _FIELDS}, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------

def score(args: Args) -> dict:
    """--score: re-grade a saved JSONL and print its tables."""
    records = read_records(args.score)
    problems = {}
    for name, bench in BENCHMARKS.items():  # code benchmarks: the tests are re-read by problem id
        ids = {r["problem_id"] for r in records if r["benchmark"] == name}
        if not ids or bench.reload is None:
            continue
        found = bench.reload(args, ids)
        problems.update({(name, p.id): p for p in found})
        missing = sorted(ids - {p.id for p in found})
        if missing:
            raise EvalError(f"{args.score}: {name} problems not found: {', '.join(missing[:5])}")
    grade_records(records, problems, args)
    if args.out:
        write_records(records, args.out)
    summary = summarize(records)
    print(format_tables(summary))
    return summary


def evaluate(args: Args) -> dict:
    """Load benchmarks, roll out and grade (generate), write the JSONL, print the tables."""
    names = parse_benchmarks(args.benchmarks)
    problems = [p for name in names for p in load_benchmark(name, args)]  # every input error before the model loads
    records = generate(args, problems)  # rolled out and graded
    out = Path(args.out or REPO_ROOT / "out" / "eval" / (re.sub(r"[^\w.-]+", "_", args.model) + ".jsonl"))
    write_records(records, out)
    summary = summarize(records)
    print(format_tables(summary))
    print(f"responses: {out}")
    return summary


def main(argv: list[str] | None = None) -> dict:
    import tyro
    args = tyro.cli(Args, args=argv, description="Evaluate a model on AIME24/25, GPQA-Diamond and LiveCodeBench.")
    if args.faithful:
        args = dataclasses.replace(args, **FAITHFUL)
    if args.lcb_grader not in reward.LCB_GRADERS:
        raise SystemExit(f"eval.py: --lcb-grader must be one of {', '.join(reward.LCB_GRADERS)}, got {args.lcb_grader!r}")
    try:
        return score(args) if args.score else evaluate(args)
    except EvalError as e:
        raise SystemExit(f"eval.py: {e}") from None


if __name__ == "__main__":
    main()
