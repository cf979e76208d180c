"""machinery/plots.py: the curves of train.py run folders, drawn by matplotlib: each seed a thin line, each arm's
mean a thick one. scripts/plot_runs.py (and scripts/experiment.py) save them as PNGs; machinery/report.py embeds the
same figures in a run's report.html.

An arm is a run's name without its trailing `-s<seed>` (saar-on-s0, saar-on-s1 -> arm saar-on). Reads only what
train.py wrote: metrics.jsonl, one line per step, step 0 being the held-out baseline.
"""
from __future__ import annotations

import json
import os
import re
import statistics
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
