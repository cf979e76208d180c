"""Curves and a table from train.py run folders: each seed a thin line, each arm's mean a thick one.

An arm is a run's name without its trailing `-s<seed>` (saar-on-s0, saar-on-s1 -> arm saar-on). Reads only
what train.py wrote: metrics.jsonl (one line per step, step 0 is the held-out baseline) and summary.json.

    python scripts/plot_runs.py out/saar-on-s0 out/saar-on-s1 out/saar-off-s0 out/saar-off-s1 --out docs/img

Writes one PNG per figure into --out and prints a markdown table of final figures (mean +- std over seeds).
machinery/plots.py draws each figure (FIGURES); machinery/report.py embeds the same figures in a run's report.html.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout: machinery/, eval.py
from machinery.plots import FIGURES, arm_of, draw, plot, read_metrics, seed_of, series  # noqa: E402,F401


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
