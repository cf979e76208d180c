"""scripts/experiment.py: 2 seeds x 2 arms x 1 step of the tiny model run for real, the runner killed once and
started again (it resumes, and skips what is finished), the summaries and tables checked against the runs' own
records; the statistics against a hand computation."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import experiment  # noqa: E402

TINY = ["--model", "tiny-qwen3", "--no-warm-start", "--tool-format", "hermes", "--steps", "1", "--prompts-per-step", "2",
        "--samples-per-prompt", "2", "--mini-batch-prompts", "1", "--max-response-tokens", "24", "--overlong-buffer",
        "8", "--eval-size", "4", "--eval-saar", "both", "--dump-rollouts", "2", "--sandbox-slots", "1"]


def runner(folder: Path, out: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "scripts/experiment.py", str(folder), "--out-dir", str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_two_seeds_two_arms_killed_resumed_and_tabled(tmp_path):
    folder, out = tmp_path / "mini", tmp_path / "out"
    folder.mkdir()
    design = {"reference": "saar", "seeds": [0, 1], "train": TINY,
              "arms": {"saar": {"flags": []}, "mask-failed": {"flags": ["--no-saar", "--mask-failed"]}}}
    (folder / "experiment.json").write_text(json.dumps(design))
    # the first run is killed, the runner with it, the moment its checkpoint is on disk
    p = runner(folder, out)
    first = out / "saar-s0"
    deadline = time.time() + 300
    while not (first / "ckpt.pt").exists():
        assert p.poll() is None and time.time() < deadline, p.stdout.read()
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGSTOP)  # the state at the kill, frozen
    done_at_kill = experiment.finished(str(first))
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (folder / "runs" / "saar-s0").exists()  # nothing collected from a run the runner did not see end
    # started again: it resumes the killed run (or, had it ended, only collects it) and runs the other three
    p = runner(folder, out)
    log = p.communicate(timeout=600)[0]
    assert p.returncode == 0, log
    assert ("[saar-s0] resuming from its checkpoint" in log) != done_at_kill, log
    assert log.count("python train.py") == 3 + (not done_at_kill)
    assert ("resumed " in (first / "train.log").read_text()) != done_at_kill  # train.py took the checkpoint
    runs = experiment.load_runs(str(folder))
    assert sorted((a, sorted(r)) for a, r in runs.items()) == [("mask-failed", [0, 1]), ("saar", [0, 1])]
    for arm, by_seed in runs.items():
        for seed, s in by_seed.items():
            run = out / f"{arm}-s{seed}"
            info = json.loads((run / "run.json").read_text())
            assert s["commit"] == info["commit"] and s["cold_start"] == "tiny-qwen3" == info["cold_start"]
            assert info["args"]["mask_failed"] == (arm == "mask-failed") and info["args"]["seed"] == seed
            recs = [json.loads(x) for x in (run / "eval_step000001.jsonl").read_text().splitlines()]
            for kind in ("eval_greedy", "eval_greedy_saar"):
                ok = [r["ok"] for r in sorted(recs, key=lambda r: r["id"]) if r["eval"] == kind]
                assert s["heldout"][kind]["ok_end"] == "".join("01"[x] for x in ok)
                assert s["heldout"][kind]["acc_end"] == sum(ok) / 4
            assert (folder / "runs" / f"{arm}-s{seed}" / "metrics.jsonl").read_bytes() == \
                (run / "metrics.jsonl").read_bytes()
        # the arms of a seed shared the step-0 evaluation (the eval cache), so they pair
        assert (folder / f"report-{arm}.html").stat().st_size > 10_000
    assert [runs["saar"][s]["step0"] for s in (0, 1)] == [runs["mask-failed"][s]["step0"] for s in (0, 1)]
    # a third start runs nothing, and the tables come from the summaries
    p = runner(folder, out, "--report")
    text = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and "python train.py" not in text, text
    assert "4 of 4 runs finished" in text and "| mask-failed | held-out gain, test-time SAAR off | 2 |" in text
    assert (folder / "img" / "reward.png").exists() and (folder / "tables.md").read_text().strip() == text.strip()


def test_statistics_equal_a_hand_computation():
    # Student's t, 97.5th percentile, from printed tables
    for df, t in [(1, 12.706), (2, 4.303), (7, 2.365), (29, 2.045)]:
        assert experiment.t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
    # differences +10, -5, +4 points: mean 3, sd sqrt(((7)^2 + (-8)^2 + 1^2) / 2) = sqrt(57)
    m, sd, hw = experiment.mean_ci([0.10, -0.05, 0.04])
    assert m == pytest.approx(0.03) and sd == pytest.approx(math.sqrt(57) / 100)
    assert hw == pytest.approx(4.303 * math.sqrt(57) / 100 / math.sqrt(3), rel=1e-3)
    assert experiment.mean_ci([0.2]) == (0.2, None, None)
    # seeds for a ±3-point interval at sd 10 points: the first n with t(n-1) * 10 / sqrt(n) <= 3, from the table's
    # t(44) = 2.0154 and t(45) = 2.0141, is 46
    assert 2.0141 * 10 / math.sqrt(46) <= 3 < 2.0154 * 10 / math.sqrt(45)
    assert experiment.seeds_for(0.10, 0.03) == 46

    def summary(arm, seed, start, end, cold="c", step0="h"):
        h = dict(acc_start=start, acc_end=end, tool_err_end=0.1, tool_calls_end=1.0)
        return dict(arm=arm, seed=seed, cold_start=cold, step0=step0,
                    heldout={"eval_greedy": h, "eval_greedy_saar": dict(h, acc_end=end + 0.01)},
                    train=dict(first_tool_err_last_third=0.2, tool_calls_last_third=1.0, resp_len_last_third=100.0))
    design = {"reference": "a", "arms": {"a": {"compare": "gain"}, "b": {"compare": "gain"}}}
    runs = {"a": {0: summary("a", 0, 0.5, 0.7), 1: summary("a", 1, 0.4, 0.5), 2: summary("a", 2, 0.3, 0.34),
                  3: summary("a", 3, 0.3, 0.4)},
            "b": {0: summary("b", 0, 0.5, 0.6), 1: summary("b", 1, 0.4, 0.55), 2: summary("b", 2, 0.3, 0.3),
                  3: summary("b", 3, 0.3, 0.4, cold="other")}}
    seeds, diffs, skipped = experiment.paired(design, runs, "b")
    assert seeds == [0, 1, 2] and diffs == pytest.approx([0.10, -0.05, 0.04]) and len(skipped) == 1  # seed 3 unpaired
    rows = experiment.comparisons(design, runs)
    hw = 4.303 * math.sqrt(57) / math.sqrt(3)  # points
    assert f"| b | held-out gain, test-time SAAR off | 3 | +10.0 -5.0 +4.0 | +3.0 | {3 - hw:+.1f}..{3 + hw:+.1f} |" \
        in "\n".join(rows)
    assert any(r.startswith("not paired: b, seed 3") for r in rows)
    assert "| a | 4 | +1.0 +1.0 +1.0 +1.0 | +1.0 |" in "\n".join(experiment.internalization(design, runs))


def test_a_summary_holds_the_runs_own_figures(tmp_path):
    """collect on a run folder written by hand, its summary.json by eval.summary as train.py writes it: accuracy and
    first-attempt tool errors per call at both ends, the calls, the training thirds, as computed here."""
    import eval as heldout
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"commit": "abc", "cold_start": "c0"}))
    (run / "git.diff").write_text("")
    (run / "train.log").write_text("done: out/run in 12 s\n")
    rewards = [-1.0, -0.5, 0.0, 0.5, 1.0, 1.0]
    (run / "metrics.jsonl").write_text("".join(json.dumps(dict(
        step=k + 1, reward=r, first_tool_err=0.1 * k, tool_calls=1.0 + k, resp_len=100 + k)) + "\n"
        for k, r in enumerate(rewards)))
    recs = {0: {"eval_greedy": [(1, 2, 1), (0, 1, 1), (0, 0, 0), (1, 1, 0)],  # (ok, calls, errors) by problem id
                "eval_greedy_saar": [(1, 2, 0), (0, 1, 0), (0, 0, 0), (0, 1, 1)]},
            6: {"eval_greedy": [(1, 1, 0), (1, 1, 0), (1, 2, 1), (0, 0, 0)],
                "eval_greedy_saar": [(1, 1, 0), (1, 1, 0), (0, 3, 0), (0, 0, 0)]}}
    for step, kinds in recs.items():
        (run / f"eval_step{step:06d}.jsonl").write_text("".join(
            json.dumps(dict(eval=kind, id=f"p{i}", ok=ok, calls=c, errors=e)) + "\n"
            for kind, rows in kinds.items() for i, (ok, c, e) in enumerate(rows)))
    heldout.summary(str(run), 6)
    s = experiment.collect(str(run), str(tmp_path / "dest"), "saar", 3, ["--x"])
    g, on = s["heldout"]["eval_greedy"], s["heldout"]["eval_greedy_saar"]
    assert (g["acc_start"], g["acc_end"], on["acc_start"], on["acc_end"]) == (0.5, 0.75, 0.25, 0.5)
    assert (g["tool_err_start"], g["tool_err_end"], on["tool_err_start"], on["tool_err_end"]) == (2 / 4, 1 / 4, 1 / 4, 0)
    assert (g["ok_start"], g["ok_end"], g["tool_calls_end"], g["n"]) == ("1001", "1110", 1.0, 4)
    t = s["train"]
    assert t["reward_first_third"] == -0.75 and t["reward_last_third"] == 1.0 and t["tool_calls_last_third"] == 5.5
    assert t["first_tool_err_last_third"] == pytest.approx(0.45) and t["resp_len_last_third"] == 104.5
    assert (s["commit"], s["cold_start"], s["wall_s"], s["steps"]) == ("abc", "c0", 12.0, 6)
    assert json.loads((tmp_path / "dest" / "summary.json").read_text()) == s


def test_git_keeps_an_experiments_runs():
    """An experiment's runs/ is committed: no .gitignore pattern may hide it (an unanchored `runs/` once did)."""
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", "docs/experiments/x/runs/a-s0/summary.json"], cwd=ROOT)
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.returncode == 1, "git ignores docs/experiments/*/runs/ (see .gitignore)"
