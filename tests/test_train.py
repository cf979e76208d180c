"""train.py end to end in subprocesses: a short run, SIGKILL mid-step, --resume, bit-for-bit continuation."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "tiny-qwen3", "--no-warm-start", "--tool-format", "hermes", "--prompts-per-step", "2",
         "--samples-per-prompt", "2", "--mini-batch-prompts", "1", "--max-response-tokens", "24",
         "--overlong-buffer", "8", "--eval-every", "0", "--dump-rollouts", "2", "--deterministic", "--lr", "1e-3",
         "--sandbox-slots", "1", "--seed", "3"]


def start(out: Path, run: str, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.Popen([sys.executable, "train.py", *SMALL, "--out-dir", str(out), "--run-name", run, *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def metrics(folder: Path) -> dict:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}  # a repeated step keeps its last line


def test_overlong_penalty_ramp():
    assert train.overlong_penalty(100, 200, 50, 1.0) == 0.0
    assert train.overlong_penalty(150, 200, 50, 1.0) == 0.0
    assert train.overlong_penalty(175, 200, 50, 1.0) == pytest.approx(-0.5)
    assert train.overlong_penalty(200, 200, 50, 1.0) == pytest.approx(-1.0)
    assert train.overlong_penalty(200, 200, 0, 1.0) == 0.0


def test_kill_mid_step_then_resume_is_bit_identical(tmp_path):
    ref = start(tmp_path, "ref", "--steps", "2")
    killed = start(tmp_path, "cut", "--steps", "2")
    # kill the second run with SIGKILL once step 1 is checkpointed, i.e. during step 2
    ckpt = tmp_path / "cut" / "ckpt.pt"
    deadline = time.time() + 600
    while not ckpt.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None, "the run ended before it could be killed mid-step"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    out_ref, _ = ref.communicate(timeout=900)
    assert ref.returncode == 0, out_ref[-3000:]
    assert torch.load(ckpt, weights_only=False)["step"] == 1  # at most the running step is lost
    resumed = start(tmp_path, "cut", "--steps", "2", "--resume")
    out_res, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out_res[-3000:]
    assert "resumed" in out_res
    a, b = metrics(tmp_path / "ref"), metrics(tmp_path / "cut")
    for key in ("reward", "acc", "resp_len", "tool_calls", "loss", "pg_loss"):
        if key in a[2]:
            assert a[2][key] == b[2][key], key
    wa, wb = load_file(tmp_path / "ref" / "hf" / "model.safetensors"), load_file(tmp_path / "cut" / "hf" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # the run folder reproduces the run
    info = json.loads((tmp_path / "ref" / "run.json").read_text())
    assert info["args"]["seed"] == 3 and info["commit"] is not None
    assert (tmp_path / "ref" / "packages.txt").read_text().count("torch==") == 1
    dumped = (tmp_path / "ref" / "rollouts" / "step_000002.jsonl").read_text().splitlines()
    assert len(dumped) == 2 and "saar_events" in json.loads(dumped[0])
    assert "step    2 | reward" in out_ref
