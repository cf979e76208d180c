"""scripts/plot_runs.py: arms from run names, one PNG per figure, and the mean +- std table over seeds."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import plot_runs  # noqa: E402


def write_run(folder: Path, rewards: list[float], acc0: float, acc1: float, err: float):
    folder.mkdir(parents=True)
    rows = [dict(step=0, eval_greedy_acc=acc0, eval_greedy_tool_err=0.5)]
    rows += [dict(step=i + 1, reward=r, first_tool_err=err, tool_calls=1.0, resp_len=100.0 + i,
                  saar_similarity=[0.4, 0.7]) for i, r in enumerate(rewards)]
    rows[-1].update(eval_greedy_acc=acc1, eval_greedy_tool_err=0.25)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken line\n")
    # the last evaluation per problem: 10 problems, the first round(10 * acc1) solved
    recs = [dict(id=f"p{i}", ok=i < round(10 * acc1), calls=1, errors=0, eval="eval_greedy") for i in range(10)]
    (folder / f"eval_step{len(rewards):06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_arm_names():
    assert plot_runs.arm_of("out/saar-on-s12/") == "saar-on" and plot_runs.arm_of("demo") == "demo"


def test_plots_and_table(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "on-s0", [-1.0, -0.5, 0.0], 0.4, 0.6, 0.2)
    write_run(tmp_path / "on-s1", [-1.0, 0.0, 0.5], 0.5, 0.6, 0.4)
    write_run(tmp_path / "off-s0", [-1.0, -1.0, -1.0], 0.4, 0.4, 0.6)
    out = tmp_path / "img"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_runs.py"), *(str(tmp_path / r) for r in
                          ("on-s0", "on-s1", "off-s0")), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["eval_greedy_acc.png", "first_tool_err.png", "resp_len.png", "reward.png", "tool_calls.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert "not JSON, skipped" in run.stdout
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in run.stdout.splitlines() if line.startswith("| on") or line.startswith("| off")}
    # arm "on": final held-out acc 0.6 and 0.6; last-third reward 0.0 and 0.5 -> 0.25 +- 0.354
    assert table["on"][0] == "2" and table["on"][1] == "0.600 ± 0.000" and table["on"][4] == "0.250 ± 0.354"
    assert table["off"][0] == "1" and table["off"][4] == "-1.000 ± 0.000"
    assert table["on"][2] == "-"  # no test-time SAAR evaluation in these runs
    # two arms: paired seed by seed on the same problems (seed 0 only: off has no s1); on solves p0-p5, off p0-p3
    assert "seed 0, eval_greedy: on - off = +20.0 pts (95% CI" in run.stdout
    assert "eval_greedy: on - off over 1 seeds = +20.0 ± 0.0 pts" in run.stdout
