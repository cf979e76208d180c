"""The paper's results table, in Markdown, from saved eval.py record files, beside the published figures.

    python scripts/table.py out/eval/*.jsonl [--published data/published.json]

One row per record file, named by the file (out/eval/qwen3-4b-cleaner.jsonl -> qwen3-4b-cleaner); one column per
benchmark, as the paper's table has them: AIME24, AIME25, GPQA-Diamond, LiveCodeBench-v6. A cell is the paper's
metric, mean@n (the average pass@1 over the n samples the records have), with pass@n beside it, in percent. Where
data/published.json maps the run to a published row, the published figure follows with ours minus it, in points.
A file that holds both test-time SAAR settings (eval.py --saar both) is read in the paper's (eval.py --saar paper).

The records are read by data.benchmarks.read_records and scored by eval.summarize, so every number is the one
`eval.py --score` prints for the same file; nothing is graded here (re-grade with eval.py --score F --out F).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import config  # noqa: E402
import eval as ev  # noqa: E402
from data.benchmarks import read_records  # noqa: E402
from data.problems import DataError  # noqa: E402

# the paper's names for eval.py's benchmarks; the columns follow eval.BENCHMARKS' order
TITLES = {"aime24": "AIME24", "aime25": "AIME25", "gpqa": "GPQA-Diamond", "lcb": "LiveCodeBench-v6"}
PAPER_SAAR = config.EvalSaar(saar="paper")


def read_run(path: str) -> tuple[dict, list[dict]]:
    """eval.summarize of one record file, and its records."""
    records = read_records(path, {name: b.task for name, b in ev.BENCHMARKS.items()})
    for i, rec in enumerate(records, 1):
        # summarize counts a missing grade as wrong: refuse it rather than print a low score
        if not isinstance(rec.get("correct"), bool):
            raise DataError(f"{path}: record {i} is not graded ('correct' is {rec.get('correct')!r}); "
                            f"grade it with: python eval.py --score {path} --out {path}")
    return ev.summarize(records), records


def in_paper_setting(summary: dict, records: list[dict], bench: str) -> tuple[dict | None, str | None]:
    """The benchmark's figures in the paper's test-time SAAR setting, and a note when the file ran only the other."""
    (paper_on,) = ev.saar_settings(PAPER_SAAR, bench)
    if bench in summary:  # one setting only: summarize labels it by the benchmark alone
        ran_on = next(r["saar"] for r in records if r["benchmark"] == bench)
        note = None if ran_on == paper_on else (f"{TITLES[bench]} ran with test-time SAAR {'on' if ran_on else 'off'}"
                                                f", the paper's setting is {'on' if paper_on else 'off'}")
        return summary[bench], note
    return summary.get(f"{bench} saar={'on' if paper_on else 'off'}"), None


def cell(s: dict | None, row: dict | None, bench: str) -> str:
    """mean@n / pass@n (n=...), then the published figure and ours minus it, where there is one."""
    if s is None:
        return "-"
    ours = 100 * s["mean@n"]
    text = f"{ours:.1f} / {100 * s['pass@k'][s['n']]:.1f} (n={s['n']})"
    if row is None:  # no published counterpart
        return text
    if "not_available" in row:
        return text + "; published: not available"
    if bench not in row:
        return text
    return text + f"; published {row[bench]:.1f} ({ours - row[bench]:+.1f})"


def load_published(path: str) -> dict:
    try:
        pub = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"published figures {path}: {e}") from None
    for run, name in pub["runs"].items():  # a typo in the mapping would silently drop a comparison
        if name not in pub["rows"]:
            raise DataError(f"{path}: run {run!r} maps to {name!r}, which is not among its rows")
    return pub


def table(paths: list[str], pub: dict) -> str:
    benches = [b for b in ev.BENCHMARKS if b in TITLES]
    lines = ["| run | " + " | ".join(TITLES[b] for b in benches) + " |", "|---" * (len(benches) + 1) + "|"]
    notes = []
    for path in paths:
        run = Path(path).stem
        summary, records = read_run(path)
        name = pub["runs"].get(run)
        row = pub["rows"][name] if name else None
        cells = []
        for bench in benches:
            s, note = in_paper_setting(summary, records, bench)
            cells.append(cell(s, row, bench))
            if note:
                notes.append(f"- {run}: {note}.")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
        if row is not None and "not_available" in row:
            notes.append(f"- {run}: published row {name}: not available: {row['not_available']}.")
        elif row is not None:
            notes.append(f"- {run}: published row {name}, from {pub['sources'][row['source']]}.")
    head = ("Cells: mean@n / pass@n in percent (n samples per problem, as the records have them), in the paper's "
            "test-time SAAR setting; then the published figure and ours minus it, in points. '-': not evaluated.")
    return "\n".join([head, ""] + lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", nargs="+", help="eval.py record files (out/eval/<run>.jsonl); one row each")
    p.add_argument("--published", default=str(ROOT / "data" / "published.json"),
                   help="published figures, their sources and the run -> row mapping")
    a = p.parse_args(argv)
    try:
        print(table(a.records, load_published(a.published)))
    except DataError as e:  # a missing file or a malformed record: one line, no traceback
        raise SystemExit(f"table.py: {e}") from None


if __name__ == "__main__":
    main()
