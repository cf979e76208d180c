"""machinery/evalcache.py with eval.step0_key: the step-0 evaluation is reused by weights, eval settings and code, and by nothing
else; a damaged entry is evaluated again. The evaluation is eval.held_out's, with the scripted model (the only
fake)."""
import asyncio
import dataclasses
import inspect
import shutil

import pytest

import config
import eval as ev
import reward
from data import models
from data.problems import Problem
from fakes import ScriptedEngine
from machinery import evalcache

PROBLEMS = [Problem(id="a", problem="What is 1 + 1?", answer="2", task="math"),
            Problem(id="b", problem="What is 3 + 4?", answer="7", task="math")]


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(evalcache, "_root", lambda: tmp_path / "cache")
    return tmp_path / "cache"


def train_args(*argv) -> config.Train:
    return config.cli(config.Train, "", ["--model", "tiny-qwen3", "--tool-format", "hermes", "--eval-size", "2", *argv])


def step0(tok, sb, args, out, calls: list):
    """evalcache.cached as train.py calls it, computing with eval.held_out; calls: one entry per evaluation."""
    def compute():
        calls.append(out)
        eng, loop = ScriptedEngine(tok, ["\\boxed{2}<|im_end|>", "\\boxed{5}<|im_end|>"]), asyncio.new_event_loop()
        grade = lambda p, tr: reward.grade(p.task, tr.final_text(tok), answer=p.answer, sandbox=sb)  # noqa: E731
        try:
            return ev.held_out(loop, eng, sb, tok, PROBLEMS, args, step=0, out_dir=str(out), rollout_cfg=args.rollout,
                               templates=None, grade=grade, rank=0, world=1)
        finally:
            loop.close()
    out.mkdir(exist_ok=True)
    return evalcache.cached(ev.step0_key(args, args.common.model) if args.data.eval_cache else None, str(out), compute)


def test_a_second_run_takes_the_first_runs_step0_evaluation(tok, sb, root, tmp_path, capsys):
    """The same weights and eval settings, other training flags: the first run's metrics and its per-problem records,
    with no rollout; --no-eval-cache and a hub id evaluate; a damaged entry is evaluated again, and kept."""
    calls = []
    a = step0(tok, sb, train_args(), tmp_path / "a", calls)
    assert len(calls) == 1 and len(list(root.iterdir())) == 1 and "eval_cached" not in a and a["eval_greedy_acc"] == 0.5
    b = step0(tok, sb, train_args("--lr", "1e-4", "--data-order", "stratified", "--no-saar", "--steps", "9"),
              tmp_path / "b", calls)
    assert len(calls) == 1  # from the cache
    assert b["eval_cached"] == 1 and b["eval_cache_key"] == next(root.iterdir()).name
    assert {k: v for k, v in b.items() if k not in ("t_eval", "eval_cached", "eval_cache_key")} == \
        {k: v for k, v in a.items() if k != "t_eval"}
    rows = [(tmp_path / r / evalcache.RECORDS).read_text() for r in ("a", "b")]
    assert rows[0] == rows[1] and len(rows[0].splitlines()) == 2
    assert "eval_cached" not in step0(tok, sb, train_args("--no-eval-cache"), tmp_path / "c", calls) and len(calls) == 2
    assert ev.step0_key(train_args(), "Org/not-a-folder") is None  # a hub id is not hashed, so not cached
    entry = next(root.iterdir())
    (entry / "metrics.json").write_text("{not json")
    assert "eval_cached" not in step0(tok, sb, train_args(), tmp_path / "d", calls) and len(calls) == 3
    assert "is unreadable" in capsys.readouterr().err and (entry / "metrics.json").read_text() == "{not json"


def test_the_key_covers_weights_eval_settings_templates_and_code(tmp_path, monkeypatch):
    args = train_args()
    key = ev.step0_key(args, "tiny-qwen3")
    # training-only settings (one of each section) share the entry
    assert key == ev.step0_key(config.replace(args, lr=0.5, saar=False, steps=99, run_name="x", data_order="stratified",
                                               update_dtype="bfloat16", faithful=True, rollout_is="token",
                                               mismatch_warn_kl=0.1), "tiny-qwen3")
    for change in (dict(max_turns=2), dict(eval_saar="both"), dict(seed=4), dict(temperature=0.9),
                   dict(eval_data="synth"), dict(tool_memory_mb=512), dict(math_grader="strict-box")):
        assert ev.step0_key(config.replace(args, **change), "tiny-qwen3") != key, change
    # SAAR's settings count only where the evaluation runs SAAR (--eval-saar on or both)
    assert ev.step0_key(config.replace(args, gamma=0.7), "tiny-qwen3") == key
    on = config.replace(args, eval_saar="on")
    assert ev.step0_key(config.replace(on, gamma=0.7), "tiny-qwen3") != ev.step0_key(on, "tiny-qwen3")
    assert ev.step0_key(args, "tiny-qwen3", {"system": "Be brief."}) != key  # the prompt templates' wording
    other = shutil.copytree(models.resolve("tiny-qwen3"), tmp_path / "other")
    assert ev.step0_key(args, str(other)) == key  # a copy of the same files: the same key
    import sft
    (other / sft.MARKER).write_text('{"train_s": 180.0, "pid": 1}')  # a rebuild's record: its time and pid differ
    assert ev.step0_key(args, str(other)) == key
    (other / "chat_template.jinja").write_text((other / "chat_template.jinja").read_text() + " ")
    changed_template = ev.step0_key(args, str(other))
    from safetensors.torch import load_file, save_file
    w = load_file(other / "model.safetensors")
    name = next(iter(w))
    w[name] = w[name] + 1e-3
    save_file(w, other / "model.safetensors", metadata={"format": "pt"})
    assert len({key, changed_template, ev.step0_key(args, str(other))}) == 3
    # the evaluation's code: another held_out is another key
    monkeypatch.setattr(ev, "held_out", dataclasses.replace)
    assert ev.step0_key(args, "tiny-qwen3") != key


def test_a_new_setting_is_in_the_key_unless_declared_out_beside_its_field():
    """An ablation's new field in a section the evaluation reads changes the key by itself: no list to keep in step.
    Declared out with config.not_in_eval, it does not. Training's own sections never reach the key."""
    @dataclasses.dataclass
    class Rollout(config.Rollout):
        new_knob: int = 0
        new_train_only_knob: int = config.not_in_eval(0)
    args = dataclasses.replace(train_args(), rollout=Rollout())
    key = ev.step0_key(args, "tiny-qwen3")
    assert ev.step0_key(dataclasses.replace(args, rollout=Rollout(new_knob=1)), "tiny-qwen3") != key
    assert ev.step0_key(dataclasses.replace(args, rollout=Rollout(new_train_only_knob=1)), "tiny-qwen3") == key

    @dataclasses.dataclass
    class Grpo(config.Grpo):
        new_loss_knob: int = 0
    assert ev.step0_key(dataclasses.replace(args, grpo=Grpo(new_loss_knob=1)), "tiny-qwen3") == key
    # what the evaluation reads stays in the key
    for change in (dict(seed=3), dict(eval_size=5), dict(eval_sampled=True), dict(tool_format="hermes"),
                   dict(max_response_tokens=99), dict(engine="sglang"), dict(dtype="bfloat16"),
                   dict(tool_timeout_s=1.0)):
        assert ev.step0_key(config.replace(args, **change), "tiny-qwen3") != key, change


def test_editing_saar_keeps_the_entry_unless_the_evaluation_runs_saar(monkeypatch):
    """With test-time SAAR off, the held-out evaluation runs none of saar.py and reads none of its settings: an
    ablation that edits it, or sets --gamma, keeps the step-0 evaluation; with --eval-saar on it does not."""
    import saar
    off, on = train_args(), config.replace(train_args(), eval_saar="on")
    keys = ev.step0_key(off, "tiny-qwen3"), ev.step0_key(on, "tiny-qwen3")
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda m: real(m) + ("# edited" if m is saar else ""))
    assert ev.step0_key(off, "tiny-qwen3") == keys[0] and ev.step0_key(on, "tiny-qwen3") != keys[1]
    assert ev.step0_key(config.replace(off, gamma=0.0, max_retries=1, sim_on="code"), "tiny-qwen3") == keys[0]
