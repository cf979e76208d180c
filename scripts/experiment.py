"""An experiment of train.py runs: arms (each a set of flags) x seeds, run to the end across kills, machines and days.

The experiment is a folder, docs/experiments/NAME/, committed before the first run: its design (README.md) and
experiment.json, which names the arms, the seeds, the flags every run gets and the reference arm:

    {"reference": "saar", "train": ["--eval-saar", "both"], "seeds": [0, 1, 2],
     "arms": {"saar": {"flags": []}, "no-saar": {"flags": ["--no-saar"]},
              "no-tool": {"flags": ["--tool-format", "none"], "seeds": [0], "compare": "final"}}}

    python scripts/experiment.py docs/experiments/NAME              # run what is missing, then the tables
    python scripts/experiment.py docs/experiments/NAME --seeds 3,4  # a share of the seeds (another machine)
    python scripts/experiment.py docs/experiments/NAME --report     # the tables and curves from the summaries only

Each run is `python train.py --seed S --run-name ARM-sS <train flags> <arm flags>` in --out-dir (out/NAME), seed by
seed, so that the pairs fill in together. A finished run leaves runs/ARM-sS/ in the experiment folder: summary.json
(its commit, cold start, step-0 records' hash, held-out and training figures, per-problem results) and its
metrics.jsonl. Those are small and committed; checkpoints stay in --out-dir. A run with a summary there is skipped; a
killed run continues from its checkpoint (--resume), or starts again when it has none. The first seed's report.html
of each arm is kept beside the summaries.

The tables: per arm, the final figures (mean +- std over seeds); per arm against the reference, the paired
difference of held-out gains (reference minus arm) with its 95% t-interval across seeds and the number of seeds
that would make the interval +-3 points at the observed spread. Runs are paired only on the same seed, the same
cold start and the same step-0 records. An arm with "compare": "final" (one without the cold start, say) is compared
on its final accuracy instead, paired by seed alone. Then test-time SAAR (on minus off, each arm's trained
policies), and the curves (scripts/plot_runs.py) into the experiment's img/.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_runs  # noqa: E402  (scripts/, beside this file)

KINDS = {"eval_greedy": "test-time SAAR off", "eval_greedy_saar": "test-time SAAR on"}
ECHO = re.compile(r"^(step |eval step|held-out|training reward|done:|resumed|Traceback|\w*Error)")


# ---------------------------------------------------------------------- the design

def load_design(folder: str) -> dict:
    """experiment.json, checked: the reference is an arm, every arm has flags and its seeds."""
    path = os.path.join(folder, "experiment.json")
    try:
        with open(path) as f:
            d = json.load(f)
        arms = d["arms"]
        if d["reference"] not in arms:
            raise ValueError(f"the reference {d['reference']!r} is not an arm")
        for name, arm in arms.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or not isinstance(arm.get("flags"), list):
                raise ValueError(f"arm {name!r}: a lowercase name and a list of flags")
            arm.setdefault("seeds", d["seeds"])
            arm.setdefault("compare", "gain")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"{path}: {e!r}") from None
    d.setdefault("train", [])
    return d


def plan(design: dict, seeds: list[int] | None = None) -> list[tuple[int, str]]:
    """(seed, arm) in the order they run: seed by seed, every arm of a seed in the file's order."""
    every = sorted({s for arm in design["arms"].values() for s in arm["seeds"]})
    return [(s, name) for s in every if seeds is None or s in seeds
            for name, arm in design["arms"].items() if s in arm["seeds"]]


# ---------------------------------------------------------------------- running

def train_argv(design: dict, seed: int, arm: str, out_dir: str) -> list[str]:
    return ["--seed", str(seed), "--run-name", f"{arm}-s{seed}", "--out-dir", out_dir, *design["train"],
            *design["arms"][arm]["flags"]]


def finished(run: str) -> bool:
    """train.py ended: it wrote its summary of the last step's evaluation, then its report, then said done (a run
    killed on the way has a checkpoint of its last step, and --resume writes the rest)."""
    try:
        with open(os.path.join(run, "summary.json")) as f:
            s = json.load(f)
        with open(os.path.join(run, "run.json")) as f:
            steps = json.load(f)["args"]["steps"]
        with open(os.path.join(run, "train.log")) as f:
            done = re.search(r"^done: .* in \d+ s$", f.read(), re.M) is not None
        return done and any(isinstance(v, dict) and v.get("step") == steps for v in s.values())
    except (OSError, ValueError, KeyError):
        return False


def run_one(design: dict, seed: int, arm: str, out_dir: str, python: str = sys.executable) -> None:
    """train.py for one (seed, arm) until it finishes: --resume from its checkpoint when a kill left one, a fresh
    start otherwise. Its output goes to <run>/train.log; the step lines are echoed."""
    run = os.path.join(out_dir, f"{arm}-s{seed}")
    argv = train_argv(design, seed, arm, out_dir)
    if os.path.exists(os.path.join(run, "ckpt.pt")):
        print(f"[{arm}-s{seed}] resuming from its checkpoint", flush=True)
        argv.append("--resume")
    elif os.path.exists(run):
        print(f"[{arm}-s{seed}] no checkpoint: starting again", flush=True)
        shutil.rmtree(run)
    os.makedirs(run, exist_ok=True)
    print(f"[{arm}-s{seed}] python train.py {' '.join(argv)}", flush=True)
    with open(os.path.join(run, "train.log"), "a") as log:
        p = subprocess.Popen([python, "train.py", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for line in p.stdout:
            log.write(line)
            log.flush()
            if ECHO.match(line):
                print(f"[{arm}-s{seed}] {line}", end="", flush=True)
        if p.wait() != 0 or not finished(run):
            raise SystemExit(f"[{arm}-s{seed}] train.py exited with {p.returncode}; its log: {run}/train.log")


def collect(run: str, dest: str, arm: str, seed: int, argv: list[str]) -> dict:
    """A finished run's small summary (and its metrics.jsonl) into dest, written whole."""
    with open(os.path.join(run, "run.json")) as f:
        info = json.load(f)
    rows = plot_runs.read_metrics(run)
    by_step = {r["step"]: r for r in rows}
    last = max(by_step)
    steps = [r for r in rows if r["step"] > 0 and "reward" in r]
    third = steps[len(steps) - max(1, len(steps) // 3):]
    mean = lambda key, rs=third: statistics.mean(r[key] for r in rs) if rs else None  # noqa: E731

    def records(step: int) -> dict:
        path = os.path.join(run, f"eval_step{step:06d}.jsonl")
        out = {}
        for r in map(json.loads, open(path)) if os.path.exists(path) else []:
            out.setdefault(r["eval"], []).append(r)
        return out

    start, end = records(0), records(last)
    with open(os.path.join(run, "summary.json")) as f:
        done = json.load(f)  # the run's own figures (eval.summary): accuracy and tool errors at both ends, each kind
    heldout = {}
    for kind in KINDS:
        if kind in done and kind in start and kind in end:
            a, b = (sorted(x[kind], key=lambda r: r["id"]) for x in (start, end))
            own = ("acc_start", "acc_end", "tool_err_start", "tool_err_end", "n")
            heldout[kind] = {k: done[kind][k] for k in own} | dict(tool_calls_end=statistics.mean(r["calls"] for r in b),
                ok_start="".join("01"[r["ok"]] for r in a), ok_end="".join("01"[r["ok"]] for r in b))
    step0 = json.dumps([[r["id"], r["ok"], r["calls"], r["errors"]] for k in sorted(start) for r in start[k]])
    with open(os.path.join(run, "train.log")) as f:
        wall = sum(float(m) for m in re.findall(r"^done: .* in (\d+) s", f.read(), re.M))
    s = dict(arm=arm, seed=seed, argv=argv, commit=info["commit"], diff=os.path.getsize(os.path.join(run, "git.diff")) > 0,
             cold_start=info.get("cold_start", "?"), step0=hashlib.sha256(step0.encode()).hexdigest()[:16],
             steps=len(steps), heldout=heldout,
             train=dict(reward_first_third=mean("reward", steps[:max(1, len(steps) // 3)]),
                        reward_last_third=mean("reward"), first_tool_err_last_third=mean("first_tool_err"),
                        tool_calls_last_third=mean("tool_calls"), resp_len_last_third=mean("resp_len"),
                        masked_failed=sum(r.get("masked_failed", 0) for r in steps),
                        saar_events={k: sum(r.get(f"saar_{k}", 0) for r in steps)
                                     for k in ("shallow", "deep", "given_up", "answered")}),
             lines=done.get("lines", []), wall_s=wall)
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shutil.copyfile(os.path.join(run, "metrics.jsonl"), os.path.join(tmp, "metrics.jsonl"))
    with open(os.path.join(tmp, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return s


def run_all(folder: str, design: dict, out_dir: str, seeds: list[int] | None, python: str = sys.executable) -> None:
    todo = plan(design, seeds)
    for i, (seed, arm) in enumerate(todo, 1):
        dest = os.path.join(folder, "runs", f"{arm}-s{seed}")
        if os.path.exists(os.path.join(dest, "summary.json")):
            continue
        t0 = time.time()
        print(f"== run {i}/{len(todo)}: {arm}, seed {seed}", flush=True)
        run = os.path.join(out_dir, f"{arm}-s{seed}")
        if not finished(run):
            run_one(design, seed, arm, out_dir, python)
        collect(run, dest, arm, seed, train_argv(design, seed, arm, out_dir))
        report = os.path.join(folder, f"report-{arm}.html")
        if seed == design["arms"][arm]["seeds"][0] and os.path.exists(os.path.join(run, "report.html")):
            shutil.copyfile(os.path.join(run, "report.html"), report)
        print(f"== {arm}-s{seed} done in {time.time() - t0:.0f} s: {dest}", flush=True)


# ---------------------------------------------------------------------- statistics

def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p > 0.5: bisection on its CDF, the density integrated by Simpson's rule."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    dens = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        return 0.5 + h / 3 * (dens(0) + dens(x) + sum((4 if i % 2 else 2) * dens(i * h) for i in range(1, n)))
    lo, hi = 0.0, 100.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def mean_ci(xs: list[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(mean, sd, half-width of its t-interval); sd and the half-width are None for fewer than 2 values."""
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, None, None
    sd = statistics.stdev(xs)
    return m, sd, t_quantile(0.5 + level / 2, len(xs) - 1) * sd / math.sqrt(len(xs))


def seeds_for(sd: float, half_width: float, level: float = 0.95, most: int = 10_000) -> int:
    """The fewest seeds whose t-interval has this half-width at this sd."""
    if sd == 0:
        return 2
    n = 2
    while n < most and t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n) > half_width:
        n += 1 if n < 200 else n // 10
    return n


def pts(x: float | None, sign: bool = True) -> str:
    return "-" if x is None else f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"


# ---------------------------------------------------------------------- the tables

def load_runs(folder: str) -> dict[str, dict[int, dict]]:
    """{arm: {seed: summary}} from the experiment's runs/."""
    out: dict[str, dict[int, dict]] = {}
    base = os.path.join(folder, "runs")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name, "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                s = json.load(f)
            out.setdefault(s["arm"], {})[s["seed"]] = s
    return out


def gain(s: dict, kind: str = "eval_greedy") -> float | None:
    h = s["heldout"].get(kind)
    return None if h is None else h["acc_end"] - h["acc_start"]


def arm_table(design: dict, runs: dict) -> list[str]:
    cols = [("held-out acc, SAAR off", lambda s: s["heldout"].get("eval_greedy", {}).get("acc_end")),
            ("gain", gain),
            ("held-out acc, SAAR on", lambda s: s["heldout"].get("eval_greedy_saar", {}).get("acc_end")),
            ("held-out first-attempt tool err", lambda s: s["heldout"].get("eval_greedy", {}).get("tool_err_end")),
            ("train first-attempt tool err, last third", lambda s: s["train"]["first_tool_err_last_third"]),
            ("held-out tool calls", lambda s: s["heldout"].get("eval_greedy", {}).get("tool_calls_end")),
            ("train tool calls, last third", lambda s: s["train"]["tool_calls_last_third"]),
            ("response length, last third", lambda s: s["train"]["resp_len_last_third"])]
    lines = ["| arm | seeds | " + " | ".join(c[0] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for arm in design["arms"]:
        got = runs.get(arm, {})
        cells = []
        for _, fn in cols:
            vals = [v for v in (fn(s) for s in got.values()) if v is not None]
            m, sd, _ = mean_ci(vals) if vals else (None, None, None)
            cells.append("-" if m is None else f"{m:.3f}" + (f" ± {sd:.3f}" if sd is not None else ""))
        lines.append(f"| {arm} | {len(got)} | " + " | ".join(cells) + " |")
    return lines


def paired(design: dict, runs: dict, arm: str, key=gain) -> tuple[list[int], list[float], list[str]]:
    """Seeds, reference-minus-arm differences of key(summary), and why any seed was left out."""
    ref = runs.get(design["reference"], {})
    seeds, diffs, skipped = [], [], []
    for seed, s in sorted(runs.get(arm, {}).items()):
        r = ref.get(seed)
        if r is None:
            continue
        if design["arms"][arm]["compare"] == "gain" and (r["cold_start"], r["step0"]) != (s["cold_start"], s["step0"]):
            skipped.append(f"seed {seed}: cold start or step-0 records differ ({r['cold_start']}/{r['step0']} against "
                           f"{s['cold_start']}/{s['step0']})")
            continue
        a, b = key(r), key(s)
        if a is not None and b is not None:
            seeds.append(seed)
            diffs.append(a - b)
    return seeds, diffs, skipped


def comparisons(design: dict, runs: dict, half_width: float = 0.03) -> list[str]:
    ref = design["reference"]
    lines = [f"| {ref} minus | what | seeds | per seed (pts) | mean (pts) | 95% CI | seeds for ±{100 * half_width:.0f} pts |",
             "|---|---|---|---|---|---|---|"]
    notes = []
    for arm, spec in design["arms"].items():
        if arm == ref:
            continue
        final = spec["compare"] == "final"
        what = [("held-out accuracy at the end" if final else "held-out gain, test-time SAAR off",
                 (lambda s: s["heldout"].get("eval_greedy", {}).get("acc_end")) if final else gain)]
        if not final:
            what.append(("held-out first-attempt tool err", lambda s: s["heldout"].get("eval_greedy", {}).get(
                "tool_err_end")))
        for label, key in what:
            seeds, diffs, skipped = paired(design, runs, arm, key)
            notes += [f"{arm}, {s}" for s in skipped if label == what[0][0]]
            if not diffs:
                lines.append(f"| {arm} | {label} | 0 | | | | |")
                continue
            m, sd, hw = mean_ci(diffs)
            ci = "-" if hw is None else f"{pts(m - hw)}..{pts(m + hw)}"
            need = "-" if sd is None else str(seeds_for(sd, half_width))
            lines.append(f"| {arm} | {label} | {len(diffs)} | {' '.join(pts(d) for d in diffs)} | {pts(m)} | {ci} | "
                         f"{need} |")
    return lines + [f"not paired: {n}" for n in notes]


def internalization(design: dict, runs: dict) -> list[str]:
    """Each arm's trained policies scored with test-time SAAR on minus off (the paper: under 1 point)."""
    lines = ["| arm | seeds | on minus off, per seed (pts) | mean (pts) | 95% CI |", "|---|---|---|---|---|"]
    for arm in design["arms"]:
        diffs = [h["eval_greedy_saar"]["acc_end"] - h["eval_greedy"]["acc_end"]
                 for h in (s["heldout"] for s in runs.get(arm, {}).values())
                 if "eval_greedy_saar" in h and "eval_greedy" in h]
        if diffs:
            m, _, hw = mean_ci(diffs)
            ci = "-" if hw is None else f"{pts(m - hw)}..{pts(m + hw)}"
            lines.append(f"| {arm} | {len(diffs)} | {' '.join(pts(d) for d in diffs)} | {pts(m)} | {ci} |")
    return lines


def report(folder: str, design: dict, plots: bool = True) -> str:
    runs = load_runs(folder)
    commits = sorted({s["commit"][:7] + ("+diff" if s["diff"] else "") for r in runs.values() for s in r.values()})
    out = [f"# {os.path.basename(os.path.normpath(folder))}: {sum(map(len, runs.values()))} of "
           f"{len(plan(design))} runs finished (commits {', '.join(commits) or '-'})", "",
           "Per arm, mean ± std over seeds (held-out: after the last step, greedy; training: its last third):", "",
           *arm_table(design, runs), "", f"Paired by seed against {design['reference']}:", "",
           *comparisons(design, runs), "", "Test-time SAAR, on minus off, on each arm's trained policies:", "",
           *internalization(design, runs)]
    if plots and runs:
        by_arm = {arm: [os.path.join(folder, "runs", f"{arm}-s{s}") for s in sorted(r)] for arm, r in runs.items()}
        metrics = {p: plot_runs.read_metrics(p) for ps in by_arm.values() for p in ps}
        written = plot_runs.plot(by_arm, metrics, os.path.join(folder, "img"))
        out += ["", "curves: " + " ".join(os.path.relpath(p, folder) for p in written)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the experiment's folder, with experiment.json (docs/experiments/NAME)")
    p.add_argument("--seeds", default="", help="run only these seeds, a comma list (default: all)")
    p.add_argument("--out-dir", default="", help="where the runs' folders go (default: out/NAME)")
    p.add_argument("--report", action="store_true", help="run nothing: the tables and curves from the summaries")
    a = p.parse_args(argv)
    design = load_design(a.folder)
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else None
    out_dir = a.out_dir or os.path.join("out", os.path.basename(os.path.normpath(a.folder)))
    if not a.report:
        run_all(a.folder, design, os.path.abspath(out_dir), seeds)
    text = report(a.folder, design)
    with open(os.path.join(a.folder, "tables.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
