"""eval.py: AIME24/25, GPQA-Diamond and LiveCodeBench-v6, scored as the CLEANER paper scores them; and the
held-out evaluation of a train.py run (held_out, summary).

    python eval.py --model M --benchmarks aime24,aime25,gpqa,lcb [--n N] [--saar paper|on|off|both]
    python eval.py --score out/eval/M.jsonl          # re-grade saved responses, no model needed

The rollout is the training one (rollout.py) under the paper's evaluation settings (config.Eval), test-time SAAR
as --saar says; grading is reward.py's. It prints mean@n (the paper's average pass@1), pass@k, maj@n and how often
the model's tool calls fail, and writes one JSONL record per sample, which --score re-grades. Departures
(docs/departures.md, docs/results.md): the public sources (data/benchmarks.py), not the official parquet files;
math graded by math-verify; a smaller default response budget on the CPU; LiveCodeBench graded by our strict
grader unless --lcb-grader official (--faithful). GPQA's questions are never logged, as its authors ask.
The sandboxes hide this run's data folders from the model's code (data_folders); that takes bwrap: without it
they stay readable to the code, answers included (sandbox.py says what each layer covers).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import config
import reward
from data.benchmarks import load_aime, load_gpqa, load_lcb, read_records, write_records
from data.problems import DataError, Problem

REPO_ROOT = Path(__file__).resolve().parent


class EvalError(DataError):
    """Bad input to the evaluation (file, line, field named in the message), as the loaders' DataError."""


def parse_benchmarks(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise EvalError("--benchmarks is empty; choose from " + ", ".join(BENCHMARKS))
    for name in names:
        if name not in BENCHMARKS:
            raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Benchmark:
    task: str            # the grader (reward.judge): math, gpqa or code
    load: Callable       # (config.Bench) -> list[Problem]
    n: Callable          # (config.Bench) -> samples per problem
    paper_saar: bool     # test-time SAAR in the official eval scripts (--saar paper)
    reload: Callable | None = None  # (config.Bench, ids) -> the Problems whose tests --score needs (no gold in records)


# The benchmarks, in one table: adding one is one entry (and its loader)
BENCHMARKS = {
    "aime24": Benchmark("math", lambda b: load_aime("aime24", b.data_dir, b.limit), lambda b: b.n, True),
    "aime25": Benchmark("math", lambda b: load_aime("aime25", b.data_dir, b.limit), lambda b: b.n, True),
    "gpqa": Benchmark("gpqa", lambda b: load_gpqa(b.gpqa_path, b.gpqa_seed, b.limit, b.gpqa_zip_password),
                      lambda b: b.n, True),
    "lcb": Benchmark("code", lambda b: load_lcb(b.lcb_dir, b.lcb_start, b.lcb_end, b.limit), lambda b: b.lcb_n, False,
                     reload=lambda b, ids: load_lcb(b.lcb_dir, ids=ids)),
}


def saar_settings(s: config.EvalSaar, benchmark: str) -> list[bool]:
    """Which test-time SAAR settings to run (--saar): the paper's eval scripts keep it on for AIME and GPQA and
    off for LiveCodeBench ("paper"); "both" runs each benchmark twice, so the two can be compared."""
    return {"on": [True], "off": [False], "both": [False, True], "paper": [BENCHMARKS[benchmark].paper_saar]}[s.saar]


# ------------------------------------------------------------------- generation: the training rollout (rollout.py)

def build(args: config.Eval):
    """The tokenizer, the engine and the rollout's settings (its tool format and response budget resolved)."""
    import torch

    import rollout
    from data import models
    from machinery import engines
    c, e, r = args.common, args.engine, args.rollout
    engines.require(e.engine)
    try:  # the checks train.py makes: bad settings stop here, before a model loads
        r = rollout.settle(c.model, r, args.saar if args.saar.saar != "off" else None)
    except (OSError, ValueError) as err:
        raise SystemExit(f"eval.py: {err}") from None
    tok = models.load_tokenizer(c.model)
    fmt = r.tool_format
    device = e.device if e.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    sglang = e.engine == "sglang"
    # the paper's budget on a GPU; on the CPU a long context decodes too slowly to be of use
    budget = r.max_response_tokens or (20480 if sglang or device != "cpu" else 1024)
    print(f"eval: {c.model} on {'sglang' if sglang else device}, response budget {budget} tokens, "
          f"{r.max_turns} turns, tool format {fmt}", flush=True)
    model = None if sglang else models.load_model(c.model, dtype=getattr(torch, e.dtype), device=device).eval()
    # max_context sizes a CPU engine's cache
    eng = engines.from_settings(e, tok, model=model, model_path=models.resolve(c.model), seed=c.seed, device=device,
                                max_batch=e.engine_batch, max_context=budget + config.Data.max_prompt_tokens)
    return tok, eng, dataclasses.replace(r, tool_format=fmt, max_response_tokens=budget)


def generate(args: config.Eval, problems: list[Problem]) -> list[dict]:
    """Sample each benchmark's n trajectories per problem with the training rollout and grade them
    (rollout.rollout_and_grade, grade_record); one record per sample (data/benchmarks.py: RECORD_FIELDS)."""
    import asyncio
    import contextlib

    import rollout
    from sandbox import Sandbox
    b, s, seed = args.bench, args.sandbox, args.common.seed
    templates = rollout.load_prompt_template(args.rollout.prompt_template) if args.rollout.prompt_template else None
    tok, eng, cfg = build(args)
    records, loop = [], asyncio.new_event_loop()
    code = any(BENCHMARKS[p.meta["benchmark"]].task == "code" for p in problems)
    with Sandbox(slots=s.sandbox_slots, timeout_s=s.tool_timeout_s, memory_mb=s.tool_memory_mb, clock=s.tool_clock,
                 hide=data_folders(b)) as sb, (judge_sandbox(b) if code else contextlib.nullcontext()) as judge:
        for bench in dict.fromkeys(p.meta["benchmark"] for p in problems):
            mine = [p for p in problems if p.meta["benchmark"] == bench]
            n = BENCHMARKS[bench].n(b)
            for use_saar in saar_settings(args.saar, bench):
                def graded(p: Problem, tr) -> dict:  # one sample's record, graded as --score grades it
                    rec = dict(benchmark=bench, problem_id=p.id, sample_idx=tr.meta["sample_idx"],
                               response=tr.final_text(tok), num_tool_calls=tr.num_tool_calls,
                               num_tool_errors=tr.num_tool_errors, saar=use_saar,
                               meta=dict(finish_reason=tr.finish_reason, response_tokens=len(tr.response_ids),
                                         truncated=tr.truncated, trajectory=tr.text, masked=tr.masked,
                                         saar_events=tr.saar_events))
                    if BENCHMARKS[bench].task != "code":
                        rec["gold"] = p.answer
                    return grade_record(rec, p, judge, b.code_timeout_s, b.lcb_grader)
                _, recs = loop.run_until_complete(rollout.rollout_and_grade(
                    eng, sb, tok, mine, cfg, args.saar if use_saar else None, grade=graded, n=n,
                    seeds=[rollout.seed_of(seed, k) for k in range(len(mine) * n)],
                    metas=[dict(sample_idx=i) for _ in mine for i in range(n)], templates=templates,
                    grade_workers=b.grade_workers, progress=True))
                records += recs
    loop.close()
    eng.shutdown()
    return records


# ------------------------------------------------------------------- grading and scoring

def grade_record(rec: dict, problem: Problem | None, sandbox=None, code_timeout_s: float = 6.0,
                 lcb_grader: str = "strict") -> dict:
    """Fill in pred (what the grader read: for code, the code it ran), gold and correct of one record (in
    place; also returned), by reward.judge, as training grades."""
    task = BENCHMARKS[rec["benchmark"]].task
    if task == "code":
        rec["gold"] = None
    judged = reward.judge(task, rec["response"], answer=rec["gold"], tests=problem.tests if problem else None,
                          sandbox=sandbox, lcb_grader=lcb_grader, per_test_s=code_timeout_s)
    rec["pred"] = judged.pred
    rec["correct"] = judged.correct
    return rec


def data_folders(b: config.Bench) -> tuple[str, ...]:
    """The folders that hold this run's problems and answers (LiveCodeBench dir, the GPQA file's folder, the
    AIME data dir, the responses files'): every sandbox here hides them from the code it runs (with bwrap;
    sandbox.py hides the checkout and ../shared/data itself). Without bwrap they stay readable."""
    paths = [b.lcb_dir, b.data_dir] + [str(Path(f).resolve().parent) for f in (b.gpqa_path, b.score, b.out) if f]
    return tuple(dict.fromkeys(str(Path(p).resolve()) for p in paths if p))


def judge_sandbox(b: config.Bench):
    """The sandbox that runs code answers against their tests (generate and --score)."""
    from sandbox import Sandbox
    # LiveCodeBench's harness allows 4 GB; expected outputs run to megabytes and must not be cut
    return Sandbox(slots=max(1, b.grade_workers), timeout_s=b.code_timeout_s, memory_mb=4096,
                   max_output_bytes=64 << 20, hide=data_folders(b))


def grade_records(records: list[dict], problems: dict[tuple[str, str], Problem], b: config.Bench) -> list[dict]:
    """Grade every record; records of answer benchmarks take gold from their problem when one is given."""
    for rec in records:
        p = problems.get((rec["benchmark"], rec["problem_id"]))
        if p is not None and BENCHMARKS[rec["benchmark"]].task != "code":
            rec["gold"] = p.answer
    workers = max(1, b.grade_workers)
    code = [r for r in records if BENCHMARKS[r["benchmark"]].task == "code"]
    with ThreadPoolExecutor(workers) as pool:  # math-verify runs in reward.py's worker processes
        list(pool.map(lambda r: grade_record(r, None), [r for r in records if BENCHMARKS[r["benchmark"]].task != "code"]))
    if code:
        with judge_sandbox(b) as sb, ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda r: grade_record(r, problems[(r["benchmark"], r["problem_id"])], sb,
                                                 b.code_timeout_s, b.lcb_grader), code))
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
    return reward.answer_key(pred) if BENCHMARKS[benchmark].task == "math" else pred


def maj_at_n(benchmark: str, samples: list[dict]) -> bool:
    """Is the most common extracted answer correct? Ties go to the answer seen first; no answer is wrong."""
    votes, first = Counter(), {}
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
    """Per benchmark (and test-time SAAR setting, when both ran): problems, n, mean@n (= average pass@1), pass@k
    for k = 1, 2, 4, ..., n, maj@n (answer benchmarks), tool calls per response, share of responses that call a
    tool, and the share of tool calls that failed. n is the fewest samples any problem has (pass@k needs k <= n)."""
    out = {}
    for bench in [b for b in BENCHMARKS if any(r["benchmark"] == b for r in records)]:
        settings = sorted({bool(r["saar"]) for r in records if r["benchmark"] == bench})
        for use_saar in settings:
            label = bench if len(settings) == 1 else f"{bench} saar={'on' if use_saar else 'off'}"
            out[label] = _summarize_one(bench, [r for r in records if r["benchmark"] == bench and bool(r["saar"]) == use_saar])
    return out


def _summarize_one(bench: str, recs: list[dict]) -> dict:
    by_problem: dict[str, list[dict]] = {}
    for r in recs:
        by_problem.setdefault(r["problem_id"], []).append(r)
    n = min(len(v) for v in by_problem.values())
    ks = sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})
    counts = [(len(v), sum(bool(r["correct"]) for r in v)) for v in by_problem.values()]
    calls = sum(r["num_tool_calls"] for r in recs)
    return {
        "problems": len(by_problem), "n": n,
        "mean@n": sum(c / m for m, c in counts) / len(counts),
        "pass@k": {k: sum(pass_at_k(m, c, k) for m, c in counts) / len(counts) for k in ks},
        "maj@n": (sum(maj_at_n(bench, v) for v in by_problem.values()) / len(by_problem)
                  if BENCHMARKS[bench].task != "code" else None),
        "tool_calls_per_response": calls / len(recs),
        "tool_use_rate": sum(r["num_tool_calls"] > 0 for r in recs) / len(recs),
        "tool_error_rate": (sum(r["num_tool_errors"] for r in recs) / calls) if calls else None,
    }


def format_tables(summary: dict) -> str:
    """One small table per benchmark; accuracies in percent."""
    lines = []
    for bench, s in summary.items():
        n = s["n"]
        cols = [(f"mean@{n}", s["mean@n"])] + [(f"pass@{k}", v) for k, v in s["pass@k"].items()]
        if s["maj@n"] is not None:
            cols.append((f"maj@{n}", s["maj@n"]))
        cols += [("tool-use", s["tool_use_rate"]), ("tool-err", s["tool_error_rate"])]
        cells = [("-" if v is None else f"{100 * v:.1f}") for _, v in cols] + [f"{s['tool_calls_per_response']:.2f}"]
        cols.append(("calls/resp", None))
        widths = [max(len(name), len(cell)) for (name, _), cell in zip(cols, cells)]
        lines += [f"{bench}: {s['problems']} problems x {n} samples",
                  "  ".join(name.rjust(w) for (name, _), w in zip(cols, widths)),
                  "  ".join(cell.rjust(w) for cell, w in zip(cells, widths)), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------- entry points

def score(b: config.Bench) -> dict:
    """--score: re-grade a saved JSONL and print its tables."""
    records, problems = read_records(b.score, {name: bench.task for name, bench in BENCHMARKS.items()}), {}
    for name, bench in BENCHMARKS.items():  # code benchmarks: the tests are re-read by problem id
        ids = {r["problem_id"] for r in records if r["benchmark"] == name}
        if not ids or bench.reload is None:
            continue
        found = bench.reload(b, ids)
        problems.update({(name, p.id): p for p in found})
        missing = sorted(ids - {p.id for p in found})
        if missing:
            raise EvalError(f"{b.score}: {name} problems not found: {', '.join(missing[:5])}")
    grade_records(records, problems, b)
    if b.out:
        write_records(records, b.out)
    summary = summarize(records)
    print(format_tables(summary))
    return summary


def evaluate(args: config.Eval) -> dict:
    """Load benchmarks, roll out and grade (generate), write the JSONL, print the tables."""
    b = args.bench
    problems = [p for name in parse_benchmarks(b.benchmarks) for p in BENCHMARKS[name].load(b)]  # input errors first
    records = generate(args, problems)  # rolled out and graded
    out = Path(b.out or REPO_ROOT / "out" / "eval" / (re.sub(r"[^\w.-]+", "_", args.common.model) + ".jsonl"))
    write_records(records, out)
    summary = summarize(records)
    print(format_tables(summary))
    print(f"responses: {out}")
    return summary


def main(argv: list[str] | None = None) -> dict:
    args = config.cli(config.Eval, "Evaluate a model on AIME24/25, GPQA-Diamond and LiveCodeBench.", argv)
    try:
        return score(args.bench) if args.bench.score else evaluate(args)
    except DataError as e:  # an EvalError, or a loader's (data/benchmarks.py)
        raise SystemExit(f"eval.py: {e}") from None


# ------------------------------------------------------------------- the held-out evaluation of a training run

def held_out(loop, eng, sandbox, tokenizer, problems, args: config.Train, *, step, out_dir, rollout_cfg, templates,
             grade, rank, world) -> dict:
    """Held-out accuracy: greedy, and at the rollout temperature with --eval-sampled; test-time SAAR off, on or
    both (--eval-saar), with args.saar. rollout_cfg: the run's config.Rollout, its tool format resolved. Returns
    the metrics (with t_eval); every rank's per-problem records go to out_dir/eval_step<step>.jsonl when out_dir
    is given (the master), which summary reads."""
    import rollout
    t0 = time.perf_counter()
    mine = problems[rank::world]
    results, records = {}, []
    temps = [("greedy", 0.0)] + ([("sampled", rollout_cfg.temperature)] if args.data.eval_sampled else [])
    # test-time SAAR off is eval_greedy, on is eval_greedy_saar, whatever the flag, so runs and their later
    # --eval-only calls line up
    on = dataclasses.replace(args.saar, rollback_p=1.0)  # every trajectory: the run's curriculum is training's
    modes = {"off": [("", None)], "on": [("_saar", on)], "both": [("", None), ("_saar", on)]}
    for (name, temp), (suffix, saar) in ((t, m) for t in temps for m in modes[args.saar.eval_saar]):
        trajs, oks = loop.run_until_complete(rollout.rollout_and_grade(
            eng, sandbox, tokenizer, mine, dataclasses.replace(rollout_cfg, temperature=temp), saar,
            grade=grade, seeds=list(range(len(mine))), templates=templates, progress=out_dir is not None))
        rows = [dict(id=p.id, ok=bool(ok), calls=tr.num_first_calls, errors=tr.num_first_errors, response=tr.text,
                     masked=tr.masked, saar_events=tr.saar_events) for p, tr, ok in zip(mine, trajs, oks)]
        if world > 1:
            import torch.distributed as dist
            parts = [None] * world
            dist.all_gather_object(parts, rows)
            rows = [r for part in parts for r in part]
        key = f"eval_{name}{suffix}"
        calls = sum(r["calls"] for r in rows)
        results[f"{key}_acc"] = sum(r["ok"] for r in rows) / max(1, len(rows))
        results[f"{key}_tool_err"] = sum(r["errors"] for r in rows) / max(1, calls)  # first attempts, SAAR's excluded
        results[f"{key}_tool_calls"] = calls / max(1, len(rows))
        records += [dict(r, eval=key) for r in rows]
    if out_dir is not None:  # an earlier evaluation of this step keeps its other kinds (--eval-only adds some)
        path = os.path.join(out_dir, f"eval_step{step:06d}.jsonl")
        if os.path.exists(path):
            kinds = {r["eval"] for r in records}
            with open(path) as f:
                records = [r for r in map(json.loads, f) if r["eval"] not in kinds] + records
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        os.replace(path + ".tmp", path)
    results["t_eval"] = time.perf_counter() - t0
    return results


# the sections the held-out evaluation reads: the step-0 key holds each of their settings but those declared out beside
# their field (config.not_in_eval); the others (grpo, run, update) are training's alone
READS = ("Common", "Data", "Rollout", "Saar", "Engine", "Sandbox")


def step0_key(args: config.Train, model_path: str, templates: dict | None = None) -> str | None:
    """The step-0 evaluation's cache key (machinery/evalcache.py): the model folder's files (not sft.py's build
    record, whose timings change with every rebuild of the same weights), the settings of READS, the prompt templates'
    wording, the source of the modules the evaluation runs; None for a model that is not a local folder (a hub id).
    SAAR's settings and saar.py count only with test-time SAAR on, so an ablation of SAAR keeps the entry."""
    import inspect

    import rollout
    import saar
    import sandbox
    import sft
    import tools
    from data import models, problems, synth
    from machinery import engine, engines, evalcache, hf_engine, lcb, mathverify, sandbox_pool, sglang_engine
    folder = Path(models.resolve(model_path))  # an offline model's name: its built folder
    if not folder.is_dir():
        return None
    saar_on = args.saar.eval_saar != "off"  # off: the evaluation reads no SAAR setting and runs no line of saar.py
    reads = tuple(getattr(config, name) for name in READS if saar_on or name != "Saar")  # TrainSaar is a Saar
    fields = {f.name: getattr(s, f.name) for s in config.sections(args) if isinstance(s, reads)
              for f in dataclasses.fields(s) if f.metadata.get("in_eval", True)}
    fields["templates"] = templates  # the wording --prompt-template loaded, not its path
    code = (engine, hf_engine, sglang_engine, engines, reward, lcb, mathverify, rollout, sandbox, sandbox_pool, tools,
            models, problems, synth) + ((saar,) if saar_on else ())
    program = sorted(Path(engine.__file__).parent.glob("zygote*.py"))  # the sandbox's program: an edit to any counts
    return evalcache.key(folder, fields, [inspect.getsource(m) for m in code] + [p.read_text() for p in program]
                         + [inspect.getsource(held_out)], skip=(sft.MARKER,))


def format_eval(m: dict) -> str:
    """The evaluation part of a log line: each kind's accuracy and first-attempt tool errors per call."""
    keys = sorted(k[:-4] for k in m if k.startswith("eval_") and k.endswith("_acc"))
    return " | ".join(f"{k[5:]} acc {m[k + '_acc']:.3f} tool_err {m[k + '_tool_err']:.2f}" for k in keys)


def paired_ci(before: list[bool], after: list[bool], z: float = 1.96) -> tuple[float, float, float]:
    """Mean of after - before over the same problems, and its normal-approximation CI (paired; z=1.96: 95%)."""
    d = [float(a) - float(b) for a, b in zip(after, before)]
    n = len(d)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = sum(d) / n
    sd = (sum((x - mean) ** 2 for x in d) / max(1, n - 1)) ** 0.5
    half = z * sd / n ** 0.5
    return mean, mean - half, mean + half


def summary(out: str, last_step: int) -> list[str]:
    """One line per evaluation kind: held-out accuracy before the first step and after the last, the gain with
    its paired 95% CI, and first-attempt tool errors per call; then the training reward's first and last thirds
    (metrics.jsonl). Also written to out/summary.json."""
    paths = [os.path.join(out, f"eval_step{s:06d}.jsonl") for s in (0, last_step)]
    if last_step == 0 or not all(os.path.exists(p) for p in paths):
        return []
    start, end = ([json.loads(x) for x in open(p)] for p in paths)
    lines, saved = [], {}
    for key in dict.fromkeys(r["eval"] for r in start):
        a = {r["id"]: r for r in start if r["eval"] == key}
        b = {r["id"]: r for r in end if r["eval"] == key}
        ids = [i for i in a if i in b]
        if not ids:  # a kind evaluated at one end only (--eval-only may add it later)
            continue
        acc0, acc1 = (sum(d[i]["ok"] for i in ids) / max(1, len(ids)) for d in (a, b))
        err0, err1 = (sum(d[i]["errors"] for i in ids) / max(1, sum(d[i]["calls"] for i in ids)) for d in (a, b))
        gain, lo, hi = paired_ci([a[i]["ok"] for i in ids], [b[i]["ok"] for i in ids])
        how = key[len("eval_"):].replace("_saar", ", test-time SAAR")
        lines.append(f"held-out accuracy {acc0:.2f} -> {acc1:.2f} ({100 * gain:+.0f} pts, 95% CI {100 * lo:+.0f}.."
                     f"{100 * hi:+.0f}, {len(ids)} problems, {how}); tool errors per call {err0:.2f} -> {err1:.2f}")
        saved[key] = dict(acc_start=acc0, acc_end=acc1, gain=gain, ci_low=lo, ci_high=hi, n=len(ids),
                            tool_err_start=err0, tool_err_end=err1, step=last_step)
    steps = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("step", 0) > 0 and "reward" in r:
                steps[r["step"]] = r["reward"]  # a step repeated by --resume keeps its last line
    rewards = [steps[k] for k in sorted(steps)]
    if len(rewards) >= 3:
        k = len(rewards) // 3
        first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        lines.append(f"training reward, mean of the first {k} steps {first:+.3f} -> of the last {k} {last:+.3f}")
        saved["train_reward"] = dict(first_third=first, last_third=last, steps=len(rewards))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(dict(saved, lines=lines), f, indent=1)
    return lines


if __name__ == "__main__":
    main()
