"""Curves and a table from train.py run folders: each seed a thin line, each arm's mean a thick one.

An arm is a run's name without its trailing `-s<seed>` (saar-on-s0, saar-on-s1 -> arm saar-on). Reads only
what train.py wrote: metrics.jsonl (one line per step, step 0 is the held-out baseline) and summary.json.

    python scripts/plot_runs.py out/saar-on-s0 out/saar-on-s1 out/saar-off-s0 out/saar-off-s1 --out docs/img

Writes one PNG per figure into --out and prints a markdown table of final figures (mean +- std over seeds).
`draw` makes each figure of FIGURES; report.py embeds the same figures in a run's report.html.
With two arms, it also pairs them seed by seed on the same held-out problems (the runs' last eval_step*.jsonl):
the accuracy of the first arm's policy minus the second's, with its paired 95% CI.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections import defaultdict

# (name, metrics.jsonl keys, title, y label): one figure each, drawn when some run has one of its keys (eval keys
# exist only on evaluated steps). A figure of several keys puts them side by side, as SAAR's decisions or the phases.
FIGURES = [
    ("reward", ("reward",), "training reward", "mean reward per trajectory"),
    ("eval_greedy_acc", ("eval_greedy_acc",), "held-out accuracy (greedy, test-time SAAR off)", "accuracy"),
    ("eval_greedy_saar_acc", ("eval_greedy_saar_acc",), "held-out accuracy (greedy, test-time SAAR on)", "accuracy"),
    ("tool_err", ("tool_err",), "tool errors per call (every execution, SAAR's retries too)", "failed / calls"),
    ("first_tool_err", ("first_tool_err",), "tool-error rate of first attempts (before SAAR)",
     "failed / first-attempt calls"),
    ("saar", ("saar_shallow", "saar_deep", "saar_given_up"), "SAAR decisions", "events per step"),
    ("mismatch_kl", ("mismatch_kl",), "engine/trainer mismatch KL (sampled tokens)", "KL"),
    ("tool_calls", ("tool_calls",), "tool calls per trajectory", "executions per trajectory"),
    ("resp_len", ("resp_len",), "response length", "tokens"),
    ("phases", ("t_rollout", "t_reward", "t_old_logp", "t_update", "t_sync"), "time per phase", "seconds per step"),
]
STYLES = ("-", "--", ":", "-.")  # an arm's line style where colours tell keys apart


def arm_of(run: str) -> str:
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run)))


def seed_of(run: str) -> str | None:
    m = re.search(r"-s(\d+)$", os.path.basename(os.path.normpath(run)))
    return m.group(1) if m else None


def read_metrics(run: str, warn=print) -> list[dict]:
    """A run's metrics.jsonl, a row per step; a line that is not a step's JSON is skipped and told to warn."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"{run}: no metrics.jsonl (is this a train.py run folder?)")
    rows = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            try:
                r = json.loads(line)
                step = r["step"]
            except (json.JSONDecodeError, TypeError, KeyError):
                warn(f"{path}:{i}: not JSON, skipped (a run killed mid-write?)")
                continue
            rows[step] = {**rows.get(step, {}), **r}  # step 0 (eval) and a resumed step merge
    return [rows[k] for k in sorted(rows)]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def draw(figure: tuple, runs_by_arm: dict[str, list[str]], metrics: dict[str, list[dict]]):
    """One FIGURES entry as a matplotlib figure (the caller saves and closes it), or None when no run has its keys.
    Each seed a thin line, each arm's mean a thick one; with several keys, a colour per key and a style per arm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    _, keys, title, ylabel = figure
    has = [k for k in keys if any(series(metrics[r], k)[0] for runs in runs_by_arm.values() for r in runs)]
    if not has:
        return None
    colors, many = plt.rcParams["axes.prop_cycle"].by_key()["color"], len(keys) > 1
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (arm, runs) in enumerate(runs_by_arm.items()):
        for j, key in enumerate(has):
            c, ls = (colors[j % len(colors)], STYLES[i % len(STYLES)]) if many else (colors[i % len(colors)], "-")
            name = (f"{key}" if len(runs_by_arm) == 1 else f"{arm} {key}") if many else arm
            per_step = defaultdict(list)
            for r in runs:
                xs, ys = series(metrics[r], key)
                ax.plot(xs, ys, color=c, ls=ls, lw=0.8, alpha=0.45, marker="o" if len(xs) < 4 else None, ms=3)
                for x, y in zip(xs, ys):
                    per_step[x].append(y)
            xs = sorted(x for x, v in per_step.items() if len(v) == len(runs))  # the mean where every seed has a point
            ax.plot(xs, [statistics.mean(per_step[x]) for x in xs], color=c, ls=ls, lw=2.5,
                    label=f"{name} (n={len(runs)})", marker="o" if len(xs) < 4 else None)
    ax.set(title=title, xlabel="GRPO step", ylabel=ylabel)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps are whole
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot(runs_by_arm: dict[str, list[str]], metrics: dict[str, list[dict]], out: str) -> list[str]:
    """Each figure that has data as <out>/<name>.png; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out, exist_ok=True)
    written = []
    for figure in FIGURES:
        fig = draw(figure, runs_by_arm, metrics)
        if fig is None:
            continue
        path = os.path.join(out, f"{figure[0]}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def table(runs_by_arm: dict[str, list[str]], metrics: dict[str, list[dict]]) -> str:
    """Final figures per arm, mean +- std over seeds: held-out (last evaluation) and training (last third of steps)."""
    def last(rows, key):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return vals[-1] if vals else None

    def last_third(rows, key):
        vals = [r[key] for r in rows if r["step"] > 0 and isinstance(r.get(key), (int, float))]
        vals = vals[len(vals) - max(1, len(vals) // 3):]
        return statistics.mean(vals) if vals else None

    cols = [("held-out acc, SAAR off", last, "eval_greedy_acc"), ("held-out acc, SAAR on", last, "eval_greedy_saar_acc"),
            ("held-out first-attempt tool err", last, "eval_greedy_tool_err"),
            ("train reward (last third)", last_third, "reward"),
            ("train first-attempt tool err (last third)", last_third, "first_tool_err"),
            ("tool calls / traj (last third)", last_third, "tool_calls"),
            ("response length (last third)", last_third, "resp_len")]
    lines = ["| arm | seeds | " + " | ".join(c[0] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for arm, runs in runs_by_arm.items():
        cells = []
        for _, fn, key in cols:
            vals = [v for v in (fn(metrics[r], key) for r in runs) if v is not None]
            if not vals:
                cells.append("-")
            else:
                sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                cells.append(f"{statistics.mean(vals):.3f} ± {sd:.3f}")
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_arms(runs_by_arm: dict[str, list[str]]) -> list[str]:
    """Per seed, the end-of-run held-out accuracy of arm A minus arm B on the same problems, per evaluation kind."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from eval import paired_ci  # the same paired CI as a run's own summary
    (a, runs_a), (b, runs_b) = runs_by_arm.items()
    lines, diffs = [], defaultdict(list)
    for ra in runs_a:
        rb = next((r for r in runs_b if seed_of(r) is not None and seed_of(r) == seed_of(ra)), None)
        if rb is None:
            continue
        ends = [sorted(f for f in os.listdir(r) if re.fullmatch(r"eval_step\d+\.jsonl", f)) for r in (ra, rb)]
        if not all(ends):
            continue
        recs = [[json.loads(x) for x in open(os.path.join(r, e[-1]))] for r, e in ((ra, ends[0]), (rb, ends[1]))]
        for key in dict.fromkeys(r["eval"] for r in recs[0]):
            ok_a = {r["id"]: r["ok"] for r in recs[0] if r["eval"] == key}
            ok_b = {r["id"]: r["ok"] for r in recs[1] if r["eval"] == key}
            ids = [i for i in ok_a if i in ok_b]
            if not ids:
                continue
            d, lo, hi = paired_ci([ok_b[i] for i in ids], [ok_a[i] for i in ids])
            diffs[key].append(d)
            lines.append(f"seed {seed_of(ra)}, {key}: {a} - {b} = {100 * d:+.1f} pts (95% CI {100 * lo:+.1f}..{100 * hi:+.1f}, "
                         f"{len(ids)} problems)")
    for key, ds in diffs.items():
        sd = statistics.stdev(ds) if len(ds) > 1 else 0.0
        lines.append(f"{key}: {a} - {b} over {len(ds)} seeds = {100 * statistics.mean(ds):+.1f} ± {100 * sd:.1f} pts")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="train.py run folders (out/<run>)")
    p.add_argument("--out", default="docs/img", help="folder for the PNGs")
    a = p.parse_args()
    runs_by_arm: dict[str, list[str]] = defaultdict(list)
    for r in a.runs:
        runs_by_arm[arm_of(r)].append(r)
    metrics = {r: read_metrics(r) for r in a.runs}
    for path in plot(runs_by_arm, metrics, a.out):
        print(f"wrote {path}")
    print(table(runs_by_arm, metrics))
    if len(runs_by_arm) == 2:
        for line in paired_arms(runs_by_arm):
            print(line)
    for arm, runs in runs_by_arm.items():
        for r in runs:
            s = os.path.join(r, "summary.json")
            if os.path.exists(s):
                for line in json.load(open(s)).get("lines", []):
                    print(f"{os.path.basename(os.path.normpath(r))}: {line}")


if __name__ == "__main__":
    main()
