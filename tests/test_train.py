"""train.py end to end in subprocesses: a short run, SIGKILL mid-step, --resume, bit-for-bit continuation."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import config
import reward
import train
from data import problems
from machinery import checkpoint

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "tiny-qwen3", "--no-warm-start", "--tool-format", "hermes", "--prompts-per-step", "2",
         "--samples-per-prompt", "2", "--mini-batch-prompts", "1", "--max-response-tokens", "24",
         "--overlong-buffer", "8", "--eval-size", "0", "--dump-rollouts", "2", "--deterministic", "--lr", "1e-3",
         "--sandbox-slots", "1", "--seed", "3", "--no-eval-cache"]


def parse(*argv) -> config.Train:
    """train.py's command line, as its __main__ parses it (flat flags, --faithful applied)."""
    return config.cli(train.Args, "", list(argv))


def start(out: Path, run: str, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.Popen([sys.executable, "train.py", *SMALL, "--out-dir", str(out), "--run-name", run, *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def metrics(folder: Path) -> dict:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}  # a repeated step keeps its last line


def test_overlong_penalty_ramp():
    assert reward.overlong_penalty(100, 200, 50, 1.0) == 0.0
    assert reward.overlong_penalty(150, 200, 50, 1.0) == 0.0
    assert reward.overlong_penalty(175, 200, 50, 1.0) == pytest.approx(-0.5)
    assert reward.overlong_penalty(200, 200, 50, 1.0) == pytest.approx(-1.0)
    assert reward.overlong_penalty(200, 200, 0, 1.0) == 0.0


def test_kill_mid_step_then_resume_is_bit_identical(tmp_path):
    # the tiny random model earns no reward, so its advantages are 0: a large weight decay is what moves its weights
    moved = ["--steps", "2", "--weight-decay", "30"]
    ref = start(tmp_path, "ref", *moved)
    killed = start(tmp_path, "cut", *moved)
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
    resumed = start(tmp_path, "cut", *moved, "--resume")
    out_res, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out_res[-3000:]
    assert "resumed" in out_res
    a, b = metrics(tmp_path / "ref"), metrics(tmp_path / "cut")
    for key in ("reward", "acc", "resp_len", "tool_calls", "loss", "pg_loss"):
        if key in a[2]:
            assert a[2][key] == b[2][key], key
    # the resumed step samples from the checkpoint's weights: the same rollouts, an engine that agrees with the
    # trainer (a resumed run once sampled its first step from the cold start's weights, which the engine was built on)
    step2 = [(tmp_path / r / "rollouts" / "step_000002.jsonl").read_text() for r in ("ref", "cut")]
    assert step2[0] == step2[1]
    assert b[2]["mismatch_kl"] < 1e-9 and "warning: step" not in out_res, out_res[-3000:]
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
    # the engine/trainer monitor of an ordinary run (the first mini-batch's old log-probs from the update's own
    # pass): under the bound of an fp32 run, 1e-9, and quiet (tests/test_mismatch.py has the stale control)
    assert all(0 <= a[s]["mismatch_kl"] < 1e-9 for s in (1, 2))
    # every trained token, the first mini-batch's (whose old log-probs the update wrote back) included
    assert all(a[s]["mismatch_tokens"] + a[s]["mismatch_tokens_spliced"] == a[s]["loss_tokens"] > 0 for s in (1, 2))
    assert "warning: step" not in out_ref and "| mismatch_kl " in out_ref


def poison_updates(monkeypatch, bad) -> list:
    """Wrap grpo.update: on its n-th call (from 1) with bad(n), the first trajectory of every mini-batch gets a
    NaN old log-prob on one loss token (in the first mini-batch the update would take them from its own pass).
    Returns the sizes of the batches it was called with."""
    import grpo
    real, calls = grpo.update, []

    def poisoned(model, optimizer, scheduler, batch, cfg, how, **kw):
        calls.append(len(batch))
        if bad(len(calls)):
            for t in batch[::kw["mini_batch_size"]]:
                vals = list(t.old_logp) if t.old_logp is not None else [0.0] * len(t.input_ids)
                vals[t.loss_mask.index(1)] = float("nan")
                t.old_logp = vals
        return real(model, optimizer, scheduler, batch, cfg, how, **kw)

    monkeypatch.setattr(grpo, "update", poisoned)
    return calls


def test_a_nonfinite_update_keeps_the_weights_saves_and_stops(tmp_path, monkeypatch):
    # step 2's batch gets a NaN old log-prob: grpo.update's guard must refuse the optimizer step, and
    # train.py must save what it has (weights untouched by the bad update), name it, and stop.
    calls = poison_updates(monkeypatch, lambda n: n == 2)
    monkeypatch.chdir(ROOT)
    args = parse(*SMALL + ["--out-dir", str(tmp_path), "--run-name", "nan", "--steps", "3"])
    with pytest.raises(SystemExit, match=r"(?s)step 2: non-finite loss in mini-batch 0 .*ckpt-nonfinite-step2\.pt"):
        train.main(args)
    run = tmp_path / "nan"
    good, saved = torch.load(run / "ckpt.pt", weights_only=False), torch.load(run / "ckpt-nonfinite-step2.pt", weights_only=False)
    assert good["step"] == 1 and len(calls) == 2
    for k, v in good["model"].items():
        assert torch.equal(v, saved["model"][k]), k  # the refused update did not touch a weight
    assert sorted(metrics(run)) == [1]  # step 1 was logged; nothing of the failed step
    # the run resumes from its last good checkpoint (the batch is clean this time)
    resumed = parse(*SMALL + ["--out-dir", str(tmp_path), "--run-name", "nan", "--steps", "2", "--resume"])
    train.main(resumed)
    assert sorted(metrics(run)) == [1, 2] and len(calls) == 3


@pytest.mark.parametrize("script", ["train", "sft", "eval"])
def test_every_entry_script_prints_its_help(script):
    """Each script's --help lists each setting once, flat (no section prefixes), grouped by section."""
    run = subprocess.run([sys.executable, f"{script}.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "100"}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    flags = re.findall(r"^│ (--[a-z0-9-]+)", run.stdout, re.M)  # one column: each flag opens its line
    assert "--seed" in flags and "--help" in run.stdout and not any("." in f for f in flags)
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)


def test_every_setting_is_declared_once():
    """No flag name is declared in two sections of config.py (so no two entry scripts declare one setting), and
    train.py's sections come in order: the algorithm's, then the model's, the data's and the run's, then the
    machinery's (one heading in --help),
    SAAR's switches all in its SAAR section."""
    import dataclasses
    fields = lambda cls: [f.name for f in dataclasses.fields(cls)]  # noqa: E731
    names = [n for cls in (config.Common, config.Run, config.Data, config.Rollout, config.TrainSaar, config.Grpo,
                           config.Update, config.Engine, config.Sandbox, config.Bench) for n in fields(cls)]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, dup
    assert set(fields(config.EvalSaar)) - set(fields(config.Saar)) == {"saar"}  # eval.py's --saar paper|on|off|both
    assert set(fields(config.TrainSaar)) - set(fields(config.Saar)) == {"saar", "eval_saar"}
    train = [type(s).__name__ for s in config.sections(config.Train())]
    assert train == ["Rollout", "TrainSaar", "Grpo", "Common", "Data", "Run", "Engine", "Sandbox", "Update"]


def test_settings_that_cannot_go_together_stop_the_run_before_a_model_loads():
    """--is-mode gate scores replacements at temperature 1: with the demo's 0.6 the run stops in its setup, with
    the reason, not at its first rollout; an unknown --tools name likewise."""
    import train
    with pytest.raises(SystemExit, match="needs temperature 1.0, got 0.6"):
        train.cold_start(config.cli(config.Train, "", ["--model", "tiny-qwen3", "--is-mode", "gate"]))
    with pytest.raises(SystemExit, match="unknown 'shell'; the tools are python"):
        train.cold_start(config.cli(config.Train, "", ["--model", "tiny-qwen3", "--tools", "python,shell"]))
    import tools
    tools.offer("python")


def test_bad_choices_get_tyros_error(capsys):
    for argv in (["--agg", "bogus"], ["--is-mode", "tokens"], ["--eval-saar", "maybe"], ["--lora-rank", "-1"]):
        with pytest.raises(SystemExit) as e:
            parse(*argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and argv[0] in err, (argv, err[-500:])


def test_synth_problem_specs():
    rl, warm = (train.load_problems(s, seed=0, n=6) for s in ("synth", "synth-warmup"))
    assert {p.meta["difficulty"] for p in rl} == {"rl"} and {p.meta["difficulty"] for p in warm} == {"warmup"}
    assert len(rl) == len(warm) == 6 and {p.meta["kind"] for p in warm} == {p.meta["kind"] for p in rl}


def test_stratified_order_takes_the_kinds_in_turn():
    """--data-order stratified: the seeded permutation, each kind in its own order, the kinds in turn; any 3
    consecutive problems of the demo's 3 kinds cover all 3 (shuffled, over a third of such windows miss one)."""
    import numpy as np
    probs = train.load_problems("synth-medium:primes,digit_sum,coprime", seed=0, n=300)
    kinds = [p.meta["kind"] for p in probs]
    order = np.random.default_rng(0).permutation(len(probs)).tolist()
    strat = problems.stratified(order, kinds)
    assert sorted(strat) == list(range(300))
    assert all(len({kinds[i] for i in strat[j:j + 3]}) == 3 for j in range(0, 298))
    for k in set(kinds):  # within a kind, the permutation's order
        assert [i for i in strat if kinds[i] == k] == [i for i in order if kinds[i] == k]
    assert sum(len({kinds[i] for i in order[j:j + 3]}) < 3 for j in range(298)) > 100  # the control: shuffled
    # unequal strata: the short one runs out, the others go on in turn
    assert problems.stratified([0, 1, 2, 3, 4, 5], ["a", "a", "a", "a", "b", "c"]) == [0, 4, 5, 1, 2, 3]


def test_train_size_revisits_the_pool(tmp_path):
    """--train-size 2 with 2 prompts a step: step 2 trains on step 1's two problems again, the first two of the
    seeded order (without the flag, step 2 would take the next two). A pool larger than the set: the long-prompt test."""
    import numpy as np
    run = lambda name, *extra: train.main(parse(*SMALL + [
        "--out-dir", str(tmp_path), "--run-name", name, "--steps", "2", "--dump-rollouts", "4", *extra]))
    run("pool", "--train-size", "2")
    ids = [{json.loads(x)["meta"]["problem_id"] for x in (tmp_path / "pool" / "rollouts" / f"step_{s:06d}.jsonl")
            .read_text().splitlines()} for s in (1, 2)]
    probs = train.load_problems(config.Data.train_data, seed=3, n=None)
    order = np.random.default_rng(3).permutation(len(probs)).tolist()
    assert ids[0] == ids[1] == {probs[i].id for i in order[:2]}
    assert ids[1] != {probs[i].id for i in order[2:4]}  # the control: the next two, which a whole-set run takes


def test_held_out_eval_before_and_after_with_summary(tmp_path):
    """--eval-size N: the held-out set is scored before the first step and after the last, per problem, and the
    run ends with the gain line (both test-time SAAR modes with --eval-saar both)."""
    run = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", str(tmp_path), "--run-name", "ev",
                          "--steps", "1", "--eval-size", "3", "--eval-saar", "both"],
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    folder = tmp_path / "ev"
    rows = {s: [json.loads(x) for x in (folder / f"eval_step{s:06d}.jsonl").read_text().splitlines()] for s in (0, 1)}
    assert [len(r) for r in rows.values()] == [6, 6]  # 3 problems x (SAAR off, SAAR on)
    assert {r["eval"] for r in rows[0]} == {"eval_greedy", "eval_greedy_saar"}
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["eval_greedy"]["n"] == 3 and len(summary["lines"]) == 2
    assert summary["lines"][0].startswith("held-out accuracy ") and "95% CI" in summary["lines"][0]
    assert summary["lines"][0] in run.stdout
    m = metrics(folder)
    assert "eval_greedy_acc" in m[0] and "eval_greedy_saar_acc" in m[1] and "first_tool_err" in m[1]
    # per tool, by the name a call gives (--tools python: the code interpreter), and malformed calls apart
    assert m[1]["tool_calls_code_interpreter"] + m[1]["tool_calls_malformed"] == pytest.approx(m[1]["tool_calls"])
    # the held-out records hold each trajectory's text, its masked ranges and SAAR's events
    assert all({"response", "masked", "saar_events"} <= set(r) for r in rows[1])
    assert (folder / "report.html").exists() and "report: " in run.stdout
    # the step's wall time holds its phases and its evaluation
    phases = sum(m[1][f"t_{k}"] for k in ("rollout", "reward", "old_logp", "update", "sync", "eval"))
    assert phases <= m[1]["t_wall"] < phases + 30
    assert re.search(r"^step +1 \|.* sync [0-9.]+s \|", run.stdout, re.M), run.stdout[-2000:]
    assert re.search(r"^done: \S+ in \d+ s$", run.stdout, re.M), run.stdout[-2000:]


def test_eval_only_adds_test_time_saar_to_a_finished_run(tmp_path):
    """--eval-only scores an existing run's warm start (step 0) or, with --resume, its checkpoint, with the run's
    own settings: the new kind joins eval_step*.jsonl, metrics.jsonl and the summary; run.json stays the run's."""
    def train_py(*extra):
        r = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", str(tmp_path), "--run-name", "ev",
                            "--eval-size", "3", *extra], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout
    train_py("--steps", "1")
    folder = tmp_path / "ev"
    run_json = (folder / "run.json").read_text()
    ckpt = (folder / "ckpt.pt").stat().st_mtime_ns
    # the eval flags are this call's; a different --seed here must not change which run is evaluated
    out0 = train_py("--eval-only", "--eval-saar", "on", "--seed", "99")
    out1 = train_py("--eval-only", "--eval-saar", "on", "--resume")
    assert "eval step 0 | greedy_saar acc" in out0 and "eval step 1 | greedy_saar acc" in out1
    for s in (0, 1):
        rows = [json.loads(x) for x in (folder / f"eval_step{s:06d}.jsonl").read_text().splitlines()]
        assert sorted(r["eval"] for r in rows) == ["eval_greedy"] * 3 + ["eval_greedy_saar"] * 3
        assert sorted(r["id"] for r in rows if r["eval"] == "eval_greedy_saar") == \
            sorted(r["id"] for r in rows if r["eval"] == "eval_greedy")  # the run's own held-out set (its seed)
    assert (folder / "run.json").read_text() == run_json and (folder / "ckpt.pt").stat().st_mtime_ns == ckpt
    assert len((folder / "evals.jsonl").read_text().splitlines()) == 2
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary) >= {"eval_greedy", "eval_greedy_saar"} and summary["eval_greedy_saar"]["n"] == 3
    merged = {}  # a step's lines add up (scripts/plot_runs.py reads them so)
    for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()):
        merged[r["step"]] = {**merged.get(r["step"], {}), **r}
    assert all({"eval_greedy_acc", "eval_greedy_saar_acc"} <= set(merged[s]) for s in (0, 1)) and "reward" in merged[1]


def test_eval_only_names_a_missing_run(tmp_path):
    args = parse(*["--out-dir", str(tmp_path), "--run-name", "nope", "--eval-only"])
    with pytest.raises(SystemExit, match="no run at .*nope"):
        train.main(args)


def test_dynamic_sampling_drops_groups_without_signal_and_keeps_the_data_position(tmp_path):
    """--dynamic-sampling: the random tiny model gets every problem wrong, so every group is dropped, each step
    takes --max-sample-rounds rounds, trains on nothing, and the checkpoint holds where the data got to."""
    run = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", str(tmp_path), "--run-name", "ds",
                          "--steps", "2", "--dynamic-sampling", "--max-sample-rounds", "3"],
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    m = metrics(tmp_path / "ds")
    for s in (1, 2):
        assert m[s]["sample_rounds"] == 3 and m[s]["dropped_groups"] == 3 * 2 and m[s]["adv_n"] == 0
        assert m[s]["acc"] == 0.0 and "loss" not in m[s]  # no update ran
    state = torch.load(tmp_path / "ds" / "ckpt.pt", weights_only=False)
    assert state["step"] == 2 and state["data_pos"] == 2 * 3 * 2


@pytest.mark.parametrize("unit,want", [("optimizer", [1e-3, 1e-3, 1e-3]), ("train", [0.0, 5e-4, 1e-3])])
def test_warmup_unit(tmp_path, unit, want):
    """Two optimizer steps per GRPO step, 2 warmup steps: ours reaches the full lr within the first GRPO step;
    veRL's (--warmup-unit train) steps once per GRPO step from 0, so the first step's lr is 0."""
    run = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", str(tmp_path), "--run-name", unit,
                          "--steps", "3", "--warmup-steps", "2", "--warmup-unit", unit],
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    m = metrics(tmp_path / unit)
    assert [m[s]["lr"] for s in (1, 2, 3)] == pytest.approx(want) and m[1]["n_mini_batches"] == 2


def test_long_prompts_are_dropped_at_load_time_and_counted(tmp_path):
    """--max-prompt-tokens (the official 2560): a training row whose prompt is too long never reaches the update,
    where prompt + response could overflow a micro-batch; the run says how many it dropped and goes on."""
    rows = [dict(id=f"p{i}", problem=f"What is {i} + {i}?", answer=str(2 * i), task="math") for i in range(3)]
    rows.append(dict(id="long", problem="Add these numbers: " + " + ".join(["1"] * 400) + ".", answer="400", task="math"))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", str(tmp_path), "--run-name", "lp",
                          "--steps", "2", "--train-data", str(data), "--max-prompt-tokens", "300"],
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "dropped 1 of 4 training problems whose prompt is longer than --max-prompt-tokens 300" in run.stdout
    assert "--train-size 32 is more than the 3 training problems" in run.stdout  # the default pool: all 3, a note
    dumped = [json.loads(x) for f in sorted((tmp_path / "lp" / "rollouts").iterdir()) for x in f.read_text().splitlines()]
    assert dumped and all("Add these numbers" not in d["prompt"] for d in dumped)


def test_faithful_sets_every_official_choice_and_runs(tmp_path):
    run = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", str(tmp_path), "--run-name", "f",
                          "--steps", "2", "--faithful", "--saar"],
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    args = json.loads((tmp_path / "f" / "run.json").read_text())["args"]
    official = {k: v for k, v in config.FAITHFUL.items() if k in config.flat(config.Train())}
    assert {k: args[k] for k in official} == official
    assert metrics(tmp_path / "f")[1]["lr"] == 0.0  # veRL's warmup: the first step's lr is 0


def test_nonfinite_minibatches_are_skipped_up_to_k_in_a_row(tmp_path, monkeypatch):
    """--max-nonfinite-skips K (veRL skips them all): from step 2 on every mini-batch is non-finite; step 2's two
    are skipped (2 in a row), step 3's make 4 > K=3, so the run saves and stops, the weights never touched."""
    poison_updates(monkeypatch, lambda n: n >= 2)
    monkeypatch.chdir(ROOT)
    args = parse(*SMALL + ["--out-dir", str(tmp_path), "--run-name", "skip", "--steps", "4",
                                                 "--max-nonfinite-skips", "3"])
    with pytest.raises(SystemExit, match=r"step 3: 4 non-finite mini-batches in a row, more than --max-nonfinite-skips 3"):
        train.main(args)
    run = tmp_path / "skip"
    m = metrics(run)
    assert sorted(m) == [1, 2] and m[2]["nonfinite_skipped"] == 2 and m[1]["nonfinite_skipped"] == 0
    step2, stopped = (torch.load(run / f, weights_only=False) for f in ("ckpt.pt", "ckpt-nonfinite-step3.pt"))
    assert step2["step"] == 2 and all(torch.equal(v, stopped["model"][k]) for k, v in step2["model"].items())


def test_lora_run_saves_a_plain_model_with_the_adapters_merged(tmp_path, monkeypatch):
    """--lora-rank through train.py: the checkpoint holds the warm start's weights untouched plus adapters on the
    trained layers only, and hf/ is a plain model (no adapter names) whose weights are the merge of them."""
    import grpo
    from data import models
    monkeypatch.chdir(ROOT)
    args = parse(*SMALL + ["--out-dir", str(tmp_path), "--run-name", "lora", "--steps", "2",
                                              "--lora-rank", "4", "--lora-alpha", "8", "--train-layers", "1"])
    train.main(args)
    ckpt = torch.load(tmp_path / "lora" / "ckpt.pt", weights_only=False)["model"]
    start = models.load_model("tiny-qwen3", dtype=torch.float32).state_dict()
    adapters = [k for k in ckpt if ".lora_" in k]
    assert adapters and all(".layers.1." in k for k in adapters)  # the top layer only (--train-layers 1)
    for k, v in ckpt.items():
        if ".lora_" not in k:
            assert torch.equal(v, start[k.replace(".base_layer.", ".")]), k
    saved = load_file(tmp_path / "lora" / "hf" / "model.safetensors")
    assert saved and not any(".lora_" in k or ".base_layer." in k for k in saved)
    merged = checkpoint.merge_lora(ckpt, 8.0 / 4)
    for k, v in saved.items():
        torch.testing.assert_close(v, merged[k])

