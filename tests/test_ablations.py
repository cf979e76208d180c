"""docs/ablations.md, each row tested: the ablation run on a scripted model (tests/fakes.py, against the real sandbox
and a real tokenizer), checked to change the purified trajectory, or the advantages and the loss, where the doc's
table says and nowhere else. Then the doc itself: its table names these tests, and its worked example's diff still
applies to the working tree and does what it says."""
import asyncio
import copy
import dataclasses
import json
import math
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import config
import grpo
import reward
import rollout
import saar
import tools
from data.problems import Problem
from fakes import ScriptedEngine
from machinery import mismatch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ablations.md"
PAPER = config.Rollout(tool_format="hermes", max_turns=16, max_response_tokens=20480, temperature=1.0)
HERMES = rollout.CallSyntax("hermes")
QUESTION = "What is the sum of the integers 0 to 9?"
# what a trajectory is trained on, and what a reader of its record sees
TRAINED = ("response_ids", "loss_mask", "logprobs", "spliced", "text", "turns", "finish_reason")


def turn(code: str, why: str = "Let me compute.\n") -> str:
    """An assistant turn: a line of reasoning, then one hermes call of the Python tool (rollout.call_text's)."""
    return why + rollout.call_text(rollout.Call("code_interpreter", {"code": code}), "hermes")


# the shared script: a call that fails (SyntaxError), the model's fix, the answer
BAD = turn("print(sum(range(10))", "Sum 0..9 with code.\n")
FIXED = turn("print(sum(range(10)))", "I forgot a parenthesis.\n")
ANSWER = "So the answer is \\boxed{45}.<|im_end|>"
FIX = [BAD, FIXED, ANSWER]


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def roll(tok, sb, script, saar_cfg=None, *, engine=None, seed=1, **rollout_kw):
    """One scripted trajectory: (trajectory, engine). saar_cfg: a config.Saar, None for SAAR off; rollout_kw: fields
    of config.Rollout replacing PAPER's."""
    eng = engine or ScriptedEngine(tok, script)
    cfg = dataclasses.replace(PAPER, **rollout_kw)
    prompt = rollout.prompt_ids(tok, QUESTION, "math", cfg.tool_format)
    return asyncio.run(rollout.rollout_one(eng, sb, tok, prompt, cfg, saar_cfg, seed=seed)), eng


def differs(a, b, fields=TRAINED) -> list[str]:
    """The fields of two trajectories that differ."""
    return [f for f in fields if getattr(a, f) != getattr(b, f)]


def kinds(traj) -> list[str]:
    return [e["kind"] for e in traj.saar_events]


def split(tok, text: str) -> int:
    """Where the call begins in a scripted turn, in tokens."""
    return saar.split_turn(enc(tok, text), tokenizer=tok, syntax=HERMES)


def tool_turn(tok, output: str) -> list[int]:
    return enc(tok, rollout.tool_turn_text(output, "hermes", ended=False))


def flag(*argv) -> dict:
    """The settings a train.py command line changes, by name: {name: value}."""
    try:
        given = config.flat(config.cli(config.Train, "", list(argv)))
    except SystemExit:  # tyro's answer to an unknown flag or value (its message is on stderr)
        raise AssertionError(f"not a train.py command line: {' '.join(argv)}") from None
    default = config.flat(config.Train())
    return {k: v for k, v in given.items() if v != default[k]}


# --------------------------------------------------------------------------- the rollout's rows

def test_ablation_no_saar_keeps_the_failed_call_and_its_error(tok, sb):
    """--no-saar: the failed call, its error and the model's next turn all stay in the trained trajectory."""
    assert flag("--no-saar") == {"saar": False}  # train.sample_groups then rolls out with saar=None
    off, e_off = roll(tok, sb, FIX)
    on, e_on = roll(tok, sb, FIX, config.Saar())
    error = off.turns[0]["output"]
    assert "SyntaxError" in error
    tail = tool_turn(tok, "45\n") + enc(tok, ANSWER)
    assert off.response_ids == enc(tok, BAD) + tool_turn(tok, error) + enc(tok, FIXED) + tail
    assert off.loss_mask == ([1] * len(enc(tok, BAD)) + [0] * len(tool_turn(tok, error)) + [1] * len(enc(tok, FIXED))
                             + [0] * len(tool_turn(tok, "45\n")) + [1] * len(enc(tok, ANSWER)))
    assert off.saar_events == [] and not any(off.spliced) and [t["ok"] for t in off.turns] == [False, True]
    # with SAAR the error and the failed call are gone; the rest is the same
    assert "SyntaxError" not in on.text and [t["ok"] for t in on.turns] == [True]
    assert on.response_ids[-len(tail):] == tail and kinds(on) == ["shallow"]
    # the model read the same error before its second turn either way: only what is trained on differs
    assert e_on.inputs[:2] == e_off.inputs[:2]


def test_ablation_rollback_p_draws_saar_per_trajectory(tok, sb):
    """--rollback-p p: each trajectory draws SAAR with probability p from its own seed; a trajectory that draws it is
    the SAAR one, the others the --no-saar one, token for token; p = 0 is --no-saar."""
    assert flag("--rollback-p", "0.7") == {"rollback_p": 0.7}
    off, _ = roll(tok, sb, FIX)
    on, _ = roll(tok, sb, FIX, config.Saar())
    zero, _ = roll(tok, sb, FIX, config.Saar(rollback_p=0.0))
    assert not zero.saar and zero.saar_events == [] and differs(zero, off) == []
    seeds = range(6)
    draws = [random.Random(s).random() < 0.7 for s in seeds]
    assert any(draws) and not all(draws)  # both outcomes occur among these seeds
    for s, drawn in zip(seeds, draws):
        traj, _ = roll(tok, sb, FIX, config.Saar(rollback_p=0.7), seed=s)
        assert traj.saar == drawn, s
        assert differs(traj, on if drawn else off) == [], s


def test_ablation_gamma_0_or_above_1_changes_only_the_kept_reasoning(tok, sb):
    """--gamma 0.0: every replacement shallow; --gamma 1.01: every one deep. They differ in the reasoning before
    the new call (the failed turn's or the regenerated one's) and in which tokens are marked spliced, nowhere else.
    --gamma 1.0: shallow only for a call identical to the failed one."""
    assert flag("--gamma", "0.0") == {"gamma": 0.0} and flag("--gamma", "1.01") == {"gamma": 1.01}
    shallow, _ = roll(tok, sb, FIX, config.Saar(gamma=0.0))
    deep, _ = roll(tok, sb, FIX, config.Saar(gamma=1.01))
    assert kinds(shallow) == ["shallow"] and kinds(deep) == ["deep"]
    k_old, k_new = split(tok, BAD), split(tok, FIXED)
    new_call = enc(tok, FIXED)[k_new:]
    assert shallow.response_ids[:k_old] == enc(tok, BAD)[:k_old]  # the failed turn's reasoning, kept
    assert deep.response_ids[:k_new] == enc(tok, FIXED)[:k_new]  # the regenerated turn's reasoning
    for f in ("response_ids", "loss_mask", "logprobs"):  # from the new call on, the same
        assert getattr(shallow, f)[k_old:] == getattr(deep, f)[k_new:], f
    after = len(shallow.response_ids) - k_old - len(new_call)
    assert shallow.spliced == [0] * k_old + [1] * len(new_call) + [0] * after
    assert deep.spliced == [1] * (k_new + len(new_call)) + [0] * after
    assert shallow.turns == deep.turns and shallow.finish_reason == deep.finish_reason
    assert shallow.saar_events[0]["similarity"] == deep.saar_events[0]["similarity"]
    # gamma 1.0: shallow iff similarity 1.0, i.e. the same call text; one character apart is deep
    def at_1(new):
        return saar.replace_turn(enc(tok, BAD), enc(tok, new), tokenizer=tok, syntax=HERMES, gamma=1.0)
    again = turn("print(sum(range(10))", "Once more.\n")
    assert (at_1(again).kind, at_1(again).similarity) == ("shallow", 1.0)
    assert at_1(FIXED).kind == "deep" and at_1(FIXED).similarity > 0.99
    traj, _ = roll(tok, sb, [BAD, again, FIXED, ANSWER], config.Saar(gamma=1.0))
    assert kinds(traj) == ["shallow", "deep"]  # the verbatim repeat, then the fix


DIV = turn("x = 1/0", "Divide first.\n")
SUM = turn("print(sum(range(10)))", "Sum instead.\n")


def test_ablation_sim_on_code_and_sim_eos_move_only_the_similarity(tok, sb):
    """--sim-on code compares the extracted code, not the call text with its JSON wrapper; --sim-eos adds the turn's
    <|im_end|> to both call segments. Each moves the similarity, so near gamma the shallow/deep choice, only."""
    assert flag("--sim-on", "code") == {"sim_on": "code"} and flag("--sim-eos") == {"sim_eos": True}
    script = [DIV, SUM, ANSWER]
    k_old, k_new = split(tok, DIV), split(tok, SUM)
    on_call, _ = roll(tok, sb, script, config.Saar())
    on_code, _ = roll(tok, sb, script, config.Saar(sim_on="code"))
    s_call, s_code = (t.saar_events[0]["similarity"] for t in (on_call, on_code))
    assert s_code < 0.5 <= s_call  # unrelated programs share the wrapper's text, not their code
    assert kinds(on_call) == ["shallow"] and kinds(on_code) == ["deep"]
    for f in ("response_ids", "loss_mask", "logprobs"):
        assert getattr(on_call, f)[k_old:] == getattr(on_code, f)[k_new:], f
    # --sim-eos: at a gamma between the two ratios, the ten characters of <|im_end|> on both sides flip the choice
    plain, eos = (saar.replace_turn(enc(tok, DIV), enc(tok, SUM), tokenizer=tok, syntax=HERMES, sim_eos=e).similarity
                  for e in (False, True))
    assert plain < eos
    gamma = (plain + eos) / 2
    eos_off, _ = roll(tok, sb, script, config.Saar(gamma=gamma))
    eos_on, _ = roll(tok, sb, script, config.Saar(gamma=gamma, sim_eos=True))
    assert (kinds(eos_off), kinds(eos_on)) == (["deep"], ["shallow"])
    assert [t.saar_events[0]["similarity"] for t in (eos_off, eos_on)] == [plain, eos]
    for f in ("response_ids", "loss_mask", "logprobs"):
        assert getattr(eos_on, f)[k_old:] == getattr(eos_off, f)[k_new:], f
    assert differs(eos_on, on_call) == []  # shallow either way: the same tokens
    # --sim-on code: a malformed call has no code to compare, so its replacement is deep (similarity NaN)
    broken = "Try.\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(1)\"\n</tool_call>"
    unknown = turn("ls -la /tmp", "Other.\n").replace("code_interpreter", "shell")
    assert rollout.parse_call(broken, "hermes").error and rollout.parse_call(unknown, "hermes").error
    pair = dict(tokenizer=tok, syntax=HERMES, gamma=1.0)
    assert saar.replace_turn(enc(tok, broken), enc(tok, unknown), sim_on="call", **pair).kind == "deep"
    by_code = saar.replace_turn(enc(tok, broken), enc(tok, unknown), sim_on="code", **pair)
    assert by_code.kind == "deep" and by_code.similarity != by_code.similarity


def test_ablation_feedback_instruction_changes_what_the_model_read_not_the_trajectory(tok, sb):
    """--feedback-instruction: the error the model reads before regenerating ends with the fix line; the purified
    trajectory does not contain it, and with the same regenerated turn it is the same, token for token."""
    assert flag("--feedback-instruction") == {"feedback_instruction": True}
    plain, e_plain = roll(tok, sb, FIX, config.Saar())
    told, e_told = roll(tok, sb, FIX, config.Saar(feedback_instruction=True))
    line = saar.FIX_INSTRUCTION.strip()
    assert line in tok.decode(e_told.inputs[1]) and line not in tok.decode(e_plain.inputs[1])
    assert e_told.inputs[0] == e_plain.inputs[0] and e_told.inputs[2] == e_plain.inputs[2]  # the answer's context
    assert differs(told, plain) == [] and line not in told.text
    a, b = plain.saar_events[0], told.saar_events[0]  # the event records what the model read
    assert b["error"] == a["error"] + saar.FIX_INSTRUCTION
    assert {k: v for k, v in a.items() if k != "error"} == {k: v for k, v in b.items() if k != "error"}


def test_ablation_max_retries_sets_the_regenerations_before_giving_up(tok, sb):
    """--max-retries N: after N failed regenerations of a turn SAAR gives up: the last failed attempt and its error
    stay, and SAAR is off for the rest of the trajectory."""
    assert flag("--max-retries", "1") == {"max_retries": 1}
    script = [turn("print(undefined_0)"), turn("print(undefined_1)"), turn("print(45)"), ANSWER]
    two, e_two = roll(tok, sb, script, config.Saar(max_retries=2))
    one, e_one = roll(tok, sb, script, config.Saar(max_retries=1))
    assert kinds(two) == ["shallow", "shallow"] and kinds(one) == ["shallow", "given_up"]
    assert "NameError" not in two.text and [t["ok"] for t in two.turns] == [True]
    # one retry: the retry's call (spliced over the first) stays with its error; the third turn follows it
    assert "undefined_1" in one.text and "undefined_0" not in one.text and "NameError" in one.text
    assert [t["ok"] for t in one.turns] == [False, True] and not one.saar_events[-1]["similarity"]
    assert "Note:" not in one.text  # the give-up note comes after 2 retries or more
    assert e_one.inputs[:2] == e_two.inputs[:2]  # the same until the second failure
    assert one.loss_mask.count(0) > two.loss_mask.count(0)  # an error turn more, not trained on


class LowScore(ScriptedEngine):
    """The scripted model, scoring the tokens of a replacement far less likely on the purified context than it
    sampled them with the error in context (engine.score)."""

    async def score(self, input_ids, start):
        return [self.logprob - 3.0] * (len(input_ids) - start)


def test_ablation_is_mode_gate_keeps_the_error_when_the_replacement_is_unlikely(tok, sb):
    """--is-mode gate: a replacement whose sequence-level ratio on the purified context is below --is-gate is
    refused: the trajectory is the one without SAAR, token for token, and SAAR stays on. Above it, SAAR as usual."""
    assert flag("--is-mode", "gate") == {"is_mode": "gate"}
    gate = config.Saar(is_mode="gate")
    off, _ = roll(tok, sb, FIX)
    on, _ = roll(tok, sb, FIX, config.Saar())
    refused, _ = roll(tok, sb, FIX, gate, engine=LowScore(tok, FIX))
    passed, _ = roll(tok, sb, FIX, gate)  # the scripted score equals the sampled log-probs: ratio 1
    assert kinds(refused) == ["gated"] and refused.saar_events[0]["seq_ratio"] < gate.is_gate
    assert differs(refused, off, TRAINED[:-2]) == []  # the tokens, masks, log-probs and text of no SAAR
    assert [t["ok"] for t in refused.turns] == [t["ok"] for t in off.turns] == [False, True]
    assert kinds(passed) == ["shallow"] and differs(passed, on) == []
    with pytest.raises(ValueError, match="needs temperature 1.0"):  # the demo's 0.6 cannot be scored
        roll(tok, sb, FIX, gate, temperature=0.6)


# --------------------------------------------------------------------------- the loss's and the advantages' rows

def test_ablation_rollout_is_token_reweights_the_loss_on_spliced_tokens(tok, sb):
    """--rollout-is token: each loss token's loss times min(pi_old / pi_rollout, threshold). With a trainer that
    agrees with the engine, the weight leaves 1 exactly on SAAR's spliced tokens, and so does the gradient."""
    assert flag("--rollout-is", "token") == {"rollout_is": "token"}
    purified, _ = roll(tok, sb, FIX, config.Saar())
    seq = grpo.TrainSeq.of(purified, advantage=1.0)
    spliced = torch.tensor(seq.spliced, dtype=torch.bool)
    mask = torch.tensor(seq.loss_mask, dtype=torch.bool)
    assert spliced.any() and (mask & ~spliced).any()
    # pi_old, as the trainer recomputes it on the purified tokens: the engine's own log-prob where the token was
    # sampled on that context, higher on the spliced ones (sampled with the error in context)
    seq.old_logp = torch.tensor(seq.rollout_logp) + 0.4 * spliced
    none = copy.deepcopy(seq)
    assert mismatch.correct([none], "none", 2.0) == {} and none.is_weight is None  # the default: no weights
    mismatch.correct([seq], "token", 2.0)
    w = seq.is_weight
    assert torch.equal(w != 1.0, spliced & mask)
    assert torch.allclose(w[spliced], torch.tensor(math.exp(0.4)))

    def grad(is_weight):
        logp = seq.old_logp.clone()[None].requires_grad_(True)  # before the policy moves: ratio 1
        loss, _ = grpo.policy_loss(logp, seq.old_logp[None], torch.tensor([[1.0]]), mask[None], is_weight=is_weight)
        loss.backward()
        return logp.grad[0]

    g_none, g_token = grad(None), grad(w[None])
    assert torch.equal(g_none != g_token, spliced & mask)
    assert torch.allclose(g_token, g_none * w)


@pytest.fixture(scope="module")
def graded(tok, sb):
    """Two problems, four scripted samples each, graded by reward.py: (trajectories, rewards +1/-1, group ids)."""
    probs = [Problem(id="a", problem="What is 6*7?", answer="42", task="math"),
             Problem(id="b", problem="What is 2+3?", answer="5", task="math")]
    answers = ["42", "41", "42", "40", "5", "5", "5", "4"]
    eng = ScriptedEngine(tok, [f"So \\boxed{{{a}}}.<|im_end|>" for a in answers])
    trajs, right = asyncio.run(rollout.rollout_and_grade(
        eng, sb, tok, probs, PAPER, n=4, seeds=list(range(8)), metas=[dict(group=i // 4) for i in range(8)],
        grade=lambda p, t: reward.grade(p.task, t.final_text(tok), answer=p.answer, math_grader="strict-box")))
    return trajs, [1.0 if r else -1.0 for r in right], [t.meta["group"] for t in trajs]


def test_ablation_baseline_leave_one_out_scales_each_group_by_k_over_k_minus_1(graded):
    """--baseline leave-one-out (RLOO): a reward minus the mean of its group's other samples, which is k/(k-1) times
    the group-mean advantage, k the group's size; nothing else in the update's batch changes."""
    assert flag("--baseline", "leave-one-out") == {"baseline": "leave-one-out"}
    trajs, rewards, groups = graded
    assert rewards == [1, -1, 1, -1, 1, 1, 1, -1]
    for norm in (True, False):
        mean, s_mean = grpo.compute_advantages(rewards, groups, norm_std=norm)
        loo, s_loo = grpo.compute_advantages(rewards, groups, norm_std=norm, baseline="leave-one-out")
        assert torch.allclose(loo, mean * 4 / 3)
        assert {k: v for k, v in s_mean.items() if k != "adv_abs_mean"} == \
               {k: v for k, v in s_loo.items() if k != "adv_abs_mean"}
    others = [sum(rewards[g * 4:g * 4 + 4]) - r for r, g in zip(rewards, groups)]  # RLOO by its definition
    assert torch.allclose(loo, torch.tensor([r - o / 3 for r, o in zip(rewards, others)]))
    a = [grpo.TrainSeq.of(t, x) for t, x in zip(trajs, mean.tolist())]
    b = [grpo.TrainSeq.of(t, x) for t, x in zip(trajs, loo.tolist())]
    for x, y in zip(a, b):
        assert [f.name for f in dataclasses.fields(x) if getattr(x, f.name) != getattr(y, f.name)] == ["advantage"]
    # groups of other sizes: each its own k/(k-1); a lone sample and a group of equal rewards stay at 0
    r, g = [1, -1, 1, 1, -1, 1, -1, -1], [0, 0, 1, 1, 1, 2, 3, 3]
    mean, _ = grpo.compute_advantages(r, g, norm_std=False)
    loo, _ = grpo.compute_advantages(r, g, norm_std=False, baseline="leave-one-out")
    assert torch.allclose(loo, mean * torch.tensor([2, 2, 1.5, 1.5, 1.5, 1, 1, 1]))
    assert loo[5:].tolist() == [0.0, 0.0, 0.0]


def test_ablation_no_norm_adv_std_leaves_advantages_undivided(graded):
    """--no-norm-adv-std (Dr.GRPO's advantage): the reward minus its group's mean, not divided by the group's std."""
    assert flag("--no-norm-adv-std") == {"norm_adv_std": False}
    _, rewards, groups = graded
    scaled, _ = grpo.compute_advantages(rewards, groups)
    raw, _ = grpo.compute_advantages(rewards, groups, norm_std=False)
    assert raw.tolist() == [1.0, -1.0, 1.0, -1.0, 0.5, 0.5, 0.5, -1.5]
    for k in set(groups):
        idx = [i for i, x in enumerate(groups) if x == k]
        std = torch.tensor(rewards)[idx].std()
        assert torch.allclose(scaled[idx], raw[idx] / (std + 1e-6))


def test_ablation_mask_failed_drops_a_trajectory_whose_every_call_failed_from_the_loss(tok, sb):
    """--mask-failed (verifiers PR #1416): a trajectory that called the tool and saw every call fail gets loss mask 0
    throughout, after the advantages: it stays in its group's reward statistics, adds nothing to the gradient, and the
    gradient is the one of the batch without it. A trajectory with a failed call and a good one, or with no call,
    is trained on as before."""
    assert flag("--mask-failed") == {"mask_failed": True}
    scripts = [[BAD, "So the answer is \\boxed{44}.<|im_end|>"],  # one call, failed: masked
               FIX,  # a failed call, then a good one: trained on
               [ANSWER],  # no call: trained on
               [turn("print(45)"), ANSWER]]  # one good call
    trajs = [roll(tok, sb, script)[0] for script in scripts]
    assert [grpo.every_call_failed(t) for t in trajs] == [True, False, False, False]
    rewards, groups = [-1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]
    adv, _ = grpo.compute_advantages(rewards, groups)  # the masked one is in the group's mean and std
    assert adv[0] < 0 and torch.allclose(adv[1:], adv[1])
    plain = [grpo.TrainSeq.of(t, a) for t, a in zip(trajs, adv.tolist())]
    masked = [grpo.TrainSeq.of(t, a, trained=not grpo.every_call_failed(t)) for t, a in zip(trajs, adv.tolist())]
    assert not any(masked[0].loss_mask) and any(plain[0].loss_mask)
    for x, y in zip(plain[1:], masked[1:]):
        assert x == y  # the others unchanged, field for field

    def grads(batch):
        """d loss / d logp of each trajectory's tokens, over the batch as one mini-batch (token-mean)."""
        n = max(len(b.input_ids) for b in batch)
        pad = lambda xs: [list(x) + [0] * (n - len(x)) for x in xs]  # noqa: E731
        logp = (-0.5 - 0.01 * torch.arange(len(batch) * n, dtype=torch.float32).reshape(len(batch), n))
        logp.requires_grad_(True)
        old = logp.detach() + 0.05  # the policy has moved a little: ratios off 1
        loss, _ = grpo.policy_loss(logp, old, torch.tensor([[b.advantage] for b in batch]),
                                   torch.tensor(pad([b.loss_mask for b in batch])).bool())
        loss.backward()
        return [logp.grad[i, :len(b.input_ids)] for i, b in enumerate(batch)]

    g_plain, g_masked, g_without = grads(plain), grads(masked), grads(masked[1:])
    assert g_plain[0].abs().sum() > 0 and torch.equal(g_masked[0], torch.zeros_like(g_masked[0]))
    for a, b in zip(g_masked[1:], g_without):
        assert torch.allclose(a, b)  # masking it is dropping it from the loss
    assert not torch.allclose(g_masked[1], g_plain[1])  # its tokens left the token-mean's count


# --------------------------------------------------------------------------- the run's rows

def test_ablation_no_warm_start_trains_the_base_model(monkeypatch):
    """--no-warm-start: train.cold_start returns --model itself, not sft.py's warm start; so does --tool-format none.
    (sft.warm_start is replaced by a function that only says it was asked, so that nothing trains.)"""
    import train
    import sft

    class Asked(Exception):
        pass

    def asked(*args, **kw):
        raise Asked

    monkeypatch.setattr(sft, "warm_start", asked)
    assert flag("--no-warm-start") == {"warm_start": False}
    model = ["--model", "tiny-qwen3"]  # an offline model: the one kind that gets a warm start
    path, cfg = train.cold_start(config.cli(config.Train, "", model + ["--no-warm-start"]))
    assert (path, cfg.tool_format) == ("tiny-qwen3", "markdown")
    with pytest.raises(Asked):
        train.cold_start(config.cli(config.Train, "", model))
    path, cfg = train.cold_start(config.cli(config.Train, "", model + ["--tool-format", "none"]))
    assert (path, cfg.tool_format) == ("tiny-qwen3", "none")


def test_ablation_tool_format_none_offers_no_tool_and_runs_no_call(tok, sb):
    """--tool-format none: the prompt has no tool sentence and no tool schema; a turn that writes a call is an
    answer: nothing runs, nothing is appended."""
    assert flag("--tool-format", "none") == {"tool_format": "none"}
    bare = tok.decode(rollout.prompt_ids(tok, QUESTION, "math", "none"))
    for fmt in ("hermes", "markdown"):
        assert tools.sentence(fmt) in tok.decode(rollout.prompt_ids(tok, QUESTION, "math", fmt))
        assert tools.sentence(fmt).strip() not in bare
    assert "<tools>" not in bare and "code_interpreter" not in bare
    # no tool to use or stop calling: the task and the answer's form, as data/prompts.py: NO_TOOL_PROMPTS words them
    assert "Use it" not in bare and "calling the tool" not in bare and "Give the final answer as \\boxed{answer}" in bare
    writes = turn("print(6*7)") + "\n```python\nprint(6*7)\n```\nSo \\boxed{42}.<|im_end|>"
    traj, eng = roll(tok, sb, [writes], tool_format="none")
    assert traj.num_tool_calls == 0 and traj.turns == [] and traj.finish_reason == "answer"
    assert traj.response_ids == enc(tok, writes) and set(traj.loss_mask) == {1} and len(eng.inputs) == 1
    with_tool, _ = roll(tok, sb, [writes, "\\boxed{42}<|im_end|>"])  # the same turn, hermes: its call runs
    assert with_tool.num_tool_calls == 1 and with_tool.turns[0]["output"] == "42\n"


# --------------------------------------------------------------------------- the doc stays true

def table() -> list[list[str]]:
    """The cells of the doc's ablation table (the rows that name a test)."""
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("|") and "test_ablation_" in line]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in rows]


def test_the_doc_table_names_each_ablation_test_and_real_flags():
    """Each row of docs/ablations.md's table names a test of this file, each test is named by one row, and each flag
    the table gives is a train.py flag that changes a setting."""
    rows = table()
    named = [n for row in rows for n in re.findall(r"test_ablation_\w+", row[-1])]
    defined = sorted(n for n in globals() if n.startswith("test_ablation_"))
    assert sorted(named) == defined and len(named) == len(rows)
    for row in rows:
        flags = re.findall(r"`(--[a-z-]+(?: [\w.-]+)?)`", row[1])
        assert flags, row[0]
        for f in flags:
            assert flag(*f.split()), f  # it parses, and it is not the default


def worked_example() -> str:
    blocks = re.findall(r"^```diff\n(.*?)^```$", DOC.read_text(), re.S | re.M)
    assert len(blocks) == 1, "docs/ablations.md should hold one ```diff block"
    return blocks[0]


PROBE = r'''
import asyncio, json, os, sys
root = sys.argv[1]
sys.path[:0] = [os.getcwd(), root, os.path.join(root, "tests")]
import config, rollout, saar
from data.models import load_tokenizer
from fakes import ScriptedEngine
from sandbox import Sandbox

assert os.path.dirname(os.path.abspath(saar.__file__)) == os.getcwd(), saar.__file__  # the patched copy
tok = load_tokenizer("tiny-qwen3")
syntax = rollout.CallSyntax("hermes")
turn = lambda code, why: why + rollout.call_text(rollout.Call("code_interpreter", {"code": code}), "hermes")
enc = lambda text: tok.encode(text, add_special_tokens=False)
a = enc(turn("for i in range(3):\n    print(i,  i)", "Loop.\n"))
b = enc(turn("for i in range(3):\n  print(i, i)", "Loop again.\n"))  # other whitespace runs, the same words
rep = lambda **kw: saar.replace_turn(a, b, tokenizer=tok, syntax=syntax, gamma=1.0, **kw)
out = dict(default=config.Saar().sim_ignore_space, plain=rep().similarity,
           collapsed=[rep(sim_ignore_space=True).similarity, rep(sim_ignore_space=True).kind])
# through retry_failed_call: an indentation error fixed by indenting, at gamma 1.0 on the code
script = [turn("if True:\nprint(45)", "Print it.\n"), turn("if True:\n    print(45)", "Indent it.\n"),
          "\\boxed{45}<|im_end|>"]
cfg = config.Rollout(tool_format="hermes", max_turns=4, max_response_tokens=2048, temperature=1.0)
with Sandbox(slots=1, timeout_s=4.0) as sb:
    for on in (False, True):
        prompt = rollout.prompt_ids(tok, "Print 45.", "math", "hermes")
        traj = asyncio.run(rollout.rollout_one(ScriptedEngine(tok, script), sb, tok, prompt, cfg,
                                               config.Saar(gamma=1.0, sim_on="code", sim_ignore_space=on), seed=1))
        out[f"rollout_{on}"] = [[e["kind"], e["similarity"]] for e in traj.saar_events]
print(json.dumps(out))
'''


@pytest.mark.skipif(shutil.which("git") is None, reason="git applies the worked example's diff")
def test_the_worked_example_applies_to_the_working_tree_and_works(tmp_path):
    """The doc's new SAAR knob (sim_ignore_space) touches config.py and saar.py only, applies to their current text,
    and, patched, collapses whitespace runs before the similarity, in replace_turn and through retry_failed_call."""
    patch = worked_example()
    paths = re.findall(r"^\+\+\+ b/(\S+)$", patch, re.M)
    assert sorted(paths) == ["config.py", "saar.py"]  # nothing in machinery/, no list elsewhere
    added = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert "    sim_ignore_space: bool = False" in added
    assert added[added.index("    sim_ignore_space: bool = False") + 1].lstrip().startswith('"""')  # its --help
    for p in paths:
        shutil.copyfile(ROOT / p, tmp_path / p)  # the working tree's text, committed or not
    (tmp_path / "example.diff").write_text(patch)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)  # paths relative to tmp_path, whatever is above

    def apply(*opts):
        return subprocess.run(["git", "apply", *opts, "example.diff"], cwd=tmp_path, capture_output=True, text=True)

    checked = apply("--check")
    assert checked.returncode == 0, checked.stderr
    assert apply().returncode == 0
    run = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["default"] is False and out["plain"] < 1.0
    assert out["collapsed"] == [1.0, "shallow"]
    assert out["rollout_False"][0][0] == "deep" and out["rollout_False"][0][1] < 1.0
    assert out["rollout_True"] == [["shallow", 1.0]]
